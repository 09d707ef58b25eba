"""PyTorch's worker contract, kept under stress, for a Python dataset in worker processes:

* workers set up as torch's worker loop sets them up (one torch thread, BLAS limited, seeds,
  get_worker_info), with fork, spawn and forkserver;
* any worker's death (an exit code, SIGKILL, a segfault), at every worker index, with each
  start method and ``timeout=0``, is a ``LoaderError`` naming the worker, its pid, how it
  ended and the samples it held, and the next epoch starts new workers;
* no worker process, pipe or memory file outlives an epoch (without persistent workers), an
  iterator dropped half way, the loader, the interpreter, or a killed main process;
* torch's behaviours: ``batch_size=None``, ``len()`` of iterable datasets, DataPipes sharded
  per worker and shuffled, ``DataLoader[T]``, any tensor a ``collate_fn`` returns, no pickling
  at ``num_workers=0``, an error batch and then the next, ``len`` following a growing dataset,
  the too-many-workers warning, ``LoaderTimeout`` a ``RuntimeError``, ``worker_init_fn``'s
  exception re-raised, torch's type check of ``multiprocessing_context``, advice when out of
  file descriptors;
* a torchvision ImageFolder with torchvision's transforms in a fresh interpreter delivers its
  first batch (it stalled when each worker ran torch's full thread pool).

Each scenario that could hang runs in a subprocess with a bound, so a hang fails the test.
"""
import collections
import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import longshore
from conftest import need_torch
from test_python_datasets import assert_same

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = multiprocessing.get_all_start_methods()


def run_script(body, timeout=240, env=None):
    """Runs ``body`` in a fresh interpreter (this folder importable), failing the test on a
    non-zero exit or when it runs past ``timeout`` (a hang). Returns its stdout."""
    script = textwrap.dedent(body)
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    full_env.update(env or {})
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=timeout, env=full_env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the script hung for {timeout} s; its output so far:\n{e.stdout}\n{e.stderr}")
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


# ---------------------------------------------------------------------------------------------
# Workers set up as torch's are.

class Setup:
    """Each sample reports its worker's set-up: torch's thread count, OMP_NUM_THREADS, the
    worker id (longshore's and torch's) and its seeded draws."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        import random

        import torch

        info = torch.utils.data.get_worker_info()
        own = longshore.get_worker_info()  # None in torch's own workers
        return np.array([i, torch.get_num_threads(), int(os.environ.get("OMP_NUM_THREADS", 0)),
                         info.id, info.id if own is None else own.id,
                         random.randrange(2**30), np.random.randint(2**30),
                         int(torch.randint(2**30, ()))], dtype=np.int64)


@pytest.mark.parametrize("method", METHODS)
def test_workers_run_one_torch_thread_and_torchs_seeds(method):
    torch = need_torch()
    torch.manual_seed(4)
    ours = torch.cat(list(longshore.DataLoader(Setup(), batch_size=2, num_workers=2,
                                               multiprocessing_context=method)))
    assert (ours[:, 1] == 1).all(), f"torch threads per worker: {ours[:, 1].tolist()}"
    assert (ours[:, 2] == 1).all(), f"OMP_NUM_THREADS in workers: {ours[:, 2].tolist()}"
    assert (ours[:, 3] == ours[:, 4]).all()
    assert sorted(set(ours[:, 3].tolist())) == [0, 1]
    torch.manual_seed(4)
    theirs = torch.cat(list(torch.utils.data.DataLoader(Setup(), batch_size=2, num_workers=2,
                                                        multiprocessing_context=method)))
    # random, NumPy and torch seeded per worker as torch seeds them: the same draws.
    assert torch.equal(ours[:, [0, 3, 5, 6, 7]], theirs[:, [0, 3, 5, 6, 7]])


# ---------------------------------------------------------------------------------------------
# Dead workers: every start method, every worker index, every way of dying, timeout=0.

DYING = """
import os, signal, ctypes, time
import numpy as np
import longshore

class Dying:
    '''Worker `victim` dies (once: a marker file) when it loads sample `at` or later.'''
    def __init__(self, victim, how, marker):
        self.victim, self.how, self.marker = victim, how, marker
    def __len__(self):
        return 48
    def __getitem__(self, i):
        info = longshore.get_worker_info()
        if info.id == self.victim and i >= 12 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            if self.how == "exit":
                os._exit(3)
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            ctypes.string_at(0)  # a segfault
        return np.array([i])
