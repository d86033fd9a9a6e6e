"""A rank of a job as `cuda-debug dump --job` sees it through the job's store (the
fake c10d store of tests/fake_store.py): what the dump tests share."""
import json
import threading
import time

from fake_cuda import child_env
from helpers.cli import cli


JOB_RANK = '''
import os, time, cuda_debug, cuda_debug.testing as t
fake.fake_set_async(1)
with cuda_debug.watch():
    t.spin(60)
    print("READY", flush=True)
    time.sleep(60)
'''


def rank_env(fake_cuda_dir, store, rank=0, world=1):
    return dict(child_env(fake_cuda_dir), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
                RANK=str(rank), WORLD_SIZE=str(world))


def wait_key(store, key, timeout=20.0):
    deadline = time.monotonic() + timeout
    while store.value(key) is None:
        assert time.monotonic() < deadline, "no %s in the store" % key
        time.sleep(0.05)
    return store.value(key)


def dump_job(store, *more):
    return cli("dump", "--job", "127.0.0.1:%d" % store.port, "--timeout", "1", *more,
               env={"MASTER_ADDR": "", "MASTER_PORT": ""}, timeout=60)


def registration(**kw):
    info = {"pid": 4242, "host": "node0", "world_size": 1}
    info.update(kw)
    return json.dumps(info)


def answering_rank(store, answer, rank=0):
    """A rank (this thread) that answers the next request with `answer`."""
    def run():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            n = int(store.value("cuda_debug/dump/requests") or b"0")
            if n:
                store.put("cuda_debug/dump/answer/%d/%d" % (n, rank), answer)
                return
            time.sleep(0.02)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


GOOD = {"format": "cuda_debug.dump", "version": 1, "pid": 4242, "rank": 0, "time": 1.0,
        "text": "", "streams": [], "recent": []}
