"""One engine process of the restart soak (test_restart_soak.py): it works
until its stdin closes, then checks what it must find and prints one JSON
line of counts. Every exception it meets is counted (there must be none),
every byte it reads back is compared.

usage: restart_soak_child.py ROLE TARGET ACK_FILE
  sglang     an SGLang host pool (RemoteMHATokenToKVPoolHost): alloc, backup
             of every layer, zero, load layer by layer, compare, free
  publisher  pages filled by a backup and published at once (Client.publish,
             no wait), and a prompt's pages stored through HostkvStorage's
             batch_set_v1; what is acknowledged goes to ACK_FILE
  reader     the acknowledged keys: Lookup(acquire), Load, compare, Release;
             HostkvStorage.batch_get_v1 and compare; at the end, every key
             acknowledged, found with its bytes
"""
import json
import os
import random
import sys
import threading
import time
import traceback

import torch

import hostkv
import hostkv.torch as hkt
from hostkv.sglang import RemoteMHATokenToKVPoolHost
from sglang_model import DevicePool
from sglang_model import page_keys
from storage_fixtures import StorageConfig, make_storage, tokens_of

PAGE = 16
LAYERS = 4
HEADS = 2
HEAD_DIM = 64
SLOTS = 4 * PAGE
POOL = "soak-cache"
NAMESPACE = "soak"
MODEL = "soak-org/soak-model"
MAX_KEYS = 6000  # of the 8,192 pages of POOL


class Report:
    def __init__(self, role):
        self.role = role
        self.rounds = 0
        self.skipped = 0      # alloc said None (hostkvd away)
        self.unavailable = 0  # storage answered "not stored" while away
        self.mismatches = 0
        self.lost = 0
        self.exceptions = []
        self.longest = 0.0    # the longest round, seconds

    def round(self, started):
        self.rounds += 1
        self.longest = max(self.longest, time.monotonic() - started)

    def failed(self, what):
        self.exceptions.append(f"{what}: {traceback.format_exc(limit=4)}")

    def dump(self):
        print(json.dumps(self.__dict__), flush=True)


def stopper():
    stop = threading.Event()

    def watch():
        sys.stdin.read()
        stop.set()
    threading.Thread(target=watch, daemon=True).start()
    return stop


def key_of(n):
    return f"soak-key-{n}".encode()


def rows_of(n):
    """The K/V rows of one page whose key is key_of(n)."""
    g = torch.Generator().manual_seed(1000 + n)
    return torch.randn((2, LAYERS, PAGE, HEADS, HEAD_DIM), generator=g).to(torch.bfloat16)


class CacheEngine:
    """A session on the shared pool with device buffers of its own."""

    def __init__(self, target, name):
        self.client = hostkv.Client(target, name, reconnect_timeout=60)
        self.client.create_pool(hostkv.mha_pool_spec(
            POOL, num_layers=LAYERS, num_kv_heads=HEADS, head_dim=HEAD_DIM, page_size=PAGE,
            capacity_tokens=8192 * PAGE))
        self.kv, k, v = hkt.mha_kv_buffer(LAYERS, SLOTS, HEADS, HEAD_DIM, torch.bfloat16)
        self.import_id = self.client.register_device_buffers(
            POOL, SLOTS, *hkt.device_buffers_for(self.client, k, v))

    def page_rows(self):
        return self.kv.narrow(2, 0, PAGE)


def run_sglang(target, stop, report):
    device = DevicePool("mha", LAYERS, size=256, page_size=PAGE, head_num=HEADS,
                        head_dim=HEAD_DIM)
    device.fill_random(torch.Generator().manual_seed(7))
    original = device.kv.clone()
    host = RemoteMHATokenToKVPoolHost(device, 2.0, 0, PAGE, "page_first", target=target)
    source, target_rows = torch.arange(0, 64), torch.arange(128, 192)
    print("ready", flush=True)
    while not stop.is_set():
        started = time.monotonic()
        try:
            idx = host.alloc(64)
            if idx is None:
                report.skipped += 1
                time.sleep(0.01)
                continue
            host.backup_from_device_all_layer(device, idx, source, "kernel")
            device.kv.narrow(2, 128, 64).zero_()
            for layer in range(LAYERS):
                host.load_to_device_per_layer(device, idx, target_rows, layer, "kernel")
                if not torch.equal(device.kv[:, layer].narrow(1, 128, 64),
                                   original[:, layer].narrow(1, 0, 64)):
                    report.mismatches += 1
            host.free(idx)
        except Exception:  # pylint: disable=broad-except
            report.failed("sglang round")
        report.round(started)


