#!/usr/bin/env python3
"""Sharded JPEG datasets read from a local S3 server (issue 28), the Python side: the
``webdataset`` package and MosaicML Streaming with torch's DataLoader, longshore's sharded
datasets when the package has them, and torchvision's ImageFolder over the unpacked folder for
reference. Steady state: for each loader and configuration, one warm-up epoch, then whole
epochs timed.

Data (made once under --data-dir by the xtask binary, reused when there):
  images/  the ImageNet-like synthetic folder (``xtask shard --synthetic N``: 100 classes of
           JPEGs, about 110 KB each; 10,000 images by default)
  wds/     those images as WebDataset shards of --shard-size (default 64 MiB): ``.jpg`` +
           ``.cls``, shuffled, with the wids index ``shard-index.json``
  mds/     the same images as MDS shards (columns ``jpg``: jpeg, ``cls``: int)
The server is ``xtask s3-serve --dir <data-dir> --bucket bench --port 0``, started by this
script as a subprocess (anonymous reads allowed, signed requests checked with its fixed test
credentials, which this script exports as AWS_* / S3_ENDPOINT_URL).

Loaders (every one decodes with the train pipeline: PIL decode, RandomResizedCrop(224),
RandomHorizontalFlip, ToTensor, Normalize; batch --batch-size; on CUDA, pin_memory and
``.cuda(non_blocking=True)``, synchronised at the end of each epoch):
  webdataset  ``webdataset.WebDataset(http URLs of the shards, shardshuffle, split_by_worker)``
              ``.shuffle(1000).decode("pil").to_tuple("jpg", "cls")``, the transform, batched in
              the workers, ``DataLoader(batch_size=None)`` (webdataset's recommended form).
              Shards are read over HTTP from the server (webdataset's ``curl`` handler, or
              urllib where curl is missing) every epoch; workers get whole shards, so with few
              shards some workers get more.
  streaming   ``streaming.StreamingDataset(remote="s3://bench/mds", local=<cache>,
              shuffle=True, batch_size)`` with the transform in ``__getitem__``, torch's
              DataLoader; shards are downloaded by boto3 (S3_ENDPOINT_URL) into the local
              cache during the warm-up epoch and read from it afterwards.
  webdataset (cache_dir)  the same with webdataset's shard cache (later epochs read local
              copies).
  longshore   ``longshore.datasets.WebDataset`` / ``StreamingDataset`` over S3 (shuffled,
              cached by longshore's shard cache during the warm-up epoch) and
              ``longshore.datasets.ImageFolder`` over images/ (the same pipeline from local
              disk), with longshore's DataLoader; each also drained by its Rust side in the
              same process (rows "[Rust]"). On a GPU, also WebDataset and ImageFolder with
              ``decode="nvjpeg"`` (rows "nvJPEG"; ``--decode`` picks).
  folder      torchvision's ImageFolder over images/ (local files; the reference).
torch's DataLoader is swept over --workers (8,16) x --prefetch (2,4), persistent workers,
pin_memory on CUDA; the best configuration of each loader is reported.

``--clip``: the CLIP-style form (issue 39): the same shards with a caption per image (a
``.txt`` member, 40-160 characters, written once into wds-clip/ beside wds/), read as image +
text: webdataset ``.to_tuple("jpg", "txt")`` batched with ``default_collate`` (a list of
captions), longshore ``WebDataset(fields={"jpg": "image", "txt": "text"})`` (a dict: the image
tensor and the captions as ``list[str]``; on a GPU also with ``decode="nvjpeg"``, the image
field decoded by nvJPEG and the captions carried beside it). Only the webdataset and longshore
rows run.

Prints a table and writes JSON (--out).

Here (a Rust toolchain): ``cargo build --release -p xtask``, then
    python3 xtask/python/shards_bench.py --out shards.json
(small: ``--images 500 --epochs 1 --workers 2 --prefetch 2 --shard-size 8MiB``).

On the GPU machine (no toolchain, no registry): ``cargo xtask gpu-pack`` bundles the xtask
binary (``.gpu/bin/xtask``) and ``cargo xtask gpu-python`` this script
(``gpu-python/bench/shards_bench.py``) and the baselines' wheels that the machine lacks
(``gpu-python/baseline-wheels/``: webdataset, mosaicml-streaming, boto3 and what they import
that the machine lacks, 12 wheels, 21 MiB). Carry ``gpu-pack`` and ``gpu-python``, then:
    tar -xJf gpu-pack/gpu.tar.xz
    python3 -m pip install -q --no-index --no-deps --target /tmp/site gpu-python/baseline-wheels/*.whl
    PYTHONPATH=/tmp/site python3 gpu-python/bench/shards_bench.py --xtask .gpu/bin/xtask \\
        --data-dir /tmp/shards-bench --out $OUT/shards.json
or, after the tar, with the longshore wheel installed too (for its rows), in one command:
    bash gpu-python/run.sh --shards       # XTASK=path, SHARDS_DATA_DIR=dir to change them
"""
import argparse
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import zlib
from pathlib import Path

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
BUCKET = "bench"
# `xtask s3-serve`'s fixed test credentials.
ACCESS_KEY, SECRET_KEY, REGION = "longshore-test-key", "longshore-test-secret-0123456789", "us-east-1"


