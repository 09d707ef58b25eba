"""Sharded datasets read with ``fields=``: batches are dicts of the named fields (an image
decoded by the pipeline, ints, floats, text, JSON, bytes), read and collated by the Rust
workers.

The WebDataset shards are tars written with Python's tarfile (jpg + txt + json + cls, a
caption with non-ASCII text, an empty caption); the MDS dataset is written by hand in
Streaming's layout (an int and a str column). Each sample's values are a function of its
index, so exactly-once delivery and resume are checked by value.
"""
import io
import json
import os
import struct
import tarfile

import numpy as np
import pytest

import longshore
from longshore import transforms as T

from conftest import guide_python

N = 24
SHARDS = 3


def tf():
    return T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()])


def caption(i):
    # Non-ASCII text, and one empty caption.
    return "" if i == 5 else f"a photo n\u00b0{i} \u2014 caf\u00e9"


def meta(i):
    return {"id": i, "tags": ["x"] * (i % 3), "score": i / 4}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Tar shards of N samples (jpg, txt, json, cls; sample 7 without its txt in the
    ``missing`` copy) and an MDS dataset with an int and a str column."""
    root = tmp_path_factory.mktemp("fields")
    longshore.datasets.write_synthetic_folder(root / "img", classes=2, per_class=N // 2)
    folder = longshore.datasets.ImageFolder(root / "img")
    jpgs = [open(p, "rb").read() for p, _ in folder.samples]
    for name, drop in (("wds", None), ("missing", 7)):
        (root / name).mkdir()
        for s in range(SHARDS):
            with tarfile.open(root / name / f"shard-{s:06d}.tar", "w") as t:
                for i in range(s, N, SHARDS):
                    members = [("jpg", jpgs[i]), ("txt", caption(i).encode()),
                               ("json", json.dumps(meta(i)).encode()),
                               ("cls", str(i).encode())]
                    for ext, payload in members:
                        if i == drop and ext == "txt":
                            continue
                        info = tarfile.TarInfo(f"sample{i:05d}.{ext}")
                        info.size = len(payload)
                        t.addfile(info, io.BytesIO(payload))
    write_mds(root / "mds", [{"cls": i, "text": caption(i)} for i in range(N)])
    return root


def write_mds(out, rows, per_shard=10):
    """An MDS dataset in Streaming's layout: columns ``cls`` (int) and ``text`` (str)."""
    os.makedirs(out)
    shards = []
    for k in range(0, len(rows), per_shard):
        samples = []
        for r in rows[k:k + per_shard]:
            text = r["text"].encode()
            # The sizes of the variable-size columns, then the columns in order.
            samples.append(struct.pack("<I", len(text)) + struct.pack("<q", r["cls"]) + text)
        n = len(samples)
        head = 4 + 4 * (n + 1)
        offsets = np.cumsum([0] + [len(s) for s in samples]).astype(np.uint32) + head
        body = struct.pack("<I", n) + offsets.tobytes() + b"".join(samples)
        name = f"shard.{len(shards):05d}.mds"
        with open(os.path.join(out, name), "wb") as f:
            f.write(body)
        shards.append({"column_encodings": ["int", "str"], "column_names": ["cls", "text"],
                       "column_sizes": [8, None], "compression": None, "format": "mds",
                       "hashes": [], "raw_data": {"basename": name, "bytes": len(body),
                                                  "hashes": {}},
                       "samples": n, "size_limit": 1 << 26, "version": 2, "zip_data": None})
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"shards": shards, "version": 2}, f)


FIELDS = {"jpg": "image", "txt": "text", "json": "json", "cls": "int"}


def web(root, cache, folder="wds", **kw):
    pattern = str(root / folder) + "/shard-{000000..%06d}.tar" % (SHARDS - 1)
    kw.setdefault("fields", FIELDS)
    return longshore.datasets.WebDataset(pattern, transform=kw.pop("transform", tf()),
                                         cache_dir=cache, **kw)


