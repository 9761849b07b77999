#!/usr/bin/python3
"""Keeps the container and the deployment examples consistent with hostkvd.

usage: deploy_test.py --source=DIR --hostkvd=BIN --hostkv=BIN {manifests|dockerfile}

manifests: every YAML file under deploy/ (Kubernetes objects or a Compose
  file) is parsed, and for every container/service that runs the hostkvd
  image:
  - its arguments (and HOSTKVD_* variables) name only flags that
    `hostkvd --helpfull` lists; byte sizes parse as hostkvd parses them;
  - --listen is unix:PATH and dirname(PATH) is the mount path of the shared
    socket volume (for an emptyDir, a subdirectory of it: hostkvd refuses a
    world-writable non-sticky socket directory and creates that one 0750),
    in the daemon and in every engine container (same volume in a pod, same
    hostPath across pods, same named volume in Compose), and
    the engine's HOSTKV_TARGET is unix:PATH;
  - /dev/shm is shared: the same memory-backed emptyDir in both containers of
    a pod, hostIPC + hostPath /dev/shm in both pods, ipc: shareable /
    service:hostkvd in Compose;
  - liveness/readiness probes (and the Compose healthcheck) run
    `hostkv --target=unix:PATH health`, and those very commands, pointed at a
    temporary socket, exit 0 against a daemon started with the container's own
    flags and config;
  - the config (ConfigMap key mounted at /etc/hostkv/hostkvd.textproto, or the
    file Compose mounts there) parses as hostkv.v1.DaemonConfig, and hostkvd
    starts with it and creates every pool (capacities shrunk to a few pages so
    the test fits any machine; the full sizes are computed from the daemon's
    own bytes_per_token);
  - sizes add up: configured pools <= --memory_budget <= the container's
    memory request - overhead, request <= limit, /dev/shm size >= budget,
    --copy_threads <= the CPU request;
  - an init container that prepares a hostPath socket directory runs its
    command as the manifest grants it (runAsUser, only the added
    capabilities, setpriv; skipped unless root) on a fresh root 0755
    directory and again on the re-used one, leaving it the image uid's, 0750;
  - the daemon and the engines run as the image's uid (CPU backend: the
    daemon opens the engines' 0600 shared-memory device buffers);
  - every hostkvd image reference of a file is the same, tagged with the
    project version (the GPU image: VERSION-cuda);
  - the GPU image's daemon: the pod has a runtimeClassName (the NVIDIA
    runtime mounts the driver), the daemon requests no nvidia.com/gpu and
    sees every GPU (NVIDIA_VISIBLE_DEVICES=all, capabilities with compute);
    its engines request GPUs and share PIDs with it (shareProcessNamespace
    in its pod, hostPID + hostIPC on both pods across pods);
  - a storage tier (--tier) points at what the file provides: a
    redis://NAME.NAMESPACE.svc:PORT at a Service of the file with that port,
    file:PATH / redis+unix:PATH in a mounted volume (writable unless
    --tier_read_only), --tier_password_file in a Secret mounted read-only
    that has the key; the daemon started for the test gets a Redis address
    nobody listens on (it must serve with the tier down), a temporary
    directory, a temporary password file;
  - every Secret volume has an explicit defaultMode (and every item's mode)
    that lets no other user read or write the file once kubelet applied the
    pod's fsGroup (hostkvd refuses such a secret file; Kubernetes' default is
    0644), and a Secret hostkvd reads is readable by it: fsGroup set and
    group-readable (the files are root's); the temporary secret files of the
    daemon started for the test get that very mode;
  - with --metrics_token_file, /metrics answers 401 without the token and
    serves with it.
dockerfile: for each image (target runtime, the CPU image and the default;
  target runtime-gpu, the CUDA image; each with what it inherits from
  runtime-base): it runs as a non-root numeric user (the one the manifests
  name), has HEALTHCHECK `hostkv ... health` on the
  socket of its CMD's --listen, STOPSIGNAL SIGTERM, VOLUME = the socket
  directory, EXPOSE only ports its flags listen on, no compiler or -dev
  package, the runtime libraries `ldd` finds for hostkvd and hostkv (Debian
  package closure), a build stage with the project's non-test packages
  (deploy/install_deps.sh) and the backend (-DHOSTKV_ENABLE_CUDA=OFF / ON,
  the GPU build checking that its hostkvd has the CUDA backend), the GPU
  image's NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES with
  compute (none in the CPU image); base images pinned by digest (FROM a
  global ARG: its default); the build context (.dockerignore + COPY) holds
  what CMake needs to configure hostkvd and hostkv; the entrypoint restarts
  cleanly after the daemon was SIGKILLed (pid namespace + private /dev/shm,
  skipped where unshare is not permitted).
"""
import argparse
import glob
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError:
    sys.exit("deploy_test: python3-yaml is missing (deploy/install_deps.sh installs it)")

SOCKET_ENV = "HOSTKV_TARGET"
CONFIG_PATH = "/etc/hostkv/hostkvd.textproto"
CONFIG_DIR = os.path.dirname(CONFIG_PATH)
HEALTH_WORD = "health"
# The GPU image's tag: the version and this (Dockerfile target runtime-gpu).
GPU_TAG_SUFFIX = "-cuda"
# Memory a daemon container needs beyond --memory_budget (gRPC, copy threads,
# signal records, page I/O buffers).
MIN_OVERHEAD = 512 << 20
# Debian packages whose names say "this is a compiler / toolchain".
TOOLCHAIN = re.compile(r"^(gcc|g\+\+|cpp|clang|llvm|cmake|make|ninja-build|build-essential|"
                       r"binutils|protobuf-compiler.*|nvidia-cuda-toolkit|cuda-.*|.*-dev)(-\d.*)?$")
# Files the build reads (the build context must not lose them).
BUILD_INPUT = re.compile(r"(\.(h|hh|hpp|inc|c|cc|cpp|cu|cuh|proto|cmake|sh|in)|^CMakeLists\.txt)$")
# install_deps.sh packages that only the tests need (redis-server and
# redis-tools are the servers the tier tests start; libhiredis-dev is not
# among them: hostkvd's Redis tier is built with it).
TEST_ONLY = re.compile(r"^(libgtest-dev|libgmock-dev|libbenchmark-dev|python3-.*|clang|libclang-rt-.*"
                       r"|redis-server|redis-tools)$")


class Failures:
    def __init__(self):
        self.items = []

    def check(self, ok, where, message):
        if not ok:
            self.items.append(f"{where}: {message}")
        return ok

    def fail(self, where, message):
        self.items.append(f"{where}: {message}")


F = Failures()


def note(message):
    print(message, flush=True)


# ---------------------------------------------------------------------------
# Sizes and the daemon's flags

def parse_hostkvd_bytes(text):
    """server/byte_size.cc, in Python."""
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", str(text))
    if not m:
        return None
    units = {"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "KB": 1000, "M": 1 << 20,
             "MIB": 1 << 20, "MB": 10**6, "G": 1 << 30, "GIB": 1 << 30, "GB": 10**9,
             "T": 1 << 40, "TIB": 1 << 40, "TB": 10**12}
    scale = units.get(m.group(2).upper())
    return None if scale is None else int(m.group(1)) * scale


def parse_k8s_quantity(text):
    m = re.fullmatch(r"([0-9.]+)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|m)?", str(text))
    if not m:
        return None
    scale = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
             "Pi": 1 << 50, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "P": 10**15, "m": 1e-3}[m.group(2)]
    return float(m.group(1)) * scale


