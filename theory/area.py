"""Numeric lifetime memory area ``g(s, o)``, ``E[g]`` and ``μ``, vectorised with numpy.

These are the fast twins of the symbolic derivations: the per-request forms and
the moment formula for ``E[g]`` are printed by sympy from the expressions of
:mod:`kvstab.theory.g` and :mod:`kvstab.theory.moments` into the generated
module :mod:`kvstab.theory._forms` (see :mod:`kvstab.theory.codegen`; a test
fails when it is stale), so the numbers cannot drift from the derivation and
evaluating them needs numpy only.  The tests also check them against the
defining sum of :func:`kvstab.model.tokens_held`.

Costs: a joint empirical law (a trace's rows) is a handful of array passes over
the rows; independent marginals never build the ``(s, o)`` grid — for ``B = 1``
``E[g]`` is a function of marginal moments, and for ``B > 1`` the one term that
couples ``s`` and ``o`` (the rounding of ``s + j``) is a correlation of two
dense vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.theory import _forms
from kvstab.workload import Workload

__all__ = [
    "g_exact",
    "g_continuous",
    "g_blocks",
    "lifetime_area",
    "Moments",
    "workload_moments",
    "expected_g",
    "expected_reserve_area",
    "peak_tokens",
    "mu_per_slot",
    "mu",
]

IntArr = npt.NDArray[np.int64]
FloatArr = npt.NDArray[np.float64]


def _ints(name: str, v: npt.ArrayLike) -> IntArr:
    """``v`` as int64 lengths; integer-valued floats are accepted, anything else
    (fractions, values below 1) is an :class:`InvalidArgument`."""
    arr = np.asarray(v)
    if arr.size == 0:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.issubdtype(arr.dtype, np.floating) or not np.all(np.isfinite(arr) & (arr == np.floor(arr))):
            raise InvalidArgument(f"{name} must hold integer lengths >= 1, got dtype {arr.dtype}")
    if arr.min() < 1:
        raise InvalidArgument(f"{name} must hold integer lengths >= 1, found {arr.min()!r}")
    return arr.astype(np.int64, copy=False)


def _n_chunks(s: IntArr, chunk: int) -> IntArr:
    return -(-s // chunk)


def g_exact(s: npt.ArrayLike, o: npt.ArrayLike, chunk: int) -> FloatArr:
    """Exact ``g`` for any ``s``: ``ŝ·n(n−1)/2 + s + s·o + o(o+1)/2``, ``n = ⌈s/ŝ⌉``."""
    s_, o_ = _ints("s", s), _ints("o", o)
    return np.asarray(_forms.g_exact(s_, o_, chunk, _n_chunks(s_, chunk)), dtype=np.float64)


def g_continuous(s: npt.ArrayLike, o: npt.ArrayLike, chunk: int) -> FloatArr:
    """The paper's form ``((1 + s/ŝ)·s + 2·o·s + (1 + o)·o) / 2`` (exact when ``ŝ | s``)."""
    s_, o_ = _ints("s", s), _ints("o", o)
    return np.asarray(_forms.g_continuous(s_, o_, chunk), dtype=np.float64)