def check_batch(batch, fields=FIELDS):
    assert list(batch) == list(fields)
    labels = [int(v) for v in np.asarray(batch["cls"])]
    if "jpg" in batch:
        assert tuple(batch["jpg"].shape) == (len(labels), 3, 16, 16)
        assert str(batch["jpg"].dtype).endswith("float32")
    if "txt" in batch:
        assert batch["txt"] == [caption(i) for i in labels]
    if "json" in batch:
        assert batch["json"] == [meta(i) for i in labels]
    return labels


@pytest.mark.parametrize("workers", [0, 2])
def test_webdataset_fields_every_sample_once(data, tmp_path, workers):
    ds = web(data, tmp_path / "cache", shuffle=True, seed=3)
    assert ds.fields == FIELDS
    loader = longshore.DataLoader(ds, batch_size=5, num_workers=workers, framework="numpy")
    for _ in range(2):
        labels = []
        for batch in loader:
            assert isinstance(batch, dict)
            labels += check_batch(batch)
        assert sorted(labels) == list(range(N))


def test_fields_through_torch_and_other_decoders(data, tmp_path):
    torch = pytest.importorskip("torch")
    fields = {"cls": "float", "txt": "bytes", "jpg": "image"}
    ds = web(data, tmp_path / "cache", fields=fields)
    seen = []
    for batch in longshore.DataLoader(ds, batch_size=4, num_workers=2):
        assert list(batch) == list(fields)
        assert batch["cls"].dtype == torch.float64 and batch["jpg"].shape[1:] == (3, 16, 16)
        labels = [int(v) for v in batch["cls"].tolist()]
        assert batch["txt"] == [caption(i).encode() for i in labels]
        seen += labels
    assert sorted(seen) == list(range(N))


def test_fields_without_image_need_no_transform(data, tmp_path):
    ds = web(data, tmp_path / "cache", transform=None, fields={"cls": "int", "json": "json"})
    batches = list(longshore.DataLoader(ds, batch_size=8, framework="numpy"))
    labels = [check_batch(b, {"cls": "int", "json": "json"}) for b in batches]
    assert sorted(sum(labels, [])) == list(range(N))


@pytest.mark.parametrize("workers", [0, 2])
def test_mds_int_and_str_columns(data, tmp_path, workers):
    ds = longshore.datasets.StreamingDataset(local=str(data / "mds"),
                                             fields={"cls": "int", "text": "text"})
    assert len(ds) == N
    loader = longshore.DataLoader(ds, batch_size=7, num_workers=workers, framework="numpy")
    seen = []
    for batch in loader:
        assert list(batch) == ["cls", "text"]
        labels = [int(v) for v in np.asarray(batch["cls"])]
        assert np.asarray(batch["cls"]).dtype == np.int64
        assert batch["text"] == [caption(i) for i in labels]
        seen += labels
    assert sorted(seen) == list(range(N))


def test_missing_field_raises_naming_it_or_is_skipped(data, tmp_path):
    ds = web(data, tmp_path / "cache", folder="missing")
    with pytest.raises(Exception) as e:
        list(longshore.DataLoader(ds, batch_size=4, framework="numpy"))
    msg = str(e.value)
    for cause in (e.value.__cause__, e.value.__context__):
        msg += " " + str(cause)
    assert "txt" in msg and "sample00007" in msg and "shard-000001.tar" in msg, msg
    ds = web(data, tmp_path / "cache2", folder="missing")
    loader = longshore.DataLoader(ds, batch_size=4, framework="numpy", on_sample_error="skip")
    labels = [i for b in loader for i in check_batch(b)]
    assert 7 not in labels and set(range(N)) - {7} <= set(labels)
    assert loader.stats["skipped_samples"] == 1, loader.stats


