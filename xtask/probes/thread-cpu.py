#!/usr/bin/env python3
"""Per-thread CPU sampler for a command (used on the GPU host, where `perf` may be absent).

Runs the command, samples /proc/<pid>/task/*/stat every --interval seconds, and groups the
CPU time of each interval by configuration, read off the thread names: the number of live
`longshore-worker-*` threads is the run's num_workers. Prints, per worker count, the share
of one core used by the consumer (main) thread, the workers together, and every other thread
(driver, pump), plus the number of workers busy more than half the interval.

Also reads each thread's /proc schedstat: "wait" is the time a group's threads were runnable
but waiting for a core (run-queue delay), in cores, so a starved consumer thread shows up.

--worker-nice N re-nices every `longshore-worker-*` thread to N as it appears (an experiment:
does the consumer thread lose its core to the workers?); --worker-batch puts them in
SCHED_BATCH instead.

--states samples every thread's scheduler state every 20 ms and prints, per worker count and
group, where the threads were: running/runnable (R), blocked in I/O or a page fault (D), or
sleeping in a syscall (S: futex, read, poll, ...) or a kernel function (wchan).

usage: thread-cpu.py [--interval S] [--out FILE] [--worker-nice N | --worker-batch] [--states] -- command args...
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
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                wait = int(f.read().split()[1]) / 1e9
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            wait = 0.0
        out[int(tid)] = (name, (int(rest[11]) + int(rest[12])) / TICK, wait)
    return out


SYSCALLS = {"0": "read", "17": "pread64", "202": "futex", "7": "poll", "232": "epoll_wait",
            "230": "nanosleep", "35": "nanosleep", "16": "ioctl", "24": "sched_yield",
            "281": "epoll_pwait", "270": "pselect6", "228": "clock_gettime", "1": "write",
            "9": "mmap", "11": "munmap", "10": "mprotect", "28": "madvise", "3": "close"}


def state_of(pid, tid):
    """(group-independent) state key of one thread: 'R', 'D:<wchan>' or 'S:<syscall>'."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            s = f.read()
        st = s[s.rindex(")") + 2]
        if st == "R":
            return "R"
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            nr = f.read().split()[0]
        if st == "D":
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                return "D:" + (f.read().strip() or nr)
        return st + ":" + SYSCALLS.get(nr, nr)
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError, PermissionError):
        return None


def demote(tid, nice, batch):
    try:
        if batch:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        if nice is not None:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--out")
    ap.add_argument("--worker-nice", type=int)
    ap.add_argument("--worker-batch", action="store_true")
    ap.add_argument("--states", action="store_true")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    p = subprocess.Popen(cmd)
    prev = threads(p.pid)
    agg = collections.defaultdict(lambda: collections.Counter())
    rows = []
    demoted = set()
    demoting = a.worker_nice is not None or a.worker_batch
    states = collections.defaultdict(collections.Counter)
    while p.poll() is None:
        if a.states:
            end = time.time() + a.interval
            while time.time() < end and p.poll() is None:
                cur = threads(p.pid)
                nw = sum(1 for n, _, _ in cur.values() if n.startswith("longshore-work"))
                for tid, (name, _, _) in cur.items():
                    if demoting and name.startswith("longshore-work") and tid not in demoted:
                        demote(tid, a.worker_nice, a.worker_batch)
                        demoted.add(tid)
                    g = "main" if tid == p.pid else ("workers" if name.startswith("longshore-work") else name[:15])
                    k = state_of(p.pid, tid)
                    if k is not None:
                        states[(nw, g)][k] += 1
                time.sleep(0.02)
        elif demoting:
            # Poll often so new workers are demoted quickly; sample on the interval.
            end = time.time() + a.interval
            while time.time() < end and p.poll() is None:
                for tid, (name, _, _) in threads(p.pid).items():
                    if name.startswith("longshore-work") and tid not in demoted:
                        demote(tid, a.worker_nice, a.worker_batch)
                        demoted.add(tid)
                time.sleep(0.01)
        else:
            time.sleep(a.interval)
        cur = threads(p.pid)
        dt = a.interval
        nworkers = sum(1 for n, _, _ in cur.values() if n.startswith("longshore-work"))
        c = collections.Counter()
        busy = 0
        for tid, (name, t, w) in cur.items():
            old = prev.get(tid, (name, t, w))
            d = t - old[1]
            dw = w - old[2]
            if tid == p.pid:
                g = "main"
            elif name.startswith("longshore-work"):
                g = "workers"
                busy += d > 0.5 * dt
            else:
                g = "other"
            c[g] += d
            c[g + "_wait"] += dw
        prev = cur
        rows.append({"t": time.time(), "num_workers": nworkers, **{k: v / dt for k, v in c.items()}, "busy": busy})
        g = agg[nworkers]
        g["intervals"] += 1
        for k, v in c.items():
            g[k] += v / dt
        g["busy"] += busy
    print(f"thread-cpu: exit {p.returncode}", file=sys.stderr)
    print("workers  intervals  main(core)  main-wait  workers(cores)  workers-wait  other(cores)  other-wait  busy-workers")
    for nw in sorted(agg):
        g = agg[nw]
        n = g["intervals"]
        print(f"{nw:7d}  {n:9d}  {g['main']/n:10.2f}  {g['main_wait']/n:9.2f}  {g['workers']/n:14.2f}"
              f"  {g['workers_wait']/n:12.2f}  {g['other']/n:12.2f}  {g['other_wait']/n:10.2f}  {g['busy']/n:12.1f}")
    if a.states:
        print("states (share of samples per group; groups other than main/workers by thread name)")
        for (nw, g) in sorted(states):
            c = states[(nw, g)]
            n = sum(c.values())
            if n < 20:
                continue
            top = ", ".join(f"{k} {v / n:.0%}" for k, v in c.most_common(6))
            print(f"{nw:7d}  {g:15s}  {top}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f)
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
