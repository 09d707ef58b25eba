#!/usr/bin/env python3
# H2D copy rate while k CPU threads stream-write host memory (issue 14: do the workers' writes
# of normalised batches take link throughput from the DMA?). usage: python3 xtask/probes/h2d-under-writes.py
import threading, time, torch
n = 147 << 20
dst = torch.empty(n, dtype=torch.uint8, device="cuda")
src = torch.empty(n, dtype=torch.uint8, pin_memory=True); src.fill_(1)
big = torch.empty(2 << 30, dtype=torch.uint8)
big.fill_(0)
def rate(copies=48):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        dst.copy_(src, non_blocking=True); s.synchronize()
        t0 = time.perf_counter()
        for _ in range(copies): dst.copy_(src, non_blocking=True)
        s.synchronize()
    return copies * n / (time.perf_counter() - t0) / 1e9
print("H2D GB/s (147 MiB pinned) while k threads stream-write a 2 GiB buffer (torch fill_), write GB/s")
for k in (0, 2, 4, 8, 12, 16):
    stop = False; written = [0]
    def writer():
        v = 0
        while not stop:
            v = (v + 1) % 250; big.fill_(v); written[0] += big.numel()
    if k:
        torch.set_num_threads(k)
        th = threading.Thread(target=writer); th.start(); time.sleep(0.3)
    w0 = written[0]; t0 = time.perf_counter()
    r = rate()
    wr = (written[0] - w0) / (time.perf_counter() - t0) / 1e9
    stop = True
    if k: th.join()
    print(f"k={k:2d}: H2D {r:5.1f} GB/s, CPU writes {wr:5.1f} GB/s", flush=True)