def parse_docker_bytes(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([bkmgt]?)b?", str(text).strip().lower())
    if not m:
        return None
    return float(m.group(1)) * {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30,
                                "t": 1 << 40}[m.group(2)]


def gib(n):
    return f"{n / (1 << 30):.2f} GiB"


class Hostkvd:
    """What `hostkvd --helpfull` says: flag names and defaults."""

    def __init__(self, binary):
        self.binary = binary
        out = subprocess.run([binary, "--helpfull"], capture_output=True, text=True,
                             timeout=30)
        text = out.stdout + out.stderr
        self.flags = set(re.findall(r"^\s+--([A-Za-z0-9_]+) \(", text, re.M))
        # absl's own: --help, --helpfull, ... are not listed by --helpfull.
        self.flags |= {"help", "helpfull", "helpshort", "helppackage", "version",
                       "only_check_args", "helpon", "helpmatch"}
        self.defaults = dict(re.findall(
            r"^\s+--([A-Za-z0-9_]+) \(.*?\);\s+default: \"?([^\";]*)\"?;", text, re.M | re.S))
        if "listen" not in self.flags or "memory_budget" not in self.flags:
            raise SystemExit(f"cannot read hostkvd's flags from `{binary} --helpfull`:\n{text}")

    def parse_args(self, args, where):
        """{name: value} of --name=value / --name value / --[no]bool args."""
        values = {}
        i = 0
        while i < len(args):
            arg = str(args[i])
            i += 1
            if not F.check(arg.startswith("-"), where,
                           f"argument '{arg}' is not a flag (hostkvd takes no positional "
                           f"arguments)"):
                continue
            body = arg.lstrip("-")
            name, eq, value = body.partition("=")
            if not eq:
                if name in self.flags and self.defaults.get(name) not in ("true", "false") \
                        and i < len(args) and not str(args[i]).startswith("-"):
                    value = str(args[i])
                    i += 1
                elif name.startswith("no") and name[2:] in self.flags:
                    name, value = name[2:], "false"
                else:
                    value = "true"
            F.check(name in self.flags, where,
                    f"--{name}: hostkvd has no such flag (it has: "
                    f"{', '.join(sorted(self.flags - {'help', 'helpfull', 'helpshort', 'helppackage', 'version', 'only_check_args', 'helpon', 'helpmatch', 'flagfile', 'fromenv', 'tryfromenv', 'undefok'}))})")
            values[name] = value
        if values.get("socket_group"):
            F.check(values["socket_group"] in IMAGE_GROUPS, where,
                    f"--socket_group={values['socket_group']}: the image has no such group "
                    f"(it has {sorted(IMAGE_GROUPS)})")
        for size_flag in ("memory_budget", "memory_reserve", "max_page_io", "tier_write_queue"):
            if size_flag in values:
                F.check(parse_hostkvd_bytes(values[size_flag]) is not None, where,
                        f"--{size_flag}={values[size_flag]} is not a size hostkvd parses "
                        f"(e.g. 512MiB, 64GiB)")
        return values

    def flag(self, values, name):
        return values.get(name, self.defaults.get(name, ""))


def listen_socket(hostkvd, values, where):
    listen = hostkvd.flag(values, "listen")
    if not F.check(listen.startswith("unix:/"), where,
                   f"--listen={listen}: the deployments share a Unix socket (unix:/PATH)"):
        return None
    return listen[len("unix:"):]


def health_command_ok(argv, socket_path, where, what):
    """argv must be [.../hostkv, --target=unix:SOCKET, health]."""
    argv = [str(a) for a in (argv or [])]
    ok = (len(argv) >= 3 and os.path.basename(argv[0]) == "hostkv"
          and f"--target=unix:{socket_path}" in argv[1:]
          and [a for a in argv[1:] if not a.startswith("-")] == [HEALTH_WORD])
    return F.check(ok, where, f"{what} should be [hostkv, --target=unix:{socket_path}, "
                              f"{HEALTH_WORD}], is {argv}")


# ---------------------------------------------------------------------------
# The daemon, started for real

class Protos:
    """hostkv_pb2 / hostkv_pb2_grpc generated from the source tree."""

    def __init__(self, source, workdir):
        from grpc_tools import protoc
        out = os.path.join(workdir, "py")
        os.makedirs(out)
        rc = protoc.main(["protoc", f"-I{source}/proto", f"--python_out={out}",
                          f"--grpc_python_out={out}", "hostkv/v1/hostkv.proto"])
        if rc != 0:
            raise SystemExit("protoc failed on proto/hostkv/v1/hostkv.proto")
        sys.path.insert(0, out)
        from hostkv.v1 import hostkv_pb2, hostkv_pb2_grpc  # noqa: E402
        from google.protobuf import text_format  # noqa: E402
        self.pb = hostkv_pb2
        self.grpc = hostkv_pb2_grpc
        self.text_format = text_format


def parse_config(protos, text, where):
    config = protos.pb.DaemonConfig()
    try:
        protos.text_format.Parse(text, config)
    except protos.text_format.ParseError as e:
        F.fail(where, f"not a text-format hostkv.v1.DaemonConfig: {e}")
        return None
    return config


def shrunk(protos, config):
    """The same pools with a few pages each (and no device_pool_tokens)."""
    small = protos.pb.DaemonConfig()
    small.CopyFrom(config)
    for pool in small.pools:
        pool.capacity_tokens = 4 * max(pool.page_size, 1)
        pool.device_pool_tokens = 0
    return small


def pool_bytes(spec, bytes_per_token):
    ps = max(spec.page_size, 1)
    if spec.WhichOneof("capacity") == "capacity_tokens":
        tokens = spec.capacity_tokens
    else:
        tokens = spec.capacity_bytes // bytes_per_token
    slots = (tokens // ps + 1) * ps
    return slots, slots * bytes_per_token


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp_ports(values):
    """Ports of the flags that listen on TCP (HOST:PORT values)."""
    return {int(v.rsplit(":", 1)[1]) for k, v in values.items()
            if k.endswith("listen") and re.fullmatch(r"[^/\s]*:\d+", v)}


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("HOSTKVD_")}


def wait_for(predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def write_secret(path, text, mode):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # whatever the umask
    with os.fdopen(fd, "w") as f:
        f.write(text)


def run_daemon(args, protos, config, where, probes, cli, workdir, secret_modes=None):
    """Starts hostkvd with the container's flags (--listen replaced by a temp
    socket, --memory_reserve 0, the config shrunk, each secret file
    (--tier_password_file, --metrics_token_file) a temporary one with the
    mode secret_modes gives its flag, 0600 otherwise), runs every probe
    command against it, and returns {pool name: bytes_per_token}."""
    import grpc
    tmp = tempfile.mkdtemp(prefix="run-", dir=workdir)
    sock = os.path.join(tmp, "hostkvd.sock")
    argv = [str(a) for a in args
            if not re.match(r"^--?(listen|socket_group|config|memory_reserve)(=|$)", str(a))]
    argv += [f"--listen=unix:{sock}", "--memory_reserve=0"]
    # A storage tier (--tier): the container's store is not here. A Redis
    # address becomes a loopback port nobody listens on and a Unix socket a
    # path that does not exist (the tier is down: the daemon must start and
    # serve anyway), a file tier a temporary directory, the password file a
    # temporary file.
    metrics_token = None
    for i, a in enumerate(argv):
        m = re.match(r"^--?(tier|tier_password_file|metrics_token_file)=(.*)$", a)
        if not m or not m.group(2):
            continue
        if m.group(1) in ("tier_password_file", "metrics_token_file"):
            path = os.path.join(tmp, m.group(1))
            write_secret(path, "deploy-test\n", (secret_modes or {}).get(m.group(1), 0o600))
            argv[i] = f"--{m.group(1)}={path}"
            if m.group(1) == "metrics_token_file":
                metrics_token = "deploy-test"
        elif m.group(2).startswith("redis://"):
            argv[i] = f"--tier=redis://127.0.0.1:{free_port()}"
        elif m.group(2).startswith("redis+unix:"):
            argv[i] = f"--tier=redis+unix:{os.path.join(tmp, 'no-redis.sock')}"
        elif m.group(2).startswith("file:"):
            os.makedirs(os.path.join(tmp, "tier"))
            argv[i] = f"--tier=file:{os.path.join(tmp, 'tier')}"
    # TCP endpoints (--metrics_listen=0.0.0.0:9464): a free loopback port.
    http = {}
    for i, a in enumerate(argv):
        m = re.match(r"^--?(\w*listen)=(\S*):(\d+)$", a)
        if m:
            port = free_port()
            argv[i] = f"--{m.group(1)}=127.0.0.1:{port}"
            http[m.group(1)] = port
    if config is not None:
        path = os.path.join(tmp, "hostkvd.textproto")
        with open(path, "w") as f:
            f.write(protos.text_format.MessageToString(shrunk(protos, config)))
        argv.append(f"--config={path}")
    log = open(os.path.join(tmp, "hostkvd.log"), "w+")
    daemon = subprocess.Popen([HOSTKVD.binary] + argv, stdout=log, stderr=subprocess.STDOUT,
                              env=clean_env())
    result = {}
    try:
        if not wait_for(lambda: os.path.exists(sock) or daemon.poll() is not None, 60) or \
                daemon.poll() is not None:
            log.seek(0)
            F.fail(where, f"hostkvd {' '.join(argv)} did not start:\n{log.read()}")
            return None
        for what, command, socket_path in probes:
            cmd = [cli if os.path.basename(str(command[0])) == "hostkv" else str(command[0])]
            cmd += [str(a).replace(f"unix:{socket_path}", f"unix:{sock}") for a in command[1:]]
            ok = False
            for _ in range(100):  # the socket exists a moment before SERVING
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
                if r.returncode == 0:
                    ok = True
                    break
                if "unknown command" in r.stderr:
                    break
                time.sleep(0.05)
            if F.check(ok, where, f"{what} `{shlex.join(command)}` against the running "
                                  f"daemon: exit {r.returncode}: {r.stdout.strip()} "
                                  f"{r.stderr.strip()}"):
                note(f"  {what}: `{shlex.join(command)}` exits 0 against the daemon")
        if "metrics_listen" in http:
            check_metrics(f"http://127.0.0.1:{http['metrics_listen']}/metrics", metrics_token,
                          where)
        channel = grpc.insecure_channel(f"unix:{sock}")
        stub = protos.grpc.HostKVStub(channel)
        pools = stub.ListPools(protos.pb.ListPoolsRequest(), timeout=10).pools
        result = {p.spec.name: p.bytes_per_token for p in pools}
        channel.close()
        if config is not None:
            for spec in config.pools:
                F.check(spec.name in result, where,
                        f"pool '{spec.name}' of the config was not created")
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(timeout=30)
        log.seek(0)
        F.check(rc == 0, where, f"hostkvd exited {rc} on SIGTERM:\n{log.read()}")
        F.check(not os.path.exists(sock), where, "the socket was not removed on SIGTERM")
        return result
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        log.close()


def check_metrics(url, token, where):
    """GET url serves hostkv_ metrics (with the token, if one is asked, and
    401 without it)."""
    import urllib.error
    import urllib.request
    try:
        if token is not None:
            try:
                urllib.request.urlopen(url, timeout=10).close()
                F.fail(where, f"{url} served without the --metrics_token_file token")
            except urllib.error.HTTPError as e:
                F.check(e.code == 401, where, f"{url} without the token: {e.code}, not 401")
        request = urllib.request.Request(url)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=10) as resp:
            body = resp.read().decode()
        F.check("hostkv_" in body, where, f"{url} serves no hostkv_ metrics")
        note(f"  {where}: --metrics_listen serves /metrics"
             + (" (with the token only)" if token is not None else ""))
    except OSError as e:
        F.fail(where, f"--metrics_listen: GET {url}: {e}")


def check_config_sizes(config, bytes_per_token, budget, where):
    total = 0
    for spec in config.pools:
        bpt = bytes_per_token.get(spec.name)
        if not bpt:
            continue
        slots, size = pool_bytes(spec, bpt)
        if spec.device_pool_tokens:
            F.check(slots > spec.device_pool_tokens, where,
                    f"pool '{spec.name}': {slots} token slots must exceed device_pool_tokens "
                    f"{spec.device_pool_tokens}")
        note(f"  {where}: pool '{spec.name}': {slots} token slots x {bpt} bytes = {gib(size)}")
        total += size
    if budget:
        F.check(total <= budget, where,
                f"the configured pools take {gib(total)}, more than --memory_budget {gib(budget)}")
    return total


# ---------------------------------------------------------------------------
# Kubernetes

WORKLOADS = {"Pod", "Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "CronJob"}


def pod_spec(obj):
    kind = obj.get("kind")
    if kind == "Pod":
        return obj.get("spec") or {}
    if kind == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def is_hostkvd_image(image):
    return str(image).rsplit(":", 1)[0].split("@")[0] == IMAGE_REPO


def runs_daemon(container, compose=False):
    """The hostkvd image with its entrypoint (or an explicit hostkvd)."""
    if not is_hostkvd_image(container.get("image", "")):
        return False
    # Kubernetes' command replaces the ENTRYPOINT, Compose's entrypoint does.
    command = container.get("entrypoint" if compose else "command")
    if not command:
        return True
    if isinstance(command, str):
        command = shlex.split(command)
    return os.path.basename(str(command[0])) in ("hostkvd", "hostkvd-entrypoint")


def runs_keeper(container):
    """The hostkvd image as the state keeper (--state_keeper=PATH)."""
    if not runs_daemon(container):
        return False
    argv = [str(a) for a in (container.get("command") or [])[1:]] + \
        [str(a) for a in container.get("args") or []]
    return any(a.startswith("--state_keeper=") for a in argv)


def keeper_path(container):
    argv = [str(a) for a in (container.get("command") or [])[1:]] + \
        [str(a) for a in container.get("args") or []]
    return next(a.split("=", 1)[1] for a in argv if a.startswith("--state_keeper="))


def mounts_at(container, path):
    return [m for m in container.get("volumeMounts") or [] if m.get("mountPath") == path]


def security(spec, container, key):
    ctx = container.get("securityContext") or {}
    if key in ctx:
        return ctx[key]
    return (spec.get("securityContext") or {}).get(key)


def volume(spec, name):
    for v in spec.get("volumes") or []:
        if v.get("name") == name:
            return v
    return None


def shm_source(spec, container, where):
    """('emptyDir', pod-local id, size) / ('hostPath', path, None) / None."""
    mounts = mounts_at(container, "/dev/shm")
    if not F.check(len(mounts) == 1, where, "mounts nothing at /dev/shm (the pools, signal "
                                            "records and device buffers live there)"):
        return None
    v = volume(spec, mounts[0]["name"]) or {}
    if "emptyDir" in v:
        e = v["emptyDir"] or {}
        F.check(e.get("medium") == "Memory", where,
                "the /dev/shm emptyDir must be medium: Memory (tmpfs)")
        size = parse_k8s_quantity(e["sizeLimit"]) if "sizeLimit" in e else None
        F.check(size is not None, where, "the /dev/shm emptyDir needs a sizeLimit "
                                         "(its tmpfs size; >= --memory_budget)")
        return ("emptyDir", v["name"], size)
    if "hostPath" in v:
        path = v["hostPath"].get("path")
        F.check(path == "/dev/shm", where, f"/dev/shm comes from hostPath {path}, not /dev/shm")
        F.check(spec.get("hostIPC") is True, where,
                "the host's /dev/shm is shared, but hostIPC is not true")
        return ("hostPath", path, None)
    F.fail(where, f"/dev/shm volume '{mounts[0]['name']}' is neither a memory emptyDir nor "
                  f"hostPath /dev/shm")
    return None


def socket_source(spec, container, socket_dir, where):
    mounts = mounts_at(container, socket_dir)
    # An emptyDir is world-writable without the sticky bit, which hostkvd refuses as
    # its socket directory (others could replace the socket): the socket goes in a
    # subdirectory of the emptyDir, which hostkvd creates 0750.
    in_subdir = False
    if not mounts:
        up = mounts_at(container, os.path.dirname(socket_dir))
        if len(up) == 1 and "emptyDir" in (volume(spec, up[0]["name"]) or {}):
            mounts, in_subdir = up, True
    if not F.check(len(mounts) == 1, where,
                   f"mounts nothing at {socket_dir} (the directory of the socket)"):
        return None
    v = volume(spec, mounts[0]["name"]) or {}
    if "emptyDir" in v:
        F.check(in_subdir, where,
                f"the socket directory {socket_dir} is an emptyDir (world-writable, no "
                f"sticky bit: hostkvd refuses it); put the socket in a subdirectory "
                f"hostkvd creates, e.g. {socket_dir}/hostkvd/hostkvd.sock")
        return ("emptyDir", v["name"])
    if "hostPath" in v:
        return ("hostPath", v["hostPath"].get("path"))
    F.fail(where, f"the socket volume '{mounts[0]['name']}' is neither an emptyDir nor a "
                  f"hostPath")
    return None


def config_text(spec, container, configmaps, namespace, where):
    """The text the entrypoint would find at /etc/hostkv/hostkvd.textproto."""
    for m in container.get("volumeMounts") or []:
        path = m.get("mountPath")
        v = volume(spec, m.get("name")) or {}
        if "configMap" not in v:
            continue
        cm_name = v["configMap"].get("name")
        cm = configmaps.get((namespace, cm_name))
        if path == CONFIG_DIR and not m.get("subPath"):
            items = v["configMap"].get("items")
            key = os.path.basename(CONFIG_PATH)
            if items:
                key = next((i["key"] for i in items if i.get("path") == key), None)
        elif path == CONFIG_PATH and m.get("subPath"):
            key = m["subPath"]
        else:
            continue
        if not F.check(cm is not None, where, f"ConfigMap {namespace}/{cm_name} is not in the "
                                              f"same file"):
            return None
        if not F.check(key in (cm.get("data") or {}), where,
                       f"ConfigMap {cm_name} has no key for {CONFIG_PATH}"):
            return None
        return cm["data"][key]
    return None


def check_k8s_tier(values, spec, container, docs, namespace, where):
    """--tier points at what the file provides: a Service NAME.NAMESPACE.svc
    of the file that has the port; a file tier or Redis Unix socket in a
    mounted volume; the password file in a mounted Secret that has that key,
    readable by the daemon. Returns {"tier_password_file": its file mode}
    (empty without one)."""
    modes = {}
    def find(kind, name, ns):
        return next((d for d in docs if d.get("kind") == kind
                     and (d.get("metadata") or {}).get("name") == name
                     and (d.get("metadata") or {}).get("namespace", "default") == ns), None)

    def mount_of(path):
        """The volumeMount holding path (the longest mountPath), or None."""
        best = None
        for m in container.get("volumeMounts") or []:
            mp = str(m.get("mountPath", "")).rstrip("/")
            if (path == mp or path.startswith(mp + "/")) and \
                    (best is None or len(mp) > len(str(best.get("mountPath")))):
                best = m
        return best

    tier = values.get("tier", "")
    if tier.startswith("redis://"):
        for addr in tier[len("redis://"):].split(","):
            host, _, port = addr.rpartition(":")
            if not F.check(host and port.isdigit(), where,
                           f"--tier: '{addr}' is not HOST:PORT"):
                continue
            m = re.fullmatch(r"([a-z0-9-]+)\.([a-z0-9-]+)\.svc(\.cluster\.local)?", host)
            if not m:
                continue  # a pod's name (StatefulSet), an IP, an outside host
            svc = find("Service", m.group(1), m.group(2))
            if F.check(svc is not None, where,
                       f"--tier: Service {m.group(2)}/{m.group(1)} is not in the same file"):
                ports = {p.get("port") for p in (svc.get("spec") or {}).get("ports") or []}
                F.check(int(port) in ports, where,
                        f"--tier: Service {m.group(1)} has no port {port} (it has {sorted(ports)})")
    elif tier.startswith(("file:", "redis+unix:")):
        path = tier.partition(":")[2]
        m = mount_of(path)
        F.check(m is not None, where, f"--tier={tier}: {path} is in no mounted volume (the "
                                      f"container's own filesystem is neither shared nor kept)")
        if m is not None and tier.startswith("file:") \
                and values.get("tier_read_only", "false") != "true":
            F.check(not m.get("readOnly"), where, f"--tier={tier}: the volume is mounted "
                                                  f"read-only (--tier_read_only is not set)")
    password = values.get("tier_password_file")
    if password:
        m = mount_of(password)
        v = volume(spec, m.get("name")) if m else None
        if F.check(v is not None and "secret" in v, where,
                   f"--tier_password_file={password} is not in a mounted Secret"):
            F.check(m.get("readOnly") is True, where, "the tier password Secret is not mounted "
                                                      "readOnly")
            rel = m["subPath"] if m.get("subPath") else os.path.relpath(password, m["mountPath"])
            items = v["secret"].get("items")
            key = next((i["key"] for i in items if i.get("path") == rel), None) if items else rel
            mode = check_secret_readable(spec, v, key, security(spec, container, "runAsUser"),
                                         where, "--tier_password_file")
            if mode is not None:
                modes["tier_password_file"] = mode
            secret = find("Secret", v["secret"].get("secretName"), namespace)
            if secret is not None:
                keys = set((secret.get("data") or {})) | set((secret.get("stringData") or {}))
                F.check(key in keys, where, f"--tier_password_file={password}: Secret "
                                            f"{v['secret'].get('secretName')} has no key {key}")
            else:
                F.check(key is not None, where, f"--tier_password_file={password}: the Secret "
                                                f"volume's items do not map {rel}")
    return modes


# What kubelet adds to a read-only (Secret, ConfigMap) volume's file modes
# when the pod has an fsGroup (pkg/volume/volume_linux.go: roMask): the
# files become group fsGroup, and group-readable.
FSGROUP_READ = 0o440


def secret_file_mode(spec, v, key=None):
    """The mode kubelet gives the files of Secret volume v (the item mapping
    key, if given): its item's mode or defaultMode (None: none given), with
    the fsGroup bits."""
    secret = v.get("secret") or {}
    mode = secret.get("defaultMode")
    for item in secret.get("items") or []:
        if key is not None and item.get("key") == key and "mode" in item:
            mode = item["mode"]
    if mode is None:
        return None
    if (spec.get("securityContext") or {}).get("fsGroup") is not None:
        mode |= FSGROUP_READ
    return mode


def check_k8s_secret_volumes(spec, where):
    """Every Secret volume names its mode, and no other user may read or
    write its files (hostkvd refuses such a secret file)."""
    for v in spec.get("volumes") or []:
        if "secret" not in v:
            continue
        name = v.get("name")
        items = (v["secret"].get("items") or [])
        keys = [i.get("key") for i in items] or [None]
        for key in keys:
            mode = secret_file_mode(spec, v, key)
            what = f"Secret volume {name}" + (f" item {key}" if key else "")
            if not F.check(mode is not None, where,
                           f"{what} has no defaultMode: Kubernetes' default 0644 lets every "
                           f"user of the node read it, and hostkvd refuses such a file"):
                continue
            F.check(mode & 0o007 == 0, where,
                    f"{what}: mode {mode:04o} lets other users read or write it (hostkvd "
                    f"refuses it): use defaultMode 0440 with the pod's fsGroup, or 0400")
            if mode & 0o007 == 0:
                note(f"  {where}: {what}: mode {mode:04o}")


def check_secret_readable(spec, v, key, uid, where, flag):
    """The daemon (uid, not root) can read a file of Secret volume v: the
    files are root's, so only through the fsGroup's read bit. Returns the
    file's mode (or None)."""
    mode = secret_file_mode(spec, v, key)
    fs_group = (spec.get("securityContext") or {}).get("fsGroup")
    if mode is None or uid == 0:
        return mode
    F.check(fs_group is not None and mode & 0o040, where,
            f"{flag}: the Secret's files are root's {mode:04o}"
            + ("" if fs_group is not None else " without an fsGroup")
            + f": uid {uid} cannot read them (set the pod's fsGroup, defaultMode 0440)")
    return mode


def granted_caps(spec, container):
    """The capabilities a container's process gets, as setpriv names them:
    the runtime's default set minus securityContext.capabilities.drop plus add
    (drop: [ALL] is the only form the manifests use)."""
    caps = (container.get("securityContext") or {}).get("capabilities") or {}
    drop = [str(c).upper() for c in caps.get("drop") or []]
    if "ALL" not in drop:
        return None
    return sorted(str(c).lower().removeprefix("cap_") for c in caps.get("add") or [])


def check_init_command(spec, init, socket_dir, where):
    """Runs an init container's command that prepares the hostPath socket
    directory exactly as the manifest grants it (its runAsUser, only its
    capabilities, no new privileges) on a fresh directory as kubelet creates
    it (root, 0755) and again on the re-used one (a node's second pod, an
    init retry): both runs must exit 0 and leave the directory the image
    uid's, 0750."""
    cmd = [str(a) for a in init.get("command") or []] + [str(a) for a in init.get("args") or []]
    mount = next((m for m in init.get("volumeMounts") or []
                  if os.path.normpath(m.get("mountPath", "")) == socket_dir), None)
    caps = granted_caps(spec, init)
    uid = security(spec, init, "runAsUser")
    if not F.check(cmd and mount and caps is not None, where,
                   f"cannot tell what the init container runs on {socket_dir} (command, a "
                   f"mount at {socket_dir}, capabilities with drop: [ALL])"):
        return
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        note(f"{where}: not root or no setpriv: the init command is not run")
        return
    base = tempfile.mkdtemp(prefix="hostkv-init-")
    try:
        os.chmod(base, 0o755)
        target = os.path.join(base, "hostkv")
        os.mkdir(target, 0o755)  # kubelet's DirectoryOrCreate: root, 0755
        os.chmod(target, 0o755)
        argv = [a.replace(socket_dir, target) for a in cmd]
        bounding = ",".join(["-all"] + [f"+{c}" for c in caps])
        run = ["setpriv", f"--reuid={uid if uid is not None else 0}", "--clear-groups",
               f"--bounding-set={bounding}", "--inh-caps=-all", "--ambient-caps=-all",
               "--no-new-privs", "--"] + argv
        for attempt in ("a fresh directory (root, 0755)", "the re-used directory"):
            r = subprocess.run(run, capture_output=True, text=True, timeout=30)
            st = os.stat(target)
            ok = F.check(r.returncode == 0, where,
                         f"{shlex.join(cmd)} with only {caps or 'no capabilities'} fails on "
                         f"{attempt}: {(r.stderr or r.stdout).strip()} (the pod never starts: "
                         f"Init:CrashLoopBackOff)")
            ok = F.check(st.st_uid == IMAGE_UID and st.st_gid == IMAGE_UID and
                         (st.st_mode & 0o7777) == 0o750, where,
                         f"after {attempt} the directory is {st.st_uid}:{st.st_gid} "
                         f"{st.st_mode & 0o7777:04o}, not {IMAGE_UID}:{IMAGE_UID} 0750") and ok
            if not ok:
                break
            # What a daemon leaves there for the next pod on the node.
            with open(os.path.join(target, "hostkvd.sock.lock"), "w"):
                pass
            os.chown(os.path.join(target, "hostkvd.sock.lock"), IMAGE_UID, IMAGE_UID)
        else:
            note(f"{where}: {shlex.join(cmd)} under setpriv with only {caps}: fresh and re-used "
                 f"directory end {IMAGE_UID}:{IMAGE_UID} 0750")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def check_no_secret_in_argv(container, where):
    """No Secret's value reaches a command line (every user of the node sees
    it in `ps`): no $(VAR) of a secretKeyRef variable in command/args."""
    secret_vars = {e.get("name") for e in container.get("env") or []
                   if "secretKeyRef" in ((e.get("valueFrom") or {}))}
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    for var in secret_vars:
        F.check(not any(f"$({var})" in a for a in argv), where,
                f"the Secret in ${var} is put on the command line ($({var})): `ps` shows it")


def check_redis_command(spec, container, where, workdir):
    """Runs the Redis container's command with Debian's redis-server, its
    Secret's password file in a temporary directory and a Unix socket for
    its port: it must start, refuse a client without the password, answer
    the readiness probe's command, and show no password in its argv."""
    if shutil.which("redis-server") is None:
        note(f"  {where}: redis-server not installed; its command not run")
        return
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    if not F.check(argv[:2] == ["sh", "-c"], where, "the Redis command is not `sh -c ...`"):
        return
    mount = next((m for m in container.get("volumeMounts") or []
                  if "secret" in (volume(spec, m.get("name")) or {})), None)
    if not F.check(mount is not None, where, "Redis mounts no Secret (where is its password?)"):
        return
    password = "pw-" + os.urandom(8).hex()
    secrets = os.path.join(workdir, "redis-secret")
    os.makedirs(secrets, exist_ok=True)
    write_secret(os.path.join(secrets, "password"), password, 0o440)
    sock = os.path.join(workdir, "redis.sock")
    script = (argv[2].replace(mount["mountPath"], secrets)
              .replace("--port 6379", f"--port 0 --unixsocket {sock} --dir {workdir}"))
    probe = " ".join(str(a) for a in container["readinessProbe"]["exec"]["command"][2:])
    probe = probe.replace(mount["mountPath"], secrets).replace("redis-cli", f"redis-cli -s {sock}")
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        started = wait_for(lambda: os.path.exists(sock), 10)
        if not F.check(started, where, "Redis did not start with its command"):
            return
        bare = subprocess.run(["redis-cli", "-s", sock, "ping"], capture_output=True, text=True)
        F.check("NOAUTH" in bare.stdout + bare.stderr, where,
                f"Redis answered a client without the password: {bare.stdout!r}")
        F.check(subprocess.run(["sh", "-c", probe]).returncode == 0, where,
                "the readiness probe's command fails against Redis")
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        F.check(password not in ps, where, "the Redis password is on a command line (ps)")
        note(f"  {where}: Redis runs its command, needs the password, ps shows none")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def check_k8s_file(path, docs, protos, cli, workdir):
    rel = os.path.relpath(path, SOURCE)
    configmaps = {}
    for d in docs:
        if d.get("kind") == "ConfigMap":
            md = d.get("metadata") or {}
            configmaps[(md.get("namespace", "default"), md.get("name"))] = d
    daemons, engines, keepers = [], [], []
    for d in docs:
        if d.get("kind") not in WORKLOADS:
            continue
        md = d.get("metadata") or {}
        namespace = md.get("namespace", "default")
        spec = pod_spec(d)
        check_k8s_secret_volumes(spec, f"{rel}: {d['kind']}/{md.get('name')}")
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            where = f"{rel}: {d['kind']}/{md.get('name')}: container {c.get('name')}"
            image = c.get("image", "")
            check_no_secret_in_argv(c, where)
            if "hostkv" in image:
                IMAGES.append((where, image))
            if image.startswith("redis:"):
                check_redis_command(spec, c, where, workdir)
            if runs_keeper(c):
                keepers.append((where, spec, c))
            elif runs_daemon(c):
                if c in (spec.get("initContainers") or []):
                    F.check(c.get("restartPolicy") == "Always", where,
                            "hostkvd as an init container must be a native sidecar "
                            "(restartPolicy: Always)")
                daemons.append((where, spec, c, namespace))
            elif any(e.get("name") == SOCKET_ENV for e in c.get("env") or []):
                engines.append((where, spec, c))
    F.check(daemons, rel, "no container runs the hostkvd image")
    for where, spec, c in keepers:
        # The keeper of a daemon in the same pod: on "<its socket>.state", in
        # the socket's volume, as the daemon's uid (it accepts only that uid),
        # a native sidecar so that it starts first and outlives the daemon.
        path = keeper_path(c)
        listens = []
        for _, dspec, d, _ in daemons:
            if dspec is not spec:
                continue
            argv = [str(a) for a in (d.get("command") or [])[1:]] + \
                [str(a) for a in d.get("args") or []]
            listens += [a.split("=", 1)[1] for a in argv if a.startswith("--listen=unix:")]
        F.check(any(path == l[len("unix:"):] + ".state" for l in listens), where,
                f"--state_keeper={path} is not <a hostkvd socket of the pod>.state "
                f"({listens})")
        F.check(mounts_at(c, os.path.dirname(path)), where,
                f"mounts nothing at {os.path.dirname(path)} (the daemon's socket volume)")
        F.check(security(spec, c, "runAsUser") == IMAGE_UID, where,
                f"runAsUser is not the image's uid {IMAGE_UID} (the keeper serves its own uid only)")
        if c in (spec.get("initContainers") or []):
            F.check(c.get("restartPolicy") == "Always", where,
                    "the keeper as an init container must be a native sidecar "
                    "(restartPolicy: Always)")
    F.check(engines, rel, f"no engine container (one with {SOCKET_ENV})")

    sockets = []  # (socket path, socket source, shm source, uid, spec)
    for where, spec, c, namespace in daemons:
        args = [str(a) for a in c.get("args") or []]
        cmd = c.get("command") or []
        if cmd and os.path.basename(str(cmd[0])) == "hostkvd":
            args = [str(a) for a in cmd[1:]] + args
        values = HOSTKVD.parse_args(args, where)
        for e in c.get("env") or []:
            name = e.get("name", "")
            if name.startswith("HOSTKVD_") and name != "HOSTKVD_CONFIG":
                F.check(name[len("HOSTKVD_"):].lower() in HOSTKVD.flags, where,
                        f"env {name} names no hostkvd flag")
        secret_modes = check_k8s_tier(values, spec, c, docs, namespace, where)
        socket_path = listen_socket(HOSTKVD, values, where)
        if socket_path is None:
            continue
        socket_dir = os.path.dirname(socket_path)
        sock_src = socket_source(spec, c, socket_dir, where)
        shm = shm_source(spec, c, where)
        uid = security(spec, c, "runAsUser")
        F.check(uid == IMAGE_UID, where,
                f"runAsUser is {uid}, not the image's uid {IMAGE_UID}")
        F.check(security(spec, c, "runAsNonRoot") is True, where, "runAsNonRoot is not true")
        if sock_src and sock_src[0] == "hostPath":
            # kubelet creates it root-owned: someone must give it to the daemon.
            inits = [i for i in spec.get("initContainers") or []
                     if i is not c and i.get("restartPolicy") != "Always" and any(m.get("name") == mounts_at(c, socket_dir)[0]["name"]
                                           for m in i.get("volumeMounts") or [])]
            F.check(any(str(IMAGE_UID) in " ".join(map(str, i.get("command") or []))
                        for i in inits), where,
                    f"the hostPath socket directory is root-owned until an init container "
                    f"gives it to uid {IMAGE_UID}")
            for i in inits:
                check_init_command(spec, i, socket_dir, f"{where}: init container {i.get('name')}")

        probes = []
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            probe = c.get(kind)
            if probe is None:
                F.check(kind == "startupProbe", where, f"no {kind}")
                continue
            command = (probe.get("exec") or {}).get("command")
            if health_command_ok(command, socket_path, where, f"{kind}.exec.command"):
                probes.append((f"{where}: {kind}", command, socket_path))

        text = config_text(spec, c, configmaps, namespace, where)
        F.check(not any(a.startswith(("--config", "-config")) for a in args) or text is None,
                where, f"--config given although {CONFIG_PATH} is mounted (the entrypoint "
                       f"passes it)")
        config = parse_config(protos, text, f"{where}: {CONFIG_PATH}") if text else None
        if config is not None:
            check_config_flags(config, f"{where}: {CONFIG_PATH}")
        bpt = run_daemon(args, protos, config, where, probes, cli, workdir,
                         secret_modes=secret_modes)

        budget = parse_hostkvd_bytes(HOSTKVD.flag(values, "memory_budget")) or 0
        F.check(budget > 0, where, "no --memory_budget: in a container hostkvd sees the node's "
                                   "memory, not the container's limit")
        if config is not None and bpt is not None:
            check_config_sizes(config, bpt, budget, where)
        res = c.get("resources") or {}
        req = parse_k8s_quantity((res.get("requests") or {}).get("memory", "0")) or 0
        lim = parse_k8s_quantity((res.get("limits") or {}).get("memory", "0")) or 0
        F.check(req >= budget + MIN_OVERHEAD, where,
                f"memory request {gib(req)} < --memory_budget {gib(budget)} + "
                f"{gib(MIN_OVERHEAD)} (the pool pages are charged to this container)")
        F.check(lim == 0 or lim >= req, where, "memory limit below the request")
        if shm and shm[0] == "emptyDir" and shm[2] is not None:
            F.check(shm[2] >= budget, where,
                    f"/dev/shm sizeLimit {gib(shm[2])} < --memory_budget {gib(budget)}")
        cpu = (res.get("requests") or {}).get("cpu") or (res.get("limits") or {}).get("cpu")
        if cpu is not None:
            threads = int(HOSTKVD.flag(values, "copy_threads") or 0)
            F.check(0 < threads <= math.ceil(parse_k8s_quantity(cpu)), where,
                    f"--copy_threads={threads} with a CPU request of {cpu} (0 = one per "
                    f"core of the node)")
        declared = {p.get("containerPort") for p in c.get("ports") or []}
        for port in tcp_ports(values):
            F.check(port in declared, where, f"listens on TCP port {port} (flags) but does not "
                                             f"declare it in ports")
        gpu = is_gpu_image(c.get("image", ""))
        if gpu:
            check_k8s_gpu_daemon(spec, c, where)
        sockets.append((socket_path, sock_src, shm, uid, spec, gpu))

    for where, spec, c in engines:
        target = next(e.get("value") for e in c.get("env") or [] if e.get("name") == SOCKET_ENV)
        matched = False
        for socket_path, sock_src, shm, uid, dspec, gpu in sockets:
            if target != f"unix:{socket_path}":
                continue
            matched = True
            if gpu:
                check_k8s_gpu_engine(spec, dspec, c, where)
            src = socket_source(spec, c, os.path.dirname(socket_path), where)
            eshm = shm_source(spec, c, where)
            if dspec is spec:
                F.check(src == sock_src, where, f"the socket volume {src} is not the daemon's "
                                                f"{sock_src}")
                F.check(eshm == shm, where, f"/dev/shm {eshm} is not the daemon's {shm}")
            else:
                F.check(src and src[0] == "hostPath" and src == sock_src, where,
                        f"across pods the socket directory must be the daemon's hostPath "
                        f"{sock_src}, is {src}")
                F.check(eshm and eshm[0] == "hostPath" and shm and shm[0] == "hostPath", where,
                        "across pods both must use the host's /dev/shm (hostIPC + hostPath)")
            # The socket is 0660 (uid/gid 10001): the engine needs that uid or
            # that group. Its device buffers are sealed memfds it passes over
            # the session socket, so any uid with socket access works.
            euid = security(spec, c, "runAsUser")
            pod = spec.get("securityContext") or {}
            groups = {security(spec, c, "runAsGroup"), pod.get("fsGroup"),
                      *(pod.get("supplementalGroups") or [])}
            F.check(euid == uid or uid in groups, where,
                    f"runAsUser {euid} without group {uid}: cannot open the daemon's socket "
                    f"(mode 0660; runAsGroup, fsGroup or supplementalGroups {uid})")
        F.check(matched, where, f"{SOCKET_ENV}={target} is not the socket of any hostkvd in "
                                f"the file ({[s[0] for s in sockets]})")


def is_gpu_image(image):
    return is_hostkvd_image(image) and str(image).endswith(GPU_TAG_SUFFIX)


def gpu_request(c):
    res = c.get("resources") or {}
    return any("nvidia.com/gpu" in (res.get(k) or {}) for k in ("limits", "requests"))


def check_k8s_gpu_daemon(spec, c, where):
    """The GPU image's daemon: the NVIDIA runtime mounts the driver and every
    GPU of the node, and the daemon takes no GPU from the engines."""
    F.check(spec.get("runtimeClassName"), where,
            "the GPU image without runtimeClassName: no NVIDIA runtime mounts the driver")
    F.check(not gpu_request(c), where,
            "requests nvidia.com/gpu: the device plugin would give the daemon GPUs the engines "
            "then cannot have (NVIDIA_VISIBLE_DEVICES=all shows it every GPU instead)")
    env = {e.get("name"): str(e.get("value")) for e in c.get("env") or []}
    F.check(env.get("NVIDIA_VISIBLE_DEVICES", "all") == "all", where,
            f"NVIDIA_VISIBLE_DEVICES={env.get('NVIDIA_VISIBLE_DEVICES')}: the daemon opens the "
            f"engines' buffers on whichever GPU they are")
    caps = env.get("NVIDIA_DRIVER_CAPABILITIES", "compute,utility").split(",")
    F.check("compute" in caps or "all" in caps, where,
            "NVIDIA_DRIVER_CAPABILITIES without compute: libcuda is not mounted")


def check_k8s_gpu_engine(spec, dspec, c, where):
    """CUDA IPC names the exporting process by pid: the engine and hostkvd
    must see each other's pids and share the IPC namespace."""
    F.check(gpu_request(c), where, "an engine of the GPU daemon requests no nvidia.com/gpu")
    if dspec is spec:
        F.check(spec.get("shareProcessNamespace") is True, where,
                "same pod as the GPU daemon without shareProcessNamespace: true (CUDA IPC)")
    else:
        for name, pod in (("engine", spec), ("daemon", dspec)):
            F.check(pod.get("hostPID") is True and pod.get("hostIPC") is True, where,
                    f"the {name} pod lacks hostPID/hostIPC: CUDA IPC across pods needs both")


def check_config_flags(config, where):
    if "flags" in config.DESCRIPTOR.fields_by_name:
        for name in config.flags:
            F.check(name in HOSTKVD.flags, where, f"flags {{ key: \"{name}\" }}: hostkvd has "
                                                  f"no such flag")


# ---------------------------------------------------------------------------
# Compose

def compose_list(value):
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def compose_env(service):
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
    return env


def compose_mounts(service):
    """[(source, target, type)] of short and long volume syntax."""
    out = []
    for v in service.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            if len(parts) >= 2:
                src = parts[0]
                kind = "bind" if src.startswith((".", "/", "~")) else "volume"
                out.append((src, parts[1], kind))
        else:
            out.append((v.get("source"), v.get("target"), v.get("type", "volume")))
    return out


def check_compose_file(path, doc, protos, cli, workdir):
    rel = os.path.relpath(path, SOURCE)
    base = os.path.dirname(path)
    services = doc.get("services") or {}
    daemons = {n: s for n, s in services.items() if runs_daemon(s, compose=True)}
    engines = {n: s for n, s in services.items()
               if n not in daemons and SOCKET_ENV in compose_env(s)}
    F.check(daemons, rel, "no service runs the hostkvd image")
    F.check(engines, rel, f"no engine service (one with {SOCKET_ENV})")
    for name, s in services.items():
        if "hostkv" in str(s.get("image", "")):
            IMAGES.append((f"{rel}: service {name}", s["image"]))
    sockets = {}
    for name, s in daemons.items():
        where = f"{rel}: service {name}"
        build = s.get("build")
        if build is not None:
            context = build if isinstance(build, str) else build.get("context", ".")
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile",
                                                                               "Dockerfile")
            F.check(os.path.realpath(os.path.join(base, context, dockerfile))
                    == os.path.realpath(DOCKERFILE), where,
                    f"build {context}/{dockerfile} is not the repository's Dockerfile")
        args = compose_list(s.get("command")) or compose_list(
            ["--listen=unix:" + SOCKET_DEFAULT])
        values = HOSTKVD.parse_args(args, where)
        for k in compose_env(s):
            if k.startswith("HOSTKVD_") and k != "HOSTKVD_CONFIG":
                F.check(k[len("HOSTKVD_"):].lower() in HOSTKVD.flags, where,
                        f"environment {k} names no hostkvd flag")
        socket_path = listen_socket(HOSTKVD, values, where)
        if socket_path is None:
            continue
        mounts = compose_mounts(s)
        sock = [m for m in mounts if m[1] == os.path.dirname(socket_path)]
        F.check(len(sock) == 1 and sock[0][2] == "volume", where,
                f"no named volume at {os.path.dirname(socket_path)}")
        F.check(str(s.get("ipc")) in ("shareable", "host"), where,
                f"ipc: {s.get('ipc')}: engines cannot join its IPC namespace and /dev/shm "
                f"(ipc: shareable)")
        user = str(s.get("user", IMAGE_UID)).split(":")[0]
        F.check(user == str(IMAGE_UID), where, f"user {user} is not the image's {IMAGE_UID}")
        hc = s.get("healthcheck") or {}
        test = compose_list(hc.get("test"))
        probes = []
        if F.check(test[:1] == ["CMD"], where, "healthcheck.test should be [CMD, hostkv, ...]") \
                and health_command_ok(test[1:], socket_path, where, "healthcheck.test"):
            probes.append((f"{where}: healthcheck", test[1:], socket_path))
        F.check(str(s.get("stop_signal", "SIGTERM")) == "SIGTERM", where,
                "stop_signal should be SIGTERM (drain, then stop)")
        config = None
        for src, target, kind in mounts:
            if target == CONFIG_PATH:
                cfg_path = os.path.join(base, src)
                if F.check(os.path.isfile(cfg_path), where, f"config {src} does not exist"):
                    with open(cfg_path) as f:
                        config = parse_config(protos, f.read(), f"{where}: {src}")
                    if config is not None:
                        check_config_flags(config, f"{where}: {src}")
        bpt = run_daemon(args, protos, config, where, probes, cli, workdir)
        budget = parse_hostkvd_bytes(HOSTKVD.flag(values, "memory_budget")) or 0
        F.check(budget > 0, where, "no --memory_budget (the container limit is invisible to "
                                   "hostkvd)")
        if config is not None and bpt is not None:
            check_config_sizes(config, bpt, budget, where)
        shm = parse_docker_bytes(s.get("shm_size", "64m"))
        F.check(shm is not None and shm >= budget, where,
                f"shm_size {s.get('shm_size', '64m (default)')} < --memory_budget {gib(budget)}")
        if "mem_limit" in s:
            F.check(parse_docker_bytes(s["mem_limit"]) >= budget + MIN_OVERHEAD, where,
                    f"mem_limit {s['mem_limit']} < --memory_budget + {gib(MIN_OVERHEAD)}")
        sockets[name] = (socket_path, sock[0][0] if sock else None)

    for name, s in engines.items():
        where = f"{rel}: service {name}"
        target = compose_env(s)[SOCKET_ENV]
        owner = [d for d, (p, _) in sockets.items() if target == f"unix:{p}"]
        if not F.check(owner, where, f"{SOCKET_ENV}={target} is not any hostkvd's socket"):
            continue
        socket_path, vol = sockets[owner[0]]
        F.check((vol, os.path.dirname(socket_path), "volume") in compose_mounts(s), where,
                f"does not mount volume {vol} at {os.path.dirname(socket_path)}")
        F.check(str(s.get("ipc")) in (f"service:{owner[0]}", "host"), where,
                f"ipc: {s.get('ipc')}: must be service:{owner[0]} to share its /dev/shm")
        F.check("shm_size" not in s, where, "shm_size on a service that joins another's IPC "
                                            "namespace has no effect")
        user = str(s.get("user", IMAGE_UID if is_hostkvd_image(s.get("image")) else ""))
        groups = {user.partition(":")[2], *(str(g) for g in s.get("group_add") or [])}
        F.check(user.split(":")[0] == str(IMAGE_UID) or str(IMAGE_UID) in groups, where,
                f"user '{user}' without group {IMAGE_UID}: cannot open the daemon's socket "
                f"(mode 0660; user {IMAGE_UID}, group {IMAGE_UID} or group_add)")
        dep = s.get("depends_on") or {}
        F.check(isinstance(dep, dict) and (dep.get(owner[0]) or {}).get("condition")
                == "service_healthy", where,
                f"should depend on {owner[0]} with condition: service_healthy")


# ---------------------------------------------------------------------------
# Dockerfile

def dockerfile_instructions(path):
    """[(line number, INSTRUCTION, argument text)], continuations joined."""
    out, buf, start = [], "", 0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            stripped = line.strip()
            if not buf and (not stripped or stripped.startswith("#")):
                continue
            if buf and stripped.startswith("#"):
                continue
            if not buf:
                start = n
            if stripped.endswith("\\"):
                buf += stripped[:-1] + " "
                continue
            buf += stripped
            word, _, rest = buf.partition(" ")
            out.append((start, word.upper(), rest.strip()))
            buf = ""
    return out


def exec_form(text):
    text = text.strip()
    if text.startswith("["):
        import json
        return json.loads(text)
    return ["/bin/sh", "-c", text]


def apt_installs(run_text):
    pkgs = []
    for m in re.finditer(r"apt-get\s+install\s+([^&;|]*)", run_text):
        pkgs += [w for w in m.group(1).split() if not w.startswith("-")]
    return pkgs


def parse_dockerfile():
    """Stages and facts the manifests depend on (uid, image repo, version).
    FROM may name a global ARG (ARG X=default before the first FROM): "from"
    is then the default it resolves to. "ins" are a stage's own instructions,
    "all" those it inherits from the stages it is built FROM, then its own."""
    stages, args = [], {}

    def expand(text):
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), ""),
                      text)

    for n, word, rest in dockerfile_instructions(DOCKERFILE):
        if word == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].lower() == "as" else None
            stages.append({"from": expand(parts[0]), "name": name, "line": n, "ins": []})
        elif stages:
            stages[-1]["ins"].append((n, word, rest))
    by_name = {}
    for stage in stages:
        parent = by_name.get(stage["from"])
        stage["parent"] = parent
        stage["all"] = (parent["all"] if parent else []) + stage["ins"]
        if stage["name"]:
            by_name[stage["name"]] = stage
    return stages


