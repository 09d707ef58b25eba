#!/usr/bin/env python3
"""Per-batch cost of handing longshore batches to torch: `__next__` + conversion, per batch.

The tabular workload of the python bench (f32 [N, 64] + i64 [N] memmapped, batch 1024,
shuffled, drop_last, persistent workers), delivered to the GPU (device="cuda") or, with
--pinned, as page-locked CPU tensors (pin_memory=True). Small epochs (--batches per epoch), one
warm-up epoch, then --epochs timed, torch.cuda.synchronize() at the end of each; the best of
--repeats runs. Per case, microseconds per batch (wall; CPU time of the whole process; CPU time
of the Python thread, which is what Python itself spends per batch, waits excluded) and million
samples/s:

  raw      : `_loader.epoch()` with no conversion (longshore.Tensor objects): the loader's own
             rate as Python sees it, the ceiling of the two below
  fast     : the DataLoader as users get it: `_TorchConverter`, a whole batch per Rust call
  per-tensor: the fallback, torch.utils.dlpack.from_dlpack per tensor (what the package did
             before the converter)

The Python package meets its target when `fast` is within 10% of the Rust loader's rate
(`--rust-sps`, samples/s, from the loader section of `cargo xtask bench`), i.e. when Python's
per-batch cost is well under the Rust loader's time per batch.

Needs torch and numpy, and longshore installed (a wheel); runs on the CPU too (--pinned off,
CPU tensors) to check the script itself.

Usage: python3 torch_per_batch.py [--workers 2,4,8] [--batches 1000] [--epochs 5] [--pinned]
       [--rust-sps 48.3e6] [--out result.json]
"""
import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch

import longshore
from longshore import _longshore


def make(dirname, rows):
    x = os.path.join(dirname, f"tpb_x_{rows}.npy")
    y = os.path.join(dirname, f"tpb_y_{rows}.npy")
    if not os.path.exists(x) or not os.path.exists(y):
        rng = np.random.default_rng(0)
        np.save(x, rng.random((rows, 64), dtype=np.float32))
        np.save(y, rng.integers(0, 1000, size=rows, dtype=np.int64))
    return [x, y]


def timed(make_iter, epochs, sync):
    """(wall, process CPU, Python-thread CPU) us per batch over `epochs` epochs after a
    warm-up epoch."""
    for _ in make_iter():
        pass
    sync()
    n = 0
    t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(epochs):
        for _ in make_iter():
            n += 1
        sync()
    return ((time.perf_counter() - t0) / n * 1e6, (time.process_time() - c0) / n * 1e6,
            (time.thread_time() - m0) / n * 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,4,8")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=1000, help="batches per epoch")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pinned", action="store_true", help="pin_memory=True CPU batches instead of device='cuda'")
    ap.add_argument("--rust-sps", type=float, default=None, help="the Rust loader's samples/s, to compare")
    ap.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "longshore-tpb"))
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    os.makedirs(args.data_dir, exist_ok=True)
    ds = longshore.NpyDataset(make(args.data_dir, args.batch * args.batches))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    kw = dict(pin_memory=True) if args.pinned or not cuda else dict(device="cuda")
    where = "pinned CPU tensors" if args.pinned else ("device='cuda'" if cuda else "CPU tensors (no CUDA)")
    print(f"torch {torch.__version__}, longshore {longshore.__version__}, {where}, "
          f"batch {args.batch}, {args.batches} batches/epoch, {args.epochs} epochs, best of {args.repeats}, "
          f"{os.cpu_count()} cores" + (f", {torch.cuda.get_device_name(0)}" if cuda else ""))
    head = "| workers | case | us/batch (wall) | CPU us/batch | Python-thread us/batch | M samples/s |"
    if args.rust_sps:
        head += " vs Rust |"
    print(head)
    print("|" + " ---: |" * (head.count("|") - 1))
    rows = []
    for nw in [int(w) for w in args.workers.split(",")]:
        dl = longshore.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=nw, drop_last=True,
                                  persistent_workers=nw > 0, seed=0, **kw)
        fast = dl._convert
        slow = dl._converter("torch", fast=False)
        cases = {
            "raw": lambda: dl._loader.epoch(),
            "fast": lambda: dl._loader.epoch(fast),
            "per-tensor": lambda: dl._loader.epoch(slow),
        }
        if not isinstance(fast, _longshore._TorchConverter):
            print("(this torch lacks an internal the converter needs: 'fast' is the per-tensor path)")
        for name, make_iter in cases.items():
            runs = [timed(make_iter, args.epochs, sync) for _ in range(args.repeats)]
            wall = min(r[0] for r in runs)
            cpu = min(r[1] for r in runs)
            py = min(r[2] for r in runs)
            sps = args.batch / wall * 1e6
            row = {"workers": nw, "case": name, "us_per_batch": wall, "cpu_us_per_batch": cpu,
                   "python_thread_us_per_batch": py, "samples_per_s": sps}
            line = f"| {nw} | {name} | {wall:.1f} | {cpu:.1f} | {py:.1f} | {sps / 1e6:.2f} |"
            if args.rust_sps:
                row["vs_rust"] = sps / args.rust_sps
                line += f" {sps / args.rust_sps:.0%} |"
            rows.append(row)
            print(line, flush=True)
        del dl
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "where": where, "batch": args.batch,
                       "rust_samples_per_s": args.rust_sps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
