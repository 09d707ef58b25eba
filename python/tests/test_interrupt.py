"""Waiting for a batch: the GIL is released, Ctrl-C interrupts cleanly, `timeout` is honoured."""
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

import longshore


def starved_loader(files, **kw):
    """A loader whose pool holds exactly one batch: while the first batch is alive, the next
    cannot be collated and `next()` blocks."""
    pool = longshore.PinnedPool(budget=4096, policy="wait", wait_timeout=30.0, pinned=False)
    ds = longshore.NpyDataset(files["y"])
    return longshore.DataLoader(ds, batch_size=10, framework="numpy", pool=pool, **kw), pool


def test_ctrl_c_interrupts_a_blocked_next(files):
    dl, pool = starved_loader(files)
    it = iter(dl)
    first = next(it)
    # Python's own Ctrl-C handler, even where this process started with SIGINT ignored (a
    # background job of a non-interactive shell does, and Python then keeps it ignored).
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            next(it)
        elapsed = time.monotonic() - t0
    finally:
        signal.signal(signal.SIGINT, old)
    # Interrupted soon after the press (the pool's own timeout is 30 s).
    assert elapsed < 5.0, elapsed
    # Nothing was lost: once the held batch is freed, the pending batch arrives.
    np.testing.assert_array_equal(first, np.arange(10))
    del first
    gc.collect()
    second = next(it)
    np.testing.assert_array_equal(second, np.arange(10, 20))


def test_the_gil_is_released_while_waiting(files):
    dl, _ = starved_loader(files)
    it = iter(dl)
    held = [next(it)]
    ticks = []

    def other():
        # Runs Python code (needs the GIL) while the main thread waits, then frees the batch.
        for _ in range(20):
            ticks.append(time.monotonic())
            time.sleep(0.01)
        held.clear()
        gc.collect()

    th = threading.Thread(target=other)
    th.start()
    second = next(it)  # blocks until `other` frees the first batch
    th.join()
    assert len(ticks) == 20
    np.testing.assert_array_equal(second, np.arange(10, 20))


def test_timeout_raises(files):
    dl, _ = starved_loader(files, num_workers=1, timeout=0.3)
    it = iter(dl)
    first = next(it)
    with pytest.raises(longshore.LoaderTimeout, match="timed out"):
        next(it)
    del first
