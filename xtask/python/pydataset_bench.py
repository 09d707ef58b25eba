#!/usr/bin/env python3
"""Python datasets through longshore against torch's DataLoader (issue 27), same process, same
data, steady state (one warm-up epoch, then whole epochs timed; with a device, synchronised at
the end).

Workloads:

* ``imagefolder``: torchvision's own ``ImageFolder`` (PIL decode, RandomResizedCrop(224),
  RandomHorizontalFlip, ToTensor, Normalize) over a generated ImageNet-like JPEG folder, batch
  256, 16 workers, delivered to ``cuda`` (``device="cuda"`` for longshore; ``pin_memory=True`` +
  ``.cuda(non_blocking=True)`` for torch). torch is tuned as an expert would: persistent
  workers, prefetch_factor 2 and 4, the best row kept. Peak page-locked bytes: the pool's peak
  for longshore, torch's host caching allocator's peak (``torch.cuda.host_memory_stats``) for
  torch. Then the budget check: ``PinnedPool(budget=B, shared=True)`` with ``prefetch_factor=8``
  and 32 workers must never hold more than B.
* ``small``: a dataset returning ``(torch.randn(64) row, label)`` by ``__getitem__`` and by
  ``__getitems__``, batch 256, on the CPU with pinned memory; workers 2/4/8 for both, best row.
* both with ``worker_mode="thread"`` too (the dataset in the loader's threads, under the GIL
  here: Python 3.12 is not free-threaded).
* ``startup``: time from ``iter()`` to the first batch with 16 workers, spawn and forkserver,
  non-persistent, the mean of 3 runs, small dataset.

Prints one table per workload and writes JSON (``--out``).
Usage: python3 xtask/python/pydataset_bench.py [--data DIR] [--images 4096] [--only W,...]
"""
import argparse
import json
import os
import time

import numpy as np
import torch

import longshore

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def timed(make_iter, epochs, cuda, min_secs=1.0):
    """(samples per second, epochs timed) over whole epochs after one warm-up epoch."""
    def run():
        n = 0
        for b in make_iter():
            x = b[0] if isinstance(b, (list, tuple)) else b
            n += x.shape[0]
        if cuda:
            torch.cuda.synchronize()
        return n

    run()  # warm-up: workers, caches
    t0, n, e = time.perf_counter(), 0, 0
    while e < epochs or time.perf_counter() - t0 < min_secs:
        n += run()
        e += 1
    return n / (time.perf_counter() - t0), e


def host_peak():
    f = getattr(torch.cuda, "host_memory_stats", None)
    if f is None:
        return None
    s = f()
    # torch's host caching allocator: the peak of the bytes it holds (cached included).
    peaks = {k: v for k, v in s.items() if "bytes" in k and "peak" in k}
    return max(peaks.values()) if peaks else None


def reset_host_peak():
    f = getattr(torch.cuda, "reset_peak_host_memory_stats", None)
    if f is not None:
        f()


def imagefolder(args, out):
    import torchvision.datasets as D
    import torchvision.transforms as T

    root = args.data
    longshore.datasets.write_synthetic_folder(
        root, classes=100, per_class=max(1, args.images // 100), mean_area=140_000,
        quality=90, seed=0x13A6E)
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(MEAN, STD)])
    ds = D.ImageFolder(root, tf)
    cuda = torch.cuda.is_available()
    rows = []
    for pf in (2, 4):
        dl = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, num_workers=16,
                                         pin_memory=cuda, persistent_workers=True,
                                         prefetch_factor=pf, drop_last=True)

        def it(dl=dl):
            for x, y in dl:
                yield (x.cuda(non_blocking=True), y.cuda(non_blocking=True)) if cuda else (x, y)
        reset_host_peak()
        rate, e = timed(it, args.epochs, cuda)
        rows.append({"loader": f"torch (16 workers, pin_memory, persistent, prefetch {pf})",
                     "images_per_s": rate, "epochs": e, "peak_pinned": host_peak()})
        del dl
    pool = longshore.PinnedPool(shared=True)
    dl = longshore.DataLoader(ds, batch_size=256, shuffle=True, num_workers=16, pin_memory=True,
                              persistent_workers=True, drop_last=True, pool=pool,
                              device="cuda" if cuda else None)
    rate, e = timed(lambda: iter(dl), args.epochs, cuda)
    rows.append({"loader": "longshore (16 workers, device=cuda)", "images_per_s": rate,
                 "epochs": e, "peak_pinned": pool.stats()["peak_bytes_held"]})
    del dl
    # worker_mode="thread": the dataset in the loader's threads (the GIL is taken in turns;
    # PIL releases it while decoding and resizing).
    pool = longshore.PinnedPool(shared=True)
    dl = longshore.DataLoader(ds, batch_size=256, shuffle=True, num_workers=16, pin_memory=True,
                              persistent_workers=True, drop_last=True, pool=pool,
                              device="cuda" if cuda else None, worker_mode="thread")
    rate, e = timed(lambda: iter(dl), args.epochs, cuda)
    rows.append({"loader": "longshore (16 worker threads, device=cuda)", "images_per_s": rate,
                 "epochs": e, "peak_pinned": pool.stats()["peak_bytes_held"]})
    del dl
    # The budget with a deep prefetch and many workers: 6 batches' worth of blocks.
    block = 256 * 3 * 224 * 224 * 4
    budget = 6 * block + (8 << 20)
    pool = longshore.PinnedPool(shared=True, budget=budget)
    dl = longshore.DataLoader(ds, batch_size=256, shuffle=True, num_workers=32, pin_memory=True,
                              persistent_workers=True, drop_last=True, prefetch_factor=8,
                              pool=pool, device="cuda" if cuda else None)
    rate, e = timed(lambda: iter(dl), 1, cuda)
    peak = pool.stats()["peak_bytes_held"]
    rows.append({"loader": f"longshore (32 workers, prefetch 8, budget {budget >> 20} MiB)",
                 "images_per_s": rate, "epochs": e, "peak_pinned": peak,
                 "within_budget": peak <= budget})
    del dl
    best_torch = max(r["images_per_s"] for r in rows[:2])
    for r in rows:
        r["vs_torch_best"] = r["images_per_s"] / best_torch
    out["imagefolder"] = rows
    table("imagefolder (torchvision ImageFolder, PIL, batch 256)", rows)


