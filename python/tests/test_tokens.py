"""longshore.datasets.TokenDataset: flat token files (nanoGPT's u16 train.bin, or u32) cut into
fixed-length sequences, checked against a NumPy reference (the files memory-mapped as one
stream): values by index and through the loader (dicts of [B, L] tensors, as torch's
default_collate batches dict samples), every sequence once per epoch on any number of workers
and across ranks, and a checkpoint resumed on another number of workers."""

import json

import numpy as np
import pytest

import longshore
from longshore import _longshore
from longshore.datasets import TokenDataset

from conftest import guide_python, interrupted, need_torch, run_fresh

SEP = 3
SIZES = (301, 170)  # tokens per file


def write(tmp_path, dtype=np.uint16, sizes=SIZES, seed=0, name="tok"):
    """Token files of `sizes` tokens (random ids, about one in 7 the separator SEP)."""
    rng = np.random.default_rng(seed)
    high = 60_000 if dtype == np.uint16 else 3_000_000
    paths = []
    for f, n in enumerate(sizes):
        tokens = rng.integers(SEP + 1, high, size=n).astype(dtype)
        tokens[rng.random(n) < 1 / 7] = SEP
        p = tmp_path / f"{name}-{f}.bin"
        tokens.tofile(p)
        paths.append(str(p))
    return paths


def reference(paths, dtype, seq_len, targets=True, separator=None):
    """Each sequence's fields by name, from the files memory-mapped as one stream."""
    maps = [np.memmap(p, dtype=np.dtype(dtype).newbyteorder("<"), mode="r") for p in paths]
    stream = np.concatenate(maps).astype(np.int64)
    n = (len(stream) - int(targets)) // seq_len if len(stream) >= seq_len + int(targets) else 0
    # Where documents start: the stream's start, each file's start, after each separator.
    starts = np.zeros(len(stream), dtype=bool)
    at = 0
    for m in maps:
        starts[at] = True
        at += len(m)
    if separator is not None:
        starts[1:] |= stream[:-1] == separator
    pos = np.zeros(len(stream), dtype=np.int64)
    for i in range(len(stream)):
        pos[i] = 0 if starts[i] else pos[i - 1] + 1
    out = []
    for k in range(n):
        a, b = k * seq_len, (k + 1) * seq_len
        seq = {"input_ids": stream[a:b]}
        if targets:
            seq["targets"] = stream[a + 1:b + 1]
        if separator is not None:
            seq["position_ids"] = pos[a:b]
            doc = np.zeros(seq_len, dtype=np.int64)
            for j in range(1, seq_len):
                doc[j] = doc[j - 1] + int(starts[a + j])
            seq["document_ids"] = doc
        out.append(seq)
    return out, len(stream)


def rows(batches):
    """The sequences of a list of dict batches, one dict of NumPy rows each."""
    out = []
    for b in batches:
        assert isinstance(b, dict)
        n = len(next(iter(b.values())))
        for i in range(n):
            out.append({k: np.asarray(v[i]) for k, v in b.items()})
    return out


def key(seq):
    return seq["input_ids"].tobytes()


def assert_same(got, want):
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name], dtype=np.int64), want[name],
                                      err_msg=name)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
