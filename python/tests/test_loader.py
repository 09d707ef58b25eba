"""The DataLoader on the CPU with NumPy outputs: values, order, options, state, stats."""
import numpy as np
import pytest

import longshore


def loader(ds, **kw):
    kw.setdefault("framework", "numpy")
    return longshore.DataLoader(ds, **kw)


def test_single_file_yields_arrays_in_order(files):
    ds = longshore.NpyDataset(files["x"])
    assert len(ds) == 100
    dl = loader(ds, batch_size=16)
    assert len(dl) == 7
    batches = list(dl)
    assert [b.shape for b in batches] == [(16, 5)] * 6 + [(4, 5)]
    assert batches[0].dtype == np.float32
    np.testing.assert_array_equal(np.concatenate(batches), files["arrays"]["x"])


def test_zipped_files_yield_lists_of_fields(files):
    ds = longshore.NpyDataset([files["x"], files["y"]])
    batches = list(loader(ds, batch_size=32, num_workers=2))
    assert all(isinstance(b, list) and len(b) == 2 for b in batches)
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    np.testing.assert_array_equal(x, files["arrays"]["x"])
    np.testing.assert_array_equal(y, np.arange(100))
    assert y.dtype == np.int64


def test_record_file_fields(files, tmp_path):
    rec = np.zeros(10, dtype=[("image", np.uint8, (2, 3)), ("label", np.int64)])
    rec["image"] = np.arange(60, dtype=np.uint8).reshape(10, 2, 3)
    rec["label"] = np.arange(10) * 7
    path = tmp_path / "data.bin"
    header = b"HDR!" * 4
    path.write_bytes(header + rec.tobytes())
    ds = longshore.RecordDataset(
        str(path), [("image", "u8", (2, 3)), ("label", "int64", ())], header_bytes=len(header)
    )
    assert len(ds) == 10
    img, lab = next(iter(loader(ds, batch_size=4)))
    np.testing.assert_array_equal(img, rec["image"][:4])
    np.testing.assert_array_equal(lab, rec["label"][:4])


def test_normalize_matches_the_formula(files):
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    ds = longshore.NpyDataset(files["img"], normalize=(mean, std))
    got = np.concatenate(list(loader(ds, batch_size=5)))
    img = files["arrays"]["img"].astype(np.float32)
    m = np.array(mean, np.float32)[:, None, None]
    s = np.array(std, np.float32)[:, None, None]
    np.testing.assert_allclose(got, (img / 255.0 - m) / s, rtol=1e-5, atol=1e-5)
    assert got.dtype == np.float32


def test_shuffle_is_a_seeded_permutation(files):
    ds = longshore.NpyDataset(files["y"])

    def epoch(seed, workers=0):
        return np.concatenate(list(loader(ds, batch_size=8, shuffle=True, seed=seed, num_workers=workers)))

    a, b, c = epoch(1), epoch(1, workers=3), epoch(2)
    assert sorted(a.tolist()) == list(range(100))
    assert not np.array_equal(a, np.arange(100))
    np.testing.assert_array_equal(a, b)  # workers do not change the order
    assert not np.array_equal(a, c)


def test_epochs_reshuffle_and_set_epoch_replays(files):
    dl = loader(longshore.NpyDataset(files["y"]), batch_size=10, shuffle=True, seed=5)
    e0 = np.concatenate(list(dl))
    e1 = np.concatenate(list(dl))
    assert not np.array_equal(e0, e1)
    dl.set_epoch(0)
    np.testing.assert_array_equal(np.concatenate(list(dl)), e0)


