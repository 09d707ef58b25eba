"""Python datasets in worker processes: the process side of ``python/src/pydata.rs``.

Each loader worker thread (Rust) drives one worker process over a pipe; per batch the process
fetches the samples, works out the batch's tensors (torch's ``default_collate`` structure, or
the user's ``collate_fn``), and writes each sample's array straight into the batch's block of
the loader's shared, page-locked pool, mapped from its memory file. The nesting of the batch
and its non-tensor values (strings, ...) travel pickled in the batch's last field, the *meta*.

Protocol (payloads; framing is multiprocessing's ``Connection``):

* ``S`` epoch:u64 n:u32 indices:n*u64 -> ``K`` batch:u64 n:u32 (code:u8 ndim:u8 dims:ndim*u64)*n
  meta_len:u64, or ``E`` index:u64 message:utf8 (index 2**64-1: not one sample's fault);
* ``W`` id:u64 fd:i32 len:u64 n:u32 offsets:n*u64 -> ``w`` (written into the shared block), or
  ``B`` bytes (the batch's bytes, when the block is not shared memory: fd -1), or ``E``.
"""

import collections.abc
import errno
import itertools
import mmap
import os
import pickle
import random
import signal
import struct
import sys
import threading
import traceback
import weakref
from time import monotonic as _monotonic

import numpy as np

# Batches as leaves (torch's default_collate) are built in ``_batch_tree``; ``rebuild`` is the
# loader's side of it (re-exported here for it).
from ._batch_tree import _CODES, _collate, _convert, _flatten, _torch, rebuild  # noqa: F401

_U64_MAX = 2**64 - 1
# A meta that names a batch kept in this process (``Handler.kept``); a pickle never starts so.
_KEPT = b"\0"
# The kept batches' tokens, one count for the process: unique across the handlers of worker
# threads, whose batches are looked up by token in every handler.
_TOKENS = itertools.count(1)
FD_ADVICE = ("too many open files: the DataLoader's workers can no longer reach the loader. "
             "Raise the limit with `ulimit -n` in the shell (or resource.setrlimit"
             "(resource.RLIMIT_NOFILE, ...)), or use fewer workers")





class WorkerInfo:
    """What ``get_worker_info()`` returns in a worker, as in torch: ``id``, ``num_workers``,
    ``seed``, ``dataset`` (this process's copy)."""

    def __init__(self, id, num_workers, seed, dataset):
        self.id = id
        self.num_workers = num_workers
        self.seed = seed
        self.dataset = dataset

    def __repr__(self):
        return (f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed}, "
                f"dataset={self.dataset!r})")


_worker_info = None
# A worker thread's info (worker_mode="thread"): set at each of its calls into the dataset,
# since a Rust thread's Python thread state (and its thread-locals) lasts one call.
_local = threading.local()


def get_worker_info():
    """In a worker (process or thread): its :class:`WorkerInfo`; in the main process: ``None``.
    Torch's own ``torch.utils.data.get_worker_info()`` answers the same in longshore's
    workers."""
    info = getattr(_local, "info", None)
    return info if info is not None else _worker_info


def loader_epoch():
    """The epoch of the loader whose batch this thread is fetching (in a longshore worker,
    process or thread, or the loader's own process with ``num_workers=0``); ``None`` outside
    one (the main program, torch's DataLoader)."""
    return getattr(_local, "epoch", None)


class _ThreadInfo:
    """What torch's ``get_worker_info()`` returns while thread workers run (its answer is one
    global of the process): each attribute read from the calling worker thread's info."""

    def __getattr__(self, name):
        info = getattr(_local, "info", None)
        if info is None:
            raise AttributeError(
                f"torch.utils.data.get_worker_info().{name}: not in a longshore worker thread")
        return getattr(info, name)

    def __repr__(self):
        return repr(getattr(_local, "info", None))


_THREAD_INFO = _ThreadInfo()


