"""Python datasets (any object with __getitem__ and __len__) in worker processes: batches equal
to PyTorch's DataLoader's (values, dtypes, nesting) with fork, spawn and forkserver and with
num_workers=0 in this process; collate_fn and worker_init_fn run in the workers as in torch;
get_worker_info; an exception in __getitem__ re-raised as its own type with the worker's
traceback and the sample index, or skipped; a worker that dies is an error naming it, its pid
and how it ended, within the timeout; batches written into the shared pool (one copy), never
above its budget; the dataset seen as it is at each epoch's start without persistent workers."""
import collections
import multiprocessing
import os
import signal

import numpy as np
import pytest

import longshore
from conftest import need_torch

Point = collections.namedtuple("Point", ["x", "y"])


class Nested:
    """Samples of every kind default_collate takes."""

    def __init__(self, n=23):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        return {
            "image": torch.arange(12, dtype=torch.float32).reshape(3, 4) + i,
            "label": i,
            "weight": 0.5 * i,
            "flag": i % 2 == 0,
            "name": f"sample-{i}",
            "array": np.full((2, 2), i, dtype=np.int16),
            "scalar": np.float32(i) / 4,
            "half": torch.full((2,), float(i), dtype=torch.bfloat16),
            "pair": (i, torch.tensor([i, -i])),
            "point": Point(x=i, y=float(i)),
            "list": [np.uint8(i), "x"],
        }


def assert_same(a, b, where="batch"):
    import torch

    assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f"{where}: {a.dtype} vs {b.dtype}"
        assert a.shape == b.shape, f"{where}: {a.shape} vs {b.shape}"
        assert torch.equal(a, b), f"{where}: {a} vs {b}"
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (u, v) in enumerate(zip(a, b)):
            assert_same(u, v, f"{where}[{k}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def contexts():
    return [None] + [m for m in ("fork", "spawn", "forkserver")
                     if m in multiprocessing.get_all_start_methods()]


@pytest.mark.parametrize("num_workers,context", [(0, None)] + [(2, c) for c in contexts()[1:]])
def test_batches_equal_torch_default_collate(num_workers, context):
    torch = need_torch()
    ours = longshore.DataLoader(Nested(), batch_size=5, num_workers=num_workers,
                                multiprocessing_context=context)
    theirs = torch.utils.data.DataLoader(Nested(), batch_size=5)
    for epoch in range(2):
        got, want = list(ours), list(theirs)
        assert len(got) == len(want) == 5
        for k, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"epoch {epoch} batch {k}")


def test_shuffled_order_follows_torch_manual_seed():
    torch = need_torch()
    torch.manual_seed(7)
    ours = [b["label"].tolist() for b in
            longshore.DataLoader(Nested(), batch_size=4, shuffle=True, num_workers=2)]
    torch.manual_seed(7)
    theirs = [b["label"].tolist() for b in
              torch.utils.data.DataLoader(Nested(), batch_size=4, shuffle=True, num_workers=2)]
    assert ours == theirs


def pairs(samples):
    """A collate_fn: the sum of the samples' labels and their names, joined."""
    import torch

    return {"sum": torch.tensor([sum(s["label"] for s in samples)]),
            "names": "+".join(s["name"] for s in samples),
            "pid": os.getpid()}


def test_collate_fn_runs_in_the_workers():
    torch = need_torch()
    got = list(longshore.DataLoader(Nested(10), batch_size=3, num_workers=2, collate_fn=pairs))
    want = list(torch.utils.data.DataLoader(Nested(10), batch_size=3, collate_fn=pairs))
    assert [b["sum"].tolist() for b in got] == [b["sum"].tolist() for b in want]
    assert [b["names"] for b in got] == [b["names"] for b in want]
    assert all(b["pid"] != os.getpid() for b in got)
    # torch's own default_collate is longshore's default (fused into the batch buffer).
    fused = list(longshore.DataLoader(Nested(10), batch_size=3, num_workers=2,
                                      collate_fn=torch.utils.data.default_collate))
    for a, b in zip(fused, torch.utils.data.DataLoader(Nested(10), batch_size=3)):
        assert_same(a, b)


