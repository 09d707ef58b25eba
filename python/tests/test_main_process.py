"""``num_workers=0`` keeps PyTorch's main-process contract: each batch is loaded when the loop
asks for it, never ahead, so a Python dataset's draws from the global generators (torch's,
NumPy's, Python's) fall between the training loop's own exactly where PyTorch's loader puts
them, and a seeded run is the same run with either loader. A map-style dataset runs on the
thread that iterates the loader (its grad mode and thread-locals); a ``KeyboardInterrupt``
raised in the dataset's code arrives as itself, under every sample-error policy, and the
epoch goes on, as torch's does.

Checked in this process and in a fresh interpreter (no warm thread pools or caches).
"""
import threading
import warnings

import numpy as np
import pytest

import longshore
from conftest import need_torch, run_fresh

# The scenario, shared by the in-process test and the fresh interpreter's.
SCENARIO = r'''
import random
import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

class Draws(Dataset):
    """Each sample draws from torch's, NumPy's and Python's global generators."""
    def __len__(self):
        return 24
    def __getitem__(self, i):
        return {"t": torch.rand(3), "n": float(np.random.rand()), "r": random.random(), "i": i}

class Stream(IterableDataset):
    def __iter__(self):
        for i in range(17):
            yield torch.rand(2), random.random(), float(np.random.rand())

CASES = {
    "map": (Draws, dict(batch_size=4)),
    "map shuffled": (Draws, dict(batch_size=5, shuffle=True)),
    "map pinned, shuffled, drop_last": (Draws, dict(batch_size=5, shuffle=True, pin_memory=True,
                                                   drop_last=True)),
    "map unbatched": (Draws, dict(batch_size=None, shuffle=True)),
    "map, a sampler drawing from torch": (Draws, dict(
        batch_size=3, sampler=torch.utils.data.RandomSampler(range(24), num_samples=10))),
    "iterable": (Stream, dict(batch_size=4)),
    "iterable, drop_last": (Stream, dict(batch_size=5, drop_last=True)),
}

def run(DataLoader, case, epochs=2):
    """What a training loop sees: each batch, then the loop's own draws from each generator."""
    make, kw = CASES[case]
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    loader = DataLoader(make(), **kw)
    out = []
    for _ in range(epochs):
        for batch in loader:
            out.append(repr(batch))
            out.append(repr((torch.rand(1), np.random.rand(), random.random())))
    return out
'''


def _cases():
    scope = {}
    exec(SCENARIO, scope)
    return scope


@pytest.mark.parametrize("case", [
    "map", "map shuffled", "map pinned, shuffled, drop_last", "map unbatched",
    "map, a sampler drawing from torch", "iterable", "iterable, drop_last",
])
def test_num_workers_0_draws_where_torchs_loader_draws(case):
    torch = need_torch()
    scope = _cases()
    with warnings.catch_warnings():
        # torch's pin_memory warning without an accelerator: not what this test looks at.
        warnings.simplefilter("ignore")
        expected = scope["run"](torch.utils.data.DataLoader, case)
    got = scope["run"](longshore.DataLoader, case)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"{case}: item {i} differs\nlongshore: {g}\ntorch:     {e}"


def test_num_workers_0_draws_where_torchs_loader_draws_in_a_fresh_interpreter(tmp_path):
    need_torch()
    snippet = SCENARIO + r'''
import longshore
for case in CASES:
    same = run(longshore.DataLoader, case) == run(torch.utils.data.DataLoader, case)
    print(case, "same" if same else "DIFFERENT")
'''
    out = run_fresh(snippet, tmp_path)
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == len(_cases()["CASES"]), out
    assert all(line.endswith(" same") for line in lines), out


class Counting:
    """A map-style dataset that counts its loads."""

    def __init__(self, n=20):
        self.n = n
        self.loads = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.loads += 1
        return np.float32(i)


class CountingStream:
    def __init__(self, n=20):
        self.n = n
        self.loads = 0

    def __iter__(self):
        for i in range(self.n):
            self.loads += 1
            yield np.float32(i)


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_num_workers_0_loads_nothing_ahead(kind):
    torch = need_torch()
    if kind == "map":
        ds = Counting()
    else:
        class Stream(CountingStream, torch.utils.data.IterableDataset):
            pass
        ds = Stream()
    loader = longshore.DataLoader(ds, batch_size=3)
    for epoch in range(2):
        start = ds.loads
        it = iter(loader)
        assert ds.loads == start
        for k in range(1, 5):
            next(it)
            # However long the loop takes over a batch, the loader has not run ahead.
            threading.Event().wait(0.05)
            assert ds.loads - start == 3 * k, (epoch, k)
        rest = list(it)
        assert [b.tolist() for b in rest] == [[12.0, 13.0, 14.0], [15.0, 16.0, 17.0],
                                              [18.0, 19.0]]


def test_a_map_style_dataset_runs_on_the_loops_thread_with_its_state():
    torch = need_torch()
    local = threading.local()

    class Sees(torch.utils.data.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {
                "main": threading.current_thread() is threading.main_thread(),
                "grad": torch.is_grad_enabled(),
                "local": getattr(local, "value", None),
            }

    local.value = 7
    for mod in (torch.utils.data, longshore):
        with torch.no_grad():
            batches = list(mod.DataLoader(Sees(), batch_size=3))
        assert [b["main"].tolist() for b in batches] == [[True] * 3] * 2, mod.__name__
        assert [b["grad"].tolist() for b in batches] == [[False] * 3] * 2, mod.__name__
        assert [b["local"].tolist() for b in batches] == [[7] * 3] * 2, mod.__name__


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_a_keyboard_interrupt_in_the_dataset_arrives_as_itself(policy):
    torch = need_torch()

    class Interrupts:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            if i == 4:
                raise KeyboardInterrupt
            return np.int64(i)

    def run(DataLoader, **kw):
        it = iter(DataLoader(Interrupts(), batch_size=2, **kw))
        got = []
        while True:
            try:
                got.append(next(it).tolist())
            except KeyboardInterrupt:
                got.append("interrupted")
            except StopIteration:
                return got

    # Never skipped; the interrupted batch is lost and the epoch goes on, as torch's does.
    expected = run(torch.utils.data.DataLoader)
    assert expected == [[0, 1], [2, 3], "interrupted", [6, 7], [8, 9]]
    loader = longshore.DataLoader(Interrupts(), batch_size=2, on_sample_error=policy)
    assert run(lambda ds, **kw: loader) == expected
    assert loader.stats["skipped_samples"] == 0


def test_ctrl_c_interrupts_the_wait_for_an_iterable_datasets_batch():
    torch = need_torch()
    import os
    import signal
    import time

    class Slow(torch.utils.data.IterableDataset):
        def __iter__(self):
            for i in range(4):
                time.sleep(0.6 if i == 2 else 0)
                yield np.int64(i)

    it = iter(longshore.DataLoader(Slow(), batch_size=2))
    assert next(it).tolist() == [0, 1]
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            next(it)
        # Interrupted while the batch is being made, not after it.
        assert time.monotonic() - t0 < 0.5
    finally:
        signal.signal(signal.SIGINT, old)
    # The batch being made was asked for once and comes with the next call: nothing lost,
    # nothing made twice.
    assert next(it).tolist() == [2, 3]
    assert list(it) == []