class Handler:
    """Answers the loader's requests for one worker (see the module's protocol)."""

    def __init__(self, dataset, collate_fn, worker_id, main_pid, batched=True):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.worker_id = worker_id
        self.main_pid = main_pid
        # batch_size=None (torch's "non-batch" mode): one sample per request, converted as
        # torch's default_convert does (or passed alone to collate_fn), not collated.
        self.batched = batched
        # In the loader's own process (num_workers=0, worker threads): the batch's structure
        # and values are kept here, by token, rather than pickled into the batch, as torch's
        # single-process loader hands them over as they are.
        self.in_process = main_pid == os.getpid()
        self.kept = {}
        # A failure before the first request (worker_init_fn, the dataset's set-up): every
        # request is answered with it, so it reaches the user with its type and traceback.
        self.failed = None
        self.staged = None
        self.maps = {}  # block id -> (mmap, length)
        self.stream = None  # an iterable dataset's iterator, and the epoch it is of
        self.stream_epoch = None
        self.info = None  # a worker thread's WorkerInfo, made current at each request

    def _fetch(self, indices):
        """The samples of ``indices`` (``__getitems__`` where the dataset has it), or the error
        reply naming the sample at fault, made while its exception is being handled."""
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            try:
                return list(getitems(indices))
            except Exception:
                pass  # name the sample at fault, as torch users expect: one by one below
        samples = []
        for i in indices:
            try:
                samples.append(self.dataset[i])
            except Exception:
                return self._error(i)
        if getitems is not None:
            # Every sample loads on its own: the batched call's own failure.
            try:
                return list(getitems(indices))
            except Exception:
                return self._error(None)
        return samples

    def _error(self, index):
        etype, value, tb = sys.exc_info()
        if self.worker_id < 0:
            where = "in the main process"
        elif self.info is not None:
            where = f"in DataLoader worker thread {self.worker_id}"
        else:
            where = f"in DataLoader worker process {self.worker_id}"
        msg = (f"Caught {etype.__name__} {where}.\nOriginal "
               + "".join(traceback.format_exception(etype, value, tb)))
        msg += f"\n[exception type: {etype.__module__}.{etype.__qualname__}]"
        return b"E" + struct.pack("<Q", _U64_MAX if index is None else index) + msg.encode()

    def handle(self, req):
        if self.info is not None:
            _local.info = self.info
        if self.failed is not None:
            return self.failed
        kind = req[:1]
        try:
            if kind == b"S":
                return self._stage(req)
            if kind == b"W":
                return self._write(req)
            if kind == b"N":
                return self._next(req)
            return b"E" + struct.pack("<Q", _U64_MAX) + f"unknown request {kind!r}".encode()
        except Exception:
            self.staged = None
            return self._error(None)

    def _stage(self, req):
        (epoch, n) = struct.unpack_from("<QI", req, 1)
        indices = list(struct.unpack_from(f"<{n}Q", req, 13))
        self.staged = None
        # The loader's epoch, for datasets whose samples depend on it (data.Mixture), while
        # this batch's samples are fetched.
        _local.epoch = epoch
        try:
            samples = self._fetch(indices)
        finally:
            _local.epoch = None
        if isinstance(samples, bytes):
            return samples
        return self._collated(samples)

    def _collated(self, samples, counts=None):
        """Stages a batch of ``samples``: its tensors' layout, the meta kept for the write.
        ``counts``: what the dataset reports of this worker's reads (``_shard_stats``), sent
        with the batch."""
        leaves, objects = [], []
        if not self.batched:
            if self.collate_fn is None:
                tree = _convert(samples[0], leaves, objects)
            else:
                tree = _flatten(self.collate_fn(samples[0]), leaves, objects)
        elif self.collate_fn is None:
            tree = _collate(samples, leaves, objects)
        else:
            tree = _flatten(self.collate_fn(samples), leaves, objects)
        built = (tree, objects, [leaf.torch_dtype for leaf in leaves], counts)
        if self.in_process:
            token = next(_TOKENS)
            self.kept[token] = built
            meta = _KEPT + struct.pack("<Q", token)
        else:
            meta = pickle.dumps(built, protocol=pickle.HIGHEST_PROTOCOL)
        out = [b"K", struct.pack("<QI", len(samples), len(leaves))]
        for leaf in leaves:
            shape = leaf.shape
            out.append(struct.pack("<BB", leaf.code, len(shape)))
            out.append(struct.pack(f"<{len(shape)}Q", *shape))
        out.append(struct.pack("<Q", len(meta)))
        self.staged = (leaves, meta)
        return b"".join(out)

    def _next(self, req):
        """The next batch of an iterable dataset: up to ``batch_size`` items of this worker's
        iterator (a new one each epoch, and after the last ended, as PyTorch's workers make)."""
        (epoch, batch_size, drop_last) = struct.unpack_from("<QIB", req, 1)
        if not self.batched:
            batch_size, drop_last = 1, False
        self.staged = None
        if self.stream_epoch != epoch:
            self.stream = iter(self.dataset)
            self.stream_epoch = epoch
        if self.stream is None:  # this epoch's stream ended
            return b"X"
        items = []
        # The loader's epoch, for iterable datasets whose stream depends on it (a sharded
        # dataset with map=), while this worker's stream runs.
        _local.epoch = epoch
        try:
            for _ in range(batch_size):
                items.append(next(self.stream))
        except StopIteration:
            self.stream = None
        except Exception:
            self.stream = None
            return self._error(None)
        finally:
            _local.epoch = None
        if not items or (drop_last and len(items) < batch_size):
            self.stream = None
            return b"X"
        report = getattr(self.dataset, "_shard_stats", None)
        return self._collated(items, report() if callable(report) else None)

    def unpack(self, meta):
        """The ``(tree, objects, dtypes, counts)`` of a batch's meta: kept here by token (this
        process's batches), or unpickled (a worker process's)."""
        if meta[:1] == _KEPT:
            return self.kept.pop(struct.unpack_from("<Q", meta, 1)[0])
        return pickle.loads(meta)

    def _block(self, block_id, fd, length):
        m = self.maps.get(block_id)
        if m is not None and m[1] >= length:
            return m[0]
        if len(self.maps) >= 64:  # blocks the pool freed: drop the oldest mappings
            for k in list(self.maps)[:32]:
                try:
                    self.maps.pop(k)[0].close()
                except BufferError:  # still viewed: closed when the view goes
                    pass
        path = f"/proc/{self.main_pid}/fd/{fd}" if self.main_pid != os.getpid() \
            else f"/proc/self/fd/{fd}"
        try:
            f = os.open(path, os.O_RDWR)
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                raise OSError(e.errno, f"{e.strerror}: {FD_ADVICE}") from e
            raise
        try:
            m = mmap.mmap(f, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(f)
        self.maps[block_id] = (m, length)
        return m

    def _write(self, req):
        (block_id, fd, length, n) = struct.unpack_from("<QiQI", req, 1)
        offsets = struct.unpack_from(f"<{n}Q", req, 25)
        if self.staged is None:
            return b"E" + struct.pack("<Q", _U64_MAX) + b"write request without a staged batch"
        leaves, meta = self.staged
        self.staged = None
        if fd >= 0:
            buf = self._block(block_id, fd, length)
        else:
            end = offsets[-1] + len(meta)
            buf = bytearray(end)
        for leaf, off in zip(leaves, offsets):
            leaf.write(buf, off)
        off = offsets[-1]
        buf[off:off + len(meta)] = meta
        if fd >= 0:
            return b"w"
        return b"B" + bytes(buf)


# ---------------------------------------------------------------------------------------------
# Worker processes.

def _worker_loop(conn, dataset, collate_fn, worker_id, num_workers, seed, main_pid,
                 worker_init_fn, batched=True, inherited=(), sharding=None):
    """A worker process's main loop, as torch's ``_worker_loop`` sets a worker up: one
    intra-op thread for torch (and for NumPy's BLAS), per-worker seeds, ``get_worker_info()``,
    a watchdog that ends the worker when the loader's process is gone, DataPipes sharded and
    seeded; then answers requests until the pipe closes. ``inherited``: descriptors of the
    loader's other pipes that a forked worker holds copies of (closed here, so that no worker
    keeps another's pipe open); ``sharding``: ``(world_size, rank, shared_seed)`` for a
    DataPipe."""
    global _worker_info
    # Ctrl-C goes to the main process, which ends the workers (as torch's workers do).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for fd in inherited:
        try:
            os.close(fd)
        except OSError:
            pass
    _watch_parent(main_pid)
    _limit_threads()
    random.seed(seed)
    np.random.seed(_numpy_seed(seed, worker_id))
    _worker_info = WorkerInfo(worker_id, num_workers, seed, dataset)
    handler = Handler(dataset, collate_fn, worker_id, main_pid, batched)
    # torch is set up (one thread, seeded, its worker info) when the dataset's code imported
    # it, as unpickling the dataset does under spawn, or later, at the first request after
    # the dataset's code imports it; a worker does not import torch itself.
    torch_ready = False
    try:
        if _torch() is not None:
            torch_ready = True
            handler.dataset = _torch_setup(dataset, worker_id, num_workers, seed, sharding)
            _worker_info.dataset = handler.dataset
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
    except Exception:
        # Raised at the first batch this worker is asked for, with its type and traceback
        # (the worker stays up to say so, rather than exit with a bare code).
        handler.failed = handler._error(None)
    while True:
        try:
            req = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not torch_ready and _torch() is not None:
            torch_ready = True
            try:
                handler.dataset = _torch_setup(handler.dataset, worker_id, num_workers, seed,
                                               sharding)
            except Exception:
                handler.failed = handler._error(None)
        try:
            conn.send_bytes(handler.handle(req))
        except (BrokenPipeError, OSError):
            return


def _torch_setup(dataset, worker_id, num_workers, seed, sharding):
    """What torch's worker loop does with torch: one intra-op thread (a worker is one of many
    processes: torch's pool of one thread per core in each oversubscribes the machine),
    ``torch.manual_seed``, torch's ``get_worker_info()``, and a DataPipe seeded with the
    loader's shared seed and sharded over ranks x workers. Returns the dataset (a DataPipe's
    graph after seeding)."""
    torch = _torch()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    if sharding is not None:
        from torch.utils.data import IterDataPipe, MapDataPipe, graph_settings

        world_size, rank, shared_seed = sharding
        if isinstance(dataset, IterDataPipe) and shared_seed is not None:
            rng = torch.Generator()
            rng.manual_seed(shared_seed)
            dataset = graph_settings.apply_random_seed(dataset, rng)
        if isinstance(dataset, (IterDataPipe, MapDataPipe)):
            graph_settings.apply_sharding(dataset, num_workers * world_size,
                                          worker_id * world_size + rank)
    try:
        from torch.utils.data import _utils

        _utils.worker._worker_info = _TorchWorkerInfo(worker_id, num_workers, seed, dataset)
    except Exception:
        pass
    return dataset


# Thread pools of the numerical libraries, one thread each in a worker (torch's own is set by
# _torch_setup, as torch's worker loop sets it): the environment reaches the libraries a
# worker loads from now on, and its subprocesses. (threadpoolctl, which would also limit those
# already loaded, costs tens of milliseconds per worker at start-up, each worker inspecting
# every library torch loaded; torch's workers do not do it either.)
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def _limit_threads():
    for name in _THREAD_VARS:
        os.environ.setdefault(name, "1")


def _watch_parent(main_pid):
    """Ends this worker when the loader's process ends (killed, crashed), wherever this worker
    is (a dataset call, a wait on the pipe): a thread waits on a pidfd of that process (Linux
    5.3+), or looks every 0.5 s whether it still runs. A worker never outlives its loader's
    process, as torch's ``ManagerWatchdog`` sees to."""
    def gone():
        os._exit(1)

    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(main_pid)
        except ProcessLookupError:
            gone()
        except OSError:
            pidfd = None
    def watch():
        if pidfd is not None:
            import select

            p = select.poll()
            p.register(pidfd, select.POLLIN)
            while not p.poll():
                pass
            gone()
        import time

        while True:
            time.sleep(0.5)
            try:
                os.kill(main_pid, 0)
            except ProcessLookupError:
                gone()
            except PermissionError:
                pass

    threading.Thread(target=watch, name="longshore-watchdog", daemon=True).start()


def _TorchWorkerInfo(id, num_workers, seed, dataset):
    from torch.utils.data._utils.worker import WorkerInfo as TorchInfo

    return TorchInfo(id=id, num_workers=num_workers, seed=seed, dataset=dataset)


def _numpy_seed(seed, worker_id):
    """NumPy's seed of a worker, as torch derives it (``_generate_state``)."""
    try:
        from torch.utils.data._utils.worker import _generate_state

        return _generate_state(seed - worker_id, worker_id)
    except Exception:
        return (seed ^ (worker_id << 32)) % 2**32


def _preload_forkserver(context, dataset):
    """With forkserver, before the fork server starts: it imports what every worker imports
    (torch when this process has it, NumPy, this module, the dataset's module), once, so that
    each worker forks with them loaded instead of importing them again, 16 at once. (The
    server's default preload, ``__main__``, is skipped by Python 3.11-3.12's forkserver.) The
    modules already asked for are kept; a running server is left as it is."""
    if getattr(context, "get_start_method", lambda: None)() != "forkserver":
        return
    try:
        from multiprocessing import forkserver

        server = forkserver._forkserver
        if getattr(server, "_forkserver_pid", None) is not None:
            return
        wanted = list(getattr(server, "_preload_modules", ["__main__"]))
        extra = ["numpy", __name__]
        if "torch" in sys.modules:
            extra.insert(0, "torch")
        module = getattr(type(dataset), "__module__", None)
        if module and module != "__main__" and module in sys.modules:
            extra.append(module)
        context.set_forkserver_preload(wanted + [m for m in extra if m not in wanted])
    except Exception:  # a private detail of multiprocessing changed: start as before
        pass


# Every live set of worker processes in this process, ended at interpreter exit (before the
# loader threads are stopped, see longshore/__init__.py).
_LIVE = weakref.WeakSet()


def stop_all():
    """Ends the worker processes of every loader of this process (``atexit``)."""
    for w in list(_LIVE):
        try:
            w.stop()
        except Exception:
            pass


class Workers:
    """The worker processes of one loader, started with ``context`` (a multiprocessing
    context: fork, spawn or forkserver), or its worker threads when ``context`` is
    ``"thread"``: the loader's own threads then run the dataset's code in this process, one
    :class:`Handler` each (for Python without a GIL; under the GIL they take turns).

    ``batched``: False for ``batch_size=None``; ``sharding``: ``(world_size, rank)`` when the
    dataset is a DataPipe (sharded over ranks x workers in each worker, as torch does)."""

    def __init__(self, dataset, collate_fn, num_workers, context, worker_init_fn, source,
                 batched=True, sharding=None):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.context = context
        self.worker_init_fn = worker_init_fn
        self.source = source
        self.batched = batched
        self.sharding = sharding
        self.generation = 0  # bumped by every start
        self.procs = []
        self.conns = []
        self.lock = threading.Lock()

    def start(self, base_seed, shared_seed=None):
        """(Re)starts every worker process, seeded from ``base_seed`` as torch seeds them
        (``shared_seed``: a DataPipe's, the same in every worker)."""
        self.stop()
        self.generation += 1
        if self.context == "thread":
            return self._start_threads(base_seed)
        _preload_forkserver(self.context, self.dataset)
        main_pid = os.getpid()
        fork = getattr(self.context, "get_start_method", lambda: None)() == "fork"
        sharding = None if self.sharding is None else (*self.sharding, shared_seed)
        procs, conns = [], []
        _LIVE.add(self)
        self.procs, self.conns = procs, conns
        try:
            for i in range(self.num_workers):
                parent, child = self.context.Pipe(duplex=True)
                # A forked worker holds copies of every descriptor: the loader's ends of the
                # pipes of the workers before it, and its own, which it closes.
                inherited = [c.fileno() for c in conns] + [parent.fileno()] if fork else []
                p = self.context.Process(
                    target=_worker_loop,
                    args=(child, self.dataset, self.collate_fn, i, self.num_workers,
                          base_seed + i, main_pid, self.worker_init_fn, self.batched,
                          inherited, sharding),
                    daemon=True,
                    name=f"longshore-worker-{i}",
                )
                try:
                    p.start()
                finally:
                    # Closed now, not after every worker started: a worker forked later
                    # would hold a copy of it, and this worker's death would then never
                    # close its pipe.
                    child.close()
                procs.append(p)
                conns.append(parent)
            self.source.set_workers([(c.fileno(), p.pid) for c, p in zip(conns, procs)])
        except OSError as e:
            self.stop()
            if e.errno in (errno.EMFILE, errno.ENFILE):
                raise OSError(e.errno, f"{e.strerror} starting DataLoader worker "
                                       f"{len(procs)}: {FD_ADVICE}") from e
            raise
        except BaseException:
            self.stop()
            raise

    def _start_threads(self, base_seed):
        """Worker threads: one handler per worker, each with its :class:`WorkerInfo` (seed
        ``base_seed + id``, as a process's); ``worker_init_fn`` runs once per worker with
        that worker's info current. The process's random generators (``random``, NumPy's,
        torch's) are one for all threads, so they are not seeded per worker."""
        handlers = []
        for i in range(self.num_workers):
            h = Handler(self.dataset, self.collate_fn, i, os.getpid(), self.batched)
            h.info = WorkerInfo(i, self.num_workers, base_seed + i, self.dataset)
            handlers.append(h)
        torch = _torch()
        if torch is not None:
            try:
                from torch.utils.data import _utils

                _utils.worker._worker_info = _THREAD_INFO
            except Exception:
                pass
        try:
            if self.worker_init_fn is not None:
                for h in handlers:
                    _local.info = h.info
                    self.worker_init_fn(h.info.id)
        finally:
            _local.info = None
        self.procs = handlers
        self.source.set_workers(handlers)

    def handler(self, worker_id):
        """Worker thread ``worker_id``'s handler (``worker_mode="thread"``), else None."""
        if self.context == "thread" and 0 <= worker_id < len(self.procs):
            return self.procs[worker_id]
        return None

    def alive(self):
        if self.context == "thread":
            return bool(self.procs)
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def pids(self):
        """The worker processes' pids (none for threads)."""
        if self.context == "thread":
            return []
        return [p.pid for p in self.procs]

    def describe(self, worker_id):
        """How worker ``worker_id``'s process ended: its pid and exit code or signal."""
        if self.context == "thread":
            return "a thread of this process"
        try:
            p = self.procs[worker_id]
        except IndexError:
            return "no such worker"
        p.join(timeout=1.0)
        code = p.exitcode
        if code is None:
            return f"pid {p.pid}, still running, its pipe closed"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            how = f"pid {p.pid}, killed by signal {-code} ({name})"
            if -code == signal.SIGKILL:
                how += ": the kernel's out-of-memory killer or a kill -9"
            return how
        return f"pid {p.pid}, exited with code {code}"

    def stop(self):
        """Ends the workers: their pipes shut down (each worker's next read sees the end and
        it exits; an idle worker at once), then joined, a worker still busy in the dataset's
        code after 5 s terminated, as torch ends its workers. Nothing of theirs remains: no
        process, no pipe."""
        procs, conns = self.procs, self.conns
        self.procs, self.conns = [], []
        _LIVE.discard(self)
        if procs or conns:
            # The loader's copies of the pipes first, shut down for every holder.
            self.source.set_workers([])
        if self.context == "thread":
            torch = _torch()
            if procs and torch is not None:
                try:
                    from torch.utils.data import _utils

                    if _utils.worker._worker_info is _THREAD_INFO:
                        _utils.worker._worker_info = None
                except Exception:
                    pass
            return
        for c in conns:
            try:
                c.close()
            except OSError:
                pass
        deadline = _monotonic() + 5.0
        for p in procs:
            p.join(timeout=max(0.0, deadline - _monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
                p.join()
            if hasattr(p, "close"):
                try:
                    p.close()
                except ValueError:
                    pass

    def __del__(self):
        try:
            self.stop()
        except Exception:
            pass
