#!/usr/bin/env python3
"""Runs `examples/python/train_resnet.py` over a set of configurations in one call (one host,
one lease) and prints each feeder's rate as a share of the same model and step on
GPU-resident data, the ratio issue 38's targets are written in.

    python3 xtask/python/resnet_matrix.py                       # the default set, 1 GPU
    python3 xtask/python/resnet_matrix.py --only r18-synthetic,r18-nvjpeg
    python3 xtask/python/resnet_matrix.py --gpus 2              # the same under DDP (torchrun)
    python3 xtask/python/resnet_matrix.py --list

Each configuration is a fresh process (a warm-up epoch, then `--epochs` timed epochs); the
JSON lines of all runs go to `--out` (default target/resnet-matrix/runs.jsonl), their
output to `--out`'s log, and a Markdown table is printed last.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "examples", "python", "train_resnet.py")

# name -> train_resnet.py arguments. A row's share is over the synthetic row of its model and
# step ("r18-synthetic" for eager ResNet-18 rows, "r18-synthetic-captured" for captured ones).
CONFIGS = {
    "r18-synthetic": "--loader synthetic",
    "r18-nvjpeg": "--loader longshore --decode nvjpeg",
    "r18-nvjpeg-blocking": "--loader longshore --decode nvjpeg --sched blocking",
    "r18-nvjpeg-yield": "--loader longshore --decode nvjpeg --sched yield",
    "r18-nvjpeg-profile": "--loader longshore --decode nvjpeg --profile 20",
    "r18-synthetic-profile": "--loader synthetic --profile 20",
    "r18-synthetic-captured": "--loader synthetic --step captured",
    "r18-nvjpeg-captured": "--loader longshore --decode nvjpeg --step captured",
    "r18-nvjpeg-captured-profile":
        "--loader longshore --decode nvjpeg --step captured --profile 20",
    "r18-cpu": "--loader longshore --decode cpu",
    "r18-torch": "--loader torch",
    "nvjpeg-alone": "--loader longshore --decode nvjpeg --no-model",
    "cpu-alone": "--loader longshore --decode cpu --no-model",
    "r50-synthetic": "--loader synthetic --model resnet50",
    "r50-nvjpeg": "--loader longshore --decode nvjpeg --model resnet50",
    "r50-synthetic-captured": "--loader synthetic --model resnet50 --step captured",
    "r50-nvjpeg-captured": "--loader longshore --decode nvjpeg --model resnet50 --step captured",
}
DEFAULT = [
    "r18-synthetic", "r18-nvjpeg", "r18-nvjpeg-blocking", "r18-synthetic-captured",
    "r18-nvjpeg-captured", "r50-synthetic", "r50-nvjpeg", "r18-cpu", "r18-torch",
    "nvjpeg-alone",
]


def baseline(name):
    """The synthetic configuration a row is compared with: same model, same step."""
    model = name.split("-")[0]
    captured = "-captured" in name
    return f"{model}-synthetic" + ("-captured" if captured else "")


def run(name, args, log):
    cmd = [sys.executable, TRAIN] + CONFIGS[name].split() + [
        "--epochs", str(args.epochs), "--images", str(args.images), "--data", args.data]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    if args.gpus > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.gpus}"] + cmd[1:] + ["--ddp"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t
    log.write(f"### {name} ({wall:.0f} s): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}\n")
    log.flush()
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        print(f"{name}: failed (exit {p.returncode}): {' | '.join(tail)}", flush=True)
        return None
    line = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if not line:
        print(f"{name}: no JSON line", flush=True)
        return None
    result = json.loads(line[-1])
    result["config"] = name
    print(f"{name}: {result['images_per_s']:,.0f} images/s, waited "
          f"{100 * result['wait_fraction']:.1f}% ({wall:.0f} s)", flush=True)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="comma-separated configuration names (see --list)")
    p.add_argument("--list", action="store_true")
    p.add_argument("--gpus", type=int, default=1, help="more than 1: DDP under torchrun")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--images", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=0, help="0: train_resnet.py's default")
    p.add_argument("--data", default="target/train-resnet/data")
    p.add_argument("--out", default="target/resnet-matrix")
    args = p.parse_args()
    if args.list:
        for k, v in CONFIGS.items():
            print(f"{k:32} {v}")
        return
    names = args.only.split(",") if args.only else DEFAULT
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        sys.exit(f"unknown configurations {unknown}; --list names them")
    if args.gpus > 1:
        # train_resnet.py captures a step on one GPU only.
        left = [n for n in names if "captured" in n]
        names = [n for n in names if "captured" not in n]
        if left:
            print(f"left out under DDP (a captured step is for one GPU): {', '.join(left)}")
    os.makedirs(args.out, exist_ok=True)
    results = {}
    with open(os.path.join(args.out, "log.txt"), "a") as log, \
            open(os.path.join(args.out, "runs.jsonl"), "a") as runs:
        for name in names:
            r = run(name, args, log)
            if r is not None:
                r["gpus"] = args.gpus
                results[name] = r
                runs.write(json.dumps(r) + "\n")
                runs.flush()
    print()
    print("| configuration | images/s | of the synthetic rate | waited | CPU s / 1,000 images |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in results.items():
        base = results.get(baseline(name))
        share = (f"{100 * r['images_per_s'] / base['images_per_s']:.1f}%"
                 if base and "synthetic" not in name and r.get("model") else "-")
        cpu = r.get("cpu_s_per_1000_images")
        print(f"| {name} | {r['images_per_s']:,.0f} | {share} | "
              f"{100 * r['wait_fraction']:.1f}% | {'-' if cpu is None else f'{cpu:.2f}'} |")
    for name, r in results.items():
        if r.get("profile"):
            print(f"\n{name} profile: {json.dumps(r['profile'])}")


if __name__ == "__main__":
    main()
