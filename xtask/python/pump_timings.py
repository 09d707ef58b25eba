#!/usr/bin/env python3
"""Where an epoch's per-batch time goes, on the host path (no GPU needed): the epoch thread
(the *pump*: the loader's next(), the position, the hand-over to the queue; the DLPack export runs in `__next__`)
and Python's `__next__` (waiting, conversion).

The tabular workload of the python bench: f32 [N, 64] + i64 [N] memmapped, batch 1024,
shuffled, drop_last, persistent workers, pin_memory=True. Per case, the best of --repeats runs
of --epochs epochs (after one warm-up epoch), in microseconds per batch:

  wall     : time.perf_counter
  process  : CPU time of the whole process (time.process_time: workers included)
  py-cpu   : CPU time of the Python thread (time.thread_time; its polling included)
  with LONGSHORE_EPOCH_TIMINGS=1 (set by this script), the epoch's own counters
  (`_Epoch._debug_timings()`): the epoch thread's CPU time, pump next / state / send, `__next__` export / wait / deliver (deliver includes the export),
  and the share of `__next__` calls that found no batch ready.

Cases: raw (longshore.Tensor lists, no conversion), numpy (np.from_dlpack per tensor) and, with
torch installed, fast (the DataLoader's own converter: `_TorchConverter`, a batch per Rust call).
With --device cuda the batches go to the GPU (the loader's device prefetcher runs in the pump's
next()); the cases are then raw and fast.

Usage: python pump_timings.py [--rows 1048576] [--batch 1024] [--workers 4,8] [--repeats 5]
       [--device cuda] [--cases raw,numpy,fast]
"""
import argparse
import os
import tempfile
import time

os.environ.setdefault("LONGSHORE_EPOCH_TIMINGS", "1")

import numpy as np  # noqa: E402

import longshore  # noqa: E402

def make(dirname, rows):
    x = os.path.join(dirname, f"pt_x_{rows}.npy")
    y = os.path.join(dirname, f"pt_y_{rows}.npy")
    if not os.path.exists(x) or not os.path.exists(y):
        rng = np.random.default_rng(0)
        np.save(x, rng.random((rows, 64), dtype=np.float32))
        np.save(y, rng.integers(0, 1000, size=rows, dtype=np.int64))
    return [x, y]


def one(dl, convert, acc):
    it = dl._loader.epoch(convert) if convert is not None else dl._loader.epoch()
    n = 0
    for _ in it:
        n += 1
    t = it._debug_timings() if hasattr(it, "_debug_timings") else None
    if t and acc is not None:
        # The epoch thread records its CPU time as it ends, just after it sent the end.
        end = time.monotonic() + 1.0
        while not it._debug_timings()["pump_cpu_ns"] and time.monotonic() < end:
            time.sleep(0.001)
        for k, v in it._debug_timings().items():
            acc[k] = acc.get(k, 0) + v
    return n


def run(dl, convert, epochs):
    one(dl, convert, None)  # warm-up
    acc = {}
    n = 0
    t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(epochs):
        n += one(dl, convert, acc)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    py = time.thread_time() - m0
    return n, wall / n * 1e6, py / n * 1e6, acc, cpu / n * 1e6


def report(nw, case, runs):
    best = min(runs, key=lambda r: r[1])
    n, wall, _, acc, _ = best
    py = min(r[2] for r in runs)
    cpu = min(r[4] for r in runs)
    if acc:
        b = acc["pumped"] or 1
        d = acc["delivered"] or 1
        def us(k, per):
            return f"{acc[k] / per / 1000:.2f}"

        cells = " | ".join([
            us("pump_cpu_ns", b),
            f"{us('pump_next_ns', b)} ({us('pump_next_cpu_ns', b)})",
            us("upload_ns", d), us("export_ns", d), us("pump_state_ns", b),
            f"{us('pump_send_ns', b)} ({us('pump_send_cpu_ns', b)})",
            us("next_wait_ns", d), us("next_deliver_ns", d)])
        cells += f" | {100 * acc['next_waits'] / d:.0f}"
    else:
        cells = " | ".join("-" for _ in range(9))
    print(f"| {nw} | {case} | {wall:.1f} | {cpu:.1f} | {py:.1f} | {cells} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--workers", default="4,8")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cases", default=None, help="default: raw,numpy (host), raw,fast (cuda)")
    ap.add_argument("--device", default=None, help="e.g. cuda: batches on the GPU")
    ap.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "longshore-pt"))
    ap.add_argument("--copies", default="split",
                    help="with --device: who enqueues small batches' copies, comma-separated, "
                         "alternated run by run: split (__next__) and/or pump (the epoch thread, "
                         "LONGSHORE_UPLOAD_IN_PUMP=1)")
    args = ap.parse_args()
    if args.cases is None:
        args.cases = "raw,fast" if args.device else "raw,numpy"
    os.makedirs(args.data_dir, exist_ok=True)
    ds = longshore.NpyDataset(make(args.data_dir, args.rows))
    print(f"rows={args.rows} batch={args.batch} epochs={args.epochs} repeats={args.repeats} "
          f"cores={os.cpu_count()}")
    print("| workers | case | wall us | process cpu us | py-cpu us | pump-cpu us | pump next (cpu) | upload | export | state | send (cpu) | "
          "next wait | deliver | waited % |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for nw in [int(w) for w in args.workers.split(",")]:
        torchy = args.device is not None or "fast" in args.cases
        dl = longshore.DataLoader(ds, batch_size=args.batch, num_workers=nw, shuffle=True,
                                  drop_last=True, persistent_workers=True, seed=0,
                                  pin_memory=True, device=args.device,
                                  framework="torch" if torchy else "numpy")
        for case in args.cases.split(","):
            convert = {"raw": None, "numpy": np.from_dlpack}.get(case, dl._convert)
            modes = args.copies.split(",") if args.device else ["host"]
            by_mode = {m: [] for m in modes}
            for _ in range(args.repeats):
                for m in modes:
                    os.environ["LONGSHORE_UPLOAD_IN_PUMP"] = "1" if m == "pump" else "0"
                    by_mode[m].append(run(dl, convert, args.epochs))
            for m in modes:
                report(nw, case if m == "host" else f"{case}, copies: {m}", by_mode[m])


if __name__ == "__main__":
    main()
