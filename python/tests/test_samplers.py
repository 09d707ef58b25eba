"""longshore.data's samplers and dataset helpers against torch.utils.data's: the same indices
for the same generator state, the same generator state afterwards, the same checks; and,
without PyTorch (simulated), longshore's own generator under the same rules."""
import warnings

import numpy as np
import pytest

import longshore
from longshore import data as L
from conftest import need_torch


def _drawn(torch, make, lib, seed=11):
    """Indices of two passes of the sampler `make(lib, generator)` (each with its own
    generator seeded `seed`, after torch.manual_seed(seed)), and the global generator after."""
    torch.manual_seed(seed)
    g = torch.Generator()
    g.manual_seed(seed + 1)
    s = make(lib, g)
    first, second = list(s), list(s)
    return first, second, torch.rand(3), g.initial_seed(), torch.rand(2, generator=g)


def _same(torch, make):
    from torch.utils import data as T

    ours, theirs = _drawn(torch, make, L), _drawn(torch, make, T)
    assert ours[0] == theirs[0] and ours[1] == theirs[1]
    assert [type(i) for i in ours[0]] == [type(i) for i in theirs[0]]
    assert torch.equal(ours[2], theirs[2]) and torch.equal(ours[4], theirs[4])
    return ours[0]


class _Len:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


@pytest.mark.parametrize("n", [1, 7, 100])
def test_sequential_and_random_samplers_equal_torch(n):
    torch = need_torch()
    got = _same(torch, lambda lib, g: lib.SequentialSampler(_Len(n)))
    assert got == list(range(n))
    for kw in [{}, {"num_samples": 3}, {"num_samples": 2 * n + 5}, {"num_samples": n}]:
        _same(torch, lambda lib, g, kw=kw: lib.RandomSampler(_Len(n), **kw))
        _same(torch, lambda lib, g, kw=kw: lib.RandomSampler(_Len(n), generator=g, **kw))
    for k in [1, 31, 32, 33, 100]:
        _same(torch, lambda lib, g, k=k: lib.RandomSampler(_Len(n), replacement=True, num_samples=k))
        _same(torch, lambda lib, g, k=k: lib.RandomSampler(_Len(n), True, k, generator=g))


def test_subset_and_weighted_samplers_equal_torch():
    torch = need_torch()
    idx = [5, 3, 99, 17, 42, 8]
    got = _same(torch, lambda lib, g: lib.SubsetRandomSampler(idx))
    assert sorted(got) == sorted(idx)
    _same(torch, lambda lib, g: lib.SubsetRandomSampler(idx, generator=g))
    _same(torch, lambda lib, g: lib.SubsetRandomSampler(torch.tensor(idx), generator=g))
    w = [0.1, 0.9, 0.4, 0.0, 3.0, 0.6, 1.0]
    for replacement, k in [(True, 1), (True, 50), (False, 1), (False, 6)]:
        _same(torch, lambda lib, g, r=replacement, k=k: lib.WeightedRandomSampler(w, k, r))
        _same(torch, lambda lib, g, r=replacement, k=k: lib.WeightedRandomSampler(w, k, r, generator=g))


def test_batch_sampler_equals_torch():
    torch = need_torch()
    for drop_last in (False, True):
        for bs in (1, 3, 10, 11):
            _same(torch, lambda lib, g, b=bs, d=drop_last: lib.BatchSampler(lib.SequentialSampler(range(10)), b, d))
            _same(torch, lambda lib, g, b=bs, d=drop_last: lib.BatchSampler(lib.RandomSampler(range(10), generator=g), b, d))
            # A plain iterable as the sampler.
            _same(torch, lambda lib, g, b=bs, d=drop_last: lib.BatchSampler([4, 1, 7, 7, 0], b, d))
    from torch.utils import data as T

    for drop_last in (False, True):
        assert len(L.BatchSampler(range(10), 3, drop_last)) == len(T.BatchSampler(range(10), 3, drop_last))


@pytest.mark.parametrize("n", [0, 1, 3, 10, 13])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_equals_torch_on_every_rank(n, shuffle, drop_last):
    torch = need_torch()
    from torch.utils.data import DistributedSampler as T

    for rank in range(4):
        ours = L.DistributedSampler(_Len(n), num_replicas=4, rank=rank, shuffle=shuffle, seed=5,
                                    drop_last=drop_last)
        theirs = T(_Len(n), num_replicas=4, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last)
        for epoch in (0, 1, 7):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs), (rank, epoch)
            assert len(ours) == len(theirs) and ours.total_size == theirs.total_size


