"""The shard cache's rate under a budget from Python (issue 36), beside the Rust path in the
same call.

Writes ``--shards`` WebDataset shards of about ``--samples`` samples each (``.bin``:
``--sample-bytes`` bytes, ``.cls``: the sample's index) with their wids index, serves them
with ``xtask s3-serve --latency-ms`` (every ``GET`` delayed, as an object store's first
byte), and for each shuffle block reads epochs with ``longshore.datasets.WebDataset(fields=
{"bin": "bytes", "cls": "int"})`` through ``longshore.DataLoader(batch_size, num_workers)``
(Rust workers), the training loop sleeping ``--work-us`` per sample of each batch (a GPU
step: the loader has that long to make the next batch), once with the default (unbounded)
cache and once with a budget of 4 shards per worker: one warm-up epoch, then the best of
``--epochs`` timed epochs. The cache's downloads and range
reads per epoch come from ``loader.stats["shards"]``. Then, unless ``--no-rust``, runs
``cache-bench --only rate`` with the same shape (the Rust path: the same loader and reader,
the work as CPU in the Rust workers, the latency from the fault store) and prints its table.

    cargo build --release -p xtask -p longshore-benches
    python3 xtask/python/cache_rate.py --xtask target/release/xtask \\
        --bench target/release/cache-bench
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def write(root, args):
    import longshore

    per = 1536 + -(-args.sample_bytes // 512) * 512  # tar bytes of one sample, about
    names = longshore.datasets.write_shards(
        root, ((bytes([g % 251]) * args.sample_bytes, g)
               for g in range(args.shards * args.samples)),
        shard_size=args.samples * per, image_ext="bin")
    with open(os.path.join(root, "shard-index.json")) as f:
        counts = [e["nsamples"] for e in json.load(f)["shardlist"]]
    return names, counts


def serve(xtask, root, latency_ms):
    p = subprocess.Popen([xtask, "s3-serve", "--dir", root, "--port", "0", "--bucket", "bench",
                          "--latency-ms", str(latency_ms)],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("endpoint: "):
        p.kill()
        raise RuntimeError(f"s3-serve did not start: {line!r}")
    return p, line.split(" ", 1)[1].strip()


def epoch_rates(args, endpoint, names, block, budget, cache_dir):
    import longshore

    opts = {"aws_endpoint": endpoint, "aws_access_key_id": "longshore-test-key",
            "aws_secret_access_key": "longshore-test-secret-0123456789",
            "aws_region": "us-east-1", "aws_allow_http": "true"}
    pattern = "s3://bench/shard-{000000..%06d}.tar" % (len(names) - 1)
    kw = {"cache_budget": budget} if budget else {}
    ds = longshore.datasets.WebDataset(
        pattern, fields={"bin": "bytes", "cls": "int"}, shuffle=True, seed=3, shuffle_block=block, cache_dir=cache_dir, storage_options=opts,
        **kw)
    loader = longshore.DataLoader(ds, batch_size=args.batch, num_workers=args.workers,
                                  persistent_workers=True)
    best = 0.0
    for epoch in range(args.epochs + 1):
        loader.set_epoch(epoch)
        start, n = time.perf_counter(), 0
        for batch in loader:
            k = len(batch["cls"])
            time.sleep(k * args.work_us / 1e6)
            n += k
        rate = n / (time.perf_counter() - start)
        if epoch > 0:
            best = max(best, rate)
    per_epoch = loader.stats["shards"]["cache_epochs"][1:]
    del loader
    return best, per_epoch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--xtask", default="target/release/xtask")
    p.add_argument("--bench", default="target/release/cache-bench")
    p.add_argument("--shards", type=int, default=20)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--sample-bytes", type=int, default=2048)
    p.add_argument("--latency-ms", type=int, default=20)
    p.add_argument("--work-us", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--blocks", default="0,2.5,all",
                   help="shuffle blocks in shards (0: shard order, all: the whole epoch)")
    p.add_argument("--no-rust", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="longshore-cache-rate-") as tmp:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        names, counts = write(data, args)
        largest = max(os.path.getsize(os.path.join(data, n)) for n in names)
        server, endpoint = serve(args.xtask, data, args.latency_ms)
        try:
            print(f"## Python: samples/s, {args.latency_ms} ms per GET (s3-serve), "
                  f"a step of {args.work_us} us per sample, {args.workers} workers, "
                  f"{len(names)} shards of {min(counts)}-{max(counts)} samples\n")
            print("| shuffle block | unbounded | 4 shards per worker | ratio | "
                  "downloads/epoch (4 per worker) | range reads/epoch | "
                  "misses/epoch (ms waited) |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            for b in args.blocks.split(","):
                b = b.strip()
                block = {"0": 0, "all": 2**62}.get(b)
                if block is None:
                    block = int(float(b) * args.samples)
                rates, stats = [], None
                for n, budget in enumerate([None, largest * 4 * args.workers]):
                    cache = os.path.join(tmp, f"cache-{b}-{n}")
                    rate, per_epoch = epoch_rates(args, endpoint, names, block, budget, cache)
                    rates.append(rate)
                    stats = per_epoch
                label = {"0": "0 (shard order)", "all": "all (the default here)"}.get(
                    b, f"{b} shards")
                dl = ", ".join(str(e["downloads"]) for e in stats)
                rr = ", ".join(str(e["range_reads"]) for e in stats)
                ms = ", ".join(f"{e['misses']} ({e['miss_wait_s'] * 1e3:.0f})" for e in stats)
                print(f"| {label} | {rates[0]:.0f} | {rates[1]:.0f} | "
                      f"{rates[1] / rates[0]:.2f}x | {dl} | {rr} | {ms} |", flush=True)
        finally:
            server.terminate()
            server.wait()
    if not args.no_rust:
        print(flush=True)
        subprocess.run([args.bench, "--only", "rate", "--samples", str(args.samples),
                        "--shards", str(args.shards), "--sample-bytes", str(args.sample_bytes),
                        "--latency-ms", str(args.latency_ms), "--work-us", str(args.work_us),
                        "--workers", str(args.workers), "--batch", str(args.batch),
                        "--epochs", str(args.epochs), "--blocks", args.blocks], check=True)


if __name__ == "__main__":
    sys.exit(main())
