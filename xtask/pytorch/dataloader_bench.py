#!/usr/bin/env python3
"""PyTorch DataLoader baseline for `cargo xtask bench`: its strongest configuration.

Reads the same memory-mapped .npy files the Rust benchmark generates and measures samples/s of
torch.utils.data.DataLoader over the grid num_workers x pin_memory x prefetch_factor x
persistent_workers, delivering each batch to the GPU (non_blocking) when CUDA is available.

Workloads (as in the loader issue):
  images : u8 [N, 3, 224, 224] -> f32 normalised with per-channel mean/std, batch 256
  tabular: f32 [N, 64] features + i64 [N] labels, batch 1024

Method (the same as longshore-bench's, issue 14): whole epochs are timed, so every timed
window starts and ends with an empty pipeline (no pre-filled queue is timed) and each epoch
pays its own fill, as training does. With persistent workers one untimed warm-up epoch comes
first (worker start-up); without, every epoch starts its workers, as it does in training.

  1. Screen: every configuration of the grid, one warm-up epoch (persistent workers only) and
     --screen-epochs timed epochs of a shorter epoch (--screen-samples-*: a random subset of
     the file each epoch, drawn by RandomSampler(num_samples=...)), so the whole grid fits in
     a few minutes. The page cache is warmed once per workload before the grid.
  2. Final: the --final-top best screened configurations again, on whole-file epochs
     (shuffle=True), one warm-up epoch and --final-epochs timed ones. The best final is
     PyTorch's best, which every ratio is taken against.

Prints one JSON object on stdout; progress goes to stderr.
"""
import argparse
import itertools
import json
import os
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1) * 255.0
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1) * 255.0


