#!/usr/bin/python3
"""Builds the hostkvd images with podman (or buildah) and runs them as an
operator would: the daemon from the image as uid 10001, driven from the host
through the socket volume.

usage: image_test.py --source=DIR --build=DIR [--base=IMAGE] [--gpu=auto|yes|no]
                     [--cuda_toolkit=DIR] [--work_dir=DIR] [--isolation=chroot|oci]
                     [--record]

  --source  the checkout (its Dockerfile and context)
  --build   a host build of the checkout (build/client/hostkv, the Python
            stubs in build/client/python/hostkv_proto) that drives the daemon
  --base    the Debian 12 image both FROMs start from (BUILD_BASE and
            RUNTIME_BASE). Default: the Dockerfile's pinned images where a
            registry is reachable, else a Debian 12 made here with
            `debootstrap --variant=minbase bookworm` and `podman import`
            (kept in --work_dir and in local storage; made once)
  --gpu     the GPU image (target runtime-gpu): auto builds it when a CUDA
            toolkit is here (--cuda_toolkit, default /usr/local/cuda; passed
            as --build-context cuda-toolkit=DIR) and skips it otherwise
  --record  on success, write tests/deploy/image_test.stamp: the digest of
            what the image is made from, which deploy_image_stamp_test
            (ctest) compares with the checkout

What each image must do:
  - build from the Dockerfile (format docker: HEALTHCHECK kept);
  - inspect: user 10001:10001, the socket VOLUME, the HEALTHCHECK command,
    EXPOSE 9464, the project version label; NVIDIA_* only in the GPU image;
  - `hostkvd --version` names the version, the commit and the backends
    (the GPU image: "cuda (CUDA runtime ...)"); ldd finds every library;
  - run: the state keeper as its own container (as the manifests arrange
    it), then the daemon with the image's entrypoint and CMD, uid 10001,
    /run/hostkv on a host directory, the host's /dev/shm and network; the
    HEALTHCHECK command fails before the daemon serves and passes after;
  - from the host: `hostkv demo` (bytes verified), the SGLang host-pool demo
    (Python, bytes verified), reflection as grpcurl uses it (services,
    GetPoolStats, a pool created and a page published), /metrics;
  - the daemon SIGKILLed and started again adopts that pool and its cached
    page from the keeper; SIGTERM then ends it with status 0.

`podman run` needs cgroups it can drive; where it cannot (a sandbox with
hybrid cgroups, as on the project's build machines), the containers run with
`buildah run --isolation=chroot`: the image's files, user, entrypoint, CMD
and volumes, without namespaces of their own.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from reflection_test import Reflector, reflection_stubs, small_pool  # noqa: E402
from image_inputs import inputs_digest  # noqa: E402

BASE_TAG = "localhost/hostkv-base/debian:bookworm-minbase"
IMAGE_UID = 10001
SOCKET_DIR = "/run/hostkv"


def log(msg):
    print(msg, flush=True)


def run(argv, check=True, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    r = subprocess.run(argv, **kw)
    if check and r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(argv)} exited {r.returncode}:\n"
                         f"{(r.stdout or '')[-4000:]}{(r.stderr or '')[-4000:]}")
    return r


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    log(f"  ok: {what.splitlines()[0]}")


class Images:
    """podman where it is installed, else buildah (same storage, same
    Dockerfile semantics)."""

    def __init__(self, isolation):
        self.tool = shutil.which("podman") or shutil.which("buildah")
        self.buildah = shutil.which("buildah")
        if not self.tool or not self.buildah:
            raise SystemExit("FAIL: needs podman or buildah, and buildah "
                             "(apt-get install podman buildah)")
        self.isolation = isolation

    def exists(self, image):
        if os.path.basename(self.tool) == "podman":
            return run([self.tool, "image", "exists", image], check=False).returncode == 0
        return run([self.tool, "inspect", "--type", "image", image], check=False).returncode == 0

    def build(self, source, target, tag, build_args, contexts, logfile):
        argv = [self.tool, "build" if os.path.basename(self.tool) == "podman" else "bud",
                "--format", "docker", "--layers", "--network", "host",
                "--isolation", self.isolation, "--target", target, "-t", tag,
                "-f", os.path.join(source, "Dockerfile")]
        for k, v in build_args.items():
            argv += ["--build-arg", f"{k}={v}"]
        for k, v in contexts.items():
            argv += ["--build-context", f"{k}={v}"]
        start = time.monotonic()
        with open(logfile, "w") as out:
            r = subprocess.run(argv + [source], stdout=out, stderr=subprocess.STDOUT)
        return r.returncode, time.monotonic() - start

    def inspect(self, image):
        r = run([self.buildah, "inspect", "--type", "image", image])
        return json.loads(r.stdout)


class Container:
    """One process of an image: `podman run` where it works, else
    `buildah run --isolation=chroot` on a working container of the image."""

    def __init__(self, images, image, argv, volumes, name, logfile, use_podman):
        self.images, self.logfile, self.name = images, logfile, name
        self.out = open(logfile, "w")
        if use_podman:
            cmd = ["podman", "run", "--rm", "--name", name, "--user", f"{IMAGE_UID}:{IMAGE_UID}",
                   "--network", "host", "--ipc", "host", "--pid", "host"]
            for host, inside in volumes:
                cmd += ["-v", f"{host}:{inside}"]
            if argv and argv[0].startswith("/"):
                cmd += ["--entrypoint", argv[0], image] + argv[1:]
            else:
                cmd += [image] + argv
            self.working = None
        else:
            self.working = run([images.buildah, "from", "--name", name, image]).stdout.strip()
            # buildah run mounts an anonymous volume for each VOLUME of the
            # image, in an order of its own, over or under the -v binds: the
            # volumes given here replace the image's (as `podman run -v`).
            for _, inside in volumes:
                run([images.buildah, "config", "--volume", f"{inside}-", self.working],
                    check=False)
            cmd = [images.buildah, "run", "--isolation", "chroot", "--network", "host",
                   "--user", f"{IMAGE_UID}:{IMAGE_UID}"]
            for host, inside in volumes:
                cmd += ["-v", f"{host}:{inside}"]
            cmd += [self.working, "--"] + argv
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def output(self):
        self.out.flush()
        with open(self.logfile) as f:
            return f.read()

    def remove(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.out.close()
        if self.working:
            run([self.images.buildah, "rm", self.working], check=False)


def pids_of(pattern):
    """Host pids whose command line contains pattern (both container kinds
    here share the host's pid namespace)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pattern in cmdline and "hostkvd" in cmdline and "buildah" not in cmdline \
                and "podman" not in cmdline:
            found.append(int(pid))
    return found


def wait_for(pred, timeout, what, explain=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise SystemExit(f"FAIL: {what} (waited {timeout} s){explain()}")


def mounts_of_socket_dir(sock_dir, container):
    """What a container process sees at the socket directory (a failure's
    explanation)."""
    lines = [f"\nhost {sock_dir}: {os.listdir(sock_dir)}",
             f"container output: {container.output()}"]
    for pid in pids_of(SOCKET_DIR):
        try:
            with open(f"/proc/{pid}/mountinfo") as f:
                mounts = [m.strip() for m in f if SOCKET_DIR in m]
            lines.append(f"pid {pid} mounts at {SOCKET_DIR}: {mounts}; sees "
                         f"{os.listdir(f'/proc/{pid}/root{SOCKET_DIR}')}")
        except OSError as e:
            lines.append(f"pid {pid}: {e}")
    return "\n".join(lines)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def debootstrapped_base(images, work_dir):
    if images.exists(BASE_TAG):
        log(f"base: {BASE_TAG} (made earlier)")
        return BASE_TAG
    if not shutil.which("debootstrap"):
        raise SystemExit("FAIL: no --base and no debootstrap (apt-get install debootstrap)")
    rootfs = os.path.join(work_dir, "rootfs")
    shutil.rmtree(rootfs, ignore_errors=True)
    log("base: debootstrap --variant=minbase bookworm (a few minutes)")
    run(["debootstrap", "--variant=minbase", "bookworm", rootfs, "http://deb.debian.org/debian"])
    tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
    run([images.tool, "import", "-", BASE_TAG], stdin=tar.stdout)
    tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)
    return BASE_TAG


def check_metadata(images, image, gpu, version):
    meta = images.inspect(image)
    config = (meta.get("Docker") or {}).get("config") or meta.get("OCIv1", {}).get("config", {})
    check(config.get("User") == f"{IMAGE_UID}:{IMAGE_UID}", f"user {config.get('User')}")
    check(SOCKET_DIR in (config.get("Volumes") or {}), f"volume {SOCKET_DIR}")
    check("9464/tcp" in (config.get("ExposedPorts") or {}), "exposes 9464/tcp")
    check((config.get("Labels") or {}).get("org.opencontainers.image.version") == version,
          f"label version {version}")
    health = (config.get("Healthcheck") or {}).get("Test") or []
    check(health[:1] == ["CMD"] and "health" in health, f"HEALTHCHECK {health}")
    env = dict(e.split("=", 1) for e in config.get("Env") or [])
    if gpu:
        check(env.get("NVIDIA_VISIBLE_DEVICES") == "all"
              and "compute" in env.get("NVIDIA_DRIVER_CAPABILITIES", ""),
              "NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES has compute")
    else:
        check(not any(k.startswith("NVIDIA_") for k in env), "no NVIDIA_* variables")
    return config


def one_shot(images, image, argv, work_dir, name, use_podman, volumes=()):
    c = Container(images, image, argv, list(volumes), name, os.path.join(work_dir, name + ".log"),
                  use_podman)
    try:
        rc = c.wait(120)
        return rc, c.output()
    finally:
        c.remove()


def check_binaries(images, image, gpu, version, commit, work_dir, use_podman):
    rc, out = one_shot(images, image, ["/usr/local/bin/hostkvd", "--version"], work_dir,
                       "hostkv-version", use_podman)
    log("  " + out.strip().replace("\n", "\n  "))
    check(rc == 0 and out.startswith(f"hostkvd {version} (commit {commit}"),
          f"hostkvd --version names {version} and commit {commit}")
    if gpu:
        check(re.search(r"backends: cpu, cuda \(CUDA runtime \d+\.\d+\)", out),
              "the GPU image's hostkvd has the CUDA backend")
    else:
        check("backends: cpu (built without CUDA)" in out,
              "the CPU image's hostkvd has the CPU backend only")
    rc, out = one_shot(images, image, ["/usr/local/bin/hostkv", "--version"], work_dir,
                       "hostkv-version", use_podman)
    check(rc == 0 and out.startswith(f"hostkv {version}"), f"hostkv --version: {out.strip()}")
    rc, out = one_shot(images, image, ["/bin/sh", "-c",
                                       "ldd /usr/local/bin/hostkvd /usr/local/bin/hostkv"],
                       work_dir, "hostkv-ldd", use_podman)
    check(rc == 0 and "not found" not in out, f"ldd finds every library:\n{out}")


def drive(images, image, config, source, build, work_dir, use_podman, tag):
    """Keeper + daemon from the image, driven from the host."""
    sock_dir = tempfile.mkdtemp(prefix="hostkv-image-sock-", dir="/tmp")
    os.chown(sock_dir, IMAGE_UID, IMAGE_UID)
    os.chmod(sock_dir, 0o750)
    sock = os.path.join(sock_dir, "hostkvd.sock")
    target = f"unix:{sock}"
    cli = os.path.join(build, "client", "hostkv")
    port = free_port()
    entrypoint = list(config.get("Entrypoint") or [])
    cmd = [a if not a.startswith("--metrics_listen=") else f"--metrics_listen=127.0.0.1:{port}"
           for a in config.get("Cmd") or []]
    check(f"--listen=unix:{SOCKET_DIR}/hostkvd.sock" in cmd, f"CMD listens on {SOCKET_DIR}: {cmd}")
    volumes = [(sock_dir, SOCKET_DIR), ("/dev/shm", "/dev/shm")]
    health = config["Healthcheck"]["Test"][1:]
    containers = []

    def start(name, argv):
        c = Container(images, image, argv, volumes, f"{name}-{tag}",
                      os.path.join(work_dir, f"{name}-{tag}.log"), use_podman)
        containers.append(c)
        return c

    def healthcheck():
        rc, _ = one_shot(images, image, health, work_dir, f"health-{tag}", use_podman, volumes)
        return rc

    try:
        check(healthcheck() != 0, "HEALTHCHECK fails while no daemon serves")
        keeper = start("keeper", ["/usr/local/bin/hostkvd",
                                  f"--state_keeper={SOCKET_DIR}/hostkvd.sock.state",
                                  "--state_keep_for=10m"])
        wait_for(lambda: os.path.exists(sock + ".state") or keeper.proc.poll() is not None, 60,
                 "the keeper's socket", lambda: mounts_of_socket_dir(sock_dir, keeper))
        check(keeper.proc.poll() is None, f"the keeper runs:\n{keeper.output()}")
        daemon = start("daemon", entrypoint + cmd)
        wait_for(lambda: run([cli, f"--target={target}", "health"], check=False).returncode == 0
                 or daemon.proc.poll() is not None, 120, "the daemon's health")
        check(daemon.proc.poll() is None, f"the daemon serves:\n{daemon.output()}")
        check(os.stat(sock).st_uid == IMAGE_UID, f"the socket is uid {IMAGE_UID}'s")
        check(healthcheck() == 0, "HEALTHCHECK (the image's command, in the image) passes")

        r = run([cli, f"--target={target}", "demo"], check=False, timeout=120)
        check(r.returncode == 0 and "OK: all" in r.stdout, f"hostkv demo:\n{r.stdout}{r.stderr}")
        env = dict(os.environ, PYTHONPATH=os.path.join(source, "client", "python"),
                   HOSTKV_PROTO_DIR=os.path.join(build, "client", "python", "hostkv_proto"),
                   PYTHONDONTWRITEBYTECODE="1")
        r = run(["/usr/bin/python3", os.path.join(source, "client", "python", "examples",
                                                  "sglang_cpu_demo.py"), target],
                check=False, env=env, timeout=180)
        lines = r.stdout.splitlines()
        check(r.returncode == 0 and lines and lines[-1] == "OK"
              and sum("bytes match" in line for line in lines) == 5,
              f"the SGLang host-pool demo:\n{r.stdout}{r.stderr}")

        import grpc
        pb = reflection_stubs(tempfile.mkdtemp(prefix="refl-", dir=work_dir))
        channel = grpc.insecure_channel(target)
        refl = Reflector(channel, pb)
        services = refl.services()
        check("hostkv.v1.HostKV" in services and "grpc.health.v1.Health" in services,
              f"reflection lists {services}")

        def call(method, request):
            return refl.hostkv(channel, method, request)
        sid = call("OpenSession", {"clientName": "grpcurl"})["sessionId"]
        call("CreatePool", small_pool(sid, "image-test"))
        pages = call("Alloc", {"sessionId": sid, "pool": "image-test", "numTokens": 16})["pages"]
        first = int(pages[0].get("firstPage", "0"))
        published = call("Publish", {"sessionId": sid, "pool": "image-test",
                                     "namespace": "image-test",
                                     "items": [{"key": "aW1hZ2U=", "page": str(first)}]})
        check(published.get("cached") == "1", f"Publish through reflection: {published}")
        call("CloseSession", {"sessionId": sid})
        stats = call("GetPoolStats", {"pool": "image-test"})["pools"][0]
        check(stats.get("cachedPages") == "1", f"GetPoolStats through reflection: {stats}")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) \
            .read().decode()
        check("hostkv_pools " in metrics or "hostkv_pool_" in metrics, "/metrics serves")
        channel.close()

        # The keeper's part: a daemon SIGKILLed and started again adopts.
        pids = pids_of(f"--listen=unix:{SOCKET_DIR}/hostkvd.sock")
        check(len(pids) == 1, f"one hostkvd process serves the socket ({pids})")
        os.kill(pids[0], signal.SIGKILL)
        daemon.wait(30)
        daemon = start("daemon2", entrypoint + cmd)
        wait_for(lambda: run([cli, f"--target={target}", "health"], check=False).returncode == 0
                 or daemon.proc.poll() is not None, 120, "the restarted daemon's health")
        channel = grpc.insecure_channel(target)
        refl = Reflector(channel, pb)
        stats = call("GetPoolStats", {"pool": "image-test"})["pools"][0]
        check(stats.get("cachedPages") == "1",
              f"after SIGKILL the new daemon adopted the pool and its cached page: {stats}")
        channel.close()
        pids = pids_of(f"--listen=unix:{SOCKET_DIR}/hostkvd.sock")
        os.kill(pids[0], signal.SIGTERM)
        rc = daemon.wait(60)
        check(rc == 0, f"SIGTERM ends the daemon with 0 (got {rc}):\n{daemon.output()[-2000:]}")
    finally:
        for pid in pids_of(sock_dir) + pids_of(f"{SOCKET_DIR}/hostkvd.sock"):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for c in containers:
            c.remove()
        shutil.rmtree(sock_dir, ignore_errors=True)


