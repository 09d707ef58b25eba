"""Device epochs without a GPU: the `cpu_backend` test hook of `_Loader` delivers batches
through longshore-transfer's Cpu backend (host memory, asynchronous copies, events), so the
device path of the epoch runs in CI. A small batch's copy is enqueued by `__next__`, a large
one's (over 4 MiB) by the epoch thread ahead of Python (upload.rs); LONGSHORE_UPLOAD_IN_PUMP=1
puts every copy on the epoch thread. Either way: the dataset's values in order, every pool
lease back once the arrays are gone, and a position that counts what Python received."""
import gc
import time

import numpy as np
import pytest

import longshore
from longshore import _longshore

SMALL_BATCH = 4 << 20


def options(batch_size, workers=2, shuffle=False):
    """The Rust loader's options as longshore.DataLoader passes them. Not persistent:
    persistent workers start the next epoch's first batches at the end of an epoch
    (prefetch_next_epoch), which hold leases."""
    return dict(batch_size=batch_size, shuffle=shuffle, num_workers=workers, pin_memory=False,
                drop_last=False, prefetch_factor=None, persistent_workers=False, timeout=0.0,
                seed=7, in_order=True, on_sample_error="raise", worker_priority="normal")


def native(ds, batch_size, workers=2, shuffle=False):
    return _longshore._Loader(ds, options(batch_size, workers, shuffle), cpu_backend=True)


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture
def wide(tmp_path):
    """f32 [1200, 1024] (4 KiB rows): a batch of 1100 rows is over SMALL_BATCH."""
    a = (np.arange(1200, dtype=np.float32)[:, None] * 1024
         + np.arange(1024, dtype=np.float32)[None, :])
    p = tmp_path / "wide.npy"
    np.save(p, a)
    return str(p), a


@pytest.mark.parametrize("in_pump", ["0", "1"])
def test_large_and_small_batches_reach_the_device_in_order(wide, monkeypatch, in_pump):
    monkeypatch.setenv("LONGSHORE_UPLOAD_IN_PUMP", in_pump)
    monkeypatch.setenv("LONGSHORE_EPOCH_TIMINGS", "1")
    path, a = wide
    dl = native(longshore.NpyDataset(path), 1100)
    assert 1100 * 4096 > SMALL_BATCH >= 100 * 4096
    it = dl.epoch(np.from_dlpack)
    got = [b.copy() for b in it]
    assert [b.shape for b in got] == [(1100, 1024), (100, 1024)]
    np.testing.assert_array_equal(np.concatenate(got), a)
    t = it._debug_timings()
    assert t["delivered"] == 2
    if in_pump == "1":
        assert t["upload_ns"] == 0  # the epoch thread copied both
    else:
        assert t["upload_ns"] > 0  # __next__ copied the small one
    del got, it
    gc.collect()
    assert wait_for(lambda: dl.stats()["pool"]["bytes_in_use"] == 0), dl.stats()["pool"]


@pytest.mark.parametrize("in_pump", ["0", "1"])
def test_closing_mid_epoch_returns_every_lease(wide, monkeypatch, in_pump):
    # Large batches, each waiting for room: closing the epoch with batches queued, collated and
    # being copied returns them all, and the loader is free for the next epoch.
    monkeypatch.setenv("LONGSHORE_UPLOAD_IN_PUMP", in_pump)
    path, _ = wide
    dl = native(longshore.NpyDataset(path), 200, workers=2)
    it = dl.epoch(np.from_dlpack)
    first = next(it).copy()
    assert first.shape == (200, 1024)
    it.close()
    del it
    gc.collect()
    assert wait_for(lambda: dl.stats()["pool"]["bytes_in_use"] == 0), dl.stats()["pool"]
    assert sum(b.shape[0] for b in dl.epoch(np.from_dlpack)) == 1200


@pytest.mark.parametrize("workers", [0, 3])
def test_small_batches_shuffled_match_the_host_path(files, workers):
    ds = longshore.NpyDataset([files["x"], files["y"]])
    on_device = [[f.copy() for f in b] for b in native(ds, 16, workers, True).epoch(np.from_dlpack)]
    host = _longshore._Loader(ds, options(16, workers, True))
    on_host = [[f.copy() for f in b] for b in host.epoch(np.from_dlpack)]
    assert len(on_device) == len(on_host) == 7
    for d, h in zip(on_device, on_host):
        np.testing.assert_array_equal(d[0], h[0])
        np.testing.assert_array_equal(d[1], h[1])
    np.testing.assert_array_equal(np.sort(np.concatenate([b[1] for b in on_device])),
                                  np.arange(100))


def test_the_position_counts_the_batches_python_received(files):
    dl = native(longshore.NpyDataset(files["y"]), 10)
    it = dl.epoch(np.from_dlpack)
    first = [next(it).copy() for _ in range(3)]
    # The epoch thread runs ahead; the position does not.
    assert wait_for(lambda: dl.stats()["batches"] > 3)
    state = __import__("json").loads(dl.state_dict_json())
    assert state["epoch"] == 0 and state["done_prefix"] == 3
    it.close()
    np.testing.assert_array_equal(np.concatenate(first), np.arange(30))


def test_cpu_backend_and_a_cuda_device_are_exclusive(files):
    with pytest.raises(ValueError, match="cpu_backend"):
        _longshore._Loader(longshore.NpyDataset(files["y"]), options(10, 0), device=0,
                           cpu_backend=True)