"""


def test_a_dead_worker_is_an_error_for_every_start_method_index_and_way(tmp_path):
    (tmp_path / "dying.py").write_text(DYING)
    out = run_script(f"""
        import os, sys, time
        sys.path.insert(0, {str(tmp_path)!r})
        import numpy as np
        import longshore
        from dying import Dying
        expect = {{"exit": "exited with code 3", "kill": "killed by signal 9 (SIGKILL)",
                   "segv": "killed by signal 11 (SIGSEGV)"}}
        for method in {METHODS!r}:
            for how in ("exit", "kill", "segv"):
                for victim in range(3):
                    marker = os.path.join({str(tmp_path)!r}, f"{{method}}-{{how}}-{{victim}}")
                    dl = longshore.DataLoader(Dying(victim, how, marker), batch_size=4,
                                              num_workers=3, framework="numpy", timeout=0,
                                              multiprocessing_context=method)
                    got, err = [], None
                    try:
                        for b in dl:
                            got.append(b)
                    except longshore.LoaderError as e:
                        err = e
                    died = os.path.getmtime(marker)
                    late = time.time() - died
                    where = f"{{method}} {{how}} worker {{victim}}"
                    assert err is not None, f"{{where}}: no error, {{len(got)}} batches"
                    msg = str(err)
                    assert f"DataLoader worker {{victim}} (pid " in msg, (where, msg)
                    assert expect[how] in msg and "samples [" in msg, (where, msg)
                    assert late < 30, (where, late)
                    # The next epoch starts new workers and delivers every sample.
                    again = np.concatenate(list(dl)).ravel().tolist()
                    assert again == list(range(48)), (where, again)
                    print(f"{{where}}: error {{late:.2f}} s after the death")
                    del dl
        print("ok")
    """, timeout=600)
    assert out.rstrip().endswith("ok"), out
    print(out)  # how long after each death its error came (pytest -s shows it)


def test_a_dead_worker_ends_a_persistent_epoch_and_is_replaced(tmp_path):
    (tmp_path / "dying.py").write_text(DYING)
    sys.path.insert(0, str(tmp_path))
    try:
        from dying import Dying
    finally:
        sys.path.remove(str(tmp_path))
    dl = longshore.DataLoader(Dying(1, "kill", str(tmp_path / "m")), batch_size=4,
                              num_workers=2, framework="numpy", persistent_workers=True)
    with pytest.raises(longshore.LoaderError, match="killed by signal 9"):
        list(dl)
    assert np.concatenate(list(dl)).ravel().tolist() == list(range(48))
    assert np.concatenate(list(dl)).ravel().tolist() == list(range(48))


# ---------------------------------------------------------------------------------------------
# Process hygiene: nothing outlives its epoch, iterator, loader, interpreter or main process.

class Rows:
    def __init__(self, n=64, delay=0.0):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        return np.full(16, i, dtype=np.float32)


def children():
    """Pids of this process's live worker processes: its children, and the fork server's
    (forkserver's workers are its children), less multiprocessing's helpers (the resource
    tracker, the fork server)."""
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if rest[0] != "Z":
            procs[int(name)] = (int(rest[1]), cmd)
    me = os.getpid()
    servers = {pid for pid, (ppid, cmd) in procs.items() if ppid == me and b"forkserver" in cmd}
    return {pid for pid, (ppid, cmd) in procs.items()
            if ppid in servers or (ppid == me and b"resource_tracker" not in cmd
                                   and b"forkserver" not in cmd)}


def fds():
    return sorted(os.listdir("/proc/self/fd"))


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("method", METHODS)
def test_workers_end_with_each_epoch_iterator_and_loader(method):
    dl = longshore.DataLoader(Rows(), batch_size=4, num_workers=3, framework="numpy",
                              multiprocessing_context=method)
    list(dl)  # warm: helpers a start method keeps (resource tracker, fork server) start now
    gc.collect()
    procs, open_fds = children(), fds()
    # A whole epoch.
    assert len(list(dl)) == 16
    assert children() == procs and fds() == open_fds
    # An iterator dropped half way.
    it = iter(dl)
    next(it)
    workers = set(dl._python.workers.pids())
    assert len(workers) == 3 and workers <= children()
    del it
    gc.collect()
    assert children() == procs, children() - procs
    assert fds() == open_fds
    # Persistent workers end with the loader.
    pl = longshore.DataLoader(Rows(), batch_size=4, num_workers=3, framework="numpy",
                              multiprocessing_context=method, persistent_workers=True)
    list(pl)
    list(pl)
    assert len(children() - procs) == 3
    del pl
    gc.collect()
    assert children() == procs, children() - procs
    assert fds() == open_fds


def test_workers_end_with_the_interpreter_and_with_a_killed_main_process(tmp_path):
    for method in METHODS:
        # At exit, with an epoch half read.
        out = run_script(f"""
            import longshore, numpy as np
            from test_contract import Rows
            dl = longshore.DataLoader(Rows(), batch_size=4, num_workers=3, framework="numpy",
                                      multiprocessing_context={method!r})
            it = iter(dl)
            next(it)
            print(" ".join(map(str, dl._python.workers.pids())))
        """, timeout=120)
        pids = [int(p) for p in out.split()]
        assert len(pids) == 3
        assert not any(alive(p) for p in pids), (method, [p for p in pids if alive(p)])
        # SIGKILL of the main process while its workers load (slowly).
        script = textwrap.dedent(f"""
            import sys, time, longshore, numpy as np
            from test_contract import Rows
            dl = longshore.DataLoader(Rows(n=4000, delay=0.05), batch_size=4, num_workers=3,
                                      framework="numpy", multiprocessing_context={method!r})
            it = iter(dl)
            next(it)
            print(" ".join(map(str, dl._python.workers.pids())), flush=True)
            time.sleep(600)
        """)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env=env)
        try:
            pids = [int(x) for x in p.stdout.readline().split()]
        finally:
            p.kill()
            p.wait()
        assert len(pids) == 3, method
        deadline = time.monotonic() + 20
        while any(alive(q) for q in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(q) for q in pids), (method, [q for q in pids if alive(q)])


# ---------------------------------------------------------------------------------------------
# torch's behaviours.

class Pairs:
    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(3, i, dtype=np.float32), "i": i, "name": f"s{i}"}


try:
    import torch as _torch

    _Iterable = _torch.utils.data.IterableDataset
except ImportError:
    _Iterable = object


class Stream(_Iterable):
    """An iterable dataset sharded by worker (a torch IterableDataset, so that torch's loader
    iterates it too); SizedStream has ``__len__``."""

    def __init__(self, n=10):
        self.n = n

    def __iter__(self):
        import torch

        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield np.full(2, i, dtype=np.int64), i


class SizedStream(Stream):
    def __len__(self):
        return self.n


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_size_none_yields_samples_as_torch(workers):
    torch = need_torch()
    for ds in (Pairs(), SizedStream()):
        ours = list(longshore.DataLoader(ds, batch_size=None, num_workers=workers))
        theirs = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers))
        key = (lambda s: s["i"]) if isinstance(ds, Pairs) else (lambda s: s[1])
        ours.sort(key=key)
        theirs.sort(key=key)
        assert len(ours) == len(theirs) == 10
        for k, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"sample {k}")
    with pytest.raises(ValueError, match="mutually exclusive with drop_last"):
        longshore.DataLoader(Pairs(), batch_size=None, drop_last=True)
    # A longshore dataset too: each sample without a batch dimension.
    arr = longshore.data.ArrayDataset(np.arange(12, dtype=np.float32).reshape(6, 2))
    got = list(longshore.DataLoader(arr, batch_size=None, framework="numpy"))
    assert len(got) == 6 and got[0][0].shape == (2,)
    np.testing.assert_array_equal(np.stack([g[0] for g in got]),
                                  np.arange(12, dtype=np.float32).reshape(6, 2))


def test_len_of_an_iterable_dataset_is_torchs():
    torch = need_torch()
    for bs, drop in ((3, False), (3, True), (None, False)):
        ours = longshore.DataLoader(SizedStream(10), batch_size=bs, drop_last=drop)
        theirs = torch.utils.data.DataLoader(SizedStream(10), batch_size=bs, drop_last=drop)
        assert len(ours) == len(theirs)
    unsized = longshore.DataLoader(Stream(10), batch_size=3, num_workers=2)
    with pytest.raises(TypeError):
        len(unsized)
    assert sum(len(b[1]) for b in list(unsized)) == 10  # list() passes over the TypeError


def _datapipe(torch, n=20):
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(n)).shuffle().sharding_filter()


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_an_iterdatapipe_is_sharded_per_worker_and_shuffled(workers):
    torch = need_torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp = _datapipe(torch)
        plain = [int(v) for b in longshore.DataLoader(dp, batch_size=4, num_workers=workers)
                 for v in b]
        assert sorted(plain) == list(range(20)), plain  # each element once, never twice
        torch.manual_seed(0)
        shuffled = [int(v) for b in longshore.DataLoader(_datapipe(torch), batch_size=4,
                                                         shuffle=True, num_workers=workers)
                    for v in b]
        assert sorted(shuffled) == list(range(20))
        torch.manual_seed(0)
        again = [int(v) for b in longshore.DataLoader(_datapipe(torch), batch_size=4,
                                                      shuffle=True, num_workers=workers)
                 for v in b]
        assert shuffled == again  # seeded from torch's generator, as torch's loader seeds it
        torch.manual_seed(0)
        theirs = [int(v) for b in torch.utils.data.DataLoader(_datapipe(torch), batch_size=4,
                                                              shuffle=True,
                                                              num_workers=workers)
                  for v in b]
        assert sorted(theirs) == sorted(shuffled)
        if workers <= 1:
            assert shuffled == theirs


def test_dataloader_is_generic():
    assert longshore.DataLoader[int] is not None
    assert longshore.DataLoader[int].__origin__ is longshore.DataLoader


class Weird:
    """Samples a collate_fn turns into tensors the shared slot cannot carry."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return i


class Tagged(np.ndarray):
    pass


def weird_collate(batch):
    import torch

    n = len(batch)
    dense = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4)
    return {
        "sparse": dense.to_sparse(),
        "nested": torch.nested.nested_tensor([torch.ones(k + 1) for k in range(n)]),
        "strided": dense.t(),  # non-contiguous
        "complex": torch.ones(n, dtype=torch.complex64) * batch[0],
        "param": torch.nn.Parameter(torch.ones(2), requires_grad=False),
        "ids": batch,
    }


