"""``longshore.DataLoader``: torch's ``DataLoader`` arguments over longshore's Rust loader."""

import itertools as _itertools
import json as _json
import os as _os
import types as _types
import warnings as _warnings
import weakref as _weakref

import numpy as _np

from . import _logs, _longshore
from . import data as _data
from ._epoch_wrappers import _CheckedEpoch, _Unbatched
from ._python import (
    _check_multiprocessing_context,
    _import_torch,
    _python_work,
    _PythonBatches,
    _PythonDataset,
    _share_dist_seed,
)


def _cuda_index(device):
    """The CUDA ordinal of ``device`` (None, "cuda", "cuda:N", an int or a torch.device)."""
    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    text = str(device)
    if text == "cpu":
        return None
    if text == "cuda":
        torch = _import_torch()
        return torch.cuda.current_device() if torch is not None else 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', not {device!r}")


def _torch_converter(torch, cuda, pinned):
    """A :class:`_TorchConverter` over torch's C-level functions, bound once here (never looked
    up per batch), or None when this torch lacks one of them: then each tensor goes through
    ``torch.utils.dlpack.from_dlpack``, as before the converter existed (slower, same result).

    ``torch._C._from_dlpack`` imports a DLPack capsule (every torch since 1.x);
    ``torch._C._cuda_getCurrentRawStream(index)`` returns the current stream's ``cudaStream_t``
    and ``torch._C._cuda_getDevice()`` the current GPU, without building a ``torch.cuda.Stream``
    (what torch.compile's generated code uses to launch kernels)."""
    c = getattr(torch, "_C", None)
    from_dlpack = getattr(c, "_from_dlpack", None)
    raw_stream = getattr(c, "_cuda_getCurrentRawStream", None)
    current_device = getattr(c, "_cuda_getDevice", None)
    if from_dlpack is None:
        return None
    if cuda and (raw_stream is None or current_device is None):
        return None
    if cuda and not pinned:
        # torch's Python-level CUDA set-up, which torch.cuda.current_stream() (the per-tensor
        # path) runs on first use and the raw C-level functions do not. With device="cuda"
        # the loader has made its CUDA context already; pinned CPU batches leave it to the
        # first iteration (DataLoader.__iter__), so a process may still fork after building
        # the loader, as with the per-tensor path.
        torch.cuda.init()
    return _longshore._TorchConverter(
        from_dlpack,
        raw_stream=raw_stream if cuda else None,
        current_device=current_device if pinned else None,
        pinned=pinned,
    )


def _check_pin_memory_device(value, index):
    """``pin_memory_device``: ``""``, or ``"cuda"`` / ``"cuda:N"`` agreeing with ``device``."""
    if value == "" or value is None:
        return
    text = str(value)
    if text != "cuda" and not (text.startswith("cuda:") and text[5:].isdigit()):
        raise ValueError(
            f"pin_memory_device must be '', 'cuda' or 'cuda:N', not {value!r}: longshore pins "
            "memory for CUDA; device= names the GPU that receives the batches"
        )
    if text != "cuda" and index is not None and int(text[5:]) != index:
        raise ValueError(
            f"pin_memory_device={value!r} disagrees with device (cuda:{index})"
        )


# Loaders made in this process: what tells two loaders' worker seeds apart.
_LOADERS = _itertools.count()


# Attributes PyTorch's DataLoader refuses to change after construction.
_FIXED = frozenset(
    ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")
)


