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

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams, tokens_held
from kvstab.theory import _forms
from kvstab.theory.laws import (
    MAX_PERIOD,
    Law,
    Points,
    Run,
    block_waste,
    check_block_period,
    chunk_index_residues,
    circular_convolve,
    law_of,
    length_moments,
    residues,
    rounding,
)
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
    "check_computable",
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


def _full_chunks(m: IntArr, chunk: int, block: int) -> FloatArr:
    """``T(m) = Σ_{c=1}^{m} B·⌈c·ŝ/B⌉``: what the ``m`` full chunks of a prompt hold
    over prefill.  The rounding of ``c·ŝ`` repeats every ``P = B/gcd(B, ŝ)``
    chunks, so ``T(m) = ŝ·m(m+1)/2 + ⌊m/P⌋·ψ(P) + ψ(m mod P)`` (no table over ``m``).
    A period beyond :data:`~kvstab.theory.laws.MAX_PERIOD` (a huge ``B``) still
    works for requests with few chunks: then ``ψ`` is tabled up to the largest ``m``."""
    P = block // math.gcd(block, chunk)
    if P > MAX_PERIOD and m.size and int(m.max()) < MAX_PERIOD:
        P = int(m.max()) + 1  # m mod P = m: the table covers every m asked for
    else:
        check_block_period(block, chunk)
    psi = _chunk_rounding_prefix(chunk, block, P)
    mf = m.astype(np.float64)
    return chunk * mf * (mf + 1) / 2 + (m // P).astype(np.float64) * psi[P] + psi[m % P]


def _chunk_rounding_prefix(chunk: int, block: int, P: int) -> FloatArr:
    """``ψ(i) = Σ_{c=1}^{i} (B⌈cŝ/B⌉ − cŝ)`` for ``i = 0 … P``."""
    c = np.arange(1, P + 1, dtype=np.int64) * chunk
    return np.concatenate(([0.0], np.cumsum(block_waste(c, block))))


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
    return (
        _full_chunks(_n_chunks(s_, chunk) - 1, chunk, block)
        + _block_prefix(s_ + o_, block)
        - _block_prefix(s_ - 1, block)
    )


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
    return np.asarray(cast(IntArr, tokens_held(cast(Any, t), block)), dtype=np.int64)


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


def _marginals(workload: Workload) -> tuple[Law, Law]:
    assert workload.s is not None and workload.o is not None
    return law_of(workload.s), law_of(workload.o)


def workload_moments(workload: Workload, chunk: int) -> Moments:
    """The moments of ``s``, ``o`` and ``n(s) = ⌈s/ŝ⌉`` under ``workload``: closed
    sums for uniform and geometric marginals (:mod:`kvstab.theory.laws`), one
    pass over the support points or the rows otherwise."""
    if workload.s is not None and workload.o is not None:
        ls, lo = _marginals(workload)
        ms, mo = length_moments(ls, chunk), length_moments(lo, chunk)
        return Moments(ms.Ex, ms.Ex2, mo.Ex, mo.Ex2, ms.Ex * mo.Ex, ms.En, ms.En2, ms.Exn, chunk)
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


def _expected_prefix(EN: float, EN2: float, residue_law: FloatArr, block: int) -> float:
    """``E[F(N)]`` from ``E[N]``, ``E[N²]`` and the law of ``N mod B``:
    ``F(N) = N(N+1)/2 + ⌊N/B⌋·w(B) + w(N mod B)`` with ``w(t)`` the rounding
    waste of the counts ``1 … t``."""
    waste = np.cumsum(rounding(block, block + 1))  # waste[t] = Σ_{x=1}^{t} (B⌈x/B⌉ − x)
    Et = float(residue_law @ np.arange(block, dtype=np.float64))
    return (EN2 + EN) / 2 + (EN - Et) / block * float(waste[block]) + float(residue_law @ waste[:block])


def expected_g(workload: Workload, params: ModelParams) -> float:
    """``E[g(s, o)]`` exactly (no sampling): from the moments for ``B = 1`` (the
    sympy moment formula); for ``B > 1`` the block rounding adds sums over the
    residues ``mod B`` (``O(B)``, never the ``(s, o)`` grid); a joint law is
    averaged over its rows."""
    if params.g == "continuous" and params.block != 1:
        raise InvalidArgument("the continuous g convention has no block-granular form; use g='exact' with B > 1")
    if workload.joint_s is not None and workload.joint_o is not None:
        return float(lifetime_area(workload.joint_s, workload.joint_o, params).mean())
    m = workload_moments(workload, params.chunk)
    B, chunk = params.block, params.chunk
    if B == 1:
        f = _forms.eg_exact if params.g == "exact" else _forms.eg_continuous
        return float(f(m.Es, m.Es2, m.Eo, m.Eo2, m.Eso, m.En, m.En2, chunk))
    # g_B = T(n − 1) + F(s + o) − F(s − 1) (see g_blocks)
    P = check_block_period(B, chunk)
    ls, lo = _marginals(workload)
    ps, _ = residues(ls, B)
    po, _ = residues(lo, B)
    psi = _chunk_rounding_prefix(chunk, B, P)
    pm = chunk_index_residues(ls, chunk, P)
    Em_mod = float(pm @ np.arange(P, dtype=np.float64))
    full = chunk * (m.En2 - m.En) / 2 + (m.En - 1 - Em_mod) / P * float(psi[P]) + float(pm @ psi[:P])
    after = _expected_prefix(m.Es + m.Eo, m.Es2 + 2 * m.Eso + m.Eo2, circular_convolve(ps, po), B)
    before = _expected_prefix(m.Es - 1, m.Es2 - 2 * m.Es + 1, np.roll(ps, -1), B)
    return float(full + after - before)


#: a run this short is summed point by point (cheaper than its residues mod lcm(B, ŝ))
_SMALL_RUN = 1 << 16


def _points(run: Run) -> Points:
    x = np.arange(run.length, dtype=np.float64)
    w = np.power(run.q, x)
    return Points(run.a + np.arange(run.length, dtype=np.int64), w / w.sum())


def _check_reserve_period(law: Law, block: int, chunk: int) -> int:
    """``lcm(B, ŝ)``, the period the reserve area of a long run needs; one line if too long."""
    L = block * chunk // math.gcd(block, chunk)
    if block > 1 and isinstance(law, Run) and law.length > _SMALL_RUN and L > MAX_PERIOD:
        raise InvalidArgument(
            f"the reserve area with B = {block}, ŝ = {chunk} and {law.length} possible prompt lengths needs residues "
            f"mod lcm(B, ŝ) = {L}, more than {MAX_PERIOD}; use --block 1 or a chunk that B divides"
        )
    return L


def check_computable(workload: Workload, params: ModelParams) -> None:
    """Refuse, before any work, a workload and server whose exact sums kvstab
    does not compute (lengths above ``MAX_TOKENS``, a block period above
    :data:`~kvstab.theory.laws.MAX_PERIOD`), with one line."""
    if workload.s is not None and workload.o is not None:
        # a joint law's rows are summed request by request (g_blocks), which tables
        # the block rounding only up to the rows' own chunk counts
        if params.block > 1:
            check_block_period(params.block, params.chunk)
        ls, _ = _marginals(workload)
        _check_reserve_period(ls, params.block, params.chunk)


def _expected_n_times(law: Law, f: FloatArr, chunk: int) -> float:
    """``E[n(s)·f(s mod B)]`` for a vector ``f`` over the residues ``mod B``."""
    B = f.size
    if isinstance(law, Run) and law.length <= _SMALL_RUN:
        law = _points(law)
    if isinstance(law, Points):
        n = _n_chunks(law.values, chunk).astype(np.float64)
        return float((law.weights * n) @ f[law.values % B])
    # n = ((s − 1) − ((s − 1) mod ŝ))/ŝ + 1: the part (s − 1) mod ŝ couples with s mod B
    # through s mod lcm(ŝ, B)
    L = _check_reserve_period(law, B, chunk)
    ps, m1 = residues(law, B)
    pL, _ = residues(law, L)
    y = np.arange(L, dtype=np.int64)
    inner = float(pL @ (((y - 1) % chunk).astype(np.float64) * f[y % B]))
    return float(f @ (m1 - ps)) / chunk - inner / chunk + float(f @ ps)


def expected_reserve_area(workload: Workload, params: ModelParams) -> float:
    """``E[peak·(n(s) + o)]``: the area the reserve policy sets aside per request
    (its peak ``B⌈(s + o)/B⌉`` for all ``n(s) + o`` slots)."""
    B, chunk = params.block, params.chunk
    if workload.joint_s is not None and workload.joint_o is not None:
        s_, o_ = workload.joint_s, workload.joint_o
        return float((peak_tokens(s_ + o_, B) * (_n_chunks(s_, chunk) + o_)).astype(np.float64).mean())
    m = workload_moments(workload, chunk)
    # peak = (s + o) + waste(s + o), and s, o are independent
    base = m.Esn + m.Es * m.Eo + m.En * m.Eo + m.Eo2
    if B == 1:
        return base
    check_block_period(B, chunk)
    ls, lo = _marginals(workload)
    ps, _ = residues(ls, B)
    po, m1o = residues(lo, B)
    waste = rounding(B, B)
    with_o = float(waste @ circular_convolve(ps, m1o))
    # f[r] = E_o[waste((r + o) mod B)], a circular correlation of the waste with o's residues
    f = circular_convolve(waste, np.roll(po[::-1], 1))
    return base + with_o + _expected_n_times(ls, f, chunk)


def mu_per_slot(workload: Workload, params: ModelParams) -> float:
    """``M / E[g]``: requests served per slot at saturation (the paper's ``μ·b̄``)."""
    return params.M / expected_g(workload, params)


def mu(workload: Workload, params: ModelParams) -> float:
    """``μ = M / (b̄·E[g])`` in requests per second, ``b̄`` being the server's ``params.bbar``."""
    return mu_per_slot(workload, params) / params.bbar