@pytest.mark.parametrize("workers", [0, 2])
def test_any_tensor_a_collate_fn_returns_arrives(workers):
    torch = need_torch()
    ours = list(longshore.DataLoader(Weird(), batch_size=3, num_workers=workers,
                                     collate_fn=weird_collate))
    theirs = list(torch.utils.data.DataLoader(Weird(), batch_size=3, num_workers=workers,
                                              collate_fn=weird_collate))
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs):
        assert a["sparse"].is_sparse and torch.equal(a["sparse"].to_dense(), b["sparse"].to_dense())
        assert a["nested"].is_nested
        assert all(torch.equal(p, q) for p, q in zip(a["nested"].unbind(), b["nested"].unbind()))
        assert torch.equal(a["strided"], b["strided"])
        assert torch.equal(a["complex"], b["complex"])
        assert type(a["param"]) is torch.nn.Parameter
        assert a["ids"] == b["ids"]


@pytest.mark.parametrize("workers", [0, 2])
def test_default_collate_refuses_sparse_batches_as_torch(workers):
    torch = need_torch()

    class Sparse:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.eye(2).to_sparse()

    with pytest.raises(RuntimeError, match="sparse tensors are not currently supported"):
        list(longshore.DataLoader(Sparse(), batch_size=2, num_workers=workers))


