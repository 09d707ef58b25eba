"""longshore.data.Mixture: map-style datasets drawn in chosen proportions by a fixed schedule,
Hugging Face's stopping strategies. Native members (read by the loader's Rust workers) and
Python members (read in longshore's worker processes, or torch's DataLoader): the realised
per-member counts are the schedule's draws, every position once per epoch in the loader's
epoch, the stop rules' lengths against a hand count, a checkpoint resumed on other workers, and
named errors."""
import collections
import pickle

import numpy as np
import pytest

import longshore
from longshore import _longshore
from longshore.data import ArrayDataset, ConcatDataset, Mixture, Subset

from conftest import guide_python, interrupted, need_torch, run_fresh

BASE = 1000  # member m's sample i has id m * BASE + i


def members(*sizes):
    return [ArrayDataset(np.arange(m * BASE, m * BASE + n, dtype=np.int64))
            for m, n in enumerate(sizes)]


class Ids:
    """A plain Python dataset of ids (torch-style: __getitem__ and __len__), its samples tuples
    as ArrayDataset's are."""

    def __init__(self, m, n):
        self.m, self.n = m, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return (np.int64(self.m * BASE + i),)


def ids(loader):
    out = []
    for batch in loader:
        batch = batch[0] if isinstance(batch, (list, tuple)) else batch
        out.extend(np.asarray(batch).reshape(-1).tolist())
    return out


def expected(mix, epoch):
    """The ids of positions 0..len in `epoch`, from the schedule."""
    return [m * BASE + i for m, i in (mix.source(p, epoch) for p in range(len(mix)))]


# Hand count, weights [1, 1] over 3 and 5 samples: the schedule alternates a, b, a, b, ...
# (equal shares, ties to the first member), as Hugging Face's round robin does.
# first_exhausted: a0 b0 a1 b1 a2 b2, then a would be drawn past its last sample: 6.
# all_exhausted: ... a2 b2 a0' b3 a1' b4: b's last sample at position 9: 10, a repeats 2.
# 7 positions: a0 b0 a1 b1 a2 b2 a0': a 4 (1 repeated), b 3 (2 unused).
STOPS = [
    ("first_exhausted", 6, [3, 3], [0, 2], [0, 0]),
    ("all_exhausted", 10, [5, 5], [0, 0], [2, 0]),
    (7, 7, [4, 3], [0, 2], [1, 0]),
]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("stop,length,draws,unused,repeated", STOPS)
def test_stop_rules(native, stop, length, draws, unused, repeated):
    parts = members(3, 5) if native else [Ids(0, 3), Ids(1, 5)]
    mix = Mixture(parts, [1, 1], stop=stop, shuffle=False)
    assert (mix._native is not None) == native
    assert (len(mix), mix.draws, mix.unused, mix.repeated) == (length, draws, unused, repeated)
    got = [int(np.asarray(mix[p]).reshape(-1)[0]) for p in range(length)]
    a, b = [i % 3 for i in range(5)], list(range(5))
    order = [x for pair in zip(a, [BASE + i for i in b]) for x in pair]
    assert got == order[:length]
    with pytest.raises(IndexError):
        mix[length]


def test_weighted_first_exhausted_hand_count():
    # Weights 3:1 over 100 and 10 samples: a block of 1,024 holds 768 of a, 256 of b; a's j-th
    # position falls at (j + 1/2) / 768, b's k-th at (3k + 3/2) / 768. b's 11th draw (k = 10,
    # at 31.5/768) ends the epoch: a's j = 0..31 come before it (the tie to the first member),
    # so 32 + 10 = 42 positions.
    mix = Mixture(members(100, 10), [3, 1])
    assert (len(mix), mix.draws, mix.unused, mix.repeated) == (42, [32, 10], [68, 0], [0, 0])
    assert mix.block == 1024
    # A member drawn in proportion over a long epoch: within one position per block.
    long = Mixture(members(10_000, 10_000, 10_000), [0.5, 0.3, 0.2], stop=8192)
    # 1024 * w = 512, 307.2, 204.8: floors 512, 307, 204 and the one left to the largest
    # remainder (204.8): 512, 307, 205 per block, 8 blocks.
    assert long.draws == [4096, 2456, 1640]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stop", ["first_exhausted", "all_exhausted", 300])