@pytest.mark.parametrize("fields, words", [
    ({"jpg": "picture"}, ["'jpg'", "'picture'"]),
    ({"jpg": "image", "png": "image"}, ["'jpg'", "'png'", "two image fields"]),
    ({}, ["at least one field"]),
])
def test_bad_fields_are_refused(data, tmp_path, fields, words):
    with pytest.raises(ValueError) as e:
        web(data, tmp_path / "cache", fields=fields)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_image_field_needs_a_transform_and_nvjpeg_needs_an_image_field(data, tmp_path):
    with pytest.raises(ValueError, match="'jpg'.*transform"):
        web(data, tmp_path / "cache", transform=None)
    with pytest.raises(TypeError, match="dict"):
        web(data, tmp_path / "cache", fields=["jpg"])
    ds = web(data, tmp_path / "cache", transform=None, fields={"txt": "text", "cls": "int"})
    # Refused before any GPU is touched (the Rust loader of DataLoader(device="cuda")).
    options = dict(batch_size=4, shuffle=False, num_workers=0, pin_memory=False,
                   drop_last=False, prefetch_factor=None, persistent_workers=False,
                   timeout=0.0, seed=0, in_order=True, on_sample_error="raise",
                   worker_priority="normal")
    with pytest.raises(ValueError, match="nvjpeg.*image field.*none"):
        longshore._longshore._Loader(ds._native, options, device=0, decode="nvjpeg")
    with pytest.raises(TypeError, match="DataLoader"):
        next(iter(ds))


def test_nvjpeg_decodes_the_image_field_and_carries_the_others(data, tmp_path):
    """On a GPU: decode="nvjpeg" with fields decodes the image on the device (the CPU
    path's pixels within nvJPEG's decoding differences, the same crops) and delivers every
    other field as the CPU path does; a checkpoint after 2 batches resumes the rest exactly."""
    from conftest import need_cuda

    torch = need_cuda()
    train = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])

    def loader(decode, cache, state=None):
        ds = web(data, tmp_path / cache, transform=train, shuffle=True, seed=5)
        out = longshore.DataLoader(ds, batch_size=5, num_workers=2, device="cuda",
                                   decode=decode)
        if state is not None:
            out.load_state_dict(state)
        return out

    got = {}
    for decode in ("cpu", "nvjpeg"):
        images, order = {}, []
        for batch in loader(decode, decode):
            assert list(batch) == list(FIELDS)
            assert batch["jpg"].is_cuda and batch["cls"].is_cuda
            assert tuple(batch["jpg"].shape) == (len(batch["txt"]), 3, 24, 24)
            labels = batch["cls"].tolist()
            assert batch["txt"] == [caption(i) for i in labels]
            assert batch["json"] == [meta(i) for i in labels]
            for img, i in zip(batch["jpg"].cpu(), labels):
                images[i] = img
            order.append(labels)
        got[decode] = (images, order)
    torch.cuda.synchronize()
    (cpu, cpu_order), (gpu, gpu_order) = got["cpu"], got["nvjpeg"]
    assert gpu_order == cpu_order and sorted(gpu) == list(range(N))
    worst = max(float((gpu[i] - cpu[i]).abs().mean()) * 255 for i in range(N))
    assert worst < 2.0, f"mean difference {worst:.2f} levels"
    first = loader("nvjpeg", "resume")
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    del it
    rest = [b["cls"].tolist() for b in loader("nvjpeg", "resume2", state)]
    assert rest == gpu_order[2:]


