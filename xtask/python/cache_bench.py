"""The shard cache under a budget against MosaicML Streaming's `cache_limit` (issue 36).

Writes MDS shards with Streaming's own `MDSWriter` (20 shards of 100 samples by default), then,
for each budget (in shards), reads the epochs with Streaming (`StreamingDataset(remote=...,
local=..., cache_limit=budget, shuffle_algo="py1br", shuffle_block_size=block)`, least recently
used eviction, its own predownload) and with longshore (`cache-bench --mds`: the same shards,
the same byte budget and block, Belady's rule) and prints the downloads of each epoch.
Streaming's downloads are counted by wrapping `Stream._download_file` (its only way to the
remote), in every worker process.

    python3 -m venv target/streaming-venv
    target/streaming-venv/bin/pip install mosaicml-streaming
    cargo build --release -p longshore-benches --bin cache-bench
    target/streaming-venv/bin/python xtask/python/cache_bench.py \
        --bench target/release/cache-bench --budgets 4,8,12 --workers 0,2

Streaming refuses a `cache_limit` below 4 shards.
"""

import argparse
import os
import subprocess
import sys
import tempfile


def write_mds(root, shards, samples, sample_bytes):
    from streaming import MDSWriter

    size_limit = samples * (sample_bytes + 8) + 4 * (samples + 1) + 16
    with MDSWriter(out=root, columns={"bin": "bytes"}, size_limit=size_limit) as w:
        for g in range(shards * samples):
            w.write({"bin": bytes([g % 251]) * sample_bytes})
    made = [f for f in os.listdir(root) if f.endswith(".mds")]
    assert len(made) == shards, f"{len(made)} shards written, {shards} wanted"
    sizes = [os.path.getsize(os.path.join(root, f)) for f in made]
    return max(sizes)


def streaming_downloads(root, budget, block, epochs, workers, batch):
    """Downloads per epoch of Streaming over `root` with `cache_limit=budget`."""
    import torch
    from streaming import StreamingDataset
    from streaming.base import stream as stream_mod
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    counter = tempfile.NamedTemporaryFile(delete=False)
    counter.close()
    original = stream_mod.Stream._download_file

    def counted(self, from_basename, to_basename=None):
        if from_basename.endswith(".mds"):
            with open(counter.name, "a") as f:
                f.write(from_basename + "\n")
        return original(self, from_basename, to_basename)

    stream_mod.Stream._download_file = counted
    local = tempfile.mkdtemp(prefix="streaming-cache-")
    per_epoch = []
    try:
        ds = StreamingDataset(
            remote=root,
            local=local,
            shuffle=True,
            shuffle_algo="py1br",
            shuffle_block_size=block,
            shuffle_seed=3,
            num_canonical_nodes=1,
            batch_size=batch,
            cache_limit=budget,
        )
        for _ in range(epochs):
            before = sum(1 for _ in open(counter.name))
            if workers == 0:
                n = sum(1 for _ in ds)
            else:
                loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers)
                n = sum(len(b["bin"]) for b in loader)
            assert n == len(ds), (n, len(ds))
            per_epoch.append(sum(1 for _ in open(counter.name)) - before)
    finally:
        stream_mod.Stream._download_file = original
        os.unlink(counter.name)
    return per_epoch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="the cache-bench binary")
    ap.add_argument("--shards", type=int, default=20)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--sample-bytes", type=int, default=2048)
    ap.add_argument("--budgets", default="4,8,12")
    ap.add_argument("--block", type=int, default=1 << 18)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="cache-bench-mds-")
    largest = write_mds(root, a.shards, a.samples, a.sample_bytes)
    print(f"{a.shards} MDS shards of {a.samples} samples, largest {largest} bytes, "
          f"shuffle block {a.block}, batch {a.batch}\n")
    print("| workers | budget (shards) | Streaming LRU, downloads per epoch | longshore, downloads per epoch | longshore, range reads per epoch | longshore's Belady bound |")
    print("| --- | --- | --- | --- | --- | --- |")
    for workers in [int(w) for w in a.workers.split(",")]:
        for shards in [int(b) for b in a.budgets.split(",")]:
            budget = shards * largest
            theirs = streaming_downloads(root, budget, a.block, a.epochs, workers, a.batch)
            out = subprocess.run(
                [a.bench, "--only", "mds", "--mds", root, "--mds-budget", str(budget),
                 "--block", str(a.block), "--epochs", str(a.epochs - 1),
                 "--workers", str(max(workers, 1)), "--batch", str(a.batch)],
                check=True, capture_output=True, text=True,
            ).stdout.strip().splitlines()[-1]
            ours, bound, ranged = out.split(";")
            print(f"| {workers} | {shards} | {', '.join(map(str, theirs))} | {ours} | {ranged} | {bound} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