def stage_named(stages, name):
    return next((s for s in stages if s["name"] == name), None)


def root_image(stage):
    while stage["parent"] is not None:
        stage = stage["parent"]
    return stage["from"]


# The images the Dockerfile builds: (target stage, the build stage its
# binaries come from, whether that build has the CUDA backend).
IMAGE_TARGETS = (("runtime", "build", False), ("runtime-gpu", "build-gpu", True))


def check_dockerfile(workdir, cli):
    where = "Dockerfile"
    stages = parse_dockerfile()
    if not F.check(len(stages) >= 2, where, "not a multi-stage build"):
        return
    F.check(stages[-1]["name"] == "runtime", where,
            f"the last stage (the default target) is {stages[-1]['name']}, not runtime (the CPU "
            f"image)")
    for stage in stages:
        if stage["parent"] is not None or stage["from"] == "scratch":
            continue
        F.check(re.fullmatch(r"[a-z0-9./-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}", stage["from"]),
                where, f"line {stage['line']}: base image {stage['from']} is not pinned by "
                       f"digest (IMAGE:TAG@sha256:...): a tag moves under a rebuild")
    with open(os.path.join(SOURCE, "deploy", "install_deps.sh")) as f:
        m = re.search(r"PACKAGES=\(([^)]*)\)", f.read())
    needed = [p for p in (m.group(1).split() if m else []) if not TEST_ONLY.match(p)]
    socket_path, cmd = None, []  # the CPU image's (both share runtime-base's CMD)
    for target, build_name, cuda in IMAGE_TARGETS:
        runtime, build = stage_named(stages, target), stage_named(stages, build_name)
        if not F.check(runtime is not None and build is not None, where,
                       f"no stage {target} built from stage {build_name}"):
            continue
        listens = check_image_stage(runtime, build, cuda, needed)
        if target == "runtime":
            socket_path, cmd = listens
    runtime, build = stage_named(stages, "runtime"), stage_named(stages, "build")
    if runtime is None or build is None:
        return
    if socket_path:
        hc = last_instruction(runtime, "HEALTHCHECK")
        m = re.search(r"\bCMD\s+(.*)$", hc or "")
        argv = exec_form(m.group(1)) if m else []
        if health_command_ok(argv, socket_path, where, "HEALTHCHECK CMD"):
            run_daemon(cmd, PROTOS, None, where, [(f"{where}: HEALTHCHECK", argv, socket_path)],
                       cli, workdir)
    r = subprocess.run(["sh", "-n", os.path.join(SOURCE, "deploy", "entrypoint.sh")],
                       capture_output=True, text=True)
    F.check(r.returncode == 0, "deploy/entrypoint.sh", f"sh -n: {r.stderr}")
    runtime_pkgs = []
    for _, w, rest in runtime["all"]:
        if w == "RUN":
            runtime_pkgs += apt_installs(rest)
    check_runtime_libraries(runtime_pkgs, where)
    check_build_context(build, workdir)
    check_entrypoint_restart(workdir)
    lint = os.environ.get("DOCKERFILELINT")
    if lint:
        r = subprocess.run([lint, DOCKERFILE], capture_output=True, text=True)
        F.check(r.returncode == 0, where, f"dockerfilelint:\n{r.stdout}{r.stderr}")


