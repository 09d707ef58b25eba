#!/usr/bin/env python3
"""A/B of two longshore wheels on the loader's main workloads, alternating in one call.

Each wheel is installed into its own folder (``pip install --no-index --no-deps --target``);
every run is a fresh interpreter with that folder first on ``PYTHONPATH``, so the two never
share a process, and the runs alternate A B B A within each round, so that drift of the host
(clocks, page cache, other tenants) falls on both. A run builds the loader, loads one warm-up
epoch, then times ``--epochs`` whole epochs from Python (batches on the GPU when CUDA is
there), then the same loader drained in Rust (``_Loader._drain_in_rust``: the Rust front door
in the same process). Reported per workload: each wheel's median, min and max samples/s, and
the ratio of medians (new / base).

Workloads (the same files for both wheels, made once with the new wheel):
  npy          u8 [N, 3, 224, 224] memmap -> f32 normalised per channel, batch 256
  tabular      f32 [M, 64] + i64 [M] memmaps, batch 1024
  folder-cpu   synthetic ImageNet-like JPEG folder, RandomResizedCrop(224) + flip + normalise,
               decoded by the workers (libjpeg-turbo), batch 256
  folder-nvjpeg the same folder decoded with nvJPEG on the GPU (needs CUDA)

  python3 xtask/python/wheel_ab.py --site base=/tmp/site-base --site new=/tmp/site-new \\
      --data /tmp/ab --rounds 3 --out ab.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
WORKLOADS = ["npy", "tabular", "folder-cpu", "folder-nvjpeg"]


def child(cfg):
    """One run: the loader of `cfg["workload"]`, one warm-up epoch, timed epochs from Python,
    then drained in Rust. Prints one JSON line."""
    import numpy as np

    import longshore

    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        torch, cuda = None, False
    w, data = cfg["workload"], cfg["data"]
    kw = dict(batch_size=256, shuffle=True, drop_last=True, num_workers=cfg["workers"],
              pin_memory=True, persistent_workers=True, seed=3)
    if w == "npy":
        ds = longshore.NpyDataset(os.path.join(data, "images.npy"), normalize=(MEAN, STD))
    elif w == "tabular":
        ds = longshore.NpyDataset([os.path.join(data, "x.npy"), os.path.join(data, "y.npy")])
        kw["batch_size"] = 1024
    else:
        T = longshore.transforms
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize(MEAN, STD)])
        ds = longshore.datasets.ImageFolder(os.path.join(data, "jpegs"), transform=tf)
        if w == "folder-nvjpeg":
            kw["decode"] = "nvjpeg"
    if cuda:
        kw["device"] = "cuda"
    dl = longshore.DataLoader(ds, **kw)

    def epoch():
        n = 0
        last = None
        for batch in dl:
            last = batch
            n += len(batch[0]) if isinstance(batch, (list, tuple)) else len(batch)
        if cuda and last is not None:
            torch.cuda.synchronize()
        return n

    epoch()  # warm-up: workers, pool, page cache
    t = time.perf_counter()
    n = sum(epoch() for _ in range(cfg["epochs"]))
    py = n / (time.perf_counter() - t)
    samples, secs = dl._loader._drain_in_rust(cfg["epochs"])
    print(json.dumps(dict(python=py, rust=samples / secs, cuda=cuda,
                          version=getattr(longshore, "__version__", "?"))))


def make_data(args, site):
    """The files, written once (reused when present) with `site`'s wheel."""
    code = f"""
import os, numpy as np, longshore
d = {args.data!r}
os.makedirs(d, exist_ok=True)
def fill(path, shape, dtype, f):
    if os.path.exists(path):
        return
    a = np.lib.format.open_memmap(path + '.part.npy', mode='w+', dtype=dtype, shape=shape)
    r = np.random.default_rng(0x5EED)
    step = max(1, (64 << 20) // a[0].nbytes)
    for i in range(0, shape[0], step):
        a[i:i + step] = f(r, a[i:i + step].shape)
    a.flush(); del a
    os.replace(path + '.part.npy', path)
fill(os.path.join(d, 'images.npy'), ({args.images}, 3, 224, 224), np.uint8,
     lambda r, s: r.integers(0, 256, size=s, dtype=np.uint8))
fill(os.path.join(d, 'x.npy'), ({args.rows}, 64), np.float32,
     lambda r, s: r.standard_normal(s, dtype=np.float32))
fill(os.path.join(d, 'y.npy'), ({args.rows},), np.int64,
     lambda r, s: r.integers(0, 1000, size=s))
longshore.datasets.write_synthetic_folder(os.path.join(d, 'jpegs'), classes=100,
    per_class={args.jpegs} // 100, mean_area=110_000, quality=90, seed=0x13A6E)
"""
    subprocess.run([sys.executable, "-c", code], check=True, env=env_for(site))


