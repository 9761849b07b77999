#!/usr/bin/python3
"""The operator's view of a running hostkvd, as grpcurl sees it.

Starts hostkvd, runs `hostkv demo`, then does what
`grpcurl -plaintext -unix SOCK list` and
`grpcurl ... hostkv.v1.HostKV/GetPoolStats` and `grpc.health.v1.Health/Check`
do: everything is resolved through server reflection, no .proto file is read
for hostkv or health. Checks the numbers the demo left behind.

usage: reflection_test.py HOSTKVD HOSTKV_CLI
"""
import base64
import hashlib
import hmac
import json
import os
import shutil
import socket
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format
from google.protobuf import message_factory
from grpc_tools import protoc

REFLECTION_PROTO = "grpc/reflection/v1alpha/reflection.proto"


def reflection_stubs(workdir):
    """Generates the reflection client (the one .proto grpcurl also knows)."""
    rc = protoc.main(["protoc", "-I/usr/share/grpc-proto", f"--python_out={workdir}",
                      REFLECTION_PROTO])
    assert rc == 0, "protoc failed on the reflection proto"
    sys.path.insert(0, os.path.join(workdir, "grpc", "reflection", "v1alpha"))
    import reflection_pb2  # noqa: E402
    return reflection_pb2


class Reflector:
    def __init__(self, channel, pb):
        self.pb = pb
        self.call = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=pb.ServerReflectionRequest.SerializeToString,
            response_deserializer=pb.ServerReflectionResponse.FromString)
        self.pool = descriptor_pool.DescriptorPool()
        self.added = set()

    def ask(self, **kwargs):
        responses = list(self.call(iter([self.pb.ServerReflectionRequest(**kwargs)])))
        assert len(responses) == 1
        r = responses[0]
        assert not r.HasField("error_response"), r.error_response
        return r

    def services(self):
        return sorted(s.name for s in self.ask(list_services="").list_services_response.service)

    def load_symbol(self, symbol):
        r = self.ask(file_containing_symbol=symbol)
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in r.file_descriptor_response.file_descriptor_proto]
        # Dependencies come in the same answer; add them before dependents.
        pending = {f.name: f for f in files}
        while pending:
            for name, f in list(pending.items()):
                if all(d in self.added for d in f.dependency):
                    self.pool.Add(f)
                    self.added.add(name)
                    del pending[name]
                    break
            else:
                raise AssertionError(f"unresolvable dependencies: {list(pending)}")

    def unary(self, channel, service, method, request_json):
        self.load_symbol(service)
        m = self.pool.FindServiceByName(service).FindMethodByName(method)
        factory = message_factory.MessageFactory(self.pool)
        req_cls = factory.GetPrototype(m.input_type)
        resp_cls = factory.GetPrototype(m.output_type)
        request = json_format.Parse(request_json, req_cls())
        call = channel.unary_unary(f"/{service}/{method}",
                                   request_serializer=req_cls.SerializeToString,
                                   response_deserializer=resp_cls.FromString)
        return json.loads(json_format.MessageToJson(call(request, timeout=10)))

    def hostkv(self, channel, method, request):
        """hostkv.v1.HostKV/`method` with `request` as grpcurl's JSON (a dict)."""
        return self.unary(channel, "hostkv.v1.HostKV", method, json.dumps(request))


def small_pool(session_id, name):
    """A CreatePool request for a 256-token MHA pool, as grpcurl's JSON."""
    return {"sessionId": session_id, "spec": {
        "name": name, "pageSize": 16, "layout": "LAYOUT_PAGE_FIRST",
        "capacityTokens": "256", "geometry": {
            "dtype": "DTYPE_BF16", "mha": {"numLayers": 2, "numKvHeads": 1, "headDim": 8}}}}


