#!/usr/bin/python3
"""Every service of a TCP hostkvd with --auth_token_file needs the token.

Starts hostkvd on `--listen=tcp:PORT --auth_token_file=F` and checks with real
gRPC calls (over TCP, as a remote client or a probe would make them):
  - grpc.health.v1 Check and Watch, server reflection and hostkv.v1 without
    the token, or with a wrong one (same length, other lengths) ->
    UNAUTHENTICATED, and an existing pool's name is not told apart from a
    missing one; with the token they work, and reflection describes the
    hostkv, health and reflection services (with their dependencies);
  - Watch streams beyond --max_health_watches get RESOURCE_EXHAUSTED naming
    the flag, rejected streams hold no threads, the daemon keeps answering,
    and a cancelled stream frees its slot;
  - with --health_probe_without_token, Check("") answers without the token
    while Check("hostkv.v1.HostKV"), Check("hostkv.pool.*"), Watch and
    reflection still need it.

usage: tcp_auth_test.py HOSTKVD
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc
from grpc_tools import protoc

from reflection_test import Reflector, reflection_stubs

TOKEN = "s3cret-token"
GOOD = [("authorization", f"Bearer {TOKEN}")]
WRONG = {
    "none": None,
    "same length": [("authorization", "Bearer " + TOKEN[:-1] + "X")],
    "shorter": [("authorization", "Bearer " + TOKEN[:-1])],
    "longer": [("authorization", "Bearer " + TOKEN + "X")],
    "no Bearer": [("authorization", TOKEN)],
}
POOL_CONFIG = """pools {
  name: "secret-model"
  geometry { mha { num_layers: 2 num_kv_heads: 2 head_dim: 64 } dtype: DTYPE_BF16 }
  page_size: 16
  layout: LAYOUT_PAGE_FIRST
  capacity_tokens: 1024
}
"""
MAX_WATCHES = 4


def health_stubs(workdir):
    rc = protoc.main(["protoc", "-I/usr/share/grpc-proto", f"--python_out={workdir}",
                      "grpc/health/v1/health.proto"])
    assert rc == 0, "protoc failed on the health proto"
    sys.path.insert(0, os.path.join(workdir, "grpc", "health", "v1"))
    import health_pb2  # noqa: E402
    return health_pb2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, hostkvd, workdir, *flags):
        self.port = free_port()
        token_file = os.path.join(workdir, "token")
        # 0600: hostkvd refuses a token file other users may read.
        with os.fdopen(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                       "w") as f:
            f.write(TOKEN + "\n")
        config = os.path.join(workdir, "pools.textproto")
        with open(config, "w") as f:
            f.write(POOL_CONFIG)
        self.process = subprocess.Popen(
            [hostkvd, f"--listen=tcp:{self.port}", f"--auth_token_file={token_file}",
             f"--config={config}", "--memory_reserve=256MiB", *flags])
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}",
                                             options=[("grpc.enable_http_proxy", 0)])
        grpc.channel_ready_future(self.channel).result(timeout=10)

    def threads(self):
        return len(os.listdir(f"/proc/{self.process.pid}/task"))

    def stop(self):
        self.channel.close()
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=15) == 0

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()


class Calls:
    """Health and reflection calls with chosen metadata."""

    def __init__(self, channel, health_pb, reflection_pb):
        self.health_pb, self.reflection_pb = health_pb, reflection_pb
        self.check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb.HealthCheckResponse.FromString)
        self.watch_call = channel.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=health_pb.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb.HealthCheckResponse.FromString)
        self.reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb.ServerReflectionResponse.FromString)
        self.stats = channel.unary_unary("/hostkv.v1.HostKV/GetPoolStats",
                                         request_serializer=lambda _: b"",
                                         response_deserializer=lambda b: b)

    def health(self, service, metadata):
        """The status name, or the error code's name."""
        try:
            r = self.check(self.health_pb.HealthCheckRequest(service=service),
                           metadata=metadata, timeout=5)
            return self.health_pb.HealthCheckResponse.ServingStatus.Name(r.status)
        except grpc.RpcError as e:
            return e.code().name

    def watch(self, service, metadata):
        """(stream, first status name) or (None, error code name)."""
        stream = self.watch_call(self.health_pb.HealthCheckRequest(service=service),
                                 metadata=metadata, timeout=60)
        try:
            first = next(stream)
            return stream, self.health_pb.HealthCheckResponse.ServingStatus.Name(first.status)
        except grpc.RpcError as e:
            return None, e.code().name

    def list_services(self, metadata):
        """Sorted service names, or the error code's name."""
        request = self.reflection_pb.ServerReflectionRequest(list_services="")
        try:
            responses = list(self.reflect(iter([request]), metadata=metadata, timeout=5))
            return sorted(s.name for s in responses[0].list_services_response.service)
        except grpc.RpcError as e:
            return e.code().name

    def pool_stats(self, metadata):
        try:
            self.stats(None, metadata=metadata, timeout=5)
            return "OK"
        except grpc.RpcError as e:
            return e.code().name


class TokenReflector(Reflector):
    """The reflection_test client, sending the token."""

    def ask(self, **kwargs):
        request = self.pb.ServerReflectionRequest(**kwargs)
        responses = list(self.call(iter([request]), metadata=GOOD, timeout=5))
        assert len(responses) == 1
        return responses[0]


def expect(what, got, want):
    print(f"{what}: {got}")
    assert got == want, f"{what}: got {got}, want {want}"


