"""Exact resume when PyTorch's generator decides the order (no seed=): state_dict carries the
epoch's generator state and the workers' base seed, so that load_state_dict in a fresh loader,
whatever the global generator has done since, yields exactly the batches not yet delivered,
the same batches PyTorch's DataLoader draws for that generator state."""
import json

import numpy as np
import pytest

import longshore
from conftest import need_torch


class Noisy:
    """Each sample: its index and the seed of the worker loading it (the workers' base seed
    plus its id), so a different base seed shows."""

    def __len__(self):
        return 30

    def __getitem__(self, i):
        info = longshore.get_worker_info()
        return np.array([i, -1 if info is None else info.seed % 2**62], dtype=np.int64)


def make(ds, **kw):
    kw.setdefault("batch_size", 4)
    return longshore.DataLoader(ds, framework="numpy", **kw)


def ids(batches):
    return [(b[0] if isinstance(b, list) else b)[:, 0].tolist() for b in batches]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("epoch", [0, 1])
def test_a_python_dataset_resumes_mid_epoch_exactly(persistent, epoch):
    torch = need_torch()
    torch.manual_seed(21)
    dl = make(Noisy(), shuffle=True, num_workers=2, persistent_workers=persistent)
    for _ in range(epoch):
        list(dl)
    it = iter(dl)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(dl.state_dict()))  # through JSON, as a checkpoint
    rest_whole = list(it)
    assert "torch_rng_state" in state and state["done_prefix"] == 3

    torch.manual_seed(999)  # the global generator moves on, as training does
    torch.rand(17)
    fresh = make(Noisy(), shuffle=True, num_workers=2, persistent_workers=persistent)
    fresh.load_state_dict(state)
    after = torch.get_rng_state()
    rest = list(fresh)
    assert ids(rest) == ids(rest_whole)
    # The same workers' seeds (the base seed the saved epoch drew).
    assert {v for b in rest for v in b[:, 1].tolist()} \
        <= {v for b in head + rest_whole for v in b[:, 1].tolist()}
    # The global generator is put back after the order was drawn (longshore's sampler).
    assert torch.equal(torch.get_rng_state(), after)
    assert len(head) == 3


def test_a_native_dataset_and_a_given_generator_resume_exactly():
    torch = need_torch()
    ds = longshore.data.ArrayDataset(np.arange(50, dtype=np.int64).reshape(25, 2))
    g = torch.Generator().manual_seed(5)
    dl = make(ds, shuffle=True, generator=g)
    whole = ids(dl)  # epoch 0
    it = iter(dl)  # epoch 1
    head = [next(it) for _ in range(2)]
    state = dl.state_dict()
    tail = ids(it)
    g.manual_seed(1234)  # the generator moves on
    fresh = make(ds, shuffle=True, generator=g)
    fresh.load_state_dict(state)
    assert ids(fresh) == tail
    assert ids(head) + tail != whole  # epoch 1 is another permutation
    # The order of epoch 1 is PyTorch's for that generator state.
    g2 = torch.Generator().manual_seed(5)
    want = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, generator=g2)
    list(want)
    assert [b[0][:, 0].tolist() for b in want] == ids(head) + tail


def test_torchs_own_sampler_resumes_exactly():
    torch = need_torch()
    torch.manual_seed(3)
    ds = Noisy()
    sampler = torch.utils.data.RandomSampler(ds)
    dl = make(ds, sampler=sampler, num_workers=2)
    it = iter(dl)
    head = [next(it) for _ in range(4)]
    state = dl.state_dict()
    tail = ids(it)
    torch.manual_seed(77)
    fresh = make(ds, sampler=torch.utils.data.RandomSampler(ds), num_workers=2)
    fresh.load_state_dict(state)
    assert ids(fresh) == tail
    assert sorted(sum(ids(head) + tail, [])) == list(range(30))


def test_a_finished_epoch_carries_no_generator_state():
    torch = need_torch()
    torch.manual_seed(0)
    dl = make(Noisy(), shuffle=True, num_workers=1)
    list(dl)
    state = dl.state_dict()
    assert "torch_rng_state" not in state and state["done_prefix"] == 0


def test_a_torch_state_is_refused_by_a_seeded_loader():
    need_torch()
    dl = make(Noisy(), shuffle=True)
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    with pytest.raises(ValueError, match="build it without seed"):
        make(Noisy(), shuffle=True, seed=4).load_state_dict(state)
