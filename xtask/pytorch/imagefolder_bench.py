#!/usr/bin/env python3
"""PyTorch + torchvision baseline of the `jpeg` section of `cargo xtask bench`.

torchvision.datasets.ImageFolder with PyTorch's ImageNet example transforms, through
torch.utils.data.DataLoader, swept over num_workers x pin_memory, in steady state: persistent
workers, one warm-up epoch, then --epochs whole epochs timed, each batch moved to the GPU with
non_blocking=True when CUDA is available (as the Rust side delivers to the device).

  train: RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize(IMAGENET)
  val:   Resize(256), CenterCrop(224), ToTensor(), Normalize(IMAGENET)

The CPU share is the machine's busy fraction from /proc/stat over the timed epochs (workers are
processes, so the whole machine is what counts). Prints one JSON object on stdout; progress on
stderr. Run by `jpeg-bench`, or by hand:

  python xtask/pytorch/imagefolder_bench.py --root target/longshore-bench/data/jpeg-imagenet-like
"""
import argparse
import json
import sys
import time

import torch
import torchvision
from torch.utils.data import DataLoader
from torchvision import datasets, transforms as T

NORMALIZE = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
PIPELINES = {
    "train": T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), NORMALIZE]),
    "val": T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), NORMALIZE]),
}


def cpu_jiffies():
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v) - v[3] - v[4], sum(v)
    except OSError:
        return None


def run(dataset, batch, workers, pin, epochs, device):
    kw = dict(batch_size=batch, shuffle=True, num_workers=workers, pin_memory=pin)
    if workers > 0:
        kw.update(persistent_workers=True, prefetch_factor=2)
    loader = DataLoader(dataset, **kw)

    def epoch():
        n = 0
        for images, labels in loader:
            if device is not None:
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
            n += images.shape[0]
        if device is not None:
            torch.cuda.synchronize()
        return n

    epoch()  # warm-up: worker start-up and page cache
    c0, t0 = cpu_jiffies(), time.perf_counter()
    n = sum(epoch() for _ in range(epochs))
    dt = time.perf_counter() - t0
    c1 = cpu_jiffies()
    share = (c1[0] - c0[0]) / (c1[1] - c0[1]) if c0 and c1 and c1[1] > c0[1] else None
    del loader
    return {"num_workers": workers, "pin_memory": pin, "samples_per_s": n / dt, "cpu_share": share, "epochs": epochs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--workers", default="0,4,8,16,32")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--only", default="train,val")
    a = ap.parse_args()
    device = torch.device("cuda") if torch.cuda.is_available() else None
    workers = [int(w) for w in a.workers.split(",") if w != ""]
    out = {"torch": torch.__version__, "torchvision": torchvision.__version__, "cuda": device is not None,
           "results": {}, "best": {}}
    for name in a.only.split(","):
        dataset = datasets.ImageFolder(a.root, transform=PIPELINES[name])
        runs = []
        for w in workers:
            for pin in (False, True):
                r = run(dataset, a.batch_size, w, pin, a.epochs, device)
                runs.append(r)
                print(f"jpeg: pytorch {name} workers={w} pin={pin}: {r['samples_per_s']:,.0f} images/s, "
                      f"cpu {100 * (r['cpu_share'] or 0):.0f}%", file=sys.stderr, flush=True)
        out["results"][name] = runs
        out["best"][name] = max(runs, key=lambda r: r["samples_per_s"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
