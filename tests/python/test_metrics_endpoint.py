"""/metrics as Prometheus scrapes it, over real HTTP (urllib).

- With --metrics_token_file, /metrics answers 401 (WWW-Authenticate: Bearer)
  without "Authorization: Bearer <token>" or with a wrong one (whatever the
  path), 200 with it.
- Page-cache namespaces and pools are labelled by the first 12 hex digits
  of the HMAC-SHA256 of their name under --metrics_label_key_file's key:
  the name appears nowhere in the page, unless --metrics_namespace_names.
- The page parses as the Prometheus text format (prometheus_text.parse).
- Other paths 404, other methods 405, HEAD has no body; a client that
  connects and says nothing does not hold up a scrape.
- The endpoint is off unless --metrics_listen is given.
"""
import hashlib
import hmac
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

import hostkv
import prometheus_text
from conftest import Daemon, hostkvd_binary, write_secret

TOKEN = "metrics-s3cret"
LABEL_KEY = "label-k3y"
NAMESPACE = "tenant-a/private-model-7b"
POOL = "metrics-pool"
PAGE = 4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hashed(name):
    return hmac.new(LABEL_KEY.encode(), name.encode(), hashlib.sha256).hexdigest()[:12]


def publish_one_page(daemon):
    with hostkv.Client(daemon.target, "metrics-test") as c:
        c.create_pool(hostkv.mha_pool_spec(POOL, num_layers=2, num_kv_heads=1, head_dim=8,
                                           page_size=PAGE, capacity_tokens=256))
        runs = c.alloc(POOL, PAGE)
        assert c.publish(POOL, NAMESPACE, [b"k0"], runs).cached == 1
        assert c.lookup(POOL, NAMESPACE, [b"k0", b"missing"]).hits == 1


def metrics_daemon(*flags):
    port = free_port()
    d = Daemon(f"--metrics_listen=127.0.0.1:{port}", *flags)
    d.metrics_url = f"http://127.0.0.1:{port}/metrics"
    d.metrics_port = port
    publish_one_page(d)
    return d


@pytest.fixture(scope="module")
def guarded():
    """Token asked, namespaces hashed (the defaults but the token)."""
    token_dir = tempfile.mkdtemp(prefix="hostkv-metrics-token-")
    token = write_secret(os.path.join(token_dir, "token"), TOKEN + "\n")
    key = write_secret(os.path.join(token_dir, "label-key"), LABEL_KEY + "\n")
    d = metrics_daemon(f"--metrics_token_file={token}", f"--metrics_label_key_file={key}")
    yield d
    d.stop()
    shutil.rmtree(token_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def named():
    """No token, --metrics_namespace_names."""
    d = metrics_daemon("--metrics_namespace_names")
    yield d
    d.stop()


def fetch(url, authorization=None, method="GET"):
    """(status, headers, body) of one request."""
    request = urllib.request.Request(url, method=method)
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Bearer wrong", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x",
    TOKEN, f"Basic {TOKEN}"])
def test_no_metrics_without_the_token(guarded, authorization):
    for path in ("/metrics", "/", "/other"):
        url = guarded.metrics_url.replace("/metrics", path)
        status, headers, body = fetch(url, authorization)
        assert status == 401, (path, authorization, status, body)
        assert headers["WWW-Authenticate"].startswith("Bearer"), headers
        assert "hostkv_" not in body


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_metrics_with_the_token(guarded, scheme):
    status, headers, body = fetch(guarded.metrics_url, f"{scheme} {TOKEN}")
    assert status == 200, body
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4"), headers
    assert f'hostkv_pool_capacity_pages{{pool="{hashed(POOL)}"}}' in body, body


