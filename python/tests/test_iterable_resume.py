"""A Python IterableDataset's loader resumes mid-epoch: `state_dict()` after some batches, in
a new loader (a new process's global seed), yields exactly the uninterrupted epoch's remaining
batches, random draws included (the Rust loader replays the epoch up to the checkpoint with the
saved base seed and discards what was delivered), with and without worker processes."""
import json

import pytest

import longshore
from conftest import need_torch


def _rand_stream():
    torch = need_torch()

    class Rand(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            wid, n = (info.id, info.num_workers) if info else (0, 1)
            for i in range(wid, 40, n):
                yield torch.tensor([i, int(torch.randint(0, 1 << 30, ()))])

    return torch, Rand()


def _batches(loader):
    return [b.flatten().tolist() for b in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_python_stream_resumes_with_the_uninterrupted_batches(workers):
    torch, ds = _rand_stream()
    torch.manual_seed(1)
    full = _batches(longshore.DataLoader(ds, batch_size=4, num_workers=workers))
    torch.manual_seed(1)
    first = longshore.DataLoader(ds, batch_size=4, num_workers=workers)
    # The checkpoint is taken after 3 batches and the epoch then runs to its end: an iterator
    # abandoned mid-epoch stops asynchronously, and with num_workers=0 its stream (in this
    # process) could still draw from torch's global generator while the resumed loader
    # replays from it.
    taken, state = [], None
    for b in first:
        taken.append(b.flatten().tolist())
        if len(taken) == 3:
            state = json.loads(json.dumps(first.state_dict()))
    assert taken == full
    assert state["epoch"] == 0 and state["done_prefix"] == 3
    torch.manual_seed(123)  # another process's generator
    resumed = longshore.DataLoader(ds, batch_size=4, num_workers=workers)
    resumed.load_state_dict(state)
    assert _batches(resumed) == full[3:]
    assert resumed.stats["batches"] == len(full) - 3
