#!/usr/bin/env python3
"""Token sequences for language models (issue 39): longshore from Rust and from Python against
torch's DataLoader over a memory-mapped ``train.bin`` (nanoGPT's data, tuned as an expert
would) and LitData's ``StreamingDataset`` + ``TokensLoader`` (litgpt's pretraining loader) on
the same tokens, in one call, steady state (one warm-up epoch, then whole epochs timed).

The data: ``--tokens`` u16 tokens in 4 files, documents of random length (mean 600) ended by
GPT-2's ``<|endoftext|>`` (50256). Every loader delivers shuffled sequences of ``--seq-len``
tokens plus the next one (``x, y``), ``--batch`` per batch, pinned (``pin_memory=True``):

* ``longshore rust``: ``TokenSequences`` through the Rust loader (``tokens-bench --json``);
* ``longshore python``: ``longshore.datasets.TokenDataset`` through ``longshore.DataLoader``,
  batches ``{"input_ids", "targets"}`` of int64;
* ``torch memmap``: a map-style dataset over ``np.memmap`` (nanoGPT's ``get_batch`` as a
  Dataset) through ``torch.utils.data.DataLoader``, per sample and with ``__getitems__`` (a
  batch in one numpy gather), persistent workers, the best row;
* ``litdata``: the files ``optimize``d into LitData chunks (``TokensLoader``, not timed), then
  ``StreamingDataset(item_loader=TokensLoader(block_size=seq_len + 1), shuffle=True)`` through
  ``StreamingDataLoader``; each item is the ``seq_len + 1`` tokens (the consumer slices
  ``x, y``), so it delivers half the bytes of the others.

Each row is the best over ``--workers``. Prints a table and writes JSON (``--out``).
Usage: python3 xtask/python/tokens_bench.py [--tokens 33554432] [--seq-len 2048] [--batch 8]
       [--workers 0,2,4] [--rust-bin target/release/tokens-bench] [--quick]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

EOT = 50256


def write_tokens(root, tokens, files=4, seed=0):
    rng = np.random.default_rng(seed)
    paths = []
    per = tokens // files
    for f in range(files):
        t = rng.integers(0, EOT, size=per, dtype=np.uint16)
        # Documents of geometric length (mean 600), each ended by <|endoftext|>.
        ends = np.cumsum(rng.geometric(1 / 600, size=per // 300 + 1))
        t[ends[ends < per]] = EOT
        p = os.path.join(root, f"train-{f}.bin")
        t.tofile(p)
        paths.append(p)
    return paths


def timed(make_iter, epochs, min_secs=1.0):
    """Sequences per second over whole epochs after one warm-up epoch."""
    def run():
        n = 0
        for b in make_iter():
            x = b["input_ids"] if isinstance(b, dict) else (b[0] if isinstance(b, (list, tuple)) else b)
            n += x.shape[0]
        return n

    run()
    t0, n, e = time.perf_counter(), 0, 0
    while e < epochs or time.perf_counter() - t0 < min_secs:
        n += run()
        e += 1
    return n / (time.perf_counter() - t0)


class MemmapTokens(torch.utils.data.Dataset):
    """nanoGPT's ``get_batch`` as a map-style dataset: sequence k is tokens [k L, k L + L + 1)
    of the files' stream (per file, as nanoGPT reads one ``train.bin``)."""

    def __init__(self, paths, seq_len):
        self.paths, self.seq_len = paths, seq_len
        self.maps = None
        sizes = [os.path.getsize(p) // 2 for p in paths]
        self.index = []  # (file, start) of each sequence
        for f, n in enumerate(sizes):
            self.index += [(f, s) for s in range(0, n - seq_len - 1 + 1, seq_len)]
        self.files = np.array([f for f, _ in self.index])
        self.starts = np.array([s for _, s in self.index])

    def _maps(self):
        if self.maps is None:  # per worker process: opened lazily, as nanoGPT reopens
            self.maps = [np.memmap(p, dtype=np.uint16, mode="r") for p in self.paths]
        return self.maps

    def __len__(self):
        return len(self.index)

    def __getitem__(self, k):
        f, s = self.index[k]
        chunk = torch.from_numpy(self._maps()[f][s:s + self.seq_len + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


class MemmapTokensBatched(MemmapTokens):
    """The same with ``__getitems__``: one numpy gather per batch (what an expert writes)."""

    def __getitems__(self, ks):
        maps = self._maps()
        out = np.empty((len(ks), self.seq_len + 1), dtype=np.int64)
        for i, k in enumerate(ks):
            f, s = self.index[k]
            out[i] = maps[f][s:s + self.seq_len + 1]
        t = torch.from_numpy(out)
        return t[:, :-1], t[:, 1:]


def first(batch):
    return batch


def torch_rows(paths, args):
    best = None
    for cls, name in [(MemmapTokens, "per sample"), (MemmapTokensBatched, "__getitems__")]:
        ds = cls(paths, args.seq_len)
        for w in args.workers:
            kw = dict(num_workers=w, pin_memory=True, shuffle=True)
            if w > 0:
                kw.update(persistent_workers=True, prefetch_factor=4)
            if cls is MemmapTokensBatched:
                # __getitems__ returns the whole batch; the collate passes it through.
                kw.update(collate_fn=first)
            loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, **kw)
            make = lambda loader=loader: iter(loader)
            rate = timed(make, args.epochs)
            row = dict(front="torch memmap", variant=name, workers=w, sequences_per_s=rate)
            print(f"  torch memmap {name}, {w} workers: {rate:,.0f} sequences/s", flush=True)
            if best is None or rate > best["sequences_per_s"]:
                best = row
            del loader
    return best


def longshore_rows(paths, args):
    import longshore
    from longshore.datasets import TokenDataset

    ds = TokenDataset(paths, seq_len=args.seq_len)
    best = None
    for w in args.workers:
        loader = longshore.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=w,
                                      pin_memory=True, seed=0)
        rate = timed(lambda: iter(loader), args.epochs)
        print(f"  longshore python, {w} workers: {rate:,.0f} sequences/s", flush=True)
        row = dict(front="longshore python", workers=w, sequences_per_s=rate)
        if best is None or rate > best["sequences_per_s"]:
            best = row
    return best


def rust_rows(root, args):
    cmd = [args.rust_bin, "--dir", root, "--seq-len", str(args.seq_len), "--batch",
           str(args.batch), "--workers", ",".join(map(str, args.workers)), "--epochs",
           str(args.epochs + 1), "--json", "--mixture"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for r in rows:
        print(f"  longshore {r['front']}, {r['workers']} workers: {r['sequences_per_s']:,.0f} "
              "sequences/s", flush=True)
    best = lambda front: max((r for r in rows if r["front"] == front),
                             key=lambda r: r["sequences_per_s"])
    plain = best("rust")
    mixture = best("rust mixture")
    slowest = min((r for r in rows if r["front"].startswith("rust member")),
                  key=lambda r: r["sequences_per_s"])
    print(f"  3-way mixture (5:3:2 of thirds of the files): {mixture['sequences_per_s']:,.0f} "
          f"sequences/s, {mixture['sequences_per_s'] / slowest['sequences_per_s']:.2f}x its "
          f"slowest member alone ({slowest['front']}, {slowest['sequences_per_s']:,.0f})",
          flush=True)
    return dict(front="longshore rust", workers=plain["workers"],
                sequences_per_s=plain["sequences_per_s"],
                mixture=dict(sequences_per_s=mixture["sequences_per_s"],
                             workers=mixture["workers"],
                             slowest_member=slowest["sequences_per_s"]))


def litdata_docs(path):
    """The documents of one token file (what LitData's optimize stores): picklable for its
    worker processes."""
    t = np.fromfile(path, dtype=np.uint16)
    start = 0
    for e in np.flatnonzero(t == EOT):
        yield torch.from_numpy(t[start:e + 1].astype(np.int64))
        start = e + 1
    if start < len(t):
        yield torch.from_numpy(t[start:].astype(np.int64))


def litdata_rows(paths, root, args):
    try:
        import litdata
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader, optimize
    except ImportError as e:
        print(f"  litdata: not installed ({e}); skipped", flush=True)
        return None
    out = os.path.join(root, "litdata")

    t0 = time.perf_counter()
    optimize(fn=litdata_docs, inputs=paths, output_dir=out, chunk_bytes="64MB",
             item_loader=TokensLoader(), num_workers=1, mode="overwrite")
    print(f"  litdata: optimize took {time.perf_counter() - t0:.1f} s (not timed below)", flush=True)
    best = None
    for w in args.workers:
        ds = StreamingDataset(input_dir=out, item_loader=TokensLoader(block_size=args.seq_len + 1),
                              shuffle=True, seed=0)
        loader = StreamingDataLoader(ds, batch_size=args.batch, num_workers=w, pin_memory=True)
        rate = timed(lambda: iter(loader), args.epochs)
        print(f"  litdata {litdata.__version__}, {w} workers: {rate:,.0f} sequences/s", flush=True)
        row = dict(front="litdata", workers=w, sequences_per_s=rate)
        if best is None or rate > best["sequences_per_s"]:
            best = row
        del loader
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=32 << 20)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", default="0,2,4")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--rust-bin", default="target/release/tokens-bench")
    p.add_argument("--only", default="rust,longshore,torch,litdata")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.quick:
        args.tokens, args.epochs = 4 << 20, 1
    args.workers = [int(w) for w in args.workers.split(",")]
    only = set(args.only.split(","))
    cores = os.cpu_count()
    print(f"tokens_bench: {args.tokens:,} tokens, sequences of {args.seq_len} (+1), batch "
          f"{args.batch}, workers {args.workers}, {cores} cores, torch {torch.__version__}",
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        paths = write_tokens(root, args.tokens)
        if "rust" in only and os.path.exists(args.rust_bin):
            rows.append(rust_rows(root, args))
        if "longshore" in only:
            rows.append(longshore_rows(paths, args))
        if "torch" in only:
            rows.append(torch_rows(paths, args))
        if "litdata" in only:
            r = litdata_rows(paths, root, args)
            if r:
                rows.append(r)
    print(f"\n| loader | best workers | sequences/s | tokens/s | vs litdata | vs torch memmap |")
    print("| --- | --- | --- | --- | --- | --- |")
    ref = {r["front"]: r["sequences_per_s"] for r in rows}
    for r in rows:
        rate = r["sequences_per_s"]
        vs = lambda k: f"{rate / ref[k]:.1f}x" if k in ref else "-"
        print(f"| {r['front']}{' (' + r['variant'] + ')' if 'variant' in r else ''} | "
              f"{r['workers']} | {rate:,.0f} | {rate * args.seq_len / 1e6:,.1f} M | "
              f"{vs('litdata')} | {vs('torch memmap')} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(args=vars(args), cores=cores, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
