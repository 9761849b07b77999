"""The two engine processes of torch_e2e.py (see there). Each prints its
protocol lines on stdout (B: "session N" first, then its result; A: the
hand-over as JSON) and what went wrong on stderr, and exits 0 or 1.
torch and hostkv are imported only in the engine processes."""
import json
import os
import sys
import time

LAYERS, HEADS, DIM, PAGE = 4, 2, 64, 16
TOKENS = 64          # backed up by A, loaded by B
SLOTS = 160          # device rows per layer
A_FIRST, B_FIRST = 16, 48
SENTINEL = 0xA5      # B's bytes before the load
DELAY_CYCLES = 100_000_000  # torch.cuda._sleep: ~50 ms at 2 GHz
POOL = "torch-e2e"
WAIT_S = 30


def _say(role, text):
    print(f"torch_e2e {role.upper()}: {text}", file=sys.stderr, flush=True)


def _spec(hostkv):
    return hostkv.mha_pool_spec(POOL, num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM,
                                page_size=PAGE, capacity_tokens=1024)


def _await_pinned(client, pb):
    deadline = time.monotonic() + WAIT_S
    while True:
        stats = client.get_pool_stats(POOL).pools[0]
        if stats.pin_state in (pb.PIN_PINNED, pb.PIN_NOT_NEEDED):
            return
        if stats.pin_state != pb.PIN_PINNING or time.monotonic() > deadline:
            raise RuntimeError(f"pool {POOL} is {pb.PinState.Name(stats.pin_state)}: "
                               f"{stats.pin_error or 'not pinned in time'}")
        time.sleep(0.02)


