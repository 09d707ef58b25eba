"""Batches as leaves (torch's ``default_collate``, structure first): a worker's samples
become a tree of leaves whose values are written into the shared block, and the loader's
process rebuilds the tree around the tensors it reads from the block (``rebuild``). Split from
``_workers`` (the processes and their protocol), which re-exports what it uses."""
import collections.abc
import sys

import numpy as np

# Protocol dtype codes (pydata.rs `dtype_of`) by NumPy dtype.
_CODES = {
    np.dtype(np.bool_): 0, np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3,
    np.dtype(np.int32): 4, np.dtype(np.int64): 5, np.dtype(np.float16): 6,
    np.dtype(np.float32): 7, np.dtype(np.float64): 8, np.dtype(np.uint16): 9,
    np.dtype(np.uint32): 10, np.dtype(np.uint64): 11,
}


def _torch():
    return sys.modules.get("torch")



class _Leaf:
    """One output tensor: per-sample tensors or arrays (``parts``, of equal shape and dtype)
    stacked along a new first dimension, or one whole tensor or array (``whole``, from a
    collate_fn); written into the block by one ``torch.stack``/``np.stack`` (or copy) call."""

    __slots__ = ("parts", "whole", "shape", "code", "torch_dtype", "is_torch")

    def __init__(self, parts=None, whole=None):
        self.parts = parts
        self.whole = whole
        first = parts[0] if parts is not None else whole
        torch = _torch()
        self.is_torch = torch is not None and isinstance(first, torch.Tensor)
        if self.is_torch:
            if first.device.type != "cpu":
                raise TypeError(f"a DataLoader worker returned a tensor on {first.device}: "
                                "worker outputs must be on the CPU (longshore copies batches "
                                "to the device itself)")
            code = _torch_codes().get(first.dtype)
            if code is None:
                raise TypeError(f"tensors of dtype {first.dtype} are not supported by longshore")
            self.code = code
            self.torch_dtype = "bfloat16" if first.dtype == torch.bfloat16 else None
            inner = tuple(first.shape)
        else:
            code = _CODES.get(first.dtype)
            if code is None:
                raise TypeError(f"arrays of dtype {first.dtype} are not supported by longshore")
            self.code = code
            self.torch_dtype = None
            inner = first.shape
        self.shape = ((len(parts),) + tuple(inner)) if parts is not None else tuple(inner)

    def write(self, buf, offset):
        count = 1
        for d in self.shape:
            count *= d
        if count == 0:
            return
        if self.is_torch:
            torch = _torch()
            dtype = (self.parts[0] if self.parts is not None else self.whole).dtype
            dst = torch.frombuffer(buf, dtype=dtype, count=count, offset=offset).view(self.shape)
            if self.parts is not None:
                torch.stack(self.parts, out=dst)
            else:
                dst.copy_(self.whole)
        else:
            dtype = (self.parts[0] if self.parts is not None else self.whole).dtype
            dst = np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(self.shape)
            if self.parts is not None:
                np.stack(self.parts, out=dst)
            else:
                dst[...] = self.whole


_TORCH_CODES = None


def _torch_codes():
    """Protocol dtype codes by torch dtype (bfloat16 travels as its 16 bits)."""
    global _TORCH_CODES
    if _TORCH_CODES is None:
        torch = _torch()
        _TORCH_CODES = {
            torch.bool: 0, torch.uint8: 1, torch.int8: 2, torch.int16: 3, torch.int32: 4,
            torch.int64: 5, torch.float16: 6, torch.float32: 7, torch.float64: 8,
            torch.bfloat16: 9,
        }
        for name, code in (("uint16", 9), ("uint32", 10), ("uint64", 11)):
            if hasattr(torch, name):
                _TORCH_CODES[getattr(torch, name)] = code
    return _TORCH_CODES


_BAD = ("default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; "
        "found {}")


