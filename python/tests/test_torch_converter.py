"""The batch converter for torch (``longshore._TorchConverter``): a whole batch per Rust call,
handed to ``torch._C._from_dlpack`` as legacy DLPack capsules.

On the CPU (no torch) the converter is driven with NumPy standing in for torch's importer, so
capsules, ordering, errors and the pool accounting run in CI; the tests with torch compare it
with the per-tensor ``torch.utils.dlpack.from_dlpack`` path it replaces (which stays the
fallback), and on a GPU check the stream ordering.
"""
import ctypes
import gc
import time
import types

import numpy as np
import pytest

import longshore
from longshore import _longshore
from conftest import need_cuda, need_torch

_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _Producer:
    """A DLPack producer around one capsule, so that np.from_dlpack imports it."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def numpy_importer(names=None):
    """Imports a capsule with NumPy, as torch._C._from_dlpack would with torch; records the
    capsule's name in `names`."""

    def from_dlpack(capsule):
        if names is not None:
            names.append(
                "dltensor" if _is_valid(capsule, b"dltensor") else
                "dltensor_versioned" if _is_valid(capsule, b"dltensor_versioned") else "other"
            )
        return np.from_dlpack(_Producer(capsule))

    return from_dlpack


def wait_until(cond, seconds=5.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        gc.collect()
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_converter_yields_what_the_per_tensor_path_yields(files):
    ds = longshore.NpyDataset([files["x"], files["y"]])
    names = []
    ours = longshore.DataLoader(ds, batch_size=16, shuffle=True, seed=3, num_workers=2, framework="numpy")
    ref = longshore.DataLoader(ds, batch_size=16, shuffle=True, seed=3, num_workers=2, framework="numpy")
    ours._convert = _longshore._TorchConverter(numpy_importer(names))
    n = 0
    for got, want in zip(ours, ref):
        assert isinstance(got, list) and len(got) == 2
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
        n += 1
    assert n == len(ref) == 7
    # One legacy capsule per tensor: what every torch's _from_dlpack imports.
    assert names == ["dltensor"] * 14
    # One-file datasets yield the tensor itself, as the per-tensor path does.
    single = longshore.DataLoader(longshore.NpyDataset(files["x"]), batch_size=40, framework="numpy")
    single._convert = _longshore._TorchConverter(numpy_importer())
    got = list(single)
    assert all(isinstance(b, np.ndarray) for b in got)
    np.testing.assert_array_equal(np.concatenate(got), files["arrays"]["x"])


def test_lease_returns_when_every_converted_tensor_is_freed(files):
    pool = longshore.PinnedPool(pinned=False)
    dl = longshore.DataLoader(
        longshore.NpyDataset([files["x"], files["y"]]), batch_size=10, framework="numpy", pool=pool
    )
    dl._convert = _longshore._TorchConverter(numpy_importer())
    held = list(dl)
    assert pool.stats()["blocks_in_use"] == 10
    xs = [x for x, _ in held]
    del held
    gc.collect()
    # The labels are freed, the features still hold every batch.
    assert pool.stats()["blocks_in_use"] == 10
    np.testing.assert_array_equal(np.concatenate(xs), files["arrays"]["x"])
    del xs
    assert wait_until(lambda: pool.stats()["bytes_in_use"] == 0), pool.stats()


def test_an_import_that_fails_raises_and_returns_the_batch(files):
    pool = longshore.PinnedPool(pinned=False)
    dl = longshore.DataLoader(
        longshore.NpyDataset([files["x"], files["y"]]), batch_size=10, framework="numpy", pool=pool
    )
    calls = []

    def refuse_first_labels(capsule):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("no labels today")
        return numpy_importer()(capsule)

    it = iter(dl._loader.epoch(_longshore._TorchConverter(refuse_first_labels)))
    with pytest.raises(ValueError, match="no labels today"):
        next(it)
    # The features converted before the failure were dropped, the labels' capsule destroyed:
    # the batch went back (only the epoch thread's 8 ready batches hold a block: epoch.rs
    # AHEAD_SMALL); the next batch comes as usual.
    assert wait_until(lambda: dl.stats["batches"] == 1 + 8), dl.stats
    assert wait_until(lambda: pool.stats()["blocks_in_use"] == 8), pool.stats()
    x, y = next(it)
    np.testing.assert_array_equal(y, np.arange(10, 20))
    del it, x, y
    assert wait_until(lambda: pool.stats()["bytes_in_use"] == 0), pool.stats()


def test_capsules_a_consumer_drops_free_their_memory(files):
    pool = longshore.PinnedPool(pinned=False)
    dl = longshore.DataLoader(
        longshore.NpyDataset([files["x"], files["y"]]), batch_size=10, framework="numpy", pool=pool
    )
    seen = []
    batches = list(dl._loader.epoch(_longshore._TorchConverter(seen.append)))
    assert len(batches) == 10 and len(seen) == 20
    assert pool.stats()["blocks_in_use"] == 10
    del seen
    assert wait_until(lambda: pool.stats()["bytes_in_use"] == 0), pool.stats()


def test_resume_mid_epoch_through_the_converter(files):
    ds = longshore.NpyDataset(files["y"])
    dl = longshore.DataLoader(ds, batch_size=10, shuffle=True, seed=5, framework="numpy")
    dl._convert = _longshore._TorchConverter(numpy_importer())
    it = iter(dl)
    first = [next(it) for _ in range(3)]
    state = dl.state_dict()
    it.close()
    again = longshore.DataLoader(ds, batch_size=10, shuffle=True, seed=5, framework="numpy")
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == 7
    got = np.concatenate(first + rest)
    assert sorted(got.tolist()) == list(range(100))


def test_pinned_conversion_needs_torch_streams():
    with pytest.raises(ValueError, match="raw_stream and current_device"):
        _longshore._TorchConverter(np.asarray, pinned=True)
    c = _longshore._TorchConverter(np.asarray, raw_stream=int, current_device=int, pinned=True)
    assert c.pinned


def test_old_torch_without_the_internals_falls_back():
    def f(*args):
        return None

    inits = []
    full = types.SimpleNamespace(
        _C=types.SimpleNamespace(_from_dlpack=f, _cuda_getCurrentRawStream=f, _cuda_getDevice=f),
        cuda=types.SimpleNamespace(init=lambda: inits.append(1)),
    )
    assert isinstance(longshore._loader._torch_converter(full, cuda=True, pinned=False), _longshore._TorchConverter)
    assert inits == [1]  # torch's CUDA set-up, as the per-tensor path's current_stream() runs it
    # Pinned CPU batches leave it to the first iteration (a process may fork after building
    # the loader, as with the per-tensor path).
    assert isinstance(longshore._loader._torch_converter(full, cuda=True, pinned=True), _longshore._TorchConverter)
    assert inits == [1]
    no_streams = types.SimpleNamespace(_C=types.SimpleNamespace(_from_dlpack=f))
    assert isinstance(longshore._loader._torch_converter(no_streams, cuda=False, pinned=False),
                      _longshore._TorchConverter)
    # CUDA batches need the stream functions: without them, the per-tensor path.
    assert longshore._loader._torch_converter(no_streams, cuda=True, pinned=False) is None
    assert longshore._loader._torch_converter(types.SimpleNamespace(), cuda=False, pinned=False) is None


# --- with torch ------------------------------------------------------------------------------


def assert_same_batches(torch, fast, slow):
    n = 0
    for a, b in zip(fast, slow):
        assert type(a) is type(b)
        a = a if isinstance(a, list) else [a]
        b = b if isinstance(b, list) else [b]
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert isinstance(x, torch.Tensor)
            assert x.dtype == y.dtype and x.shape == y.shape and x.device == y.device
            assert x.is_pinned() == y.is_pinned()
            assert torch.equal(x, y)
        n += 1
    return n


def loaders(files, **kw):
    ds = longshore.NpyDataset([files["x"], files["y"]])
    fast = longshore.DataLoader(ds, batch_size=16, shuffle=True, seed=1, num_workers=2, **kw)
    slow = longshore.DataLoader(ds, batch_size=16, shuffle=True, seed=1, num_workers=2, **kw)
    slow._convert = slow._converter("torch", fast=False)
    assert not isinstance(slow._convert, _longshore._TorchConverter)
    return fast, slow


def test_torch_cpu_batches_equal_the_per_tensor_path(files):
    torch = need_torch()
    fast, slow = loaders(files)
    assert isinstance(fast._convert, _longshore._TorchConverter)
    assert assert_same_batches(torch, fast, slow) == len(slow)
    single = longshore.DataLoader(longshore.NpyDataset(files["x"]), batch_size=30)
    got = list(single)
    assert all(isinstance(b, torch.Tensor) for b in got)
    assert torch.equal(torch.cat(got), torch.from_numpy(files["arrays"]["x"]))


def test_torch_cuda_batches_equal_the_per_tensor_path(files):
    torch = need_cuda()
    fast, slow = loaders(files, device="cuda")
    assert isinstance(fast._convert, _longshore._TorchConverter)
    assert assert_same_batches(torch, fast, slow) == len(slow)
    fast, slow = loaders(files, pin_memory=True)
    assert fast._convert.pinned
    assert assert_same_batches(torch, fast, slow) == len(slow)


def test_torch_cuda_batches_are_ordered_on_the_current_stream(files):
    torch = need_cuda()
    want = torch.from_numpy(files["arrays"]["x"]).cuda()
    for fast in (True, False):
        dl = longshore.DataLoader(longshore.NpyDataset(files["x"]), batch_size=25, num_workers=2,
                                  device="cuda")
        dl._convert = dl._converter("torch", fast=fast)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            got = []
            for x in dl:
                # The side stream is busy when the next batch arrives: the wait for its copy
                # is enqueued behind that work, and the clone reads after both.
                torch.cuda._sleep(1_000_000)
                got.append(x.clone())
        side.synchronize()
        assert torch.equal(torch.cat(got), want), f"fast={fast}"


def test_torch_waits_for_a_copy_still_queued_on_another_stream():
    """The copy of the tensor is enqueued behind a long sleep on another stream, so it has not
    run when torch reads: a consumer not ordered after it reads the zeros the memory held
    before. Both conversions (the batch converter and the per-tensor `__dlpack__` path) must
    make torch's current stream wait for it."""
    torch = need_cuda()
    payload = bytes(range(1, 256)) * 4096
    want = torch.frombuffer(bytearray(payload), dtype=torch.uint8).cuda()
    convert = longshore._loader._torch_converter(torch, cuda=True, pinned=False)
    assert isinstance(convert, _longshore._TorchConverter)
    for fast in (True, False):
        copy = torch.cuda.Stream()
        with torch.cuda.stream(copy):
            torch.cuda._sleep(1_000_000_000)  # several hundred ms of the copy stream
        t = _longshore._cuda_bytes_copied_on(0, copy.cuda_stream, payload)
        consumer = torch.cuda.Stream()
        with torch.cuda.stream(consumer):
            x = convert.convert([t], 0)[0] if fast else torch.from_dlpack(t)
            got = x.clone()
        consumer.synchronize()
        assert got.shape == want.shape
        assert torch.equal(got, want), f"fast={fast}: read before the copy ({int(got.sum())})"
    # The control: with no ordering (DLPack's stream=-1), the same read sees the zeros, so the
    # assertions above can fail.
    copy = torch.cuda.Stream()
    with torch.cuda.stream(copy):
        torch.cuda._sleep(1_000_000_000)
    t = _longshore._cuda_bytes_copied_on(0, copy.cuda_stream, payload)
    consumer = torch.cuda.Stream()
    with torch.cuda.stream(consumer):
        got = torch._C._from_dlpack(t.__dlpack__(stream=-1)).clone()
    consumer.synchronize()
    copy.synchronize()
    assert not torch.equal(got, want) and int(got.sum()) == 0, "the copy ran before the read"


def test_pinned_lease_waits_for_the_current_stream(files):
    torch = need_cuda()
    pool = longshore.PinnedPool(pinned=True)
    dl = longshore.DataLoader(longshore.NpyDataset([files["x"], files["y"]]), batch_size=10,
                              pin_memory=True, pool=pool)
    assert isinstance(dl._convert, _longshore._TorchConverter) and dl._convert.pinned
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        held = list(dl)
        # Hold the stream back (about a second), then copy from the batches behind it.
        torch.cuda._sleep(2_000_000_000)
        on_gpu = [x.cuda(non_blocking=True) for x, _ in held]
    del held
    gc.collect()
    # Every tensor is freed, but the stream has not run the copies yet: no lease went back.
    assert pool.stats()["blocks_in_use"] == 10, pool.stats()
    side.synchronize()
    assert wait_until(lambda: pool.stats()["bytes_in_use"] == 0), pool.stats()
    assert torch.equal(torch.cat(on_gpu).cpu(), torch.from_numpy(files["arrays"]["x"]))