def env_for(site):
    env = dict(os.environ)
    env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run(args, name, site, workload):
    cfg = dict(workload=workload, data=args.data, workers=args.workers, epochs=args.epochs)
    p = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)],
                       env=env_for(site), capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0:
        # Said either way; a run that measured before it failed (a crash at exit) still counts.
        sys.stderr.write(f"{name} {workload}: exit {p.returncode} "
                         f"({'after' if lines else 'before'} its result)\n{p.stderr[-3000:]}\n")
    if not lines:
        return None
    r = json.loads(lines[-1])
    r["exit"] = p.returncode
    print(f"  {workload:14s} {name:5s} python {r['python']:12,.0f}/s  rust {r['rust']:12,.0f}/s",
          flush=True)
    return r


def summary(results, names):
    base, new = names
    rows = []
    for w in sorted({k[1] for k in results}):
        row = dict(workload=w)
        for side in ("python", "rust"):
            med = {}
            for n in names:
                xs = [r[side] for r in results.get((n, w), [])]
                if not xs:
                    continue
                med[n] = statistics.median(xs)
                row[f"{n}_{side}"] = dict(median=med[n], min=min(xs), max=max(xs), runs=len(xs))
            if base in med and new in med:
                row[f"ratio_{side}"] = med[new] / med[base]
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--site", action="append", default=[],
                    help="NAME=FOLDER, twice: the base wheel's, then the new one's")
    ap.add_argument("--data", default="/tmp/wheel-ab")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--images", type=int, default=8192, help="rows of images.npy")
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows of the tabular files")
    ap.add_argument("--jpegs", type=int, default=4096)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child is not None:
        return child(json.loads(args.child))
    sites = [s.split("=", 1) for s in args.site]
    if len(sites) != 2 or any(len(s) != 2 for s in sites):
        ap.error("give --site base=FOLDER --site new=FOLDER")
    names = [n for n, _ in sites]
    make_data(args, sites[1][1])
    results = {}
    for r in range(args.rounds):
        order = sites if r % 2 == 0 else sites[::-1]
        print(f"round {r + 1}: {' '.join(n for n, _ in order + order[::-1])}", flush=True)
        for w in args.workloads.split(","):
            for name, site in order + order[::-1]:
                got = run(args, name, site, w)
                if got is not None:
                    results.setdefault((name, w), []).append(got)
    rows = summary(results, names)
    print(f"\n| workload | {names[0]} python | {names[1]} python | ratio | "
          f"{names[0]} rust | {names[1]} rust | ratio |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        cells = [row["workload"]]
        for side in ("python", "rust"):
            for n in names:
                m = row.get(f"{n}_{side}")
                cells.append(f"{m['median']:,.0f} ({m['min']:,.0f}-{m['max']:,.0f})" if m else "-")
            ratio = row.get(f"ratio_{side}")
            cells.append(f"{ratio:.3f}x" if ratio else "-")
        print("| " + " | ".join(cells) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(args=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