class WhoLoads:
    """Each sample says which worker loaded it and what worker_init_fn set there."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        info = longshore.get_worker_info()
        return np.array([i, info.id, info.num_workers, int(os.environ.get("LS_INIT", "-1"))])


def init_worker(worker_id):
    os.environ["LS_INIT"] = str(100 + worker_id)


@pytest.mark.parametrize("context", contexts()[1:])
def test_worker_info_and_worker_init_fn(context):
    dl = longshore.DataLoader(WhoLoads(), batch_size=2, num_workers=3, framework="numpy",
                              worker_init_fn=init_worker, multiprocessing_context=context)
    rows = np.concatenate(list(dl))
    assert rows[:, 0].tolist() == list(range(12))
    assert set(rows[:, 1].tolist()) == {0, 1, 2}
    assert (rows[:, 2] == 3).all()
    assert (rows[:, 3] == 100 + rows[:, 1]).all(), rows
    assert longshore.get_worker_info() is None  # the main process


class Failing:
    def __init__(self, bad, exc=KeyError):
        self.bad, self.exc = bad, exc

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i in self.bad:
            raise self.exc(f"no sample {i}")
        return np.array([i], dtype=np.int64)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_exception_is_reraised_as_its_type_with_the_traceback(num_workers):
    dl = longshore.DataLoader(Failing({7}), batch_size=4, num_workers=num_workers,
                              framework="numpy")
    with pytest.raises(KeyError) as e:
        list(dl)
    msg = str(e.value)
    where = "DataLoader worker process" if num_workers else "the main process"
    assert f"Caught KeyError in {where}" in msg, msg
    assert "Original Traceback" in msg and "no sample 7" in msg and "__getitem__" in msg, msg
    assert "sample 7" in msg, msg


def test_a_failing_sample_is_skipped_under_on_sample_error_skip():
    dl = longshore.DataLoader(Failing({3, 11}, ValueError), batch_size=4, num_workers=2,
                              framework="numpy", on_sample_error="skip")
    seen = np.concatenate(list(dl)).ravel().tolist()
    assert seen == [i for i in range(20) if i not in (3, 11)]


class Dying:
    def __init__(self, at, how):
        self.at, self.how = at, how

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == self.at:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        return np.array([i])


@pytest.mark.parametrize("how,expect", [("kill", "killed by signal 9 (SIGKILL)"),
                                        ("exit", "exited with code 3")])
def test_a_dead_worker_is_an_error_naming_it(how, expect):
    dl = longshore.DataLoader(Dying(13, how), batch_size=4, num_workers=2, framework="numpy",
                              timeout=20)
    with pytest.raises(longshore.LoaderError) as e:
        list(dl)
    msg = str(e.value)
    assert "DataLoader worker" in msg and "pid" in msg and expect in msg, msg
    assert "12, 13, 14, 15" in msg, msg
    # The next epoch starts new workers; the failure repeats where the sample is.
    with pytest.raises(longshore.LoaderError):
        list(dl)


def test_batches_are_written_into_the_shared_pool_within_its_budget():
    block = 64 * 1024 * 4  # a batch: 64 samples of 1024 f32
    pool = longshore.PinnedPool(budget=3 * block, shared=True, pinned=False)

    class Rows:
        def __len__(self):
            return 64 * 20

        def __getitem__(self, i):
            return np.full(1024, i, dtype=np.float32)

    dl = longshore.DataLoader(Rows(), batch_size=64, num_workers=4, prefetch_factor=8,
                              framework="numpy", pool=pool)
    total = 0
    for b in dl:
        assert (b[:, 0] == np.arange(total, total + 64)).all()
        total += 64
    assert total == 64 * 20
    s = pool.stats()
    assert 0 < s["peak_bytes_held"] <= 3 * block, s
    # num_workers=0: the handler in this process maps the blocks it writes (the shared path).
    dl0 = longshore.DataLoader(Rows(), batch_size=64, framework="numpy")
    assert sum(len(b) for b in dl0) == 64 * 20
    assert dl0._python.handler.maps, "batches were piped, not written into shared blocks"


class Curriculum:
    """Samples depend on an epoch set in the main process."""

    def __init__(self):
        self.epoch = 0

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.array([self.epoch])


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_see_the_dataset_as_it_is_when_the_epoch_starts(persistent):
    ds = Curriculum()
    dl = longshore.DataLoader(ds, batch_size=2, num_workers=2, framework="numpy",
                              persistent_workers=persistent)
    assert {int(v) for b in dl for v in b.ravel()} == {0}
    ds.epoch = 1
    seen = {int(v) for b in dl for v in b.ravel()}
    # Like PyTorch: new workers each epoch see the change; persistent ones keep their copy.
    assert seen == ({0} if persistent else {1})


def test_resume_after_k_batches_yields_exactly_the_rest():
    def make():
        return longshore.DataLoader(WhoLoads(), batch_size=2, num_workers=2, shuffle=True,
                                    seed=3, framework="numpy")

    whole = [b[:, 0].tolist() for b in make()]
    dl = make()
    it = iter(dl)
    head = [next(it)[:, 0].tolist() for _ in range(2)]
    state = dl.state_dict()
    del it
    fresh = make()
    fresh.load_state_dict(state)
    rest = [b[:, 0].tolist() for b in fresh]
    assert head + rest == whole


class Stream:
    """An iterable dataset sharded by worker, as PyTorch's documentation shows."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = longshore.get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter({"id": i, "x": np.array([i, 2 * i], dtype=np.int32)}
                    for i in range(w, self.n, k))




