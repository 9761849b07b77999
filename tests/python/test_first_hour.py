"""What a new user and an operator meet in their first hour (issue 23): the
hostkv CLI's commands and defaults, and what hostkvd says about a mistake
in its flags, its environment, its config file or its socket."""
import os
import re
import socket
import subprocess
import tempfile

import pytest

import hostkv
from conftest import Daemon, hostkvd_binary, write_secret


def cli_binary():
    path = os.environ.get("HOSTKV_CLI")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("HOSTKV_CLI does not name the hostkv binary")
    return path


def cli(*args, env=None, target=None):
    """Runs `hostkv`; --target first unless target is None."""
    argv = [cli_binary()] + ([f"--target={target}"] if target else []) + list(args)
    full_env = dict(os.environ)
    full_env.pop("HOSTKV_TARGET", None)
    full_env.update(env or {})
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=full_env)


def hostkvd(*args, env=None, timeout=10):
    """Runs hostkvd expecting it to exit (a refused start); its log (stdout)
    and stderr together are the result's .stderr."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTKVD_")}
    full_env.update(env or {})
    out = subprocess.run([hostkvd_binary(), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=timeout, env=full_env,
                         errors="replace")
    out.stderr = out.stdout
    return out


def private_listen(tmp):
    return f"--listen=unix:{tmp}/hostkvd.sock"


# -- the CLI -------------------------------------------------------------------

def test_demo_twice_with_other_geometries_cleans_up_its_pool(daemon):
    first = cli("demo", target=daemon.target)
    assert first.returncode == 0, first.stderr
    assert "deleted pool 'demo'" in first.stdout
    second = cli("demo", "--attention=mla", "--layout=layer_first", "--page_size=1",
                 target=daemon.target)
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines()[-1].startswith("OK: all ")
    with hostkv.Client(daemon.target, "pytest") as c:
        assert "demo" not in [p.spec.name for p in c.list_pools()]


def test_a_different_spec_under_an_existing_name_names_the_fields(daemon):
    with hostkv.Client(daemon.target, "pytest") as c:
        c.create_pool(hostkv.pb.PoolSpec(
            name="demo", page_size=16, capacity_tokens=4096, layout=hostkv.pb.LAYOUT_PAGE_FIRST,
            geometry=hostkv.pb.Geometry(dtype=hostkv.pb.DTYPE_BF16, mha=hostkv.pb.MhaGeometry(
                num_layers=2, num_kv_heads=2, head_dim=64))))
        try:
            out = cli("demo", target=daemon.target)
            assert out.returncode == 1
            assert "ALREADY_EXISTS" in out.stderr
            assert "num_layers: 2 -> 4" in out.stderr, out.stderr
            assert "hostkv delete-pool demo" in out.stderr
            deleted = cli("delete-pool", "demo", target=daemon.target)
            assert deleted.returncode == 0, deleted.stderr
            assert deleted.stdout == "deleted pool 'demo'\n"
            assert "demo" not in [p.spec.name for p in c.list_pools()]
            again = cli("delete-pool", "demo", target=daemon.target)
            assert again.returncode == 1 and "NOT_FOUND" in again.stderr
        finally:
            try:
                c.delete_pool("demo")
            except hostkv.errors.NotFound:
                pass


def test_stats_does_not_count_its_own_session():
    d = Daemon()
    try:
        out = cli("stats", target=d.target)
        assert out.returncode == 0, out.stderr
        assert "sessions open: 0 " in out.stdout, out.stdout
        assert "hostkv-cli" not in out.stdout
        with hostkv.Client(d.target, "an-engine"):
            out = cli("stats", target=d.target)
            assert "sessions open: 1 " in out.stdout, out.stdout
            assert "an-engine" in out.stdout and "hostkv-cli" not in out.stdout
    finally:
        d.stop()


def test_the_target_comes_from_hostkv_target(daemon):
    out = cli("pools", env={"HOSTKV_TARGET": daemon.target})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("POOL ")
    with _client_from_env(daemon) as c:
        assert c.session_number > 0


def _client_from_env(daemon):
    old = os.environ.get("HOSTKV_TARGET")
    os.environ["HOSTKV_TARGET"] = daemon.target
    try:
        return hostkv.Client(client_name="from-env")
    finally:
        if old is None:
            del os.environ["HOSTKV_TARGET"]
        else:
            os.environ["HOSTKV_TARGET"] = old


def test_a_bare_socket_path_gets_the_unix_prefix_suggested(daemon):
    path = daemon.target[len("unix:"):]
    out = cli("pools", target=path)
    assert out.returncode == 1
    assert f"is a path: a Unix socket is unix:{path}" in out.stderr
    with pytest.raises(hostkv.errors.InvalidArgument, match="unix:"):
        hostkv.Client(path)


def test_lookup_needs_a_pool(daemon):
    out = cli("lookup", "--namespace=ns", "0a0b", target=daemon.target)
    assert out.returncode == 2
    assert "usage: hostkv lookup --pool=P" in out.stderr


def test_help_lists_every_flag():
    out = subprocess.run([cli_binary(), "--help"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    assert "No flags matched" not in text
    for flag in ("--target", "--token_file", "--pool", "--attention", "--page_size"):
        assert flag in text, flag
    out = subprocess.run([hostkvd_binary(), "--help"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    assert "No flags matched" not in text
    for flag in ("--listen", "--memory_budget", "--session_lease", "--tier", "--copy_threads"):
        assert flag in text, flag


def test_tcp_port_and_a_token_file_reach_a_tcp_daemon():
    d = Daemon(tcp=True, token="s3cr3t-token")
    try:
        port = d.target.rsplit(":", 1)[1]
        bare = cli("pools", target=f"tcp:{port}")
        assert bare.returncode == 1 and "UNAUTHENTICATED" in bare.stderr, bare.stderr
        token = write_secret(os.path.join(d.workdir, "cli-token"), "s3cr3t-token\n")
        out = cli("--token_file=" + token, "pools", target=f"tcp:{port}")
        assert out.returncode == 0, out.stderr
        out = cli("health", target=f"tcp:{port}", env={"HOSTKV_TOKEN_FILE": token})
        assert out.returncode == 0 and out.stdout == "SERVING\n", out.stderr
    finally:
        d.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_a_closed_socket_says_permission_denied_and_what_opens_it():
    d = Daemon()
    try:
        def as_other_user():
            return subprocess.run(
                ["setpriv", "--reuid=61005", "--regid=61005", "--clear-groups",
                 cli_binary(), f"--target={d.target}", "pools"],
                capture_output=True, text=True, timeout=30)
        os.chmod(d.workdir, 0o750)
        out = as_other_user()
        assert out.returncode == 1
        assert f"permission denied on {d.workdir} (owner root (uid 0)" in out.stderr, out.stderr
        assert "mode 0750" in out.stderr and "--socket_group" in out.stderr
        os.chmod(d.workdir, 0o755)  # the directory opens; the socket is 0660
        out = as_other_user()
        assert out.returncode == 1
        assert f"permission denied on {d.sock} (owner root (uid 0)" in out.stderr, out.stderr
        assert "mode 0660" in out.stderr
    finally:
        d.stop()


def test_freeing_no_pages_is_a_no_op(client):
    pool = "first-hour-free"
    client.create_pool(hostkv.pb.PoolSpec(
        name=pool, page_size=16, capacity_tokens=1024, layout=hostkv.pb.LAYOUT_PAGE_FIRST,
        geometry=hostkv.pb.Geometry(dtype=hostkv.pb.DTYPE_BF16, mha=hostkv.pb.MhaGeometry(
            num_layers=2, num_kv_heads=1, head_dim=8))))
    try:
        pages = client.alloc(pool, 32)
        assert client.free(pool, []) == 0
        assert client.free(pool, pages) == 2
    finally:
        client.delete_pool(pool)


def test_get_pool_without_a_name_is_invalid_argument(client):
    with pytest.raises(hostkv.errors.InvalidArgument, match="pool is required"):
        client._call(client._stub.GetPool, hostkv.pb.GetPoolRequest(pool=""))


# -- hostkvd's start -------------------------------------------------------------

def test_a_listen_path_without_unix_is_refused_with_the_fix(tmp_path):
    out = hostkvd(f"--listen={tmp_path}/x.sock")
    assert out.returncode != 0
    assert f"--listen=unix:{tmp_path}/x.sock" in out.stderr


def test_tcp_on_another_interface_needs_a_token():
    out = hostkvd("--listen=0.0.0.0:50999")
    assert out.returncode != 0
    assert "is not loopback: it needs --auth_token_file" in out.stderr


def test_a_duration_flag_says_what_it_takes(tmp_path):
    out = hostkvd(private_listen(tmp_path), "--session_lease=30")
    assert out.returncode != 0
    assert "--session_lease=30 is not a duration such as 30s" in out.stderr
    out = hostkvd(private_listen(tmp_path), env={"HOSTKVD_SESSION_LEASE": "30"})
    assert "HOSTKVD_SESSION_LEASE: --session_lease=30 is not a duration" in out.stderr


def test_config_errors_name_their_source(tmp_path):
    missing = tmp_path / "nope.textproto"
    out = hostkvd(f"--config={missing}")
    assert out.returncode != 0
    assert f"cannot read --config {missing}: No such file or directory" in out.stderr
    config = tmp_path / "c.textproto"
    config.write_text('flags { key: "copy_threads" value: "-1" }\n')
    out = hostkvd(private_listen(tmp_path), f"--config={config}")
    assert out.returncode != 0
    assert "--copy_threads must be in [0, 1024]" in out.stderr
    assert f"(set by --config {config})" in out.stderr, out.stderr
    out = hostkvd(private_listen(tmp_path), env={"HOSTKVD_COPY_THREADS": "-1"})
    assert "(set by HOSTKVD_COPY_THREADS)" in out.stderr, out.stderr


def test_a_misspelt_variable_is_warned_of(tmp_path):
    out = hostkvd(private_listen(tmp_path), "--copy_threads=-1",
                  env={"HOSTKVD_MEMORY_BUDGT": "8GiB"})
    assert "HOSTKVD_MEMORY_BUDGT names no hostkvd flag and is ignored" in out.stderr


def test_a_busy_metrics_port_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with tempfile.TemporaryDirectory() as tmp:
            out = hostkvd(private_listen(tmp), f"--metrics_listen=127.0.0.1:{port}")
    assert out.returncode != 0
    assert f"--metrics_listen 127.0.0.1:{port}: Address already in use" in out.stderr, out.stderr


def test_the_lock_file_goes_with_a_clean_exit():
    d = Daemon()
    sock = d.sock
    assert os.path.exists(sock + ".lock")
    d.process.terminate()
    assert d.process.wait(timeout=15) == 0
    assert not os.path.exists(sock + ".lock")
    assert not os.path.exists(sock)
    d.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run hostkvd as another uid")
def test_a_socket_directory_root_used_first_says_whose_it_is():
    """Root ran hostkvd on this socket before; a non-root hostkvd then gets
    a hint, not a bare Permission denied on the lock file."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        out = _start_as_other_user_after_root(tmp)
    assert out.returncode != 0
    assert "belongs to another user, e.g. a hostkvd run as root" in out.stdout, out.stdout
    assert "uid 61005" in out.stdout


