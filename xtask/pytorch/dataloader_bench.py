#!/usr/bin/env python3
"""PyTorch DataLoader baseline for `cargo xtask bench`.

Reads the same memory-mapped .npy files the Rust benchmark generates and measures
samples/s of torch.utils.data.DataLoader over a sweep of num_workers x pin_memory,
delivering each batch to the GPU (non_blocking) when CUDA is available.

Workloads (as in the loader issue):
  images : u8 [N, 3, 224, 224] -> f32 normalised with per-channel mean/std, batch 256
  tabular: f32 [N, 64] features + i64 [N] labels, batch 1024
Prints one JSON object on stdout.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

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


def run(ds, batch, workers, pin, max_batches, device):
    kw = dict(batch_size=batch, shuffle=True, num_workers=workers, pin_memory=pin, drop_last=True)
    if workers > 0:
        kw["prefetch_factor"] = 2
        kw["persistent_workers"] = False
    dl = DataLoader(ds, **kw)
    it = iter(dl)
    # Warm-up: worker start-up is excluded, as in the Rust benchmark.
    first = next(it)
    n = 0
    t0 = time.perf_counter()
    for k in range(max_batches):
        try:
            b = next(it)
        except StopIteration:  # small (quick) files: go on with the next epoch, as the Rust side does
            it = iter(dl)
            b = next(it)
        if device is not None:
            if isinstance(b, (list, tuple)):
                b = [t.to(device, non_blocking=True) for t in b]
            else:
                b = b.to(device, non_blocking=True)
        n += batch
    if device is not None:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del it, first
    return n / dt if dt > 0 else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--workers", default="0,4,8,16")
    ap.add_argument("--max-batches-images", type=int, default=40)
    ap.add_argument("--max-batches-tabular", type=int, default=200)
    ap.add_argument("--only", default="images,tabular")
    a = ap.parse_args()
    device = torch.device("cuda") if torch.cuda.is_available() else None
    workers = [int(w) for w in a.workers.split(",") if w != ""]
    out = {"torch": torch.__version__, "cuda": bool(device), "results": []}
    for name in a.only.split(","):
        if name == "images":
            ds = Images(os.path.join(a.dir, "images_u8.npy"))
            batch, mb = 256, a.max_batches_images
        elif name == "tabular":
            ds = Tabular(os.path.join(a.dir, "tabular_x.npy"), os.path.join(a.dir, "tabular_y.npy"))
            batch, mb = 1024, a.max_batches_tabular
        else:
            continue
        for w in workers:
            for pin in (False, True):
                if pin and device is None:
                    continue
                sps = run(ds, batch, w, pin, mb, device)
                out["results"].append({"workload": name, "num_workers": w, "pin_memory": pin, "samples_per_s": sps})
                print(f"pytorch {name} workers={w} pin={pin}: {sps:,.0f} samples/s", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
