#!/usr/bin/env python3
"""A 3-way mixture of sharded datasets against its members (issue 39's target: within 5% of
the slowest member's own rate), from Python: ``longshore.data.Mixture`` of three
``longshore.datasets.WebDataset`` members (weights 5:3:2, ``stop="all_exhausted"``), each
member alone, and the three shards' sets as one WebDataset, all with the same train pipeline
and loader options, steady state (one warm-up epoch, then whole epochs timed), and each also
drained by its Rust side in the same process.

Data: the WebDataset shards of ``shards_bench.py`` (``--data-dir``, ``wds/`` or with
``--clip`` the captioned ``wds-clip/``), read from local disk (the shard cache is the same
for every row); the shard list is cut into three members of about 1/2, 1/3 and 1/6 of the
shards.

    python3 xtask/python/mixture_bench.py --data-dir /tmp/longshore-shards-bench --workers 8
"""
import argparse
import json
import time
from pathlib import Path

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def timed(loader, epochs):
    """(images/s over `epochs` whole epochs after a warm-up one, samples per epoch)."""
    def epoch():
        n = 0
        for batch in loader:
            x = batch["jpg"] if isinstance(batch, dict) else batch[0]
            n += x.shape[0]
        return n

    epoch()
    t0, counts = time.perf_counter(), [epoch() for _ in range(epochs)]
    return sum(counts) / (time.perf_counter() - t0), counts


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=Path("/tmp/longshore-shards-bench"))
    p.add_argument("--clip", action="store_true", help="the captioned shards (image + text)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args()

    import longshore
    from longshore import transforms as T
    from longshore.data import Mixture

    folder = args.data_dir.resolve() / ("wds-clip" if args.clip else "wds")
    shards = [s["url"] for s in json.loads((folder / "shard-index.json").read_text())["shardlist"]]
    n = len(shards)
    cuts = [0, max(1, n // 2), max(2, n // 2 + n // 3), n]
    if n < 3:
        raise SystemExit(f"{folder} holds {n} shards: 3 members need 3 (a smaller --shard-size)")
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(MEAN, STD)])
    fields = {"jpg": "image", "txt": "text"} if args.clip else None
    cache = args.data_dir.resolve() / "mixture-cache"

    def wds(names):
        return longshore.datasets.WebDataset([str(folder / s) for s in names], transform=tf,
                                             shuffle=True, cache_dir=cache, fields=fields)

    members = [wds(shards[a:b]) for a, b in zip(cuts, cuts[1:])]
    runs = [(f"member {i} ({cuts[i + 1] - cuts[i]} shards, {len(m)} samples)", m)
            for i, m in enumerate(members)]
    mix = Mixture(members, [5, 3, 2], stop="all_exhausted", seed=0)
    runs.append((f"Mixture 5:3:2, all_exhausted ({len(mix)} positions, draws {mix.draws})", mix))
    runs.append((f"one WebDataset of the {n} shards", wds(shards)))
    rows = []
    print(f"{n} shards in {folder}; {args.workers} workers, batch {args.batch_size}", flush=True)
    for name, ds in runs:
        loader = longshore.DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers,
                                      persistent_workers=True)
        rate, counts = timed(loader, args.epochs)
        samples, secs = loader._loader._drain_in_rust(args.epochs)
        rows.append({"dataset": name, "images_per_s": rate, "rust_images_per_s": samples / secs,
                     "samples_per_epoch": counts})
        print(f"  {name}: {rate:,.0f} images/s (Rust {samples / secs:,.0f}), epochs of {counts}",
              flush=True)
        if ds is mix:
            print(f"    sources read: {loader.stats.get('sources')}", flush=True)
    slowest = min(r["images_per_s"] for r in rows[:3])
    slowest_rust = min(r["rust_images_per_s"] for r in rows[:3])
    ratio = rows[3]["images_per_s"] / slowest
    ratio_rust = rows[3]["rust_images_per_s"] / slowest_rust
    print(f"\nmixture / slowest member: {ratio:.2f}x (Rust {ratio_rust:.2f}x)")
    if args.out:
        args.out.write_text(json.dumps({"benchmark": "mixture", "rows": rows,
                                        "vs_slowest": ratio, "vs_slowest_rust": ratio_rust},
                                       indent=2))


if __name__ == "__main__":
    main()
