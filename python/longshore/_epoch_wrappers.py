"""What ``DataLoader.__iter__`` wraps an epoch of the Rust loader in: unbatched samples, and an
order from a Python iterator whose error is raised at the epoch's end."""


class _Unbatched:
    """A longshore dataset's epoch with ``batch_size=None``: each one-sample batch's tensors
    without their batch dimension (torch's non-batch mode yields samples as they are)."""

    __slots__ = ("_epoch",)

    def __init__(self, epoch):
        self._epoch = epoch

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._epoch)
        if isinstance(batch, dict):
            return {k: t[0] for k, t in batch.items()}
        if isinstance(batch, (list, tuple)):
            return [t[0] for t in batch]
        return batch[0]

    def close(self):
        close = getattr(self._epoch, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name):
        return getattr(self._epoch, name)


class _CheckedEpoch:
    """An epoch whose order comes from a Python iterator: raises, at the epoch's end, what
    the iterator raised (the loader delivers the batches dealt before it)."""

    __slots__ = ("_epoch", "_order")

    def __init__(self, epoch, order):
        self._epoch = epoch
        self._order = order

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return self._epoch.__next__()
        except StopIteration:
            self._order.raise_error()
            raise

    def close(self):
        self._epoch.close()

    def __getattr__(self, name):
        return getattr(self._epoch, name)