def check_without_token(calls):
    for name, metadata in WRONG.items():
        for service in ("", "hostkv.v1.HostKV", "hostkv.pool.secret-model",
                        "hostkv.pool.missing"):
            expect(f"Check({service!r}) token {name}", calls.health(service, metadata),
                   "UNAUTHENTICATED")
        expect(f"Watch('') token {name}", calls.watch("", metadata)[1], "UNAUTHENTICATED")
        expect(f"reflection list token {name}", calls.list_services(metadata),
               "UNAUTHENTICATED")
        expect(f"GetPoolStats token {name}", calls.pool_stats(metadata), "UNAUTHENTICATED")


def check_with_token(calls, channel, reflection_pb):
    expect("Check('') with token", calls.health("", GOOD), "SERVING")
    expect("Check(hostkv.v1.HostKV) with token", calls.health("hostkv.v1.HostKV", GOOD),
           "SERVING")
    expect("Check(pool) with token", calls.health("hostkv.pool.secret-model", GOOD), "SERVING")
    expect("Check(missing pool) with token", calls.health("hostkv.pool.missing", GOOD),
           "NOT_FOUND")
    expect("reflection list with token", calls.list_services(GOOD),
           ["grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
            "hostkv.v1.HostKV"])
    expect("GetPoolStats with token", calls.pool_stats(GOOD), "OK")

    reflector = TokenReflector(channel, reflection_pb)
    for service in ("hostkv.v1.HostKV", "grpc.health.v1.Health",
                    "grpc.reflection.v1alpha.ServerReflection"):
        reflector.load_symbol(service)  # the file and its dependencies
        methods = [m.name for m in reflector.pool.FindServiceByName(service).methods]
        print(f"reflection describes {service}: {methods}")
        assert methods, service
    r = reflector.ask(file_by_filename="grpc/health/v1/health.proto")
    assert len(r.file_descriptor_response.file_descriptor_proto) == 1, r
    r = reflector.ask(file_containing_symbol="no.such.Symbol")
    expect("unknown symbol", r.error_response.error_code, grpc.StatusCode.NOT_FOUND.value[0])


def check_watch_limit(daemon, calls):
    held = []
    for i in range(MAX_WATCHES):
        stream, status = calls.watch("", GOOD)
        expect(f"Watch {i + 1} of {MAX_WATCHES}", status, "SERVING")
        held.append(stream)
    stream = calls.watch_call(calls.health_pb.HealthCheckRequest(service=""), metadata=GOOD,
                              timeout=5)
    try:
        next(stream)
        raise AssertionError("a Watch beyond --max_health_watches was accepted")
    except grpc.RpcError as e:
        expect("Watch beyond the limit", e.code().name, "RESOURCE_EXHAUSTED")
        assert "--max_health_watches" in e.details(), e.details()
    expect("Watch beyond the limit without token", calls.watch("", None)[1],
           "UNAUTHENTICATED")

    # Many rejected streams at once (over the limit, or without the token)
    # hold no threads; before the bound each held one.
    before = daemon.threads()
    results = {"token": [], "none": []}
    def one(name, metadata):
        results[name].append(calls.watch("", metadata)[1])
    workers = [threading.Thread(target=one, args=a)
               for a in [("token", GOOD), ("none", None)] * 100]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    expect("100 more Watch streams with token", set(results["token"]), {"RESOURCE_EXHAUSTED"})
    expect("100 Watch streams without token", set(results["none"]), {"UNAUTHENTICATED"})
    time.sleep(0.5)
    after = daemon.threads()
    print(f"daemon threads: {before} before, {after} after 200 rejected streams")
    assert after <= before + 16, (before, after)

    expect("Check while watches are full", calls.health("", GOOD), "SERVING")
    expect("GetPoolStats while watches are full", calls.pool_stats(GOOD), "OK")

    held.pop().cancel()  # the daemon notices within ~1 s
    deadline = time.time() + 10
    while True:
        stream, status = calls.watch("", GOOD)
        if status == "SERVING":
            held.append(stream)
            break
        assert status == "RESOURCE_EXHAUSTED" and time.time() < deadline, status
        time.sleep(0.2)
    print("a cancelled Watch freed its slot")
    for stream in held:
        stream.cancel()


def check_probe_flag(calls):
    expect("probe Check('') without token", calls.health("", None), "SERVING")
    expect("probe Check('') with a wrong token", calls.health("", WRONG["same length"]),
           "SERVING")
    for service in ("hostkv.v1.HostKV", "hostkv.pool.secret-model", "hostkv.pool.x"):
        expect(f"probe Check({service!r}) without token", calls.health(service, None),
               "UNAUTHENTICATED")
    expect("probe Watch('') without token", calls.watch("", None)[1], "UNAUTHENTICATED")
    expect("probe reflection without token", calls.list_services(None), "UNAUTHENTICATED")
    expect("probe GetPoolStats without token", calls.pool_stats(None), "UNAUTHENTICATED")
    expect("probe Check(pool) with token", calls.health("hostkv.pool.secret-model", GOOD),
           "SERVING")


def main():
    hostkvd = sys.argv[1]
    workdir = tempfile.mkdtemp(prefix="hostkv-tcp-auth-")
    daemon = None
    try:
        reflection_pb = reflection_stubs(workdir)
        health_pb = health_stubs(workdir)

        print("-- token, no probe flag, --max_health_watches=4")
        daemon = Daemon(hostkvd, workdir, f"--max_health_watches={MAX_WATCHES}")
        calls = Calls(daemon.channel, health_pb, reflection_pb)
        check_without_token(calls)
        check_with_token(calls, daemon.channel, reflection_pb)
        check_watch_limit(daemon, calls)
        daemon.stop()

        print("-- token and --health_probe_without_token")
        daemon = Daemon(hostkvd, workdir, "--health_probe_without_token")
        calls = Calls(daemon.channel, health_pb, reflection_pb)
        check_probe_flag(calls)
        daemon.stop()
        print("PASS")
    finally:
        if daemon is not None:
            daemon.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
