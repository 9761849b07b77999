"""An engine process for test_sglang_storage_restart.py: prefills a prompt,
stores its pages through HostkvStorage, prints "ready SESSION KEYS", then
waits to be killed.

usage: sglang_storage_child.py TARGET POOL MODEL in-process|remote SEED
"""
import dataclasses
import sys
import time

from storage_fixtures import Engine, StorageConfig, tokens_of


@dataclasses.dataclass
class Target:
    target: str


def main(target, pool, model, kind, seed):
    engine = Engine(Target(target), "mha", "page_first", remote=kind == "remote",
                    pool_name=pool, config=StorageConfig(model_name=model))
    idx, keys = engine.prefill(tokens_of(seed, 6 * 16), seed=seed)
    assert engine.storage.batch_set_v1(keys, idx) == [True] * len(keys)
    print("ready", engine.storage.client.session_number, len(keys), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
