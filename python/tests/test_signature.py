"""longshore.DataLoader's signature and checks are torch.utils.data.DataLoader's: the same
parameters in the same order with the same defaults, the same exceptions with the same
messages, the same attributes; what longshore cannot run is refused naming what it runs."""
import inspect

import numpy as np
import pytest

import longshore
from longshore import data as L
from conftest import need_torch

# The list, in torch's order: what the signature must start with.
TORCH_PARAMS = [
    ("dataset", inspect.Parameter.empty),
    ("batch_size", 1),
    ("shuffle", None),
    ("sampler", None),
    ("batch_sampler", None),
    ("num_workers", 0),
    ("collate_fn", None),
    ("pin_memory", False),
    ("drop_last", False),
    ("timeout", 0),
    ("worker_init_fn", None),
    ("multiprocessing_context", None),
    ("generator", None),
    ("prefetch_factor", None),
    ("persistent_workers", False),
    ("pin_memory_device", ""),
    ("in_order", True),
]


def _params(cls):
    return list(inspect.signature(cls.__init__).parameters.values())[1:]


def test_signature_starts_with_torchs_parameters():
    ours = _params(longshore.DataLoader)
    got = [(p.name, p.default) for p in ours[: len(TORCH_PARAMS)]]
    assert got == TORCH_PARAMS
    kinds = [p.kind for p in ours[: len(TORCH_PARAMS)]]
    first_kw = [p.name for p in ours].index("prefetch_factor")
    assert all(k == inspect.Parameter.POSITIONAL_OR_KEYWORD for k in kinds[:first_kw])
    assert all(k == inspect.Parameter.KEYWORD_ONLY for k in kinds[first_kw:])
    # Then longshore's own, keyword-only.
    rest = {p.name: p for p in ours[len(TORCH_PARAMS):]}
    for name in ("device", "pool", "seed", "decode", "on_sample_error", "framework"):
        assert rest[name].kind == inspect.Parameter.KEYWORD_ONLY


def test_signature_equals_torchs():
    torch = need_torch()
    theirs = _params(torch.utils.data.DataLoader)
    ours = _params(longshore.DataLoader)[: len(theirs)]
    assert [(p.name, p.kind, p.default) for p in ours] == [
        (p.name, p.kind, p.default) for p in theirs
    ]


def _datasets(torch):
    x = torch.arange(40, dtype=torch.float32).reshape(20, 2)
    y = torch.arange(20)
    return L.TensorDataset(x, y), torch.utils.data.TensorDataset(x, y)


CHECKS = [
    dict(num_workers=-1),
    dict(timeout=-1),
    dict(prefetch_factor=2),
    dict(num_workers=2, prefetch_factor=-1),
    dict(persistent_workers=True),
    dict(shuffle=True, sampler=[0, 1]),
    dict(batch_sampler=[[0, 1]], batch_size=2),
    dict(batch_sampler=[[0, 1]], shuffle=True),
    dict(batch_sampler=[[0, 1]], sampler=[0, 1]),
    dict(batch_sampler=[[0, 1]], drop_last=True),
    dict(batch_size=None, drop_last=True),
    dict(batch_size=0),
    dict(batch_size=-3),
    dict(batch_size=True),
    dict(batch_size=2.5),
    dict(drop_last=1),
    dict(multiprocessing_context="spawn"),
    dict(num_workers=1, multiprocessing_context="no-such-method"),
    "empty-shuffle",
]


@pytest.mark.parametrize("kw", CHECKS, ids=str)
def test_checks_raise_torchs_exception_and_message(kw):
    torch = need_torch()
    ours_ds, theirs_ds = _datasets(torch)
    if kw == "empty-shuffle":
        kw = dict(shuffle=True)
        ours_ds = L.TensorDataset(torch.zeros(0, 2))
        theirs_ds = torch.utils.data.TensorDataset(torch.zeros(0, 2))
    with pytest.raises(Exception) as theirs:
        torch.utils.data.DataLoader(theirs_ds, **kw)
    with pytest.raises(type(theirs.value)) as ours:
        longshore.DataLoader(ours_ds, **kw)
    assert str(ours.value) == str(theirs.value)


