#!/usr/bin/env python3
"""ResNet-18 (torchvision, bf16 autocast, channels_last, SGD) trained from Python on an
ImageNet-like JPEG folder, fed by torch's DataLoader or by longshore, to see whether the GPU
waits for data in a real training step.

    python3 examples/python/train_resnet.py --loader longshore --decode nvjpeg
    python3 examples/python/train_resnet.py --loader torch
    python3 examples/python/train_resnet.py --loader synthetic   # the model alone, data on the GPU
    python3 examples/python/train_resnet.py --loader longshore --decode nvjpeg --no-model
    python3 examples/python/train_resnet.py --step captured      # the step in a CUDA graph
    python3 examples/python/train_resnet.py --model resnet50
    torchrun --nproc-per-node 2 examples/python/train_resnet.py --ddp
    python3 xtask/python/resnet_matrix.py                        # the configurations together

``--step captured`` (one GPU) replays the whole training step (forward, backward, optimizer) as
one CUDA graph (torch.cuda.graphs' whole-network capture: static input buffers the batch is copied
into), so the Python thread launches one graph a step instead of hundreds of kernels: what is
left of the gap to the synthetic rate is then the loader's, not the launch path's. ``--ddp``
runs one process per GPU under torchrun (NCCL, DistributedDataParallel, each rank its share
of the folder: torch's DistributedSampler, longshore's ``data.DistributedSampler``); the
images/s are all ranks' together. The JSON line also gives the CPU time the machine spent per
1,000 images over the timed epochs (all its cores' busy time: workers, decoding, the training
process).

The folder (default: 10,000 JPEGs in 100 classes, about 400x350 and 110 KB each) is generated
once by longshore's synthetic writer. Steady state: one warm-up epoch, then `--epochs` whole
epochs timed. `--no-model` times the loader alone (what the GPU would get if the model took no
time). Prints one JSON line: images/s, the share of the step's time spent waiting for data.
Needs torch, torchvision (for the model and the torch baseline) and the longshore package.
"""

import argparse
import json
import os
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loader", choices=["torch", "longshore", "synthetic"], default="longshore")
    p.add_argument("--decode", choices=["cpu", "nvjpeg"], default="nvjpeg")
    p.add_argument("--data", default="target/train-resnet/data", help="the JPEG folder")
    p.add_argument("--images", type=int, default=10_000, help="images in a generated folder")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 8)
    p.add_argument("--epochs", type=int, default=2, help="timed epochs after the warm-up one")
    p.add_argument("--no-model", action="store_true", help="time the loader alone")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker-priority", choices=["normal", "background"], default="normal",
                   help="longshore's worker threads' scheduling class")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="after the timed epochs, profile STEPS steps (torch.profiler, CUPTI) and "
                        "report what the GPU's compute stream waits for")
    p.add_argument("--trace", default="target/train-resnet/trace.json",
                   help="where --profile writes its Chrome trace")
    p.add_argument("--model", choices=["resnet18", "resnet50"], default="resnet18")
    p.add_argument("--step", choices=["eager", "captured"], default="eager",
                   help="captured: the training step replayed as one CUDA graph (one GPU)")
    p.add_argument("--ddp", action="store_true",
                   help="one process per GPU under torchrun (NCCL, DistributedDataParallel)")
    p.add_argument("--sched", choices=["auto", "spin", "yield", "blocking"], default="auto",
                   help="how the CUDA context's host threads wait for the GPU (the primary "
                        "context's CU_CTX_SCHED_* flag, set before torch creates it): spin "
                        "polls, blocking sleeps on an OS primitive")
    return p.parse_args()


