#!/usr/bin/env python3
"""The `python` section of `cargo xtask bench`: the longshore Python package against
torch.utils.data.DataLoader, on the same files, in the same run.

Workloads (as in the Rust loader section):
  images : u8 [N, 3, 224, 224] memmap -> f32 normalised per channel, batch 256
  tabular: f32 [N, 64] features + i64 [N] labels, memmap, batch 1024
Method (steady state): shuffled, drop_last, persistent workers; one warm-up epoch, then whole
epochs timed; batches delivered to the GPU when CUDA is available (longshore: device="cuda",
torch: pin_memory + .to(device, non_blocking=True)), synchronised at the end of each epoch.
Each side is swept over num_workers (and pin_memory for torch); the best of each is compared.
The Rust side is measured in the same process: each loader is also driven by Rust
(`_Loader._drain_in_rust`, the Rust bench's consumer loop), alternating with Python for --rounds
rounds. When the Rust loader section's results.json is given, the Python package is also
compared with that section's figure for the same workload (another process, its own sweep).

Writes a JSON report (--out) and prints a markdown table. Needs numpy, longshore; torch for the
baseline and the GPU (without torch: longshore alone, NumPy outputs, CPU).
"""
import argparse
import json
import os
import platform
import sys
import time

import numpy as np

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def ensure(path, shape, dtype, fill):
    """A .npy of `shape`/`dtype` at `path`, generated in chunks when missing or different."""
    if os.path.exists(path):
        try:
            a = np.load(path, mmap_mode="r")
            if a.shape == tuple(shape) and a.dtype == np.dtype(dtype):
                return path
        except ValueError:
            pass
    tmp = path + ".partial.npy"
    a = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=tuple(shape))
    rng = np.random.default_rng(0x5EED)
    step = max(1, (64 << 20) // max(1, a[0].nbytes))
    for i in range(0, shape[0], step):
        a[i : i + step] = fill(rng, a[i : i + step].shape)
    a.flush()
    del a
    os.replace(tmp, path)
    return path


def make_files(data_dir, images, tabular):
    os.makedirs(data_dir, exist_ok=True)
    img = ensure(
        os.path.join(data_dir, f"py_images_u8_{images}.npy"),
        (images, 3, 224, 224),
        np.uint8,
        lambda r, s: r.integers(0, 256, size=s, dtype=np.uint8),
    )
    x = ensure(
        os.path.join(data_dir, f"py_tabular_x_{tabular}.npy"),
        (tabular, 64),
        np.float32,
        lambda r, s: r.random(s, dtype=np.float32),
    )
    y = ensure(
        os.path.join(data_dir, f"py_tabular_y_{tabular}.npy"),
        (tabular,),
        np.int64,
        lambda r, s: r.integers(0, 1000, size=s, dtype=np.int64),
    )
    return {"images": img, "tabular": (x, y)}


def steady(make_iter, epochs, sync):
    """Samples/s over `epochs` whole epochs after one warm-up epoch."""
    n = 0
    for _ in make_iter():  # warm-up epoch: worker start-up, page cache, pool
        pass
    sync()
    t0 = time.perf_counter()
    for _ in range(epochs):
        for b in make_iter():
            n += (b[0] if isinstance(b, (list, tuple)) else b).shape[0]
        sync()
    return n / (time.perf_counter() - t0)


def bench_longshore(files, workload, workers, epochs, cuda, rounds, priorities=("normal",)):
    """The Python package over `workers`; per worker count, also the same loader driven in
    Rust in this process (`_Loader._drain_in_rust`: the Rust bench's consumer, with no epoch
    thread, export or conversion), alternating with the Python side for `rounds` rounds, the
    best of each kept: the ratio of the two is what the binding costs, on the same workers and
    files, free of the run-to-run noise between two processes."""
    import longshore

    if workload == "images":
        ds = longshore.NpyDataset(files["images"], normalize=(MEAN, STD))
        bs = 256
    else:
        ds = longshore.NpyDataset(list(files["tabular"]))
        bs = 1024
    rows = []
    torch = _torch()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for prio, nw in ((p, w) for p in priorities for w in workers):
        dl = longshore.DataLoader(
            ds,
            batch_size=bs,
            shuffle=True,
            num_workers=nw,
            pin_memory=True,
            drop_last=True,
            persistent_workers=nw > 0,
            seed=0,
            device="cuda" if cuda else None,
            worker_priority=prio,
        )
        py_best, rust_best_sps, wait = 0.0, 0.0, None
        for _ in range(rounds):
            sps = steady(lambda: iter(dl), epochs, sync)
            if sps > py_best:
                py_best, wait = sps, dl.stats["wait_fraction"]
            dl._loader._drain_in_rust(1)  # warm-up epoch, as steady() has
            n, secs = dl._loader._drain_in_rust(epochs)
            rust_best_sps = max(rust_best_sps, n / secs)
        rows.append({"num_workers": nw, "worker_priority": prio, "pin_memory": True,
                     "samples_per_s": py_best, "wait_fraction": wait,
                     "rust_in_process": rust_best_sps})
        del dl
    return rows


def _torch():
    try:
        import torch

        return torch
    except ImportError:
        return None


def bench_torch(files, workload, workers, epochs, cuda):
    torch = _torch()
    from torch.utils.data import DataLoader, Dataset

    mean = torch.tensor(MEAN).view(3, 1, 1) * 255.0
    std = torch.tensor(STD).view(3, 1, 1) * 255.0

    class Images(Dataset):
        def __init__(self, path):
            self.path, self.arr = path, None
            self.n = np.load(path, mmap_mode="r").shape[0]

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.arr is None:
                self.arr = np.load(self.path, mmap_mode="r")
            x = torch.from_numpy(np.array(self.arr[i])).float()
            return (x - mean) / std

    class Tabular(Dataset):
        def __init__(self, fx, fy):
            self.fx, self.fy, self.x, self.y = fx, fy, None, None
            self.n = np.load(fx, mmap_mode="r").shape[0]

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.x is None:
                self.x = np.load(self.fx, mmap_mode="r")
                self.y = np.load(self.fy, mmap_mode="r")
            return torch.from_numpy(np.array(self.x[i])), int(self.y[i])

    if workload == "images":
        ds, bs = Images(files["images"]), 256
    else:
        ds, bs = Tabular(*files["tabular"]), 1024
    device = torch.device("cuda") if cuda else None
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for nw in workers:
        for pin in (False, True):
            kw = dict(batch_size=bs, shuffle=True, num_workers=nw, pin_memory=pin and cuda,
                      drop_last=True)
            if nw > 0:
                kw.update(prefetch_factor=2, persistent_workers=True)
            dl = DataLoader(ds, **kw)

            def epoch():
                for b in dl:
                    if device is not None:
                        b = ([t.to(device, non_blocking=True) for t in b]
                             if isinstance(b, (list, tuple)) else b.to(device, non_blocking=True))
                    yield b

            sps = steady(epoch, epochs, sync)
            rows.append({"num_workers": nw, "pin_memory": pin and cuda, "samples_per_s": sps})
            del dl
            if not cuda:
                break  # pin_memory means nothing without a GPU
    return rows


def rust_best(results_json):
    """The Rust loader section's best samples/s per workload, from a results.json."""
    out = {}
    if not results_json or not os.path.exists(results_json):
        return out
    with open(results_json) as f:
        r = json.load(f)
    for fig in r.get("figures", []):
        p = fig.get("params", {})
        if fig.get("section") == "loader" and p.get("what") == "best":
            out[p.get("workload")] = {"samples_per_s": fig["value"], "num_workers": p.get("num_workers"),
                                      "pin_memory": p.get("pin_memory")}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="target/longshore-bench/data")
    ap.add_argument("--out", default="target/longshore-bench/python.json")
    ap.add_argument("--rust-results", default=None, help="results.json of the Rust sections")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--images", type=int, default=None, help="image rows (default 4096; quick 256)")
    ap.add_argument("--tabular", type=int, default=None, help="tabular rows (default 1M; quick 32768)")
    ap.add_argument("--workers", default=None, help="comma-separated num_workers sweep")
    ap.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
    ap.add_argument("--workloads", default="images,tabular", help="comma-separated workloads")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch baseline")
    ap.add_argument("--rounds", type=int, default=None,
                    help="alternating Python / Rust-in-process rounds per worker count (default 2; quick 1)")
    ap.add_argument("--worker-priority", default="normal",
                    help="comma-separated worker priorities to sweep (normal, background)")
    args = ap.parse_args()

    quick = args.quick
    images = args.images or (256 if quick else 4096)
    tabular = args.tabular or (32768 if quick else 1_000_000)
    epochs = args.epochs or (1 if quick else 3)
    rounds = args.rounds or (1 if quick else 2)
    workers = ([int(w) for w in args.workers.split(",")] if args.workers
               else ([2] if quick else [4, 8, 16]))
    torch = _torch()
    cuda = bool(torch is not None and torch.cuda.is_available() and not args.cpu)
    files = make_files(args.data_dir, images, tabular)

    report = {
        "section": "python",
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                    "cores": os.cpu_count(), "torch": getattr(torch, "__version__", None),
                    "gpu": torch.cuda.get_device_name(0) if cuda else None},
        "method": f"steady state: 1 warm-up epoch, {epochs} timed epochs, persistent workers, "
                  f"shuffle, drop_last; {'delivered to the GPU' if cuda else 'consumed on the CPU'}",
        "rows": {"images": images, "tabular": tabular},
        "figures": [],
        "notes": [],
    }
    rust = rust_best(args.rust_results)
    if rust:
        report["notes"].append(
            "Rust loader: the best of the loader section in " + str(args.rust_results)
            + " (its own sweep and method; compare like with like before quoting the ratio)")
    table = []
    rows_md = []

    def label(r):
        """A configuration's worker count, with its priority when not the default."""
        p = r.get("worker_priority", "normal")
        return str(r["num_workers"]) + ("" if p == "normal" else f" {p}")

    for w in args.workloads.split(","):
        if w not in ("images", "tabular"):
            sys.exit(f"unknown workload {w!r}: images or tabular")
        ours = bench_longshore(files, w, workers, epochs, cuda, rounds,
                               args.worker_priority.split(","))
        best = max(ours, key=lambda r: r["samples_per_s"])
        for r in ours:
            report["figures"].append({"workload": w, "side": "longshore-python", **r})
            rows_md.append(f"| {w} | {label(r)} | {r['samples_per_s']:,.0f} | "
                           f"{r['rust_in_process']:,.0f} | {r['samples_per_s'] / r['rust_in_process']:.2f}x |")
        theirs_best = None
        if torch is not None and not args.no_torch:
            theirs = bench_torch(files, w, workers, epochs, cuda)
            for r in theirs:
                report["figures"].append({"workload": w, "side": "pytorch", **r})
            theirs_best = max(theirs, key=lambda r: r["samples_per_s"])
        elif args.no_torch:
            if "--no-torch: no PyTorch baseline" not in report["notes"]:
                report["notes"].append("--no-torch: no PyTorch baseline")
        elif "torch not installed: no PyTorch baseline" not in report["notes"]:
            report["notes"].append("torch not installed: no PyTorch baseline")
        rb = rust.get(w)
        rust_here = max(ours, key=lambda r: r["rust_in_process"])
        row = {
            "workload": w,
            "longshore_python": best["samples_per_s"],
            "longshore_python_workers": label(best),
            "pytorch": theirs_best and theirs_best["samples_per_s"],
            "pytorch_config": theirs_best and f"workers={theirs_best['num_workers']} pin={theirs_best['pin_memory']}",
            "vs_pytorch": theirs_best and best["samples_per_s"] / theirs_best["samples_per_s"],
            "rust": rb and rb["samples_per_s"],
            "python_vs_rust": rb and best["samples_per_s"] / rb["samples_per_s"],
            "rust_in_process": rust_here["rust_in_process"],
            "rust_in_process_workers": label(rust_here),
            "python_vs_rust_in_process": best["samples_per_s"] / rust_here["rust_in_process"],
        }
        report["figures"].append({"workload": w, "side": "summary", **row})
        table.append(row)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)

    def fmt(v, pct=False):
        if v is None:
            return "-"
        return f"{v:.2f}x" if pct else f"{v:,.0f}"

    lines = [f"## python: {report['method']}", "",
             "| workload | longshore (Python) | best workers | PyTorch best | PyTorch config | vs PyTorch | same loader in Rust (workers) | Python / Rust, same process | Rust loader section | Python / Rust section |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in table:
        lines.append(
            f"| {r['workload']} | {fmt(r['longshore_python'])} | {r['longshore_python_workers']} | "
            f"{fmt(r['pytorch'])} | {r['pytorch_config'] or '-'} | {fmt(r['vs_pytorch'], True)} | "
            f"{fmt(r['rust_in_process'])} ({r['rust_in_process_workers']}) | "
            f"{fmt(r['python_vs_rust_in_process'], True)} | "
            f"{fmt(r['rust'])} | {fmt(r['python_vs_rust'], True)} |")
    lines += ["", "| workload | workers | Python | same loader in Rust | Python / Rust |",
              "| --- | --- | ---: | ---: | ---: |"] + rows_md
    for n in report["notes"]:
        lines.append(f"\nnote: {n}")
    md = "\n".join(lines) + "\n"
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