def _delay(torch):
    """Keeps the current stream busy for a while (so that work enqueued
    behind it visibly runs later than work that does not wait for it)."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(DELAY_CYCLES)  # pylint: disable=protected-access


def _await_stream(stream, signals, op):
    """Polls `stream` (synchronize could hang on a signal that never comes)."""
    deadline = time.monotonic() + WAIT_S
    while not stream.query():
        if time.monotonic() > deadline:
            words = [signals.read_word(layer) for layer in range(LAYERS)]
            raise RuntimeError(f"the compute stream is stuck in wait_layer: words {words}, "
                               f"op {op.op_id} signals {op.signal_value}")
        time.sleep(0.001)


def _rows(tensors, first):
    """Rows [first, first + TOKENS) of each layer, as one uint8 CPU tensor."""
    import torch  # pylint: disable=import-outside-toplevel
    return torch.stack([t[first:first + TOKENS] for t in tensors]).view(torch.uint8).cpu()


def _engine_a(client, to_session, workdir):
    import torch  # pylint: disable=import-outside-toplevel
    import hostkv  # pylint: disable=import-outside-toplevel
    import hostkv.cuda as hkc  # pylint: disable=import-outside-toplevel
    client.create_pool(_spec(hostkv))
    _await_pinned(client, hostkv.pb)
    shape = (SLOTS, HEADS, DIM)
    k = [torch.zeros(shape, dtype=torch.bfloat16, device="cuda") for _ in range(LAYERS)]
    v_all = torch.zeros((LAYERS,) + shape, dtype=torch.bfloat16, device="cuda")
    v = [v_all[layer] for layer in range(LAYERS)]
    kb, vb = hkc.device_buffers_for_cuda(k, v)
    with hkc.GpuSignals(LAYERS) as signals:
        import_id = client.register_device_buffers(POOL, SLOTS, kb, vb,
                                                   gpu_signals=signals.buffer)
        signals.attach_kv_word(client, import_id)
        pages = client.alloc(POOL, TOKENS)
        torch.cuda.synchronize()  # the zeros are there
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            _delay(torch)
            for t in k + [v_all]:
                t.view(torch.uint8).random_(0, 256)
            mark = signals.mark_kv_written(stream)
        op = client.backup(POOL, import_id, pages, [(A_FIRST, TOKENS)], wait_kv_written=mark)
        client.wait(op, timeout=WAIT_S)
        stream.synchronize()
        torch.save({"k": _rows(k, A_FIRST), "v": _rows(v, A_FIRST)},
                   os.path.join(workdir, "expected.pt"))
        moved = client.hand_over_pages(POOL, pages, to_session)
        if moved != sum(n for _, n in pages):
            raise RuntimeError(f"hand_over_pages moved {moved} pages of {pages}")
        client.unregister_device_buffers(import_id)
    print(json.dumps({"pages": pages, "mark": mark}), flush=True)
    return f"backed up {TOKENS} tokens behind mark {mark}, op {op.op_id}"


def _compare(role, name, got, want):
    if bool((got == want).all()):
        return True
    wrong = got != want
    layer = int(wrong.nonzero()[0][0])
    sentinel = bool((got[layer][wrong[layer]] == SENTINEL).all())
    zeros = bool((got[layer][wrong[layer]] == 0).all())
    hint = (" (B's sentinel: read before the load landed; did wait_layer wait?)" if sentinel
            else " (zeros: the backup ran before the KV was written?)" if zeros else "")
    _say(role, f"MISMATCH: {name}: {int(wrong.sum())} of {got.numel()} bytes differ, "
               f"first in layer {layer}{hint}")
    return False


def _engine_b(client, workdir):
    import torch  # pylint: disable=import-outside-toplevel
    import hostkv  # pylint: disable=import-outside-toplevel
    import hostkv.cuda as hkc  # pylint: disable=import-outside-toplevel
    shape = (SLOTS, HEADS, DIM)
    k_all = torch.empty((LAYERS,) + shape, dtype=torch.bfloat16, device="cuda")
    k_all.view(torch.uint8).fill_(SENTINEL)
    k = [k_all[layer] for layer in range(LAYERS)]
    v = [torch.empty(shape, dtype=torch.bfloat16, device="cuda") for _ in range(LAYERS)]
    for t in v:
        t.view(torch.uint8).fill_(SENTINEL)
    out_k = torch.empty((LAYERS, TOKENS) + shape[1:], dtype=torch.bfloat16, device="cuda")
    out_v = torch.empty_like(out_k)
    torch.cuda.synchronize()
    client.create_pool(_spec(hostkv))
    _await_pinned(client, hostkv.pb)
    signals = hkc.GpuSignals(LAYERS)
    import_id = client.register_device_buffers(POOL, SLOTS, *hkc.device_buffers_for_cuda(k, v),
                                               gpu_signals=signals.buffer)
    signals.attach_kv_word(client, import_id)
    handover = sys.stdin.readline()
    if not handover:
        raise RuntimeError("no hand-over from engine A")
    pages = [tuple(p) for p in json.loads(handover)["pages"]]
    side, compute = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(side):
        _delay(torch)
        mark = signals.mark_kv_written(side)
    op = client.load(POOL, import_id, pages, [(B_FIRST, TOKENS)], wait_kv_written=mark)
    with torch.cuda.stream(compute):
        for layer in range(LAYERS):
            signals.wait_layer(op, layer)  # on the current stream: compute
            out_k[layer].copy_(k[layer][B_FIRST:B_FIRST + TOKENS])
            out_v[layer].copy_(v[layer][B_FIRST:B_FIRST + TOKENS])
    _await_stream(compute, signals, op)
    client.wait(op, timeout=WAIT_S)  # Aborted if the daemon failed it
    words = [signals.read_word(layer) for layer in range(LAYERS)]
    if min(words) < op.signal_value:
        raise RuntimeError(f"signal words {words} below op.signal_value {op.signal_value}")
    expected = torch.load(os.path.join(workdir, "expected.pt"))
    ok = _compare("b", "K", out_k.view(torch.uint8).cpu(), expected["k"])
    ok = _compare("b", "V", out_v.view(torch.uint8).cpu(), expected["v"]) and ok
    for plane, tensors in (("K", k), ("V", v)):
        outside = torch.stack([torch.cat([t[:B_FIRST], t[B_FIRST + TOKENS:]]) for t in tensors])
        if not bool((outside.view(torch.uint8) == SENTINEL).all()):
            _say("b", f"MISMATCH: the load wrote {plane} rows outside its slots")
            ok = False
    client.free(POOL, pages)
    client.unregister_device_buffers(import_id)
    signals.release()
    if not ok:
        raise RuntimeError("B's bytes differ from A's")
    name = torch.cuda.get_device_name()
    return (f"{LAYERS} layers x K/V x {TOKENS} tokens backed up by A, handed over, loaded by "
            f"B with wait_layer on its stream: bytes equal (words {words[0]}.., "
            f"torch {torch.__version__}, {name})")


def run_engine(role, target, workdir, to_session):
    """Engine `role` ("a" or "b") against `target`; returns the exit code."""
    try:
        import hostkv  # pylint: disable=import-outside-toplevel
        with hostkv.Client(target, f"torch-e2e-{role}") as client:
            if role == "b":
                print(f"session {client.session_number}", flush=True)
                result = _engine_b(client, workdir)
                print(result, flush=True)
            else:
                result = _engine_a(client, to_session, workdir)
        _say(role, result)
        return 0
    except Exception as e:  # pylint: disable=broad-except
        _say(role, f"FAIL: {type(e).__name__}: {e}")
        return 1
