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
stderr. With --gpu-decode (and CUDA), also the GPU-decoding baseline: file bytes read by
DataLoader workers (torchvision.io.read_file), torchvision.io.decode_jpeg(device="cuda") on each
batch (batches of --batch-size, 256 by default), then the same crops, resizes (antialiased
bilinear), flips and normalisation on the GPU, one image at a time as torchvision's functional
API does. Run by `jpeg-bench`, or by hand:

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


class FileBytes(torch.utils.data.Dataset):
    """The ImageFolder's files as raw bytes (uint8 tensors) and labels."""

    def __init__(self, root):
        self.samples = datasets.ImageFolder(root).samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        return torchvision.io.read_file(path), label


def collate_bytes(items):
    return [d for d, _ in items], torch.tensor([label for _, label in items])


def gpu_transform(name, img):
    import torchvision.transforms.functional as F

    if name == "train":
        i, j, h, w = T.RandomResizedCrop.get_params(img, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
        img = F.resized_crop(img, i, j, h, w, [224, 224], antialias=True)
        if torch.rand(1).item() < 0.5:
            img = F.hflip(img)
    else:
        img = F.center_crop(F.resize(img, 256, antialias=True), 224)
    return img


def run_gpu_decode(root, name, batch, workers, epochs):
    # Each batch is a list of 256 byte tensors: with the default `file_descriptor` sharing
    # strategy every one costs an open descriptor in flight and the workers run out of them
    # ("Bad file descriptor"); `file_system` is what PyTorch's docs advise for many tensors.
    torch.multiprocessing.set_sharing_strategy("file_system")
    device = torch.device("cuda")
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)
    kw = dict(batch_size=batch, shuffle=True, num_workers=workers, pin_memory=False,
              collate_fn=collate_bytes)
    if workers > 0:
        kw.update(persistent_workers=True, prefetch_factor=2)
    loader = DataLoader(FileBytes(root), **kw)

    def epoch():
        n = 0
        for data, labels in loader:
            images = torchvision.io.decode_jpeg(data, mode=torchvision.io.ImageReadMode.RGB, device=device)
            out = torch.stack([gpu_transform(name, im) for im in images])
            out = (out.float() / 255.0 - mean) / std
            labels = labels.to(device, non_blocking=True)
            n += out.shape[0]
        torch.cuda.synchronize()
        return n

    epoch()
    c0, t0 = cpu_jiffies(), time.perf_counter()
    n = sum(epoch() for _ in range(epochs))
    dt = time.perf_counter() - t0
    c1 = cpu_jiffies()
    share = (c1[0] - c0[0]) / (c1[1] - c0[1]) if c0 and c1 and c1[1] > c0[1] else None
    return {"num_workers": workers, "batch_size": batch, "samples_per_s": n / dt, "cpu_share": share,
            "epochs": epochs, "what": "torchvision.io.decode_jpeg(device='cuda') + resize"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--workers", default="0,4,8,16,32")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--only", default="train,val")
    ap.add_argument("--gpu-decode", action="store_true")
    ap.add_argument("--gpu-decode-workers", type=int, default=8)
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
    if a.gpu_decode and device is not None:
        out["gpu_decode"] = {}
        for name in a.only.split(","):
            try:
                r = run_gpu_decode(a.root, name, a.batch_size, a.gpu_decode_workers, a.epochs)
            except Exception as e:  # an old torchvision without batched GPU decode_jpeg
                r = {"skipped": f"{type(e).__name__}: {e}"}
            out["gpu_decode"][name] = r
            print(f"jpeg: torchvision gpu decode {name}: {r}", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
