#!/usr/bin/env python3
"""Host-to-device copy rate against the number of distinct page-locked source buffers.

The image loader keeps num_workers x prefetch_factor batches (147 MiB each) in flight, so its
copies read from that many distinct page-locked blocks in turn. This copies a 147 MiB batch
64 times round-robin over N buffers (N = 1 .. 64) and reports GB/s, for buffers from
cudaHostAlloc (torch's pin_memory) and for malloc'd memory registered with cudaHostRegister
(what longshore's pool does above 32 MiB). If the rate falls with N, the size of the pinned
working set (address translation on the DMA path), not the CPU work, costs link throughput.

usage: python3 xtask/probes/h2d-working-set.py [--max-buffers 64]
"""
import argparse
import ctypes
import time

import numpy as np
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--max-buffers", type=int, default=64)
ap.add_argument("--mib", type=int, default=147)
a = ap.parse_args()
n_bytes = a.mib << 20
dev = torch.device("cuda")
dst = torch.empty(n_bytes, dtype=torch.uint8, device=dev)
cudart = torch.cuda.cudart()


def pinned(kind, n):
    bufs = []
    for _ in range(n):
        if kind == "cudaHostAlloc":
            t = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=True)
        else:
            arr = np.ones(n_bytes, dtype=np.uint8)
            rc = cudart.cudaHostRegister(arr.ctypes.data, n_bytes, 0)
            assert int(rc) == 0, rc
            t = torch.from_numpy(arr)
            t._keep = arr
        t.fill_(1)
        bufs.append(t)
    return bufs


def rate(bufs, copies=64):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for b in bufs[:4]:
            dst.copy_(b, non_blocking=True)
        s.synchronize()
        t0 = time.perf_counter()
        for i in range(copies):
            dst.copy_(bufs[i % len(bufs)], non_blocking=True)
        s.synchronize()
    return copies * n_bytes / (time.perf_counter() - t0) / 1e9


print(f"{torch.cuda.get_device_name(0)}: H2D GB/s, {a.mib} MiB copies round-robin over N buffers")
for kind in ("cudaHostAlloc", "cudaHostRegister"):
    bufs = pinned(kind, a.max_buffers)
    row = []
    n = 1
    while n <= a.max_buffers:
        row.append(f"N={n}: {rate(bufs[:n]):.1f}")
        n *= 2
    print(f"{kind:17s} " + "  ".join(row), flush=True)
    if kind == "cudaHostRegister":
        for b in bufs:
            cudart.cudaHostUnregister(b._keep.ctypes.data)
    del bufs
