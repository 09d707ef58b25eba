"""longshore.datasets.WebDataset and StreamingDataset: image shards read by the Rust workers.

Each sample's label is its index in the source folder, so that exactly-once delivery and
resume can be checked by label; pixels are checked against datasets.ImageFolder. The S3 test
runs moto's server on 127.0.0.1 (real HTTP, signing and listing; skipped where moto is not
installed: the test extra installs it).
"""
import io
import json
import os
import tarfile
from collections import Counter

import numpy as np
import pytest

import longshore
from longshore import transforms as T

N = 48


def tf():
    # Deterministic: pixels comparable with the folder's.
    return T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor()])


def train_tf():
    return T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToTensor()])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A synthetic folder of N JPEGs, and the same images (label = index in the folder) as
    WebDataset shards (written by longshore and by Python's tarfile) and MDS shards."""
    root = tmp_path_factory.mktemp("shards")
    longshore.datasets.write_synthetic_folder(root / "img", classes=4, per_class=N // 4)
    folder = longshore.datasets.ImageFolder(root / "img", transform=tf())
    samples = [(open(p, "rb").read(), i) for i, (p, _) in enumerate(folder.samples)]
    wds = longshore.datasets.write_shards(root / "wds", samples, shard_size=40_000)
    mds = longshore.datasets.write_shards(root / "mds", samples, format="mds",
                                          shard_size=40_000)
    assert len(wds) > 4 and len(mds) > 4
    # Tar shards as other tools write them (no index: counted by a scan).
    (root / "tar").mkdir()
    for s in range(4):
        with tarfile.open(root / "tar" / f"part-{s:03d}.tar", "w") as t:
            for i in range(s, N, 4):
                for ext, payload in (("jpg", samples[i][0]), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"sample{i:05d}.{ext}")
                    info.size = len(payload)
                    t.addfile(info, io.BytesIO(payload))
    return root, folder, wds


def labels_of(loader):
    out = []
    for _, y in loader:
        out += [int(v) for v in np.asarray(y)]
    return out


def web(root, cache, **kw):
    last = len([n for n in os.listdir(root / "wds") if n.endswith(".tar")]) - 1
    pattern = str(root / "wds") + "/shard-{000000..%06d}.tar" % last
    return longshore.datasets.WebDataset(pattern, transform=kw.pop("transform", tf()),
                                         cache_dir=cache, **kw)


def test_webdataset_epoch_exactly_once_and_pixels(data, tmp_path):
    root, folder, shards = data
    ds = web(root, tmp_path / "c")
    assert len(ds) == N and len(ds.urls) == len(shards)
    loader = longshore.DataLoader(ds, batch_size=4, num_workers=2, framework="numpy")
    assert len(loader) == N // 4
    seen, images = [], {}
    for x, y in loader:
        assert x.shape == (4, 3, 32, 32) and x.dtype == np.float32
        for img, label in zip(x, y):
            images[int(label)] = img
        seen += [int(v) for v in y]
    assert sorted(seen) == list(range(N))
    for i in (0, 17, N - 1):
        ref, label = folder[i]
        assert label == i * 4 // N  # the folder's class
        np.testing.assert_array_equal(images[i], ref)


def test_tar_shards_without_index_and_iteration_outside_loader(data, tmp_path):
    root, folder, _ = data
    ds = longshore.datasets.WebDataset(
        str(root / "tar" / "part-{000..003}.tar"), transform=tf(), cache_dir=tmp_path / "c")
    assert len(ds) == N
    got = list(ds)
    assert sorted(label for _, label in got) == list(range(N))
    img, label = got[5]
    np.testing.assert_array_equal(img, folder[label][0])


def test_streaming_dataset_mds(data, tmp_path):
    root, folder, _ = data
    ds = longshore.datasets.StreamingDataset(local=str(root / "mds"), transform=tf())
    assert len(ds) == N
    assert sorted(labels_of(longshore.DataLoader(ds, batch_size=6, num_workers=3))) \
        == list(range(N))
    img, label = next(iter(ds))
    np.testing.assert_array_equal(img, folder[label][0])
    # Streaming's arguments: batch_size must agree with the loader's; a cache_limit string.
    ds = longshore.datasets.StreamingDataset(
        remote=str(root / "mds"), local=str(tmp_path / "cache"), transform=tf(),
        batch_size=8, cache_limit="10mb", shuffle=True)
    assert len(longshore.DataLoader(ds, batch_size=8, num_workers=2)) == N // 8
    with pytest.raises(ValueError, match="batch_size=8"):
        longshore.DataLoader(ds, batch_size=4)


def test_epochs_advance_and_set_epoch_repeats(data, tmp_path):
    root, _, _ = data
    ds = web(root, tmp_path / "c", shuffle=True, seed=3, shuffle_block=16)
    loader = longshore.DataLoader(ds, batch_size=4, num_workers=2)
    e0, e1 = labels_of(loader), labels_of(loader)
    assert sorted(e0) == sorted(e1) == list(range(N))
    assert e0 != e1  # the second iteration reads epoch 1
    loader.set_epoch(0)
    assert labels_of(loader) == e0
    # The same order from another loader with the same seed (any worker count gives the
    # same global order; with one rank and the same workers, the same batches).
    other = longshore.DataLoader(web(root, tmp_path / "c2", shuffle=True, seed=3,
                                     shuffle_block=16), batch_size=4, num_workers=2)
    assert labels_of(other) == e0


@pytest.mark.parametrize("workers_after", [1, 3])
def test_resume_with_other_workers_and_ranks(data, tmp_path, workers_after):
    root, _, _ = data
    ds = web(root, tmp_path / "c", shuffle=True, seed=11, shuffle_block=8)
    loader = longshore.DataLoader(ds, batch_size=4, num_workers=2, drop_last=True)
    loader.set_epoch(2)
    it = iter(loader)
    first = []
    for _ in range(5):
        first += [int(v) for v in next(it)[1]]
    state = json.loads(json.dumps(loader.state_dict()))  # JSON-serialisable
    assert state["epoch"] == 2
    del it
    # A new job: one rank with other workers.
    again = longshore.DataLoader(web(root, tmp_path / "c", shuffle=True, seed=11,
                                     shuffle_block=8),
                                 batch_size=4, num_workers=workers_after, drop_last=True)
    again.load_state_dict(state)
    rest = labels_of(again)
    assert sorted(first + rest) == list(range(N))
    # Or two ranks: each gets the same number of the remaining samples, all exactly once.
    per_rank = []
    for rank in range(2):
        dl = longshore.DataLoader(
            web(root, tmp_path / "c", shuffle=True, seed=11, shuffle_block=8, rank=rank,
                world_size=2),
            batch_size=2, num_workers=workers_after, drop_last=True)
        dl.load_state_dict(state)
        per_rank.append(labels_of(dl))
    assert len(per_rank[0]) == len(per_rank[1])
    assert sorted(first + per_rank[0] + per_rank[1]) == list(range(N))
    # After the resumed epoch, the next one starts whole.
    assert sorted(labels_of(again)) == list(range(N))


def test_state_dict_between_epochs_is_the_next_epoch(data, tmp_path):
    root, _, _ = data
    loader = longshore.DataLoader(web(root, tmp_path / "c", shuffle=True), batch_size=4)
    labels_of(loader)
    state = loader.state_dict()
    assert state["epoch"] == 1
    fresh = longshore.DataLoader(web(root, tmp_path / "c", shuffle=True), batch_size=4)
    fresh.load_state_dict(state)
    fresh_epoch = labels_of(fresh)
    assert fresh_epoch == labels_of(loader)  # epoch 1 on both
    with pytest.raises(ValueError, match="sharded"):
        fresh.load_state_dict({"epoch": 0, "version": 1})


def test_ranks_split_the_epoch_equally(data, tmp_path):
    root, _, _ = data
    got = []
    for rank in range(3):
        ds = web(root, tmp_path / "c", shuffle=True, rank=rank, world_size=3)
        assert (ds.rank, ds.world_size) == (rank, 3)
        got.append(labels_of(longshore.DataLoader(ds, batch_size=4, num_workers=2)))
    assert len({len(g) for g in got}) == 1
    counts = Counter(sum(got, []))
    assert set(counts) == set(range(N))
    # Padding repeats make the ranks equal (48 samples over 3 ranks x 2 workers x 4).
    assert sum(counts.values()) == len(got) * len(got[0])


def test_spec_shared_between_ranks(data, tmp_path):
    root, _, _ = data
    first = web(root, tmp_path / "c", rank=0, world_size=2)
    other = longshore.datasets.WebDataset([], transform=tf(), spec=first.spec, rank=1,
                                          world_size=2, cache_dir=tmp_path / "c")
    assert other.urls == first.urls and len(other) == N


def test_torch_conventions_and_bad_arguments(data, tmp_path):
    root, _, _ = data
    ds = web(root, tmp_path / "c")
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        longshore.DataLoader(ds, batch_size=4, shuffle=True)
    with pytest.raises(ValueError, match="in_order"):
        longshore.DataLoader(ds, batch_size=4, in_order=False)
    with pytest.raises(ValueError, match="transform"):
        longshore.datasets.WebDataset(str(root / "wds" / "shard-000000.tar"))
    with pytest.raises(ValueError, match="budget"):
        web(root, tmp_path / "c3", cache_budget=1000)
    with pytest.raises(ValueError, match="remote"):
        longshore.datasets.StreamingDataset(transform=tf())
    with pytest.raises(ValueError, match="rank"):
        web(root, tmp_path / "c", rank=0)
    with pytest.raises(OSError, match="nope"):
        longshore.datasets.WebDataset(str(tmp_path / "nope-{0..3}.tar"), transform=tf())


def test_corrupt_image_names_shard_and_key(data, tmp_path):
    root, _, _ = data
    (tmp_path / "bad").mkdir()
    good = open(root / "tar" / "part-000.tar", "rb").read()
    with tarfile.open(tmp_path / "bad" / "b-0.tar", "w") as t:
        for i, payload in enumerate([b"not a jpeg at all", b"\xff\xd8\xff\xe0broken"]):
            for ext, p in (("jpg", payload), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"bad{i}.{ext}")
                info.size = len(p)
                t.addfile(info, io.BytesIO(p))
    (tmp_path / "bad" / "b-1.tar").write_bytes(good)
    ds = longshore.datasets.WebDataset(str(tmp_path / "bad" / "b-{0..1}.tar"),
                                       transform=tf(), cache_dir=tmp_path / "c")
    with pytest.raises(longshore.SampleError, match=r"b-0\.tar#bad0\.jpg"):
        labels_of(longshore.DataLoader(ds, batch_size=2))
    # on_sample_error="skip": the other shard's samples all arrive.
    skipped = labels_of(longshore.DataLoader(ds, batch_size=2, on_sample_error="skip"))
    assert sorted(skipped) == sorted(range(0, N, 4))


def test_s3_server(data, tmp_path, monkeypatch):
    """Through moto's S3 server on 127.0.0.1: signed requests, a listing, range reads."""
    server_mod = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    root, _, shards = data
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="train")
        for name in os.listdir(root / "wds"):
            s3.upload_file(str(root / "wds" / name), "train", f"wds/{name}")
        for name in os.listdir(root / "mds"):
            s3.upload_file(str(root / "mds" / name), "train", f"imgs/{name}")
        ds = longshore.datasets.WebDataset(
            "s3://train/wds/shard-{000000..%06d}.tar" % (len(shards) - 1), transform=train_tf(),
            shuffle=True, cache_dir=tmp_path / "c")
        loader = longshore.DataLoader(ds, batch_size=4, num_workers=2)
        x, _ = next(iter(loader))
        assert tuple(x.shape) == (4, 3, 24, 24)
        assert sorted(labels_of(loader)) == list(range(N))
        ms = longshore.datasets.StreamingDataset(remote="s3://train/imgs",
                                                 local=str(tmp_path / "m"), transform=tf())
        assert sorted(labels_of(longshore.DataLoader(ms, batch_size=4, num_workers=2))) \
            == list(range(N))
        # The same store configured by storage_options alone (object_store's keys).
        for k in env:
            monkeypatch.delenv(k)
        opts = {"aws_endpoint": endpoint, "aws_access_key_id": "testing",
                "aws_secret_access_key": "testing", "aws_region": "us-east-1",
                "aws_allow_http": True}
        pattern = "s3://train/wds/shard-{000000..%06d}.tar" % (len(shards) - 1)
        so = longshore.datasets.WebDataset(pattern, transform=tf(), cache_dir=tmp_path / "o",
                                           storage_options=opts)
        assert sorted(labels_of(longshore.DataLoader(so, batch_size=4, num_workers=2))) \
            == list(range(N))
        with pytest.raises(ValueError, match="endpoint"):
            longshore.datasets.WebDataset(pattern, transform=tf(), cache_dir=tmp_path / "p",
                                          storage_options={"endpoint": endpoint})
    finally:
        server.stop()


def test_cuda_batches(data, tmp_path):
    from conftest import need_cuda

    torch = need_cuda()
    root, _, _ = data
    loader = longshore.DataLoader(web(root, tmp_path / "c", transform=train_tf()),
                                  batch_size=8, num_workers=2, device="cuda")
    labels = []
    for x, y in loader:
        assert x.is_cuda and x.shape == (8, 3, 24, 24)
        labels += y.tolist()
    torch.cuda.synchronize()
    assert sorted(labels) == list(range(N))



def test_guide_example():
    """The Python example of docs/guide/object-storage.md runs as written."""
    guide = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "guide", "object-storage.md")
    text = open(guide).read()
    section = text[text.index("## Datasets in object storage"):]
    section = section[:section.index("\n## ", 1)]
    blocks = section.split("```python\n")[1:]
    assert len(blocks) == 1, "one Python example in the section"
    exec(compile(blocks[0].split("```")[0], "guide.md", "exec"), {})


