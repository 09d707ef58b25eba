"""``torch.utils.data``'s samplers with PyTorch's names, arguments, checks and draws (re-exported
by :mod:`longshore.data`; see its documentation)."""

import itertools
import math
import random as _random

import numpy as _np

from . import _longshore

def _torch():
    try:
        import torch

        return torch
    except ImportError:
        return None


def _fresh_seed():
    """A seed for longshore's generator when PyTorch (whose global generator would decide)
    is not installed."""
    return _random.SystemRandom().getrandbits(63)


def _no_generator_without_torch(generator):
    if generator is not None and _torch() is None:
        raise TypeError(
            "generator is a torch.Generator, and PyTorch is not installed: leave it None "
            "(longshore's own generator draws then)"
        )


def _indices_from(data):
    """Packed int64 indices from Rust, as a NumPy array."""
    return _np.frombuffer(data, dtype=_np.int64)


def _concat(parts):
    parts = [_np.asarray(p, dtype=_np.int64) for p in parts]
    if not parts:
        return _np.zeros(0, dtype=_np.int64)
    return _np.concatenate(parts)


# ---------------------------------------------------------------------------------------------
# Samplers
# ---------------------------------------------------------------------------------------------


class Sampler:
    """Base class of samplers, as ``torch.utils.data.Sampler``: ``__iter__`` yields indices
    (or lists of indices, for a batch sampler); ``__len__`` is optional."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    """``0, 1, ..., len(data_source) - 1``."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)

    def _epoch(self):
        """The whole epoch's indices, drawn as ``__iter__`` draws them."""
        return _np.arange(len(self.data_source), dtype=_np.int64)


