"""Numeric lifetime memory area ``g(s, o)`` and the service rate ``μ``, vectorised.

These are the fast numeric twins of the symbolic derivations in this package;
the tests check both against the defining sum of :func:`kvstab.model.tokens_held`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.workload import Workload

__all__ = ["g_exact", "g_continuous", "g_blocks", "lifetime_area", "expected_g", "mu_per_slot", "mu"]

Arr = npt.NDArray[np.int64]


def _n_chunks(s: Arr, chunk: int) -> Arr:
    return -(-s // chunk)


def g_exact(s: npt.ArrayLike, o: npt.ArrayLike, chunk: int) -> npt.NDArray[np.float64]:
    """Exact ``g`` for any ``s``: ``ŝ·n(n−1)/2 + s + s·o + o(o+1)/2``, ``n = ⌈s/ŝ⌉``."""
    s_ = np.asarray(s, dtype=np.int64)
    o_ = np.asarray(o, dtype=np.int64)
    n = _n_chunks(s_, chunk)
    return (chunk * n * (n - 1) // 2 + s_ + s_ * o_ + o_ * (o_ + 1) // 2).astype(np.float64)


def g_continuous(s: npt.ArrayLike, o: npt.ArrayLike, chunk: int) -> npt.NDArray[np.float64]:
    """The paper's form ``((1 + s/ŝ)·s + 2·o·s + (1 + o)·o) / 2`` (exact when ``ŝ | s``)."""
    s_ = np.asarray(s, dtype=np.float64)
    o_ = np.asarray(o, dtype=np.float64)
    return ((1.0 + s_ / chunk) * s_ + 2.0 * o_ * s_ + (1.0 + o_) * o_) / 2.0


def _block_prefix(N: Arr, B: int) -> Arr:
    """``Σ_{x=1}^{N} B·⌈x/B⌉`` for non-negative ``N``."""
    q, r = N // B, N % B
    return B * B * q * (q + 1) // 2 + r * B * (q + 1)


def g_blocks(s: npt.ArrayLike, o: npt.ArrayLike, chunk: int, block: int) -> npt.NDArray[np.float64]:
    """Exact ``g`` when memory is held in blocks of ``B`` tokens:
    ``Σ_c B⌈min(cŝ, s)/B⌉ + Σ_j B⌈(s + j)/B⌉``."""
    s_ = np.asarray(s, dtype=np.int64)
    o_ = np.asarray(o, dtype=np.int64)
    if block == 1:
        return g_exact(s_, o_, chunk)
    decode = _block_prefix(s_ + o_, block) - _block_prefix(s_, block)
    n = _n_chunks(s_, chunk)
    # prefill: full chunks c = 1..n-1 hold c·ŝ tokens, the last holds s
    prefill = block * (-(-s_ // block))
    nmax = int(n.max()) if n.size else 0
    for c in range(1, nmax):
        prefill = prefill + np.where(c < n, block * (-(-(c * chunk) // block)), 0)
    return (prefill + decode).astype(np.float64)


def lifetime_area(s: npt.ArrayLike, o: npt.ArrayLike, params: ModelParams) -> npt.NDArray[np.float64]:
    """``g(s, o)`` under the convention and block size in ``params``."""
    if params.g == "continuous":
        if params.block != 1:
            raise InvalidArgument("the continuous g convention has no block-granular form; use g='exact' with B > 1")
        return g_continuous(s, o, params.chunk)
    return g_blocks(s, o, params.chunk, params.block)


def expected_g(workload: Workload, params: ModelParams) -> float:
    """``E[g(s, o)]`` exactly: by enumeration of the support for independent
    marginals, by the mean over rows for a joint empirical law."""
    if workload.s is not None and workload.o is not None:
        sv, sp = workload.s.support()
        ov, op = workload.o.support()
        if params.block == 1 or params.g == "continuous":
            # for B = 1 the form is separable, g(s, o) = g(s, 0) + g(0, o) + s·o,
            # so E[g] needs only marginal expectations, not the pair grid
            zs, zo = np.zeros_like(sv), np.zeros_like(ov)
            return float(
                lifetime_area(sv, zs, params) @ sp + lifetime_area(zo, ov, params) @ op + (sv @ sp) * (ov @ op)
            )
        grid_s, grid_o = np.meshgrid(sv, ov, indexing="ij")
        return float((lifetime_area(grid_s.ravel(), grid_o.ravel(), params).reshape(grid_s.shape) * np.outer(sp, op)).sum())
    assert workload.joint_s is not None and workload.joint_o is not None
    return float(lifetime_area(workload.joint_s, workload.joint_o, params).mean())



def mu_per_slot(workload: Workload, params: ModelParams) -> float:
    """``M / E[g]``: requests served per slot at saturation (the paper's ``μ·b̄``)."""
    return params.M / expected_g(workload, params)


def mu(workload: Workload, params: ModelParams, bbar: float) -> float:
    """``μ = M / (b̄·E[g])`` in requests per second."""
    if not (bbar > 0):
        raise InvalidArgument(f"batch time b̄ must be > 0 seconds, got {bbar!r}")
    return mu_per_slot(workload, params) / bbar
