"""Conformance with torch.utils.data.DataLoader: for the same dataset, generator state and
options, longshore yields the same batches (values, dtypes, nesting, order) over two epochs,
and leaves PyTorch's global generator where PyTorch's DataLoader leaves it. The grid covers
shuffle, every sampler (longshore's, PyTorch's, plain iterables), batch samplers, drop_last,
num_workers 0/2/4, in_order and persistent_workers; DistributedSampler over a simulated
4-rank world gives each rank PyTorch's indices."""
import itertools

import numpy as np
import pytest

import longshore
from longshore import data as L
from conftest import need_torch

N = 37  # not a multiple of any batch size below


class TupleDataset:
    """What PyTorch indexes for an ArrayDataset: a tuple of rows of NumPy arrays."""

    def __init__(self, *arrays):
        self.arrays = arrays

    def __getitem__(self, i):
        return tuple(a[i] for a in self.arrays)

    def __len__(self):
        return len(self.arrays[0])


def _arrays():
    rng = np.random.default_rng(0)
    return (
        rng.integers(0, 255, size=(N, 3, 2, 2), dtype=np.uint8),
        np.arange(N, dtype=np.int64),  # unique: identifies the sample
        rng.standard_normal(N).astype(np.float64),
        rng.standard_normal((N, 4)).astype(np.float16),
        np.arange(N) % 3 == 0,
        rng.integers(-5, 5, size=(N, 1), dtype=np.int16),
    )


def _pair(torch, kind):
    """(longshore's dataset, PyTorch's) holding the same samples."""
    from torch.utils import data as T

    if kind == "tensors":
        x = torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)
        y = torch.arange(N)
        return L.TensorDataset(x, y), T.TensorDataset(x, y)
    arrays = _arrays()
    if kind == "arrays":
        return L.ArrayDataset(*arrays), TupleDataset(*arrays)
    if kind == "subset":
        ours, theirs = _pair(torch, "arrays")
        idx = [5, 0, 36, -2, 17, 17, 3, 30, 22, 9, 11, 1, 2]
        return L.Subset(ours, idx), T.Subset(theirs, [i % N for i in idx])
    if kind == "concat":
        a_o, a_t = _pair(torch, "arrays")
        s_o, s_t = _pair(torch, "subset")
        return L.ConcatDataset([a_o, s_o, a_o]), T.ConcatDataset([a_t, s_t, a_t])
    if kind == "split":
        a_o, a_t = _pair(torch, "arrays")
        o = L.random_split(a_o, [0.7, 0.3], generator=torch.Generator().manual_seed(3))[0]
        t = T.random_split(a_t, [0.7, 0.3], generator=torch.Generator().manual_seed(3))[0]
        return o, t
    if kind == "torch-split":
        # PyTorch's own random_split (Subset) and ConcatDataset over longshore datasets.
        a_o, a_t = _pair(torch, "arrays")
        o = T.random_split(a_o, [0.6, 0.4], generator=torch.Generator().manual_seed(3))
        t = T.random_split(a_t, [0.6, 0.4], generator=torch.Generator().manual_seed(3))
        return T.ConcatDataset([o[1], a_o]), T.ConcatDataset([t[1], a_t])
    raise AssertionError(kind)


def _epochs(torch, make_loader, lib, seed, epochs=2, key=None):
    """Two epochs of `make_loader(lib)` after torch.manual_seed(seed), as lists of tensors,
    and a draw of the global generator after them."""
    torch.manual_seed(seed)
    loader = make_loader(lib)
    out = []
    for e in range(epochs):
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(e)
        batches = [[t.clone() for t in b] for b in loader]
        if key is not None:
            batches.sort(key=key)
        out.append(batches)
    return out, torch.rand(4)


def _assert_same(torch, ours, theirs, what):
    (o_epochs, o_after), (t_epochs, t_after) = ours, theirs
    assert len(o_epochs) == len(t_epochs)
    for e, (o, t) in enumerate(zip(o_epochs, t_epochs)):
        assert len(o) == len(t), (what, e)
        for i, (bo, bt) in enumerate(zip(o, t)):
            assert isinstance(bo, list) and len(bo) == len(bt), (what, e, i)
            for fo, ft in zip(bo, bt):
                assert fo.dtype == ft.dtype and fo.shape == ft.shape, (what, e, i, fo.dtype, ft.dtype)
                assert torch.equal(fo, ft), (what, e, i)
    assert torch.equal(o_after, t_after), (what, "global generator after the epochs")


