#!/usr/bin/env python3
"""Per-batch cost of the Python package, on the CPU: how many microseconds Python spends per
batch beyond the loader's own work.

Method: a tabular dataset (f32 [N, 64] + i64 [N], memmapped, in the page cache) read in small
batches (default 64 rows), so the data work per batch is small and the per-batch overheads
dominate. Each case runs one warm-up epoch, then `--epochs` whole epochs timed with
time.perf_counter (wall) and time.process_time (CPU of every thread of the process); each
figure is the best (minimum) of `--repeats` runs, which is the least disturbed by other load on
the machine, as wall us / CPU us / Python-thread CPU us per batch (time.thread_time of the
consuming thread: what Python itself spends per batch, waits excluded; the least disturbed by
other load):

  raw      : `_loader.epoch()` yielding longshore.Tensor objects, not converted
  numpy    : `DataLoader(framework="numpy")`: every tensor through np.from_dlpack
  capsule  : the torch converter (`_TorchConverter`, a whole batch per Rust call) handing its
             capsules to a C function that drops them (`id`) instead of torch._C._from_dlpack:
             the torch path's cost without torch's own import (torch: xtask/python/torch_per_batch.py)
  step=US  : numpy, plus a simulated training step of US microseconds of Python-held busy
             work per batch: with overlap, the cost per batch approaches max(step, loader)
             rather than step + loader

Usage: python per_batch.py [--rows 200000] [--batch 64] [--workers 0,2] [--step 20]
"""
import argparse
import os
import tempfile
import time

import numpy as np

import longshore


def make(dirname, rows):
    x = os.path.join(dirname, f"pb_x_{rows}.npy")
    y = os.path.join(dirname, f"pb_y_{rows}.npy")
    if not os.path.exists(x):
        np.save(x, np.random.default_rng(0).random((rows, 64), dtype=np.float32))
        np.save(y, np.arange(rows, dtype=np.int64))
    return [x, y]


def busy(us):
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def run(dl, epochs, raw, step, convert=None):
    def one():
        n = 0
        if convert is not None:
            it = dl._loader.epoch(convert)
        else:
            it = dl._loader.epoch() if raw else iter(dl)
        for _ in it:
            n += 1
            if step:
                busy(step)
        return n

    one()  # warm-up: workers, page cache, pool
    t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    n = sum(one() for _ in range(epochs))
    return ((time.perf_counter() - t0) / n * 1e6, (time.process_time() - c0) / n * 1e6,
            (time.thread_time() - m0) / n * 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--step", type=float, default=20.0)
    ap.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "longshore-pb"))
    args = ap.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    ds = longshore.NpyDataset(make(args.data_dir, args.rows))
    print(f"rows={args.rows} batch={args.batch} epochs={args.epochs} repeats={args.repeats} "
          f"cores={os.cpu_count()}")
    print("| workers | raw us/batch | numpy us/batch | capsule us/batch | numpy + step "
          f"{args.step:g} us: us/batch |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    # None with a longshore from before the converter (its column then shows "-").
    converter = getattr(longshore._longshore, "_TorchConverter", None)
    capsule = converter(id) if converter else None
    for nw in [int(w) for w in args.workers.split(",")]:
        dl = longshore.DataLoader(ds, batch_size=args.batch, num_workers=nw, shuffle=True,
                                  drop_last=True, persistent_workers=nw > 0, seed=0,
                                  framework="numpy")
        cells = []
        cases = [(True, 0, None), (False, 0, None), (False, 0, capsule), (False, args.step, None)]
        for k, (raw, step, convert) in enumerate(cases):
            if k == 2 and capsule is None:
                cells.append(None)
                continue
            runs = [run(dl, args.epochs, raw, step, convert) for _ in range(args.repeats)]
            cells.append(tuple(min(r[j] for r in runs) for j in range(3)))
        print(f"| {nw} | " + " | ".join("-" if c is None else "{:.1f} / {:.1f} / {:.1f}".format(*c)
                                         for c in cells) + " |")


if __name__ == "__main__":
    main()
