"""The epoch thread runs ahead of Python by a bounded number of batches: the resumable
position counts only the batches Python received, and close() returns the queued ones."""
import gc
import time

import numpy as np
import pytest

import longshore

# Batches the epoch thread holds ready beyond those Python received: AHEAD_SMALL for batches of
# at most SMALL_BATCH bytes, AHEAD for larger ones (epoch.rs).
AHEAD_SMALL = 8
AHEAD = 2
SMALL_BATCH = 4 << 20


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def make(files, **kw):
    ds = longshore.NpyDataset(files["y"])
    # 20 batches: more than AHEAD_SMALL beyond the few Python takes.
    kw.setdefault("batch_size", 5)
    return longshore.DataLoader(ds, framework="numpy", shuffle=True, seed=11, **kw)


@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_resumes_at_the_first_batch_python_did_not_receive(files, workers):
    full = [b.copy() for b in make(files, num_workers=workers)]
    assert len(full) == 20
    dl = make(files, num_workers=workers)
    it = iter(dl)
    got = [next(it).copy() for _ in range(3)]
    # Let the epoch thread fill its queue: the loader has handed out more than Python took.
    assert wait_for(lambda: dl.stats["batches"] == 3 + AHEAD_SMALL)
    state = dl.state_dict()
    assert state["epoch"] == 0 and state["done_prefix"] == 3 and state["done_extra"] == []
    it.close()
    assert dl.state_dict() == state  # closing does not count the dropped batches either
    resumed = make(files, num_workers=workers)
    resumed.load_state_dict(state)
    rest = [b.copy() for b in resumed]
    assert len(got) + len(rest) == len(full)
    for a, b in zip(got + rest, full):
        np.testing.assert_array_equal(a, b)


def test_state_before_the_first_batch_and_after_the_end(files):
    dl = make(files, num_workers=1)
    it = iter(dl)
    assert wait_for(lambda: dl.stats["batches"] == AHEAD_SMALL)
    assert dl.state_dict()["done_prefix"] == 0 and dl.state_dict()["epoch"] == 0
    batches = list(it)
    assert len(batches) == 20
    s = dl.state_dict()
    assert s["epoch"] == 1 and s["done_prefix"] == 0
    # After the last batch, before the end is seen: the same as after the end (the next
    # epoch, from its start), although the epoch thread has not finished.
    it = iter(dl)
    for _ in range(20):
        next(it)
    s = dl.state_dict()
    assert s["epoch"] == 2 and s["done_prefix"] == 0
    assert list(it) == []
    assert dl.state_dict() == s


def test_set_epoch_and_load_state_dict_take_over_from_a_closed_epoch(files):
    dl = make(files)
    it = iter(dl)
    next(it)
    it.close()
    assert dl.state_dict()["done_prefix"] == 1
    dl.set_epoch(4)
    s = dl.state_dict()
    assert s["epoch"] == 4 and s["done_prefix"] == 0


def test_close_returns_the_queued_batches(files):
    pool = longshore.PinnedPool(pinned=False)
    dl = make(files, num_workers=2, pool=pool)
    it = iter(dl)
    held = next(it)
    assert wait_for(lambda: dl.stats["batches"] == 1 + AHEAD_SMALL)
    assert pool.stats()["blocks_in_use"] > 1
    it.close()
    # Only the batch Python holds keeps its block.
    assert wait_for(lambda: pool.stats()["blocks_in_use"] == 1)
    with pytest.raises(StopIteration):
        next(it)
    del held
    gc.collect()
    assert pool.stats()["bytes_in_use"] == 0


def test_dropping_an_epoch_returns_its_batches(files):
    pool = longshore.PinnedPool(pinned=False)
    dl = make(files, num_workers=1, pool=pool)
    it = iter(dl)
    next(it)
    assert wait_for(lambda: dl.stats["batches"] == 1 + AHEAD_SMALL)
    del it
    gc.collect()
    assert wait_for(lambda: pool.stats()["bytes_in_use"] == 0)


