"""worker_mode="thread": a Python dataset's code in the loader's threads of this process (for
Python without a GIL): the same batches as PyTorch's DataLoader, get_worker_info (longshore's
and torch's) per thread, worker_init_fn once per worker, an exception re-raised naming the
worker thread, iterable datasets sharded by worker, batches in the shared pool within its
budget; the refusals. And a process that exits with a loader still running ends cleanly."""
import os
import subprocess
import sys
import threading
import textwrap

import numpy as np
import pytest

import longshore
from conftest import need_torch
from test_python_datasets import Failing, Nested, Stream, assert_same, torch_stream


def test_batches_equal_torch_default_collate():
    torch = need_torch()
    ours = longshore.DataLoader(Nested(), batch_size=5, num_workers=3, worker_mode="thread")
    theirs = torch.utils.data.DataLoader(Nested(), batch_size=5)
    for epoch in range(2):
        got, want = list(ours), list(theirs)
        assert len(got) == len(want) == 5
        for k, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"epoch {epoch} batch {k}")


def test_shuffled_order_follows_torch_manual_seed():
    torch = need_torch()
    torch.manual_seed(11)
    ours = [b["label"].tolist() for b in longshore.DataLoader(
        Nested(), batch_size=4, shuffle=True, num_workers=2, worker_mode="thread")]
    torch.manual_seed(11)
    theirs = [b["label"].tolist() for b in torch.utils.data.DataLoader(
        Nested(), batch_size=4, shuffle=True, num_workers=2)]
    assert ours == theirs


class WhoLoadsThreads:
    """Each sample names the worker (longshore's and torch's info) and the thread loading it."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        info = longshore.get_worker_info()
        tinfo = None
        if "torch" in sys.modules:
            import torch

            tinfo = torch.utils.data.get_worker_info()
        return np.array([i, info.id, info.num_workers, info.seed % 1000,
                         -1 if tinfo is None else tinfo.id, threading.get_ident() % 2**31,
                         os.getpid()], dtype=np.int64)


def test_worker_info_and_worker_init_fn_per_thread():
    inits = []

    def init(worker_id):
        info = longshore.get_worker_info()
        inits.append((worker_id, info.id, info.num_workers, threading.get_ident()))

    dl = longshore.DataLoader(WhoLoadsThreads(), batch_size=2, num_workers=3, seed=5,
                              framework="numpy", worker_mode="thread", worker_init_fn=init)
    rows = np.concatenate(list(dl))
    assert rows[:, 0].tolist() == list(range(24))
    assert set(rows[:, 1].tolist()) == {0, 1, 2}
    assert (rows[:, 2] == 3).all()
    assert (rows[:, 6] == os.getpid()).all()  # threads of this process
    # Each worker's samples come from one thread (the loader's thread of that worker), and
    # its seed is the base seed plus its id, as a process's.
    for w in range(3):
        mine = rows[rows[:, 1] == w]
        assert len(set(mine[:, 5].tolist())) == 1, mine
        assert len(set(mine[:, 3].tolist())) == 1
    seeds = {w: int(rows[rows[:, 1] == w][0, 3]) for w in range(3)}
    assert (seeds[1] - seeds[0]) % 1000 == 1 and (seeds[2] - seeds[0]) % 1000 == 2, seeds
    if "torch" in sys.modules:
        assert (rows[:, 4] == rows[:, 1]).all(), rows  # torch's get_worker_info agrees
        import torch

        assert torch.utils.data.get_worker_info() is None  # restored when the epoch ends
    assert [(a, b, c) for a, b, c, _ in inits] == [(0, 0, 3), (1, 1, 3), (2, 2, 3)]
    assert longshore.get_worker_info() is None  # the main thread


def test_an_exception_names_the_worker_thread_and_sample():
    dl = longshore.DataLoader(Failing({9}), batch_size=4, num_workers=2, framework="numpy",
                              worker_mode="thread")
    with pytest.raises(KeyError) as e:
        list(dl)
    msg = str(e.value)
    assert "Caught KeyError in DataLoader worker thread" in msg, msg
    assert "no sample 9" in msg and "sample 9" in msg, msg
    skipped = longshore.DataLoader(Failing({9}), batch_size=4, num_workers=2,
                                   framework="numpy", worker_mode="thread",
                                   on_sample_error="skip")
    got = np.concatenate(list(skipped)).ravel().tolist()
    assert got == [i for i in range(20) if i != 9]


@pytest.mark.parametrize("num_workers", [1, 3])
def test_iterable_datasets_shard_by_worker_as_torch(num_workers):
    torch = need_torch()
    want = [b["id"].tolist() for b in torch.utils.data.DataLoader(
        torch_stream(23), batch_size=4, num_workers=num_workers)]
    for ds in (Stream(23), torch_stream(23)):
        dl = longshore.DataLoader(ds, batch_size=4, num_workers=num_workers,
                                  worker_mode="thread", persistent_workers=True)
        for epoch in range(2):
            assert [b["id"].tolist() for b in dl] == want, (type(ds), epoch)


class Rows:
    def __len__(self):
        return 64 * 20

    def __getitem__(self, i):
        return np.full(1024, i, dtype=np.float32)


def test_thread_batches_are_written_into_the_shared_pool_within_its_budget():
    block = 64 * 1024 * 4  # a batch: 64 samples of 1024 f32
    pool = longshore.PinnedPool(budget=3 * block, shared=True, pinned=False)
    dl = longshore.DataLoader(Rows(), batch_size=64, num_workers=4, prefetch_factor=8,
                              framework="numpy", pool=pool, worker_mode="thread")
    total, handlers = 0, None
    for b in dl:
        handlers = handlers or list(dl._python.workers.procs)
        assert (b[:, 0] == np.arange(total, total + 64)).all()
        total += 64
    assert total == 64 * 20
    s = pool.stats()
    assert 0 < s["peak_bytes_held"] <= 3 * block, s
    # The threads' handlers mapped the shared blocks (one copy), they did not hand bytes back.
    assert any(h.maps for h in handlers), "batches were not written in place"
    assert dl._python.workers.procs == []  # the epoch's threads ended with it


def test_refusals():
    with pytest.raises(ValueError, match="worker_mode must be 'process' or 'thread'"):
        longshore.DataLoader(Nested(), worker_mode="threads")
    with pytest.raises(ValueError, match="multiprocessing_context .* must stay None"):
        longshore.DataLoader(Nested(), num_workers=2, worker_mode="thread",
                             multiprocessing_context="spawn")
    with pytest.raises(ValueError, match="longshore's own datasets load in Rust threads"):
        longshore.DataLoader(longshore.data.ArrayDataset(np.zeros((4, 2), np.float32)),
                             worker_mode="process")


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_exit_with_a_running_loader_is_clean(tmp_path, mode):
    """The interpreter exits while a loader's threads still work (an iterator never closed,
    worker processes ended by multiprocessing at exit): no abort, exit code 0."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import time
        import numpy as np
        import longshore

        class Slow:
            def __len__(self):
                return 100000

            def __getitem__(self, i):
                time.sleep(0.001)
                return np.full(8, i, dtype=np.float32)

        if __name__ == "__main__":
            dl = longshore.DataLoader(Slow(), batch_size=4, num_workers=3, framework="numpy",
                                      worker_mode={mode!r})
            it = iter(dl)
            next(it)
            print("ok", flush=True)
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for _ in range(4):
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=120, env=env)
        assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])
        assert "Fatal Python error" not in r.stderr, r.stderr[-2000:]
