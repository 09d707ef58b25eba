"""A Python dataset's side of :class:`longshore.DataLoader`: the dataset, ``collate_fn``,
``worker_init_fn`` and ``multiprocessing_context`` run in worker processes (or threads) as
PyTorch runs them (:class:`_PythonDataset`), and an epoch's batches are rebuilt from their
tensors and meta (:class:`_PythonBatches`)."""

import os as _os
import sys as _sys

from . import _longshore, _workers
from . import data as _data
from ._longshore import LoaderError, LoaderTimeout, SampleError
from ._samplers import _torch as _import_torch


def _is_datapipe(dataset):
    """Whether ``dataset`` is one of torch's DataPipes (``IterDataPipe`` / ``MapDataPipe``)."""
    torch = _import_torch() if "torch" in _sys.modules else None
    data = getattr(getattr(torch, "utils", None), "data", None)
    kinds = tuple(k for k in (getattr(data, "IterDataPipe", None),
                              getattr(data, "MapDataPipe", None)) if k is not None)
    return bool(kinds) and isinstance(dataset, kinds)


def _datapipe_world():
    """``(world_size, rank)`` for sharding a DataPipe, as torch's loader takes them: the
    initialised process group's, else ``(1, 0)``."""
    torch = _import_torch()
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class _PythonDataset:
    """A Python dataset's loader parts: the Rust loader's source and the worker processes.

    ``batched``: False for ``batch_size=None`` (torch's non-batch mode: each sample converted,
    not collated). A DataPipe is sharded over ranks x workers in its workers (in this process
    over ranks with ``num_workers=0``) and an ``IterDataPipe`` seeded per epoch with one shared
    seed, as torch's loader does."""

    def __init__(self, dataset, collate_fn, worker_init_fn, context, num_workers,
                 iterable=None, batched=True):
        import multiprocessing

        if context == "thread":
            pass  # worker threads (worker_mode="thread"): _workers.Workers runs them
        elif isinstance(context, str):
            context = multiprocessing.get_context(context)
        elif context is None:
            context = multiprocessing.get_context()
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.iterable = bool(iterable)
        self.batched = batched
        self.context = context
        self.worker_init_fn = worker_init_fn
        self.num_workers = num_workers
        self.datapipe = _is_datapipe(dataset)
        self.source = None
        self.workers = None
        self.handler = None
        # (pid, dataset) -> the counts a worker sent with its latest batch (shard_stats).
        self.counts = {}
        if not iterable:
            self.bind(None, False)

    def bind(self, batch_size, drop_last):
        """Makes the loader's source: an iterable dataset's carries ``(batch_size,
        drop_last)``, which its workers apply."""
        dataset, collate_fn = self.dataset, self.collate_fn
        self.source = _longshore._ProcessSource(
            0 if self.iterable else len(dataset), self._describe,
            (batch_size, drop_last) if self.iterable else None)
        sharding = _datapipe_world() if self.datapipe else None
        self.workers = _workers.Workers(dataset, collate_fn, self.num_workers, self.context,
                                        self.worker_init_fn, self.source, self.batched,
                                        sharding)
        if self.num_workers == 0:
            # PyTorch's num_workers=0: the dataset's code runs in this process.
            self.handler = _workers.Handler(dataset, collate_fn, -1, _os.getpid(), self.batched)
            self.source.set_workers([self.handler])

    def _describe(self, worker_id):
        return self.workers.describe(worker_id)

    def unpack(self, meta):
        """A batch's ``(tree, objects, dtypes)`` from its meta (see ``Handler.unpack``); the
        counts its worker sent with it are kept for ``shard_stats``."""
        if meta[:1] == _workers._KEPT:
            if self.handler is not None:
                built = self.handler.unpack(meta)
            else:
                token = _workers.struct.unpack_from("<Q", meta, 1)[0]
                for h in self.workers.procs:
                    if token in getattr(h, "kept", ()):
                        built = h.unpack(meta)
                        break
                else:
                    raise LoaderError(f"a batch's values were not kept (token {token})")
        else:
            built = _workers.pickle.loads(meta)
        tree, objects, dtypes, counts = built
        if counts is not None:
            key, value = counts
            self.counts[key] = value
        return tree, objects, dtypes

    def shard_stats(self):
        """A sharded dataset read with ``map=``: its workers' counts (each process's as of
        its last batch delivered, over every process that read for this loader) added up, in
        the shape of ``stats["shards"]``; ``None`` before any."""
        if not self.counts:
            return None
        return _merge_shard_stats(list(self.counts.values()))

    def end_epoch(self, generation=None):
        """Ends an epoch's workers (without persistent workers, or after a worker died), as
        PyTorch ends its workers with the epoch: no process, pipe or thread of theirs stays,
        and torch's ``get_worker_info()`` is ``None`` again in this process. ``generation``:
        only if the workers are still those that epoch started (a later iterator's are
        left)."""
        w = self.workers
        if w is not None and (generation is None or generation == w.generation):
            w.stop()

    def start_epoch(self, base_seed, persistent, shared_seed=None):
        """Starts the worker processes for an epoch: every epoch, as PyTorch does, or once
        with persistent workers (again if one died)."""
        if not self.iterable:
            # A dataset may grow between epochs: torch's loader follows it.
            self.source.set_len(len(self.dataset))
        w = self.workers
        if w.num_workers == 0:
            if self.datapipe:
                self.handler.dataset = self._main_datapipe(shared_seed)
                self.handler.stream_epoch = None
            return
        if persistent and w.alive():
            return
        w.start(base_seed, shared_seed)

    def _main_datapipe(self, shared_seed):
        """The DataPipe as this process iterates it (``num_workers=0``): seeded with the
        epoch's shared seed, sharded over ranks, as torch's single-process iterator does."""
        torch = _import_torch()
        from torch.utils.data import IterDataPipe, graph_settings

        dataset = self.dataset
        if isinstance(dataset, IterDataPipe) and shared_seed is not None:
            rng = torch.Generator()
            rng.manual_seed(shared_seed)
            dataset = graph_settings.apply_random_seed(dataset, rng)
        world_size, rank = _datapipe_world()
        graph_settings.apply_sharding(dataset, world_size, rank)
        return dataset