def cpu_jiffies():
    """Busy and total jiffies of the whole machine (/proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(v) - v[3] - v[4], sum(v)


def set_sched(mode, ordinal):
    """Sets the primary context's scheduling flag on `ordinal` before anything creates it (torch
    and longshore share that context): how a thread blocked in a synchronisation waits. The
    driver's default (auto) spins while there are fewer active contexts than cores."""
    if mode == "auto":
        return
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    flag = {"spin": 1, "yield": 2, "blocking": 4}[mode]
    dev = ctypes.c_int()
    for call, rc in (("cuInit", cuda.cuInit(0)),
                     ("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), ordinal)),
                     ("cuDevicePrimaryCtxSetFlags",
                      cuda.cuDevicePrimaryCtxSetFlags_v2(dev, flag))):
        if rc != 0:
            raise RuntimeError(f"{call} failed with CUresult {rc} (setting --sched {mode})")


def distributed(args):
    """(rank, world size, local rank): torchrun's, with the NCCL process group up (--ddp), or
    a single process."""
    if not args.ddp:
        return 0, 1, 0
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    return dist.get_rank(), dist.get_world_size(), local


MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def folder(args):
    import longshore

    classes = 100
    per_class = max(1, args.images // classes)
    t = time.perf_counter()
    # jpeg-bench's folder (FolderSpec::imagenet_like): the same files for both; reused when present.
    images, nbytes, reused = longshore.datasets.write_synthetic_folder(
        args.data, classes=classes, per_class=per_class, mean_area=140_000, quality=90, seed=0x13A6E)
    if not reused:
        print(f"generated {images} JPEGs ({nbytes / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s",
              flush=True)
    return args.data


def torch_loader(args, root):
    import torch
    import torchvision.datasets as D
    import torchvision.transforms as T

    ds = D.ImageFolder(root, T.Compose([
        T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]))
    sampler = (torch.utils.data.distributed.DistributedSampler(ds, shuffle=True)
               if args.ddp else None)
    # An expert's configuration: all workers, pinned memory, persistent workers, deeper prefetch.
    dl = torch.utils.data.DataLoader(
        ds, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler,
        num_workers=args.workers, pin_memory=True, persistent_workers=True, prefetch_factor=4,
        drop_last=True)
    count = [0]

    def epoch():
        if sampler is not None:
            sampler.set_epoch(count[0])
        count[0] += 1
        for x, y in dl:
            yield x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    return epoch


def longshore_loader(args, root):
    import longshore
    import longshore.transforms as T

    ds = longshore.datasets.ImageFolder(root, T.Compose([
        T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]))
    # Each rank its share of the folder (the loader's epoch reaches the sampler).
    sampler = longshore.data.DistributedSampler(ds, shuffle=True) if args.ddp else None
    dl = longshore.DataLoader(
        ds, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler,
        num_workers=args.workers, persistent_workers=True, drop_last=True, seed=args.seed,
        device=f"cuda:{args.local_rank}", decode=args.decode,
        worker_priority=args.worker_priority)
    count = [0]

    def epoch():
        dl.set_epoch(count[0])  # the loader's order and the sampler's
        count[0] += 1
        return iter(dl)
    return epoch


def synthetic_loader(args, _root):
    import torch

    steps = args.images // args.batch_size // args.world_size
    x = torch.randn(args.batch_size, 3, 224, 224, device="cuda")
    y = torch.randint(0, 100, (args.batch_size,), device="cuda")

    def epoch():
        for _ in range(steps):
            yield x, y
    return epoch


def union(intervals):
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def overlap(a, b):
    """Length of the intersection of two interval unions."""
    return union(a) + union(b) - union(a + b)


def gpu_profile(args, epoch, step):
    """Runs `args.profile` steps under torch.profiler (CUDA activity from CUPTI: every kernel and
    copy of the process, nvJPEG's and longshore's included) and says where the GPU's time went:
    the share of the window the training stream (the one with the most kernel time) computes,
    what runs on other streams (decode, crop/resize, copies) and how much of that overlaps
    the training kernels (SMs shared), and the host's wait for data."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    it = epoch()
    for _ in range(3):  # the profiled window starts in steady state
        x, y = next(it)
        if step is not None:
            step(x, y)
    torch.cuda.synchronize()
    waited, launch = 0.0, 0.0
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(args.profile):
            t = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                it = epoch()
                x, y = next(it)
            waited += time.perf_counter() - t
            t = time.perf_counter()
            if step is not None:
                step(x, y)
            launch += time.perf_counter() - t
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    for _ in it:  # finish the epoch so that the loader's threads end cleanly
        pass
    os.makedirs(os.path.dirname(args.trace) or ".", exist_ok=True)
    prof.export_chrome_trace(args.trace)
    with open(args.trace) as f:
        trace = json.load(f)
    streams = {}
    for ev in trace.get("traceEvents", []):
        cat = ev.get("cat", "")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset") or "dur" not in ev:
            continue
        stream = ev.get("args", {}).get("stream", ev.get("tid"))
        streams.setdefault(stream, []).append((ev["ts"], ev["ts"] + ev["dur"], cat, ev.get("name", "")))
    if not streams:
        return {"error": "no CUDA activity recorded (CUPTI unavailable?)"}
    busy = {k: union([(s, e) for s, e, _, _ in v]) for k, v in streams.items()}
    train = max(busy, key=busy.get)
    start = min(s for v in streams.values() for s, _, _, _ in v)
    end = max(e for v in streams.values() for _, e, _, _ in v)
    window = end - start
    train_iv = [(s, e) for s, e, _, _ in streams[train]]
    other = {}
    for k, v in streams.items():
        if k == train:
            continue
        for s, e, cat, name in v:
            kind = ("copy" if cat == "gpu_memcpy" else "memset" if cat == "gpu_memset"
                    else "nvjpeg" if "nvjpeg" in name.lower() or "jpeg" in name.lower()
                    else "longshore" if "longshore" in name.lower() or "crop" in name.lower()
                    or "resize" in name.lower() else "other")
            other.setdefault(kind, []).append((s, e))
    # The training stream's idle time, split by what else the GPU did meanwhile: idle while
    # another stream decoded or copied (the step waited on the GPU for its batch's event), or
    # idle with no kernel or copy anywhere (waiting for the host, or for nvJPEG's hardware
    # engines, whose work is not a kernel).
    gaps, last = [], None
    for s_, e_ in sorted(train_iv):
        if last is not None and s_ > last:
            gaps.append((last, s_))
        last = e_ if last is None else max(last, e_)
    others = [iv for v in other.values() for iv in v]
    gap_total = union(gaps)
    gap_other = overlap(gaps, others) if others and gaps else 0.0
    # Host-side CUDA calls (runtime and driver API), by total time: where the host blocked;
    # and by thread (the training thread's launches against the decode thread's calls).
    api, threads = {}, {}
    for ev in trace.get("traceEvents", []):
        if ev.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in ev:
            name = ev.get("name", "")
            api[name] = api.get(name, 0.0) + ev["dur"]
            t = threads.setdefault(ev.get("tid"), {"calls": 0, "ms": 0.0, "top": {}})
            t["calls"] += 1
            t["ms"] += ev["dur"] / 1e3
            t["top"][name] = t["top"].get(name, 0.0) + ev["dur"] / 1e3
    by_thread = []
    for tid, t in sorted(threads.items(), key=lambda kv: -kv[1]["calls"])[:4]:
        top3 = sorted(t["top"].items(), key=lambda kv: -kv[1])[:4]
        by_thread.append({"tid": tid, "calls_per_step": t["calls"] / args.profile,
                          "ms": round(t["ms"], 1),
                          "top_ms": {k: round(v, 1) for k, v in top3}})
    top = {}
    for k, v in streams.items():
        for s, e, cat, name in v:
            if k != train and cat == "kernel":
                top[name[:60]] = top.get(name[:60], 0.0) + (e - s)
    return {
        "steps": args.profile,
        "wall_ms": 1e3 * wall,
        "gpu_window_ms": window / 1e3,
        "train_stream_busy": busy[train] / window,
        "host_waited_for_data": waited / wall,
        "other_streams_ms": {k: union(v) / 1e3 for k, v in other.items()},
        "other_overlapping_training_ms": {k: overlap(v, train_iv) / 1e3 for k, v in other.items()},
        "train_idle_ms": gap_total / 1e3,
        "train_idle_while_other_streams_busy_ms": gap_other / 1e3,
        "host_step_launch_ms": 1e3 * launch / args.profile,
        "top_host_cuda_calls_ms": dict(sorted(((k, v / 1e3) for k, v in api.items()),
                                              key=lambda kv: -kv[1])[:8]),
        "host_cuda_calls_by_thread": by_thread,
        "top_other_kernels_ms": dict(sorted(((k, v / 1e3) for k, v in top.items()),
                                            key=lambda kv: -kv[1])[:8]),
        "trace": args.trace,
    }


def make_step(args):
    """The training step: eager, or (``--step captured``) the whole step captured once in a
    CUDA graph over static input buffers, each call copying the batch in and replaying it."""
    import torch
    import torchvision

    model = getattr(torchvision.models, args.model)(num_classes=100).cuda()
    model = model.to(memory_format=torch.channels_last)
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    def eager(x, y):
        x = x.contiguous(memory_format=torch.channels_last)
        # cache_enabled=False: autocast's weight cache may not outlive a graph capture.
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=args.step == "eager"):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    if args.step == "eager":
        return eager
    static_x = torch.randn(args.batch_size, 3, 224, 224, device="cuda")
    static_x = static_x.contiguous(memory_format=torch.channels_last)
    static_y = torch.randint(0, 100, (args.batch_size,), device="cuda")
    # Warm-up on a side stream (cuDNN's choices, the optimizer's state), then the capture, as
    # torch.cuda.graphs documents.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager(static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = eager(static_x, static_y)

    def captured(x, y):
        static_x.copy_(x)  # channels_last from the batch's layout, one copy kernel
        static_y.copy_(y)
        graph.replay()
        return static_loss
    return captured


def main():
    args = parse()
    if args.ddp and args.step == "captured":
        # Capturing DistributedDataParallel's step failed on torch 2.11 (h200-x2, 2026-11-28:
        # "operation would make the legacy stream depend on a capturing blocking stream"
        # during the capture, with synthetic data too): not a data-loading question.
        raise SystemExit("--step captured is for one GPU: capturing a DDP step needs torch's "
                         "own CUDA-graph support for DDP (static graph, NCCL on the side "
                         "stream), which this example does not set up")
    set_sched(args.sched, int(os.environ.get("LOCAL_RANK", "0")))
    import torch

    args.rank, args.world_size, args.local_rank = distributed(args)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = True
    root = None
    if args.loader != "synthetic":
        # Rank 0 writes the folder (once), the other ranks then find it.
        if args.rank == 0:
            root = folder(args)
        if args.ddp:
            torch.distributed.barrier()
        root = root or folder(args)
    make = {"torch": torch_loader, "longshore": longshore_loader, "synthetic": synthetic_loader}
    epoch = make[args.loader](args, root)
    step = None if args.no_model else make_step(args)

    rates, waits, cpu = [], [], []
    for e in range(args.epochs + 1):
        seen, waited = 0, 0.0
        torch.cuda.synchronize()
        if args.ddp:
            torch.distributed.barrier()
        t0, jiffies = time.perf_counter(), cpu_jiffies()
        it = epoch()
        while True:
            t = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - t
            if step is not None:
                step(x, y)
            seen += x.shape[0]
        torch.cuda.synchronize()
        if args.ddp:
            # Every rank's images, over the slowest rank's time.
            total = torch.tensor([seen], device="cuda")
            torch.distributed.all_reduce(total)
            torch.distributed.barrier()
            seen = int(total.item())
        wall = time.perf_counter() - t0
        now = cpu_jiffies()
        if e > 0:  # the first epoch warms up (workers, cuDNN, nvJPEG states)
            rates.append(seen / wall)
            waits.append(waited / wall)
            if jiffies is not None and now is not None and now[1] > jiffies[1]:
                share = (now[0] - jiffies[0]) / (now[1] - jiffies[1])
                cpu.append(share * (os.cpu_count() or 1) * wall / seen * 1e3)
        if args.rank == 0:
            print(f"epoch {e}{' (warm-up)' if e == 0 else ''}: {seen / wall:,.0f} images/s, "
                  f"waited for data {100 * waited / wall:.1f}% of the time", flush=True)
    profile = gpu_profile(args, epoch, step) if args.profile else None
    if args.rank == 0:
        print(json.dumps({
            "profile": profile,
            "loader": args.loader, "decode": args.decode if args.loader == "longshore" else None,
            "model": None if args.no_model else args.model, "step": args.step,
            "world_size": args.world_size, "workers": args.workers,
            "batch_size": args.batch_size, "sched": args.sched, "images_per_s": sum(rates) / len(rates),
            "wait_fraction": sum(waits) / len(waits),
            "cpu_s_per_1000_images": sum(cpu) / len(cpu) if cpu else None,
            "gpu": torch.cuda.get_device_name(0)}))
    if args.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
