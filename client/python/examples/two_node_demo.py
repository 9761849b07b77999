"""Two hostkvd daemons ("two nodes") sharing one Redis as their storage tier.

    build/venv/bin/python client/python/examples/two_node_demo.py [--hostkvd PATH] [--redis URL]

Starts a redis-server on a Unix socket of its own (unless --redis names one,
e.g. redis://10.0.0.5:6379), and two hostkvd daemons, each with its own
socket, pools and memory, both with --tier pointing at that Redis. An engine
on node A writes a prompt's KV (real torch tensors) into host pages and
publishes them; node A writes them behind to Redis. An engine on node B,
whose host memory has never seen them, looks the keys up: node B brings the
pages from Redis into its own free pages before answering, and the engine
reads them back byte-exact. Everything it starts is stopped at the end.

hostkvd defaults to $HOSTKVD, else build/server/hostkvd (the quickstart's
and the test suite's build); redis-server must be on PATH (Debian's
redis-server package) unless --redis is given.
"""
import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

import hostkv
from hostkv.cache_calls import page_list

LAYERS, HEADS, HEAD_DIM, PAGE = 4, 8, 128, 16
PAGES = 8                                   # the prompt: 8 pages of 16 tokens
POOL, NAMESPACE = "two-node-demo", "demo-org/demo-model/tp0-1/p16"


def find_hostkvd():
    for path in (os.environ.get("HOSTKVD"), "build/server/hostkvd"):
        if path and os.access(path, os.X_OK):
            return path
    sys.exit("hostkvd not found: pass --hostkvd or set HOSTKVD")


def wait_for(path, what, proc, timeout=20):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"{what} did not start (see its log above)")
        time.sleep(0.02)


def start_daemon(hostkvd, workdir, name, tier):
    sock = os.path.join(workdir, f"{name}.sock")
    proc = subprocess.Popen(
        [hostkvd, f"--listen=unix:{sock}", "--memory_reserve=256MiB",
         f"--tier={tier}", "--log_level=warning"])
    wait_for(sock, f"hostkvd {name}", proc)
    return proc, f"unix:{sock}"


def page_keys(tokens):
    """SGLang's page keys: SHA-256 chained over each page's token ids."""
    keys, prior = [], b""
    for start in range(0, len(tokens), PAGE):
        h = hashlib.sha256(prior)
        for t in tokens[start:start + PAGE]:
            h.update(t.to_bytes(4, "little"))
        prior = h.digest()
        keys.append(prior)
    return keys


def spec():
    return hostkv.mha_pool_spec(POOL, LAYERS, HEADS, HEAD_DIM, PAGE, capacity_tokens=64 * PAGE)


def wait_written(client, count, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        tier = client.get_pool_stats().tier
        if tier.written >= count or time.monotonic() > deadline:
            return tier
        time.sleep(0.02)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hostkvd", default=None)
    parser.add_argument("--redis", default=None, help="an existing Redis: redis://HOST:PORT")
    args = parser.parse_args()
    hostkvd = args.hostkvd or find_hostkvd()
    workdir = tempfile.mkdtemp(prefix="hostkv-two-node-")
    procs = []
    try:
        tier = args.redis
        if tier is None:
            if shutil.which("redis-server") is None:
                sys.exit("redis-server not found: apt-get install redis-server, or pass --redis")
            redis_sock = os.path.join(workdir, "redis.sock")
            redis = subprocess.Popen(
                ["redis-server", "--port", "0", "--unixsocket", redis_sock, "--save", "",
                 "--appendonly", "no", "--dir", workdir, "--maxmemory", "256mb",
                 "--maxmemory-policy", "allkeys-lru"], stdout=subprocess.DEVNULL)
            procs.append(redis)
            wait_for(redis_sock, "redis-server", redis)
            tier = f"redis+unix:{redis_sock}"
        print(f"tier: {tier}")
        node_a, target_a = start_daemon(hostkvd, workdir, "node-a", tier)
        procs.append(node_a)
        node_b, target_b = start_daemon(hostkvd, workdir, "node-b", tier)
        procs.append(node_b)
        print(f"node A: hostkvd on {target_a}; node B: hostkvd on {target_b}")

        g = torch.Generator().manual_seed(7)
        tokens = torch.randint(0, 150_000, (PAGES * PAGE,), generator=g).tolist()
        keys = page_keys(tokens)
        # The prompt's KV in SGLang's page_first flat page format, per page:
        # (2, PAGE, LAYERS, HEADS, HEAD_DIM) bf16.
        kv = torch.randn((PAGES, 2, PAGE, LAYERS, HEADS, HEAD_DIM),
                         generator=g).to(torch.bfloat16)
        page_bytes = [kv[i].contiguous().view(torch.uint8).numpy().tobytes()
                      for i in range(PAGES)]

        with hostkv.Client(target_a, "engine-on-node-a") as a:
            a.create_pool(spec())
            runs = a.alloc(POOL, PAGES * PAGE)
            pages = [p for first, n in runs for p in range(first, first + n)]
            for page, data in zip(pages, page_bytes):
                a.write_pages(POOL, [(page, 1)], data)
            published = a.publish(POOL, NAMESPACE, keys, runs,
                                  parent_keys=[None] + keys[:-1])
            print(f"node A: engine published {published.cached} pages "
                  f"({PAGES * len(page_bytes[0]) >> 10} KiB)")
            t = wait_written(a, PAGES)
            print(f"node A: tier wrote {t.written} pages ({t.written_bytes >> 10} KiB) "
                  f"behind the publish, serving={t.serving}")
            if t.written < PAGES:
                sys.exit("FAIL: node A did not write the pages to the tier")

        with hostkv.Client(target_b, "engine-on-node-b") as b:
            b.create_pool(spec())
            before = b.get_pool_stats(POOL).pools[0].cached_pages
            found = b.lookup(POOL, NAMESPACE, keys, acquire=True)
            print(f"node B: host memory held {before} of these pages; lookup found "
                  f"{found.hits} of {len(keys)} keys")
            got = [b.read_pages(POOL, [(page, 1)]) for page in page_list(found.pages)]
            same = sum(x == y for x, y in zip(got, page_bytes))
            t = b.get_pool_stats().tier
            print(f"node B: tier brought {t.read_hits} pages ({t.read_bytes >> 10} KiB) "
                  f"in {t.get_calls} call(s), mean {t.get_mean_seconds * 1e3:.2f} ms")
            b.release(POOL, found.pages)
            if found.hits != PAGES or same != PAGES:
                sys.exit(f"FAIL: {found.hits} hits, {same} of {PAGES} pages byte-exact")
            print(f"node B: {same} of {PAGES} pages match node A's bytes: bytes match")
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
