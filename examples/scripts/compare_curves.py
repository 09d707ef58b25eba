#!/usr/bin/env python3
"""Compares two `train --json` outputs (one JSON line per epoch, then the summary line):
per-epoch loss of a single-process run vs a distributed run, and throughput / scaling.

    python3 examples/scripts/compare_curves.py single.jsonl dist.jsonl [--tol 1e-3]
Exits 1 when an epoch's loss differs by more than the relative tolerance."""
import argparse
import json
import sys


def load(path):
    rows = [json.loads(l) for l in open(path) if l.lstrip().startswith("{")]
    epochs = [r for r in rows if "epoch" in r and "device" not in r]
    summary = [r for r in rows if "device" in r][-1]
    return epochs, summary


def steady(epochs):
    """Samples/s over epochs 2.. (epoch 1 includes warm-up: kernels, pools, NCCL set-up)."""
    rest = epochs[1:] or epochs
    return sum(e["samples"] for e in rest) / sum(e["seconds"] for e in rest)


ap = argparse.ArgumentParser()
ap.add_argument("single")
ap.add_argument("distributed")
ap.add_argument("--tol", type=float, default=1e-3)
a = ap.parse_args()
tol = a.tol
e1, s1 = load(a.single)
e2, s2 = load(a.distributed)
w = s2["world_size"]
print(f"{'epoch':>5} {'loss 1 proc':>12} {'loss ' + str(w) + ' ranks':>12} {'rel diff':>9}")
worst = 0.0
for a, b in zip(e1, e2):
    rel = abs(a["loss"] - b["loss"]) / abs(a["loss"])
    worst = max(worst, rel)
    print(f"{a['epoch']:>5} {a['loss']:>12.6f} {b['loss']:>12.6f} {rel:>9.2e}")
ok = worst <= tol and len(e1) == len(e2)
print(f"max relative loss difference {worst:.2e} (tolerance {tol:g}): {'OK' if ok else 'MISMATCH'}")
t1, t2 = steady(e1), steady(e2)
print(f"1 process : {t1:,.0f} samples/s (steady state), {s1['samples_per_sec']:,.0f} overall on {s1['device']}")
print(f"{w} ranks   : {t2:,.0f} samples/s all ranks (steady state), {s2['samples_per_sec']:,.0f} overall; "
      f"{s2['rank_samples_per_sec']:,.0f} samples/s per rank (rank 0)")
print(f"scaling   : {t2 / t1:.2f}x vs 1 GPU ({100 * t2 / t1 / w:.0f}% efficiency); "
      f"rank 0 waited for data {100 * s2['wait_fraction']:.1f}% of its loop")
sys.exit(0 if ok else 1)
