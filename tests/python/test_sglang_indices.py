"""hostkv.sglang's index handling (indices.py) and slot bookkeeping
(host_slots.py): SGLang's token-index tensors -> hostkv's page and slot
runs, checked against plain-Python models on edge cases and on random
input; every bad input raises before anything moves. No daemon needed."""
import random

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from hostkv import errors  # noqa: E402
from hostkv.sglang import indices as idx  # noqa: E402
from hostkv.sglang.host_slots import HostSlots  # noqa: E402


# -- plain-Python models ------------------------------------------------------

def merge(values):
    """[(first, count), ...] of consecutive ascending values."""
    runs = []
    for v in values:
        if runs and runs[-1][0] + runs[-1][1] == v:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((v, 1))
    return runs


def model_page_runs(tokens, ps, size):
    """page_runs's result, or the fragment its InvalidArgument names."""
    if len(tokens) % ps:
        return "not whole pages"
    if not tokens:
        return []
    if min(tokens) < 0 or max(tokens) >= size:
        return "outside the pool's"
    pages = []
    for i in range(0, len(tokens), ps):
        row = tokens[i:i + ps]
        if row[0] % ps or row != list(range(row[0], row[0] + ps)):
            return "whole pages in order"
        pages.append(row[0] // ps)
    return merge(pages)


def model_slot_runs(tokens, slots):
    if tokens and (min(tokens) < 0 or max(tokens) >= slots):
        return "outside the device pool's"
    return merge(tokens)


def outcome(fn, *args):
    try:
        return fn(*args)
    except errors.InvalidArgument as e:
        assert isinstance(e, ValueError)
        return e.message


def assert_matches(got, want):
    if isinstance(want, str):
        assert isinstance(got, str) and want in got, (got, want)
    else:
        assert got == want


def pages(*numbers, ps=4):
    """Token indices of whole pages `numbers`, in that order."""
    return torch.tensor([p * ps + j for p in numbers for j in range(ps)], dtype=torch.int64)


# -- page runs (host indices) ---------------------------------------------------

PS, SIZE = 4, 64  # 16 pages of 4 tokens


@pytest.mark.parametrize("tokens,want", [
    (pages(), []),
    (pages(3), [(3, 1)]),
    (pages(0), [(0, 1)]),
    (pages(15), [(15, 1)]),
    (pages(2, 3, 4), [(2, 3)]),
    (pages(1, 3, 4, 9), [(1, 1), (3, 2), (9, 1)]),
    (pages(5, 4, 3), [(5, 1), (4, 1), (3, 1)]),            # descending pages
    (pages(7, 7), [(7, 1), (7, 1)]),                       # a page twice: as before
    (pages(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), [(0, 16)]),
])
def test_page_runs(tokens, want):
    assert idx.page_runs(tokens, PS, SIZE) == want
    assert idx.page_runs(tokens.to(torch.int32), PS, SIZE) == want
    assert idx.page_runs(tokens.tolist(), PS, SIZE) == want
    assert idx.pages_of(tokens, PS, SIZE).tolist() == [p for p, n in want for p in range(p, p + n)]
    assert idx.pages_of(tokens, PS, SIZE).dtype == torch.int64


@pytest.mark.parametrize("tokens,fragment", [
    (torch.arange(3), "3 indices are not whole pages of 4 tokens"),
    (torch.arange(1, 5), "must cover whole pages in order"),        # not page-aligned
    (pages(2).flip(0), "must cover whole pages in order"),          # a page backwards
    (torch.tensor([8, 9, 11, 10]), "must cover whole pages in order"),
    (torch.cat([pages(1), torch.tensor([8, 9, 10, 10])]), "must cover whole pages in order"),
    (torch.cat([pages(1), torch.arange(9, 13)]), "must cover whole pages in order"),
    (pages(16), "index 67 is outside the pool's 64 slots"),
    (pages(-1), "index -4 is outside the pool's 64 slots"),
    (torch.arange(61, 65), "index 64 is outside"),                  # out of range and misaligned:
    (torch.tensor([-3, 0, 1, 2]), "index -3 is outside"),           # the range is named first
    (torch.zeros(2, 4, dtype=torch.int64), "a 1-D index tensor, not 2-D"),
    (torch.tensor(4), "a 1-D index tensor, not 0-D"),
    (torch.arange(4, dtype=torch.float32), "integer indices, not torch.float32"),
    (torch.arange(4, dtype=torch.int16), "integer indices, not torch.int16"),
    (torch.tensor([2**63 - 1, -2**63, -2**63 + 1, -2**63 + 2]), "is outside"),  # wraps around
])
def test_page_runs_refuse(tokens, fragment):
    for fn in (idx.page_runs, idx.pages_of):
        with pytest.raises(errors.InvalidArgument, match=fragment.replace("(", r"\(")):
            fn(tokens, PS, SIZE)


def test_page_runs_page_size_one_and_strided_input():
    assert idx.page_runs(torch.tensor([5, 6, 7, 2, 9]), 1, 10) == [(5, 3), (2, 1), (9, 1)]
    with pytest.raises(errors.InvalidArgument, match="index 10 is outside"):
        idx.page_runs(torch.tensor([5, 10]), 1, 10)
    strided = torch.stack([pages(1, 2, 3, 4), pages(9, 9, 9, 9)], dim=1)[:, 0]
    assert not strided.is_contiguous()
    assert idx.page_runs(strided, PS, SIZE) == [(1, 4)]
    every_other = torch.arange(0, 32)[::2]  # a view with stride 2: tokens 0, 2, 4, ...
    assert not every_other.is_contiguous()
    assert idx.slot_runs(every_other, 64) == [(v, 1) for v in range(0, 32, 2)]
    with pytest.raises(errors.InvalidArgument, match="whole pages in order"):
        idx.page_runs(every_other, PS, SIZE)


# -- slot runs (device indices) ---------------------------------------------------

@pytest.mark.parametrize("tokens,want", [
    ([], []),
    ([7], [(7, 1)]),
    ([0, 1, 2, 3], [(0, 4)]),
    ([4, 5, 0, 1, 9], [(4, 2), (0, 2), (9, 1)]),
    ([3, 2, 1], [(3, 1), (2, 1), (1, 1)]),
    ([3, 3, 4], [(3, 1), (3, 2)]),           # duplicates are not checked for device slots
    ([63], [(63, 1)]),
])
def test_slot_runs(tokens, want):
    t = torch.tensor(tokens, dtype=torch.int64)
    assert idx.slot_runs(t, 64) == want
    assert idx.slot_runs(t.to(torch.int32), 64) == want
    assert idx.slot_runs(tokens, 64) == want


@pytest.mark.parametrize("tokens,fragment", [
    ([64], "slot 64 is outside the device pool's 64 slots"),
    ([-1, 0], "slot -1 is outside"),
    ([62, 63, 64, 65], "slot 65 is outside"),
    ([2**63 - 1, -2**63], "slot -9223372036854775808 is outside"),  # wraps around
])
def test_slot_runs_refuse(tokens, fragment):
    with pytest.raises(errors.InvalidArgument, match=fragment):
        idx.slot_runs(torch.tensor(tokens, dtype=torch.int64), 64)


def test_transfer_runs_checks_host_then_device_then_counts():
    host, device = pages(2, 3), torch.tensor([9, 10, 11, 12, 0, 1, 2, 3])
    assert idx.transfer_runs(host, device, PS, SIZE, 64) == ([(2, 2)], [(9, 4), (0, 4)])
    assert idx.transfer_runs(pages(), [], PS, SIZE, 64) == ([], [])
    with pytest.raises(errors.InvalidArgument, match="8 host indices but 7 device indices"):
        idx.transfer_runs(host, device[:7], PS, SIZE, 64)
    with pytest.raises(errors.InvalidArgument, match="host_indices: index 67 is outside"):
        idx.transfer_runs(pages(16), torch.tensor([100] * 3), PS, SIZE, 64)
    with pytest.raises(errors.InvalidArgument, match="device_indices: slot 100 is outside"):
        idx.transfer_runs(host, torch.tensor([100] * 3), PS, SIZE, 64)
    with pytest.raises(errors.InvalidArgument, match="device_indices: a 1-D"):
        idx.transfer_runs(host, device.view(2, 4), PS, SIZE, 64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_index_tensors_give_the_same_runs():
    host, device = pages(4, 5, 9), torch.tensor([1, 2, 3, 7, 8, 9, 10, 11, 12, 0, 5, 6])
    want = idx.transfer_runs(host, device, PS, SIZE, 64)
    assert idx.transfer_runs(host.cuda(), device.cuda(), PS, SIZE, 64) == want
    assert idx.transfer_runs(host.cuda().int(), device.cuda().int(), PS, SIZE, 64) == want
    with pytest.raises(errors.InvalidArgument, match="whole pages in order"):
        idx.page_runs((host + 1).cuda(), PS, SIZE)


# -- runs <-> token indices -------------------------------------------------------

def test_runs_of_takes_tensors_arrays_and_lists():
    for values in (torch.tensor([1, 2, 3, 7, 5, 6]), np.array([1, 2, 3, 7, 5, 6]),
                   [1, 2, 3, 7, 5, 6]):
        assert idx.runs_of(values) == [(1, 3), (7, 1), (5, 2)]
    assert idx.runs_of(torch.empty(0, dtype=torch.int64)) == [] == idx.runs_of([])
    assert idx.runs_of(torch.tensor([4])) == [(4, 1)]


@pytest.mark.parametrize("runs", [[], [(0, 1)], [(5, 3)], [(9, 1), (2, 1), (4, 3)],
                                  [(3, 2), (8, 1), (0, 1), (12, 4)]])
@pytest.mark.parametrize("ps", [1, 4, 16])
def test_token_indices_are_the_runs_pages(runs, ps):
    tokens = idx.token_indices(runs, ps)
    assert tokens.dtype == torch.int64
    assert tokens.tolist() == [p * ps + j for first, count in runs
                               for p in range(first, first + count) for j in range(ps)]
    assert idx.page_numbers(runs).tolist() == [p for f, c in runs for p in range(f, f + c)]
    assert idx.page_runs(tokens, ps, 16 * ps) == merge(
        [p for f, c in runs for p in range(f, f + c)])


# -- against the models, random input ------------------------------------------------

def random_tokens(rng, ps, size):
    n = rng.randrange(0, 7)
    numbers = [rng.randrange(-1, size // ps + 1) for _ in range(n)]
    kind = rng.randrange(7)
    if kind == 0:
        numbers = sorted({p for p in numbers if p >= 0})
    tokens = [p * ps + j for p in numbers for j in range(ps)]
    if tokens and kind == 1:
        tokens[rng.randrange(len(tokens))] += rng.choice((-1, 1, ps))
    elif tokens and kind == 2:
        rng.shuffle(tokens)
    elif kind == 3:
        tokens = tokens[:-1]
    elif kind == 4:
        tokens = [t + 1 for t in tokens]
    elif kind == 5:
        start = rng.randrange(-2, size + 2)
        tokens = list(range(start, start + rng.randrange(0, 3 * ps + 1)))
    return tokens


def test_runs_match_the_models_on_random_input():
    rng = random.Random(26)
    for _ in range(3000):
        ps = rng.choice((1, 2, 4, 16))
        size = ps * rng.randrange(1, 9)
        tokens = random_tokens(rng, ps, size)
        dtype = rng.choice((torch.int64, torch.int32))
        t = torch.tensor(tokens, dtype=dtype)
        assert_matches(outcome(idx.page_runs, t, ps, size), model_page_runs(tokens, ps, size))
        assert_matches(outcome(idx.slot_runs, t, size), model_slot_runs(tokens, size))


# -- host slots: token-granular frees over whole-page allocations ------------------------

def test_host_slots_free_whole_and_partial_pages():
    s = HostSlots(8, 4)
    s.take([(1, 3), (6, 1)])
    assert s.free_pages() == 4 and s.held_page_numbers().tolist() == [1, 2, 3, 6]
    t = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    assert s.pages_freed_by(t(4, 5)).tolist() == []          # half of page 1
    s.release(t(4, 5), t())
    assert s.pages_freed_by(t(7, 6, 8, 9, 10, 11)).tolist() == [1, 2]  # unsorted
    s.release(t(7, 6, 8, 9, 10, 11), t(1, 2))
    assert s.free_pages() == 6 and s.held_page_numbers().tolist() == [3, 6]
    assert s.pages_freed_by(torch.arange(12, 16)).tolist() == [3]
    assert s.pages_freed_by(torch.arange(25, 27)).tolist() == []   # inside page 6
    assert s.pages_freed_by(t(24, 25, 26, 27)).tolist() == [6]
    assert s.pages_freed_by(t()).tolist() == []


def test_host_slots_refuse_and_change_nothing():
    s = HostSlots(8, 4)
    s.take([(0, 2), (5, 3)])
    used, held = s.used.clone(), s.held.clone()
    with pytest.raises(IndexError, match="slot 32 is outside the host pool's 32 slots"):
        s.pages_freed_by(torch.tensor([0, 32]))
    with pytest.raises(IndexError, match="slot -1 is outside"):
        s.pages_freed_by(torch.tensor([-1, 0]))
    with pytest.raises(AssertionError, match="appears more than once"):
        s.pages_freed_by(torch.tensor([1, 2, 1]))
    with pytest.raises(AssertionError, match=r"not currently allocated: \[8, 9\]"):
        s.pages_freed_by(torch.tensor([7, 8, 9]))
    with pytest.raises(AssertionError, match="not currently allocated"):
        s.pages_freed_by(torch.arange(6, 10))                  # one ascending run
    assert torch.equal(s.used, used) and torch.equal(s.held, held) and s.free_pages() == 3


def test_host_slots_match_a_model_on_random_frees():
    rng = random.Random(5)
    for _ in range(60):
        ps, page_num = rng.choice((1, 2, 4, 16)), rng.randrange(1, 10)
        s = HostSlots(page_num, ps)
        used, held = set(), set()
        for _ in range(40):
            free = [p for p in range(page_num) if p not in held]
            if free and rng.random() < 0.4:
                chosen = sorted(rng.sample(free, rng.randrange(1, len(free) + 1)))
                s.take(merge(chosen))
                held.update(chosen)
                used.update(p * ps + j for p in chosen for j in range(ps))
                continue
            pool = sorted(used)
            kind = rng.randrange(4)
            if kind == 0 and pool:
                i = rng.randrange(len(pool))
                tokens = pool[i:rng.randrange(i, len(pool)) + 1]
            elif kind == 1 and pool:
                tokens = rng.sample(pool, rng.randrange(1, len(pool) + 1))
            elif kind == 2 and pool:
                tokens = pool[:rng.randrange(1, len(pool) + 1)]
                tokens.append(rng.choice(tokens))
            else:
                tokens = [rng.randrange(-1, s.size + 1) for _ in range(rng.randrange(0, 4))]
            t = torch.tensor(tokens, dtype=torch.int64)
            if any(x < 0 or x >= s.size for x in tokens):
                want = IndexError
            elif len(set(tokens)) != len(tokens) or not set(tokens) <= used:
                want = AssertionError
            else:
                left = used - set(tokens)
                want = sorted(p for p in {x // ps for x in tokens}
                              if not any(p * ps + j in left for j in range(ps)))
            if isinstance(want, list):
                got = s.pages_freed_by(t)
                assert got.tolist() == want, (ps, page_num, tokens)
                s.release(t, got)
                used -= set(tokens)
                held -= set(want)
            else:
                with pytest.raises(want):
                    s.pages_freed_by(t)
            assert set(s.used.nonzero().flatten().tolist()) == used
            assert set(s.held_page_numbers().tolist()) == held
            assert s.free_pages() == page_num - len(held)