def last_instruction(stage, word):
    found = [rest for _, w, rest in stage["all"] if w == word]
    return found[-1] if found else None


def check_image_stage(runtime, build, cuda, needed):
    """One image (target stage) with the instructions it inherits; returns
    (the socket its CMD listens on, the CMD)."""
    where = f"Dockerfile: {runtime['name']}"
    chain, stage = [], runtime
    while stage is not None:
        chain.append(stage)
        stage = stage["parent"]
    F.check(not any(s is build or s["name"] in ("toolchain", "build", "build-gpu")
                    for s in chain), where,
            f"the image is built FROM a build stage (inherits its toolchain): "
            f"{[s['name'] for s in chain]}")
    F.check(not re.search(r"(devel|-dev\b)", root_image(runtime)), where,
            f"runtime base {root_image(runtime)} is a development image")
    last = lambda word: last_instruction(runtime, word)  # noqa: E731

    # User.
    user = last("USER")
    if F.check(user is not None, where, "the runtime stage has no USER (runs as root)"):
        uid = user.split(":")[0]
        F.check(uid.isdigit() and uid != "0", where,
                f"USER {user}: must be a non-root numeric uid (runAsNonRoot can verify it)")
        runs = " ".join(rest for _, w, rest in runtime["all"] if w == "RUN")
        m = re.search(r"useradd\b[^&;]*--uid\s+(\d+)", runs)
        F.check(m and m.group(1) == uid, where,
                f"USER {user} is not the uid useradd creates ({m.group(1) if m else None})")

    # CMD / ENTRYPOINT / socket.
    cmd = exec_form(last("CMD") or "[]")
    values = HOSTKVD.parse_args(cmd, f"{where}: CMD")
    socket_path = listen_socket(HOSTKVD, values, f"{where}: CMD")
    entrypoint = exec_form(last("ENTRYPOINT") or "[]")
    copies = [rest for _, w, rest in runtime["all"] if w == "COPY"]
    F.check(any(c.split()[-1] == entrypoint[0] and "deploy/entrypoint.sh" in c for c in copies)
            if entrypoint else False, where,
            f"ENTRYPOINT {entrypoint} is not deploy/entrypoint.sh copied into the image")
    with open(os.path.join(SOURCE, "deploy", "entrypoint.sh")) as f:
        ep = f.read()
    m = re.search(r"^\s*exec\s+(\S+)", ep, re.M)
    binaries = [c for c in copies if f"--from={build['name']} " in c]
    F.check(binaries, where, f"copies nothing from stage {build['name']}")
    bin_dirs = [c.split()[-1].rstrip("/") for c in binaries]
    F.check(m and os.path.dirname(m.group(1)) in bin_dirs, where,
            f"entrypoint.sh execs {m.group(1) if m else '?'}, not where hostkvd is copied "
            f"({bin_dirs})")

    # Stop signal, volume, expose.
    F.check(last("HEALTHCHECK") is not None, where, "no HEALTHCHECK")
    F.check((last("STOPSIGNAL") or "").upper() in ("SIGTERM", "15"), where,
            "STOPSIGNAL should be SIGTERM (hostkvd drains its copies on it)")
    vols = []
    for _, w, rest in runtime["all"]:
        if w == "VOLUME":
            vols += exec_form(rest) if rest.startswith("[") else rest.split()
    if socket_path:
        F.check(os.path.dirname(socket_path) in vols, where,
                f"VOLUME {vols} does not hold the socket directory {os.path.dirname(socket_path)}")
    listened = {str(p) for p in tcp_ports(values)}
    exposed = set()
    for _, w, rest in runtime["all"]:
        if w == "EXPOSE":
            exposed |= {p.split("/")[0] for p in rest.split()}
    F.check(exposed == listened, where,
            f"EXPOSE {sorted(exposed)} but the CMD's flags listen on TCP ports {sorted(listened)}")
    label = " ".join(rest for _, w, rest in runtime["all"] if w == "LABEL")
    m = re.search(r'org\.opencontainers\.image\.version="?([^"\s]+)', label)
    F.check(m and m.group(1) == VERSION, where,
            f"LABEL version {m.group(1) if m else None} is not the project version {VERSION}")

    # Packages: no toolchain at runtime; the build has the project's packages.
    runtime_pkgs = []
    for _, w, rest in runtime["all"]:
        if w == "RUN":
            runtime_pkgs += apt_installs(rest)
    bad = [p for p in runtime_pkgs if TOOLCHAIN.match(p)]
    F.check(not bad, where, f"the runtime stage installs toolchain/-dev packages {bad}")
    F.check(not any(re.search(r"--from=\S+\s+\S*(/usr/bin/(gcc|g\+\+|cc|c\+\+|ld)|/usr/include"
                              r"|/usr/local/cuda)", c) for c in copies), where,
            "the runtime stage copies a compiler, headers or the CUDA toolkit")
    build_pkgs = []
    for _, w, rest in build["all"]:
        if w == "RUN":
            build_pkgs += apt_installs(rest)
    missing = [p for p in needed if p not in build_pkgs]
    F.check(not missing, where, f"stage {build['name']} lacks {missing} "
                                f"(deploy/install_deps.sh installs them for the build)")

    # The backend: the build's cmake, and what the GPU image needs at run time.
    runs = " ".join(rest for _, w, rest in build["ins"] if w == "RUN")
    want = "ON" if cuda else "OFF"
    F.check(f"-DHOSTKV_ENABLE_CUDA={want}" in runs, where,
            f"stage {build['name']} does not configure -DHOSTKV_ENABLE_CUDA={want}")
    envs = " ".join(rest for _, w, rest in runtime["all"] if w == "ENV")
    if cuda:
        F.check("-DCMAKE_CUDA_COMPILER=" in runs, where,
                f"stage {build['name']} does not name its nvcc (CMAKE_CUDA_COMPILER)")
        F.check(re.search(r"hostkvd --version \| grep -q 'cuda", runs), where,
                f"stage {build['name']} does not check that its hostkvd has the CUDA backend")
        F.check(re.search(r"NVIDIA_VISIBLE_DEVICES=all\b", envs), where,
                "no ENV NVIDIA_VISIBLE_DEVICES=all (the NVIDIA runtime then mounts no driver)")
        m = re.search(r"NVIDIA_DRIVER_CAPABILITIES=(\S+)", envs)
        F.check(m and "compute" in m.group(1).split(","), where,
                "NVIDIA_DRIVER_CAPABILITIES lacks compute (libcuda is not mounted without it)")
    else:
        F.check("NVIDIA_" not in envs, where, "the CPU image asks the NVIDIA runtime for GPUs")
    return socket_path, cmd


