"""The C++ and Python clients agree: pages the C++ client wrote (WritePages)
read back byte-exact through the Python client's read_pages."""
import os
import subprocess

import pytest

import hostkv


def test_cpp_written_pages_read_back_by_python(daemon, client):
    writer = os.environ.get("CPP_PAGE_WRITER")
    if not writer:
        pytest.skip("CPP_PAGE_WRITER does not name tests/python/cpp_page_writer")
    pool = client.create_pool(hostkv.mha_pool_spec(
        "interop", num_layers=3, num_kv_heads=2, head_dim=8, page_size=4,
        capacity_tokens=64))
    out = subprocess.run([writer, daemon.target, "interop", "24", str(client.session_number)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    pages = [tuple(int(x) for x in line.split()) for line in out.splitlines()]
    assert hostkv.count_tokens(pages, 4) == 24
    data = client.read_pages("interop", pages)
    assert data == bytes((7 * i + 3) & 0xFF for i in range(6 * pool.page_bytes))
    assert client.free("interop", pages) == 6
    client.delete_pool("interop")