class DataLoader:
    """``torch.utils.data.DataLoader`` over longshore's Rust loader: the same arguments, in
    the same order, with PyTorch's defaults, checks and messages, then longshore's own.

    ``dataset`` is a longshore dataset: :class:`NpyDataset`, :class:`RecordDataset`,
    :class:`datasets.ImageFolder` with a transform (batches ``[images, labels]``),
    :class:`datasets.TokenDataset` (batches ``{"input_ids": ..., "targets": ...}``),
    :class:`data.ArrayDataset` / :class:`data.TensorDataset` (in-memory arrays), or a
    :class:`data.Subset` / :class:`data.ConcatDataset` of them.

    ``shuffle``, ``sampler``, ``batch_sampler``, ``drop_last`` and ``generator`` decide the
    order as in PyTorch: with PyTorch installed, for the same generator state
    (``torch.manual_seed``, or ``generator``) the same batches in the same order, and
    PyTorch's global generator is drawn from as PyTorch's DataLoader draws from it (the
    workers' base seed, at each iteration). ``sampler`` / ``batch_sampler`` take
    :mod:`longshore.data`'s samplers (drawn in one call per epoch), PyTorch's, or any iterable
    of indices / of lists of indices (iterated in the main process as the loader needs
    batches, as PyTorch does). ``in_order=False`` hands batches over as they are ready.

    Refused, with a ``ValueError`` naming what longshore does instead: ``collate_fn`` other
    than PyTorch's ``default_collate``, ``worker_init_fn``, ``multiprocessing_context`` (the
    workers are Rust threads), ``batch_size=None``, a ``pin_memory_device`` other than CUDA's.
    ``pin_memory_device`` is otherwise accepted (PyTorch ignores it too).

    longshore's own keywords: ``seed`` (instead of ``generator``): the order is then
    longshore's own, reproducible without PyTorch and resumable exactly
    (:meth:`state_dict`), and PyTorch's generator is not touched; ``device`` delivers batches
    on a GPU. ``pool`` (a :class:`PinnedPool`) bounds the host memory batches may hold;
    ``framework`` picks ``"torch"`` or ``"numpy"`` outputs (default: torch when installed).
    ``decode="nvjpeg"`` (an ImageFolder, image shards or shards with an image field, and
    ``device="cuda"``) decodes the JPEGs on the GPU with nvJPEG: the workers only read the
    files and draw the crops (the same crops as ``decode="cpu"`` for a seed). ``worker_priority="background"`` runs the worker threads at a
    lower priority (Linux: ``SCHED_BATCH``, nice 10), so that with about as many busy workers
    as cores the threads that hand batches to Python (the epoch thread and the one calling
    ``next``) still get a core when they wake; ``"normal"`` (the default) leaves them as
    PyTorch's workers are. ``on_sample_error="skip"`` drops a sample that fails to load from
    its batch (``"raise"``, the default, raises :class:`SampleError`).

    A Python dataset's code runs in worker processes (``multiprocessing_context``), as in
    PyTorch; ``worker_mode="thread"`` runs it in the loader's threads of this process instead:
    no start-up, no pickling of the dataset, samples written straight into the pinned batch.
    That is what to use on Python without a GIL (3.13t and later); under the GIL the threads
    take turns, except in code that releases it (file reads, PIL's and NumPy's C loops).
    With threads the process's random generators are one for all workers (they are not
    seeded per worker); ``get_worker_info()`` (longshore's and torch's) answers per thread.
    """

    def __init__(
        self,
        dataset,
        batch_size=1,
        shuffle=None,
        sampler=None,
        batch_sampler=None,
        num_workers=0,
        collate_fn=None,
        pin_memory=False,
        drop_last=False,
        timeout=0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor=None,
        persistent_workers=False,
        pin_memory_device="",
        in_order=True,
        device=None,
        pool=None,
        seed=None,
        framework=None,
        decode="cpu",
        worker_priority="normal",
        on_sample_error="raise",
        worker_mode=None,
    ):
        # The Rust side's warnings (a skipped sample, a damaged shard) reach `logging`.
        _logs.ensure_started()
        # PyTorch's rules on the options (num_workers, timeout, prefetch_factor,
        # persistent_workers) are the Rust builder's, checked when the loader is built (a
        # ValueError in PyTorch's words); here only what the Rust side does not see.
        _check_multiprocessing_context(multiprocessing_context, num_workers)
        if worker_mode not in (None, "process", "thread"):
            raise ValueError(
                f"worker_mode must be 'process' or 'thread' (or None), not {worker_mode!r}")
        if worker_mode == "thread" and multiprocessing_context is not None:
            raise ValueError(
                "worker_mode='thread' runs the dataset in threads of this process: "
                "multiprocessing_context (a start method for worker processes) must stay None")
        # batch_size=None without a batch_sampler: torch's non-batch mode (each sample
        # converted by default_convert, or passed alone to collate_fn).
        batched = not (batch_size is None and batch_sampler is None)
        native = _python_work(dataset, collate_fn, worker_init_fn,
                              "thread" if worker_mode == "thread" else multiprocessing_context,
                              num_workers if isinstance(num_workers, int) else 0, batched)
        if worker_mode == "process" and not isinstance(native, _PythonDataset):
            raise ValueError(
                "worker_mode='process': longshore's own datasets load in Rust threads of this "
                "process, which run no Python; leave worker_mode None")
        self._python = native if isinstance(native, _PythonDataset) else None
        # Image shards (datasets.WebDataset, StreamingDataset): an iterable dataset that the
        # Rust workers read, in an order planned per epoch.
        self._sharded = isinstance(native, _longshore._Shards)
        iterable = (self._python is not None and self._python.iterable) or self._sharded
        if iterable:
            if self._python is not None and self._python.datapipe:
                # torch's loader: an IterDataPipe's shuffle option sets its Shuffler(s).
                if shuffle is not None:
                    from torch.utils.data import graph_settings

                    dataset = graph_settings.apply_shuffle_settings(dataset, shuffle=shuffle)
                    self._python.dataset = dataset
                shuffle = None
            # PyTorch's checks for an IterableDataset, in its words.
            for name, value in (("shuffle", shuffle), ("sampler", sampler),
                                ("batch_sampler", batch_sampler)):
                if value not in (None, False):
                    raise ValueError(
                        f"DataLoader with IterableDataset: expected unspecified {name} option, "
                        f"but got {name}={value}"
                    )
            if batch_size is None and self._sharded:
                raise ValueError(
                    "batch_size=None (no automatic batching): a sharded dataset's batches are "
                    "made by longshore's workers; use batch_size=1 and take each batch's "
                    "first row"
                )
            if self._python is not None:
                self._python.bind(batch_size or 1, bool(drop_last))
                # A sharded dataset with map= plans each worker's stream in whole batches.
                bind = getattr(dataset, "_bind_loader", None)
                if bind is not None:
                    bind(batch_size or 1, bool(drop_last))
            wanted = getattr(dataset, "batch_size", None) if self._sharded else None
            if wanted is not None and wanted != batch_size:
                raise ValueError(
                    f"the dataset was made with batch_size={wanted}, the loader's is "
                    f"{batch_size}: they must agree (or leave the dataset's None)")
        if self._python is not None:
            native = self._python.source
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive "
                    "with batch_size, shuffle, sampler, and "
                    "drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None:
            if drop_last:
                raise ValueError(
                    "batch_size=None option disables auto-batching "
                    "and is mutually exclusive with drop_last"
                )
        if seed is not None and generator is not None:
            raise ValueError(
                "give generator (PyTorch's) or seed (longshore's order), not both"
            )
        if generator is not None:
            _data._no_generator_without_torch(generator)
        # PyTorch's default samplers (their checks included: batch_size, drop_last, an empty
        # dataset with shuffle).
        own_sampler = sampler is None and batch_sampler is None
        if iterable:
            # An iterable dataset has no sampler: its workers' streams are the order.
            pass
        elif sampler is None:
            if shuffle:
                sampler = _data.RandomSampler(dataset, generator=generator)
            else:
                sampler = _data.SequentialSampler(dataset)
        # The loader's batches of indices: the batch sampler, or (batch_size=None) the sampler's
        # indices one by one, which torch's attribute batch_sampler does not show (None).
        batches = batch_sampler
        if batch_sampler is None and not iterable:
            batches = _data.BatchSampler(sampler, batch_size if batched else 1, drop_last)
            batch_sampler = batches if batched else None
        torch = _import_torch() if seed is None else None
        # PyTorch's generator decides the order (and draws the workers' base seed).
        self._torch_rng = torch
        # The Rust loader's own order: sequential, or shuffled by longshore's generator (seed=,
        # or PyTorch absent); else Python hands the loader each epoch's order. A Python
        # dataset's sequential order is its SequentialSampler's, whose length follows the
        # dataset as it grows between epochs (a shuffled one is rebuilt when it grew).
        builtin = iterable or (own_sampler and batched and (not shuffle or torch is None)
                               and (shuffle or self._python is None))
        self._unbatched = not batched
        index = _cuda_index(device)
        _check_pin_memory_device(pin_memory_device, index)
        if framework is None:
            framework = "torch" if (_import_torch() is not None or index is not None) else "numpy"
        if framework not in ("torch", "numpy"):
            raise ValueError(f"framework must be 'torch' or 'numpy', not {framework!r}")
        if framework == "numpy" and index is not None:
            raise ValueError("NumPy arrays live on the CPU: device='cuda' needs framework='torch'")
        if seed is None and torch is not None:
            # The workers' random transforms: reproducible under torch.manual_seed, and not
            # the same in two loaders of one process (drawing from the generator here would
            # shift PyTorch's draws).
            gen = generator if generator is not None else torch.default_generator
            rust_seed = (int(gen.initial_seed()) * 0x9E3779B97F4A7C15 + next(_LOADERS)) % 2**64
        else:
            rust_seed = seed
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.drop_last = drop_last
        self.timeout = timeout
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self._batches = batches
        self.generator = generator
        self.collate_fn = collate_fn
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        # torch's attribute: 2 with workers when not given.
        self.prefetch_factor = 2 if prefetch_factor is None and num_workers > 0 else prefetch_factor
        self.persistent_workers = persistent_workers
        self.pin_memory_device = pin_memory_device
        self.in_order = in_order
        self.device = device
        self.seed = seed
        self._order = None if builtin else _longshore._EpochOrder(
            len(dataset), _len_or_zero(batches))
        self._iterated = False
        # A sharded dataset's resumed epoch: its batches left (what len() says until the next
        # epoch starts), and whether it is under way.
        self._resumed_len = None
        self._resumed_running = False
        # Exact resume when PyTorch's generator decides: the generator's state after the
        # epoch's base-seed draw (before the sampler's draws) and the workers' base seed, of
        # the epoch now running / of the epoch to resume (load_state_dict).
        self._epoch_rng = None
        self._resume_rng = None
        self._base_seed = None
        self._loader_args = None
        self._loader = self._make_loader(
            # datasets.ImageFolder & co wrap their native dataset.
            native,
            dict(
                batch_size=1 if self._order is not None else (batch_size or 1),
                shuffle=bool(shuffle) and builtin,
                num_workers=num_workers,
                pin_memory=bool(pin_memory),
                drop_last=bool(drop_last) and builtin,
                prefetch_factor=prefetch_factor,
                persistent_workers=bool(persistent_workers),
                timeout=float(timeout),
                seed=rust_seed,
                in_order=bool(in_order),
                on_sample_error=on_sample_error,
                worker_priority=worker_priority,
            ),
            device=index,
            pool=pool,
            order=self._order,
            # Every torch version imports host memory labelled kDLCPU (and still sees the pages
            # pinned); not every one imports kDLCUDAHost, DLPack's own label for page-locked
            # memory, which is kept for other consumers.
            pinned_label="cpu" if framework == "torch" else "cuda_host",
            decode=decode,
            # A Mixture's delivered samples are counted by member (stats["sources"]).
            sources=dataset._schedule if isinstance(dataset, _data.Mixture) else None,
        )
        self._index = index
        self._convert = self._converter(framework)
        self._dataset_len = None if iterable else len(dataset)
        if self._python is not None:
            # The worker processes end with the loader (deleted, collected, or at exit).
            _weakref.finalize(self, self._python.end_epoch)
        self._initialized = True

    # ``DataLoader[T]``, as torch's DataLoader is a Generic.
    __class_getitem__ = classmethod(_types.GenericAlias)

    def _make_loader(self, *args, **kwargs):
        """The Rust loader, from arguments kept for a rebuild (a Python dataset that grew
        under longshore's own shuffled order)."""
        self._loader_args = (args, kwargs)
        return _longshore._Loader(*args, **kwargs)

    def _follow_length(self):
        """A Python dataset that grew (or shrank) since the last epoch: the order's bounds
        follow it, and longshore's own shuffled order is drawn over the new length, as torch's
        samplers read ``len(dataset)`` at each epoch."""
        if self._python is None or self._python.iterable:
            return
        n = len(self.dataset)
        if n == self._dataset_len:
            return
        self._dataset_len = n
        self._python.source.set_len(n)
        if self._order is not None:
            self._order.set_dataset_len(n)
            return
        epoch = _json.loads(self._loader.state_dict_json())["epoch"]
        args, kwargs = self._loader_args
        self._loader = self._make_loader(*args, **kwargs)
        self._loader.set_epoch(epoch)

    def _check_worker_number(self):
        """torch's warning when a loader starts more worker processes than the CPUs this
        process may run on (its affinity mask), in torch's words."""
        if not self.num_workers or self._python is None:
            return
        try:
            cpus = len(_os.sched_getaffinity(0))
            checked = True
        except (AttributeError, OSError):
            cpus, checked = _os.cpu_count(), False
        if cpus is not None and self.num_workers <= cpus:
            return
        if cpus is None:
            suggest = ("DataLoader is not able to compute a suggested max number of worker in "
                       "current system.")
        else:
            suggest = (f"Our suggested max number of worker in current system is {cpus}"
                       f"{'' if checked else ' (`cpuset` is not taken into account)'}, which is "
                       "smaller than what this DataLoader is going to create.")
        _warnings.warn(
            f"This DataLoader will create {self.num_workers} worker processes in total. "
            f"{suggest} Please be aware that excessive worker creation might get DataLoader "
            "running slow or even freeze, lower the worker number to avoid potential "
            "slowness/freeze if necessary.", stacklevel=3)

    def __setattr__(self, attr, val):
        if attr in _FIXED and self.__dict__.get("_initialized", False):
            raise ValueError(
                f"{attr} attribute should not be set after {type(self).__name__} is initialized"
            )
        super().__setattr__(attr, val)

    def _converter(self, framework, fast=True):
        """What turns a batch's tensors into the framework's: a ``_TorchConverter`` (a whole
        batch per Rust call) for torch, or a callable per tensor (``np.from_dlpack``, or
        torch's ``from_dlpack`` with ``fast=False`` or where this torch lacks the internals the
        converter uses)."""
        if framework == "numpy":
            import numpy as np

            return np.from_dlpack
        torch = _import_torch()
        if torch is None:
            raise ImportError("framework='torch' needs PyTorch installed")
        # Page-locked batches are usually copied to the GPU with non_blocking=True on torch's
        # current stream: their block goes back to the pool only once that stream has passed
        # the point where the tensor was freed.
        pinned = self._index is None and self.pin_memory and torch.cuda.is_available()
        if fast:
            converter = _torch_converter(torch, cuda=self._index is not None or pinned, pinned=pinned)
            if converter is not None:
                self._cuda_init = torch.cuda.init if pinned else None
                return converter
        from_dlpack = torch.utils.dlpack.from_dlpack
        if pinned:
            current_stream = torch.cuda.current_stream
            current_device = torch.cuda.current_device

            def pinned_from_dlpack(t):
                stream = current_stream().cuda_stream
                t.release_after_stream(current_device(), stream if stream != 0 else 1)
                return from_dlpack(t)

            return pinned_from_dlpack
        return from_dlpack

    def __iter__(self):
        init = getattr(self, "_cuda_init", None)
        if init is not None:
            # Pinned batches through the fast converter: torch's CUDA set-up, once, at the
            # first iteration rather than at construction (see _torch_converter).
            init()
            self._cuda_init = None
        torch = self._torch_rng
        self._follow_length()
        self._check_worker_number()
        shared_seed = None
        if self._python is not None and self._python.datapipe and self._python.iterable:
            # torch's iterator draws an IterDataPipe's shared seed first (the same in every
            # worker and, under torch.distributed, on every rank), then the base seed.
            shared_seed = _share_dist_seed(self.generator)
        base_seed = None
        resume, restore = self._resume_rng, None
        self._resume_rng = None
        if resume is not None:
            # The saved epoch's draws again: its base seed, and the generator as it was
            # before the sampler drew (put back after a whole-epoch sampler's draws).
            gen = self.generator if self.generator is not None else torch.default_generator
            restore = gen.get_state()
            gen.set_state(_rng_state_from(torch, resume[0]))
            base_seed = self._base_seed = resume[1]
        elif torch is not None and not (self._iterated and self.persistent_workers):
            # PyTorch's iterator draws its workers' base seed from the generator when it is
            # made (once, with persistent workers): the draws that follow are then PyTorch's.
            base_seed = self._base_seed = int(
                torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        self._iterated = True
        if self._sharded:
            # The loader runs the next epoch (or the one set_epoch chose, or a restored one)
            # and lays it out on the dataset; its position counts the batches received.
            if self._resumed_len is not None:
                if self._resumed_running:
                    self._resumed_len = None
                self._resumed_running = True
            return self._epoch(restore)
        if torch is not None:
            # (An iterable dataset's epoch resumes by replay: the same base seed makes its
            # workers' streams the same.)
            gen = self.generator if self.generator is not None else torch.default_generator
            epoch = _json.loads(self._loader.state_dict_json())["epoch"]
            self._epoch_rng = (gen.get_state(), epoch)
        if self._python is not None:
            if base_seed is None:
                base_seed = self._base_seed
            if base_seed is None:
                base_seed = (int(self.seed or 0) * 0x9E3779B97F4A7C15 + next(_LOADERS)) % 2**63
                self._base_seed = base_seed
            # An IterDataPipe's workers are seeded anew each epoch (with its shared seed).
            persistent = bool(self.persistent_workers) and shared_seed is None
            self._python.start_epoch(base_seed, persistent, shared_seed)
            try:
                epoch = self._epoch(restore)
            except BaseException:
                if not persistent:
                    self._python.end_epoch()
                raise
            return _PythonBatches(epoch, self, persistent)
        epoch = self._epoch(restore)
        return _Unbatched(epoch) if self._unbatched else epoch

    def _epoch(self, restore=None):
        """The epoch's batches. ``restore``: the generator's state to put back once the order
        is drawn (after a resumed epoch's draws; a sampler the loader iterates draws as it
        goes, so the generator then stays where the saved epoch's draws leave it)."""
        order = self._order
        if order is None:
            # The epoch converts each tensor itself (no Python frame per batch); it has close().
            return self._loader.epoch(self._convert)
        lazy = self._hand_over(order)
        if restore is not None and not lazy:
            gen = self.generator if self.generator is not None \
                else self._torch_rng.default_generator
            gen.set_state(restore)
        epoch = self._loader.epoch(self._convert)
        return _CheckedEpoch(epoch, order) if lazy else epoch

    def _hand_over(self, order):
        """Gives the loader this epoch's order; True when it iterates a Python iterator."""
        bs = self._batches
        length = _len_or_zero(bs)
        if isinstance(bs, _data.BatchSampler) and type(bs).__iter__ is _data.BatchSampler.__iter__:
            whole = _data._whole_epoch(bs.sampler)
            if whole is not None:
                order.indices(whole.astype(_np.int64, copy=False).tobytes(), bs.batch_size,
                              bs.drop_last, length)
                return False
            order.lazy(iter(bs.sampler), bs.batch_size, bs.drop_last, length)
            return True
        order.lazy(iter(bs), None, False, length)
        return True

    def __len__(self):
        """Batches per epoch, as torch counts them: the batch sampler's length (following a
        dataset that grows); for an iterable Python dataset, ``len(dataset)`` in batches (a
        ``TypeError`` when it has no ``__len__``, which ``list(loader)`` passes over). Over a
        sharded dataset, the batches each rank yields per epoch (of a resumed epoch, those
        left)."""
        if self._sharded and self._resumed_len is not None:
            return self._resumed_len
        if self._python is not None and self._python.iterable:
            length = len(self.dataset)
            if self.batch_size is not None:
                if self.drop_last:
                    length //= self.batch_size
                else:
                    length = -(-length // self.batch_size)
            return length
        if self._order is not None:
            return len(self._batches)
        if self._python is not None:
            # longshore's own shuffled order over a Python dataset: redrawn over the new
            # length at the next epoch when it grew.
            n = len(self.dataset)
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self._loader)

    def set_epoch(self, epoch):
        """Sets the epoch the next iteration runs: the loader's (longshore's order, the
        workers' seeds) and the sampler's ``set_epoch`` (a :class:`data.DistributedSampler`'s,
        PyTorch's), where it has one."""
        self._loader.set_epoch(int(epoch))
        self._resumed_len = None
        for s in (self.sampler, self.batch_sampler):
            if callable(getattr(s, "set_epoch", None)):
                s.set_epoch(epoch)

    def _share_sampler(self):
        """A sampler that takes one rank's share (longshore's or PyTorch's
        ``DistributedSampler``, also inside a batch sampler), else None."""
        for s in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if isinstance(getattr(s, "num_replicas", None), int) and hasattr(s, "rank"):
                return s
        return None

    def _share_state(self, state):
        """Adds what a checkpoint of one rank's share needs to resume on another number of
        ranks or batch size: the ranks, the batch size, the epoch's offset."""
        s = self._share_sampler()
        if s is None:
            return
        state["num_replicas"] = s.num_replicas
        batch_size = getattr(self._batches, "batch_size", None)
        if isinstance(batch_size, int):
            state["batch_size"] = batch_size
        resumed = getattr(s, "_resumed", None)
        if resumed is not None and resumed[0] == state["epoch"]:
            state["share_offset"] = int(resumed[1])

    def _load_share(self, state):
        """Takes the share entries out of ``state`` and, on another number of ranks or batch
        size, turns it into the resumed epoch's start (see :meth:`load_state_dict`)."""
        saved = state.pop("num_replicas", None)
        saved_batch = state.pop("batch_size", None)
        offset = int(state.pop("share_offset", 0))
        s = self._share_sampler()
        if saved is None or s is None:
            return
        batch_size = getattr(self._batches, "batch_size", None)
        same = int(saved) == s.num_replicas and saved_batch in (None, batch_size)
        ours = callable(getattr(s, "_resume_share", None))
        epoch = int(state["epoch"])
        if same:
            if ours:
                s._resume_share(epoch, offset)
                self._order.set_len(len(self._batches))
            return
        if not ours:
            raise ValueError(
                f"the state was taken with a DistributedSampler over {saved} ranks, this "
                f"loader's (PyTorch's) is over {s.num_replicas}: it resumes on the same number "
                "of ranks and batch size only; longshore.data.DistributedSampler resumes on "
                "any")
        if saved_batch is None:
            raise ValueError(
                f"the state was taken with a DistributedSampler over {saved} ranks, this "
                f"loader's is over {s.num_replicas}, and the state does not say its batch "
                "size: it resumes on the same number of ranks only")
        if state.get("done_extra"):
            raise ValueError(
                f"the state was taken with a DistributedSampler over {saved} ranks, this "
                f"loader's is over {s.num_replicas}, after batches delivered out of order "
                "(in_order=False): it resumes on the same number of ranks and batch size only")
        n = len(self.dataset)
        if int(state["done_prefix"]) >= int(state["num_batches"]):
            consumed = n  # the epoch was done
        else:
            consumed = min(offset + int(saved) * int(state["done_prefix"]) * int(saved_batch), n)
        s._resume_share(epoch, consumed)
        left = len(self._batches)
        self._order.set_len(left)
        state.update(done_prefix=0, done_extra=[], num_batches=left)

    def state_dict(self):
        """Where the loader stands (epoch, delivered batches), as a JSON-serialisable dict.

        When PyTorch's generator decides the order (no ``seed=``), it also holds what the
        epoch drew: the generator's state before the sampler's draws (``torch_rng_state``)
        and the workers' base seed (``base_seed``), so that :meth:`load_state_dict` resumes
        the same epoch exactly, in a new process too.

        Over a sharded dataset (:class:`datasets.WebDataset`, ``StreamingDataset``) it is the
        dataset's resume state after the batches received so far (``"sharded"``), which a
        loader with another number of ranks or workers resumes too; after a whole epoch, the
        start of the next."""
        state = _json.loads(self._loader.state_dict_json())
        if self._sharded:
            # The loader's state, holding the dataset's position.
            return {"epoch": state["epoch"], "sharded": state}
        self._share_state(state)
        if self._epoch_rng is not None and self._epoch_rng[1] == state["epoch"]:
            # An epoch under way (a finished one's successor draws afresh from the generator).
            import base64

            state["torch_rng_state"] = base64.b64encode(
                self._epoch_rng[0].numpy().tobytes()).decode("ascii")
            state["base_seed"] = self._base_seed
        return state

    def load_state_dict(self, state):
        """Restores a position saved by :meth:`state_dict`: the next iteration yields exactly
        the batches the saved epoch had not delivered. Where the state holds PyTorch's
        generator state, that iteration draws the saved epoch's order again from it (the
        generator, ``generator`` or PyTorch's global one, is put back afterwards, except
        under a sampler the loader iterates, which draws as it goes).

        Under :class:`data.DistributedSampler`, a state resumes on another number of ranks
        or batch size too: ranks step together, so after ``k`` batches of ``B`` on ``W``
        ranks the first ``W * k * B`` entries of the epoch's global order were consumed, and
        the rest is split over this loader's ranks by the sampler's rule (every new rank loads
        any old rank's state). PyTorch's ``DistributedSampler``, a state of an older version
        or one taken after out-of-order delivery resume on the same layout only
        (``ValueError`` otherwise)."""
        state = dict(state)
        if self._sharded:
            if "sharded" not in state:
                raise ValueError("this state is not a sharded dataset's loader state (it has "
                                 "no 'sharded' entry)")
            self._loader.load_state_dict_json(_json.dumps(state["sharded"]))
            self._resumed_len = max(0, len(self._loader) - int(state["sharded"]["done_prefix"]))
            self._resumed_running = False
            return
        if "sharded" in state:
            raise ValueError("this state is a sharded dataset's loader state; this loader "
                             "does not read a sharded dataset")
        self._load_share(state)
        rng, base_seed = state.pop("torch_rng_state", None), state.pop("base_seed", None)
        self._loader.load_state_dict_json(_json.dumps(state))
        if rng is not None:
            if self._torch_rng is None:
                raise ValueError(
                    "this state was saved by a loader whose order PyTorch's generator drew; "
                    "this loader's order is longshore's (seed=): build it without seed")
            import base64

            self._resume_rng = (base64.b64decode(rng), base_seed)
            self._iterated = False

    @property
    def stats(self):
        """Counters: ``wait_fraction`` (share of the consumer's time spent waiting for data),
        ``consumer_wait_s``, ``consumer_time_s``, ``worker_busy_s``, ``samples_per_second``,
        ``pinned_wait_s`` (time workers waited for pinned memory, summed),
        ``consumer_pinned_wait_s`` and ``pinned_wait_fraction`` (the part of the consumer's
        wait spent on pinned memory: near one, the pinned budget is the bottleneck),
        ``in_flight_limit`` (batches kept in flight: ``num_workers * prefetch_factor``, fewer
        when the budget cannot back them), ``reloaded``, ``skipped_samples``, and the pool's
        counters under ``"pool"``. Over a :class:`~longshore.data.Mixture`, ``sources``: the
        samples of the delivered batches by member (over an epoch of one rank, the member's
        share of :attr:`~longshore.data.Mixture.draws`; a sample skipped under
        ``on_sample_error="skip"`` stays counted in its member, and in ``skipped_samples``).
        Over a sharded dataset, ``"shards"``: its failed and made-up samples and its cache's
        downloads and range reads, per epoch too (read with ``map=``, its worker processes'
        counts added up, each as of its latest batch delivered)."""
        stats = self._loader.stats()
        shards = None if self._python is None else self._python.shard_stats()
        if shards is not None:
            stats["shards"] = shards
        return stats

    def reset_stats(self):
        self._loader.reset_stats()


def _len_or_zero(sampler):
    """Batches per epoch for the loader's resumable position (0 when the sampler has no
    length)."""
    try:
        return int(len(sampler))
    except TypeError:
        return 0


def _rng_state_from(torch, raw):
    """A generator state (a uint8 tensor) from its bytes."""
    import numpy as np

    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())