def run_publisher(target, ack_file, stop, report):
    e = CacheEngine(target, "publisher")
    storage = storage_engine(target, MODEL)
    acks = open(ack_file, "a", buffering=1)
    print("ready", flush=True)
    n = 0
    while not stop.is_set():
        if n >= MAX_KEYS:  # all stay cached: a miss is a lost key
            time.sleep(0.05)
            continue
        started = time.monotonic()
        try:
            e.page_rows().copy_(rows_of(n))
            runs = e.client.alloc(POOL, PAGE)
            e.client.backup(POOL, e.import_id, runs, [(0, PAGE)])
            # No wait: the daemon publishes the page once the backup filled
            # it, and a restart in between submits the backup again first.
            done = e.client.publish(POOL, NAMESPACE, [key_of(n)], runs)
            if done.outcomes == [hostkv.cache_calls.CACHED]:
                acks.write(f"c {n}\n")
            made = prefill(storage, n) if n % 16 == 0 else None
            if made is not None:
                idx, keys = made
                stored = storage.storage.batch_set_v1(keys, idx)
                storage.host.free(idx)
                if all(stored):
                    acks.write(f"s {n}\n")
                else:
                    report.unavailable += 1
        except Exception:  # pylint: disable=broad-except
            report.failed(f"publisher round {n}")
        n += 1
        report.round(started)


def prefill(engine, n):
    """A prompt's KV (seed n) backed up to fresh host pages of `engine`:
    (host indices, page keys), or None while hostkvd is away."""
    idx = engine.host.alloc(2 * PAGE)
    if idx is None:
        return None
    engine.device.fill_random(torch.Generator().manual_seed(n))
    engine.host.backup_from_device_all_layer(engine.device, idx, torch.arange(2 * PAGE),
                                             "kernel")
    return idx, page_keys(tokens_of(n, 2 * PAGE), PAGE)


class StorageEngine:
    """An engine rank with HostkvStorage on a host pool that every soak
    engine shares (so what one stores, the other finds), big enough that
    nothing stored is evicted during the soak."""

    def __init__(self, target, model):
        self.device = DevicePool("mha", LAYERS, size=256, page_size=PAGE, head_num=HEADS,
                                 head_dim=HEAD_DIM)
        self.host = RemoteMHATokenToKVPoolHost(self.device, 128.0, 0, PAGE, "page_first",
                                               target=target, pool_name="soak-storage")
        self.storage = make_storage(self.host, target, StorageConfig(model_name=model))

    def page_bytes(self, host_indices):
        return [self.host.get_data_page(int(i)).contiguous().view(torch.uint8)
                .numpy().tobytes() for i in host_indices[::PAGE].tolist()]


def storage_engine(target, model):
    return StorageEngine(target, model)


class _Target:
    def __init__(self, target):
        self.target = target


def read_acks(ack_file):
    cached, stored = [], []
    with open(ack_file) as f:
        for line in f:
            if line.endswith("\n"):
                kind, n = line.split()
                (cached if kind == "c" else stored).append(int(n))
    return cached, stored


def check_cached(e, n, report):
    hit = e.client.lookup(POOL, NAMESPACE, [key_of(n)], acquire=True)
    if hit.hits != 1:
        report.lost += 1
        return
    e.page_rows().zero_()
    e.client.wait(e.client.load(POOL, e.import_id, hit.pages, [(0, PAGE)]))
    if not torch.equal(e.page_rows(), rows_of(n)):
        report.mismatches += 1
    e.client.release(POOL, hit.pages)


def check_stored(storage, expected_engine, n, report, final):
    made = prefill(expected_engine, n)
    if made is None:
        report.unavailable += 1
        return
    idx, keys = made
    expected = expected_engine.page_bytes(idx)
    expected_engine.host.free(idx)
    into = storage.host.alloc(2 * PAGE)
    if into is None:
        report.unavailable += 1
        return
    try:
        got = storage.storage.batch_get_v1(keys, into)
        if not all(got):
            if final:
                report.lost += 1
            else:
                report.unavailable += 1
            return
        if storage.page_bytes(into) != expected:
            report.mismatches += 1
    finally:
        storage.host.free(into)


def run_reader(target, ack_file, stop, report):
    e = CacheEngine(target, "reader")
    storage = storage_engine(target, MODEL)
    expected_engine = storage_engine(target, MODEL + "-expected")
    print("ready", flush=True)
    rng = random.Random(5)
    while not stop.is_set():
        started = time.monotonic()
        try:
            cached, stored = read_acks(ack_file)
            if cached:
                check_cached(e, rng.choice(cached[-16:] + cached[:1]), report)
            if stored:
                check_stored(storage, expected_engine, rng.choice(stored), report, False)
            if not cached and not stored:
                time.sleep(0.01)
        except Exception:  # pylint: disable=broad-except
            report.failed("reader round")
        report.round(started)
    # Every acknowledged key, with its bytes.
    try:
        cached, stored = read_acks(ack_file)
        for n in cached:
            check_cached(e, n, report)
        for n in stored:
            check_stored(storage, expected_engine, n, report, True)
        report.checked = [len(cached), len(stored)]
    except Exception:  # pylint: disable=broad-except
        report.failed("final check")


def main(role, target, ack_file):
    stop = stopper()
    report = Report(role)
    try:
        if role == "sglang":
            run_sglang(target, stop, report)
        elif role == "publisher":
            run_publisher(target, ack_file, stop, report)
        else:
            run_reader(target, ack_file, stop, report)
    except Exception:  # pylint: disable=broad-except
        report.failed("setup")
    report.dump()
    sys.stdout.flush()
    os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