class Outer:
    # A namedtuple class inside a class body: pickle cannot find it by its name.
    Inner = collections.namedtuple("Inner", ["a", "b"])

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return Outer.Inner(a=i, b=np.float32(i))


def test_num_workers_0_does_not_pickle_batches():
    need_torch()
    got = list(longshore.DataLoader(Outer(), batch_size=2))
    assert [type(b).__name__ for b in got] == ["Inner", "Inner"]
    assert got[1].a.tolist() == [2, 3]


class FailsAt:
    def __init__(self, bad):
        self.bad = bad

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i in self.bad:
            raise KeyError(f"no sample {i}")
        return np.array([i])


@pytest.mark.parametrize("workers", [0, 2])
def test_after_a_failed_batch_the_next_one_comes(workers):
    torch = need_torch()

    def drain(dl):
        out, it = [], iter(dl)
        while True:
            try:
                out.append([int(v) for v in next(it).ravel()])
            except StopIteration:
                return out
            except KeyError as e:
                out.append(type(e).__name__)

    ours = drain(longshore.DataLoader(FailsAt({5, 13}), batch_size=4, num_workers=workers))
    theirs = drain(torch.utils.data.DataLoader(FailsAt({5, 13}), batch_size=4,
                                               num_workers=workers))
    assert ours == theirs
    assert ours[1] == "KeyError" and ours[3] == "KeyError" and ours[4] == [16, 17, 18, 19]


class Growing:
    def __init__(self):
        self.n = 8

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.array([i])


@pytest.mark.parametrize("kw", [dict(), dict(shuffle=True), dict(shuffle=True, seed=3)])
def test_len_follows_a_growing_dataset(kw):
    need_torch()
    ds = Growing()
    dl = longshore.DataLoader(ds, batch_size=4, **kw)
    assert len(dl) == 2 and sorted(int(v) for b in dl for v in b) == list(range(8))
    ds.n = 12
    assert len(dl) == 3
    assert sorted(int(v) for b in dl for v in b) == list(range(12))