def test_distributed_sampler_takes_the_world_from_torchrun_env(monkeypatch):
    torch = need_torch()
    from torch.utils.data import DistributedSampler as T

    monkeypatch.setenv("WORLD_SIZE", "4")
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        ours = L.DistributedSampler(_Len(10))
        assert (ours.num_replicas, ours.rank) == (4, rank)
        assert list(ours) == list(T(_Len(10), num_replicas=4, rank=rank))
        # Given values win over the environment.
        assert L.DistributedSampler(_Len(10), num_replicas=2, rank=1).num_replicas == 2


def test_distributed_sampler_without_a_world_fails_as_torch(monkeypatch):
    torch = need_torch()
    from torch.utils.data import DistributedSampler as T

    for var in ("WORLD_SIZE", "RANK", "SLURM_NTASKS", "SLURM_PROCID", "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(Exception) as theirs:
        T(_Len(10))
    with pytest.raises(type(theirs.value)) as ours:
        L.DistributedSampler(_Len(10))
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    "build",
    [
        lambda lib: lib.RandomSampler(range(3), replacement=1),
        lambda lib: lib.RandomSampler(range(3), num_samples=0),
        lambda lib: lib.RandomSampler(range(0)),
        lambda lib: lib.RandomSampler(range(3), num_samples=2.5),
        lambda lib: lib.WeightedRandomSampler([1.0, 2.0], 0),
        lambda lib: lib.WeightedRandomSampler([1.0, 2.0], True),
        lambda lib: lib.WeightedRandomSampler([1.0, 2.0], 2, replacement=0),
        lambda lib: lib.WeightedRandomSampler([[1.0, 2.0]], 2),
        lambda lib: lib.BatchSampler(range(3), 0, False),
        lambda lib: lib.BatchSampler(range(3), True, False),
        lambda lib: lib.BatchSampler(range(3), 2, 1),
        lambda lib: lib.DistributedSampler(range(3), num_replicas=2, rank=2),
        lambda lib: lib.DistributedSampler(range(3), num_replicas=2, rank=-1),
    ],
)
def test_sampler_checks_equal_torch(build):
    torch = need_torch()
    from torch.utils import data as T

    with pytest.raises(Exception) as theirs:
        build(T)
    with pytest.raises(type(theirs.value)) as ours:
        build(L)
    assert str(ours.value) == str(theirs.value)


def test_whole_epoch_draws_as_iterating_does():
    # What the loader takes in one call leaves every generator where iterating would.
    torch = need_torch()
    for make in [
        lambda g: L.RandomSampler(range(50), generator=g),
        lambda g: L.RandomSampler(range(50)),
        lambda g: L.RandomSampler(range(50), True, 70, generator=g),
        lambda g: L.SubsetRandomSampler(list(range(10, 30)), generator=g),
        lambda g: L.WeightedRandomSampler([1.0] * 20, 15, False, generator=g),
    ]:
        out = []
        for whole in (False, True):
            torch.manual_seed(3)
            g = torch.Generator().manual_seed(4)
            s = make(g)
            got = s._epoch().tolist() if whole else list(s)
            out.append((got, torch.rand(2), torch.rand(2, generator=g)))
        assert out[0][0] == out[1][0]
        assert torch.equal(out[0][1], out[1][1]) and torch.equal(out[0][2], out[1][2])


@pytest.fixture
def no_torch(monkeypatch):
    """longshore.data as it runs without PyTorch installed (its samplers live in
    longshore._samplers)."""
    from longshore import _samplers

    monkeypatch.setattr(L, "_torch", lambda: None)
    monkeypatch.setattr(_samplers, "_torch", lambda: None)


def test_without_torch_samplers_use_longshores_generator(no_torch):
    perms = [list(L.RandomSampler(range(40))) for _ in range(3)]
    assert all(sorted(p) == list(range(40)) for p in perms)
    assert len({tuple(p) for p in perms}) > 1  # a fresh seed each pass
    rep = list(L.RandomSampler(range(5), replacement=True, num_samples=64))
    assert len(rep) == 64 and set(rep) <= set(range(5))
    more = list(L.RandomSampler(range(5), num_samples=12))
    assert len(more) == 12 and sorted(more[:5]) == list(range(5))
    assert sorted(L.SubsetRandomSampler([7, 9, 11])) == [7, 9, 11]
    w = list(L.WeightedRandomSampler([0.0, 1.0, 0.0, 2.0], 30))
    assert len(w) == 30 and set(w) <= {1, 3}
    assert sorted(L.WeightedRandomSampler([1.0, 0.0, 1.0, 1.0], 3, False)) == [0, 2, 3]
    with pytest.raises(TypeError, match="generator"):
        L.RandomSampler(range(3), generator=object())