def _python_work(dataset, collate_fn, worker_init_fn, multiprocessing_context, num_workers=0,
                 batched=True):
    """The arguments whose work only Python can do: a Python dataset, ``collate_fn``,
    ``worker_init_fn``, ``multiprocessing_context``. A map-style Python dataset (any object
    with ``__getitem__`` and ``__len__``) runs in worker processes (:class:`_PythonDataset`),
    with ``collate_fn``, ``worker_init_fn`` and ``multiprocessing_context`` as PyTorch runs
    them; longshore's own datasets run in Rust threads, where those arguments are refused (a
    ``ValueError`` naming what longshore runs instead). The one place that decides it; returns
    what the Rust loader reads for ``dataset``."""
    native = _data._native_or_none(dataset)
    if native is None:
        if not _is_iterable(dataset) and hasattr(dataset, "__getitem__") \
                and hasattr(dataset, "__len__"):
            collate_fn = _own_collate(collate_fn, batched)
            return _PythonDataset(dataset, collate_fn, worker_init_fn, multiprocessing_context,
                                  num_workers, batched=batched)
        if hasattr(dataset, "__iter__"):
            collate_fn = _own_collate(collate_fn, batched)
            return _PythonDataset(dataset, collate_fn, worker_init_fn, multiprocessing_context,
                                  num_workers, iterable=True, batched=batched)
        raise TypeError(
            "longshore.DataLoader takes a map-style dataset (__getitem__ and __len__), a "
            "longshore.NpyDataset, RecordDataset, datasets.ImageFolder, data.ArrayDataset or "
            "data.TensorDataset (or a data.Subset or data.ConcatDataset of them), not "
            + type(dataset).__name__
        )
    if collate_fn is not None and not _is_default_collate(collate_fn):
        raise ValueError(
            "collate_fn: longshore's workers collate in Rust, as torch.utils.data."
            "default_collate does (a list of one batched tensor per field); leave collate_fn "
            "None and transform the batch after the loader"
        )
    if worker_init_fn is not None:
        raise ValueError(
            "worker_init_fn: longshore's workers are Rust threads, which run no Python; "
            "their random transforms are seeded from seed= (or torch's generator) and the "
            "worker id"
        )
    if multiprocessing_context is not None:
        raise ValueError(
            "multiprocessing_context: longshore's workers are threads of this process, "
            "not processes; leave it None"
        )
    return native