def podman_run_works(images, image):
    if os.path.basename(images.tool) != "podman":
        return False
    r = run(["podman", "run", "--rm", "--network", "host", image, "/bin/true"], check=False)
    if r.returncode != 0:
        log(f"podman run does not start containers here ({r.stderr.strip().splitlines()[-1]}); "
            f"running them with buildah run --isolation=chroot")
    return r.returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--base", default="")
    ap.add_argument("--gpu", choices=["auto", "yes", "no"], default="auto")
    ap.add_argument("--cuda_toolkit", default="/usr/local/cuda")
    ap.add_argument("--work_dir", default="/var/tmp/hostkv-image-test")
    ap.add_argument("--isolation", default="chroot")
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args()
    source, build = os.path.realpath(a.source), os.path.realpath(a.build)
    os.makedirs(a.work_dir, exist_ok=True)
    if os.geteuid() != 0:
        raise SystemExit("FAIL: run as root (the containers run as uid 10001 on a directory "
                         "this test gives to that uid)")
    with open(os.path.join(source, "CMakeLists.txt")) as f:
        version = re.search(r"project\(\s*hostkv\s+VERSION\s+([0-9.]+)", f.read()).group(1)
    commit = run(["git", "-C", source, "describe", "--always", "--dirty", "--abbrev=12"],
                 check=False).stdout.strip() or "unknown"
    images = Images(a.isolation)
    base = a.base or debootstrapped_base(images, a.work_dir)
    build_args = {"HOSTKV_COMMIT": commit}
    if base != "pinned":
        build_args.update(BUILD_BASE=base, RUNTIME_BASE=base)

    targets = [("runtime", f"localhost/hostkv/hostkvd:{version}", False, {})]
    nvcc = os.path.join(a.cuda_toolkit, "bin", "nvcc")
    if a.gpu == "yes" or (a.gpu == "auto" and os.path.exists(nvcc)):
        contexts = {"cuda-toolkit": os.path.realpath(a.cuda_toolkit)} if os.path.exists(nvcc) \
            else {}
        targets.append(("runtime-gpu", f"localhost/hostkv/hostkvd:{version}-cuda", True,
                        contexts))
    else:
        log(f"GPU image: skipped (no CUDA toolkit at {a.cuda_toolkit}; --gpu=yes builds it "
            f"from NVIDIA's repository)")
    results = []
    for target, tag, gpu, contexts in targets:
        log(f"== {target} -> {tag}")
        logfile = os.path.join(a.work_dir, f"build-{target}.log")
        rc, seconds = images.build(source, target, tag, build_args, contexts, logfile)
        with open(logfile) as f:
            tail = f.read()[-3000:]
        check(rc == 0, f"build of {target} ({seconds:.0f} s; log {logfile}):\n{tail}")
        size = run([images.tool, "image", "inspect", "--format", "{{.Size}}", tag],
                   check=False).stdout.strip()
        log(f"  built in {seconds:.0f} s, {int(size) / 1e6:.0f} MB" if size.isdigit()
            else f"  built in {seconds:.0f} s")
        config = check_metadata(images, tag, gpu, version)
        use_podman = podman_run_works(images, tag)
        check_binaries(images, tag, gpu, version, commit, a.work_dir, use_podman)
        drive(images, tag, config, source, build, a.work_dir, use_podman,
              "gpu" if gpu else "cpu")
        results.append(f"{target} ({seconds:.0f} s build)")
    log(f"PASS: {', '.join(results)}")
    if a.record:
        stamp = os.path.join(HERE, "image_test.stamp")
        with open(stamp, "w") as f:
            f.write("# tests/deploy/image_test.py passed on these inputs "
                    "(deploy_image_stamp_test compares)\n")
            f.write(f"inputs {inputs_digest(source)}\n")
            f.write(f"images {' '.join(t for t, _, _, _ in targets)}\n")
            f.write(f"commit {commit}\n")
            f.write(f"date {time.strftime('%Y-%m-%d')}\n")
        log(f"recorded {stamp}")


if __name__ == "__main__":
    main()