def _sampler_cases(torch):
    """(name, options(lib, dataset) -> kwargs): every way of choosing the order."""
    def gen():
        return torch.Generator().manual_seed(1234)

    return [
        ("sequential", lambda lib, ds: dict(batch_size=5)),
        ("shuffle", lambda lib, ds: dict(batch_size=5, shuffle=True)),
        ("shuffle-drop", lambda lib, ds: dict(batch_size=4, shuffle=True, drop_last=True)),
        ("shuffle-generator", lambda lib, ds: dict(batch_size=6, shuffle=True, generator=gen())),
        ("random-replacement", lambda lib, ds: dict(
            batch_size=8, sampler=lib.RandomSampler(ds, replacement=True, num_samples=50))),
        ("random-more", lambda lib, ds: dict(
            batch_size=7, sampler=lib.RandomSampler(ds, num_samples=2 * len(ds) + 3, generator=gen()))),
        ("subset-random", lambda lib, ds: dict(
            batch_size=3, sampler=lib.SubsetRandomSampler([1, 4, 9, 2, 8, 5, 0], generator=gen()))),
        ("weighted", lambda lib, ds: dict(
            batch_size=4, drop_last=True,
            sampler=lib.WeightedRandomSampler([(i % 5) + 0.5 for i in range(len(ds))], 22))),
        ("weighted-no-replacement", lambda lib, ds: dict(
            batch_size=4, sampler=lib.WeightedRandomSampler([1.0] * len(ds), 9, False, generator=gen()))),
        ("torch-sampler", lambda lib, ds: dict(
            batch_size=5, sampler=torch.utils.data.RandomSampler(ds, generator=gen()))),
        ("iterable-sampler", lambda lib, ds: dict(batch_size=4, sampler=[3, 1, 4, 1, 5, 9, 2, 6])),
        ("batch-sampler", lambda lib, ds: dict(
            batch_sampler=lib.BatchSampler(lib.RandomSampler(ds), 6, False))),
        ("batch-sampler-drop", lambda lib, ds: dict(
            batch_sampler=lib.BatchSampler(lib.SequentialSampler(ds), 6, True))),
        ("torch-batch-sampler", lambda lib, ds: dict(
            batch_sampler=torch.utils.data.BatchSampler(
                torch.utils.data.RandomSampler(ds, generator=gen()), 5, False))),
        ("list-batch-sampler", lambda lib, ds: dict(batch_sampler=[[0, 1, 2], [7], [5, 5, 3, 2]])),
    ]


GRID = [(0, False), (2, False), (2, True), (4, False), (4, True)]


@pytest.mark.parametrize("workers, persistent", GRID, ids=lambda v: str(v))
def test_batches_equal_torch_over_the_option_grid(workers, persistent):
    torch = need_torch()
    from torch.utils import data as T

    ours_ds, theirs_ds = _pair(torch, "arrays")
    for name, options in _sampler_cases(torch):
        extra = dict(num_workers=workers, persistent_workers=persistent)
        ours = _epochs(torch, lambda lib: longshore.DataLoader(ours_ds, **options(L, ours_ds), **extra), L, 7)
        theirs = _epochs(torch, lambda lib: T.DataLoader(theirs_ds, **options(T, theirs_ds), **extra), T, 7)
        _assert_same(torch, ours, theirs, (name, workers, persistent))


@pytest.mark.parametrize("kind", ["tensors", "arrays", "subset", "concat", "split", "torch-split"])
def test_native_datasets_batch_as_torch(kind):
    torch = need_torch()
    from torch.utils import data as T

    ours_ds, theirs_ds = _pair(torch, kind)
    assert len(ours_ds) == len(theirs_ds)
    for kw in (dict(batch_size=4), dict(batch_size=3, shuffle=True, num_workers=2),
               dict(batch_size=5, shuffle=True, drop_last=True)):
        ours = _epochs(torch, lambda lib: longshore.DataLoader(ours_ds, **kw), L, 3)
        theirs = _epochs(torch, lambda lib: T.DataLoader(theirs_ds, **kw), T, 3)
        _assert_same(torch, ours, theirs, (kind, kw))


