"""Shared fixtures: small .npy and record files, and the CUDA/torch gates.

CUDA tests skip (saying why) without torch or a GPU, and fail instead when
LONGSHORE_REQUIRE_CUDA=1 is set, like the Rust test suites.
"""
import os

import numpy as np
import pytest

import longshore

REQUIRE_CUDA = os.environ.get("LONGSHORE_REQUIRE_CUDA") == "1"


def torch_or_none():
    try:
        import torch

        return torch
    except ImportError:
        return None


def need_torch():
    torch = torch_or_none()
    if torch is None:
        if REQUIRE_CUDA:
            pytest.fail("LONGSHORE_REQUIRE_CUDA=1 but torch cannot be imported")
        pytest.skip("torch is not installed")
    return torch


def need_cuda():
    torch = need_torch()
    ok, why = longshore.cuda_status()
    if not torch.cuda.is_available() or not ok:
        reason = why or "torch.cuda.is_available() is False"
        if REQUIRE_CUDA:
            pytest.fail(f"LONGSHORE_REQUIRE_CUDA=1 but CUDA cannot be used: {reason}")
        pytest.skip(f"no CUDA: {reason}")
    return torch


@pytest.fixture
def files(tmp_path):
    """x: f32 [100, 5] (x[i, j] = 10 i + j), y: i64 [100] (y[i] = i), img: u8 [12, 3, 4, 4]."""
    x = (10 * np.arange(100)[:, None] + np.arange(5)[None, :]).astype(np.float32)
    y = np.arange(100, dtype=np.int64)
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(12, 3, 4, 4), dtype=np.uint8)
    paths = {}
    for name, arr in (("x", x), ("y", y), ("img", img)):
        p = tmp_path / f"{name}.npy"
        np.save(p, arr)
        paths[name] = str(p)
    paths["arrays"] = {"x": x, "y": y, "img": img}
    paths["dir"] = tmp_path
    return paths


def fresh_env():
    """The environment for a fresh interpreter that imports the `longshore` these tests import.

    The package's directory goes first on `PYTHONPATH`: the source tree's `python/` has no
    compiled extension where the suite runs against an installed wheel, so naming it would
    import a package without `_longshore`.
    """
    here = os.path.dirname(os.path.dirname(os.path.abspath(longshore.__file__)))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([here] + rest))


def run_fresh(snippet, cwd):
    """Runs ``snippet`` in a fresh interpreter (no warm thread pools or caches) importing the
    ``longshore`` these tests import, in ``cwd``; returns its standard output (its exit status
    checked, its standard error shown on failure)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", snippet], cwd=cwd, env=fresh_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def interrupted(make, before, after, k, read):
    """An uninterrupted epoch of ``make(before)``, and the same epoch checkpointed after ``k``
    batches of ``make(before)`` and resumed by ``make(after, seed=99)`` (the checkpoint's order,
    not that seed's): ``(full, taken, rest)``, each read by ``read`` from a list of batches."""
    full = read(make(before))
    first = make(before)
    it = iter(first)
    taken = read([next(it) for _ in range(k)])
    state = first.state_dict()
    it.close()
    resumed = make(after, seed=99)
    resumed.load_state_dict(state)
    return full, taken, read(resumed)


def guide_python(page, heading):
    """The one Python example of section ``heading`` (``"## ..."``) of ``docs/guide/<page>``,
    as code to run."""
    guide = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "guide", page)
    with open(guide) as f:
        text = f.read()
    section = text[text.index(heading):]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    blocks = section.split("```python\n")[1:]
    assert len(blocks) == 1, f"one Python example in {page}'s {heading!r}"
    return compile(blocks[0].split("```")[0], page, "exec")
