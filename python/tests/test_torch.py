"""PyTorch: batches equal torch's own DataLoader's on the same files; on a GPU, tensors on the
device, a training step, and every pool lease back once the tensors are freed.

Skips without torch (CPU CI); the CUDA tests skip without a GPU, and everything here fails
instead of skipping under LONGSHORE_REQUIRE_CUDA=1.
"""
import gc
import time

import numpy as np
import pytest

import longshore
from conftest import need_cuda, need_torch

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def torch_datasets(torch, files):
    from torch.utils.data import Dataset

    class Tabular(Dataset):
        def __init__(self):
            self.x = np.load(files["x"], mmap_mode="r")
            self.y = np.load(files["y"], mmap_mode="r")

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return torch.from_numpy(np.array(self.x[i])), torch.tensor(int(self.y[i]))

    class Images(Dataset):
        def __init__(self):
            self.a = np.load(files["img"], mmap_mode="r")
            self.m = torch.tensor(MEAN).view(3, 1, 1)
            self.s = torch.tensor(STD).view(3, 1, 1)

        def __len__(self):
            return len(self.a)

        def __getitem__(self, i):
            x = torch.from_numpy(np.array(self.a[i])).float() / 255.0
            return (x - self.m) / self.s

    return Tabular(), Images()


def wait_until(cond, seconds=5.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        gc.collect()
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_cpu_tensors_equal_torch_dataloader(files):
    torch = need_torch()
    from torch.utils.data import DataLoader

    tab, img = torch_datasets(torch, files)
    ours = longshore.DataLoader(longshore.NpyDataset([files["x"], files["y"]]), batch_size=16, num_workers=2)
    theirs = DataLoader(tab, batch_size=16, shuffle=False)
    assert len(ours) == len(theirs)
    for (x, y), (tx, ty) in zip(ours, theirs):
        assert isinstance(x, torch.Tensor) and x.device.type == "cpu"
        assert x.dtype == tx.dtype and y.dtype == ty.dtype
        assert torch.equal(x, tx) and torch.equal(y, ty)
    ours = longshore.DataLoader(longshore.NpyDataset(files["img"], normalize=(MEAN, STD)), batch_size=5)
    theirs = DataLoader(img, batch_size=5)
    for x, tx in zip(ours, theirs):
        torch.testing.assert_close(x, tx, rtol=1e-5, atol=1e-5)


def test_cuda_batches_equal_torch_dataloader(files):
    torch = need_cuda()
    from torch.utils.data import DataLoader

    tab, img = torch_datasets(torch, files)
    ours = longshore.DataLoader(
        longshore.NpyDataset([files["x"], files["y"]]), batch_size=16, num_workers=2, device="cuda"
    )
    theirs = DataLoader(tab, batch_size=16, pin_memory=True)
    n = 0
    for (x, y), (tx, ty) in zip(ours, theirs):
        assert x.is_cuda and y.is_cuda and x.device.index == torch.cuda.current_device()
        assert torch.equal(x, tx.cuda(non_blocking=True)) and torch.equal(y, ty.cuda())
        n += 1
    assert n == len(theirs)
    ours = longshore.DataLoader(
        longshore.NpyDataset(files["img"], normalize=(MEAN, STD)), batch_size=5, device="cuda:0"
    )
    for x, tx in zip(ours, DataLoader(img, batch_size=5)):
        torch.testing.assert_close(x, tx.cuda(), rtol=1e-5, atol=1e-5)


def test_pinned_cpu_tensors_are_page_locked(files):
    torch = need_cuda()
    dl = longshore.DataLoader(longshore.NpyDataset(files["x"]), batch_size=10, pin_memory=True)
    for x in dl:
        assert x.device.type == "cpu" and x.is_pinned()
        assert torch.equal(x.cuda(non_blocking=True).cpu(), x)


def test_training_step_on_longshore_batches(files, tmp_path):
    torch = need_cuda()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2048, 16)).astype(np.float32)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    y = (x @ w).argmax(axis=1).astype(np.int64)
    np.save(tmp_path / "tx.npy", x)
    np.save(tmp_path / "ty.npy", y)
    ds = longshore.NpyDataset([str(tmp_path / "tx.npy"), str(tmp_path / "ty.npy")])
    dl = longshore.DataLoader(ds, batch_size=128, shuffle=True, num_workers=2, seed=0,
                              persistent_workers=True, device="cuda")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for epoch in range(5):
        total = 0.0
        for xb, yb in dl:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        losses.append(total / len(dl))
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses


def test_every_lease_returns_after_tensors_are_freed(files):
    torch = need_cuda()
    pool = longshore.PinnedPool(pinned=True)
    # Device batches: each lease goes back once its copy is done, tensors alive or not.
    dl = longshore.DataLoader(longshore.NpyDataset([files["x"], files["y"]]), batch_size=10,
                              num_workers=2, device="cuda", pool=pool)
    held = list(dl)
    torch.cuda.synchronize()
    assert wait_until(lambda: pool.stats()["bytes_in_use"] == 0), pool.stats()
    del held
    # Pinned host batches: each lease is held by its tensors, and by the async copies made
    # from them on torch's current stream, then goes back.
    dl = longshore.DataLoader(longshore.NpyDataset([files["x"], files["y"]]), batch_size=10,
                              pin_memory=True, pool=pool)
    held = list(dl)
    assert pool.stats()["blocks_in_use"] == 10
    on_gpu = [(x.cuda(non_blocking=True), y.cuda(non_blocking=True)) for x, y in held]
    del held
    torch.cuda.synchronize()
    assert wait_until(lambda: pool.stats()["bytes_in_use"] == 0), pool.stats()
    assert pool.stats()["blocks_pending"] == 0
    want = np.load(files["x"])
    np.testing.assert_array_equal(torch.cat([x for x, _ in on_gpu]).cpu().numpy(), want)


def test_consumer_stream_waits_for_the_copy(files):
    torch = need_cuda()
    side = torch.cuda.Stream()
    dl = longshore.DataLoader(longshore.NpyDataset(files["x"]), batch_size=50, device="cuda")
    want = torch.from_numpy(np.load(files["x"])).cuda()
    with torch.cuda.stream(side):
        got = [x.clone() for x in dl]  # from_dlpack orders `side` after each copy
    side.synchronize()
    assert torch.equal(torch.cat(got), want)


def test_kdlcudahost_import_in_this_torch(files):
    """DLPack's own label for page-locked memory, imported by torch (information for the
    report: some torch versions import only kDLCPU, which the DataLoader uses for torch)."""
    torch = need_cuda()
    loader = longshore.DataLoader(longshore.NpyDataset(files["y"]), batch_size=10, pin_memory=True,
                                  framework="numpy")
    (t,) = next(iter(loader._loader.epoch()))
    assert t.__dlpack_device__() == (3, 0)
    try:
        x = torch.from_dlpack(t)
    except (RuntimeError, BufferError) as e:
        pytest.xfail(f"torch {torch.__version__} does not import kDLCUDAHost: {e}")
    assert x.device.type == "cpu" and x.is_pinned()
    assert torch.equal(x, torch.arange(10))