def test_loader_draws_every_position_once(num_workers, stop):
    mix = Mixture(members(120, 45, 80), [2, 1, 1], stop=stop, seed=3)
    assert mix._native is not None
    loader = longshore.DataLoader(mix, batch_size=16, num_workers=num_workers)
    got = ids(loader)
    assert got == expected(mix, 0)  # in order: every position once, the loader's epoch 0
    counts = collections.Counter(x // BASE for x in got)
    assert [counts[m] for m in range(3)] == mix.draws
    if stop == "first_exhausted":
        assert len(set(got)) == len(got)  # every sample at most once
    shuffled = ids(longshore.DataLoader(mix, batch_size=16, shuffle=True,
                                        num_workers=num_workers, seed=1))
    assert sorted(shuffled) == sorted(expected(mix, 0))


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_stats_count_the_delivered_samples_by_member(native, num_workers):
    parts = members(120, 45, 80)
    if not native:
        parts[1] = Ids(1, 45)  # a Python member: the mixture is a Python dataset
    mix = Mixture(parts, [2, 1, 1], stop="all_exhausted", seed=5)
    assert (mix._native is not None) == native
    loader = longshore.DataLoader(mix, batch_size=16, shuffle=True, seed=2,
                                  num_workers=num_workers, in_order=False,
                                  persistent_workers=num_workers > 0)
    assert loader.stats["sources"] == [0, 0, 0]
    for epoch in (1, 2):
        got = ids(loader)
        counts = collections.Counter(x // BASE for x in got)
        assert [counts[m] for m in range(3)] == mix.draws
        assert loader.stats["sources"] == [epoch * d for d in mix.draws], epoch
    # Stopped mid-epoch: the batches the loader delivered (to the epoch's hand-off, which
    # runs a few batches ahead of the program, as the other counters count), nothing before
    # reset_stats.
    loader.reset_stats()
    it = iter(loader)
    head = ids([next(it) for _ in range(4)])
    counts = collections.Counter(x // BASE for x in head)
    stats = loader.stats
    assert sum(stats["sources"]) == stats["samples"] < len(mix)
    assert all(stats["sources"][m] >= counts[m] for m in range(3)), (stats, counts)
    it.close()
    # One rank of two: its own share.
    ranks = [longshore.DataLoader(mix, batch_size=16, num_workers=num_workers,
                                  sampler=longshore.data.DistributedSampler(
                                      mix, num_replicas=2, rank=r, shuffle=True))
             for r in range(2)]
    per_rank = []
    for r in ranks:
        got = ids(r)
        counts = collections.Counter(x // BASE for x in got)
        assert r.stats["sources"] == [counts[m] for m in range(3)]
        per_rank.append(r.stats["sources"])
    # The ranks' shares cover the epoch; DistributedSampler pads an odd length with one repeat.
    totals = [a + b for a, b in zip(*per_rank)]
    assert sum(totals) == len(mix) + len(mix) % 2
    assert all(t >= d for t, d in zip(totals, mix.draws)), (totals, mix.draws)
    assert "sources" not in longshore.DataLoader(parts[0], batch_size=8).stats


def test_epochs_differ():
    mix = Mixture(members(50, 50), [1, 1])
    loader = longshore.DataLoader(mix, batch_size=10, num_workers=2)
    e0, e1 = ids(loader), ids(loader)
    assert e0 == expected(mix, 0) and e1 == expected(mix, 1) and e0 != e1
    assert sorted(e0) == sorted(e1)  # both epochs exhaust both members
    loader.set_epoch(5)
    assert ids(loader) == expected(mix, 5)
    # Outside a loader: set_epoch.
    assert [int(mix[p][0]) for p in range(len(mix))] == expected(mix, 0)
    mix.set_epoch(1)
    assert [int(mix[p][0]) for p in range(len(mix))] == e1
    assert mix.source(3) == mix.source(3, 1) != mix.source(3, 0) or e0[3] == e1[3]
    # shuffle=False: index order, every epoch.
    plain = Mixture(members(50, 50), [1, 1], shuffle=False)
    assert expected(plain, 0) == expected(plain, 7)
    # Another seed, another order.
    assert expected(Mixture(members(50, 50), [1, 1], seed=9), 0) != e0


@pytest.mark.parametrize("workers", [(2, 0), (0, 3)])
def test_resume_on_other_workers(workers):
    before, after = workers
    mix = Mixture(members(90, 40), [3, 1], stop="all_exhausted", seed=4)

    def make(num_workers, seed=5):
        return longshore.DataLoader(mix, batch_size=7, shuffle=True, num_workers=num_workers,
                                    seed=seed)

    full, taken, rest = interrupted(make, before, after, 4, ids)
    assert taken + rest == full
    assert len(full) == len(mix)


def test_native_members_of_any_kind(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(2 * BASE, 2 * BASE + 30, dtype=np.int64))
    npy = longshore.NpyDataset(tmp_path / "a.npy")
    arr = ArrayDataset(np.arange(0, 60, dtype=np.int64))
    concat = ConcatDataset([Subset(arr, list(range(10))),
                            ArrayDataset(np.arange(BASE, BASE + 10, dtype=np.int64))])
    # Batch forms must agree: a one-file NpyDataset batches one tensor, ArrayDataset a list.
    with pytest.raises(ValueError, match="member 1 has fields .* member 0"):
        Mixture([arr, npy], [1, 1])
    mix = Mixture([concat, arr], [1, 2], stop=60)
    assert mix._native is not None
    assert len(ids(longshore.DataLoader(mix, batch_size=8, num_workers=2))) == 60
    inner = Mixture([npy, longshore.NpyDataset(tmp_path / "a.npy")], [1, 1])
    nested = Mixture([inner, npy], [1, 1], stop=20)  # a mixture is a member like any other
    assert nested._native is not None
    assert len(ids(longshore.DataLoader(nested, batch_size=8))) == 20


def test_bad_arguments():
    a, b = members(5, 5)
    with pytest.raises(ValueError, match="weights: 1 weights for 2 datasets"):
        Mixture([a, b], [1])
    with pytest.raises(ValueError, match="weights"):
        Mixture([a, b], [1, -1])
    with pytest.raises(ValueError, match="weights"):
        Mixture([a, b], [0, 0])
    with pytest.raises(ValueError, match="weights"):
        Mixture([a, b], ["x", 1])
    for stop in ("first", 0, -3, True, 1.5):
        with pytest.raises(ValueError, match="stop="):
            Mixture([a, b], [1, 1], stop=stop)
    with pytest.raises(ValueError, match="at least one dataset"):
        Mixture([], [])
    with pytest.raises(ValueError, match="member 1 is empty"):
        Mixture([a, ArrayDataset(np.zeros(0, np.int64))], [1, 1])
    with pytest.raises(ValueError, match=r"member 1 \(int\) is not a map-style"):
        Mixture([a, 3], [1, 1])
    with pytest.raises(ValueError, match="member 1 has fields"):
        Mixture([a, ArrayDataset(np.zeros((5, 2), np.float32))], [1, 1])
    with pytest.raises(ValueError, match="seed="):
        Mixture([a, b], [1, 1], seed="x")
    # Straight to the native classes, as the Python class calls them.
    with pytest.raises(ValueError, match="stop="):
        _longshore._MixtureSchedule([3], [1.0], "never")
    with pytest.raises(IndexError, match="out of range for a mixture of"):
        Mixture([a, b], [1, 1]).source(10)


def test_python_members_in_longshore_workers():
    mix = Mixture([Ids(0, 70), Ids(1, 30), members(0, 0, 50)[2]], [2, 1, 1],
                  stop="all_exhausted", seed=11)
    assert mix._native is None  # a Python member: a Python dataset
    for num_workers in (0, 2):
        loader = longshore.DataLoader(mix, batch_size=9, num_workers=num_workers)
        e0, e1 = ids(loader), ids(loader)  # the workers learn the loader's epoch
        assert e0 == expected(mix, 0) and e1 == expected(mix, 1) and e0 != e1
        counts = collections.Counter(x // BASE for x in e0)
        assert [counts[m] for m in range(3)] == mix.draws
    # Resume onto another number of workers.
    full = ids(longshore.DataLoader(mix, batch_size=9, shuffle=True, num_workers=2, seed=3))
    first = longshore.DataLoader(mix, batch_size=9, shuffle=True, num_workers=2, seed=3)
    it = iter(first)
    taken = ids([next(it) for _ in range(3)])
    state = first.state_dict()
    it.close()
    # A Python dataset's shuffle is a sampler of the loader's seed: the same seed here.
    resumed = longshore.DataLoader(mix, batch_size=9, shuffle=True, num_workers=0, seed=3)
    resumed.load_state_dict(state)
    assert taken + ids(resumed) == full
    # Thread workers too.
    threads = longshore.DataLoader(mix, batch_size=9, num_workers=2, worker_mode="thread")
    assert ids(threads) == expected(mix, 0)


def test_python_members_in_torch_dataloader():
    torch = need_torch()
    mix = Mixture([Ids(0, 40), Ids(1, 25)], [1, 1], stop="first_exhausted", seed=2)
    for epoch in (0, 1):
        mix.set_epoch(epoch)  # torch's loader has no epoch of its own to pass on
        loader = torch.utils.data.DataLoader(mix, batch_size=8, num_workers=2)
        assert ids(loader) == expected(mix, epoch)
    assert [int(x[0]) for x in mix.__getitems__([0, 1, 2])] == expected(mix, 1)[:3]
    # A worker process started by spawn or forkserver gets a pickled copy: the schedule is
    # rebuilt from the arguments, with the epoch.
    copy = pickle.loads(pickle.dumps(mix))
    assert copy._current_epoch() == 1 and expected(copy, 1) == expected(mix, 1)
    assert [int(copy[p][0]) for p in range(len(copy))] == expected(mix, 1)


SNIPPET = """
import numpy as np, torch, longshore
from longshore.data import ArrayDataset, Mixture
web = ArrayDataset(np.arange(1000, dtype=np.int64))
code = ArrayDataset(np.arange(10_000, 10_200, dtype=np.int64))
mix = Mixture([web, code], [0.8, 0.2], stop="all_exhausted", seed=0)
n = {0: 0, 1: 0}
for (x,) in longshore.DataLoader(mix, batch_size=64, shuffle=True, num_workers=2):
    n[0] += int((x < 10_000).sum()); n[1] += int((x >= 10_000).sum())
assert [n[0], n[1]] == mix.draws and mix.repeated[1] > 0, (n, mix.draws)
print("ok", len(mix))
"""


def test_snippet_in_a_fresh_interpreter(tmp_path):
    need_torch()
    out = run_fresh(SNIPPET, tmp_path)
    assert out.split()[0] == "ok"


def test_guide_example():
    """The Python example of the guide's "Mixtures" section runs as written."""
    exec(guide_python("migrating-from-pytorch.md", "## Mixtures"), {"__name__": "guide"})


def write_tars(root, name, n, shards=3):
    """WebDataset shards of `n` samples: `cls` (a member-wide id) and `txt`."""
    import io
    import tarfile
    d = root / name
    d.mkdir()
    for s in range(shards):
        with tarfile.open(d / f"shard-{s:06d}.tar", "w") as t:
            for i in range(s, n, shards):
                for ext, payload in (("cls", str(i).encode()), ("txt", f"{name} {i}".encode())):
                    info = tarfile.TarInfo(f"{name}{i:05d}.{ext}")
                    info.size = len(payload)
                    t.addfile(info, io.BytesIO(payload))
    return str(d) + "/shard-{000000..%06d}.tar" % (shards - 1)


def read_texts(loader, n=None):
    """The texts of the first `n` batches (all without `n`): no batch past them is taken."""
    import itertools
    out = []
    it = iter(loader)
    for batch in itertools.islice(it, n):
        out += batch["txt"]
    if n is not None:
        it.close()
    return out


@pytest.mark.parametrize("stop", ["first_exhausted", "all_exhausted", 150])
def test_sharded_members_make_a_sharded_mixture(tmp_path, stop):
    from longshore.datasets import WebDataset
    fields = {"txt": "text", "cls": "int"}
    urls = [write_tars(tmp_path, "web", 120), write_tars(tmp_path, "books", 30, shards=2)]

    def mixture(rank=0, world_size=1):
        members = [WebDataset(u, fields=fields, transform=None, cache_dir=tmp_path / "cache",
                              rank=rank, world_size=world_size) for u in urls]
        return Mixture(members, [3, 1], stop=stop, seed=4)

    mix = mixture()
    assert not isinstance(mix, Mixture) and len(mix) == sum(mix.draws)
    loader = longshore.DataLoader(mix, batch_size=8, num_workers=2, framework="numpy")
    texts = read_texts(loader)
    counts = collections.Counter(t.split()[0] for t in texts)
    assert [counts["web"], counts["books"]] == mix.draws
    assert loader.stats["sources"] == mix.draws  # every position read once, no padding
    if stop == "first_exhausted":
        assert len(set(texts)) == len(texts)
    if stop == "all_exhausted":
        assert len(set(texts)) == 150  # every sample of both members
    # Two ranks: equal batches, the epoch's draws between them, then a checkpoint of rank 0
    # after 3 batches resumed on one rank with one worker: the rest of the epoch.
    ranks = [longshore.DataLoader(mixture(r, 2), batch_size=8, num_workers=2,
                                  framework="numpy") for r in range(2)]
    per_rank = [read_texts(r) for r in ranks]
    assert len(per_rank[0]) == len(per_rank[1])
    # The ranks' shares are the epoch, plus one padding repeat when it does not split evenly.
    extra = collections.Counter(per_rank[0] + per_rank[1]) - collections.Counter(texts)
    assert sum(extra.values()) == len(mix) % 2
    assert not collections.Counter(texts) - collections.Counter(per_rank[0] + per_rank[1])
    first = longshore.DataLoader(mixture(0, 2), batch_size=8, num_workers=2, framework="numpy")
    head = read_texts(first, 3)
    state = first.state_dict()
    rest = longshore.DataLoader(mixture(0, 1), batch_size=8, num_workers=1, framework="numpy")
    rest.load_state_dict(state)
    tail = read_texts(rest)
    second = longshore.DataLoader(mixture(1, 2), batch_size=8, num_workers=2, framework="numpy")
    head1 = read_texts(second, 3)
    # What ranks 0 and 1 delivered before the checkpoint, and the rest on one rank: the epoch.
    assert sorted(head + head1 + tail) == sorted(texts)


def test_sharded_and_map_style_members_do_not_mix(tmp_path):
    from longshore.datasets import WebDataset
    wds = WebDataset(write_tars(tmp_path, "web", 12), fields={"cls": "int"}, transform=None,
                     cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="all sharded"):
        Mixture([wds, members(5)[0]], [1, 1])
    other = WebDataset(write_tars(tmp_path, "other", 12), fields={"txt": "text"},
                       transform=None, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="fields"):
        Mixture([wds, other], [1, 1])


class Stream:
    """A torch-style iterable dataset of ids m * BASE + i, sharded over the workers."""

    def __init__(self, m, n):
        self.m, self.n = m, n

    def __iter__(self):
        import longshore._workers as w
        info = w.get_worker_info()
        k, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(k, self.n, step):
            yield (np.int64(self.m * BASE + i),)


@pytest.mark.parametrize("workers,context", [(0, None), (2, "fork"), (2, "spawn")])
@pytest.mark.parametrize("stop", ["first_exhausted", "all_exhausted"])
def test_iterable_members_are_drawn_by_the_schedule(workers, context, stop):
    need_torch()
    mix = Mixture([Stream(0, 300), Stream(1, 40)], [3, 1], stop=stop)
    assert "iterable" in repr(mix)
    got = ids(longshore.DataLoader(mix, batch_size=8, num_workers=workers,
                                   multiprocessing_context=context))
    counts = collections.Counter(x // BASE for x in got)
    per_worker = max(workers, 1)
    if stop == "first_exhausted":
        # Each worker stops when its share of member 1 (40 / workers) runs out: 3 of member 0
        # for each of member 1, every sample at most once.
        assert counts[1] == 40 and len(set(got)) == len(got)
        assert abs(counts[0] - 3 * 40) <= 3 * per_worker
    else:
        # Every sample of both, member 1 passing again until member 0 (the larger share) ran out.
        assert set(got) == set(range(300)) | set(range(BASE, BASE + 40))
        assert abs(counts[1] - 100) <= 3 * per_worker


def test_iterable_mixture_in_torch_dataloader():
    torch = need_torch()
    mix = Mixture([Stream(0, 30), Stream(1, 10)], [3, 1])
    assert isinstance(mix, torch.utils.data.IterableDataset)
    got = [int(x) for (b,) in torch.utils.data.DataLoader(mix, batch_size=4) for x in b]
    assert collections.Counter(x // BASE for x in got) == {0: 30, 1: 10}


def test_iterable_mixture_refusals():
    with pytest.raises(ValueError, match="iterable"):
        Mixture([Stream(0, 5), members(5)[0]], [1, 1])
    with pytest.raises(ValueError, match="positions"):
        Mixture([Stream(0, 5), Stream(1, 5)], [1, 1], stop=7)


@pytest.mark.parametrize("fmt", ["webdataset", "mds"])
def test_image_shard_members_mix_images_and_labels(tmp_path, fmt):
    """Image-classification shards (WebDataset or MDS members, no fields): batches of
    (images, labels), each member's labels its own range, the draws per member."""
    from longshore import transforms as T
    from longshore.datasets import ImageFolder, StreamingDataset, WebDataset
    longshore.datasets.write_synthetic_folder(tmp_path / "img", classes=2, per_class=10)
    jpgs = [open(p, "rb").read() for p, _ in ImageFolder(tmp_path / "img").samples]
    tf = T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()])
    members = []
    for m, n in enumerate([20, 6]):
        out = tmp_path / f"m{m}"
        names = longshore.datasets.write_shards(
            out, [(jpgs[i % 20], m * BASE + i) for i in range(n)], format=fmt, shard_size=20_000)
        if fmt == "webdataset":
            members.append(WebDataset([str(out / x) for x in names], transform=tf,
                                      cache_dir=tmp_path / "cache"))
        else:
            members.append(StreamingDataset(local=str(out), transform=tf))
    mix = Mixture(members, [1, 1], stop="all_exhausted", seed=1)
    loader = longshore.DataLoader(mix, batch_size=5, num_workers=2, framework="numpy")
    labels = []
    for images, y in loader:
        assert images.shape[1:] == (3, 16, 16)
        labels += np.asarray(y).tolist()
    counts = collections.Counter(x // BASE for x in labels)
    assert [counts[0], counts[1]] == mix.draws and set(labels) >= set(range(20))