def _collate(batch, leaves, objects):
    """torch's ``default_collate`` of ``batch`` (a list of samples), with every tensor replaced
    by a leaf index: returns the structure (a tree of tuples tagged by kind) and appends
    leaves and non-tensor values."""
    elem = batch[0]
    torch = _torch()
    if torch is not None and isinstance(elem, torch.Tensor):
        if not _plain(elem):
            # Sparse, nested, subclassed or of a dtype the shared slot does not carry: torch's
            # own default_collate (its errors for sparse and nested batches included), and the
            # result travels whole, by the general path.
            objects.append(torch.utils.data.default_collate(batch))
            return ("o", len(objects) - 1)
        _stack_check(batch)
        leaves.append(_Leaf(parts=list(batch)))
        return ("t", len(leaves) - 1)
    if isinstance(elem, np.ndarray) and elem.dtype.kind not in "SaUO":
        if elem.dtype not in _CODES and torch is not None:
            objects.append(torch.utils.data.default_collate(batch))
            return ("o", len(objects) - 1)
        parts = [np.asarray(a) for a in batch]
        _stack_check(parts)
        leaves.append(_Leaf(parts=parts))
        return ("t", len(leaves) - 1)
    if isinstance(elem, np.ndarray) or isinstance(elem, np.str_):
        raise TypeError(_BAD.format(elem.dtype if isinstance(elem, np.ndarray) else type(elem)))
    if isinstance(elem, np.generic) and not isinstance(elem, (np.str_, np.bytes_)):
        leaves.append(_Leaf(whole=np.asarray(batch)))
        return ("t", len(leaves) - 1)
    if isinstance(elem, bool):
        leaves.append(_Leaf(whole=np.asarray(batch, dtype=np.bool_)))
        return ("t", len(leaves) - 1)
    if isinstance(elem, float):
        leaves.append(_Leaf(whole=np.asarray(batch, dtype=np.float64)))
        return ("t", len(leaves) - 1)
    if isinstance(elem, int):
        leaves.append(_Leaf(whole=np.asarray(batch, dtype=np.int64)))
        return ("t", len(leaves) - 1)
    if isinstance(elem, (str, bytes)):
        objects.append(batch)  # as torch: the batch as given (a list, or a tuple from zip)
        return ("o", len(objects) - 1)
    if isinstance(elem, collections.abc.Mapping):
        keys = list(elem)
        items = [(k, _collate([d[k] for d in batch], leaves, objects)) for k in keys]
        return ("m", type(elem), items)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return ("n", type(elem), [_collate(s, leaves, objects) for s in zip(*batch)])
    if isinstance(elem, collections.abc.Sequence):
        it = iter(batch)
        size = len(next(it))
        if not all(len(e) == size for e in it):
            raise RuntimeError("each element in list of batch should be of equal size")
        parts = [_collate(s, leaves, objects) for s in zip(*batch)]
        if isinstance(elem, tuple):
            return ("l", list, parts)  # torch: tuples collate to lists
        return ("l", type(elem), parts)
    raise TypeError(_BAD.format(type(elem)))


def _stack_check(parts):
    first = parts[0]
    shape, dtype = first.shape, first.dtype
    for k, p in enumerate(parts):
        if p.shape != shape:
            raise RuntimeError("stack expects each tensor to be equal size, but got "
                               f"{list(shape)} at entry 0 and {list(p.shape)} at entry {k}")
        if p.dtype != dtype:
            raise RuntimeError(f"expected each tensor to have the same dtype, got {dtype} "
                               f"and {p.dtype}")


def _plain(t):
    """Whether tensor ``t`` travels in the batch's shared slot: a plain ``torch.Tensor``
    (no subclass), dense and strided, on the CPU, of a dtype the protocol carries. Any other
    tensor (sparse, nested, a subclass, complex...) travels whole by the general path: pickled
    from a worker process, as it is from the main process."""
    return (type(t) is _torch().Tensor and t.layout == _torch().strided and not t.is_nested
            and t.device.type == "cpu" and t.dtype in _torch_codes())


