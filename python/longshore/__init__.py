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

import atexit as _atexit

from . import _longshore, data, datasets, transforms  # noqa: F401  (submodules)
from . import _workers
from ._workers import get_worker_info  # noqa: F401  (re-exported, as torch.utils.data has it)
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
from .data import (  # noqa: F401  (re-exported, as torch.utils.data has them)
    ArrayDataset,
    BatchSampler,
    ConcatDataset,
    DistributedSampler,
    Mixture,
    RandomSampler,
    Sampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    random_split,
)
from ._loader import DataLoader

# Where users import it from (and where pickle finds it).
DataLoader.__module__ = "longshore"

# Before the interpreter finalizes: loader threads finish their turn in Python and take no
# other (a thread attaching to a finalizing interpreter aborts the process).
_atexit.register(_longshore._at_exit)
# Before that (atexit runs last-registered first): every loader's worker processes end, their
# pipes shut down, so no worker outlives the interpreter.
_atexit.register(_workers.stop_all)

__all__ = [
    "DataLoader",
    "data",
    "datasets",
    "transforms",
    *data.__all__,  # torch.utils.data's names, as longshore.data has them
    "get_worker_info",
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