class Images(Dataset):
    def __init__(self, path):
        self.path = path
        self.arr = None
        self.n = np.load(path, mmap_mode="r").shape[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.arr is None:  # open per worker
            self.arr = np.load(self.path, mmap_mode="r")
        x = torch.from_numpy(np.array(self.arr[i])).float()
        return (x - MEAN) / STD


class Tabular(Dataset):
    def __init__(self, feats, labels):
        self.fp, self.lp = feats, labels
        self.f = self.l = None
        self.n = np.load(feats, mmap_mode="r").shape[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.f is None:
            self.f = np.load(self.fp, mmap_mode="r")
            self.l = np.load(self.lp, mmap_mode="r")
        return torch.from_numpy(np.array(self.f[i])), int(self.l[i])


def warm_page_cache(paths):
    """Reads every file once, so the first configuration does not pay the disk."""
    for p in paths:
        a = np.load(p, mmap_mode="r")
        flat = a.reshape(-1).view(np.uint8) if a.dtype != np.uint8 else a.reshape(-1)
        step = 64 << 20
        s = 0
        for i in range(0, flat.shape[0], step):
            s += int(flat[i:i + step:4096].sum())


def deliver(b, device):
    if device is None:
        return b
    if isinstance(b, (list, tuple)):
        return [t.to(device, non_blocking=True) for t in b]
    return b.to(device, non_blocking=True)


def run(ds, batch, cfg, epoch_samples, epochs, device):
    """Times `epochs` whole epochs; returns (samples/s, batches timed, seconds)."""
    workers, pin, prefetch, persistent = cfg
    kw = dict(batch_size=batch, num_workers=workers, pin_memory=pin, drop_last=True)
    if epoch_samples is None or epoch_samples >= len(ds):
        kw["shuffle"] = True
    else:
        kw["sampler"] = RandomSampler(ds, replacement=False, num_samples=epoch_samples)
    if workers > 0:
        kw["prefetch_factor"] = prefetch
        kw["persistent_workers"] = persistent
    dl = DataLoader(ds, **kw)
    if workers > 0 and persistent:  # warm-up epoch: worker start-up is not timed
        for b in dl:
            deliver(b, device)
        if device is not None:
            torch.cuda.synchronize()
    n = batches = 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for b in dl:
            deliver(b, device)
            n += batch
            batches += 1
    if device is not None:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del dl
    return (n / dt if dt > 0 else 0.0), batches, dt


def ints(s):
    return [int(x) for x in s.split(",") if x != ""]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--workers", default="0,4,8,16,32")
    ap.add_argument("--pin", default="0,1", help="pin_memory values (1 needs CUDA)")
    ap.add_argument("--prefetch", default="2,4,8")
    ap.add_argument("--persistent", default="0,1")
    ap.add_argument("--screen-epochs", type=int, default=1)
    ap.add_argument("--screen-samples-images", type=int, default=4096)
    ap.add_argument("--screen-samples-tabular", type=int, default=262144)
    ap.add_argument("--final-top", type=int, default=3)
    ap.add_argument("--final-epochs", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=200.0,
                    help="screening of a workload stops (with a note) after its share of this")
    ap.add_argument("--only", default="images,tabular")
    a = ap.parse_args()
    device = torch.device("cuda") if torch.cuda.is_available() else None
    out = {"torch": torch.__version__, "cuda": bool(device), "cores": os.cpu_count(),
           "method": "whole epochs; screen then final (see the script's docstring)",
           "results": [], "notes": []}
    names = [n for n in a.only.split(",") if n in ("images", "tabular")]
    for name in names:
        if name == "images":
            paths = [os.path.join(a.dir, "images_u8.npy")]
            ds, batch, screen_n = Images(paths[0]), 256, a.screen_samples_images
        else:
            paths = [os.path.join(a.dir, "tabular_x.npy"), os.path.join(a.dir, "tabular_y.npy")]
            ds, batch, screen_n = Tabular(*paths), 1024, a.screen_samples_tabular
        warm_page_cache(paths)
        grid = []
        for w, pin, pf, pers in itertools.product(
                ints(a.workers), ints(a.pin), ints(a.prefetch), ints(a.persistent)):
            pin = bool(pin)
            if pin and device is None:
                continue
            if w == 0:  # prefetch_factor and persistent_workers need workers
                pf, pers = None, False
            cfg = (w, pin, pf, bool(pers))
            if cfg not in grid:
                grid.append(cfg)
        t_start = time.perf_counter()
        screened = []
        for cfg in grid:
            if time.perf_counter() - t_start > a.budget_s / len(names):
                out["notes"].append(f"{name}: screening stopped after {len(screened)} of {len(grid)} "
                                    f"configurations (budget {a.budget_s / len(names):.0f} s)")
                break
            sps, nb, dt = run(ds, batch, cfg, screen_n, a.screen_epochs, device)
            screened.append((sps, cfg))
            out["results"].append(dict(workload=name, stage="screen", num_workers=cfg[0], pin_memory=cfg[1],
                                       prefetch_factor=cfg[2], persistent_workers=cfg[3], samples_per_s=sps,
                                       batches=nb, secs=dt, epoch_samples=min(screen_n, len(ds))))
            print(f"pytorch {name} screen workers={cfg[0]} pin={cfg[1]} prefetch={cfg[2]} "
                  f"persistent={cfg[3]}: {sps:,.0f} samples/s", file=sys.stderr, flush=True)
        screened.sort(key=lambda r: -r[0])
        for _, cfg in screened[:a.final_top]:
            sps, nb, dt = run(ds, batch, cfg, None, a.final_epochs, device)
            out["results"].append(dict(workload=name, stage="final", num_workers=cfg[0], pin_memory=cfg[1],
                                       prefetch_factor=cfg[2], persistent_workers=cfg[3], samples_per_s=sps,
                                       batches=nb, secs=dt, epoch_samples=len(ds) // batch * batch))
            print(f"pytorch {name} final workers={cfg[0]} pin={cfg[1]} prefetch={cfg[2]} "
                  f"persistent={cfg[3]}: {sps:,.0f} samples/s", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