@pytest.mark.parametrize("output", ["int64", "int32"])
@pytest.mark.parametrize("targets", [True, False])
def test_sequences_are_the_stream(tmp_path, dtype, output, targets):
    torch = need_torch()
    paths = write(tmp_path, dtype)
    ds = TokenDataset(paths, 16, dtype=dtype, output_dtype=getattr(torch, output),
                      targets=targets)
    want, total = reference(paths, dtype, 16, targets)
    assert len(ds) == len(want) == (total - int(targets)) // 16
    assert ds.total_tokens == total
    assert ds.dropped_tokens == total - 16 * len(ds) - int(targets)
    assert ds.fields == ["input_ids", "targets"][:1 + int(targets)]
    assert ds.output_dtype == getattr(torch, output)
    for k in (0, 1, len(ds) // 2, len(ds) - 1, -1):
        got = ds[k]
        assert all(t.dtype == getattr(torch, output) and t.shape == (16,) for t in got.values())
        assert_same(got, want[k])
    loader = longshore.DataLoader(ds, batch_size=5)
    batches = list(loader)
    assert len(batches) == len(loader) == -(-len(ds) // 5)
    first = batches[0]
    assert list(first) == ds.fields
    assert all(t.dtype == getattr(torch, output) and t.shape == (5, 16) for t in first.values())
    got = rows(batches)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same(g, w)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_documents_positions_and_ids(tmp_path, dtype):
    paths = write(tmp_path, dtype, seed=1)
    ds = TokenDataset(paths, 24, dtype=np.dtype(dtype).name, separator=SEP)
    want, _ = reference(paths, dtype, 24, separator=SEP)
    assert ds.fields == ["input_ids", "targets", "position_ids", "document_ids"]
    assert ds.documents is not None and ds.documents > 2
    got = rows(longshore.DataLoader(ds, batch_size=4, num_workers=2))
    assert len(got) == len(want) == len(ds)
    for g, w in zip(got, want):
        assert_same(g, w)
    # A document cut at a sequence's end continues in the next: positions carry over.
    assert any(w["position_ids"][0] > 0 for w in want)
    for k in (0, len(ds) - 1):
        assert_same(ds[k], want[k])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_sequence_once_per_epoch(tmp_path, num_workers):
    torch = need_torch()
    paths = write(tmp_path)
    ds = TokenDataset(paths, 8)
    want, _ = reference(paths, np.uint16, 8)
    by_key = {key(w): w for w in want}
    assert len(by_key) == len(want)
    loader = longshore.DataLoader(ds, batch_size=6, shuffle=True, num_workers=num_workers,
                                  pin_memory=True, seed=4)
    orders = []
    for epoch in range(2):
        batches = list(loader)
        assert all(b["input_ids"].dtype == torch.int64 for b in batches)
        assert [len(b["input_ids"]) for b in batches[:-1]] == [6] * (len(batches) - 1)
        got = rows(batches)
        assert sorted(key(g) for g in got) == sorted(by_key)
        for g in got:
            assert_same(g, by_key[key(g)])
        orders.append([key(g) for g in got])
    assert orders[0] != orders[1], "each epoch is shuffled anew"
    assert orders[0] != [key(w) for w in want]


@pytest.mark.parametrize("world", [3, 5])
def test_ranks_share_every_sequence_equally(tmp_path, world):
    paths = write(tmp_path)
    ds = TokenDataset(paths, 13)
    assert len(ds) == 36
    want, _ = reference(paths, np.uint16, 13)
    shares = []
    for rank in range(world):
        sampler = longshore.data.DistributedSampler(ds, num_replicas=world, rank=rank,
                                                    shuffle=True, seed=2)
        loader = longshore.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2)
        shares.append([key(g) for g in rows(loader)])
    assert len({len(s) for s in shares}) == 1, "equal shares"
    together = [k for s in shares for k in s]
    assert set(together) == {key(w) for w in want}
    if len(ds) % world == 0:
        assert len(together) == len(ds), "every sequence once"
    else:  # DistributedSampler pads by repeating the first sequences of its order
        assert len(together) == world * -(-len(ds) // world)


@pytest.mark.parametrize("workers", [(2, 0), (0, 3), (2, 2)])
def test_resume_on_other_workers(tmp_path, workers):
    before, after = workers
    paths = write(tmp_path, np.uint32)
    ds = TokenDataset(paths, 9, dtype=np.uint32, separator=SEP)

    def make(num_workers, seed=5):
        return longshore.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers,
                                    seed=seed)

    full, taken, rest = interrupted(make, before, after, 3, rows)
    assert len(taken) + len(rest) == len(full) == len(ds)
    for g, w in zip(taken + rest, full):
        assert_same(g, w)


def test_resume_with_torch_generator(tmp_path):
    torch = need_torch()
    paths = write(tmp_path)
    ds = TokenDataset(paths, 16)
    torch.manual_seed(7)
    full = rows(longshore.DataLoader(ds, batch_size=3, shuffle=True, num_workers=2))
    torch.manual_seed(7)
    first = longshore.DataLoader(ds, batch_size=3, shuffle=True, num_workers=2)
    it = iter(first)
    taken = rows([next(it) for _ in range(2)])
    state = first.state_dict()
    it.close()
    resumed = longshore.DataLoader(ds, batch_size=3, shuffle=True, num_workers=0)
    resumed.load_state_dict(state)
    rest = rows(resumed)
    assert [key(g) for g in taken + rest] == [key(g) for g in full]


def test_a_partial_token_names_the_file(tmp_path):
    good = write(tmp_path)
    bad = tmp_path / "odd.bin"
    bad.write_bytes(b"\x01\x00\x02\x00\x03")  # 5 bytes: 2.5 u16 tokens
    with pytest.raises(ValueError, match="odd.bin") as e:
        TokenDataset([good[0], str(bad)], 8)
    assert "5 bytes" in str(e.value)
    # 6 bytes are 3 u16 tokens but 1.5 u32 tokens.
    bad.write_bytes(bytes(6))
    TokenDataset(str(bad), 2)
    with pytest.raises(ValueError, match="odd.bin"):
        TokenDataset(str(bad), 1, dtype="uint32")


def test_bad_arguments(tmp_path):
    paths = write(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        TokenDataset([paths[0], str(tmp_path / "missing.bin")])
    with pytest.raises(FileNotFoundError, match="no token files match"):
        TokenDataset(str(tmp_path / "nothing-*.bin"))
    with pytest.raises(ValueError, match="dtype"):
        TokenDataset(paths, 8, dtype=np.int16)
    with pytest.raises(ValueError, match="dtype"):
        TokenDataset(paths, 8, dtype=">u2")
    with pytest.raises(ValueError, match="output_dtype"):
        TokenDataset(paths, 8, output_dtype="float32")
    with pytest.raises(ValueError, match="seq_len"):
        TokenDataset(paths, 0)
    with pytest.raises(ValueError, match="separator"):
        TokenDataset(paths, 8, separator=70_000)
    with pytest.raises(ValueError, match="at least one"):
        TokenDataset([])


def test_paths_as_a_glob_a_list_or_one_path(tmp_path):
    paths = write(tmp_path, sizes=(50, 60, 70))
    by_glob = TokenDataset(str(tmp_path / "tok-*.bin"), 8)
    assert by_glob.paths == sorted(paths)
    assert by_glob.total_tokens == 180
    one = TokenDataset(tmp_path / "tok-1.bin", 8)  # a pathlib.Path
    assert one.total_tokens == 60 and len(one) == (60 - 1) // 8
    assert "TokenDataset(" in repr(one) and "seq_len=8" in repr(one)
    assert "3 files" in repr(by_glob)


def test_getitem_is_a_dict_of_tensors(tmp_path):
    torch = need_torch()
    paths = write(tmp_path)
    ds = TokenDataset(paths, 16, separator=SEP)
    want, _ = reference(paths, np.uint16, 16, separator=SEP)
    item = ds[-1]
    assert isinstance(item, dict) and list(item) == ds.fields
    assert all(isinstance(t, torch.Tensor) and t.dtype == torch.int64 for t in item.values())
    assert_same(item, want[-1])
    # torch's default_collate of the items is the loader's batch.
    batch = torch.utils.data.default_collate([ds[k] for k in range(4)])
    ours = next(iter(longshore.DataLoader(ds, batch_size=4)))
    assert list(batch) == list(ours)
    for name in batch:
        assert torch.equal(batch[name], ours[name])
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(IndexError):
        ds[-len(ds) - 1]


def test_unbatched_numpy_and_subsets(tmp_path):
    need_torch()
    paths = write(tmp_path)
    ds = TokenDataset(paths, 16)
    want, _ = reference(paths, np.uint16, 16)
    # batch_size=None: each sample as it is, a dict of [L] tensors.
    sample = next(iter(longshore.DataLoader(ds, batch_size=None)))
    assert isinstance(sample, dict) and sample["input_ids"].shape == (16,)
    assert_same(sample, want[0])
    # framework="numpy": dicts of arrays.
    batch = next(iter(longshore.DataLoader(ds, batch_size=2, framework="numpy")))
    assert isinstance(batch["targets"], np.ndarray) and batch["targets"].shape == (2, 16)
    # A Subset and a ConcatDataset of token datasets keep the dict batches.
    sub = longshore.data.Subset(ds, [5, 2, 7])
    assert isinstance(sub._native, _longshore._Native), "read by the Rust workers"
    got = rows(longshore.DataLoader(sub, batch_size=2))
    for g, k in zip(got, [5, 2, 7]):
        assert_same(g, want[k])
    both = longshore.data.ConcatDataset([ds, sub])
    assert len(rows(longshore.DataLoader(both, batch_size=8))) == len(ds) + 3
    other = TokenDataset(paths, 16, targets=False)
    with pytest.raises(ValueError, match="ConcatDataset"):
        longshore.DataLoader(longshore.data.ConcatDataset([ds, other]), batch_size=2)


def test_device_path_delivers_dicts(tmp_path):
    """The device epoch (longshore-transfer's Cpu backend, the `cpu_backend` test hook)."""
    paths = write(tmp_path)
    ds = TokenDataset(paths, 16, output_dtype="int32")
    want, _ = reference(paths, np.uint16, 16)
    options = dict(batch_size=5, shuffle=False, num_workers=2, pin_memory=False,
                   drop_last=False, prefetch_factor=None, persistent_workers=False,
                   timeout=0.0, seed=7, in_order=True, on_sample_error="raise",
                   worker_priority="normal")
    loader = _longshore._Loader(ds, options, cpu_backend=True)
    assert loader.names == ds.fields
    got = rows([{k: v.copy() for k, v in b.items()} for b in loader.epoch(np.from_dlpack)])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["input_ids"].dtype == np.int32
        assert_same(g, w)


SNIPPET = """
import numpy as np, torch, longshore
np.arange(10_000, dtype=np.uint16).tofile("train.bin")   # nanoGPT's prepare.py writes this
ds = longshore.datasets.TokenDataset("train.bin", seq_len=64)
loader = longshore.DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, pin_memory=True)
n = 0
for batch in loader:
    x, y = batch["input_ids"], batch["targets"]
    assert x.dtype == torch.int64 and x.shape[1] == 64 and torch.equal(x + 1, y)
    n += len(x)
assert n == len(ds) == (10_000 - 1) // 64
print("ok", n)
"""


def test_snippet_in_a_fresh_interpreter(tmp_path):
    need_torch()
    out = run_fresh(SNIPPET, tmp_path)
    assert out.split() == ["ok", str((10_000 - 1) // 64)]


def test_guide_example(tmp_path, monkeypatch):
    """The Python example of the guide's "Token sequences" section runs as written."""
    need_torch()
    code = guide_python("migrating-from-pytorch.md", "## Token sequences")
    monkeypatch.chdir(tmp_path)
    exec(code, {})


def test_write_token_file_from_parquet_documents(tmp_path):
    """A tokenized Parquet dataset (documents of varying length in a list column, as Hugging
    Face stores input_ids) becomes one token file that TokenDataset packs, documents in the
    files' order, separators between them."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    docs = [list(range(100 * d, 100 * d + 3 + d % 7)) for d in range(40)]
    (tmp_path / "pq").mkdir()
    for f in range(3):
        part = docs[f * 14:(f + 1) * 14]
        table = pa.table({"input_ids": pa.array(part, pa.list_(pa.int32())),
                          "n": pa.array([len(d) for d in part], pa.int64())})
        pq.write_table(table, tmp_path / "pq" / f"part-{f}.parquet", row_group_size=5)
    ds = longshore.datasets.ParquetDataset(str(tmp_path / "pq") + "/part-{0..2}.parquet",
                                           fields={"input_ids": "array"},
                                           cache_dir=tmp_path / "cache", shuffle=True, rank=1,
                                           world_size=2)
    out = tmp_path / "train.bin"
    tokens, n = longshore.datasets.write_token_file(ds, out, "input_ids", separator=65535)
    want = [t for d in docs for t in d + [65535]]
    assert (tokens, n) == (len(want), 40)
    assert np.fromfile(out, dtype="<u2").tolist() == want  # every rank's, in order
    seqs = TokenDataset(out, seq_len=16, separator=65535)
    first = seqs[0]
    assert first["input_ids"].tolist() == want[:16]
    # Document 1 starts after document 0's 3 tokens and its separator: position 0 there.
    assert first["position_ids"].tolist()[:6] == [0, 1, 2, 3, 0, 1]
    # Errors name the sample; nothing is left behind.
    big = longshore.datasets.ParquetDataset(str(tmp_path / "pq") + "/part-{0..2}.parquet",
                                            fields={"input_ids": "array"},
                                            cache_dir=tmp_path / "cache")
    with pytest.raises(Exception) as e:
        longshore.datasets.write_token_file(big, tmp_path / "u8.bin", "n", dtype="uint16")
    # A scalar column is no array: named with its file and row.
    assert "field \"n\"" in str(e.value) and "part-0.parquet" in str(e.value), str(e.value)
    assert not (tmp_path / "u8.bin").exists()
    with pytest.raises(ValueError, match="uint16"):
        longshore.datasets.write_token_file(big, tmp_path / "x.bin", "input_ids", dtype="int64")


@pytest.mark.parametrize("kind", ["longshore", "torch"])
def test_a_checkpoint_resumes_exactly_on_the_same_ranks(tmp_path, kind):
    paths = write(tmp_path)
    ds = TokenDataset(paths, 13)
    assert len(ds) == 36
    if kind == "torch":
        Sampler = need_torch().utils.data.distributed.DistributedSampler
    else:
        Sampler = longshore.data.DistributedSampler

    def make(world, rank, workers=0):
        sampler = Sampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=2)
        return longshore.DataLoader(ds, batch_size=10, sampler=sampler, num_workers=workers,
                                    seed=1)

    full = [key(g) for g in rows(make(2, 1))]
    first = make(2, 1)
    it = iter(first)
    taken = [key(g) for g in rows([next(it)])]
    state = json.loads(json.dumps(first.state_dict()))
    it.close()
    assert (state["num_replicas"], state["batch_size"]) == (2, 10)
    resumed = make(2, 1, workers=2)
    resumed.load_state_dict(state)
    assert taken + [key(g) for g in rows(resumed)] == full
    if kind == "torch":
        # PyTorch's sampler cannot leave out what was consumed: refused by name, even where
        # the batch counts agree (18 and 12 sequences a rank are both 2 batches of 10).
        other = make(3, 1)
        assert len(other) == len(first) == 2
        with pytest.raises(ValueError, match="over 2 ranks, this loader's .PyTorch's. is over 3"):
            other.load_state_dict(state)
        assert len([key(g) for g in rows(other)]) == 12


@pytest.mark.parametrize("workers", [0, 2])
def test_a_checkpoint_resumes_on_other_numbers_of_ranks_and_batch_sizes(tmp_path, workers):
    paths = write(tmp_path)
    ds = TokenDataset(paths, 13)
    want = {key(w) for w in reference(paths, np.uint16, 13)[0]}
    assert len(ds) == len(want) == 36

    def make(world, rank, batch_size):
        sampler = longshore.data.DistributedSampler(ds, num_replicas=world, rank=rank,
                                                    shuffle=True, seed=4)
        return longshore.DataLoader(ds, batch_size=batch_size, sampler=sampler,
                                    num_workers=workers, seed=1)

    def run(world, batch_size, state, take):
        """Every rank's sequences (each rank `take` batches, or all); rank 0's state after."""
        seen, counts, after = [], [], None
        for rank in range(world):
            loader = make(world, rank, batch_size)
            if state is not None:
                loader.load_state_dict(json.loads(json.dumps(state)))
            it = iter(loader)
            got = rows([b for _, b in zip(range(take), it)] if take else list(it))
            if rank == 0:
                after = loader.state_dict()
            it.close()
            seen += [key(g) for g in got]
            counts.append(len(got))
        assert len(set(counts)) == 1, f"equal shares: {counts}"
        return seen, after

    # 2 ranks deliver a batch of 10 each (20 of 36), then checkpoint; 3 ranks take a batch
    # of 4 each of the 16 left (12), checkpoint again; 1 rank with batches of 5 the rest.
    seen, s1 = run(2, 10, None, 1)
    assert len(seen) == 20
    more, s2 = run(3, 4, s1, 1)
    assert s2["share_offset"] == 20 and s2["num_replicas"] == 3 and s2["batch_size"] == 4
    rest, _ = run(1, 5, s2, None)
    together = seen + more + rest
    assert set(together) == want, "every sequence"
    assert len(together) == len(want), "each once (no padding needed here)"
    # PyTorch's own sampler on the new ranks cannot resume it.
    torch = need_torch()
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=3, rank=0)
    loader = longshore.DataLoader(ds, batch_size=4, sampler=sampler)
    with pytest.raises(ValueError, match="PyTorch's"):
        loader.load_state_dict(s1)


def test_an_elastic_resume_in_a_fresh_interpreter(tmp_path):
    """The user's path after a preemption: the checkpoint written to a file by a job on 2
    ranks, read by a new process that runs 3 ranks."""
    paths = write(tmp_path)
    ds = TokenDataset(paths, 13)
    want = sorted(key(w) for w in reference(paths, np.uint16, 13)[0])
    seen = []
    for rank in range(2):
        sampler = longshore.data.DistributedSampler(ds, num_replicas=2, rank=rank, seed=4)
        loader = longshore.DataLoader(ds, batch_size=6, sampler=sampler, num_workers=2)
        it = iter(loader)
        seen += [key(g) for g in rows([next(it), next(it)])]
        if rank == 0:
            (tmp_path / "loader.json").write_text(json.dumps(loader.state_dict()))
        it.close()
    snippet = f"""
import json
import longshore
from longshore.datasets import TokenDataset
ds = TokenDataset({[str(p) for p in paths]!r}, 13)
state = json.loads(open("loader.json").read())
out = []
for rank in range(3):
    sampler = longshore.data.DistributedSampler(ds, num_replicas=3, rank=rank, seed=4)
    loader = longshore.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2)
    loader.load_state_dict(state)
    assert len(loader) == 1, len(loader)
    out += [b["input_ids"].tolist() for b in loader]
print(json.dumps(out))
"""
    for batch in json.loads(run_fresh(snippet, tmp_path)):
        seen += [np.asarray(row, dtype=np.int64).tobytes() for row in batch]
    assert sorted(seen) == want, "every sequence once: 24 before, 12 after"
