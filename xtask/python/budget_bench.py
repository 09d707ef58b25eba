#!/usr/bin/env python3
"""What a pinned budget costs, from Python (issue 29): the counterpart of the Rust bench's
`budget` section (`cargo xtask bench --only budget`).

Workload: `NpyDataset` of u8 images [N, 3, 224, 224] (N = 8192 by default), batch 256 (about
37 MiB a batch, a 40 MiB pool block), 16 workers, shuffled, drop_last, persistent workers,
delivered to `device="cuda"` when torch sees a GPU (else NumPy on the CPU). Budgets: default
(a quarter of RAM), 2048 MiB, 12, 6 and 2 batches' blocks, each at prefetch_factor 2 and 8.
Steady state: one warm-up epoch, then whole epochs (at least --epochs and --min-secs),
synchronised at the end. Per row: images/s, the rate against the unconstrained one at the same
prefetch_factor (same process), the pool's peak held bytes and waits, the workers' pinned-memory
wait and the share of the consumer's wait it explains, the loader's in-flight bound and reloads.

Usage: python python/bench/budget_bench.py [--images 8192] [--data-dir DIR] [--out budget.json]
"""
import argparse
import json
import os
import sys
import time

import numpy as np

BATCH = 256
SHAPE = (3, 224, 224)
MIB = 1 << 20


def size_class(n):
    """The pool's size class of `n` bytes (four classes per power of two, page granularity)."""
    page = 4096
    n = max(n, page)
    pow2 = 1 << (n.bit_length() - 1)
    step = max(pow2 // 4, page)
    return (n + step - 1) // step * step


def ensure_images(data_dir, rows):
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, f"py_images_u8_{rows}.npy")
    if os.path.exists(path):
        a = np.load(path, mmap_mode="r")
        if a.shape == (rows,) + SHAPE and a.dtype == np.uint8:
            return path
    tmp = path + ".partial.npy"
    a = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(rows,) + SHAPE)
    rng = np.random.default_rng(0x5EED)
    for i in range(0, rows, 256):
        a[i : i + 256] = rng.integers(0, 256, size=a[i : i + 256].shape, dtype=np.uint8)
    a.flush()
    del a
    os.replace(tmp, path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="target/longshore-bench/data")
    ap.add_argument("--out", default="target/longshore-bench/python-budget.json")
    ap.add_argument("--images", type=int, default=8192)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs, at least")
    ap.add_argument("--min-secs", type=float, default=1.0, help="timed seconds, at least")
    ap.add_argument("--factors", default="2,8", help="comma-separated prefetch_factor values")
    ap.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
    args = ap.parse_args()

    import longshore

    try:
        import torch

        cuda = torch.cuda.is_available() and not args.cpu
    except ImportError:
        torch, cuda = None, False
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    path = ensure_images(args.data_dir, args.images)
    ds = longshore.NpyDataset(path)
    block = size_class(BATCH * int(np.prod(SHAPE)))
    budgets = [("default", None), ("2048 MiB", 2048 * MIB)] + [
        (f"{n * block // MIB} MiB ({n} batches)", n * block) for n in (12, 6, 2)
    ]
    rows = []
    for pf in [int(f) for f in args.factors.split(",")]:
        base = None
        for label, budget in budgets:
            pool = None if budget is None else longshore.PinnedPool(budget=budget)
            dl = longshore.DataLoader(
                ds,
                batch_size=BATCH,
                shuffle=True,
                num_workers=args.workers,
                prefetch_factor=pf,
                pin_memory=True,
                drop_last=True,
                persistent_workers=True,
                seed=0,
                device="cuda" if cuda else None,
                pool=pool,
            )
            # Warm-up epoch. No variable may keep the last batch: under a budget of 2 batches
            # a batch held across epochs leaves the loader a single block (`for _ in dl: pass`
            # would keep it in `_`).
            for b in dl:
                del b
            sync()
            dl.reset_stats()
            n, epochs, t0 = 0, 0, time.perf_counter()
            while epochs < args.epochs or time.perf_counter() - t0 < args.min_secs:
                for b in dl:
                    n += (b[0] if isinstance(b, (list, tuple)) else b).shape[0]
                    del b
                sync()
                epochs += 1
            secs = time.perf_counter() - t0
            s = dl.stats
            rate = n / secs
            base = base or rate
            row = {
                "budget": label,
                "budget_bytes": budget,
                "prefetch_factor": pf,
                "num_workers": args.workers,
                "images_per_s": rate,
                "vs_unconstrained": rate / base,
                "peak_held_bytes": s["pool"]["peak_bytes_held"],
                "waits": s["pool"]["waits"],
                "worker_pinned_wait_s": s["pinned_wait_s"],
                "pinned_wait_fraction": s["pinned_wait_fraction"],
                "wait_fraction": s["wait_fraction"],
                "in_flight_limit": s["in_flight_limit"],
                "reloaded": s["reloaded"],
                "epochs": epochs,
                "device": "cuda" if cuda else "cpu",
            }
            rows.append(row)
            print(
                f"{label:>22} pf{pf}: {rate:10.0f} images/s ({rate / base:.2f}x), peak held "
                f"{row['peak_held_bytes'] // MIB} MiB, {row['waits']} waits, worker pinned wait "
                f"{row['worker_pinned_wait_s']:.2f} s ({row['pinned_wait_fraction']:.2f} of the "
                f"consumer's wait), in flight {row['in_flight_limit']}, reloaded {row['reloaded']}",
                flush=True,
            )
            del dl, pool
    out = {"workload": f"images-u8 {args.images}x{SHAPE} batch {BATCH}", "rows": rows,
           "python": sys.version.split()[0]}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    print("| budget | prefetch_factor | images/s | vs unconstrained | peak held | waits | "
          "worker pinned wait s | pinned share of wait |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['budget']} | {r['prefetch_factor']} | {r['images_per_s']:,.0f} | "
              f"{r['vs_unconstrained']:.2f} | {r['peak_held_bytes'] // MIB} MiB | {r['waits']} | "
              f"{r['worker_pinned_wait_s']:.2f} | {r['pinned_wait_fraction']:.2f} |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