class Small:
    """64 floats and a label per sample, from memory."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class SmallBatched(Small):
    def __getitems__(self, indices):
        return [(self.x[i], self.y[i]) for i in indices]


def small(args, out):
    rows = []
    cuda = torch.cuda.is_available()
    for cls in (Small, SmallBatched):
        ds = cls(args.small)
        best = {}
        for w in (2, 4, 8):
            dl = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, num_workers=w,
                                             pin_memory=cuda, persistent_workers=True,
                                             prefetch_factor=4)
            best.setdefault("torch", []).append((timed(lambda: iter(dl), args.epochs, False)[0], w))
            del dl
            dl = longshore.DataLoader(ds, batch_size=256, shuffle=True, num_workers=w,
                                      pin_memory=cuda, persistent_workers=True)
            best.setdefault("longshore", []).append(
                (timed(lambda: iter(dl), args.epochs, False)[0], w))
            del dl
            dl = longshore.DataLoader(ds, batch_size=256, shuffle=True, num_workers=w,
                                      pin_memory=cuda, persistent_workers=True,
                                      worker_mode="thread")
            best.setdefault("threads", []).append(
                (timed(lambda: iter(dl), args.epochs, False)[0], w))
            del dl
        t, tw = max(best["torch"])
        ls, lw = max(best["longshore"])
        th, thw = max(best["threads"])
        rows.append({"dataset": cls.__name__, "torch_best": t, "torch_workers": tw,
                     "longshore_best": ls, "longshore_workers": lw, "ratio": ls / t,
                     "threads_best": th, "threads_workers": thw, "threads_ratio": th / t,
                     "all": best})
    out["small"] = rows
    table("small tensors (64 floats + label, batch 256, pinned)", rows)


def startup(args, out):
    """Each (start method, loader) in a fresh process: xtask/probes/worker-startup.py (a fork
    server serves every later loader of its process, so sharing one would favour the second)."""
    import subprocess
    import sys

    probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "probes",
                         "worker-startup.py")
    r = subprocess.run([sys.executable, probe, "--workers", "16", "--reps", "3"],
                       capture_output=True, text=True, check=True)
    rows = [line for line in r.stdout.splitlines() if "first batch" in line]
    out["startup"] = rows
    print("\n== worker start-up (16 workers; iter() to each worker's init, to the first batch)")
    for line in rows:
        print("  " + line)


def table(title, rows):
    print(f"\n== {title}")
    for r in rows:
        print("  " + ", ".join(f"{k}={v:,.3f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in r.items() if k != "all"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="target/pydataset-bench/jpegs")
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--small", type=int, default=256 * 400)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--only", default="imagefolder,small,startup")
    ap.add_argument("--out", default="target/pydataset-bench/results.json")
    args = ap.parse_args()
    out = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "cores": os.cpu_count(), "torch": torch.__version__}
    for w in args.only.split(","):
        {"imagefolder": imagefolder, "small": small, "startup": startup}[w](args, out)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