def test_namespaces_and_pools_are_hashed_by_default(guarded):
    _, _, body = fetch(guarded.metrics_url, f"Bearer {TOKEN}")
    for part in (NAMESPACE, "tenant-a", "private-model", POOL,
                 hashlib.sha256(NAMESPACE.encode()).hexdigest()[:12]):
        assert part not in body, f"'{part}' is on /metrics:\n{body}"
    label = f'namespace="{hashed(NAMESPACE)}",pool="{hashed(POOL)}"'
    assert f"hostkv_cache_cached_pages{{{label}}} 1" in body, body
    assert f"hostkv_cache_hits_total{{{label}}} 1" in body, body
    assert f"hostkv_cache_misses_total{{{label}}} 1" in body, body


def test_names_with_metrics_namespace_names(named):
    status, _, body = fetch(named.metrics_url)  # no token asked
    assert status == 200, body
    label = f'namespace="{NAMESPACE}",pool="{POOL}"'
    assert f"hostkv_cache_cached_pages{{{label}}} 1" in body, body
    assert hashed(NAMESPACE) not in body


@pytest.mark.parametrize("which", ["guarded", "named"])
def test_the_page_parses_as_prometheus_text(request, which):
    daemon = request.getfixturevalue(which)
    _, _, body = fetch(daemon.metrics_url, f"Bearer {TOKEN}")
    families = prometheus_text.parse(body)
    for name, kind in [("hostkv_pool_capacity_bytes", "gauge"),
                       ("hostkv_cache_cached_pages", "gauge"),
                       ("hostkv_cache_hits_total", "counter"),
                       ("hostkv_rpcs_total", "counter"),
                       ("hostkv_sessions", "gauge")]:
        assert families[name]["type"] == kind, (name, families.get(name))
        assert families[name]["help"], name
    for f in families.values():
        for _, labels, _ in f["samples"]:
            if "namespace" in labels and which == "guarded":
                assert re.fullmatch(r"[0-9a-f]{12}", labels["namespace"]), labels


def test_the_reader_refuses_what_prometheus_refuses():
    good = '# HELP a_total A.\n# TYPE a_total counter\na_total{x="1\\"\\n"} 2\n'
    assert prometheus_text.parse(good)["a_total"]["samples"] == [("a_total", {"x": '1"\n'}, 2)]
    for bad in ['a{x="1} 2', "a 2\na 3", 'a{x="\\t"} 1', "1a 2", "a{x=1} 2", "a two",
                "a 1\nb 1\na 2", "# TYPE a counter\n# TYPE a gauge", "a 1\n# TYPE a gauge"]:
        with pytest.raises(ValueError):
            prometheus_text.parse(bad)


def test_other_paths_methods_and_head(guarded):
    good = f"Bearer {TOKEN}"
    assert fetch(guarded.metrics_url.replace("/metrics", "/"), good)[0] == 404
    assert fetch(guarded.metrics_url.replace("/metrics", "/metricsx"), good)[0] == 404
    assert fetch(guarded.metrics_url + "?name[]=x", good)[0] == 200
    assert fetch(guarded.metrics_url, good, method="POST")[0] == 405
    status, headers, body = fetch(guarded.metrics_url, good, method="HEAD")
    assert status == 200 and body == "" and int(headers["Content-Length"]) > 1000


def test_a_silent_client_does_not_hold_up_a_scrape(guarded):
    with socket.create_connection(("127.0.0.1", guarded.metrics_port)) as silent:
        silent.sendall(b"GET /metrics HTTP/1.1\r\n")  # and nothing more
        started = time.monotonic()
        assert fetch(guarded.metrics_url, f"Bearer {TOKEN}")[0] == 200
        assert time.monotonic() - started < 2
    with socket.create_connection(("127.0.0.1", guarded.metrics_port)) as big:
        big.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"y" * 10000 + b"\r\n\r\n")
        assert big.recv(100).startswith(b"HTTP/1.1 431 ")


def test_off_by_default():
    out = subprocess.run([hostkvd_binary(), "--helpfull"], capture_output=True,
                         text=True).stdout
    for flag, default in [("metrics_listen", '""'), ("metrics_token_file", '""'),
                          ("metrics_namespace_names", "false")]:
        m = re.search(rf"--{flag} .*?default: (\S+);", out, re.S)
        assert m and m.group(1) == default, (flag, m and m.group(1))
