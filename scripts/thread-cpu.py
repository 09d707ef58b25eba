#!/usr/bin/env python3
"""Per-thread CPU sampler for a command (used on the GPU host, where `perf` may be absent).

Runs the command, samples /proc/<pid>/task/*/stat every --interval seconds, and groups the
CPU time of each interval by configuration, read off the thread names: the number of live
`longshore-worker-*` threads is the run's num_workers. Prints, per worker count, the share
of one core used by the consumer (main) thread, the workers together, and every other thread
(driver, pump), plus the number of workers busy more than half the interval.

usage: thread-cpu.py [--interval S] [--out FILE] -- command args...
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def threads(pid):
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                s = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        name = s[s.index("(") + 1 : s.rindex(")")]
        rest = s[s.rindex(")") + 2 :].split()
        out[int(tid)] = (name, (int(rest[11]) + int(rest[12])) / TICK)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--out")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    p = subprocess.Popen(cmd)
    prev = threads(p.pid)
    agg = collections.defaultdict(lambda: collections.Counter())
    rows = []
    while p.poll() is None:
        time.sleep(a.interval)
        cur = threads(p.pid)
        dt = a.interval
        nworkers = sum(1 for n, _ in cur.values() if n.startswith("longshore-work"))
        c = collections.Counter()
        busy = 0
        for tid, (name, t) in cur.items():
            d = t - prev.get(tid, (name, t))[1]
            if tid == p.pid:
                c["main"] += d
            elif name.startswith("longshore-work"):
                c["workers"] += d
                busy += d > 0.5 * dt
            else:
                c["other"] += d
        prev = cur
        rows.append({"t": time.time(), "num_workers": nworkers, **{k: v / dt for k, v in c.items()}, "busy": busy})
        g = agg[nworkers]
        g["intervals"] += 1
        for k, v in c.items():
            g[k] += v / dt
        g["busy"] += busy
    print(f"thread-cpu: exit {p.returncode}", file=sys.stderr)
    print("workers  intervals  main(core)  workers(cores)  other(cores)  busy-workers")
    for nw in sorted(agg):
        g = agg[nw]
        n = g["intervals"]
        print(f"{nw:7d}  {n:9d}  {g['main']/n:10.2f}  {g['workers']/n:14.2f}  {g['other']/n:12.2f}  {g['busy']/n:12.1f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f)
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
