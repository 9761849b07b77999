"""Fixtures of the vLLM v0.26+ tests: hostkvd as tests/python runs it (its
Daemon class, loaded by path: this suite runs in its own pytest process,
since its stand-in `vllm` differs from tests/python's older one)."""
import importlib.util
import os

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "hostkv_python_conftest", os.path.join(_HERE, "..", "python", "conftest.py"))
_daemon_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_daemon_module)
Daemon = _daemon_module.Daemon


@pytest.fixture
def daemon():
    d = Daemon()
    yield d
    d.stop()