def main():
    hostkvd, cli = sys.argv[1], sys.argv[2]
    workdir = tempfile.mkdtemp(prefix="hostkv-reflection-")
    sock = os.path.join(workdir, "hostkvd.sock")
    tier_dir = os.path.join(workdir, "tier")
    os.mkdir(tier_dir)
    with socket.socket() as probe:  # a free port for /metrics
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    # The key /metrics labels namespaces and pools with (HMAC-SHA256).
    label_key = os.path.join(workdir, "label.key")
    with open(os.open(label_key, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("reflection-test-key\n")
    # With a file tier, so that the operator's view includes the tier.
    daemon = subprocess.Popen([hostkvd, f"--listen=unix:{sock}", "--memory_reserve=256MiB",
                               f"--tier=file:{tier_dir}", "--tier_fsync=false",
                               f"--metrics_listen=127.0.0.1:{metrics_port}",
                               f"--metrics_label_key_file={label_key}"])
    try:
        for _ in range(500):
            if os.path.exists(sock):
                break
            time.sleep(0.01)
        demo = subprocess.run([cli, f"--target=unix:{sock}", "demo"], capture_output=True,
                              text=True, timeout=60)
        print(demo.stdout)
        assert demo.returncode == 0, demo.stderr
        assert "OK: all" in demo.stdout

        pb = reflection_stubs(workdir)
        channel = grpc.insecure_channel(f"unix:{sock}")
        reflector = Reflector(channel, pb)
        services = reflector.services()
        print("services:", services)
        for want in ("hostkv.v1.HostKV", "grpc.health.v1.Health",
                     "grpc.reflection.v1alpha.ServerReflection"):
            assert want in services, f"{want} missing from {services}"

        stats = reflector.unary(channel, "hostkv.v1.HostKV", "GetPoolStats", "{}")
        print("GetPoolStats:", json.dumps(stats))
        # The demo deletes its pool when it ends (a second demo of another
        # geometry then finds the name free).
        assert "demo" not in [p["name"] for p in stats.get("pools", [])], stats
        assert "deleted pool 'demo'" in demo.stdout

        # The page cache as an operator drives it with grpcurl: a session
        # (unverified: no session socket) publishes a page, closes, and the
        # page stays cached, visible in GetPoolStats.
        def call(method, request):
            return reflector.hostkv(channel, method, request)
        sid = call("OpenSession", {"clientName": "grpcurl"})["sessionId"]
        call("CreatePool", small_pool(sid, "ops"))
        pages = call("Alloc", {"sessionId": sid, "pool": "ops", "numTokens": 32})["pages"]
        first = int(pages[0].get("firstPage", "0"))  # JSON leaves out zeros
        key0, key1 = base64.b64encode(b"page-0").decode(), base64.b64encode(b"page-1").decode()
        published = call("Publish", {"sessionId": sid, "pool": "ops", "namespace": "ops-demo",
                                     "items": [{"key": key0, "page": str(first)},
                                               {"key": key1, "parentKey": key0,
                                                "page": str(first + 1)}]})
        print("Publish:", published)
        assert published["cached"] == "2", published
        call("CloseSession", {"sessionId": sid})
        sid = call("OpenSession", {"clientName": "grpcurl"})["sessionId"]
        found = call("Lookup", {"sessionId": sid, "pool": "ops", "namespace": "ops-demo",
                                "keys": [key0, key1, base64.b64encode(b"nope").decode()]})
        print("Lookup:", found)
        assert found["hits"] == "2", found
        runs = [(int(r.get("firstPage", "0")), int(r["numPages"])) for r in found["pages"]]
        assert runs == [(first, 2)], found
        pool = call("GetPoolStats", {"pool": "ops"})["pools"][0]
        print("GetPoolStats(ops) after publishing:", json.dumps(pool))
        assert pool["cachedPages"] == "2" and pool["usedPages"] == "2", pool
        assert pool["cache"]["cachedPages"] == "2", pool
        assert pool["cache"]["evictablePages"] == "1", pool  # the leaf; its parent waits
        assert pool["cache"]["hits"] == "2" and pool["cache"]["misses"] == "1", pool
        ns = pool["cacheNamespaces"][0]
        assert ns["name"] == "ops-demo" and ns["ownerUnverified"] is True, ns
        assert int(pool["cacheReservedBytes"]) > 0, pool
        call("CloseSession", {"sessionId": sid})

        # The tier under the cache: the write-behind stored both pages.
        deadline = time.monotonic() + 20
        while True:
            tier = call("GetPoolStats", {})["tier"]
            if tier.get("written", "0") == "2" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        print("GetPoolStats tier:", json.dumps(tier))
        assert tier["url"] == f"file:{tier_dir}", tier
        assert tier["serving"] is True, tier
        assert tier["written"] == "2", tier
        assert int(tier["writtenBytes"]) > 2 * 2 * 2 * 16 * 8 * 2, tier  # 2 pages + headers
        files = [f for _, _, names in os.walk(tier_dir) for f in names]
        assert len(files) == 2, files
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                         timeout=10).read().decode()
        assert "hostkv_tier_up 1" in metrics, metrics
        assert 'hostkv_tier_writes_total{result="written"} 2' in metrics, metrics
        assert "hostkv_tier_put_seconds_count" in metrics, metrics
        # Namespaces and pools are labelled by a keyed hash (no
        # --metrics_namespace_names).
        def label(name):
            return hmac.new(b"reflection-test-key", name, hashlib.sha256).hexdigest()[:12]
        assert "ops-demo" not in metrics, metrics
        assert (f'hostkv_cache_cached_pages{{namespace="{label(b"ops-demo")}",'
                f'pool="{label(b"ops")}"}} 2') in metrics, metrics

        for service in ("", "hostkv.v1.HostKV", "hostkv.tier"):
            health = reflector.unary(channel, "grpc.health.v1.Health", "Check",
                                     json.dumps({"service": service}))
            print(f"Health/Check({service!r}):", health)
            assert health["status"] == "SERVING", health

        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=10) == 0
        print("PASS")
    finally:
        if daemon.poll() is None:
            daemon.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