def test_nvjpeg_fields_in_a_fresh_interpreter(data, tmp_path):
    """On a GPU, the user's path in a fresh interpreter (no CUDA context, no warm pools): a
    WebDataset with fields decoded by nvJPEG, every sample once with its own caption."""
    from conftest import need_cuda, run_fresh

    need_cuda()
    pattern = str(data / "wds") + "/shard-{000000..%06d}.tar" % (SHARDS - 1)
    out = run_fresh(f"""
import longshore
from longshore import transforms as T
ds = longshore.datasets.WebDataset({pattern!r}, shuffle=True, seed=1, cache_dir={str(tmp_path)!r},
    transform=T.Compose([T.RandomResizedCrop(16), T.ToTensor()]),
    fields={{"jpg": "image", "txt": "text", "cls": "int"}})
loader = longshore.DataLoader(ds, batch_size=5, num_workers=2, device="cuda", decode="nvjpeg")
for batch in loader:
    assert batch["jpg"].is_cuda and batch["jpg"].shape[1:] == (3, 16, 16)
    for i, text in zip(batch["cls"].tolist(), batch["txt"]):
        print(i, text.encode().hex())
""", tmp_path)
    rows = [line.split(" ", 1) for line in out.splitlines()]
    assert sorted(int(i) for i, _ in rows) == list(range(N))
    assert all(bytes.fromhex(text).decode() == caption(int(i)) for i, text in rows)


def test_nvjpeg_fields_of_a_sharded_mixture(data, tmp_path):
    """On a GPU: a Mixture of two WebDatasets with fields, decoded by nvJPEG: the draws of
    each member, every field of a row its own sample's, the members' counts in stats."""
    from conftest import need_cuda
    from longshore.data import Mixture

    need_cuda()
    members = [longshore.datasets.WebDataset(str(data / "wds" / f"shard-{s:06d}.tar"),
                                             transform=tf(), fields=FIELDS,
                                             cache_dir=tmp_path / "cache") for s in range(2)]
    mix = Mixture(members, [3, 1], stop="first_exhausted", seed=2)
    loader = longshore.DataLoader(mix, batch_size=4, num_workers=2, device="cuda",
                                  decode="nvjpeg")
    labels = []
    for batch in loader:
        assert batch["jpg"].is_cuda and tuple(batch["jpg"].shape)[1:] == (3, 16, 16)
        labels += check_batch({k: v.cpu() if hasattr(v, "cpu") else v
                               for k, v in batch.items()})
    # Shard s holds the samples i with i % SHARDS == s.
    drawn = [sum(1 for i in labels if i % SHARDS == s) for s in range(2)]
    assert drawn == mix.draws and len(set(labels)) == len(labels)
    assert loader.stats["sources"] == mix.draws