class RandomSampler(Sampler):
    """``torch.utils.data.RandomSampler``: a permutation (repeated, then cut, when
    ``num_samples > len(data_source)``) or, with ``replacement``, ``num_samples`` uniform draws.

    Without a ``generator``, each iteration seeds a fresh generator with a draw from PyTorch's
    global one (``torch.manual_seed`` decides), as PyTorch does; with one, it draws from it."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.replacement, bool):
            raise TypeError(
                f"replacement should be a boolean value, but got replacement={self.replacement}"
            )
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(
                "num_samples should be a positive integer value, but got "
                f"num_samples={self.num_samples}"
            )
        _no_generator_without_torch(generator)

    @property
    def num_samples(self):
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def _parts(self):
        """The epoch's indices as PyTorch draws them: one array per ``randperm`` (or per 32
        ``randint`` draws), each drawn when the previous one has been consumed."""
        n = len(self.data_source)
        torch = _torch()
        if torch is None:
            yield _indices_from(
                _longshore._random_indices(n, self.replacement, self.num_samples, _fresh_seed())
            )
            return
        if self.generator is None:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            generator = torch.Generator()
            generator.manual_seed(seed)
        else:
            generator = self.generator
        if self.replacement:
            for _ in range(self.num_samples // 32):
                yield torch.randint(high=n, size=(32,), dtype=torch.int64, generator=generator).numpy()
            yield torch.randint(
                high=n, size=(self.num_samples % 32,), dtype=torch.int64, generator=generator
            ).numpy()
        else:
            for _ in range(self.num_samples // n):
                yield torch.randperm(n, generator=generator).numpy()
            yield torch.randperm(n, generator=generator).numpy()[: self.num_samples % n]

    def __iter__(self):
        for part in self._parts():
            yield from part.tolist()

    def _epoch(self):
        return _concat(self._parts())

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """``torch.utils.data.SubsetRandomSampler``: ``indices`` in a random order each epoch."""

    def __init__(self, indices, generator=None):
        self.indices = indices
        self.generator = generator
        _no_generator_without_torch(generator)

    def _order(self):
        torch = _torch()
        if torch is None:
            return _indices_from(_longshore._permutation(len(self.indices), _fresh_seed()))
        return torch.randperm(len(self.indices), generator=self.generator).numpy()

    def __iter__(self):
        for i in self._order().tolist():
            yield self.indices[i]

    def _epoch(self):
        order = self._order()
        return _np.asarray(self.indices, dtype=_np.int64).reshape(-1)[order]

    def __len__(self):
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """``torch.utils.data.WeightedRandomSampler``: ``num_samples`` indices of
    ``range(len(weights))`` drawn with probabilities proportional to ``weights``
    (``torch.multinomial``)."""

    def __init__(self, weights, num_samples, replacement=True, generator=None):
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got num_samples={num_samples}"
            )
        if not isinstance(replacement, bool):
            raise ValueError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        _no_generator_without_torch(generator)
        torch = _torch()
        if torch is not None:
            weights_tensor = torch.as_tensor(weights, dtype=torch.double)
        else:
            weights_tensor = _np.asarray(weights, dtype=_np.float64)
        if len(weights_tensor.shape) != 1:
            raise ValueError(
                "weights should be a 1d sequence but given "
                f"weights have shape {tuple(weights_tensor.shape)}"
            )
        self.weights = weights_tensor
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def _epoch(self):
        torch = _torch()
        if torch is None:
            return _indices_from(
                _longshore._weighted_indices(
                    self.weights.tolist(), self.num_samples, self.replacement, _fresh_seed()
                )
            )
        return torch.multinomial(
            self.weights, self.num_samples, self.replacement, generator=self.generator
        ).numpy()

    def __iter__(self):
        yield from iter(self._epoch().tolist())

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    """``torch.utils.data.BatchSampler``: ``sampler``'s indices in lists of ``batch_size``
    (the last one shorter, or dropped with ``drop_last``)."""

    def __init__(self, sampler, batch_size, drop_last):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        sampler_iter = iter(self.sampler)
        if self.drop_last:
            args = [sampler_iter] * self.batch_size
            for batch_droplast in zip(*args):
                yield [*batch_droplast]
        else:
            batch = [*itertools.islice(sampler_iter, self.batch_size)]
            while batch:
                yield batch
                batch = [*itertools.islice(sampler_iter, self.batch_size)]

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size


def _dist_world(rank=None, world_size=None):
    """This process's ``(rank, world_size)``, the one rank resolution of longshore's Python
    side: each as given, else the initialised torch.distributed process group's (as PyTorch),
    else the launcher's environment (torchrun's ``RANK``/``WORLD_SIZE``, SLURM's, Open MPI's,
    read by longshore's ``DistEnv``), else ``None`` for what none of them gives."""
    if rank is not None and world_size is not None:
        return rank, world_size
    torch = _torch()
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        world = (dist.get_rank(), dist.get_world_size())
    else:
        world = _longshore._dist_env() or (None, None)
    return (
        world[0] if rank is None else rank,
        world[1] if world_size is None else world_size,
    )


def _world(num_replicas, rank):
    """``DistributedSampler``'s defaults (``(num_replicas, rank)``): see ``_dist_world``; an
    error when neither a process group nor a launcher gives what is missing."""
    rank, num_replicas = _dist_world(rank, num_replicas)
    if rank is None or num_replicas is None:
        torch = _torch()
        dist = getattr(torch, "distributed", None) if torch is not None else None
        if dist is not None and dist.is_available():
            # PyTorch's own error (no process group).
            dist.get_world_size()
        raise RuntimeError(
            "DistributedSampler needs num_replicas and rank, an initialised "
            "torch.distributed process group, or a launcher's environment (torchrun's "
            "WORLD_SIZE and RANK)"
        )
    return num_replicas, rank