def _flatten(out, leaves, objects):
    """A user ``collate_fn``'s output as leaves (its tensors and arrays as they are)."""
    torch = _torch()
    if torch is not None and isinstance(out, torch.Tensor):
        if not _plain(out) and out.device.type == "cpu":
            objects.append(out)
            return ("o", len(objects) - 1)
        leaves.append(_Leaf(whole=out))
        return ("t", len(leaves) - 1)
    if isinstance(out, np.ndarray) and out.dtype.kind not in "SaUO" and out.dtype in _CODES:
        leaf = _Leaf(whole=out)
        leaf.torch_dtype = "numpy"  # a collate_fn's array stays an array
        leaves.append(leaf)
        return ("t", len(leaves) - 1)
    if isinstance(out, collections.abc.Mapping):
        return ("m", type(out), [(k, _flatten(v, leaves, objects)) for k, v in out.items()])
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return ("n", type(out), [_flatten(v, leaves, objects) for v in out])
    if isinstance(out, (list, tuple)):
        return ("l", type(out), [_flatten(v, leaves, objects) for v in out])
    objects.append(out)
    return ("o", len(objects) - 1)


def _convert(data, leaves, objects):
    """torch's ``default_convert`` of one sample (``batch_size=None``: no batching), with every
    tensor or array it yields as a leaf: tensors as they are, NumPy arrays and scalars as
    tensors, containers rebuilt, anything else as it is."""
    torch = _torch()
    if torch is not None and isinstance(data, torch.Tensor):
        if not _plain(data):
            objects.append(data)
            return ("o", len(objects) - 1)
        leaves.append(_Leaf(whole=data))
        return ("t", len(leaves) - 1)
    if isinstance(data, (np.ndarray, np.generic)) and not isinstance(data, (np.str_, np.bytes_)):
        arr = np.asarray(data)
        if arr.dtype.kind in "SaUO":
            objects.append(data)  # as torch: string and object arrays stay arrays
            return ("o", len(objects) - 1)
        if arr.dtype not in _CODES:
            objects.append(torch.as_tensor(data) if torch is not None else data)
            return ("o", len(objects) - 1)
        leaves.append(_Leaf(whole=arr))
        return ("t", len(leaves) - 1)
    if isinstance(data, collections.abc.Mapping):
        return ("m", type(data), [(k, _convert(v, leaves, objects)) for k, v in data.items()])
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return ("n", type(data), [_convert(v, leaves, objects) for v in data])
    if isinstance(data, tuple):
        return ("l", list, [_convert(v, leaves, objects) for v in data])
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return ("l", type(data), [_convert(v, leaves, objects) for v in data])
    objects.append(data)
    return ("o", len(objects) - 1)


def rebuild(tree, tensors, objects, torch_dtypes):
    """The batch in the main process: ``tree`` with leaf ``i`` as ``tensors[i]`` (viewed as
    ``torch_dtypes[i]`` when set) and object ``j`` as ``objects[j]``."""
    kind = tree[0]
    if kind == "t":
        t = tensors[tree[1]]
        view = torch_dtypes[tree[1]]
        if view == "bfloat16":
            t = t.view(_torch().bfloat16)
        elif view == "numpy" and hasattr(t, "numpy") and t.device.type == "cpu":
            t = t.numpy()
        return t
    if kind == "o":
        return objects[tree[1]]
    if kind == "m":
        typ, items = tree[1], tree[2]
        d = {k: rebuild(v, tensors, objects, torch_dtypes) for k, v in items}
        if typ is dict:
            return d
        try:
            return typ(d)
        except TypeError:
            return d
    if kind == "n":
        return tree[1](*(rebuild(v, tensors, objects, torch_dtypes) for v in tree[2]))
    if kind == "l":
        typ, parts = tree[1], tree[2]
        vals = [rebuild(v, tensors, objects, torch_dtypes) for v in parts]
        if typ is list:
            return vals
        try:
            return typ(vals)
        except TypeError:
            return vals
    raise ValueError(f"bad batch structure {kind!r}")


# ---------------------------------------------------------------------------------------------
# The handler: one batch at a time, in a worker process or in the main process.
