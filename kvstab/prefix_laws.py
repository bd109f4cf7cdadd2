"""Synthetic laws of prompt content: which tokens of a prompt other requests share.

A prefix law never changes the law of the lengths ``(s, o)`` (except the
multi-turn law, whose prompts grow from turn to turn): given a request's
prompt length ``s``, it says what the prompt's segments are
(:mod:`kvstab.prefix`).  So every length-only consumer (``μ``, ``E[g]``, the
engines) sees the workload it saw without the law, and a plan drawn with a
prefix law has byte for byte the lengths of the same plan without it (the
prompts are drawn after the lengths, from the same generator).

==========================  =================================================================
spec (``prefix=…``)         prompt of a request of length ``s``
==========================  =================================================================
``shared(P)``               one system prompt of ``P`` tokens, then ``s − P`` own tokens
``tenants(n,P,a)``          tenant ``t`` (Zipf(``a``) over ``n``) : its system prompt of
                            ``P_t`` tokens, then own tokens; ``P`` an integer or a length
                            law (``U(100,900)``…) drawn once per tenant (seed 0)
``fewshot(n,H,E,a)``        an instruction header of ``H`` tokens all templates share,
                            template ``t``'s ``E`` tokens of examples (Zipf(``a``) over
                            ``n``), then the question (own tokens)
``chat(K,T)``               a conversation of ``K`` turns (an integer or a length law);
                            turn ``k``'s prompt is turn ``k − 1``'s prompt, its answer and a
                            new message; ``s`` and ``o`` are a turn's message and answer
                            laws; ``T`` is the mean think time in seconds
                            (:func:`kvstab.arrivals.conversation_arrivals`)
==========================  =================================================================

Zipf(``a``) over ``n`` items: item ``t = 0 … n − 1`` has probability
``∝ (t + 1)^−a`` (``a = 0``: uniform).  The shared part of a law must fit in
every prompt: ``P ≤ ess inf s`` (``H + E`` for few-shot), else
:class:`~kvstab.errors.InvalidArgument` naming the parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument
from kvstab.prefix import PromptSet, content_id, content_ids
from kvstab.validation import MAX_TOKENS, nonneg_float, positive_int

__all__ = ["PrefixLaw", "Shared", "Tenants", "FewShot", "Conversation", "zipf_weights", "MAX_ITEMS"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

#: the most tenants or templates a law may have (their weights are listed)
MAX_ITEMS = 10**7


class LengthDist(Protocol):
    """What a law here reads of a length law (:class:`kvstab.workload.LengthDist`,
    restated so that this module does not import the workload module, which imports it)."""

    def sample(self, rng: np.random.Generator, n: int) -> IntArray: ...

    def support(self) -> tuple[IntArray, npt.NDArray[np.float64]]: ...

    @property
    def max(self) -> int: ...

    def describe(self) -> str: ...


class PrefixLaw(Protocol):
    """How a request's prompt of length ``s`` is made of shared and own segments."""

    def check(self, s_min: int) -> None:
        """Raise :class:`InvalidArgument`, naming the parameter, if the shared
        part may not fit in a prompt of ``s_min`` tokens."""

    def prompts(self, rng: np.random.Generator, s: IntArray, first: int = 0) -> PromptSet:
        """The prompts of requests of lengths ``s``, numbered from ``first`` (their own tokens' ids)."""

    def describe(self) -> str:
        """The spec (``shared(1024)``, …) that parses back to this law."""