def find_xtask(given):
    """The xtask binary: --xtask, else the first of the release build, the GPU bundle's, the
    debug build (relative to the working directory, then to the repository root)."""
    if given:
        p = Path(given)
        if not p.exists():
            sys.exit(f"--xtask {given}: no such file")
        return p.resolve()
    roots = [Path.cwd(), Path(__file__).resolve().parents[2]]
    target = os.environ.get("CARGO_TARGET_DIR")
    rels = ["target/release/xtask", ".gpu/bin/xtask", "target/debug/xtask"]
    for root in roots:
        cands = [root / r for r in rels]
        if target:
            cands[1:1] = [Path(target) / "release/xtask", Path(target) / "debug/xtask"]
        for c in cands:
            if c.is_file():
                return c.resolve()
    sys.exit("no xtask binary: build it (cargo build --release -p xtask) or pass --xtask PATH")


def expected_images(n):
    """What `xtask shard --synthetic n` generates: 100 classes (fewer below 100 images) of
    ceil(n / classes) images."""
    classes = min(n, 100)
    return classes * -(-n // classes)


def run_xtask(xtask, *args):
    cmd = [str(xtask), *map(str, args)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def ensure_data(xtask, data, images, shard_size):
    """images/, wds/ and mds/ under `data`, packed when missing or made with other settings."""
    want = {"images": expected_images(images), "shard_size": shard_size}
    for fmt, index in (("wds", "shard-index.json"), ("mds", "index.json")):
        out = data / fmt
        stamp = out / "bench-stamp.json"
        try:
            if json.loads(stamp.read_text()) == want and (out / index).exists():
                continue
        except (OSError, ValueError):
            pass
        run_xtask(xtask, "shard", "--input", data / "images", "--synthetic", images,
                  "--out", out, "--format", fmt, "--shard-size", shard_size)
        stamp.write_text(json.dumps(want))
    index = json.loads((data / "wds" / "shard-index.json").read_text())
    return [s["url"] for s in index["shardlist"]], sum(s["nsamples"] for s in index["shardlist"])


def caption(key, cls):
    """A caption for sample `key` of class `cls`: 40-160 characters, some non-ASCII."""
    h = zlib.crc32(key.encode())
    words = ["a", "photo", "of", "the", "small", "large", "bright", "café", "naïve", "scene",
             "with", "and", "in", "morning", "light", "river", "street", "dog", "bird", "tree"]
    n = 8 + h % 20
    return f"class {cls}: " + " ".join(words[(h >> (k % 24) ^ k) % len(words)] for k in range(n))


def ensure_clip(data):
    """wds-clip/: each wds/ shard with a `.txt` caption beside every sample's `.jpg`/`.cls`."""
    src, out = data / "wds", data / "wds-clip"
    index = json.loads((src / "shard-index.json").read_text())
    stamp = out / "bench-stamp.json"
    want = {"shards": [s["url"] for s in index["shardlist"]],
            "sizes": [s.get("filesize") for s in index["shardlist"]]}
    try:
        if json.loads(stamp.read_text()) == want:
            return
    except (OSError, ValueError):
        pass
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    entries = []
    for entry in index["shardlist"]:
        members = []
        with tarfile.open(src / entry["url"]) as t:
            for m in t.getmembers():
                members.append((m.name, t.extractfile(m).read()))
        with tarfile.open(out / entry["url"], "w") as t:
            for name, payload in members:
                key, ext = name.split(".", 1)
                extra = []
                if ext == "cls":
                    extra = [(f"{key}.txt", caption(key, payload.decode()).encode())]
                for n, b in [(name, payload)] + extra:
                    info = tarfile.TarInfo(n)
                    info.size = len(b)
                    t.addfile(info, io.BytesIO(b))
        entries.append({"url": entry["url"], "nsamples": entry["nsamples"],
                        "filesize": (out / entry["url"]).stat().st_size})
    (out / "shard-index.json").write_text(json.dumps(
        {**index, "shardlist": entries}))
    stamp.write_text(json.dumps(want))
    print(f"wrote {len(entries)} captioned shards into {out}", flush=True)


class Server:
    """`xtask s3-serve` over `data` as bucket `bench` on a free port, for the `with` block."""

    def __init__(self, xtask, data):
        self.cmd = [str(xtask), "s3-serve", "--dir", str(data), "--bucket", BUCKET, "--port", "0"]

    def __enter__(self):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("endpoint: "):
            self.proc.kill()
            sys.exit(f"{' '.join(self.cmd)} did not start: {line!r}")
        self.endpoint = line.split(" ", 1)[1]
        # Keep reading its banner so that it never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        os.environ.update({
            "AWS_ENDPOINT_URL": self.endpoint, "S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION, "AWS_ALLOW_HTTP": "true",
        })
        print(f"s3-serve: {self.endpoint}, bucket {BUCKET}", flush=True)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def train_transform():
    import torchvision.transforms as T

    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(MEAN, STD)])
    return tf