def _start_as_other_user_after_root(tmp):
    run_dir = os.path.join(tmp, "run")
    os.mkdir(run_dir, 0o755)
    with open(os.path.join(run_dir, "hostkvd.sock.lock"), "w"):
        pass  # root's, 0644, as a root hostkvd leaves it when killed
    return subprocess.run(
        ["setpriv", "--reuid=61005", "--regid=61005", "--clear-groups", hostkvd_binary(),
         f"--listen=unix:{run_dir}/hostkvd.sock", "--keep_state=false"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30,
        env={k: v for k, v in os.environ.items() if not k.startswith("HOSTKVD_")})


@pytest.mark.parametrize("program", ["hostkvd", "hostkv"])
def test_version_names_the_release_commit_and_build(program):
    binary = hostkvd_binary() if program == "hostkvd" else cli_binary()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert re.fullmatch(program + r" \d+\.\d+\.\d+ \(commit ([0-9a-f]{7,}(-dirty)?|unknown|\S+), "
                        r"(Release|RelWithDebInfo|Debug|MinSizeRel|unspecified) build\)",
                        lines[0]), out.stdout
    assert "NDEBUG" not in out.stdout
    if program == "hostkvd":
        # The backends this build has; on a machine without a driver the
        # CUDA build says it serves the CPU backend.
        assert re.fullmatch(r"backends: cpu( \(built without CUDA\)|, cuda \(CUDA runtime "
                            r"\d+\.\d+\)(; no CUDA driver here: serves the CPU backend"
                            r"|; driver \d+\.\d+, .*))", lines[1]), out.stdout