def zipf_weights(n: int, a: float) -> npt.NDArray[np.float64]:
    """Zipf(``a``) probabilities of items ``0 … n − 1``: ``∝ (t + 1)^−a``."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -float(a)
    return w / w.sum()


def _own(n_shared: IntArray, s: IntArray, first: int, shared: list[tuple[IntArray, IntArray]]) -> PromptSet:
    """Prompts made of ``shared`` columns (content, length per request; length 0 = absent), then own tokens."""
    n = s.size
    own = s - n_shared
    cols = [*shared, (content_ids("own", first + np.arange(n, dtype=np.int64)), own)]
    content = np.stack([c for c, _ in cols], axis=1)
    length = np.stack([ln for _, ln in cols], axis=1)
    keep = length > 0  # row-major: each request's segments stay in order
    per_row = keep.sum(axis=1)
    off = np.concatenate(([0], np.cumsum(per_row))).astype(np.int64)
    return PromptSet(off, content[keep], length[keep], output=content_ids("output", first + np.arange(n, dtype=np.int64)))


def _check_shared(law: str, param: str, shared: int, s_min: int) -> None:
    if shared > s_min:
        raise InvalidArgument(
            f"prefix={law}: {param}={shared} shared tokens exceed the shortest prompt s={s_min}; "
            "the shared part must fit in every prompt (lower it, or raise s's least value)"
        )


def _zipf_args(law: str, n: object, a: object) -> tuple[int, float]:
    count = positive_int(f"prefix={law}: n", n, maximum=MAX_ITEMS)
    try:
        expo = nonneg_float(f"prefix={law}: a (Zipf exponent)", a)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{exc}; the Zipf exponent is a finite number >= 0") from None
    return count, expo


@dataclass(frozen=True, slots=True)
class Shared:
    """Every prompt starts with the same system prompt of ``P`` tokens."""

    P: int = field(metadata={"help": "tokens of the shared system prompt, >= 1 and <= ess inf s"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "P", positive_int("prefix=shared(P): P", self.P, maximum=MAX_TOKENS))

    def check(self, s_min: int) -> None:
        _check_shared(self.describe(), "P", self.P, s_min)

    def prompts(self, rng: np.random.Generator, s: IntArray, first: int = 0) -> PromptSet:
        p = np.full(s.size, self.P, dtype=np.int64)
        return _own(p, s, first, [(np.full(s.size, content_id("shared", 0), dtype=np.int64), p)])

    def describe(self) -> str:
        return f"shared({self.P})"


@dataclass(frozen=True, slots=True)
class Tenants:
    """``n`` tenants, each with its own system prompt; a request belongs to
    tenant ``t`` with Zipf(``a``) probability."""

    n: int = field(metadata={"help": "number of tenants, >= 1"})
    P: LengthDist = field(metadata={"help": "law of a tenant's system-prompt length (drawn once per tenant, seed 0)"})
    a: float = field(metadata={"help": "Zipf exponent of the tenants' popularity, >= 0"})
    sizes: tuple[int, ...] = field(init=False, metadata={"help": "each tenant's system-prompt length"})

    def __post_init__(self) -> None:
        n, a = _zipf_args("tenants(n,P,a)", self.n, self.a)
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "a", a)
        # drawn from a fixed seed: the tenants are part of the law, not of one plan
        sizes = self.P.sample(np.random.default_rng(0), n)
        object.__setattr__(self, "sizes", tuple(int(x) for x in sizes))

    def check(self, s_min: int) -> None:
        _check_shared(self.describe(), "P (the largest tenant's)", max(self.sizes), s_min)

    def prompts(self, rng: np.random.Generator, s: IntArray, first: int = 0) -> PromptSet:
        t = rng.choice(self.n, size=s.size, p=zipf_weights(self.n, self.a)).astype(np.int64)
        p = np.asarray(self.sizes, dtype=np.int64)[t]
        return _own(p, s, first, [(content_ids("tenant", t), p)])

    def describe(self) -> str:
        return f"tenants({self.n},{self.P.describe()},{self.a:g})"


@dataclass(frozen=True, slots=True)
class FewShot:
    """Few-shot templates: a header of ``H`` tokens every template shares, then
    template ``t``'s ``E`` tokens of examples (Zipf(``a``) over ``n``), then the
    request's own question."""

    n: int = field(metadata={"help": "number of templates, >= 1"})
    H: int = field(metadata={"help": "tokens of the instruction header all templates share, >= 1"})
    E: int = field(metadata={"help": "tokens of one template's examples, >= 1"})
    a: float = field(metadata={"help": "Zipf exponent of the templates' popularity, >= 0"})

    def __post_init__(self) -> None:
        n, a = _zipf_args("fewshot(n,H,E,a)", self.n, self.a)
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "H", positive_int("prefix=fewshot(n,H,E,a): H", self.H, maximum=MAX_TOKENS))
        object.__setattr__(self, "E", positive_int("prefix=fewshot(n,H,E,a): E", self.E, maximum=MAX_TOKENS))

    def check(self, s_min: int) -> None:
        _check_shared(self.describe(), "H+E", self.H + self.E, s_min)

    def prompts(self, rng: np.random.Generator, s: IntArray, first: int = 0) -> PromptSet:
        t = rng.choice(self.n, size=s.size, p=zipf_weights(self.n, self.a)).astype(np.int64)
        h = np.full(s.size, self.H, dtype=np.int64)
        e = np.full(s.size, self.E, dtype=np.int64)
        header = np.full(s.size, content_id("fewshot-header", 0), dtype=np.int64)
        return _own(h + e, s, first, [(header, h), (content_ids("fewshot", t), e)])

    def describe(self) -> str:
        return f"fewshot({self.n},{self.H},{self.E},{self.a:g})"


@dataclass(frozen=True, slots=True, eq=False)
class ConversationDraw:
    """Requests of whole conversations, in conversation then turn order."""

    conversation: IntArray
    turn: IntArray
    s: IntArray
    o: IntArray
    prompts: PromptSet