class RGB:
    """The train transform on an RGB image (a few of the JPEGs are grayscale; torchvision's
    ImageFolder loader converts too)."""

    def __init__(self, tf):
        self.tf = tf

    def __call__(self, img):
        return self.tf(img if img.mode == "RGB" else img.convert("RGB"))


def timed(make_iter, epochs, cuda):
    """Steady state: one warm-up epoch, then `epochs` whole epochs timed.
    Returns (images/s, samples per timed epoch, warm-up seconds)."""
    import torch

    def epoch():
        n = 0
        for batch in make_iter():
            # (images, labels), (images, captions) or {"jpg": images, "txt": captions}
            x, y = (batch["jpg"], batch["txt"]) if isinstance(batch, dict) else batch
            if isinstance(y, list):
                y = torch.tensor([len(c) for c in y])  # the captions reach the program
            if cuda:
                x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            n += x.shape[0]
        if cuda:
            torch.cuda.synchronize()
        return n

    t0 = time.perf_counter()
    epoch()
    warm = time.perf_counter() - t0
    t0, counts = time.perf_counter(), []
    for _ in range(epochs):
        counts.append(epoch())
    return sum(counts) / (time.perf_counter() - t0), counts, warm


def sweep(name, make_loader, args, cuda, rows, rust_drain=False):
    """Times `make_loader(workers, prefetch)` over the sweep; appends a row for each. With
    `rust_drain` (a longshore loader), then drains the same loader's epochs in Rust
    (`_drain_in_rust`) and appends that as a row "<name> [Rust]"."""
    for w in args.workers:
        for pf in args.prefetch:
            label = f"{name} (workers {w}, prefetch {pf})"
            try:
                dl = make_loader(w, pf)
                rate, counts, warm = timed(lambda dl=dl: iter(dl), args.epochs, cuda)
                if rust_drain:
                    samples, secs = dl._loader._drain_in_rust(args.epochs)
                    rust = samples / secs
                    print(f"  {label} [Rust]: {rust:,.0f} images/s", flush=True)
                    rows.append({"loader": f"{name} [Rust]", "workers": w, "prefetch": pf,
                                 "status": "ok", "images_per_s": rust,
                                 "samples_per_epoch": [samples // max(args.epochs, 1)],
                                 "warmup_s": 0.0})
                del dl
            except Exception as e:  # a baseline that fails is reported, not fatal
                print(f"  {label}: failed: {type(e).__name__}: {e}", flush=True)
                rows.append({"loader": name, "workers": w, "prefetch": pf,
                             "status": f"failed: {type(e).__name__}: {e}"})
                continue
            print(f"  {label}: {rate:,.0f} images/s, epochs of {counts}, warm-up {warm:.1f} s",
                  flush=True)
            rows.append({"loader": name, "workers": w, "prefetch": pf, "status": "ok",
                         "images_per_s": rate, "samples_per_epoch": counts,
                         "warmup_s": warm})


def dataloader_kw(w, pf, cuda):
    return dict(num_workers=w, prefetch_factor=pf if w > 0 else None,
                persistent_workers=w > 0, pin_memory=cuda)


def bench_webdataset(args, shard_urls, endpoint, cuda, rows):
    import torch
    import webdataset as wds

    urls = [f"{endpoint}/{BUCKET}/{args.wds}/{u}" for u in shard_urls]
    tf = RGB(train_transform())
    if shutil.which("curl") is None:
        # webdataset reads http URLs through a `curl` subprocess; without curl, urllib
        # (set before the workers fork, so they inherit it).
        import importlib
        import urllib.request

        print("  (no curl here: webdataset reads the shards with urllib)")
        # The module (the package's `webdataset.gopen` is its function of that name).
        schemes = importlib.import_module("webdataset.gopen").gopen_schemes
        schemes["http"] = lambda url, mode="rb", bufsize=8192, **kw: urllib.request.urlopen(url)

    cache_dir = None

    def make(w, pf):
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), workersplitter=wds.split_by_worker,
                             empty_check=False, cache_dir=cache_dir)
              .shuffle(1000)
              .decode("pil")
              .to_tuple("jpg", "txt" if args.clip else "cls")
              .map_tuple(tf, str if args.clip else int)
              .batched(args.batch_size, collation_fn=torch.utils.data.default_collate,
                       partial=True))
        return torch.utils.data.DataLoader(ds, batch_size=None, **dataloader_kw(w, pf, cuda))

    sweep("webdataset", make, args, cuda, rows)
    # With its shard cache: epoch 0 downloads, later epochs read local copies (what an expert
    # turns on when the node has the disk).
    cache_dir = str(args.data_dir.resolve() / "webdataset-cache")
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.makedirs(cache_dir)  # webdataset requires it to exist
    sweep("webdataset (cache_dir)", make, args, cuda, rows)


