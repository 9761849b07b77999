"""A vLLM worker (rank 0 of a one-GPU instance) that is killed mid-transfer
by test_vllm_offloading.py: it loads the 4 blocks the test stored (taking
references) and stores 4 new ones (owning unpublished pages), prints
"ready" with both jobs submitted and not collected, and waits to be
killed. argv: target model."""
import os
import sys
import time

os.environ.setdefault("PYTHONHASHSEED", "0")

import vllm_fixtures as vf  # noqa: E402


def main():
    target, model = sys.argv[1], sys.argv[2]
    inst = vf.Instance(target, seed=9, model=model)
    hashes = vf.prompt_hashes(4)
    hits, load = inst.sched.lookup_and_prepare_load(hashes, [20, 21, 22, 23])
    assert hits == 4, hits
    out, store = inst.sched.prepare_store(vf.prompt_hashes(4, 3000), [4, 5, 6, 7])
    worker = inst.workers[0]
    assert worker.submit(load) is not None
    assert worker.submit(store) is not None
    print("ready", flush=True)
    time.sleep(60)


if __name__ == "__main__":
    main()