def test_abandoned_epoch_then_next_epoch_counts_what_python_received(files):
    dl = make(files, num_workers=1)
    it = iter(dl)
    next(it)
    next(it)
    assert wait_for(lambda: dl.stats["batches"] == 2 + AHEAD_SMALL)
    it.close()
    # set_epoch to the next epoch keeps the unfinished one as the position, as Python saw it.
    dl.set_epoch(1)
    s = dl.state_dict()
    assert (s["epoch"], s["done_prefix"]) == (0, 2)
    # A new epoch's iterator: its own start, not the abandoned epoch's run-ahead.
    it2 = iter(dl)
    s = dl.state_dict()
    assert (s["epoch"], s["done_prefix"]) == (1, 0)
    it2.close()


def test_a_refused_state_keeps_the_position(files):
    dl = make(files, num_workers=1)
    it = iter(dl)
    next(it)
    assert wait_for(lambda: dl.stats["batches"] == 1 + AHEAD_SMALL)
    bad = dl.state_dict()
    bad["num_batches"] += 1
    with pytest.raises(Exception):
        dl.load_state_dict(bad)
    assert dl.state_dict()["done_prefix"] == 1
    it.close()


def test_the_queue_stops_at_its_depth(files):
    dl = make(files, num_workers=2)
    it = iter(dl)
    next(it)
    assert wait_for(lambda: dl.stats["batches"] == 1 + AHEAD_SMALL)
    time.sleep(0.2)
    assert dl.stats["batches"] == 1 + AHEAD_SMALL
    # Each batch taken makes room for one more.
    for k in range(2, 6):
        next(it)
        assert wait_for(lambda: dl.stats["batches"] == k + AHEAD_SMALL)
    it.close()


@pytest.fixture
def large(tmp_path):
    """f32 [51, 65536] (x[i, :] = i): rows of 256 KiB, 17 of them a batch just over SMALL_BATCH."""
    x = np.repeat(np.arange(51, dtype=np.float32)[:, None], 65536, axis=1)
    path = tmp_path / "large.npy"
    np.save(path, x)
    return str(path)


def test_large_batches_run_only_ahead_batches_ahead(large):
    assert 17 * 65536 * 4 > SMALL_BATCH
    pool = longshore.PinnedPool(pinned=False)
    dl = longshore.DataLoader(longshore.NpyDataset(large), batch_size=17, num_workers=1,
                              framework="numpy", pool=pool)
    it = iter(dl)
    first = next(it)
    assert wait_for(lambda: dl.stats["batches"] == 1 + AHEAD)
    time.sleep(0.2)
    # The epoch thread waits for room: it took no more batches from the loader.
    assert dl.stats["batches"] == 1 + AHEAD
    rest = list(it)  # taking one wakes it for the next (no 50 ms timeout per batch needed)
    assert [int(b[0, 0]) for b in [first] + rest] == [0, 17, 34]
    assert all(b.shape == (17, 65536) for b in rest)
    del first, rest
    gc.collect()
    assert wait_for(lambda: pool.stats()["bytes_in_use"] == 0)


def test_closing_while_the_epoch_thread_waits_for_room(large):
    pool = longshore.PinnedPool(pinned=False)
    dl = longshore.DataLoader(longshore.NpyDataset(large), batch_size=17, num_workers=1,
                              framework="numpy", pool=pool)
    it = iter(dl)
    held = next(it)
    assert wait_for(lambda: dl.stats["batches"] == 1 + AHEAD)
    it.close()
    assert dl.state_dict()["done_prefix"] == 1
    # The waiting batch and the queued one go back; the epoch thread ends (its workers stop).
    assert wait_for(lambda: pool.stats()["blocks_in_use"] == 1)
    del held
    gc.collect()
    assert wait_for(lambda: pool.stats()["bytes_in_use"] == 0)