@pytest.mark.parametrize("workers", [2, 4])
def test_out_of_order_delivers_torchs_batches(workers):
    torch = need_torch()
    from torch.utils import data as T

    ours_ds, theirs_ds = _pair(torch, "arrays")
    first_id = lambda b: int(b[1][0])  # noqa: E731  (sample ids are unique)
    for kw in (dict(batch_size=4, shuffle=True), dict(batch_size=5),
               dict(batch_sampler=L.BatchSampler(L.RandomSampler(range(N)), 3, False))):
        kw = dict(kw, num_workers=workers, in_order=False)
        t_kw = dict(kw)
        if "batch_sampler" in kw:
            t_kw["batch_sampler"] = T.BatchSampler(T.RandomSampler(range(N)), 3, False)
        ours = _epochs(torch, lambda lib: longshore.DataLoader(ours_ds, **kw), L, 5, key=first_id)
        theirs = _epochs(torch, lambda lib: T.DataLoader(theirs_ds, **t_kw), T, 5, key=first_id)
        _assert_same(torch, ours, theirs, kw)


@pytest.mark.parametrize("shuffle, drop_last", list(itertools.product([True, False], repeat=2)))
def test_distributed_sampler_gives_each_of_4_ranks_torchs_batches(shuffle, drop_last):
    torch = need_torch()
    from torch.utils import data as T

    ours_ds, theirs_ds = _pair(torch, "arrays")
    seen = []
    for rank in range(4):
        def make(lib, rank=rank):
            ds = ours_ds if lib is L else theirs_ds
            loader = longshore.DataLoader if lib is L else T.DataLoader
            s = lib.DistributedSampler(ds, num_replicas=4, rank=rank, shuffle=shuffle, seed=3,
                                       drop_last=drop_last)
            return loader(ds, batch_size=3, sampler=s, num_workers=rank % 3)
        ours, theirs = _epochs(torch, make, L, 1), _epochs(torch, make, T, 1)
        _assert_same(torch, ours, theirs, ("rank", rank))
        seen.append([int(i) for b in ours[0][0] for i in b[1]])
    ids = [i for r in seen for i in r]
    assert len({len(r) for r in seen}) == 1  # equal work per rank
    if drop_last:
        assert len(set(ids)) == len(ids)
    else:
        assert set(ids) == set(range(N))


def test_distributed_sampler_from_torchrun_environment(monkeypatch):
    torch = need_torch()
    from torch.utils import data as T

    ours_ds, theirs_ds = _pair(torch, "tensors")
    monkeypatch.setenv("WORLD_SIZE", "4")
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        ours = _epochs(torch, lambda lib: longshore.DataLoader(
            ours_ds, batch_size=4, sampler=L.DistributedSampler(ours_ds)), L, 2)
        theirs = _epochs(torch, lambda lib: T.DataLoader(
            theirs_ds, batch_size=4, sampler=T.DistributedSampler(theirs_ds, num_replicas=4, rank=rank)), T, 2)
        _assert_same(torch, ours, theirs, ("env rank", rank))


def test_a_failing_sampler_raises_its_error_after_the_batches_before_it():
    torch = need_torch()
    ours_ds, _ = _pair(torch, "tensors")

    def sampler():
        yield from range(10)
        raise KeyError("sampler broke")

    class Once:
        def __iter__(self):
            return sampler()

    got = []
    with pytest.raises(KeyError, match="sampler broke"):
        for b in longshore.DataLoader(ours_ds, batch_size=4, sampler=Once(), num_workers=2):
            got.append(b[1].tolist())
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_an_unsized_infinite_sampler_is_pulled_lazily():
    torch = need_torch()
    ours_ds, _ = _pair(torch, "tensors")

    class Forever:
        def __iter__(self):
            return itertools.cycle(range(N))

    dl = longshore.DataLoader(ours_ds, batch_size=5, sampler=Forever(), num_workers=2)
    with pytest.raises(TypeError):
        len(dl)
    it = iter(dl)
    got = [next(it)[1].tolist() for _ in range(20)]
    it.close()
    flat = [i for b in got for i in b]
    assert flat == [i % N for i in range(100)]


def test_seed_keeps_longshores_own_order_and_leaves_torchs_generator():
    torch = need_torch()
    ds, _ = _pair(torch, "tensors")
    torch.manual_seed(0)
    a = [b[1].tolist() for b in longshore.DataLoader(ds, batch_size=5, shuffle=True, seed=9)]
    after = torch.rand(2)
    torch.manual_seed(1)
    b = [b[1].tolist() for b in longshore.DataLoader(ds, batch_size=5, shuffle=True, seed=9)]
    assert a == b
    torch.manual_seed(0)
    assert torch.equal(torch.rand(2), after)  # no draw from torch's generator