def dpkg_owner(path):
    candidates = {path, os.path.realpath(path)}
    for p in list(candidates):
        if p.startswith("/usr/lib/"):
            candidates.add(p[len("/usr"):])
        elif p.startswith("/lib/"):
            candidates.add("/usr" + p)
    for p in candidates:
        r = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0].strip()
    return None


def check_runtime_libraries(runtime_pkgs, where):
    if not shutil.which("dpkg") or not shutil.which("apt-cache"):
        note("SKIP runtime libraries: no dpkg/apt-cache here")
        return
    r = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                        "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"]
                       + runtime_pkgs, capture_output=True, text=True)
    closure = {line.strip() for line in r.stdout.splitlines()
               if line and not line.startswith((" ", "<"))}
    closure |= set(runtime_pkgs) | {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}  # base image
    checked = set()
    for binary in (HOSTKVD.binary, CLI):
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        for m in re.finditer(r"^\s*(\S+) => (\S+)", out, re.M):
            lib, path = m.groups()
            if path == "not" or re.match(r"lib(asan|ubsan|tsan|lsan|cuda|cudart)", lib):
                continue
            pkg = dpkg_owner(path)
            if not F.check(pkg is not None, where,
                           f"{os.path.basename(binary)} needs {lib} ({path}), which no Debian "
                           f"package provides"):
                continue
            pkg = pkg.split(",")[0]
            checked.add(pkg)
            F.check(pkg in closure, where,
                    f"{os.path.basename(binary)} needs {lib} from package {pkg}, which the "
                    f"runtime stage does not install (add it to the runtime apt-get install)")
    note(f"  runtime libraries of hostkvd and hostkv come from {sorted(checked)}")


