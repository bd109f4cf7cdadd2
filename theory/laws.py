"""Expectations over a length law without enumerating its support.

A uniform law on ``{a, …, b}`` or a geometric law truncated at ``cap`` may span
10⁹ points (a long-context workload, ``U(1, 10⁹)``); every expectation
``kvstab mu`` needs is a sum over that support.  This module computes those
sums at a cost that does not grow with the support's length:

* a parametric law is a **run**: the consecutive integers ``a … a+L−1`` with
  weights ``q^(x−a)`` (``q = 1`` uniform, ``q = 1 − p`` geometric).  A power
  sum ``Σ q^x (a + x)^j`` over a run splits into ``√L`` blocks of ``√L``
  points, and since ``(y + z)^j`` expands into products of a block term and
  an offset term, it is a sum of products of two short sums (``O(√L)``).
  The chunk count ``n = ⌈x/ŝ⌉`` is constant within a chunk, so the moments of
  ``n`` separate the same way (chunks × offsets in a chunk).
* block rounding (``B > 1``) enters only through residues ``x mod B``: the
  law of a residue of a run costs ``O(B)``, and sums of independent lengths
  become circular convolutions of length ``B``.
* any other law (empirical, a plug-in's) is its support points, vectorised:
  ``O(number of support points)``.

All sums are of non-negative terms in float64 (no cancellation); the tests
check every function against brute-force enumeration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.model import tokens_held
from kvstab.validation import MAX_TOKENS
from kvstab.workload import Fixed, Geometric, LengthDist, Uniform

__all__ = [
    "MAX_PERIOD",
    "Run",
    "Points",
    "Law",
    "law_of",
    "LengthMoments",
    "length_moments",
    "residues",
    "chunk_index_residues",
    "circular_convolve",
    "check_block_period",
    "block_waste",
    "rounding",
]

FloatArr = npt.NDArray[np.float64]
IntArr = npt.NDArray[np.int64]

#: below this many points a sum is one vector pass
_DIRECT = 1 << 16
#: the longest residue period (``B``, ``B/gcd(B, ŝ)`` or ``lcm(B, ŝ)``) the exact ``B > 1``
#: sums handle (vectors of this length, milliseconds): a KV block of 10⁶ tokens is no real server
MAX_PERIOD = 1 << 20


@dataclass(frozen=True, slots=True)
class Run:
    """The integers ``a … a + length − 1`` with weights ``q^(x − a)`` (not normalised)."""

    a: int
    length: int
    q: float


@dataclass(frozen=True, slots=True)
class Points:
    """Support points ``values`` with probabilities ``weights``."""

    values: IntArr
    weights: FloatArr


Law = Run | Points


def law_of(dist: LengthDist) -> Law:
    """A length law as a run (uniform, geometric) or as its support points.

    Lengths above :data:`kvstab.validation.MAX_TOKENS` are refused: no KV cache
    holds them, and float64 sums of their squares would lose the integers."""
    if int(dist.max) > MAX_TOKENS:
        raise InvalidArgument(
            f"workload {dist.describe()}: lengths must be at most {MAX_TOKENS} tokens, got ess sup {dist.max}"
        )
    if isinstance(dist, Uniform):
        return Run(int(dist.a), int(dist.b) - int(dist.a) + 1, 1.0)
    if isinstance(dist, Geometric):
        return Run(1, int(dist.cap), 1.0 - float(dist.p))
    if isinstance(dist, Fixed):
        return Points(np.array([int(dist.value)], dtype=np.int64), np.array([1.0]))
    v, w = dist.support()
    return Points(np.asarray(v, dtype=np.int64), np.asarray(w, dtype=np.float64))


def _pow(q: float, e: float) -> float:
    """``q**e`` with ``0**0 = 1`` (a geometric law with ``p = 1`` is a point mass)."""
    return 1.0 if e == 0 else q**e


def _power_sums(a: int, length: int, q: float) -> FloatArr:
    """``[Σ q^x, Σ q^x (a + x), Σ q^x (a + x)²]`` over ``x = 0 … length − 1``."""
    return np.array(_power_sums_cached(a, length, q))


@lru_cache(maxsize=256)
def _power_sums_cached(a: int, length: int, q: float) -> tuple[float, float, float]:
    # one law's sums are asked for several times (its total weight by every residue call)
    s0, s1, s2 = _power_sums_uncached(a, length, q)
    return float(s0), float(s1), float(s2)


def _power_sums_uncached(a: int, length: int, q: float) -> FloatArr:
    if length <= 0:
        return np.zeros(3)
    if length <= _DIRECT:
        x = np.arange(length, dtype=np.float64)
        w = np.power(q, x)
        y = a + x
        return np.array([w.sum(), (w * y).sum(), (w * y * y).sum()])
    # x = D·G + r: weights q^(DG)·q^r and (a + r + DG)^j expand into block × offset sums
    G = math.isqrt(length)
    nD = length // G
    z = np.arange(nD, dtype=np.float64) * G
    W = np.power(q, z)
    A0, A1, A2 = W.sum(), (W * z).sum(), (W * z * z).sum()
    r = np.arange(G, dtype=np.float64)
    v = np.power(q, r)
    y = a + r
    V0, V1, V2 = v.sum(), (v * y).sum(), (v * y * y).sum()
    body = np.array([A0 * V0, A0 * V1 + A1 * V0, A0 * V2 + 2 * A1 * V1 + A2 * V0])
    done = nD * G
    return body + _pow(q, done) * _power_sums(a + done, length - done, q)


def _run_chunk_sums(run: Run, chunk: int) -> FloatArr:
    """``[Σw, Σwx, Σwx², Σwn, Σwn², Σwxn]`` over a run, ``n = ⌈x/ŝ⌉``."""
    a, b, q = run.a, run.a + run.length - 1, run.q
    ca, cb = -(-a // chunk), -(-b // chunk)

    def constant_chunk(u: int, v: int, c: int) -> FloatArr:
        # x = u … v all lie in chunk c: n is the constant c there
        P0, P1, P2 = _pow(q, u - a) * _power_sums(u, v - u + 1, q)
        return np.array([P0, P1, P2, c * P0, c * c * P0, c * P1])

    if ca == cb:
        return constant_chunk(a, b, ca)
    out = constant_chunk(a, ca * chunk, ca) + constant_chunk((cb - 1) * chunk + 1, b, cb)
    nC = cb - ca - 1
    if nC > 0:
        # full chunks c = c1 + e (e = 0 … nC−1) hold x = k0 + e·ŝ + r (r = 1 … ŝ)
        k0, c1 = ca * chunk, ca + 1
        scale = _pow(q, k0 + 1 - a)
        E0, E1, E2 = _power_sums(0, nC, _pow(q, chunk))
        R0, R1, R2 = _power_sums(1, chunk, q)
        out = out + scale * np.array(
            [
                E0 * R0,
                k0 * E0 * R0 + chunk * E1 * R0 + E0 * R1,
                k0 * k0 * E0 * R0
                + chunk * chunk * E2 * R0
                + E0 * R2
                + 2 * k0 * chunk * E1 * R0
                + 2 * k0 * E0 * R1
                + 2 * chunk * E1 * R1,
                c1 * E0 * R0 + E1 * R0,
                c1 * c1 * E0 * R0 + 2 * c1 * E1 * R0 + E2 * R0,
                k0 * c1 * E0 * R0 + k0 * E1 * R0 + chunk * c1 * E1 * R0 + chunk * E2 * R0 + c1 * E0 * R1 + E1 * R1,
            ]
        )
    return out


@dataclass(frozen=True, slots=True)
class LengthMoments:
    """``E[x]``, ``E[x²]``, ``E[n]``, ``E[n²]``, ``E[x·n]`` of one length law, ``n = ⌈x/ŝ⌉``."""

    Ex: float
    Ex2: float
    En: float
    En2: float
    Exn: float


def length_moments(law: Law, chunk: int) -> LengthMoments:
    """The moments of a length and of its chunk count under ``law``."""
    if isinstance(law, Points):
        x = law.values.astype(np.float64)
        n = (-(-law.values // chunk)).astype(np.float64)
        w = law.weights
        return LengthMoments(float(x @ w), float(x * x @ w), float(n @ w), float(n * n @ w), float(x * n @ w))
    S = _run_chunk_sums(law, chunk)
    return LengthMoments(*(float(v / S[0]) for v in S[1:]))


def _run_residues(a: int, length: int, q: float, K: int) -> tuple[FloatArr, FloatArr]:
    """``(Σ q^j [a + j ≡ t], Σ q^j (a + j) [a + j ≡ t])`` for ``t = 0 … K−1``,
    ``j = 0 … length − 1``: full periods in closed form, then the remainder."""
    nP, rem = divmod(length, K)
    A0, A1, _ = _power_sums(0, nP, _pow(q, K))
    j = np.arange(K, dtype=np.float64)
    qj = np.power(q, j)
    p = qj * A0
    m1 = qj * ((a + j) * A0 + K * A1)
    if rem:
        tail = _pow(q, nP * K) * qj[:rem]
        p[:rem] += tail
        m1[:rem] += tail * (a + nP * K + j[:rem])
    shift = a % K
    return np.roll(p, shift), np.roll(m1, shift)


def residues(law: Law, K: int) -> tuple[FloatArr, FloatArr]:
    """``(P(x ≡ t mod K), E[x; x ≡ t mod K])`` for ``t = 0 … K − 1``: ``O(K)`` for a
    run, ``O(support)`` for points."""
    if isinstance(law, Points):
        t = law.values % K
        return (
            np.asarray(np.bincount(t, weights=law.weights, minlength=K), dtype=np.float64),
            np.asarray(np.bincount(t, weights=law.weights * law.values, minlength=K), dtype=np.float64),
        )
    p, m1 = _run_residues(law.a, law.length, law.q, K)
    total = _power_sums(law.a, law.length, law.q)[0]
    return p / total, m1 / total


def chunk_index_residues(law: Law, chunk: int, P: int) -> FloatArr:
    """``P(m ≡ t mod P)`` for ``m = ⌈x/ŝ⌉ − 1 = (x − 1) // ŝ`` (the full chunks before
    the last): the law of ``m`` over a run is two end masses around a run with
    ratio ``q^ŝ``."""
    if isinstance(law, Points):
        return np.asarray(np.bincount(((law.values - 1) // chunk) % P, weights=law.weights, minlength=P), np.float64)
    a, b, q = law.a, law.a + law.length - 1, law.q
    ma, mb = (a - 1) // chunk, (b - 1) // chunk
    out = np.zeros(P)
    if ma == mb:
        out[ma % P] = 1.0
        return out
    head_end, tail_start = (ma + 1) * chunk, mb * chunk + 1
    out[ma % P] += _power_sums(a, head_end - a + 1, q)[0]
    out[mb % P] += _pow(q, tail_start - a) * _power_sums(tail_start, b - tail_start + 1, q)[0]
    nI = mb - ma - 1
    if nI > 0:
        # m = ma+1 … mb−1 each hold a full chunk x = m·ŝ + 1 … (m+1)·ŝ
        per_chunk = _pow(q, head_end + 1 - a) * _power_sums(0, chunk, q)[0]
        inner, _ = _run_residues(ma + 1, nI, _pow(q, chunk), P)
        out += per_chunk * inner
    return out / out.sum()


def circular_convolve(x: FloatArr, y: FloatArr) -> FloatArr:
    """``z[t] = Σ_u x[u]·y[(t − u) mod K]``: the law of a sum of independent residues."""
    K = x.size
    if K <= 2048:
        full = np.convolve(x, y)
        z = full[:K].copy()
        z[: full.size - K] += full[K:]
        return z
    return np.fft.irfft(np.fft.rfft(x) * np.fft.rfft(y), n=K)


def check_block_period(block: int, chunk: int) -> int:
    """``P = B/gcd(B, ŝ)``, the period of the chunks' block rounding; refuses a
    ``B`` or ``P`` beyond :data:`MAX_PERIOD` with one line."""
    period = block // math.gcd(block, chunk)
    if block > MAX_PERIOD or period > MAX_PERIOD:
        raise InvalidArgument(
            f"block size B = {block} with chunk ŝ = {chunk}: the exact block-granular sums need B and "
            f"B/gcd(B, ŝ) = {period} at most {MAX_PERIOD}; use a smaller B (vLLM uses 16) or --block 1"
        )
    return period


def block_waste(x: IntArr, block: int) -> FloatArr:
    """``tokens_held(x, B) − x``: the block rounding waste of holding ``x`` tokens
    (:func:`kvstab.model.tokens_held` is written for ints and z3 terms; numpy
    arrays go through it unchanged)."""
    held = cast(IntArr, tokens_held(cast(Any, x), block))
    return np.asarray(held - x, dtype=np.float64)


def rounding(block: int, upto: int) -> FloatArr:
    """:func:`block_waste` of ``x = 0 … upto − 1``."""
    return block_waste(np.arange(upto, dtype=np.int64), block)
