"""Damaged shards from Python (issue 36): an error naming the shard, member and byte offset
under on_sample_error="raise", a counted skip that reaches `loader.stats` and Python's
`logging` under "skip", with and without a shard index; `len()` never shrinks because of
damage, and every rank yields exactly `len(loader)` batches whatever is skipped."""
import io
import logging
import os
import shutil
import tarfile

import numpy as np
import pytest

import longshore
from longshore import _logs
from longshore import transforms as T

N = 60


def tf():
    return T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()])


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """N PNG-free JPEG samples in 6 tar shards (label = index), with the writer's index."""
    root = tmp_path_factory.mktemp("damage")
    longshore.datasets.write_synthetic_folder(root / "img", classes=3, per_class=N // 3)
    folder = longshore.datasets.ImageFolder(root / "img", transform=tf())
    samples = [(open(p, "rb").read(), i) for i, (p, _) in enumerate(folder.samples)]
    urls = longshore.datasets.write_shards(root / "wds", samples, shard_size=16_000)
    assert len(urls) >= 4, urls
    return root


def copy(shards, tmp_path, index=True):
    out = tmp_path / "wds"
    shutil.copytree(shards / "wds", out)
    if not index:
        for name in os.listdir(out):
            if name.endswith(".json"):
                os.remove(out / name)
    names = sorted(n for n in os.listdir(out) if n.endswith(".tar"))
    return out, names


def truncate(path):
    """Cuts a shard in the middle of one of its later members' data."""
    with tarfile.open(path) as t:
        members = t.getmembers()
    m = members[len(members) * 2 // 3]
    cut = m.offset_data + m.size // 2
    with open(path, "r+b") as f:
        f.truncate(cut)
    return cut


def dataset(out, names, tmp_path, **kw):
    pattern = str(out) + "/shard-{000000..%06d}.tar" % (len(names) - 1)
    return longshore.datasets.WebDataset(pattern, transform=tf(), cache_dir=tmp_path / "c",
                                         **kw)


@pytest.mark.parametrize("index", [True, False])
def test_a_truncated_shard_raises_naming_it_by_default(shards, tmp_path, index):
    out, names = copy(shards, tmp_path, index)
    truncate(out / names[1])
    ds = dataset(out, names, tmp_path)
    if index:
        assert len(ds) == N  # the index's count stands
    with pytest.raises(OSError) as e:
        longshore.DataLoader(ds, batch_size=4, num_workers=2, framework="numpy")
    msg = str(e.value)
    assert names[1] in msg and "at byte" in msg and "member" in msg, msg
    assert "on_sample_error" in msg, msg


@pytest.mark.parametrize("index", [True, False])
@pytest.mark.parametrize("workers", [0, 2])
def test_skipped_samples_are_counted_logged_and_ranks_stay_equal(shards, tmp_path, index,
                                                                 workers, caplog):
    out, names = copy(shards, tmp_path, index)
    truncate(out / names[1])
    batches, labels, stats = [], [], []
    with caplog.at_level(logging.WARNING, logger="longshore"):
        for rank in range(3):
            ds = dataset(out, names, tmp_path, rank=rank, world_size=3)
            dl = longshore.DataLoader(ds, batch_size=4, num_workers=workers,
                                      framework="numpy", on_sample_error="skip")
            got = list(dl)
            batches.append((len(got), len(dl)))
            labels += [int(v) for _, y in got for v in y]
            stats.append(dl.stats)
        _logs.flush()
    # Every rank yields exactly len(loader) batches (a DDP job's ranks stay equal).
    assert all(n == want for n, want in batches), batches
    assert len({n for n, _ in batches}) == 1, batches
    failed = sum(s["shards"]["failed"] for s in stats)
    damaged = sum(s["shards"]["damaged_shards"] for s in stats)
    assert damaged >= 1, stats
    if index:
        # The lost samples are counted and made up for by padding repeats.
        assert failed > 0 and failed == sum(s["shards"]["padded"] for s in stats), stats
        assert sum(s["skipped_samples"] for s in stats) == failed, stats
    missing = set(range(N)) - set(labels)
    assert missing, "a truncated shard loses samples"
    if index:
        assert len(missing) == failed, (missing, stats)
    # The damage reached Python's logging, naming the shard.
    text = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("longshore"))
    assert "damaged shard" in text and names[1] in text, text


def test_a_broken_header_under_raise_names_the_offset_and_the_epoch_goes_on(shards, tmp_path):
    out, names = copy(shards, tmp_path, True)
    path = out / names[2]
    with tarfile.open(path) as t:
        members = t.getmembers()
        m = members[len(members) // 2]
    data = bytearray(path.read_bytes())
    data[m.offset + 148:m.offset + 156] = b"0000000\0"
    path.write_bytes(bytes(data))
    ds = dataset(out, names, tmp_path)
    dl = longshore.DataLoader(ds, batch_size=4, framework="numpy")  # size unchanged: builds
    errors, good = [], 0
    it = iter(dl)
    while True:
        try:
            x, y = next(it)
            good += len(y)
        except StopIteration:
            break
        except longshore.SampleError as e:
            errors.append(str(e))
    assert errors and all(names[2] in e for e in errors), errors
    assert "at byte" in errors[0] and "checksum" in errors[0], errors[0]
    assert good + 4 * len(errors) >= N - 4


def test_an_endpoint_that_never_answers_fails_within_the_timeout(tmp_path):
    """A server that accepts connections and never answers (it held the constructor for
    907 s): with storage_options={"timeout": "1s"} the dataset's constructor fails within
    seconds, naming the operation and the endpoint."""
    import socket
    import threading
    import time

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    port = srv.getsockname()[1]
    held, stop = [], threading.Event()

    def accept():  # accepts, reads nothing, answers nothing
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    opts = {"aws_endpoint": f"http://127.0.0.1:{port}", "aws_access_key_id": "x",
            "aws_secret_access_key": "x", "aws_region": "us-east-1", "aws_allow_http": True,
            "timeout": "1s"}
    start = time.monotonic()
    try:
        with pytest.raises(OSError) as e:
            longshore.datasets.WebDataset("s3://train/shard-{000000..000003}.tar",
                                          transform=tf(), cache_dir=tmp_path / "c",
                                          storage_options=opts)
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()
    took = time.monotonic() - start
    msg = str(e.value)
    assert f"127.0.0.1:{port}" in msg and "list" in msg, msg
    assert took < 90, took  # the retry budget (60 s) bounds it; without a timeout: 907 s


def test_a_budget_below_the_working_set_warns_once_and_counts_redownloads(shards, tmp_path,
                                                                          caplog):
    """A cache budget of two shards under a whole-epoch shuffle: every sample still arrives
    once, the shards downloaded again and the samples read by range (shards not on disk) are
    counted in `loader.stats["shards"]` (per epoch too) and the budget that would suffice is
    named once through logging."""
    out, names = copy(shards, tmp_path)
    largest = max(os.path.getsize(out / n) for n in names)
    ds = dataset(out, names, tmp_path, shuffle=True, shuffle_block=10**9,
                 cache_budget=2 * largest)
    loader = longshore.DataLoader(ds, batch_size=4, num_workers=2)
    with caplog.at_level(logging.WARNING, logger="longshore"):
        for epoch in range(2):
            loader.set_epoch(epoch)
            labels = sorted(int(x) for _, y in loader for x in y)
            assert labels == list(range(N)), epoch
        _logs.flush()
    s = loader.stats["shards"]
    assert [e["epoch"] for e in s["cache_epochs"]] == [0, 1], s
    assert s["downloads"] == sum(e["downloads"] for e in s["cache_epochs"]) > len(names), s
    assert s["redownloads"] > 0 and s["forced_evictions"] > 0, s
    # Each worker process downloads a shard to learn its layout; after that, reads of shards
    # not on disk are range reads, one sample's bytes each.
    assert s["range_reads"] == sum(e["range_reads"] for e in s["cache_epochs"]) > 0, s
    e1 = s["cache_epochs"][1]
    assert 0 < e1["range_bytes"] < e1["range_reads"] * largest, s
    warned = [r for r in caplog.records if "would download each shard once" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


def label_of(sample):
    """A map= function (module level: workers started by spawn unpickle it)."""
    return sample["cls"]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers,context,persistent",
                         [(0, None, False), (2, "fork", False), (2, "spawn", True),
                          (3, "forkserver", False)])
def test_map_workers_counts_reach_the_loader_stats(shards, tmp_path, workers, context,
                                                   persistent):
    """`map=`: the shards are read in the loader's worker processes (or its own, with no
    workers); their cache counts (range reads below the working set, downloads, per epoch)
    reach `loader.stats["shards"]`, added up over the workers, under every start method and
    with workers started again each epoch."""
    out, names = copy(shards, tmp_path)
    largest = max(os.path.getsize(out / n) for n in names)
    pattern = str(out) + "/shard-{000000..%06d}.tar" % (len(names) - 1)
    ds = longshore.datasets.WebDataset(pattern, transform=None, fields={"cls": "int"},
                                       map=label_of, cache_dir=tmp_path / "c", shuffle=True,
                                       shuffle_block=10**9, cache_budget=2 * largest)
    loader = longshore.DataLoader(ds, batch_size=4, num_workers=workers,
                                  multiprocessing_context=context,
                                  persistent_workers=persistent)
    assert "shards" not in loader.stats
    for epoch in range(2):
        loader.set_epoch(epoch)
        labels = sorted(int(x) for y in loader for x in y)
        assert labels == list(range(N)), epoch
        s = loader.stats["shards"]
        assert [e["epoch"] for e in s["cache_epochs"]] == list(range(epoch + 1)), s
    assert s["failed"] == 0 and s["damaged_shards"] == 0 and s["failed_by_reason"] == {}, s
    # Each reading process downloads shards to learn their layouts; the rest of its reads
    # of shards not on disk are range reads (how many in an epoch depends on the workers'
    # interleaving: some epochs of some runs have none).
    assert s["downloads"] == sum(e["downloads"] for e in s["cache_epochs"]) >= len(names), s
    assert s["range_reads"] == sum(e["range_reads"] for e in s["cache_epochs"]) > 0, s
    for e in s["cache_epochs"]:
        assert (e["range_bytes"] > 0) == (e["range_reads"] > 0), s
        assert e["range_bytes"] < max(e["range_reads"], 1) * largest, s
        # Reads that waited for their shard: each process's first ones at least.
        assert e["misses"] > 0 and e["miss_wait_s"] > 0, s


def test_workers_counts_add_up_a_shard_damaged_in_two_once():
    """What the loader does with its `map=` workers' counts: added key by key and epoch by
    epoch; a shard two workers found damaged counts once."""
    from longshore._python import _merge_shard_stats

    def part(epoch_reads, damaged, reason):
        return {"failed": 1, "padded": 1, "unpadded": 0, "downloads": 2, "redownloads": 1,
                "forced_evictions": 0, "range_reads": sum(epoch_reads),
                "failed_by_reason": {reason: 1}, "damaged_shards": len(damaged),
                "damaged": damaged,
                "cache_epochs": [{"epoch": e, "downloads": 1, "redownloads": 0,
                                  "downloaded_bytes": 10, "evictions": 0,
                                  "forced_evictions": 0, "range_reads": r, "range_bytes": 5 * r,
                                  "misses": 1, "miss_wait_s": 0.25}
                                 for e, r in enumerate(epoch_reads)]}

    s = _merge_shard_stats([part([3, 4], [2], "damaged shard"), part([5], [2, 7], "bad sample")])
    assert s["failed"] == 2 and s["padded"] == 2 and s["downloads"] == 4, s
    assert s["failed_by_reason"] == {"damaged shard": 1, "bad sample": 1}, s
    assert s["damaged_shards"] == 2, s
    assert [(e["epoch"], e["range_reads"], e["downloads"], e["misses"], e["miss_wait_s"])
            for e in s["cache_epochs"]] == [(0, 8, 2, 2, 0.5), (1, 4, 1, 1, 0.25)], s
    assert s["range_reads"] == 12 and "damaged" not in s and "members" not in s, s


def test_range_reads_off_downloads_the_shard_for_every_miss(shards, tmp_path):
    """`range_reads=False`: the same budget and shuffle, every sample once, no range read, the
    shards downloaded again instead."""
    out, names = copy(shards, tmp_path)
    largest = max(os.path.getsize(out / n) for n in names)
    ds = dataset(out, names, tmp_path, shuffle=True, shuffle_block=10**9,
                 cache_budget=2 * largest, range_reads=False)
    loader = longshore.DataLoader(ds, batch_size=4, num_workers=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        labels = sorted(int(x) for _, y in loader for x in y)
        assert labels == list(range(N)), epoch
    s = loader.stats["shards"]
    assert s["range_reads"] == 0, s
    assert s["cache_epochs"][1]["redownloads"] > 0, s