def test_positional_arguments_are_torchs():
    torch = need_torch()
    ours_ds, theirs_ds = _datasets(torch)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    args = (4, True, None, None, 2, None, False, True, 0, None, None)
    ours = longshore.DataLoader(ours_ds, *args, g1)
    theirs = torch.utils.data.DataLoader(theirs_ds, *args, g2)
    for name in ("batch_size", "num_workers", "pin_memory", "drop_last", "timeout", "generator",
                 "prefetch_factor", "persistent_workers", "in_order", "pin_memory_device"):
        o, t = getattr(ours, name), getattr(theirs, name)
        assert (o is g1 and t is g2) if name == "generator" else o == t, name
    assert len(ours) == len(theirs) == 5
    got = [[t.clone() for t in b] for b in ours]
    want = list(theirs)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_attributes_are_torchs():
    torch = need_torch()
    from torch.utils import data as T

    ours_ds, theirs_ds = _datasets(torch)
    cases = [
        dict(),
        dict(shuffle=True, batch_size=3, drop_last=True),
        dict(batch_sampler=T.BatchSampler(T.SequentialSampler(range(20)), 6, False)),
        dict(sampler=range(20)),
        dict(num_workers=2, persistent_workers=True),
    ]
    for kw in cases:
        ours = longshore.DataLoader(ours_ds, **kw)
        theirs = T.DataLoader(theirs_ds, **kw)
        for name in ("batch_size", "drop_last", "num_workers", "prefetch_factor",
                     "persistent_workers", "timeout", "in_order", "pin_memory_device"):
            assert getattr(ours, name) == getattr(theirs, name), (kw, name)
        assert type(ours.sampler).__name__ == type(theirs.sampler).__name__
        assert type(ours.batch_sampler).__name__ == type(theirs.batch_sampler).__name__
        assert len(ours) == len(theirs)
        if "batch_sampler" in kw:
            assert ours.batch_sampler is kw["batch_sampler"]
        for name in ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
                     "persistent_workers"):
            with pytest.raises(ValueError) as t:
                setattr(theirs, name, None)
            with pytest.raises(ValueError) as o:
                setattr(ours, name, None)
            assert str(o.value).replace("DataLoader", "") == str(t.value).replace("DataLoader", "")
        ours.num_workers = ours.num_workers  # others may be set, as in torch


def test_default_collate_is_accepted():
    torch = need_torch()
    ours_ds, theirs_ds = _datasets(torch)
    dc = torch.utils.data.default_collate
    ours = longshore.DataLoader(ours_ds, batch_size=8, collate_fn=dc)
    theirs = torch.utils.data.DataLoader(theirs_ds, batch_size=8, collate_fn=dc)
    for a, b in zip(ours, theirs):
        assert all(torch.equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize(
    "kw, names",
    [
        (dict(collate_fn=lambda b: b), "collate_fn"),
        (dict(worker_init_fn=lambda i: None), "worker_init_fn"),
        (dict(num_workers=1, multiprocessing_context="spawn"), "multiprocessing_context"),
        (dict(pin_memory_device="xpu"), "pin_memory_device"),
        (dict(seed=1, generator="g"), "generator"),
    ],
)
def test_refusals_name_the_longshore_alternative(kw, names):
    ds = L.ArrayDataset(np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match=names):
        longshore.DataLoader(ds, **kw)


def test_pin_memory_device_cuda_is_accepted():
    ds = L.ArrayDataset(np.arange(8, dtype=np.float32).reshape(4, 2))
    for value in ("", "cuda", "cuda:0"):
        dl = longshore.DataLoader(ds, batch_size=2, pin_memory=True, pin_memory_device=value,
                                  framework="numpy")
        assert dl.pin_memory_device == value
        assert sum(len(b[0]) for b in dl) == 4


def test_unusable_datasets_are_refused_naming_longshores():
    with pytest.raises(TypeError, match="ArrayDataset"):
        longshore.DataLoader(object())


def test_on_sample_error_is_checked():
    ds = L.ArrayDataset(np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="on_sample_error"):
        longshore.DataLoader(ds, on_sample_error="ignore")
    assert len(list(longshore.DataLoader(ds, on_sample_error="skip", framework="numpy"))) == 4