def dockerignore_patterns():
    path = os.path.join(SOURCE, ".dockerignore")
    if not os.path.exists(path):
        return []
    pats = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                pats.append(line)
    return pats


def ignored(rel, patterns):
    """Docker's rule: the last matching pattern wins; a pattern also excludes
    what lies under a matched directory."""
    result = False
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pat in patterns:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        p = p.strip("/")
        rx = re.escape(p).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*") \
            .replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(rx, pre) for pre in prefixes):
            result = not neg
    return result


def check_build_context(build, workdir):
    """Copies what the build stage COPYs (minus .dockerignore) and runs the
    build stage's cmake configure on it."""
    where = "Dockerfile"
    patterns = dockerignore_patterns()
    ctx = os.path.join(workdir, "context")
    os.makedirs(ctx)
    workdir_in_image = "/"
    for _, w, rest in build["all"]:
        if w == "WORKDIR":
            workdir_in_image = rest
        if w != "COPY" or "--from=" in rest:
            continue
        words = [x for x in rest.split() if not x.startswith("--")]
        srcs, dest = words[:-1], words[-1]
        for src in srcs:
            src = src.rstrip("/") if src not in (".", "./") else "."
            full = os.path.join(SOURCE, src)
            if not F.check(os.path.exists(full), where, f"COPY {src}: not in the repository"):
                continue
            if src != "." and not F.check(not ignored(src, patterns), where,
                                          f"COPY {src}: excluded by .dockerignore"):
                continue
            target_rel = os.path.relpath(
                os.path.join(workdir_in_image, dest) if not dest.startswith("/") else dest,
                workdir_in_image)
            # A directory's contents go into dest; a file goes into dest/ or
            # becomes dest.
            for root, _, files in os.walk(full):
                for fname in files:
                    fpath = os.path.join(root, fname)
                    rel = os.path.relpath(fpath, SOURCE)
                    if ignored(rel, patterns):
                        # Configure would not notice a missing header.
                        F.check(not BUILD_INPUT.search(fname), where,
                                f"COPY {src}: .dockerignore excludes {rel}, a build input")
                        continue
                    out = os.path.join(ctx, target_rel, os.path.relpath(fpath, full))
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    shutil.copy2(fpath, out)
            if os.path.isfile(full):
                out = os.path.join(ctx, target_rel, os.path.basename(full)) \
                    if dest.endswith("/") or target_rel == "." else os.path.join(ctx, target_rel)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                shutil.copy2(full, out)
    for rel in ("deploy/entrypoint.sh",):
        F.check(not ignored(rel, patterns), where, f"{rel} is excluded by .dockerignore but "
                                                   f"the runtime stage copies it")
    runs = " ".join(rest for _, w, rest in build["all"] if w == "RUN")
    m = re.search(r"cmake\s+-S\s+\.\s+-B\s+(\S+)((?:\s+-D\S+)*)", runs)
    if not F.check(m is not None, where, "the build stage has no `cmake -S . -B DIR -D...`"):
        return
    defs = m.group(2).split()
    bdir = os.path.join(workdir, "context-build")
    r = subprocess.run(["cmake", "-S", ctx, "-B", bdir] + defs, capture_output=True, text=True,
                       timeout=300)
    if not F.check(r.returncode == 0, where,
                   f"cmake configure of the Docker build context failed (a COPY missing?):\n"
                   f"{r.stdout[-3000:]}{r.stderr[-3000:]}"):
        return
    r = subprocess.run(["cmake", "--build", bdir, "--target", "help"], capture_output=True,
                       text=True, timeout=120)
    for target in ("hostkvd", "hostkv"):
        F.check(re.search(rf"^\.\.\. {target}$", r.stdout, re.M), where,
                f"the Docker build context does not define target {target}")
    note("  Docker build context configures (targets hostkvd, hostkv)")