def test_too_many_workers_warn_in_torchs_words():
    cpus = len(os.sched_getaffinity(0))
    dl = longshore.DataLoader(Rows(8), batch_size=4, num_workers=cpus + 1, framework="numpy")
    with pytest.warns(UserWarning, match=f"will create {cpus + 1} worker processes in total"):
        list(dl)


class Slow:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        time.sleep(30)
        return np.array([i])


def test_a_timeout_is_a_runtime_error_naming_the_workers():
    dl = longshore.DataLoader(Slow(), batch_size=2, num_workers=2, timeout=0.5,
                              framework="numpy")
    start = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        list(dl)
    assert isinstance(e.value, longshore.LoaderTimeout) and isinstance(e.value, TimeoutError)
    assert "pid" in str(e.value) and "timed out" in str(e.value), str(e.value)
    assert time.monotonic() - start < 20  # the slow workers are ended, not waited for


def failing_init(worker_id):
    raise ValueError(f"worker {worker_id} cannot start: no credentials")


@pytest.mark.parametrize("method", METHODS)
def test_worker_init_fns_exception_is_reraised_with_its_traceback(method):
    dl = longshore.DataLoader(Rows(8), batch_size=4, num_workers=2, framework="numpy",
                              worker_init_fn=failing_init, multiprocessing_context=method)
    with pytest.raises(ValueError) as e:
        list(dl)
    msg = str(e.value)
    assert "no credentials" in msg and "failing_init" in msg and "Traceback" in msg, msg


def test_multiprocessing_context_is_type_checked_as_torch():
    with pytest.raises(TypeError, match="valid context object"):
        longshore.DataLoader(Rows(8), num_workers=1, multiprocessing_context=object())
    with pytest.raises(ValueError, match="valid start method"):
        longshore.DataLoader(Rows(8), num_workers=1, multiprocessing_context="nope")


def test_out_of_file_descriptors_says_what_to_do():
    out = run_script("""
        import resource, longshore, numpy as np
        from test_contract import Rows
        import os
        used = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (used + 6, used + 6))
        try:
            list(longshore.DataLoader(Rows(64), batch_size=4, num_workers=8,
                                      framework="numpy"))
        except OSError as e:
            print("ERR", e)
    """, timeout=120)
    assert "ERR" in out and "ulimit -n" in out, out


# ---------------------------------------------------------------------------------------------
# The user's path in a fresh interpreter: torchvision's ImageFolder and transforms.

def test_torchvision_imagefolder_in_a_fresh_process_delivers(tmp_path):
    need_torch()
    pytest.importorskip("torchvision")
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(2):
        d = tmp_path / f"class{c}"
        d.mkdir()
        for k in range(24):
            Image.fromarray(rng.integers(0, 255, (64, 80, 3), dtype=np.uint8)).save(
                d / f"{k}.jpg")
    for method in METHODS:
        out = run_script(f"""
            import time
            start = time.monotonic()
            import torch, torchvision, longshore
            from torchvision import transforms as T
            tf = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.ToTensor(),
                            T.Normalize([0.5] * 3, [0.25] * 3)])
            ds = torchvision.datasets.ImageFolder({str(tmp_path)!r}, tf)
            dl = longshore.DataLoader(ds, batch_size=8, num_workers=4, shuffle=True,
                                      multiprocessing_context={method!r})
            it = iter(dl)
            x, y = next(it)
            first = time.monotonic() - start
            n = len(y) + sum(len(b[1]) for b in it)
            assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32, x.shape
            assert n == 48, n
            print(f"first batch after {{first:.2f}} s")
        """, timeout=240)
        assert "first batch after" in out, out


class Named:
    def __len__(self):
        return 30

    def __getitem__(self, i):
        time.sleep(0.02 if i // 2 % 3 == 0 else 0.0)  # worker 0's batches come late
        return {"name": f"s{i}", "i": i}


def test_worker_threads_keep_each_batch_with_its_own_values():
    """Batches made in this process keep their non-tensor values by token: one count for all
    worker threads, so no batch is rebuilt with another thread's values."""
    need_torch()
    for _ in range(5):
        dl = longshore.DataLoader(Named(), batch_size=2, num_workers=3, worker_mode="thread",
                                  in_order=False)
        for b in dl:
            assert b["name"] == [f"s{i}" for i in b["i"].tolist()], b