@pytest.mark.parametrize("n, drop_last", [(10, False), (10, True), (3, False), (13, True)])
def test_without_torch_distributed_ranks_share_the_data(no_torch, n, drop_last):
    shares = [list(L.DistributedSampler(range(n), 4, r, seed=1, drop_last=drop_last)) for r in range(4)]
    assert len({len(s) for s in shares}) == 1
    allidx = [i for s in shares for i in s]
    if drop_last:
        assert len(set(allidx)) == len(allidx) == 4 * (n // 4)
    else:
        assert set(allidx) == set(range(n)) and len(allidx) == 4 * -(-n // 4)
    again = [list(L.DistributedSampler(range(n), 4, r, seed=1, drop_last=drop_last)) for r in range(4)]
    assert again == shares  # seeded: every process draws the same order
    s = L.DistributedSampler(range(n), 4, 0, seed=1, drop_last=drop_last)
    s.set_epoch(1)
    if n >= 10:
        assert list(s) != shares[0]


def test_without_torch_random_split(no_torch):
    a, b = L.random_split(range(10), [3, 7], seed=4)
    assert sorted(list(a.indices) + list(b.indices)) == list(range(10))
    assert L.random_split(range(10), [3, 7], seed=4)[0].indices == a.indices
    with pytest.raises(TypeError, match="generator"):
        L.random_split(range(10), [3, 7], generator=object())


# --------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------


def test_random_split_equals_torch():
    torch = need_torch()
    from torch.utils import data as T

    cases = [(10, [3, 7]), (10, [1, 0, 9]), (10, [0.3, 0.3, 0.4]), (11, [0.3, 0.3, 0.4]),
             (11, [0.5, 0.5]), (3, [0.1, 0.9]), (7, [0.25, 0.25, 0.25, 0.25])]
    for n, lengths in cases:
        if True:
            with warnings.catch_warnings(record=True) as w_theirs:
                warnings.simplefilter("always")
                theirs = T.random_split(range(n), lengths, generator=torch.Generator().manual_seed(42))
            with warnings.catch_warnings(record=True) as w_ours:
                warnings.simplefilter("always")
                ours = L.random_split(range(n), lengths, generator=torch.Generator().manual_seed(42))
            assert [list(s.indices) for s in ours] == [list(s.indices) for s in theirs]
            assert [str(w.message) for w in w_ours] == [str(w.message) for w in w_theirs]
    # The global generator by default.
    torch.manual_seed(9)
    theirs = [list(s.indices) for s in T.random_split(range(20), [5, 15])]
    after = torch.rand(1)
    torch.manual_seed(9)
    assert [list(s.indices) for s in L.random_split(range(20), [5, 15])] == theirs
    assert torch.equal(torch.rand(1), after)
    for bad in ([3, 3], [0.5, 0.6], [-0.5, 1.5]):
        with pytest.raises(ValueError) as t:
            T.random_split(range(10), bad)
        with pytest.raises(ValueError) as o:
            L.random_split(range(10), bad)
        assert str(o.value) == str(t.value)


def test_subset_and_concat_index_as_torch():
    torch = need_torch()
    from torch.utils import data as T

    x = torch.arange(30).reshape(10, 3)
    ours = L.TensorDataset(x, x[:, 0] * 2)
    theirs = T.TensorDataset(x, x[:, 0] * 2)
    for idx in (0, 9, -1, -10):
        assert all(torch.equal(a, b) for a, b in zip(ours[idx], theirs[idx]))
    sub_o, sub_t = L.Subset(ours, [4, -1, 2]), T.Subset(theirs, [4, -1, 2])
    assert len(sub_o) == len(sub_t) == 3
    for i in range(3):
        assert all(torch.equal(a, b) for a, b in zip(sub_o[i], sub_t[i]))
    cat_o = L.ConcatDataset([ours, sub_o])
    cat_t = T.ConcatDataset([theirs, sub_t])
    assert cat_o.cumulative_sizes == cat_t.cumulative_sizes and len(cat_o) == len(cat_t)
    for i in range(-len(cat_t), len(cat_t)):
        assert all(torch.equal(a, b) for a, b in zip(cat_o[i], cat_t[i]))
    with pytest.raises(AssertionError, match="empty"):
        L.ConcatDataset([])
    with pytest.raises(AssertionError, match="Size mismatch"):
        L.TensorDataset(x, x[:5])
    with pytest.raises(ValueError, match="Size mismatch"):
        L.ArrayDataset(np.zeros(3), np.zeros(4))


def test_native_datasets_refuse_what_they_cannot_batch(files):
    torch = need_torch()
    with pytest.raises(ValueError, match="bfloat16"):
        L.TensorDataset(torch.zeros(4, 2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="complex"):
        L.ArrayDataset(np.zeros(4, dtype=np.complex64))
    with pytest.raises(ValueError, match="first dimension"):
        L.ArrayDataset(np.float32(3.0))
    with pytest.raises(IndexError, match="out of range"):
        longshore.DataLoader(L.Subset(L.ArrayDataset(np.zeros(4)), [0, 4]))
    a = L.ArrayDataset(np.zeros((4, 2), np.float32))
    b = L.ArrayDataset(np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="fields"):
        longshore.DataLoader(L.ConcatDataset([a, b]))
    # Over a Python dataset: PyTorch's indexing, and the loader runs it in Python.
    py = L.Subset(list(range(10)), [3, 4])
    assert py[1] == 4
    got = [b.tolist() for b in longshore.DataLoader(py, batch_size=2, framework="numpy")]
    assert got == [[3, 4]]


def test_non_native_byte_order_and_views_are_batched_by_value():
    torch = need_torch()
    big = np.arange(24, dtype=">i4").reshape(6, 4)
    view = np.arange(48, dtype=np.float64).reshape(6, 8)[:, ::2]
    dl = longshore.DataLoader(L.ArrayDataset(big, view), batch_size=4)
    got = [b for b in dl]
    assert torch.equal(got[0][0], torch.tensor(big[:4].astype(np.int32)))
    assert torch.equal(got[1][1], torch.tensor(np.ascontiguousarray(view[4:])))


def test_without_torch_the_loader_runs_every_sampler(no_torch, monkeypatch):
    monkeypatch.setattr(longshore._loader, "_import_torch", lambda: None)
    ds = L.ArrayDataset(np.arange(30, dtype=np.int64), np.arange(30, dtype=np.float32) / 2)

    def ids(**kw):
        dl = longshore.DataLoader(ds, framework="numpy", **kw)
        return [b[0].tolist() for b in dl]

    flat = lambda batches: [i for b in batches for i in b]  # noqa: E731
    for kw in (dict(batch_size=4, shuffle=True), dict(batch_size=4, shuffle=True, num_workers=2),
               dict(batch_size=5, sampler=L.RandomSampler(ds)),
               dict(batch_sampler=L.BatchSampler(L.RandomSampler(ds), 7, False))):
        got = ids(**kw)
        assert sorted(flat(got)) == list(range(30)), kw
    assert ids(batch_size=8, sampler=[5, 6, 7]) == [[5, 6, 7]]
    ranks = [flat(ids(batch_size=3, sampler=L.DistributedSampler(ds, 4, r, seed=2))) for r in range(4)]
    every = [i for r in ranks for i in r]
    assert set(every) == set(range(30)) and len(every) == 32 and {len(r) for r in ranks} == {8}
    assert ids(batch_size=4, shuffle=True, seed=3) == ids(batch_size=4, shuffle=True, seed=3)


def _resumed_shares(n, world, offset, drop_last, epoch=3):
    """The ranks' shares of epoch `epoch` with its first `offset` global entries taken out,
    interleaved back into one list, and the whole epoch's global order (one rank of one)."""
    whole = L.DistributedSampler(range(n), 1, 0, seed=5)
    whole.set_epoch(epoch)
    order = list(whole)
    shares = []
    for r in range(world):
        s = L.DistributedSampler(range(n), world, r, seed=5, drop_last=drop_last)
        s._resume_share(epoch, offset)
        assert len(s) == len(list(s))
        shares.append(list(s))
    assert len({len(s) for s in shares}) == 1, "equal shares"
    return [s[i] for i in range(len(shares[0])) for s in shares], order


@pytest.mark.parametrize("torch_present", [True, False])
@pytest.mark.parametrize("n, world, offset, drop_last",
                         [(10, 3, 4, False), (10, 3, 4, True), (7, 4, 6, False), (9, 2, 9, False),
                          (5, 3, 0, False)])
def test_a_resumed_share_is_the_rest_of_the_global_order(
        monkeypatch, torch_present, n, world, offset, drop_last):
    if torch_present:
        need_torch()
    else:
        from longshore import _samplers
        monkeypatch.setattr(L, "_torch", lambda: None)
        monkeypatch.setattr(_samplers, "_torch", lambda: None)
    got, order = _resumed_shares(n, world, offset, drop_last)
    rest = order[offset:]
    if drop_last:
        assert got == rest[:len(rest) // world * world]
    else:
        size = -(-len(rest) // world) * world
        assert got == (rest + rest * world)[:size]