@dataclass(frozen=True, slots=True)
class Conversation:
    """Multi-turn conversations: turn ``k``'s prompt is turn ``k − 1``'s prompt,
    its answer (``o`` tokens) and a new message; think time between turns."""

    turns: LengthDist = field(metadata={"help": "law of the number of turns of a conversation"})
    think: float = field(metadata={"help": "mean think time between a turn's arrival and the next's, seconds (exponential)"})
    message: LengthDist = field(metadata={"help": "law of a new user message's length (the spec's s)"})
    answer: LengthDist = field(metadata={"help": "law of an answer's length (the spec's o)"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "think", nonneg_float("prefix=chat(K,T): T (think time, seconds)", self.think))

    def check(self, s_min: int) -> None:
        return None  # nothing is shared beyond what the conversation itself wrote

    @property
    def mean_turns(self) -> float:
        """``E[K]``: requests per conversation."""
        v, p = self.turns.support()
        return float(np.dot(v, p))

    @property
    def max_total(self) -> int:
        """``ess sup(s + o)`` of a request: the last turn of the longest conversation."""
        return self.turns.max * (self.message.max + self.answer.max)

    def draw(self, rng: np.random.Generator, conversations: int, first: int = 0) -> ConversationDraw:
        """``conversations`` whole conversations (numbered from ``first``): turn
        counts, then every message and answer length, then the prompts."""
        k = self.turns.sample(rng, conversations)
        n = int(k.sum())
        m = self.message.sample(rng, n)
        o = self.answer.sample(rng, n)
        conv = np.repeat(np.arange(conversations, dtype=np.int64), k) + first
        turn = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(k) - k, k)
        # turn j's prompt: messages 0..j interleaved with answers 0..j−1 (2j + 1 segments)
        msg_id = content_ids("message", conv * (1 << 32) + turn)
        ans_id = content_ids("answer", conv * (1 << 32) + turn)
        nseg = 2 * turn + 1
        off = np.concatenate(([0], np.cumsum(nseg))).astype(np.int64)
        row = np.repeat(np.arange(n, dtype=np.int64), nseg)
        pos = np.arange(int(off[-1]), dtype=np.int64) - off[row]
        src = row - turn[row] + pos // 2  # the request whose message (even pos) or answer (odd pos) it is
        is_msg = pos % 2 == 0
        content = np.where(is_msg, msg_id[src], ans_id[src])
        length = np.where(is_msg, m[src], o[src])
        s = np.add.reduceat(length, off[:-1]) if n else np.zeros(0, dtype=np.int64)
        return ConversationDraw(conv, turn, s, o, PromptSet(off, content, length, output=ans_id))

    def turn_times(self, rng: np.random.Generator, d: ConversationDraw, start: FloatArray) -> FloatArray:
        """Each request's arrival time, seconds: its conversation's start ``start[c]`` (seconds) plus
        the think times of its conversation's earlier turns, one exponential of mean ``think`` per turn after the first (open loop: a turn waits
        on the previous turn's arrival, not on its answer)."""
        gap = rng.exponential(self.think, size=d.turn.size) if self.think > 0 else np.zeros(d.turn.size)
        gap[d.turn == 0] = 0.0
        elapsed = np.cumsum(gap)
        first = np.flatnonzero(d.turn == 0)
        # the think time summed up to each conversation's first turn, repeated over its turns
        conv_start = np.repeat(elapsed[first], np.diff(np.append(first, d.turn.size)))
        return start[d.conversation] + (elapsed - conv_start)

    def prompts(self, rng: np.random.Generator, s: IntArray, first: int = 0) -> PromptSet:
        raise InvalidArgument(
            "prefix=chat(K,T) makes its own prompt lengths: draw it with kvstab.arrivals.conversation_arrivals"
        )

    def describe(self) -> str:
        return f"chat({self.turns.describe()},{self.think:g})"


def request_law_sample(law: Conversation, requests: int = 50_000) -> tuple[IntArray, IntArray]:
    """The request stream's ``(s, o)`` law, estimated from conversations drawn
    with seed 0 until ``requests`` requests (each conversation gives each of its
    turns), plus one row at the law's ``ess sup(s + o)`` so that ``δ`` and the
    fit checks see the true largest request."""
    rng = np.random.default_rng(0)
    per = max(1, math.ceil(requests / max(law.mean_turns, 1.0)))
    d = law.draw(rng, per)
    kmax = law.turns.max
    s_top = kmax * law.message.max + (kmax - 1) * law.answer.max
    return np.append(d.s, s_top), np.append(d.o, law.answer.max)
