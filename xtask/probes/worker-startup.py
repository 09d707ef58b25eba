#!/usr/bin/env python3
"""Where worker start-up goes, longshore against torch's DataLoader (issue 27's start-up
target): for 16 workers and each start method, the time from ``iter()`` to each worker's
``worker_init_fn`` (the process is up, the dataset unpickled, seeds set), to its first
``__getitem__``, and to the first batch in the main process. Each worker appends its
timestamps to a file named by the run; the main process reads them after the first batch.

Each (start method, loader) runs in a fresh process of its own (a fork server, once started,
serves every later loader of its process, so the first loader would pay for both).

Usage: python3 xtask/probes/worker-startup.py [--workers 16] [--reps 3] [--methods spawn,forkserver]
"""
import argparse
import functools
import glob
import os
import statistics
import tempfile
import time

import torch

import longshore

# One folder for the main process and its workers (spawned workers import this file again).
OUT = os.environ.setdefault("LS_STARTUP_DIR", tempfile.mkdtemp(prefix="ls-startup-"))


def mark(tag, run):
    with open(os.path.join(OUT, f"{run}-{os.getpid()}"), "a") as f:
        f.write(f"{tag} {time.time()}\n")


def init(run, worker_id):
    mark("init", run)


class Small:
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.first = False
        self.run = "x"

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if not self.first:
            self.first = True
            mark("get", self.run)
        return self.x[i], self.y[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", default="spawn,forkserver")
    ap.add_argument("--one", nargs=2, metavar=("METHOD", "LOADER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is None:
        import subprocess
        import sys

        for method in args.methods.split(","):
            for name in ("torch", "longshore"):
                subprocess.run([sys.executable, __file__, "--workers", str(args.workers),
                                "--reps", str(args.reps), "--one", method, name], check=True)
        return
    ds = Small(256 * args.workers)
    for method in [args.one[0]]:
        rows = {}
        for rep in range(args.reps):
            for name in [args.one[1]]:
                run = f"{method}-{name}-{rep}"
                ds.run = run
                cls = torch.utils.data.DataLoader if name == "torch" else longshore.DataLoader
                dl = cls(ds, batch_size=256, num_workers=args.workers,
                         multiprocessing_context=method,
                         worker_init_fn=functools.partial(init, run))
                t0 = time.time()
                it = iter(dl)
                t_iter = time.time()
                next(it)
                t_first = time.time()
                time.sleep(0.5)  # the other workers' marks
                del it, dl
                inits, gets = [], []
                for path in glob.glob(os.path.join(OUT, f"{run}-*")):
                    for line in open(path):
                        tag, t = line.split()
                        (inits if tag == "init" else gets).append(float(t) - t0)
                r = rows.setdefault(name, [])
                r.append((t_iter - t0, min(inits), statistics.median(inits), max(inits),
                          min(gets) if gets else float("nan"), t_first - t0))
        for name, r in rows.items():
            mean = [statistics.mean(c) for c in zip(*r)]
            print(f"{method:10s} {name:9s} iter {mean[0]:.3f}  init min/med/max "
                  f"{mean[1]:.3f}/{mean[2]:.3f}/{mean[3]:.3f}  first get {mean[4]:.3f}  "
                  f"first batch {mean[5]:.3f} s  (mean of {len(r)})", flush=True)


if __name__ == "__main__":
    main()