ENTRYPOINT_RESTART = r"""
set -eu
mount -t tmpfs -o size=64m tmpfs /dev/shm
start() {
  unshare --pid --fork --kill-child --mount-proc sh "$EP" \
    --listen=unix:$DIR/hostkvd.sock --memory_reserve=0 --config=$CFG >>$DIR/log 2>&1 &
  UPID=$!
  i=0
  until "$CLI" --target=unix:$DIR/hostkvd.sock health >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -lt 200 ] || { echo "daemon did not become healthy"; cat $DIR/log; exit 1; }
    kill -0 $UPID 2>/dev/null || { echo "daemon exited"; cat $DIR/log; exit 1; }
    sleep 0.05
  done
}
start
ls /dev/shm | grep -q '\.pool\.' && { echo "a pool segment is named in /dev/shm (pools are sealed memfds)"; ls /dev/shm; exit 1; }
kill -KILL $UPID; wait $UPID 2>/dev/null || true
i=0; while [ -S $DIR/hostkvd.sock ] && "$CLI" --target=unix:$DIR/hostkvd.sock health >/dev/null 2>&1; do
  i=$((i + 1)); [ $i -lt 100 ] || break; sleep 0.05; done
ls /dev/shm | grep -q '\.pool\.' && { echo "SIGKILL left a pool segment behind"; ls /dev/shm; exit 1; }
start
echo restarted
kill -KILL $UPID; wait $UPID 2>/dev/null || true
"""