def test_nvjpeg_decoding_matches_the_cpu(data, tmp_path):
    """decode="nvjpeg": the workers read the shards, nvJPEG decodes on the GPU; each sample's
    pixels are the CPU pipeline's within a few levels (the same crops: per-sample seeds)."""
    from conftest import need_cuda

    torch = need_cuda()
    root, _, _ = data
    train = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToTensor()])
    got = {}
    for decode in ("cpu", "nvjpeg"):
        loader = longshore.DataLoader(web(root, tmp_path / "c", transform=train, shuffle=True),
                                      batch_size=8, num_workers=2, device="cuda",
                                      decode=decode)
        out = {}
        for x, y in loader:
            assert x.is_cuda and tuple(x.shape) == (8, 3, 40, 40)
            for img, label in zip(x.cpu(), y.tolist()):
                out[label] = img
        got[decode] = out
    torch.cuda.synchronize()
    assert sorted(got["nvjpeg"]) == list(range(N))
    worst = max(float((got["nvjpeg"][i] - got["cpu"][i]).abs().mean()) * 255 for i in range(N))
    assert worst < 2.0, f"mean difference {worst:.2f} levels"


def test_parquet_dataset_hugging_face_layout(data, tmp_path):
    """Parquet files as Hugging Face writes an image dataset (pyarrow, snappy): an ``image``
    struct<bytes, path> column and an int ``label``."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    root, folder, _ = data
    samples = [(open(p, "rb").read(), i) for i, (p, _) in enumerate(folder.samples)]
    (tmp_path / "pq").mkdir()
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for part in range(3):
        rows = samples[part::3]
        table = pa.table({
            "image": pa.array([{"bytes": b, "path": f"{i}.jpg"} for b, i in rows], image_type),
            "label": pa.array([i for _, i in rows], pa.int64()),
        })
        pq.write_table(table, tmp_path / "pq" / f"train-{part:05d}-of-00003.parquet",
                       row_group_size=5)
    ds = longshore.datasets.ParquetDataset(
        str(tmp_path / "pq" / "train-{00000..00002}-of-00003.parquet"), transform=tf(),
        cache_dir=tmp_path / "c")
    assert len(ds) == N
    images = {}
    for x, y in longshore.DataLoader(ds, batch_size=4, num_workers=2, framework="numpy"):
        for img, label in zip(x, y):
            images[int(label)] = img
    assert sorted(images) == list(range(N))
    for i in (0, 29):
        np.testing.assert_array_equal(images[i], folder[i][0])
