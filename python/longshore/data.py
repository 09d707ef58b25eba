"""``torch.utils.data``'s samplers and dataset helpers, for :class:`longshore.DataLoader`.

>>> import numpy as np, longshore
>>> from longshore.data import ArrayDataset, DistributedSampler, random_split
>>> ds = ArrayDataset(np.zeros((1000, 8), np.float32), np.arange(1000))
>>> train, val = random_split(ds, [0.9, 0.1])
>>> loader = longshore.DataLoader(train, batch_size=64, sampler=DistributedSampler(train))  # doctest: +SKIP

The names, arguments, checks and messages are PyTorch's, and with PyTorch installed every
sampler draws from the same generator with the same calls as PyTorch's: for the same
``torch.Generator`` state (or ``torch.manual_seed``), the same indices, in the same order.
Without PyTorch, the samplers draw from longshore's own generator (``longshore-data``'s
samplers: the same rules, another order).

The datasets are native: ``ArrayDataset`` / ``TensorDataset`` copy their arrays once into
memory that the loader's Rust worker threads read, and ``Subset``, ``ConcatDataset`` and
``random_split`` over any longshore dataset (``NpyDataset``, ``RecordDataset``,
``datasets.ImageFolder``, these) map indices in Rust. Over other (Python) datasets they behave
as PyTorch's, for indexing in Python. :class:`Mixture` (not PyTorch's: Hugging Face's
``interleave_datasets`` for map-style datasets) draws datasets in chosen proportions, in Rust
over longshore datasets, in Python over others.

PyTorch's own sampler objects (and any iterable of indices, or of lists of indices for
``batch_sampler``) work too: the loader iterates them in the main process, as PyTorch does.
"""
import bisect
import itertools
import math
from operator import attrgetter as _attrgetter
import sys
import warnings

import numpy as _np

from . import _longshore, _workers
from ._samplers import (  # noqa: F401  (the samplers are this module's; the helpers its and others')
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    _dist_world,
    _fresh_seed,
    _indices_from,
    _no_generator_without_torch,
    _torch,
    _whole_epoch,
)

__all__ = [
    "Sampler",
    "SequentialSampler",
    "RandomSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
    "BatchSampler",
    "DistributedSampler",
    "ArrayDataset",
    "TensorDataset",
    "Subset",
    "ConcatDataset",
    "random_split",
    "Mixture",
]


_CHUNK = 64 << 20

_DTYPES = {"b1", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8"}


def _rows(a):
    shape = getattr(a, "shape", None)
    if shape is None or len(shape) == 0:
        raise ValueError(
            f"each array needs a first dimension (the samples), got {type(a).__name__} "
            f"of shape {tuple(shape) if shape is not None else None}"
        )
    return int(shape[0])


def _as_numpy(a, what):
    """``a`` (a NumPy array, a CPU torch tensor, or anything ``numpy.asarray`` takes) as a
    C-ordered NumPy array in native byte order, of a dtype the loader batches."""
    module = type(a).__module__ or ""
    if module.startswith("torch") and hasattr(a, "detach"):
        if a.device.type != "cpu":
            raise ValueError(
                f"{what}: longshore reads its samples from host memory; give CPU tensors "
                f"(not {a.device}) and device='cuda' to receive batches on the GPU"
            )
        try:
            a = a.detach().resolve_conj().resolve_neg().numpy()
        except TypeError as e:  # bfloat16, complex32, ... have no NumPy dtype
            raise ValueError(
                f"{what}: dtype {a.dtype} is not supported; longshore batches bool, "
                "(u)int8-64 and float16/32/64"
            ) from e
    a = _np.asarray(a)
    if a.ndim == 0:
        _rows(a)
    if a.dtype.str[1:] not in _DTYPES:
        raise ValueError(
            f"{what}: dtype {a.dtype} is not supported; longshore batches bool, (u)int8-64 "
            "and float16/32/64"
        )
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "<" and sys.byteorder == "big"):
        a = a.astype(a.dtype.newbyteorder("="))
    return _np.ascontiguousarray(a)


def _chunks(a):
    flat = a.reshape(-1).view(_np.uint8)
    for start in range(0, flat.nbytes, _CHUNK):
        yield flat[start : start + _CHUNK].tobytes()