def check_entrypoint_restart(workdir):
    """A daemon SIGKILLed in a container (pid 1, /dev/shm outliving it) must
    start again through the entrypoint."""
    where = "deploy/entrypoint.sh"
    if not shutil.which("unshare"):
        note("SKIP entrypoint restart: no unshare")
        return
    d = tempfile.mkdtemp(prefix="restart-", dir=workdir)
    with open(os.path.join(SOURCE, "deploy", "entrypoint.sh")) as f:
        ep = f.read()
    ep = ep.replace("/usr/local/bin/hostkvd", HOSTKVD.binary)
    ep = ep.replace("/etc/hostkv/hostkvd.textproto", os.path.join(d, "absent.textproto"))
    with open(os.path.join(d, "entrypoint.sh"), "w") as f:
        f.write(ep)
    with open(os.path.join(d, "cfg.textproto"), "w") as f:
        f.write('pools { name: "restart" geometry { mha { num_layers: 2 num_kv_heads: 1 '
                'head_dim: 64 } dtype: DTYPE_BF16 } page_size: 16 layout: LAYOUT_PAGE_FIRST '
                'capacity_tokens: 256 }\n')
    env = clean_env()
    env.update(EP=os.path.join(d, "entrypoint.sh"), CFG=os.path.join(d, "cfg.textproto"),
               DIR=d, CLI=CLI)
    outer = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        outer = ["unshare", "--map-root-user", "--mount", "--propagation", "private"]
    probe = subprocess.run(outer + ["--pid", "--fork", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        note(f"SKIP entrypoint restart: unshare is not permitted here ({probe.stderr.strip()})")
        return
    r = subprocess.run(outer + ["sh", "-c", ENTRYPOINT_RESTART], capture_output=True, text=True,
                       env=env, timeout=120)
    F.check(r.returncode == 0 and "restarted" in r.stdout, where,
            f"hostkvd did not come back after SIGKILL through the entrypoint:\n"
            f"{r.stdout}{r.stderr}")
    if r.returncode == 0:
        note("  entrypoint: hostkvd (pid 1) restarts after SIGKILL with its segments left behind")


# ---------------------------------------------------------------------------

def check_images():
    """One hostkvd image per file (daemon, keeper and init containers run the
    same build), tagged with the project version, "-cuda" for the GPU image."""
    repos = {img for _, img in IMAGES if is_hostkvd_image(img)}
    wanted = (f"{IMAGE_REPO}:{VERSION}", f"{IMAGE_REPO}:{VERSION}{GPU_TAG_SUFFIX}")
    per_file = {}
    for where, img in IMAGES:
        if is_hostkvd_image(img):
            F.check(img in wanted, where, f"image {img}, expected one of {wanted} (the project "
                                          f"version)")
            per_file.setdefault(where.split(":")[0], set()).add(img)
    for rel, imgs in per_file.items():
        F.check(len(imgs) == 1, rel, f"runs different hostkvd images {sorted(imgs)}")
    F.check(repos, "deploy/", "no file references the hostkvd image")


def main():
    global SOURCE, HOSTKVD, CLI, DOCKERFILE, IMAGE_UID, IMAGE_REPO, VERSION, IMAGES
    global SOCKET_DEFAULT, PROTOS, IMAGE_GROUPS
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--hostkvd", required=True)
    ap.add_argument("--hostkv", required=True)
    ap.add_argument("what", choices=["manifests", "dockerfile"])
    a = ap.parse_args()
    SOURCE = os.path.realpath(a.source)
    HOSTKVD = Hostkvd(a.hostkvd)
    CLI = a.hostkv
    DOCKERFILE = os.path.join(SOURCE, "Dockerfile")
    IMAGES = []
    SOCKET_DEFAULT = HOSTKVD.defaults.get("listen", "unix:/run/hostkv/hostkvd.sock")[5:]
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        VERSION = re.search(r"project\(\s*hostkv\s+VERSION\s+([0-9.]+)", f.read()).group(1)
    stages = parse_dockerfile()
    user = next((rest for _, w, rest in reversed(stages[-1]["all"]) if w == "USER"), "0")
    IMAGE_UID = int(user.split(":")[0]) if user.split(":")[0].isdigit() else None
    runs = " ".join(rest for _, w, rest in stages[-1]["all"] if w == "RUN")
    IMAGE_GROUPS = set(re.findall(r"groupadd\b[^&;]*?\s([A-Za-z_][A-Za-z0-9_-]*)\s*(?:&&|;|$)",
                                  runs))
    IMAGE_REPO = "hostkv/hostkvd"
    note(f"hostkvd flags: {' '.join(sorted(HOSTKVD.flags))}")
    note(f"image {IMAGE_REPO}:{VERSION}, uid {IMAGE_UID}")

    workdir = tempfile.mkdtemp(prefix="hostkv-deploy-test-")
    try:
        PROTOS = Protos(SOURCE, workdir)
        if a.what == "dockerfile":
            check_dockerfile(workdir, CLI)
        else:
            files = sorted(glob.glob(os.path.join(SOURCE, "deploy", "**", "*.y*ml"),
                                     recursive=True))
            F.check(files, "deploy/", "no YAML files")
            for path in files:
                note(f"{os.path.relpath(path, SOURCE)}")
                try:
                    with open(path) as f:
                        docs = [d for d in yaml.safe_load_all(f) if d is not None]
                except yaml.YAMLError as e:
                    F.fail(os.path.relpath(path, SOURCE), f"not YAML: {e}")
                    continue
                if len(docs) == 1 and "services" in docs[0]:
                    check_compose_file(path, docs[0], PROTOS, CLI, workdir)
                elif docs and all("apiVersion" in d and "kind" in d for d in docs):
                    check_k8s_file(path, docs, PROTOS, CLI, workdir)
                else:
                    F.fail(os.path.relpath(path, SOURCE),
                           "neither Kubernetes objects nor a Compose file")
            for path in sorted(glob.glob(os.path.join(SOURCE, "deploy", "**", "*.textproto"),
                                         recursive=True)):
                rel = os.path.relpath(path, SOURCE)
                with open(path) as f:
                    config = parse_config(PROTOS, f.read(), rel)
                if config is not None:
                    check_config_flags(config, rel)
                    run_daemon([], PROTOS, config, rel, [], CLI, workdir)
                    note(f"{rel}: parses, hostkvd creates its {len(config.pools)} pool(s)")
            check_images()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if F.items:
        print(f"\nFAIL: {len(F.items)} problem(s):")
        for item in F.items:
            print(f"  - {item}")
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
