#!/usr/bin/env python3
"""A user's torchvision ImageFolder through longshore against torch's DataLoader, each loader in
a fresh interpreter (issue 35): no warm thread pool, cache or fork server from an earlier loader.

Each configuration runs in a child process of its own, which imports torch and torchvision,
builds ``torchvision.datasets.ImageFolder`` (PIL decode, RandomResizedCrop(224),
RandomHorizontalFlip, ToTensor, Normalize) over the same generated JPEG folder, and reports:

* ``first_batch_s``: from ``iter(loader)`` to the first batch on the device;
* ``images_per_s``: steady state, whole epochs after one warm-up epoch (synchronised);
* ``peak_pss``: the peak proportional set size of the whole process tree (the child and every
  descendant: workers, fork server), from ``/proc/PID/smaps_rollup`` sampled every second by
  this (parent) process.

torch is tuned as an expert would: 16 workers, ``pin_memory=True``, persistent workers,
``prefetch_factor`` 2 and 4, ``.cuda(non_blocking=True)``; longshore: 16 workers,
``device="cuda"``. Without a GPU both deliver CPU batches (pinned where CUDA is present).

Usage: python3 xtask/python/fresh_bench.py [--data DIR] [--images 4096] [--workers 16]
       [--epochs 2] [--methods fork] [--out FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def child(cfg):
    """One configuration, in this fresh process; prints its JSON result last."""
    t_start = time.perf_counter()
    import torch
    import torchvision.datasets as D
    import torchvision.transforms as T

    import longshore

    cuda = torch.cuda.is_available()
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(MEAN, STD)])
    ds = D.ImageFolder(cfg["data"], tf)
    kw = dict(batch_size=256, shuffle=True, num_workers=cfg["workers"], drop_last=True,
              persistent_workers=True, multiprocessing_context=cfg["method"])
    if cfg["loader"] == "torch":
        dl = torch.utils.data.DataLoader(ds, pin_memory=cuda, prefetch_factor=cfg["prefetch"],
                                         **kw)

        def epoch():
            for x, y in dl:
                yield (x.cuda(non_blocking=True), y.cuda(non_blocking=True)) if cuda else (x, y)
    else:
        dl = longshore.DataLoader(ds, pin_memory=True, device="cuda" if cuda else None, **kw)

        def epoch():
            return iter(dl)

    t_imported = time.perf_counter()
    it = epoch()
    x, y = next(it)
    if cuda:
        torch.cuda.synchronize()
    first = time.perf_counter() - t_imported
    n = x.shape[0] + sum(b[0].shape[0] for b in it)  # the rest of the warm-up epoch
    if cuda:
        torch.cuda.synchronize()
    t0, n, e = time.perf_counter(), 0, 0
    while e < cfg["epochs"] or time.perf_counter() - t0 < 2.0:
        for b in epoch():
            n += b[0].shape[0]
        if cuda:
            torch.cuda.synchronize()
        e += 1
    rate = n / (time.perf_counter() - t0)
    print(json.dumps({"first_batch_s": first, "images_per_s": rate, "epochs": e,
                      "import_s": t_imported - t_start}), flush=True)


def tree(root):
    """``root`` and its live descendants."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == p and pid not in out:
                out.add(pid)
                frontier.append(pid)
    return out


def pss(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def measure(cfg):
    """Runs ``cfg`` in a fresh interpreter, sampling its tree's PSS; returns the result row."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(cfg)],
                            stdout=subprocess.PIPE, text=True)
    peak = [0]

    def sample():
        # Every second: reading smaps_rollup walks each process's page tables under its
        # mmap lock, which a faster sampling would make the measured processes wait for.
        while proc.poll() is None:
            peak[0] = max(peak[0], pss(tree(proc.pid)))
            time.sleep(1.0)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        for pid in tree(proc.pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        raise SystemExit(f"{cfg['loader']} ({cfg['method']}) ran past 300 s")
    t.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cfg} failed with exit {proc.returncode}")
    row = dict(cfg)
    row.pop("data")
    row.update(json.loads(out.strip().splitlines()[-1]))
    row["peak_pss_gb"] = peak[0] / 1e9
    print(f"  {row}", file=sys.stderr, flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", default="target/fresh-bench/jpegs")
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--methods", default="fork")
    ap.add_argument("--out", default="target/fresh-bench/results.json")
    args = ap.parse_args()
    if args.child is not None:
        return child(json.loads(args.child))
    import longshore

    if not os.path.isdir(args.data):
        longshore.datasets.write_synthetic_folder(
            args.data, classes=100, per_class=max(1, args.images // 100), mean_area=140_000,
            quality=90, seed=0x13A6E)
    rows = []
    for method in args.methods.split(","):
        base = dict(data=os.path.abspath(args.data), workers=args.workers, epochs=args.epochs,
                    method=method)
        for pf in (2, 4):
            rows.append(measure(dict(base, loader="torch", prefetch=pf)))
        rows.append(measure(dict(base, loader="longshore", prefetch=None)))
        torch_rows = [r for r in rows if r["loader"] == "torch" and r["method"] == method]
        best = max(torch_rows, key=lambda r: r["images_per_s"])
        for r in rows:
            if r["method"] == method:
                r["vs_torch_best"] = r["images_per_s"] / best["images_per_s"]
                r["first_vs_torch_best"] = r["first_batch_s"] / best["first_batch_s"]
                r["pss_vs_torch_best"] = r["peak_pss_gb"] / best["peak_pss_gb"]
    print("\n== torchvision ImageFolder, each loader in a fresh process "
          f"({args.workers} workers, batch 256)")
    for r in rows:
        print("  " + ", ".join(f"{k}={v:,.3f}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in r.items()))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cores": os.cpu_count(), "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
