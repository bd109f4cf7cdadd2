"""Length distributions and workloads: the law of ``(s, o)``.

A :class:`Workload` is either a pair of independent marginals or a joint
empirical law (rows of a trace).  Every distribution here has finite support,
so that ``ess sup(s + o)`` — and hence the paper's ``δ`` — is defined; a
geometric law therefore carries an explicit truncation point.

Workload specs (CLI ``--workload``)::

    paper-1:1 | paper-2:1 | paper-1:2          the paper's P/D workloads
    s=U(10,1600),o=U(10,1600)                  independent marginals
    s=const(512),o=geom(0.01,2000)             geometric o, truncated at 2000
    s=U(1,100),o=empirical(PATH)               an empirical marginal
    trace(PATH)                                the joint law of a trace's rows
    trace(PATH),independent                    the trace's marginals, independent
    SPEC,prefix=LAW                            any of the above with prefix structure

Prefix laws (:mod:`kvstab.prefix_laws`; the lengths' law is unchanged, except
``chat``'s): ``shared(P)``, ``tenants(n,P,a)`` (``P`` an integer or a DIST),
``fewshot(n,H,E,a)``, and ``chat(K,T)`` (``K`` turns, an integer or a DIST;
``T`` seconds of mean think time; ``s``/``o`` are then one turn's message and
answer)::

    s=U(1100,2000),o=U(10,500),prefix=shared(1024)
    s=U(600,2000),o=geom(0.01,2000),prefix=tenants(16,U(100,500),1.1)
    paper-1:1,prefix=fewshot(8,200,600,1.0)   (refused: H+E=800 > ess inf s=10)
    s=U(20,200),o=U(50,400),prefix=chat(U(1,8),30)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams
from kvstab.prefix_laws import Conversation, FewShot, PrefixLaw, Shared, Tenants, request_law_sample
from kvstab.validation import MAX_TOKENS, nonneg_float, positive_int, unit_fraction

__all__ = [
    "LengthDist",
    "Uniform",
    "Fixed",
    "Geometric",
    "EmpiricalDist",
    "Workload",
    "parse_workload",
    "PAPER_WORKLOADS",
    "MAX_SUPPORT",
]

#: the most values a parametric law may range over: its support is enumerated
#: (moments, E[g]), so a law over 10¹² values would exhaust memory, not compute
MAX_SUPPORT = 10**7

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class LengthDist(Protocol):
    """A law on positive integers with finite support."""

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        """``n`` i.i.d. draws."""

    def support(self) -> tuple[IntArray, FloatArray]:
        """Support points (increasing) and their probabilities."""

    @property
    def max(self) -> int:
        """The essential supremum."""

    @property
    def min(self) -> int:
        """The essential infimum."""

    def describe(self) -> str:
        """A spec string that parses back to this law."""


def _check_len(name: str, value: int) -> int:
    """A length: an integer in ``[1, MAX_TOKENS]`` (:mod:`kvstab.validation`)."""
    try:
        return positive_int(name, value, maximum=MAX_TOKENS)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{exc} (a length is an integer >= 1)") from None


def _check_span(what: str, count: int) -> None:
    if count > MAX_SUPPORT:
        raise InvalidArgument(
            f"{what} ranges over {count} values; kvstab enumerates a law's support, at most {MAX_SUPPORT} values"
        )


@dataclass(frozen=True, slots=True)
class Uniform:
    """Discrete uniform on ``{a, …, b}`` (the paper's ``U(a, b)``)."""

    a: int = field(metadata={"help": "least value, >= 1"})
    b: int = field(metadata={"help": "greatest value, >= a"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "a", _check_len("U(a, b): a", self.a))
        object.__setattr__(self, "b", _check_len("U(a, b): b", self.b))
        if self.b < self.a:
            raise InvalidArgument(f"U(a, b) needs a <= b, got a={self.a}, b={self.b}")

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        return rng.integers(self.a, self.b + 1, size=n, dtype=np.int64)

    def support(self) -> tuple[IntArray, FloatArray]:
        # only code that must list every value calls this (the theory sums laws in closed form)
        _check_span(f"U({self.a},{self.b})", self.b - self.a + 1)
        v = np.arange(self.a, self.b + 1, dtype=np.int64)
        return v, np.full(v.shape, 1.0 / v.size)

    @property
    def max(self) -> int:
        return self.b

    @property
    def min(self) -> int:
        return self.a

    def describe(self) -> str:
        return f"U({self.a},{self.b})"


@dataclass(frozen=True, slots=True)
class Fixed:
    """A point mass: every request has the same length."""

    value: int = field(metadata={"help": "the length, >= 1"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", _check_len("const(v): v", self.value))

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        return np.full(n, self.value, dtype=np.int64)

    def support(self) -> tuple[IntArray, FloatArray]:
        return np.array([self.value], dtype=np.int64), np.array([1.0])

    @property
    def max(self) -> int:
        return self.value

    @property
    def min(self) -> int:
        return self.value

    def describe(self) -> str:
        return f"const({self.value})"


@dataclass(frozen=True, slots=True)
class Geometric:
    """Geometric on ``{1, 2, …}`` with success probability ``p``, conditioned on
    ``≤ cap`` (a finite ``cap`` keeps ``ess sup`` and ``δ`` defined)."""

    p: float = field(metadata={"help": "success probability in (0, 1]"})
    cap: int = field(metadata={"help": "truncation point (ess sup), >= 1"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", unit_fraction("geom(p, cap): p", self.p))
        object.__setattr__(self, "cap", _check_len("geom(p, cap): cap", self.cap))

    def support(self) -> tuple[IntArray, FloatArray]:
        _check_span(f"geom({self.p},{self.cap})", self.cap)
        v = np.arange(1, self.cap + 1, dtype=np.int64)
        w = float(self.p) * (1.0 - float(self.p)) ** (v - 1)
        return v, w / w.sum()

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        # inversion of the truncated law: no support is listed, so a cap of 10⁹ costs nothing
        p = float(self.p)
        if p >= 1.0:
            return np.ones(n, dtype=np.int64)
        log_q = np.log1p(-p)
        tail = -np.expm1(self.cap * log_q)  # P(X ≤ cap) = 1 − q^cap
        u = rng.random(n)
        x = np.ceil(np.log1p(-u * tail) / log_q)
        return np.clip(x, 1, self.cap).astype(np.int64)

    @property
    def max(self) -> int:
        return self.cap

    @property
    def min(self) -> int:
        return 1

    def describe(self) -> str:
        return f"geom({self.p},{self.cap})"


@dataclass(frozen=True, slots=True, eq=False)
class EmpiricalDist:
    """The empirical law of observed lengths (each observation equally likely)."""

    values: tuple[int, ...] = field(metadata={"help": "observed lengths, each >= 1"})
    source: str = field(default="", metadata={"help": "where the values came from"})

    def __post_init__(self) -> None:
        if len(self.values) == 0:
            raise InvalidArgument(f"empirical law {self.source or ''}: no observations (empty trace)")
        arr = np.asarray(self.values, dtype=np.int64)
        if arr.min() < 1:
            raise InvalidArgument(f"empirical law {self.source}: lengths must be >= 1, found {int(arr.min())}")

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        arr = np.asarray(self.values, dtype=np.int64)
        return arr[rng.integers(0, arr.size, size=n)]

    def support(self) -> tuple[IntArray, FloatArray]:
        v, c = np.unique(np.asarray(self.values, dtype=np.int64), return_counts=True)
        return v, c / c.sum()

    @property
    def max(self) -> int:
        return int(max(self.values))

    @property
    def min(self) -> int:
        return int(min(self.values))

    def describe(self) -> str:
        return f"empirical({self.source})"


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    """The law of ``(s, o)``: independent marginals, or a joint empirical law.

    Exactly one of (``s`` and ``o``) or (``joint_s`` and ``joint_o``) is set.
    ``prefix`` (optional) is the law of the prompts' content
    (:mod:`kvstab.prefix_laws`); it leaves the law of ``(s, o)`` as it is.
    """

    s: LengthDist | None = None
    o: LengthDist | None = None
    joint_s: IntArray | None = None
    joint_o: IntArray | None = None
    name: str = ""
    prefix: PrefixLaw | None = None

    def __post_init__(self) -> None:
        indep = self.s is not None and self.o is not None
        joint = self.joint_s is not None and self.joint_o is not None
        if indep == joint:
            raise InvalidArgument("a workload needs either both marginals s and o, or a joint law (s, o rows)")
        if joint:
            js = np.asarray(self.joint_s, dtype=np.int64)
            jo = np.asarray(self.joint_o, dtype=np.int64)
            if js.size == 0:
                raise InvalidArgument(f"workload {self.name!r}: the joint law has no rows (empty trace)")
            if js.shape != jo.shape:
                raise InvalidArgument("joint law: s and o columns differ in length")
            if js.min() < 1 or jo.min() < 1:
                raise InvalidArgument(f"workload {self.name!r}: lengths must be >= 1")
            object.__setattr__(self, "joint_s", js)
            object.__setattr__(self, "joint_o", jo)
        if self.prefix is not None:
            self.prefix.check(self.s.min if self.s is not None else int(np.min(np.asarray(self.joint_s))))

    @property
    def independent(self) -> bool:
        """Whether ``s`` and ``o`` are independent marginals."""
        return self.s is not None

    @staticmethod
    def joint(s: npt.ArrayLike, o: npt.ArrayLike, name: str = "") -> Workload:
        """The joint empirical law of paired observations."""
        return Workload(joint_s=np.asarray(s, dtype=np.int64), joint_o=np.asarray(o, dtype=np.int64), name=name)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[IntArray, IntArray]:
        """``n`` i.i.d. pairs ``(s, o)`` as two int64 arrays."""
        if self.s is not None and self.o is not None:
            s = self.s.sample(rng, n)
            o = self.o.sample(rng, n)
            return s, o
        assert self.joint_s is not None and self.joint_o is not None
        idx = rng.integers(0, self.joint_s.size, size=n)
        return self.joint_s[idx], self.joint_o[idx]

    @property
    def max_total(self) -> int:
        """``ess sup(s + o)``: the largest peak memory a request can need."""
        if self.s is not None and self.o is not None:
            return self.s.max + self.o.max
        assert self.joint_s is not None and self.joint_o is not None
        return int((self.joint_s + self.joint_o).max())

    @property
    def min_total(self) -> int:
        """``ess inf(s + o)``: the least peak memory (before block rounding) a request can need."""
        if self.s is not None and self.o is not None:
            return self.s.min + self.o.min
        assert self.joint_s is not None and self.joint_o is not None
        return int((self.joint_s + self.joint_o).min())

    def check_fits(self, params: ModelParams, *, drop_oversize: bool = False) -> None:
        """Raise :class:`InvalidArgument` at once if no request of this law fits
        in ``M`` or, unless ``drop_oversize``, if some cannot (their peak
        ``B⌈(s + o)/B⌉`` exceeds ``M``, so no scheduler could ever serve them):
        checked on the law itself, before any request is drawn."""
        if not params.fits_total(self.min_total):
            raise InvalidArgument(
                f"no request of workload {self.describe()!r} fits in M={params.M} (the smallest needs "
                f"{params.peak(self.min_total)} tokens at its peak); raise --M"
            )
        if not drop_oversize and not params.fits_total(self.max_total):
            raise InvalidArgument(
                f"some requests of workload {self.describe()!r} need up to {params.peak(self.max_total)} tokens "
                f"at their peak but M={params.M}: no scheduler can ever serve them (pass --drop-oversize to drop "
                "such requests and report how many)"
            )

    def conditioned(self, max_total: int) -> tuple[Workload, float]:
        """The law of ``(s, o)`` given ``s + o ≤ max_total``, and ``P(s + o ≤ max_total)``.

        What a server sees when the requests that cannot fit are dropped: its
        ``E[g]``, ``μ`` and ``δ`` are this law's, not the whole law's.  Exact:
        a joint law keeps its rows that fit; independent marginals become the
        joint law of the pairs that fit, each pair repeated in proportion to
        its probability — the marginals' support counts (one each for
        ``U``/``const``, the observation counts for ``empirical``).  A
        geometric marginal has no such integer weights and is refused, as is
        a grid of more than :data:`MAX_SUPPORT` rows.  The whole law itself
        when everything fits; :class:`InvalidArgument` when nothing does."""
        limit = int(max_total)
        if self.max_total <= limit:
            return self, 1.0
        if self.prefix is not None:
            # the shared part still fits: conditioning only removes long requests' lengths
            plain, prob = replace(self, prefix=None).conditioned(limit)
            return replace(plain, prefix=self.prefix), prob
        if self.min_total > limit:
            raise InvalidArgument(f"no request of workload {self.describe()!r} has s + o <= {limit}")
        name = f"{self.describe()} | s+o<={limit}"
        if self.s is None or self.o is None:
            assert self.joint_s is not None and self.joint_o is not None
            keep = self.joint_s + self.joint_o <= limit
            return Workload.joint(self.joint_s[keep], self.joint_o[keep], name=name), float(keep.mean())
        vs, cs = _support_counts(self.s)
        vo, co = _support_counts(self.o)
        # o's support is increasing: the o that fit beside s = vs[i] are a prefix of it, of length k[i]
        k = np.searchsorted(vo, limit - vs, side="right")
        cum_o = np.concatenate(([0], np.cumsum(co)))
        rows = int(np.dot(cs, cum_o[k]))
        if rows > MAX_SUPPORT:
            raise InvalidArgument(
                f"the law of workload {self.describe()!r} given s + o <= {limit} has {rows} weighted pairs (more than "
                f"{MAX_SUPPORT}); give it as a trace of (s, o) rows"
            )
        i = np.repeat(np.arange(vs.size), k)
        j = np.arange(i.size) - np.repeat(np.cumsum(k) - k, k)
        weight = cs[i] * co[j]
        prob = float(np.dot(cs, cum_o[k]) / (cs.sum() * co.sum()))
        return Workload.joint(np.repeat(vs[i], weight), np.repeat(vo[j], weight), name=name), prob

    def given_fit(self, params: ModelParams) -> tuple[Workload, float]:
        """:meth:`conditioned` on fitting ``params``' memory: the largest ``s + o``
        whose peak ``B⌈(s + o)/B⌉`` is at most ``M`` is ``B⌊M/B⌋``."""
        return self.conditioned(params.block * (params.M // params.block))

    @property
    def max_s(self) -> int:
        """``ess sup s``."""
        if self.s is not None:
            return self.s.max
        assert self.joint_s is not None
        return int(np.max(self.joint_s))

    @property
    def max_o(self) -> int:
        """``ess sup o``."""
        if self.o is not None:
            return self.o.max
        assert self.joint_o is not None
        return int(np.max(self.joint_o))

    def describe(self) -> str:
        """A readable spec of the workload."""
        if self.name:
            return self.name
        tail = f",prefix={self.prefix.describe()}" if self.prefix is not None else ""
        if self.s is not None and self.o is not None:
            return f"s={self.s.describe()},o={self.o.describe()}{tail}"
        return f"joint({self.joint_s.size if self.joint_s is not None else 0} rows){tail}"


def _support_counts(dist: LengthDist) -> tuple[IntArray, IntArray]:
    """A marginal's support and integer weights proportional to its probabilities."""
    if isinstance(dist, (Uniform, Fixed)):
        v, _ = dist.support()
        return v, np.ones(v.size, dtype=np.int64)
    if isinstance(dist, EmpiricalDist):
        v, c = np.unique(np.asarray(dist.values, dtype=np.int64), return_counts=True)
        return v, c.astype(np.int64)
    raise InvalidArgument(
        f"the law {dist.describe()} has no integer weights, so kvstab cannot condition it on s + o fitting exactly; "
        "lower its cap so that every request fits, or give the lengths as a trace"
    )


def _paper(name: str, s: tuple[int, int], o: tuple[int, int]) -> Workload:
    return Workload(s=Uniform(*s), o=Uniform(*o), name=name)


#: The paper's workloads with independent discrete-uniform lengths (MODEL.md).
PAPER_WORKLOADS: dict[str, Workload] = {
    "paper-1:1": _paper("paper-1:1", (10, 1600), (10, 1600)),
    "paper-2:1": _paper("paper-2:1", (10, 2133), (10, 1066)),
    "paper-1:2": _paper("paper-1:2", (10, 1066), (10, 2133)),
}

_VALID = (
    "valid: paper-1:1 | paper-2:1 | paper-1:2 | s=DIST,o=DIST | trace(PATH)[,independent], each optionally "
    "followed by ,prefix=LAW, with DIST one of U(a,b), const(v), geom(p,cap), empirical(PATH) and LAW one of "
    "shared(P), tenants(n,P,a), fewshot(n,H,E,a), chat(K,T)"
)
_PREFIX = re.compile(r"^\s*([a-z]+)\s*\((.*)\)\s*$", re.IGNORECASE)
_DIST = re.compile(r"^\s*(U|uniform|const|fixed|geom|geometric|empirical)\s*\(\s*([^)]*)\)\s*$", re.IGNORECASE)


def _parse_int(text: str, spec: str, name: str) -> int:
    try:
        return positive_int(name, text.strip(), maximum=MAX_TOKENS)
    except InvalidArgument as exc:
        raise InvalidArgument(f"workload {spec!r}: {exc}; {_VALID}") from None


def _parse_dist(text: str, spec: str, which: str) -> LengthDist:
    m = _DIST.match(text)
    if not m:
        raise InvalidArgument(f"workload {spec!r}: cannot parse the law of {which} {text!r}; {_VALID}")
    kind, args = m.group(1).lower(), m.group(2)
    parts = [a for a in args.split(",")] if args.strip() else []
    if kind in ("u", "uniform"):
        if len(parts) != 2:
            raise InvalidArgument(f"workload {spec!r}: U(a,b) takes two integers, got {text!r}")
        return Uniform(_parse_int(parts[0], spec, "U(a, b): a"), _parse_int(parts[1], spec, "U(a, b): b"))
    if kind in ("const", "fixed"):
        if len(parts) != 1:
            raise InvalidArgument(f"workload {spec!r}: const(v) takes one integer, got {text!r}")
        return Fixed(_parse_int(parts[0], spec, "const(v): v"))
    if kind in ("geom", "geometric"):
        if len(parts) != 2:
            raise InvalidArgument(f"workload {spec!r}: geom(p,cap) takes a probability and a cap, got {text!r}")
        try:
            p = unit_fraction("geom p", parts[0].strip())
        except InvalidArgument as exc:
            raise InvalidArgument(f"workload {spec!r}: {exc}") from None
        return Geometric(p, _parse_int(parts[1], spec, "geom(p, cap): cap"))
    # empirical(PATH): one column of a trace file
    from kvstab.traces import load_trace

    tr = load_trace(args.strip())
    return EmpiricalDist(tuple(int(v) for v in (tr.s if which == "s" else tr.o)), source=args.strip())


def _split_args(text: str) -> list[str]:
    """Split at the commas outside parentheses: ``8,U(1,9),1.1`` → three."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += (ch == "(") - (ch == ")")
        cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]


def _parse_len_or_dist(text: str, spec: str, name: str) -> LengthDist:
    """An integer (a point mass) or a DIST."""
    if re.fullmatch(r"\s*[0-9][0-9_eE.+]*\s*", text):
        return Fixed(_parse_int(text, spec, name))
    return _parse_dist(text, spec, name)


def _zipf(text: str, form: str) -> float:
    try:
        return nonneg_float(f"prefix={form}: a (Zipf exponent)", text)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{exc}; the Zipf exponent is a finite number >= 0") from None


def _parse_prefix(text: str, spec: str, base: Workload) -> Workload:
    """``base`` with the prefix law ``text`` (``shared(P)``, …)."""
    m = _PREFIX.match(text)
    if not m:
        raise InvalidArgument(f"workload {spec!r}: cannot parse the prefix law {text!r}; {_VALID}")
    kind, args = m.group(1).lower(), _split_args(m.group(2))
    forms = {"shared": "shared(P)", "tenants": "tenants(n,P,a)", "fewshot": "fewshot(n,H,E,a)", "chat": "chat(K,T)"}
    if kind not in forms:
        raise InvalidArgument(f"workload {spec!r}: unknown prefix law {m.group(1)!r}; {_VALID}")
    form = forms[kind]
    want = form.count(",") + 1
    if len(args) != want or not all(args):
        noun = "argument" if want == 1 else "arguments"
        raise InvalidArgument(f"workload {spec!r}: prefix={form} takes {want} {noun}, got {text!r}")
    if kind == "chat":
        if base.s is None or base.o is None:
            raise InvalidArgument(
                f"workload {spec!r}: prefix=chat(K,T) needs s and o laws (a turn's message and answer), not a trace's rows"
            )
        try:
            think = nonneg_float("prefix=chat(K,T): T (think time, seconds)", args[1])
            law = Conversation(_parse_len_or_dist(args[0], spec, "chat(K,T): K"), think, base.s, base.o)
        except InvalidArgument as exc:
            raise InvalidArgument(f"workload {spec!r}: {exc}") from None
        s, o = request_law_sample(law)
        name = f"{base.describe()},prefix={law.describe()}"
        return Workload(joint_s=s, joint_o=o, name=name, prefix=law)
    law_: PrefixLaw
    try:
        if kind == "shared":
            law_ = Shared(_parse_int(args[0], spec, "shared(P): P"))
        elif kind == "tenants":
            n = _parse_int(args[0], spec, "tenants(n,P,a): n")
            law_ = Tenants(n, _parse_len_or_dist(args[1], spec, "tenants(n,P,a): P"), _zipf(args[2], form))
        else:
            n, h, e = (_parse_int(a, spec, f"fewshot(n,H,E,a): {k}") for k, a in zip("nHE", args, strict=False))
            law_ = FewShot(n, h, e, _zipf(args[3], form))
    except InvalidArgument as exc:
        if str(exc).startswith("workload "):
            raise
        raise InvalidArgument(f"workload {spec!r}: {exc}") from None
    try:
        return replace(base, prefix=law_, name=f"{base.describe()},prefix={law_.describe()}")
    except InvalidArgument as exc:
        raise InvalidArgument(f"workload {spec!r}: {exc}") from None


def parse_workload(spec: str) -> Workload:
    """Parse a workload spec (see the module docstring); raises
    :class:`InvalidArgument` with the valid forms on failure."""
    text = spec.strip()
    m = re.match(r"^(.*?)\s*,\s*prefix\s*=\s*(.+)$", text)
    if m:
        return _parse_prefix(m.group(2), spec, parse_workload(m.group(1)))
    if text in PAPER_WORKLOADS:
        return PAPER_WORKLOADS[text]
    m = re.match(r"^trace\((.+)\)\s*(,\s*independent)?$", text)
    if m:
        from kvstab.traces import load_trace

        tr = load_trace(m.group(1).strip())
        if m.group(2):
            src = m.group(1).strip()
            return Workload(
                s=EmpiricalDist(tuple(int(v) for v in tr.s), source=src),
                o=EmpiricalDist(tuple(int(v) for v in tr.o), source=src),
                name=f"trace({src}),independent",
            )
        return Workload.joint(tr.s, tr.o, name=f"trace({m.group(1).strip()})")
    # s=DIST,o=DIST — split at the top-level comma before "o="
    m = re.match(r"^s\s*=\s*(.+?)\s*,\s*o\s*=\s*(.+)$", text)
    if not m:
        raise InvalidArgument(f"workload {spec!r} does not parse; {_VALID}")
    return Workload(s=_parse_dist(m.group(1), spec, "s"), o=_parse_dist(m.group(2), spec, "o"), name="")
