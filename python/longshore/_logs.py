"""The Rust crates' warnings (and info) in Python's ``logging``: a daemon thread takes the
records the Rust side queues (``_longshore._next_logs``) every 0.2 s and emits each on
``logging.getLogger(name)``: ``longshore.shards`` (a damaged shard, a skipped
sample), ``longshore.loader`` (a skipped sample, an epoch ended by an error), and so on, all
children of ``logging.getLogger("longshore")``.

The thread starts when the first loader or dataset is made (``ensure_started``), and again in
a forked child that makes one (a fork keeps only the forking thread). It waits in
``time.sleep``, never inside Rust with the GIL released: a daemon thread that takes the GIL back
from Rust while the interpreter finalizes is ended by CPython in a way that must not cross Rust
frames. What is still queued at exit is emitted by an ``atexit`` handler."""

import atexit
import logging
import os
import threading
import time

from . import _longshore

_lock = threading.Lock()
_started_in = None  # the pid whose thread runs


def _run():
    while True:
        time.sleep(0.2)
        try:
            flush()
        except Exception:  # the interpreter is going away
            return


def ensure_started():
    """Starts the thread that emits the Rust side's records, once per process."""
    global _started_in
    pid = os.getpid()
    if _started_in == pid:
        return
    with _lock:
        if _started_in == pid:
            return
        threading.Thread(target=_run, name="longshore-logs", daemon=True).start()
        _started_in = pid


def flush():
    """Emits the records queued now, on this thread (for tests and before a report)."""
    for level, name, message in _longshore._next_logs(0.0):
        logging.getLogger(name).log(level, message)


atexit.register(flush)