class DistributedSampler(Sampler):
    """``torch.utils.data.distributed.DistributedSampler``: this rank's share of the dataset.

    ``num_replicas`` and ``rank`` default to the process group's, or (without one) to the
    launcher's environment: torchrun's ``WORLD_SIZE`` and ``RANK``. Each epoch (see
    :meth:`set_epoch`) is shuffled by a generator seeded ``seed + epoch``, padded by wrapping
    around to a multiple of ``num_replicas`` (or cut, with ``drop_last``), and rank ``r`` takes
    every ``num_replicas``-th index from ``r``: PyTorch's indices."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        num_replicas, rank = _world(num_replicas, rank)
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        if self.drop_last and len(self.dataset) % self.num_replicas != 0:
            self.num_samples = math.ceil((len(self.dataset) - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(len(self.dataset) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.shuffle = shuffle
        self.seed = seed
        # An epoch resumed from a checkpoint of another number of ranks: (epoch, entries of
        # its global order consumed before), see DataLoader.load_state_dict.
        self._resumed = None

    def _offset(self):
        """Entries of this epoch's global order consumed before its shares were split."""
        r = self._resumed
        return min(r[1], len(self.dataset)) if r is not None and r[0] == self.epoch else 0

    def _share_len(self):
        """This rank's indices in this epoch: PyTorch's rule over what is left of it."""
        offset = self._offset()
        if offset == 0:
            return self.num_samples
        left = len(self.dataset) - offset
        return left // self.num_replicas if self.drop_last else -(-left // self.num_replicas)

    def _resume_share(self, epoch, consumed):
        """Sets ``epoch`` with its first ``consumed`` entries of the global order (every rank's
        share together) taken out; the rest is split over this sampler's ranks."""
        if consumed > len(self.dataset):
            raise ValueError(f"{consumed} entries of epoch {epoch}'s order consumed, of a "
                             f"dataset of {len(self.dataset)}")
        self._resumed = (epoch, consumed) if consumed > 0 else None
        self.epoch = epoch

    def _epoch(self):
        n = len(self.dataset)
        torch = _torch()
        offset = self._offset()
        if torch is None and offset == 0:
            return _indices_from(
                _longshore._distributed_indices(
                    n, self.num_replicas, self.rank, bool(self.shuffle),
                    (self.seed + self.epoch) & (2**64 - 1), bool(self.drop_last), 0,
                )
            )
        if torch is None:
            # The global order: one replica's share of one.
            indices = _indices_from(_longshore._distributed_indices(
                n, 1, 0, bool(self.shuffle), (self.seed + self.epoch) & (2**64 - 1), False, 0))
        elif self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(n, generator=g).numpy()
        else:
            indices = _np.arange(n, dtype=_np.int64)
        indices = indices[offset:]
        num_samples = self._share_len()
        total_size = num_samples * self.num_replicas
        if len(indices) == 0:
            return indices[:0]
        if not self.drop_last:
            padding_size = total_size - len(indices)
            if padding_size <= len(indices):
                indices = _np.concatenate([indices, indices[:padding_size]])
            else:
                reps = math.ceil(padding_size / len(indices))
                indices = _np.concatenate([indices, _np.tile(indices, reps)[:padding_size]])
        else:
            indices = indices[:total_size]
        if len(indices) != total_size:
            raise AssertionError(
                f"Number of indices ({len(indices)}) does not match total_size ({total_size})"
            )
        indices = indices[self.rank : total_size : self.num_replicas]
        if len(indices) != num_samples:
            raise AssertionError(
                f"Number of subsampled indices ({len(indices)}) does not match num_samples "
                f"({num_samples})"
            )
        return indices

    def __iter__(self):
        return iter(self._epoch().tolist())

    def __len__(self):
        return self._share_len()

    def set_epoch(self, epoch):
        """Sets the epoch: with ``shuffle``, each epoch has its own order (the same on every
        rank)."""
        self.epoch = epoch


# The samplers whose whole epoch the loader takes in one call (``_epoch``) instead of
# iterating them: a subclass that overrides ``__iter__`` is iterated.
_WHOLE_EPOCH = {
    cls.__iter__: cls
    for cls in (SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler,
                DistributedSampler)
}


def _whole_epoch(sampler):
    """The epoch's indices of one of longshore's samplers (a NumPy int64 array), or None for
    any other sampler, which the loader iterates."""
    if _WHOLE_EPOCH.get(getattr(type(sampler), "__iter__", None)) is None:
        return None
    return sampler._epoch()


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------

# Bytes handed to Rust per call when copying an array (bounds the extra memory of the copy).