def _is_iterable(dataset):
    """An iterable dataset, as PyTorch decides (a torch ``IterableDataset``), or an object
    with ``__iter__`` that cannot be indexed."""
    torch = _import_torch()
    if torch is not None and isinstance(dataset, torch.utils.data.IterableDataset):
        return True
    return hasattr(dataset, "__iter__") and not (
        hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"))


def _is_default_collate(fn, name="default_collate"):
    return (getattr(fn, "__name__", None) == name
            and getattr(fn, "__module__", "").startswith("torch.utils.data"))


def _own_collate(collate_fn, batched):
    """``collate_fn``, or None for torch's default (``default_collate``, or
    ``default_convert`` with ``batch_size=None``), which the workers fuse into the batch."""
    if collate_fn is not None and _is_default_collate(
            collate_fn, "default_collate" if batched else "default_convert"):
        return None
    return collate_fn


def _check_multiprocessing_context(context, num_workers):
    """PyTorch's checks of ``multiprocessing_context`` (before longshore's refusal)."""
    if context is None:
        return
    if num_workers <= 0:
        raise ValueError(
            "multiprocessing_context can only be used with multi-process loading "
            f"(num_workers > 0), but got num_workers={num_workers}"
        )
    import multiprocessing

    if isinstance(context, str):
        valid = multiprocessing.get_all_start_methods()
        if context not in valid:
            raise ValueError(
                "multiprocessing_context option should specify a valid start method in "
                f"{valid!r}, but got multiprocessing_context={context!r}"
            )
    elif not isinstance(context, multiprocessing.context.BaseContext):
        raise TypeError(
            "multiprocessing_context option should be a valid context object or a string "
            f"specifying the start method, but got multiprocessing_context={context}"
        )


class _PythonBatches:
    """A Python dataset's epoch: batches rebuilt from their tensors and meta (nesting,
    non-tensor values), as torch's iterator hands them over.

    A batch whose samples raised re-raises the worker's exception (its own type, the worker's
    traceback in the message) and the epoch goes on: the next ``next()`` yields the next
    batch, as torch's iterator does. A worker process that died ends the epoch with a
    ``LoaderError`` naming the worker, its pid, how it ended and the samples it held; the
    next epoch starts new workers. The workers end with the epoch (unless persistent), when
    the iterator is closed or collected, or when the loader goes."""

    def __init__(self, epoch, loader, persistent):
        self._epoch = epoch
        # The loader lives while its iterator does (as torch's iterator holds its loader):
        # its workers end with it.
        self._loader = loader
        self._python = loader._python
        self._generation = self._python.workers.generation
        self._persistent = persistent
        self._timeout = loader.timeout

    def __iter__(self):
        return self

    def __next__(self):
        epoch = self._epoch
        if epoch is None:
            raise StopIteration
        try:
            tensors, meta = next(epoch)
        except StopIteration:
            self._finish(broken=False)
            raise
        except SampleError as e:
            dead = self._python.source.dead_worker()
            if dead is not None:
                self._finish(broken=True)
                raise LoaderError(dead) from None
            raise _reraise(e) from None
        except LoaderTimeout as e:
            message = self._timed_out(str(e))
            self._finish(broken=True)
            raise LoaderTimeout(message) from None
        except KeyboardInterrupt:
            # With num_workers=0 the epoch goes on, as torch's: the interrupted batch is lost
            # (raised in the dataset's code) or comes with the next ``next()`` (raised while
            # waiting). With workers the epoch is over, its workers with it.
            if self._python.num_workers != 0:
                self._finish(broken=True)
            raise
        except BaseException:
            # A loader failure: the epoch is over, its workers with it.
            self._finish(broken=True)
            raise
        tree, objects, dtypes = self._python.unpack(meta)
        return _workers.rebuild(tree, tensors, objects, dtypes)

    def _timed_out(self, message):
        """The timeout's message with the worker processes' pids and states (torch names the
        timeout; longshore says who it waited for)."""
        workers = self._python.workers
        pids = workers.pids() if workers is not None else []
        if not pids:
            return message
        states = []
        for i, pid in enumerate(pids):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                state = "gone"
            states.append(f"worker {i}: pid {pid} ({state})")
        return (f"DataLoader timed out after {self._timeout} seconds: {message}; worker "
                f"processes: {', '.join(states)}")

    def _finish(self, broken):
        epoch, self._epoch = self._epoch, None
        if epoch is None:
            return
        close = getattr(epoch, "close", None)
        if close is not None:
            close()
        if broken or not self._persistent:
            self._python.end_epoch(self._generation)

    def close(self):
        """Ends the epoch now: its batches not yet taken go back to the pool, and its worker
        processes end (unless persistent)."""
        self._finish(broken=False)

    def __del__(self):
        try:
            self._finish(broken=False)
        except Exception:
            pass


# The gloo process group torch's loader shares an IterDataPipe's seed over (made once).
_SEED_GROUP = []


def _share_dist_seed(generator):
    """An IterDataPipe's shared seed for an epoch, drawn from ``generator`` (torch's global
    one by default) and, under torch.distributed, rank 0's on every rank, as torch's
    ``_share_dist_seed`` does (so the ranks shuffle alike and their shards add up)."""
    torch = _import_torch()
    seed = torch.empty((), dtype=torch.int64).random_(generator=generator)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        if not _SEED_GROUP:
            _SEED_GROUP.append(dist.new_group(backend="gloo"))
        dist.broadcast(seed, src=0, group=_SEED_GROUP[0])
    return seed.item()


def _reraise(e):
    """The worker's exception type for a ``SampleError`` that carries one (its message ends
    with ``[exception type: module.qualname]``), else ``e``."""
    import importlib

    msg = str(e)
    tail = msg.rstrip().rsplit("\n", 1)[-1]
    prefix = "[exception type: "
    if not (tail.startswith(prefix) and tail.endswith("]")):
        return e
    module, _, qualname = tail[len(prefix):-1].rpartition(".")
    try:
        typ = importlib.import_module(module)
        for part in qualname.split("."):
            typ = getattr(typ, part)
    except Exception:
        return e
    if not (isinstance(typ, type) and issubclass(typ, BaseException)):
        return e
    try:
        return typ(msg)
    except Exception:
        return RuntimeError(msg)


_SUMMED = ("failed", "padded", "unpadded", "downloads", "redownloads", "forced_evictions",
           "range_reads")
_EPOCH_SUMMED = ("downloads", "redownloads", "downloaded_bytes", "evictions",
                 "forced_evictions", "range_reads", "range_bytes", "misses", "miss_wait_s")


def _merge_shard_stats(parts):
    """The ``stats["shards"]`` of several processes' counts (``_Shards.records_stats``):
    counts added, reasons and epochs added key by key, a shard damaged in two processes
    counted once."""
    out = {k: sum(p.get(k, 0) for p in parts) for k in _SUMMED}
    reasons = {}
    damaged = set()
    epochs = {}
    members = []
    for p in parts:
        for reason, n in p.get("failed_by_reason", {}).items():
            reasons[reason] = reasons.get(reason, 0) + n
        damaged.update(p.get("damaged", ()))
        for e in p.get("cache_epochs", ()):
            into = epochs.setdefault(e["epoch"], dict.fromkeys(_EPOCH_SUMMED, 0))
            for k in _EPOCH_SUMMED:
                into[k] += e.get(k, 0)
        m = p.get("members", ())
        members.extend([0] * (len(m) - len(members)))
        for i, n in enumerate(m):
            members[i] += n
    out["failed_by_reason"] = reasons
    out["damaged_shards"] = len(damaged)
    out["cache_epochs"] = [dict(epoch=e, **epochs[e]) for e in sorted(epochs)]
    if members:
        out["members"] = members
    return out