def test_drop_last(files):
    dl = loader(longshore.NpyDataset(files["y"]), batch_size=30, drop_last=True)
    assert len(dl) == 3
    assert [len(b) for b in dl] == [30, 30, 30]


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"num_workers": -1}, "num_workers"),
        ({"prefetch_factor": 4}, "prefetch_factor"),
        ({"persistent_workers": True}, "persistent_workers"),
        ({"timeout": -1}, "timeout"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_pytorch_option_checks(files, kw, match):
    with pytest.raises(ValueError, match=match):
        loader(longshore.NpyDataset(files["y"]), **kw)


def test_not_a_dataset():
    with pytest.raises(TypeError, match="map-style dataset"):
        longshore.DataLoader(42)
    # A list is a map-style dataset, as in PyTorch.
    got = [b.tolist() for b in longshore.DataLoader([1, 2, 3], batch_size=2, framework="numpy")]
    assert got == [[1, 2], [3]]


def test_resume_mid_epoch(files):
    ds = longshore.NpyDataset(files["y"])
    dl = loader(ds, batch_size=10, shuffle=True, seed=3, num_workers=2)
    full = [b.copy() for b in dl]
    dl2 = loader(ds, batch_size=10, shuffle=True, seed=3, num_workers=2)
    it = iter(dl2)
    first = [next(it).copy() for _ in range(4)]
    state = dl2.state_dict()
    assert state["epoch"] == 0 and state["done_prefix"] == 4
    it.close()
    dl3 = loader(ds, batch_size=10, shuffle=True, seed=99, num_workers=2)
    dl3.load_state_dict(state)
    rest = list(dl3)
    for got, want in zip(first + rest, full):
        np.testing.assert_array_equal(got, want)
    assert len(first) + len(rest) == len(full)


def test_stats(files):
    dl = loader(longshore.NpyDataset(files["x"]), batch_size=25, num_workers=2)
    for _ in dl:
        pass
    s = dl.stats
    assert s["batches"] == 4 and s["samples"] == 100 and s["epochs"] == 1
    assert 0.0 <= s["wait_fraction"] <= 1.0
    for k in ("consumer_wait_s", "consumer_time_s", "worker_busy_s", "samples_per_second"):
        assert s[k] >= 0.0
    assert "bytes_in_use" in s["pool"]
    dl.reset_stats()
    assert dl.stats["batches"] == 0


def test_stats_report_the_pinned_budget(files):
    # A batch of 25 x 5 f32 takes one page-sized block: a budget of three blocks keeps two
    # batches in flight (one block left for the batch the consumer holds), not 2 x 4.
    pool = longshore.PinnedPool(budget=3 * 4096, pinned=False)
    dl = loader(longshore.NpyDataset(files["x"]), batch_size=25, num_workers=2,
                prefetch_factor=4, persistent_workers=True, pool=pool)
    for _ in range(2):
        assert sum(len(b) for b in dl) == 100
    s = dl.stats
    assert s["in_flight_limit"] == 2
    assert s["pinned_wait_s"] >= 0.0 and s["consumer_pinned_wait_s"] >= 0.0
    assert 0.0 <= s["pinned_wait_fraction"] <= 1.0
    assert s["reloaded"] >= 0
    assert s["pool"]["peak_bytes_held"] <= 3 * 4096


def test_drain_in_rust_runs_whole_epochs_and_leaves_the_position(files):
    # The benchmark's Rust-side consumer: whole epochs, every sample, on the same loader.
    dl = loader(longshore.NpyDataset([files["x"], files["y"]]), batch_size=16, shuffle=True,
                drop_last=True, num_workers=2, persistent_workers=True, seed=1)
    n, secs = dl._loader._drain_in_rust(3)
    assert n == 3 * 96 and secs > 0.0
    assert dl.state_dict()["epoch"] == 3
    # Python's iteration goes on from there: the next epoch, whole.
    assert sum(b[0].shape[0] for b in dl) == 96
    assert dl.state_dict()["epoch"] == 4


def _worker_nice_values():
    """The nice value of each of this process's loader worker threads (Linux /proc)."""
    import glob
    import os

    out = []
    for task in glob.glob(f"/proc/{os.getpid()}/task/*"):
        try:
            comm = open(os.path.join(task, "comm")).read().strip()
            stat = open(os.path.join(task, "stat")).read()
        except OSError:
            continue  # the thread ended meanwhile
        if comm.startswith("longshore-worke"):
            # Fields after the command's closing parenthesis; nice is field 19 (index 16 here).
            out.append(int(stat.rsplit(")", 1)[1].split()[16]))
    return out


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
def test_worker_priority_background_lowers_the_workers_and_keeps_the_batches(files):
    import os

    ds = longshore.NpyDataset([files["x"], files["y"]])
    kw = dict(batch_size=16, shuffle=True, num_workers=2, persistent_workers=True, seed=3)
    normal = loader(ds, **kw)
    background = loader(ds, worker_priority="background", **kw)
    a = [b[1] for b in normal]
    base = os.nice(0)
    del normal
    b = [x[1] for x in background]
    # Nice 10 (or the inherited value, if higher) on its two workers, which persist between
    # epochs (threads of the loaders of earlier tests, at the inherited value, may not have
    # ended yet).
    nice = _worker_nice_values()
    assert sum(v == max(10, base) for v in nice) == 2, nice
    # The priority changes scheduling, not what is loaded.
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="worker_priority"):
        loader(ds, worker_priority="high")


def test_missing_and_bad_files_name_the_file(files, tmp_path):
    missing = str(tmp_path / "nope.npy")
    with pytest.raises(FileNotFoundError, match="nope.npy"):
        longshore.NpyDataset(missing)
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not an npy file at all, clearly")
    with pytest.raises(ValueError, match="bad.npy"):
        longshore.NpyDataset(str(bad))
    short = tmp_path / "short.npy"
    short.write_bytes(open(files["x"], "rb").read()[:300])
    with pytest.raises(ValueError, match="short.npy"):
        longshore.NpyDataset(str(short))
    with pytest.raises(ValueError, match="x.npy"):
        longshore.NpyDataset(files["x"], normalize=([0.5] * 3, [0.5] * 3))
    with pytest.raises(ValueError, match="lengths|shape"):
        longshore.NpyDataset([files["x"], files["img"]])