def _native_arrays(arrays, what):
    """The Rust dataset over copies of ``arrays`` (each row of each array one field of a
    sample)."""
    arrays = [_as_numpy(a, what) for a in arrays]
    n = _rows(arrays[0]) if arrays else 0
    fields = [(a.dtype.str, list(a.shape[1:]), _chunks(a)) for a in arrays]
    return _longshore._Native.arrays(n, fields)


class ArrayDataset:
    """In-memory arrays as a dataset: sample ``i`` is ``(arrays[0][i], arrays[1][i], ...)``,
    and batches are what ``torch.utils.data.default_collate`` makes of those tuples: a list of
    one ``[batch, *row_shape]`` tensor per array, of the array's dtype.

    ``arrays`` are NumPy arrays, CPU torch tensors, or anything ``numpy.asarray`` takes, with
    the same first dimension. Their rows are copied once, into memory the loader's worker
    threads read without Python (later changes to the arrays are not seen by the loader)."""

    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        lengths = [_rows(a) for a in arrays]
        if any(n != lengths[0] for n in lengths):
            raise ValueError(f"Size mismatch between arrays: first dimensions {lengths}")
        self.arrays = arrays
        self._native = _native_arrays(arrays, type(self).__name__)

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)

    def __len__(self):
        return _rows(self.arrays[0])

    def __repr__(self):
        return f"{type(self).__name__}(len={len(self)}, fields={self._native.fields()})"


class TensorDataset(ArrayDataset):
    """``torch.utils.data.TensorDataset(*tensors)``: sample ``i`` is
    ``tuple(t[i] for t in tensors)``. CPU tensors (or NumPy arrays), copied once as
    :class:`ArrayDataset` does."""

    def __init__(self, *tensors):
        if any(_rows(tensors[0]) != _rows(t) for t in tensors):
            raise AssertionError("Size mismatch between tensors")
        self.tensors = tensors
        self.arrays = tensors
        self._native = _native_arrays(tensors, "TensorDataset")


def _native_or_none(dataset):
    """The object the Rust loader reads for ``dataset``, or None for a Python dataset."""
    native = (_longshore.NpyDataset, _longshore.RecordDataset, _longshore._Native,
              _longshore._ImageFolder, _longshore._TokenSequences, _longshore._Shards,
              _longshore._Mixture)
    if isinstance(dataset, native):
        return dataset
    if isinstance(dataset, (str, bytes)) or getattr(dataset, "map_fn", None) is not None:
        # A sharded dataset with map=: a Python function runs on its samples, in worker
        # processes (a Python iterable dataset).
        return None
    # PyTorch's own Subset and ConcatDataset (random_split's parts) over longshore datasets.
    kind = _TORCH_WRAPPERS.get((type(dataset).__module__, type(dataset).__name__))
    if kind is Subset:
        return Subset(dataset.dataset, dataset.indices)._native
    if kind is ConcatDataset:
        return ConcatDataset(dataset.datasets)._native
    inner = getattr(dataset, "_native", None)
    if inner is None or inner is dataset:
        return None
    return _native_or_none(inner)


def _weights_of(weights, datasets):
    """``weights`` as floats, one per dataset (a ``ValueError`` otherwise)."""
    try:
        weights = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise ValueError(f"weights={weights!r}: one number per dataset") from None
    if len(weights) != len(datasets):
        raise ValueError(f"weights: {len(weights)} weights for {len(datasets)} datasets")
    return weights


