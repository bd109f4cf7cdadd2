"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstab.data import data_dir as _shipped_data_dir


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The data kvstab ships (``kvstab/data``, or ``$KVSTAB_DATA``)."""
    d = _shipped_data_dir()
    assert (d / "traces").is_dir(), f"kvstab's data folder {d} has no traces/"
    return d


def _warm_engine() -> None:
    """The compiled engine of the built-ins (``_kernel.run_builtins``, with lookahead's finish tree)."""
    from kvstab.arrivals import fixed_arrivals
    from kvstab.engine import run
    from kvstab.model import ModelParams
    from kvstab.registry import load_scheduler

    run(load_scheduler("current-fit"), ModelParams(M=64, chunk=8), fixed_arrivals([(0, 5, 3), (1, 9, 4)]), 20)


def _warm_sglang() -> None:
    """sglang's compiled engine (``_kernel_sglang.run_sglang``)."""
    from kvstab.arrivals import fixed_arrivals
    from kvstab.engine import run
    from kvstab.model import ModelParams
    from kvstab.registry import load_scheduler

    run(load_scheduler("sglang"), ModelParams(M=64, chunk=8), fixed_arrivals([(0, 5, 3), (1, 9, 4)]), 20)


def _warm_plugin() -> None:
    """The plug-in path's loop (``_plugin_kernel``): a rule the engine has no compiled path for."""
    from kvstab.arrivals import fixed_arrivals
    from kvstab.engine import run
    from kvstab.model import ModelParams
    from kvstab.schedulers.current_fit import CurrentFit

    class _Outside(CurrentFit):
        """current-fit under another class: the engine does not know it, so it tapes it."""

    run(_Outside(), ModelParams(M=64, chunk=8), fixed_arrivals([(0, 5, 3), (1, 9, 4)]), 20_000, engine="fast")


@pytest.fixture(scope="session", autouse=True)
def _each_kernel_compiled_once() -> None:
    """On a cold numba cache every pytest-xdist worker would compile each kernel itself (about
    105 s of CPU: the engine 47 s, sglang's 39 s, the plug-in loop 20 s, measured from an empty
    cache) — the same work once per worker.  Here each kernel is compiled under a lock of its own,
    the workers taking them in different orders, so each is compiled once and the other workers
    load it from the cache when the lock is theirs.  Warm, this costs a few loads per worker."""
    import hashlib
    import os
    import tempfile

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return
    try:
        import fcntl
    except ImportError:  # no flock (Windows): each worker compiles what it needs, as without xdist
        return
    from kvstab.engine import _kernel

    if not _kernel.HAVE_NUMBA:
        return
    jobs = [_warm_engine, _warm_sglang, _warm_plugin]
    k = int(worker.removeprefix("gw") or 0) % len(jobs)
    # one lock per kernel and checkout (the cache sits beside the source)
    tag = hashlib.sha256(str(Path(_kernel.__file__).resolve().parent).encode()).hexdigest()[:12]
    for job in jobs[k:] + jobs[:k]:
        with open(Path(tempfile.gettempdir()) / f"kvstab-{job.__name__}-{tag}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            job()