_STREAMING_TRAIN = None


def streaming_train(base):
    """A StreamingDataset whose samples are (transformed image, label); one class, defined on
    first use (streaming is imported only when its row runs) and kept at module level so that
    workers started by spawn can unpickle it."""
    global _STREAMING_TRAIN
    if _STREAMING_TRAIN is None:
        class StreamingTrain(base):
            def __init__(self, tf, **kw):
                super().__init__(**kw)
                self.tf = tf

            def __getitem__(self, i):
                s = super().__getitem__(i)
                return self.tf(s["jpg"]), s["cls"]

        StreamingTrain.__qualname__ = "StreamingTrain"
        globals()["StreamingTrain"] = _STREAMING_TRAIN = StreamingTrain
    return _STREAMING_TRAIN


def bench_streaming(args, data, cuda, rows):
    import torch
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    cache = data / "streaming-cache"
    shutil.rmtree(cache, ignore_errors=True)  # the warm-up epoch downloads through S3
    ds = streaming_train(StreamingDataset)(
        RGB(train_transform()), remote=f"s3://{BUCKET}/mds", local=str(cache), shuffle=True,
        batch_size=args.batch_size)
    # The dataset fetched index.json here with a boto3 client that each stream keeps (and its
    # pool's keep-alive socket). Forked workers would inherit that one socket and read each
    # other's responses: shards corrupted or mixed up, and 60 s stalls (seen with 2 workers).
    # Drop it, as Streaming's own retry does, so that each worker makes its own.
    for stream in getattr(ds, "streams", []):
        downloader = getattr(stream, "_downloader", None)
        if downloader is not None:
            downloader.clean_up()

    def make(w, pf):
        return torch.utils.data.DataLoader(ds, batch_size=args.batch_size,
                                           **dataloader_kw(w, pf, cuda))

    sweep("streaming", make, args, cuda, rows)