def _python_iterable(dataset):
    """A Python iterable dataset: a torch ``IterableDataset``, or an object with ``__iter__``
    that cannot be indexed (not one of longshore's own)."""
    if _native_or_none(dataset) is not None:
        return False
    iterable = getattr(sys.modules.get("torch.utils.data"), "IterableDataset", None)
    if iterable is not None and isinstance(dataset, iterable):
        return True
    return hasattr(dataset, "__iter__") and not (
        hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"))


class _IterableMixtureBase:
    """What :class:`Mixture` makes of Python iterable datasets (torch ``IterableDataset``s,
    streams of unknown length): in each worker, position ``p`` of its stream draws the next
    sample of the member the mixture's schedule names (the same schedule, weights and
    interleaving as a map-style mixture), each member sharding itself over the workers as
    torch's iterable datasets do. ``stop``: ``"first_exhausted"`` ends the worker's stream when
    the member drawn has no sample left; ``"all_exhausted"`` starts an exhausted member again
    (``iter()`` anew) until every member with weight has run out once. A number of positions
    needs map-style members (their lengths). Resuming a checkpoint replays the epoch (exact
    when the members' streams are a function of the epoch); ``set_epoch`` reaches members that
    have one. Per-member counts are not in ``loader.stats`` (the draws happen in the workers)."""

    def __init__(self, datasets, weights, *, stop="first_exhausted", seed=0):
        self.datasets = list(datasets)
        self.weights = _weights_of(weights, self.datasets)
        if stop not in ("first_exhausted", "all_exhausted"):
            raise ValueError(f"stop={stop!r}: a mixture of iterable datasets stops at "
                             "\"first_exhausted\" or \"all_exhausted\" (a number of positions "
                             "needs map-style members)")
        self.stop = stop
        self.seed = seed
        self._weights = _longshore._Weights(self.weights)

    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_weights"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._weights = _longshore._Weights(self.weights)

    def set_epoch(self, epoch):
        """Passes the epoch to the members that take one."""
        for d in self.datasets:
            if callable(getattr(d, "set_epoch", None)):
                d.set_epoch(epoch)

    def __iter__(self):
        m = len(self.datasets)
        drawn = [w > 0 for w in self.weights]
        its = [iter(d) for d in self.datasets]
        exhausted = [False] * m
        p, schedule = 0, []
        while True:
            if not schedule:
                schedule = self._weights.members(p, 1024)[::-1]
            s = schedule.pop()
            try:
                sample = next(its[s])
            except StopIteration:
                if self.stop == "first_exhausted":
                    return
                exhausted[s] = True
                if all(exhausted[i] or not drawn[i] for i in range(m)):
                    return
                its[s] = iter(self.datasets[s])
                try:
                    sample = next(its[s])
                except StopIteration:
                    raise ValueError(f"Mixture: member {s} yields no sample (in this worker)"
                                     ) from None
            yield sample
            p += 1

    def __repr__(self):
        return (f"Mixture({len(self.datasets)} iterable members, weights={self.weights}, "
                f"stop={self.stop!r})")


_ITERABLE_MIXTURE = None


def _iterable_mixture():
    """The class of iterable mixtures: a torch ``IterableDataset`` when torch is imported (so
    that torch's DataLoader takes it as one), made once and kept at module level (workers
    started by spawn unpickle it by name)."""
    global _ITERABLE_MIXTURE
    if _ITERABLE_MIXTURE is None:
        base = getattr(sys.modules.get("torch.utils.data"), "IterableDataset", None)
        bases = (_IterableMixtureBase,) if base is None else (_IterableMixtureBase, base)
        cls = type("IterableMixture", bases, {"__module__": __name__})
        globals()["IterableMixture"] = _ITERABLE_MIXTURE = cls
    return _ITERABLE_MIXTURE


class Subset:
    """``torch.utils.data.Subset``: the samples of ``dataset`` at ``indices``. Over a longshore
    dataset the loader maps the indices in Rust (negative indices count from the end, and an
    index out of range is an ``IndexError`` when the loader is built)."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = indices

    @property
    def _native(self):
        inner = _native_or_none(self.dataset)
        if inner is None:
            return None
        indices = _np.asarray(self.indices, dtype=_np.int64).reshape(-1)
        return _longshore._Native.subset(inner, indices.tobytes())

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices):
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__([self.indices[idx] for idx in indices])
        return [self.dataset[self.indices[idx]] for idx in indices]

    def __len__(self):
        return len(self.indices)

    def __repr__(self):
        return f"Subset({self.dataset!r}, len={len(self)})"


class ConcatDataset:
    """``torch.utils.data.ConcatDataset``: ``datasets`` one after another. Over longshore
    datasets whose samples have the same fields, the loader concatenates them in Rust."""

    @staticmethod
    def cumsum(sequence):
        r, s = [], 0
        for e in sequence:
            n = len(e)
            r.append(n + s)
            s += n
        return r

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if len(self.datasets) == 0:
            raise AssertionError("datasets should not be an empty iterable")
        iterable = getattr(sys.modules.get("torch.utils.data"), "IterableDataset", None)
        for d in self.datasets:
            if iterable is not None and isinstance(d, iterable):
                raise AssertionError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = self.cumsum(self.datasets)

    @property
    def _native(self):
        parts = [_native_or_none(d) for d in self.datasets]
        if any(p is None for p in parts):
            return None
        return _longshore._Native.concat(parts)

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx = len(self) + idx
        dataset_idx = bisect.bisect_right(self.cumulative_sizes, idx)
        if dataset_idx == 0:
            sample_idx = idx
        else:
            sample_idx = idx - self.cumulative_sizes[dataset_idx - 1]
        return self.datasets[dataset_idx][sample_idx]

    def __repr__(self):
        return f"ConcatDataset({len(self.datasets)} datasets, len={len(self)})"


_TORCH_WRAPPERS = {
    ("torch.utils.data.dataset", "Subset"): Subset,
    ("torch.utils.data.dataset", "ConcatDataset"): ConcatDataset,
}


def random_split(dataset, lengths, generator=None, *, seed=None):
    """``torch.utils.data.random_split``: ``dataset`` split at random into non-overlapping
    :class:`Subset` of the given ``lengths`` (or fractions summing to 1, rounded as PyTorch
    rounds them). The permutation is PyTorch's for the same ``generator`` (default: PyTorch's
    global one); ``seed`` (longshore's) draws it from longshore's generator instead, with or
    without PyTorch."""
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        subset_lengths = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            subset_lengths.append(math.floor(len(dataset) * frac))
        remainder = len(dataset) - sum(subset_lengths)
        for i in range(remainder):
            subset_lengths[i % len(subset_lengths)] += 1
        lengths = subset_lengths
        for i, length in enumerate(lengths):
            if length == 0:
                warnings.warn(
                    f"Length of split at index {i} is 0. This might result in an empty dataset.",
                    stacklevel=2,
                )
    if sum(lengths) != len(dataset):
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    if seed is not None and generator is not None:
        raise ValueError("random_split takes a generator (PyTorch's) or a seed (longshore's), not both")
    torch = _torch() if seed is None else None
    if torch is not None:
        indices = torch.randperm(
            sum(lengths), generator=generator if generator is not None else torch.default_generator
        ).tolist()
    else:
        _no_generator_without_torch(generator)
        n = sum(lengths)
        indices = _indices_from(
            _longshore._permutation(n, _fresh_seed() if seed is None else seed & (2**64 - 1))
        ).tolist()
    return [
        Subset(dataset, indices[offset - length : offset])
        for offset, length in zip(itertools.accumulate(lengths), lengths)
    ]


_STOPS = ("first_exhausted", "all_exhausted")


class Mixture:
    """Map-style ``datasets`` drawn in proportion to ``weights``, by a fixed schedule:
    position ``p`` of an epoch reads sample ``index`` of member ``member``
    (:meth:`source`), members interleaved as evenly as the weights allow (every block of
    :attr:`block` positions, at least 1,024, holds each member's share), each member's samples
    in a random order of ``(seed, epoch, member, pass)`` (``shuffle=False``: in index order).
    The loader's sampler shuffles the positions as for any dataset, so ranks
    (:class:`DistributedSampler`), workers and ``load_state_dict`` work on a mixture as on any
    map-style dataset.

    ``stop``: how an epoch ends, as Hugging Face's ``interleave_datasets`` stopping
    strategies: ``"first_exhausted"`` (default) where the schedule would draw from a member
    with no sample left (every sample at most once per epoch; :attr:`unused` counts the
    others' samples not drawn); ``"all_exhausted"`` once every member gave every sample
    (members that run out earlier pass again, in another order; :attr:`repeated` counts
    them); or a number of positions per epoch (members passing as often as needed).

    Over sharded datasets (``datasets.WebDataset``, ``StreamingDataset`` or ``ParquetDataset``
    members of one format, with the same ``transform`` and ``fields``) the mixture is itself a
    sharded dataset, iterated through ``longshore.DataLoader``: the same schedule draws each
    member's samples in the member's own shuffled order (a member drawn again passes in
    another order, with other augmentation seeds), every rank yields the same number of
    batches, and ``state_dict`` resumes it exactly on any number of ranks or workers. Its
    ``draws`` are per member; ``loader.stats["sources"]`` counts the samples its workers read,
    by member. Member 0's cache options and store are used.

    Over Python iterable datasets (torch ``IterableDataset``s, streams of unknown length) it is
    an iterable dataset (a torch ``IterableDataset`` when torch is imported): in each worker,
    the same schedule names the member whose next sample each position draws, each member
    sharding itself over the workers as torch's iterable datasets do; ``stop`` is
    ``"first_exhausted"`` or ``"all_exhausted"`` (an exhausted member starts again until
    every member ran out once). Its checkpoint resumes by replay.

    Over longshore datasets (``NpyDataset``, ``RecordDataset``, ``datasets.ImageFolder`` with a
    transform, ``datasets.TokenDataset``, :class:`ArrayDataset`, :class:`TensorDataset`, and
    :class:`Subset` / :class:`ConcatDataset` / ``Mixture`` of them), whose samples must have the
    same fields, the loader's Rust workers read the mixture and write its batches straight into
    the batch's memory, in the loader's epoch. With any other (Python) member it is a Python
    dataset: ``__getitem__`` asks the schedule which member and index to read; in
    ``longshore.DataLoader``'s workers the loader's epoch applies, elsewhere (the main
    program, ``torch.utils.data.DataLoader``) the one given to :meth:`set_epoch`. With torch's
    DataLoader call ``dataset.set_epoch(epoch)`` before each epoch's ``iter(loader)``
    (torch's ``persistent_workers=True`` keeps the workers' copies: their epoch stays).

    >>> import numpy as np
    >>> from longshore.data import ArrayDataset, Mixture
    >>> web, books = ArrayDataset(np.arange(100)), ArrayDataset(np.arange(1000, 1010))
    >>> mix = Mixture([web, books], [3, 1])   # 3 of web for 1 of books, until books runs out
    >>> len(mix), mix.draws, mix.unused
    (40, [30, 10], [70, 0])
    """

    def __new__(cls, datasets=(), weights=(), *, stop="first_exhausted", seed=0, shuffle=True):
        datasets = list(datasets)
        if any(getattr(d, "map_fn", None) is not None for d in datasets):
            raise ValueError("Mixture: a sharded member made with map= is read in Python "
                             "worker processes; mix members without map= (the mixture's "
                             "batches are their fields)")
        sharded = [isinstance(_native_or_none(d), _longshore._Shards) for d in datasets]
        if datasets and all(sharded):
            # Sharded members: one sharded dataset (an iterable one) that draws them.
            from .datasets import _ShardMixture

            return _ShardMixture(datasets, weights, stop=stop, seed=seed, shuffle=shuffle)
        if any(sharded):
            raise ValueError("Mixture: members are all sharded datasets (WebDataset, "
                             "StreamingDataset, ParquetDataset) or all map-style datasets")
        iterable = [_python_iterable(d) for d in datasets]
        if datasets and all(iterable):
            # Python iterable datasets (torch's IterableDataset): drawn by the same schedule
            # from each worker's streams.
            return _iterable_mixture()(datasets, weights, stop=stop, seed=seed)
        if any(iterable):
            raise ValueError("Mixture: members are all iterable datasets (torch "
                             "IterableDataset) or all map-style datasets")
        return super().__new__(cls)

    def __init__(self, datasets, weights, *, stop="first_exhausted", seed=0, shuffle=True):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("Mixture needs at least one dataset")
        self.weights = _weights_of(weights, self.datasets)
        if not (isinstance(stop, str) and stop in _STOPS) and (
                isinstance(stop, bool) or not isinstance(stop, int) or stop <= 0):
            raise ValueError(f"stop={stop!r}: must be \"first_exhausted\", \"all_exhausted\" "
                             "or a positive number of positions per epoch")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed={seed!r}: an int")
        iterable = getattr(sys.modules.get("torch.utils.data"), "IterableDataset", None)
        for i, d in enumerate(self.datasets):
            native = _native_or_none(d)
            if (isinstance(native, _longshore._Shards)
                    or (iterable is not None and isinstance(d, iterable))
                    or (native is None
                        and not (hasattr(d, "__getitem__") and hasattr(d, "__len__")))):
                raise ValueError(f"Mixture: member {i} ({type(d).__name__}) is not a map-style "
                                 "dataset (__getitem__ and __len__); a mixture draws samples "
                                 "by index")
        self.stop = stop
        self.seed = seed
        self.shuffle = bool(shuffle)
        self._epoch = 0
        self._build()

    def _build(self):
        natives = [_native_or_none(d) for d in self.datasets]
        args = (self.weights, self.stop)
        kw = {"seed": self.seed & (2**64 - 1), "shuffle": self.shuffle}
        if all(n is not None for n in natives):
            self._native = _longshore._Mixture(natives, *args, **kw)
            self._schedule = self._native
        else:
            self._native = None
            self._schedule = _longshore._MixtureSchedule(
                [len(d) for d in self.datasets], *args, **kw)
        self._schedule.set_epoch(self._epoch)

    def __getstate__(self):
        # The native objects are rebuilt from the arguments (a worker process's copy).
        state = self.__dict__.copy()
        del state["_native"], state["_schedule"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._build()

    def _current_epoch(self):
        epoch = _workers.loader_epoch()
        return self._epoch if epoch is None else epoch

    def set_epoch(self, epoch):
        """The epoch of the members' orders outside ``longshore.DataLoader`` (indexing in the
        main program, ``torch.utils.data.DataLoader``); longshore's loader uses its own."""
        self._epoch = int(epoch)
        self._schedule.set_epoch(self._epoch)

    def source(self, position, epoch=None):
        """``(member, index)``: the member and the member's sample that ``position`` reads in
        ``epoch`` (default: the current one, see :meth:`set_epoch`)."""
        return self._schedule.source(position, self._current_epoch() if epoch is None else epoch)

    draws = property(_attrgetter("_schedule.draws"),
                     doc="Each member's draws in an epoch (the same every epoch).")
    unused = property(_attrgetter("_schedule.unused"),
                      doc="Each member's samples not drawn in an epoch.")
    repeated = property(_attrgetter("_schedule.repeated"),
                        doc="Each member's draws past its size in an epoch (samples drawn again).")
    block = property(_attrgetter("_schedule.block"),
                     doc="The schedule's block: every block of this many positions holds each "
                         "member's share.")

    def __len__(self):
        return len(self._schedule)

    def __getitem__(self, position):
        """``datasets[member][index]`` for ``(member, index) = source(position)``: a member's
        own ``__getitem__`` (``NpyDataset`` and ``RecordDataset`` have none; the loader reads
        them)."""
        member, index = self.source(position)
        return self.datasets[member][index]

    def __getitems__(self, positions):
        """The samples at ``positions``, each member's read by its own ``__getitems__`` where
        it has one (as torch's DataLoader fetches a batch)."""
        members, indices = self._schedule.sources(list(positions), self._current_epoch())
        out = [None] * len(members)
        for m, d in enumerate(self.datasets):
            at = [j for j, s in enumerate(members) if s == m]
            if not at:
                continue
            getitems = getattr(d, "__getitems__", None)
            if getitems is not None:
                samples = getitems([indices[j] for j in at])
            else:
                samples = [d[indices[j]] for j in at]
            for j, sample in zip(at, samples):
                out[j] = sample
        return out

    def __repr__(self):
        kind = "native" if self._native is not None else "python"
        return (f"Mixture({len(self.datasets)} datasets, weights={self.weights}, "
                f"stop={self.stop!r}, len={len(self)}, {kind})")


def __getattr__(name):
    # `IterableMixture` is made on first use (a torch IterableDataset when torch is there):
    # a worker process started by spawn finds it by name when it unpickles a mixture.
    if name == "IterableMixture":
        return _iterable_mixture()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