def test_nvjpeg_skips_an_undecodable_image_from_every_field(data, tmp_path):
    """On a GPU: a JPEG whose header reads but whose data is cut (the workers pass it, nvJPEG
    and the CPU fallback cannot decode it) is, under on_sample_error="skip", dropped from the
    image and from every other field, and counted in stats["skipped_samples"]; under "raise"
    it is an error."""
    from conftest import need_cuda

    torch = need_cuda()
    folder = longshore.datasets.ImageFolder(data / "img")
    out = tmp_path / "cut"
    out.mkdir()
    jpgs = [open(p, "rb").read() for p, _ in folder.samples[:10]]
    # A baseline JPEG (SOF0): nvJPEG's engines take it, so the device stage finds the damage.
    cut = next(i for i, j in enumerate(jpgs) if b"\xff\xc0" in j)
    with tarfile.open(out / "shard-000000.tar", "w") as t:
        for i, jpg in enumerate(jpgs):
            if i == cut:
                jpg = jpg[:len(jpg) // 2]
            for ext, payload in (("jpg", jpg), ("txt", caption(i).encode()),
                                 ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"sample{i:05d}.{ext}")
                info.size = len(payload)
                t.addfile(info, io.BytesIO(payload))
    fields = {"jpg": "image", "txt": "text", "cls": "int"}

    def loader(policy, cache):
        ds = longshore.datasets.WebDataset(str(out / "shard-000000.tar"), transform=tf(),
                                           fields=fields, cache_dir=tmp_path / cache)
        return longshore.DataLoader(ds, batch_size=10, device="cuda", decode="nvjpeg",
                                    on_sample_error=policy)

    skip = loader("skip", "a")
    (batch,) = list(skip)
    labels = batch["cls"].tolist()
    assert labels == [i for i in range(10) if i != cut]
    assert batch["txt"] == [caption(i) for i in labels]
    assert tuple(batch["jpg"].shape) == (9, 3, 16, 16)
    assert skip.stats["skipped_samples"] == 1, skip.stats
    torch.cuda.synchronize()
    with pytest.raises(Exception, match=f"sample {cut}|sample{cut:05d}"):
        list(loader("raise", "b"))


@pytest.mark.parametrize("workers_after", [0, 2])
def test_resume_gives_the_remaining_batches(data, tmp_path, workers_after):
    def loader(workers):
        ds = web(data, tmp_path / "cache", shuffle=True, seed=11)
        return longshore.DataLoader(ds, batch_size=3, num_workers=workers, framework="numpy")

    def key(batch):
        return (check_batch(batch), batch["txt"], batch["jpg"].tobytes())

    full = [key(b) for b in loader(2)]
    first = loader(2)
    it = iter(first)
    head = [key(next(it)) for _ in range(3)]
    state = first.state_dict()
    del it
    again = loader(workers_after)
    again.load_state_dict(state)
    rest = [key(b) for b in again]
    if workers_after == 2:
        assert head + rest == full
    else:
        # The same batches, pixels included; their order follows the workers' streams.
        assert sorted(head + rest) == sorted(full)


@pytest.mark.parametrize("size", [16, 256])
@pytest.mark.parametrize("in_pump", ["0", "1"])
def test_device_batches_keep_their_text(data, tmp_path, monkeypatch, size, in_pump):
    """The device path without a GPU (`_Loader`'s cpu_backend hook): the text is read from
    host memory before the copy, whether `__next__` (small batches) or the epoch thread
    (batches over 4 MiB: 256 x 256 images) enqueues it."""
    monkeypatch.setenv("LONGSHORE_UPLOAD_IN_PUMP", in_pump)
    ds = web(data, tmp_path / "cache", transform=T.Compose([T.Resize(size),
                                                            T.CenterCrop(size), T.ToTensor()]))
    options = dict(batch_size=8, shuffle=False, num_workers=2, pin_memory=False,
                   drop_last=False, prefetch_factor=None, persistent_workers=False,
                   timeout=0.0, seed=0, in_order=True, on_sample_error="raise",
                   worker_priority="normal")
    loader = longshore._longshore._Loader(ds._native, options, cpu_backend=True)
    seen = []
    for batch in loader.epoch(np.from_dlpack):
        assert list(batch) == list(FIELDS)
        assert batch["jpg"].shape == (8, 3, size, size)
        seen += check_batch({**batch, "jpg": batch["jpg"][:, :, :16, :16]})
    assert sorted(seen) == list(range(N))


def test_guide_example():
    """The fields example of docs/guide/object-storage.md runs as written."""
    exec(guide_python("object-storage.md", "## Fields beyond image and label"), {})


def tokens(i):
    return np.arange(i * 100, i * 100 + 6, dtype=np.uint16)


def embedding(i):
    return (i + np.arange(6, dtype=np.float32) / 10).reshape(2, 3)


def npy(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    """The same arrays in three formats: tar shards of ``.npy`` members (big-endian for odd
    samples; sample 4's tokens one shorter in the ``ragged`` copy), an MDS dataset with an
    ``ndarray:uint16:6`` column, and Parquet files with list<uint16> and
    fixed_size_list<float32, 6> columns."""
    root = tmp_path_factory.mktemp("arrays")
    for name, short in (("wds", None), ("ragged", 4)):
        (root / name).mkdir()
        for s in range(SHARDS):
            with tarfile.open(root / name / f"shard-{s:06d}.tar", "w") as t:
                for i in range(s, N, SHARDS):
                    tok = tokens(i)[:5] if i == short else tokens(i)
                    if i % 2:
                        tok = tok.astype(">u2")
                    members = [("tok.npy", npy(tok)), ("emb.npy", npy(embedding(i))),
                               ("cls", str(i).encode())]
                    for ext, payload in members:
                        info = tarfile.TarInfo(f"sample{i:05d}.{ext}")
                        info.size = len(payload)
                        t.addfile(info, io.BytesIO(payload))
    # MDS: columns cls (int) and tok (ndarray:uint16:6: the raw elements, a fixed size).
    os.makedirs(root / "mds")
    shards = []
    for k in range(0, N, 10):
        samples = [struct.pack("<q", i) + tokens(i).tobytes() for i in range(k, min(k + 10, N))]
        head = 4 + 4 * (len(samples) + 1)
        offsets = np.cumsum([0] + [len(s) for s in samples]).astype(np.uint32) + head
        body = struct.pack("<I", len(samples)) + offsets.tobytes() + b"".join(samples)
        name = f"shard.{len(shards):05d}.mds"
        (root / "mds" / name).write_bytes(body)
        shards.append({"column_encodings": ["int", "ndarray:uint16:6"],
                       "column_names": ["cls", "tok"], "column_sizes": [8, 12],
                       "compression": None, "format": "mds", "hashes": [],
                       "raw_data": {"basename": name, "bytes": len(body), "hashes": {}},
                       "samples": len(samples), "size_limit": 1 << 26, "version": 2,
                       "zip_data": None})
    (root / "mds" / "index.json").write_text(json.dumps({"shards": shards, "version": 2}))
    return root


def check_arrays(batch, torch=None):
    labels = [int(v) for v in np.asarray(batch["cls"])]
    tok = batch["tok"] if torch is None else batch["tok"].numpy()
    assert tok.dtype == np.uint16 and tok.shape == (len(labels), 6)
    assert np.array_equal(tok, np.stack([tokens(i) for i in labels]))
    if "emb" in batch:
        emb = batch["emb"]
        assert emb.dtype == np.float32 and emb.shape == (len(labels), 2, 3)
        assert np.array_equal(emb, np.stack([embedding(i) for i in labels]))
    return labels


@pytest.mark.parametrize("workers", [0, 2])
def test_npy_members_are_stacked_arrays(arrays, tmp_path, workers):
    ds = web(arrays, tmp_path / "cache", transform=None,
             fields={"tok.npy": "array", "emb.npy": "array", "cls": "int"})
    seen = []
    for batch in longshore.DataLoader(ds, batch_size=4, num_workers=workers, framework="numpy"):
        assert list(batch) == ["tok.npy", "emb.npy", "cls"]
        seen += check_arrays({"tok": batch["tok.npy"], "emb": batch["emb.npy"],
                              "cls": batch["cls"]})
    assert sorted(seen) == list(range(N))


def test_arrays_of_a_batch_must_share_a_shape(arrays, tmp_path):
    ds = web(arrays, tmp_path / "cache", folder="ragged", transform=None,
             fields={"tok.npy": "array"})
    with pytest.raises(Exception) as e:
        list(longshore.DataLoader(ds, batch_size=N, framework="numpy"))
    msg = " ".join(str(x) for x in (e.value, e.value.__cause__, e.value.__context__))
    assert "'tok.npy'" in msg or '"tok.npy"' in msg, msg
    assert "sample00004" in msg and "stacked" in msg, msg


@pytest.mark.parametrize("workers", [0, 2])
def test_mds_ndarray_column(arrays, workers):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "uint16"):
        pytest.skip("this torch has no uint16")
    ds = longshore.datasets.StreamingDataset(local=str(arrays / "mds"),
                                             fields={"tok": "array", "cls": "int"})
    seen = []
    for batch in longshore.DataLoader(ds, batch_size=5, num_workers=workers):
        assert batch["tok"].dtype == torch.uint16
        seen += check_arrays(batch, torch)
    assert sorted(seen) == list(range(N))


def test_parquet_list_columns(arrays, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    (tmp_path / "pq").mkdir()
    for s in range(SHARDS):
        ids = list(range(s, N, SHARDS))
        table = pa.table({
            "tok": pa.array([tokens(i).tolist() for i in ids], pa.list_(pa.uint16())),
            "emb": pa.array([embedding(i).ravel().tolist() for i in ids],
                            pa.list_(pa.float32(), 6)),
            "cls": pa.array(ids, pa.int64()),
        })
        pq.write_table(table, tmp_path / "pq" / f"part-{s}.parquet", row_group_size=3)
    ds = longshore.datasets.ParquetDataset(str(tmp_path / "pq") + "/part-{0..%d}.parquet"
                                           % (SHARDS - 1),
                                           cache_dir=tmp_path / "cache",
                                           fields={"tok": "array", "emb": "array", "cls": "int"})
    seen = []
    for batch in longshore.DataLoader(ds, batch_size=4, num_workers=2, framework="numpy"):
        # A fixed-size list is one flat list per row: [B, 6].
        emb = np.asarray(batch["emb"])
        assert emb.shape == (len(batch["cls"]), 6)
        seen += check_arrays({"tok": np.asarray(batch["tok"]), "cls": batch["cls"],
                              "emb": emb.reshape(-1, 2, 3)})
    assert sorted(seen) == list(range(N))


@pytest.mark.parametrize("decode", ["cpu", "nvjpeg"])
def test_parquet_image_struct_with_caption_and_label(data, tmp_path, decode):
    """Hugging Face's image layout (an ``image`` struct<bytes, path> column) with a caption
    and a ``label`` column read as fields, on the CPU and (on a GPU) by nvJPEG: every row
    once, each field its own row's (a field named ``label`` beside the decoder's own tensors)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    device = None
    if decode == "nvjpeg":
        from conftest import need_cuda

        need_cuda()
        device = "cuda"
    folder = longshore.datasets.ImageFolder(data / "img")
    jpgs = [open(p, "rb").read() for p, _ in folder.samples]
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    (tmp_path / "pq").mkdir()
    for part in range(SHARDS):
        ids = list(range(part, N, SHARDS))
        pq.write_table(pa.table({
            "image": pa.array([{"bytes": jpgs[i], "path": f"{i}.jpg"} for i in ids], image_type),
            "text": pa.array([caption(i) for i in ids]),
            "label": pa.array(ids, pa.int64()),
        }), tmp_path / "pq" / f"part-{part}.parquet", row_group_size=3)
    ds = longshore.datasets.ParquetDataset(
        str(tmp_path / "pq") + "/part-{0..%d}.parquet" % (SHARDS - 1), transform=tf(),
        cache_dir=tmp_path / "cache", shuffle=True, seed=3,
        fields={"image": "image", "text": "text", "label": "int"})
    loader = longshore.DataLoader(ds, batch_size=5, num_workers=2, device=device,
                                  decode=decode)
    seen = []
    for batch in loader:
        assert list(batch) == ["image", "text", "label"]
        labels = [int(v) for v in batch["label"].tolist()]
        assert tuple(batch["image"].shape) == (len(labels), 3, 16, 16)
        assert batch["text"] == [caption(i) for i in labels]
        seen += labels
    assert sorted(seen) == list(range(N))


def caption_length(sample):
    """A map= function (module level: workers started by spawn unpickle it)."""
    assert sample["__key__"].split("#")[1].startswith("sample")
    return sample["jpg"], len(sample["txt"]), sample["cls"], sample["json"]["id"]


@pytest.mark.parametrize("workers,context", [(0, None), (2, "fork"), (2, "spawn"),
                                             (2, "thread")])
def test_map_runs_in_worker_processes_on_the_decoded_fields(data, tmp_path, workers, context):
    torch = pytest.importorskip("torch")
    fields = {"jpg": "image", "txt": "text", "json": "json", "cls": "int"}
    ds = web(data, tmp_path / "cache", fields=fields, map=caption_length, shuffle=True, seed=2)
    assert longshore.data._native_or_none(ds) is None  # a Python dataset
    kw = ({"worker_mode": "thread"} if context == "thread"
          else {"multiprocessing_context": context})
    loader = longshore.DataLoader(ds, batch_size=4, num_workers=workers, **kw)
    seen = {}
    for images, lengths, labels, ids in loader:
        assert images.shape[1:] == (3, 16, 16) and images.dtype == torch.float32
        assert labels.tolist() == ids.tolist()
        for img, n, i in zip(images, lengths.tolist(), labels.tolist()):
            assert n == len(caption(i)) and i not in seen
            seen[i] = img
    assert sorted(seen) == list(range(N))
    # The pixels are the native fields path's: the same pipeline, the same per-sample seed.
    native = web(data, tmp_path / "cache2", fields=fields, shuffle=True, seed=2)
    for batch in longshore.DataLoader(native, batch_size=4, num_workers=2):
        for img, i in zip(batch["jpg"], batch["cls"].tolist()):
            assert torch.equal(img, seen[i]), i


def test_map_needs_fields_and_stays_out_of_mixtures(data, tmp_path):
    with pytest.raises(ValueError, match="fields="):
        web(data, tmp_path / "cache", fields=None, map=caption_length)
    ds = web(data, tmp_path / "cache", fields={"cls": "int"}, transform=None, map=dict)
    other = web(data, tmp_path / "cache", fields={"cls": "int"}, transform=None)
    with pytest.raises(ValueError, match="map="):
        longshore.data.Mixture([ds, other], [1, 1])


def label_of(sample):
    return sample["cls"]


@pytest.mark.parametrize("drop_last", [False, True])
def test_map_keeps_ranks_equal(data, tmp_path, drop_last):
    pytest.importorskip("torch")
    per_rank = []
    for rank in range(3):
        ds = web(data, tmp_path / "cache", fields={"cls": "int"}, transform=None,
                 map=label_of, shuffle=True, rank=rank, world_size=3)
        loader = longshore.DataLoader(ds, batch_size=3, num_workers=2, drop_last=drop_last,
                                      multiprocessing_context="forkserver")
        per_rank.append([b.tolist() for b in loader])
    assert len({len(b) for b in per_rank}) == 1, [len(b) for b in per_rank]
    labels = [i for batches in per_rank for b in batches for i in b]
    if drop_last:
        assert len(labels) == len(set(labels)) and all(len(b) == 3 for r in per_rank for b in r)
    else:
        assert set(labels) == set(range(N))  # 24 over 3 ranks: 8 each, no padding
        assert len(labels) == N


def test_map_resumes_exactly(data, tmp_path):
    pytest.importorskip("torch")

    def loader():
        ds = web(data, tmp_path / "cache", fields={"cls": "int"}, transform=None,
                 map=label_of, shuffle=True, seed=5)
        return longshore.DataLoader(ds, batch_size=4, num_workers=2)

    full = [b.tolist() for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it).tolist() for _ in range(2)]
    state = first.state_dict()
    it.close()
    again = loader()
    again.load_state_dict(state)
    assert head + [b.tolist() for b in again] == full


@pytest.mark.parametrize("workers", [0, 3])
def test_map_reads_each_epoch_of_the_loader(data, tmp_path, workers):
    """Every epoch its own order, in the loader's process or in persistent spawn workers
    (whose streams learn the loader's epoch)."""
    pytest.importorskip("torch")
    ds = web(data, tmp_path / "cache", fields={"cls": "int"}, transform=None, map=label_of,
             shuffle=True, seed=9)
    kw = dict(persistent_workers=True, multiprocessing_context="spawn") if workers else {}
    loader = longshore.DataLoader(ds, batch_size=5, num_workers=workers, **kw)
    epochs = [[i for b in loader for i in b.tolist()] for _ in range(3)]
    for e in epochs:
        assert sorted(e) == list(range(N))
    assert epochs[0] != epochs[1] != epochs[2], "each epoch its own order"
    loader.set_epoch(0)
    assert [i for b in loader for i in b.tolist()] == epochs[0]