def _block_prefix(N: IntArr, B: int) -> FloatArr:
    """``F(N) = Σ_{x=1}^{N} B·⌈x/B⌉`` for non-negative ``N``."""
    return np.asarray(_forms.block_prefix(N // B, N % B, B), dtype=np.float64)


def _full_chunk_table(nmax: int, chunk: int, block: int) -> FloatArr:
    """``T[m] = Σ_{c=1}^{m} B·⌈c·ŝ/B⌉`` for ``m = 0 … nmax``: what the full chunks
    of a prompt with ``m + 1`` chunks hold over prefill."""
    c = np.arange(1, nmax + 1, dtype=np.int64)
    return np.concatenate(([0.0], np.cumsum(block * (-(-(c * chunk) // block))).astype(np.float64)))


def g_blocks(s: npt.ArrayLike, o: npt.ArrayLike, chunk: int, block: int) -> FloatArr:
    """Exact ``g`` when memory is held in blocks of ``B`` tokens:
    ``Σ_c B⌈min(cŝ, s)/B⌉ + Σ_j B⌈(s + j)/B⌉``.

    The last chunk (holding ``s``) and the decode steps (``s + 1 … s + o``) are
    ``o + 1`` consecutive counts: ``F(s + o) − F(s − 1)``; the full chunks come
    from a prefix table over the chunk index.  No loop over requests.
    """
    s_, o_ = _ints("s", s), _ints("o", o)
    if block == 1:
        return g_exact(s_, o_, chunk)
    n = _n_chunks(s_, chunk)
    table = _full_chunk_table(int(n.max()) if n.size else 0, chunk, block)
    return table[n - 1] + _block_prefix(s_ + o_, block) - _block_prefix(s_ - 1, block)


def lifetime_area(s: npt.ArrayLike, o: npt.ArrayLike, params: ModelParams) -> FloatArr:
    """``g(s, o)`` under the convention and block size in ``params``."""
    if params.g == "continuous":
        if params.block != 1:
            raise InvalidArgument("the continuous g convention has no block-granular form; use g='exact' with B > 1")
        return g_continuous(s, o, params.chunk)
    return g_blocks(s, o, params.chunk, params.block)


def peak_tokens(total: npt.ArrayLike, block: int) -> IntArr:
    """Peak memory of a request of ``s + o = total`` tokens: ``B·⌈total/B⌉``
    (the same rounding as :func:`kvstab.model.tokens_held`)."""
    t = np.asarray(total, dtype=np.int64)
    return block * (-(-t // block))


@dataclass(frozen=True, slots=True)
class Moments:
    """The moments ``E[g]`` depends on, for a given chunk ``ŝ`` (``n = ⌈s/ŝ⌉``)."""

    Es: float
    Es2: float
    Eo: float
    Eo2: float
    Eso: float
    En: float
    En2: float
    Esn: float
    chunk: int

    @property
    def cov(self) -> float:
        """``Cov(s, o) = E[s·o] − E[s]·E[o]``."""
        return self.Eso - self.Es * self.Eo

    def corr(self) -> float:
        """The correlation coefficient of ``s`` and ``o`` (0 when one is constant)."""
        vs, vo = self.Es2 - self.Es**2, self.Eo2 - self.Eo**2
        return 0.0 if vs <= 0 or vo <= 0 else self.cov / float(np.sqrt(vs * vo))


def workload_moments(workload: Workload, chunk: int) -> Moments:
    """The moments of ``s``, ``o`` and ``n(s) = ⌈s/ŝ⌉`` under ``workload``."""
    if workload.s is not None and workload.o is not None:
        sv, sp_ = workload.s.support()
        ov, op = workload.o.support()
        sf, of = sv.astype(np.float64), ov.astype(np.float64)
        nf = _n_chunks(sv, chunk).astype(np.float64)
        Es, Eo = float(sf @ sp_), float(of @ op)
        return Moments(
            Es,
            float(sf**2 @ sp_),
            Eo,
            float(of**2 @ op),
            Es * Eo,
            float(nf @ sp_),
            float(nf**2 @ sp_),
            float((sf * nf) @ sp_),
            chunk,
        )
    assert workload.joint_s is not None and workload.joint_o is not None
    sf = workload.joint_s.astype(np.float64)
    of = workload.joint_o.astype(np.float64)
    nf = _n_chunks(workload.joint_s, chunk).astype(np.float64)
    return Moments(
        float(sf.mean()),
        float((sf * sf).mean()),
        float(of.mean()),
        float((of * of).mean()),
        float((sf * of).mean()),
        float(nf.mean()),
        float((nf * nf).mean()),
        float((sf * nf).mean()),
        chunk,
    )


def _cross(h: FloatArr, wo: FloatArr, ov: IntArr, sv: IntArr) -> FloatArr:
    """``Σ_o wo(o)·h(s + o)`` for each ``s`` in ``sv`` (``wo`` given on ``ov``):
    one correlation of dense vectors, never the ``(s, o)`` grid."""
    dense = np.zeros(int(ov.max()) + 1)
    np.add.at(dense, ov, wo)
    full = np.correlate(h, dense, mode="valid")  # full[v] = Σ_m h[v + m]·dense[m]
    return full[sv]


def expected_g(workload: Workload, params: ModelParams) -> float:
    """``E[g(s, o)]`` exactly (no sampling): from the moments for ``B = 1``
    (the sympy moment formula), by a correlation over the supports for
    independent marginals with ``B > 1``, by the mean over rows for a joint law."""
    if params.g == "continuous" and params.block != 1:
        raise InvalidArgument("the continuous g convention has no block-granular form; use g='exact' with B > 1")
    if workload.joint_s is not None and workload.joint_o is not None:
        return float(lifetime_area(workload.joint_s, workload.joint_o, params).mean())
    m = workload_moments(workload, params.chunk)
    if params.block == 1:
        f = _forms.eg_exact if params.g == "exact" else _forms.eg_continuous
        return float(f(m.Es, m.Es2, m.Eo, m.Eo2, m.Eso, m.En, m.En2, params.chunk))
    assert workload.s is not None and workload.o is not None
    B = params.block
    sv, sp_ = workload.s.support()
    ov, op = workload.o.support()
    n = _n_chunks(sv, params.chunk)
    table = _full_chunk_table(int(n.max()), params.chunk, B)
    F = _block_prefix(np.arange(int(sv.max() + ov.max()) + 1, dtype=np.int64), B)
    tail = _cross(F, op, ov, sv) - _block_prefix(sv - 1, B)
    return float((table[n - 1] + tail) @ sp_)


def expected_reserve_area(workload: Workload, params: ModelParams) -> float:
    """``E[peak·(n(s) + o)]``: the area the reserve policy sets aside per request
    (its peak ``B⌈(s + o)/B⌉`` for all ``n(s) + o`` slots)."""
    B, chunk = params.block, params.chunk
    if workload.joint_s is not None and workload.joint_o is not None:
        s_, o_ = workload.joint_s, workload.joint_o
        return float((peak_tokens(s_ + o_, B) * (_n_chunks(s_, chunk) + o_)).astype(np.float64).mean())
    assert workload.s is not None and workload.o is not None
    sv, sp_ = workload.s.support()
    ov, op = workload.o.support()
    h = peak_tokens(np.arange(int(sv.max() + ov.max()) + 1, dtype=np.int64), B).astype(np.float64)
    n = _n_chunks(sv, chunk).astype(np.float64)
    per_s = n * _cross(h, op, ov, sv) + _cross(h, op * ov, ov, sv)
    return float(per_s @ sp_)


def mu_per_slot(workload: Workload, params: ModelParams) -> float:
    """``M / E[g]``: requests served per slot at saturation (the paper's ``μ·b̄``)."""
    return params.M / expected_g(workload, params)


def mu(workload: Workload, params: ModelParams, bbar: float) -> float:
    """``μ = M / (b̄·E[g])`` in requests per second."""
    if not (isinstance(bbar, (int, float)) and bbar > 0 and np.isfinite(bbar)):
        raise InvalidArgument(f"batch time b̄ must be a finite number > 0 seconds, got {bbar!r}")
    return mu_per_slot(workload, params) / bbar
