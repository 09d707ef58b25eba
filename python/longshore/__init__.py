"""longshore: a data loader that keeps GPUs fed.

PyTorch's ``DataLoader(pin_memory=True)`` + ``.to(device, non_blocking=True)`` rebuilt in Rust:
worker threads (no pickling, no GIL) collate batches straight into pooled page-locked memory,
and every batch is handed to PyTorch (or NumPy) through DLPack without a copy.

>>> import longshore
>>> ds = longshore.NpyDataset(["x.npy", "y.npy"])          # doctest: +SKIP
>>> loader = longshore.DataLoader(ds, batch_size=256, shuffle=True, num_workers=4,
...                               device="cuda")            # doctest: +SKIP
>>> for x, y in loader:                                     # doctest: +SKIP
...     loss = model(x).cross_entropy(y)

The options have PyTorch's names, defaults and checks. Batches are:

* with ``device="cuda"`` (or ``"cuda:N"``, or a ``torch.device``): torch tensors on the GPU,
  zero-copy, ordered on torch's current stream (the GPU waits for the copy, the host does not);
* otherwise: page-locked (``pin_memory=True``) or pageable CPU torch tensors, or NumPy arrays
  when torch is not installed (or ``framework="numpy"``).

A batch's memory goes back to longshore's pool when every tensor of the batch has been freed.
"""

import json as _json

from . import _longshore, datasets, transforms  # noqa: F401  (submodules)
from ._longshore import (  # noqa: F401  (re-exported)
    LoaderError,
    LoaderTimeout,
    NpyDataset,
    PinnedPool,
    RecordDataset,
    SampleError,
    Tensor,
    cuda_status,
)

__all__ = [
    "DataLoader",
    "datasets",
    "transforms",
    "NpyDataset",
    "RecordDataset",
    "PinnedPool",
    "Tensor",
    "LoaderError",
    "SampleError",
    "LoaderTimeout",
    "cuda_status",
]

__version__ = "0.1.0"


def _import_torch():
    try:
        import torch  # noqa: F401

        return torch
    except ImportError:
        return None


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


class DataLoader:
    """``torch.utils.data.DataLoader``'s options over longshore's Rust loader.

    ``dataset`` is a :class:`NpyDataset`, a :class:`RecordDataset` or a
    :class:`datasets.ImageFolder` with a transform (batches ``[images, labels]``). ``seed`` fixes shuffling
    and per-worker randomness (PyTorch takes a ``generator``); ``device`` delivers batches on
    a GPU. ``pool`` (a :class:`PinnedPool`) bounds the host memory batches may hold;
    ``framework`` picks ``"torch"`` or ``"numpy"`` outputs (default: torch when installed).
    ``prefetch_factor=None`` means 2 with workers, as in PyTorch. ``decode="nvjpeg"`` (with an
    ImageFolder and ``device="cuda"``) decodes the JPEGs on the GPU with nvJPEG: the workers
    only read the files and draw the crops (the same crops as ``decode="cpu"`` for a seed).
    ``worker_priority="background"`` runs the worker threads at a lower priority (Linux:
    ``SCHED_BATCH``, nice 10), so that with about as many busy workers as cores the threads that
    hand batches to Python (the epoch thread and the one calling ``next``) still get a core
    when they wake; ``"normal"`` (the default) leaves them as PyTorch's workers are.
    """

    def __init__(
        self,
        dataset,
        batch_size=1,
        shuffle=False,
        num_workers=0,
        pin_memory=False,
        drop_last=False,
        prefetch_factor=None,
        persistent_workers=False,
        timeout=0,
        seed=None,
        device=None,
        *,
        pool=None,
        framework=None,
        decode="cpu",
        worker_priority="normal",
    ):
        if shuffle is None:
            shuffle = False
        index = _cuda_index(device)
        if framework is None:
            framework = "torch" if (_import_torch() is not None or index is not None) else "numpy"
        if framework not in ("torch", "numpy"):
            raise ValueError(f"framework must be 'torch' or 'numpy', not {framework!r}")
        if framework == "numpy" and index is not None:
            raise ValueError("NumPy arrays live on the CPU: device='cuda' needs framework='torch'")
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.drop_last = drop_last
        self.timeout = timeout
        self.device = device
        self._loader = _longshore._Loader(
            # datasets.ImageFolder wraps its native dataset.
            getattr(dataset, "_native", dataset),
            batch_size,
            bool(shuffle),
            num_workers,
            bool(pin_memory),
            bool(drop_last),
            prefetch_factor,
            bool(persistent_workers),
            float(timeout),
            seed,
            index,
            pool,
            # Every torch version imports host memory labelled kDLCPU (and still sees the pages
            # pinned); not every one imports kDLCUDAHost, DLPack's own label for page-locked
            # memory, which is kept for other consumers.
            "cpu" if framework == "torch" else "cuda_host",
            decode,
            worker_priority=worker_priority,
        )
        self._index = index
        self._convert = self._converter(framework)

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
        # The epoch converts each tensor itself (no Python frame per batch); it has close().
        return self._loader.epoch(self._convert)

    def __len__(self):
        return len(self._loader)

    def set_epoch(self, epoch):
        """Sets the epoch the next iteration runs (reaches the sampler's ``set_epoch``)."""
        self._loader.set_epoch(int(epoch))

    def state_dict(self):
        """Where the loader stands (epoch, delivered batches), as a JSON-serialisable dict."""
        return _json.loads(self._loader.state_dict_json())

    def load_state_dict(self, state):
        """Restores a position saved by :meth:`state_dict`."""
        self._loader.load_state_dict_json(_json.dumps(state))

    @property
    def stats(self):
        """Counters: ``wait_fraction`` (share of the consumer's time spent waiting for data),
        ``consumer_wait_s``, ``consumer_time_s``, ``worker_busy_s``, ``samples_per_second``,
        ``pinned_wait_s`` (time workers waited for pinned memory, summed),
        ``consumer_pinned_wait_s`` and ``pinned_wait_fraction`` (the part of the consumer's
        wait spent on pinned memory: near one, the pinned budget is the bottleneck),
        ``in_flight_limit`` (batches kept in flight: ``num_workers * prefetch_factor``, fewer
        when the budget cannot back them), ``reloaded``, and the pool's counters under
        ``"pool"``."""
        return self._loader.stats()

    def reset_stats(self):
        self._loader.reset_stats()