def torch_stream(n):
    import torch

    class S(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            w, k = (info.id, info.num_workers) if info is not None else (0, 1)
            return iter({"id": i, "x": np.array([i, 2 * i], dtype=np.int32)}
                        for i in range(w, n, k))
    return S()


@pytest.mark.parametrize("num_workers", [0, 1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_datasets_shard_and_batch_as_torch(num_workers, drop_last):
    torch = need_torch()
    want = [b["id"].tolist() for b in torch.utils.data.DataLoader(
        torch_stream(23), batch_size=4, num_workers=num_workers, drop_last=drop_last)]
    dl = longshore.DataLoader(Stream(23), batch_size=4, num_workers=num_workers,
                              drop_last=drop_last, persistent_workers=num_workers > 0)
    for epoch in range(2):
        got = [b["id"].tolist() for b in dl]
        assert got == want, f"epoch {epoch}"
    # A torch IterableDataset (which has __getitem__) is iterable too.
    got = [b["id"].tolist() for b in longshore.DataLoader(
        torch_stream(23), batch_size=4, num_workers=num_workers, drop_last=drop_last)]
    assert got == want


def test_iterable_datasets_refuse_samplers_as_torch():
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        longshore.DataLoader(Stream(4), batch_size=2, shuffle=True)
    with pytest.raises(TypeError, match="map-style dataset"):
        longshore.DataLoader(42, batch_size=2)


class Ragged:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return np.zeros(i + 1)


def test_samples_that_cannot_be_stacked_fail_as_in_torch():
    dl = longshore.DataLoader(Ragged(), batch_size=2, framework="numpy")
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        list(dl)


def test_batches_arrive_on_the_gpu_from_pinned_shared_blocks():
    from conftest import need_cuda

    torch = need_cuda()
    want = list(longshore.DataLoader(Nested(), batch_size=5, num_workers=2))
    pool = longshore.PinnedPool(shared=True)
    dl = longshore.DataLoader(Nested(), batch_size=5, num_workers=2, device="cuda", pool=pool)
    for epoch in range(2):
        got = list(dl)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a["image"].is_cuda and a["label"].is_cuda
            assert_same({k: v.cpu() if hasattr(v, "cpu") else v for k, v in a.items()
                         if k not in ("pair", "point", "list")},
                        {k: v for k, v in b.items() if k not in ("pair", "point", "list")})
            assert a["pair"][1].is_cuda and torch.equal(a["pair"][1].cpu(), b["pair"][1])
    assert pool.stats()["blocks_in_use"] + pool.stats()["blocks_cached"] > 0


def test_forkserver_preloads_what_the_workers_import(tmp_path):
    """With forkserver, the fork server imports torch, NumPy and the worker module once, so
    that workers fork with them loaded (Python 3.11-3.12 skip the default __main__ preload)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no forkserver start method here")
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""
        import sys
        from multiprocessing import forkserver
        import numpy as np
        import longshore

        class Rows:
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return np.array([i, len(sys.modules)])

        if __name__ == "__main__":
            dl = longshore.DataLoader(Rows(), batch_size=4, num_workers=2, framework="numpy",
                                      multiprocessing_context="forkserver")
            assert [b[:, 0].tolist() for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7]]
            print(",".join(forkserver._forkserver._preload_modules))
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    preload = r.stdout.strip().split(",")
    assert "numpy" in preload and "longshore._workers" in preload, preload
    import importlib.util

    # longshore imports torch where it is installed, so the workers would import it too.
    assert ("torch" in preload) == (importlib.util.find_spec("torch") is not None), preload
