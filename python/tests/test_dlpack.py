"""The DLPack protocol of longshore.Tensor and the lifetimes of batch memory."""
import ctypes
import gc

import numpy as np
import pytest

import longshore


def raw_epoch(ds, **kw):
    """An epoch yielding lists of longshore.Tensor (no conversion)."""
    dl = longshore.DataLoader(ds, framework="numpy", **kw)
    return dl, dl._loader.epoch()


def capsule_name(cap):
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype = ctypes.c_char_p
    get.argtypes = [ctypes.py_object]
    return get(cap)


def test_tensor_protocol(files):
    _, ep = raw_epoch(longshore.NpyDataset([files["x"], files["y"]]), batch_size=4)
    x, y = next(ep)
    assert x.shape == [4, 5] and x.dtype == "float32"
    assert y.shape == [4] and y.dtype == "int64"
    assert x.__dlpack_device__() == (1, 0)  # pageable memory: kDLCPU
    cap = x.__dlpack__(max_version=(1, 0))
    assert capsule_name(cap) == b"dltensor_versioned"
    with pytest.raises(BufferError, match="already exported"):
        x.__dlpack__()
    legacy = y.__dlpack__()
    assert capsule_name(legacy) == b"dltensor"
    del cap, legacy  # unconsumed capsules run the deleter


def test_copy_and_other_devices_are_refused(files):
    _, ep = raw_epoch(longshore.NpyDataset(files["y"]), batch_size=4)
    (t,) = next(ep)
    with pytest.raises(BufferError, match="copy"):
        t.__dlpack__(max_version=(1, 0), copy=True)
    with pytest.raises(BufferError, match="device"):
        t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    # Refusals leave the tensor exportable.
    a = np.from_dlpack(t)
    np.testing.assert_array_equal(a, [0, 1, 2, 3])


def test_arrays_are_zero_copy_and_writable(files):
    _, ep = raw_epoch(longshore.NpyDataset(files["x"]), batch_size=8)
    (t,) = next(ep)
    a = np.from_dlpack(t)
    assert a.flags.writeable
    b = a.reshape(-1)
    b[0] = -1.0
    assert a[0, 0] == -1.0  # same memory


def test_batch_memory_returns_when_every_array_is_freed(files):
    pool = longshore.PinnedPool(pinned=False)
    dl = longshore.DataLoader(
        longshore.NpyDataset([files["x"], files["y"]]), batch_size=10, framework="numpy", pool=pool
    )
    held = list(dl)
    gc.collect()
    s = pool.stats()
    assert s["blocks_in_use"] == 10 and s["bytes_in_use"] > 0
    xs = [b[0] for b in held]
    del held
    gc.collect()
    # The label arrays are gone but the features still use every batch's block.
    assert pool.stats()["blocks_in_use"] == 10
    del xs
    gc.collect()
    s = pool.stats()
    assert s["bytes_in_use"] == 0 and s["blocks_in_use"] == 0
    assert s["blocks_cached"] >= 1
    # The next epoch reuses cached blocks instead of allocating.
    allocs = s["allocations"]
    for _ in dl:
        pass
    assert pool.stats()["allocations"] == allocs


def test_arrays_freed_on_another_thread(files):
    import threading

    pool = longshore.PinnedPool(pinned=False)
    dl = longshore.DataLoader(longshore.NpyDataset(files["y"]), batch_size=10, framework="numpy", pool=pool)
    box = [list(dl)]
    assert pool.stats()["blocks_in_use"] == 10

    def free():
        box.pop()
        gc.collect()

    th = threading.Thread(target=free)
    th.start()
    th.join()
    assert pool.stats()["bytes_in_use"] == 0