def bench_longshore(args, shard_urls, data, cuda, rows):
    """longshore's sharded datasets (WebDataset over S3, StreamingDataset over S3) and its
    ImageFolder over the unpacked folder (the same pipeline from local disk: the reference of
    the "within 10%" target), with longshore's DataLoader. Each loader is also drained by its
    Rust side in the same process (``_drain_in_rust``: the batches as a Rust user's loop gets
    them, no conversion to torch), the Rust front door's rate."""
    try:
        import longshore
        from longshore import transforms as LT
    except ImportError as e:
        print(f"  longshore: not available (cannot import longshore: {e})")
        rows.append({"loader": "longshore", "status": f"not available: {e}"})
        return
    tf = LT.Compose([LT.RandomResizedCrop(224), LT.RandomHorizontalFlip(), LT.ToTensor(),
                     LT.Normalize(MEAN, STD)])
    n = len(shard_urls)
    cache = data / "longshore-cache"
    shutil.rmtree(cache, ignore_errors=True)  # the warm-up epoch downloads through S3
    fields = {"jpg": "image", "txt": "text"} if args.clip else None
    makers = {
        "WebDataset": lambda: longshore.datasets.WebDataset(
            f"s3://{BUCKET}/{args.wds}/shard-{{000000..{n - 1:06d}}}.tar", transform=tf,
            shuffle=True, cache_dir=cache / args.wds, fields=fields),
        "StreamingDataset": lambda: longshore.datasets.StreamingDataset(
            remote=f"s3://{BUCKET}/mds", local=str(cache / "mds"), transform=tf, shuffle=True),
        "ImageFolder": lambda: longshore.datasets.ImageFolder(str(data / "images"), transform=tf),
    }
    # On a GPU, the image datasets decoded by nvJPEG too (`decode="nvjpeg"`), shards against
    # the folder: the same comparison on the GPU's JPEG engines.
    runs = [(cls, "cpu") for cls in makers if not args.clip or cls == "WebDataset"]
    if cuda and "nvjpeg" in args.decode:
        runs += [("WebDataset", "nvjpeg")] + ([] if args.clip else [("ImageFolder", "nvjpeg")])
    if "cpu" not in args.decode:
        runs = [r for r in runs if r[1] != "cpu"]
    for cls, decode in runs:
        make_ds = makers[cls]
        name = f"longshore.datasets.{cls}" + (" nvJPEG" if decode == "nvjpeg" else "")
        if not hasattr(longshore.datasets, cls):
            print(f"  {name}: not available")
            rows.append({"loader": name, "status": "not available"})
            continue
        try:
            ds = make_ds()
        except Exception as e:
            print(f"  {name}: failed: {type(e).__name__}: {e}")
            rows.append({"loader": name, "status": f"failed: {type(e).__name__}: {e}"})
            continue

        def make(w, pf, ds=ds, cls=cls, decode=decode):
            kw = {"decode": "nvjpeg"} if decode == "nvjpeg" else {}
            return longshore.DataLoader(ds, batch_size=args.batch_size, num_workers=w,
                                        shuffle=True if cls == "ImageFolder" else None,
                                        persistent_workers=True, pin_memory=cuda,
                                        device="cuda" if cuda else None, **kw)

        # longshore's workers are threads: prefetch is its own, not swept.
        sweep(name, make, argparse.Namespace(**{**vars(args), "prefetch": [2]}), cuda, rows,
              rust_drain=True)


def bench_folder(args, data, cuda, rows):
    import torch
    import torchvision.datasets as D

    ds = D.ImageFolder(str(data / "images"), train_transform())

    def make(w, pf):
        return torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                           **dataloader_kw(w, pf, cuda))

    sweep("folder", make, args, cuda, rows)


