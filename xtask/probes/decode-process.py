#!/usr/bin/env python3
"""Probe (issue 38): does decoding in a process of its own, with its own CUDA context, take
nvJPEG's per-image driver calls off the training process and close the gap to the model's
rate on GPU-resident data?

A producer process iterates longshore's `DataLoader(ImageFolder, device="cuda",
decode="nvjpeg")` and hands each batch to the training process through a
`torch.multiprocessing` queue (CUDA IPC: the consumer maps the producer's memory; each batch
is first copied into torch's allocator, whose blocks IPC can share). The two processes'
contexts then share the GPU by time slices (no MPS here). The training process runs
train_resnet.py's eager step and reports images/s and its wait for data, as train_resnet.py
does, beside the same step on GPU-resident data and on the in-process loader, in one call.

    python3 xtask/probes/decode-process.py [--epochs 3] [--workers 16]
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "python"))


def producer(q, done, data, batch_size, workers, epochs):
    import longshore
    import longshore.transforms as T
    import train_resnet

    ds = longshore.datasets.ImageFolder(data, T.Compose([
        T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
        T.Normalize(train_resnet.MEAN, train_resnet.STD)]))
    dl = longshore.DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers,
                              persistent_workers=True, drop_last=True, seed=0, device="cuda",
                              decode="nvjpeg")
    for e in range(epochs):
        dl.set_epoch(e)
        for x, y in dl:
            q.put((x.clone(), y.clone()))
        q.put(None)
    done.wait()


def run(args, source):
    """images/s and wait share over the timed epochs for `source` in ("synthetic", "inprocess",
    "process")."""
    import torch
    import torch.multiprocessing as mp
    import train_resnet

    ns = argparse.Namespace(model="resnet18", ddp=False, step="eager",
                            batch_size=args.batch_size, local_rank=0)
    step = train_resnet.make_step(ns)
    epochs = args.epochs + 1
    if source == "process":
        ctx = mp.get_context("spawn")
        q, done = ctx.Queue(maxsize=4), ctx.Event()
        p = ctx.Process(target=producer, args=(q, done, args.data, args.batch_size,
                                                args.workers, epochs))
        p.start()

        def epoch():
            while (b := q.get()) is not None:
                yield b
    elif source == "inprocess":
        ns2 = argparse.Namespace(batch_size=args.batch_size, ddp=False, workers=args.workers,
                                 seed=0, local_rank=0, decode="nvjpeg",
                                 worker_priority="normal")
        epoch = train_resnet.longshore_loader(ns2, args.data)
    else:
        ns2 = argparse.Namespace(images=args.images, batch_size=args.batch_size, world_size=1)
        epoch = train_resnet.synthetic_loader(ns2, None)
    rates, waits = [], []
    for e in range(epochs):
        torch.cuda.synchronize()
        t0, seen, waited = time.perf_counter(), 0, 0.0
        it = epoch()
        while True:
            t = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            waited += time.perf_counter() - t
            step(x, y)
            seen += x.shape[0]
            del x, y
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        if e > 0:
            rates.append(seen / wall)
            waits.append(waited / wall)
        print(f"{source} epoch {e}: {seen / wall:,.0f} images/s, waited "
              f"{100 * waited / wall:.1f}%", flush=True)
    if source == "process":
        done.set()
        p.join(timeout=60)
    return {"images_per_s": sum(rates) / len(rates), "wait": sum(waits) / len(waits)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="target/train-resnet/data")
    p.add_argument("--images", type=int, default=10_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--only", default="synthetic,inprocess,process")
    args = p.parse_args()
    import train_resnet

    train_resnet.folder(argparse.Namespace(data=args.data, images=args.images))
    import torch

    torch.backends.cudnn.benchmark = True
    out = {s: run(args, s) for s in args.only.split(",")}
    base = out.get("synthetic", {}).get("images_per_s")
    for k, v in out.items():
        if base:
            v["of_synthetic"] = v["images_per_s"] / base
    print(json.dumps(out))


if __name__ == "__main__":
    main()