def table(rows, images):
    ok = [r for r in rows if r.get("status") == "ok"]
    best = {}
    for r in ok:
        if r["loader"] not in best or r["images_per_s"] > best[r["loader"]]["images_per_s"]:
            best[r["loader"]] = r
    print(f"\n| loader | best configuration | images/s | vs folder | samples per epoch ({images}) |")
    print("| --- | --- | --- | --- | --- |")
    ref = best.get("folder", {}).get("images_per_s")
    names = list(dict.fromkeys(r["loader"] for r in rows))
    for name in names:
        r = best.get(name)
        if r is None:
            status = next(x["status"] for x in rows if x["loader"] == name)
            print(f"| {name} | - | {status} | | |")
            continue
        vs = f"{r['images_per_s'] / ref:.2f}x" if ref else "-"
        print(f"| {name} | workers {r['workers']}, prefetch {r['prefetch']} | "
              f"{r['images_per_s']:,.0f} | {vs} | {r['samples_per_epoch']} |")
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--xtask", help="the xtask binary (default: target/release/xtask, "
                   ".gpu/bin/xtask or target/debug/xtask, whichever is found first)")
    p.add_argument("--data-dir", default="/tmp/longshore-shards-bench", type=Path)
    p.add_argument("--images", type=int, default=10_000)
    p.add_argument("--shard-size", default="64MiB")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2, help="timed epochs after the warm-up")
    p.add_argument("--workers", default="8,16", help="num_workers values to sweep")
    p.add_argument("--prefetch", default="2,4", help="prefetch_factor values to sweep")
    p.add_argument("--only", default="webdataset,streaming,longshore,folder")
    p.add_argument("--decode", default="cpu,nvjpeg",
                   help="longshore's decoders to run: cpu, nvjpeg (on a GPU) or both")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--clip", action="store_true",
                   help="CLIP-style shards: image + caption (webdataset and longshore rows)")
    args = p.parse_args()
    args.wds = "wds-clip" if args.clip else "wds"
    args.workers = [int(x) for x in args.workers.split(",")]
    args.prefetch = [int(x) for x in args.prefetch.split(",")]
    only = set(args.only.split(","))

    import torch

    cuda = torch.cuda.is_available()
    xtask = find_xtask(args.xtask)
    data = args.data_dir.resolve()
    data.mkdir(parents=True, exist_ok=True)
    shard_urls, images = ensure_data(xtask, data, args.images, args.shard_size)
    if args.clip:
        ensure_clip(data)
        only &= {"webdataset", "longshore"}
    print(f"{images} images in {len(shard_urls)} WebDataset shards; cuda: {cuda}; "
          f"{os.cpu_count()} CPUs", flush=True)
    rows = []
    with Server(xtask, data) as server:
        for name, run in (
            ("webdataset", lambda: bench_webdataset(args, shard_urls, server.endpoint, cuda, rows)),
            ("streaming", lambda: bench_streaming(args, data, cuda, rows)),
            ("longshore", lambda: bench_longshore(args, shard_urls, data, cuda, rows)),
            ("folder", lambda: bench_folder(args, data, cuda, rows)),
        ):
            if name not in only:
                continue
            print(f"\n== {name}", flush=True)
            try:
                run()
            except ImportError as e:
                print(f"  {name}: not available ({e})")
                rows.append({"loader": name, "status": f"not available: {e}"})
    best = table(rows, images)
    if args.out:
        versions = {}
        for mod in ("torch", "torchvision", "webdataset", "streaming", "boto3", "PIL",
                    "longshore"):
            try:
                versions[mod] = __import__(mod).__version__
            except Exception:
                versions[mod] = None
        report = {
            "benchmark": "shards", "images": images, "shards": len(shard_urls),
            "shard_size": args.shard_size, "batch_size": args.batch_size,
            "epochs_timed": args.epochs, "cuda": cuda,
            "device": torch.cuda.get_device_name() if cuda else None,
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "versions": versions, "rows": rows, "best": best,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
