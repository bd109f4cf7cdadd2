"""Value types of the model and its one memory-accounting function.

Everything that needs to know how many KV tokens a request holds — the
simulator, the z3 encoding, the property tests, the closed forms' brute-force
checks — calls :func:`tokens_held` and :func:`progress_after`.  Nothing else in
the project re-derives them (see ``docs/MODEL.md``, "Lifecycle and
memory").

Progress is counted in tokens processed: ``0 ≤ p ≤ s + o``.  While ``p < s``
the request is prefilling (a slot processes up to ``ŝ`` prompt tokens); from
``p = s`` on it decodes one token per slot; at ``p = s + o`` it is finished and
releases its memory at the end of that slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from kvstab.errors import InvalidArgument
from kvstab.ops import CONCRETE, BoolLike, IntLike, Ops
from kvstab.validation import MAX_TOKENS, positive_float, positive_int

__all__ = [
    "Request",
    "ModelParams",
    "GConvention",
    "tokens_held",
    "unit_tokens",
    "progress_after",
    "is_prefilling",
    "first_chunk_tokens",
    "prefill_slots",
    "check_positive_int",
    "PAPER_M",
    "PAPER_CHUNK",
    "PAPER_BBAR",
    "DEFAULT_WINDOW",
]

GConvention = Literal["exact", "continuous"]

#: The paper's A100 / Llama-3-8B setting (MODEL.md, "The paper's experiments").
PAPER_M = 131_000
PAPER_CHUNK = 512
PAPER_BBAR = 0.0372

#: the queue-head window an engine shows a rule first (it doubles while the rule admits all it sees);
#: here, not in the simulator, so that the command line's flags can name it without loading an engine
DEFAULT_WINDOW = 8


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` as an ``int`` if it is a positive integer (at most
    :data:`kvstab.validation.MAX_TOKENS`), else raise :class:`InvalidArgument`
    naming ``name`` and the value (see :mod:`kvstab.validation`)."""
    return positive_int(name, value, maximum=MAX_TOKENS)


@dataclass(frozen=True, slots=True)
class Request:
    """One request: prompt length ``s`` and output length ``o`` (tokens, ≥ 1)."""

    s: int = field(metadata={"help": "prompt (prefill) length in tokens, >= 1"})
    o: int = field(metadata={"help": "output (decode) length in tokens, >= 1"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "s", check_positive_int("prompt length s", self.s))
        object.__setattr__(self, "o", check_positive_int("output length o", self.o))

    @property
    def total(self) -> int:
        """``s + o``: the tokens the request holds in its last slot."""
        return self.s + self.o


@dataclass(frozen=True, slots=True)
class ModelParams:
    """The server: capacity, chunk, block size, batch time and the conventions in force.

    The one server object: every function that needs the server takes it whole
    (as vLLM passes its config objects), so ``b̄`` travels with ``M`` instead of
    beside it.  The rules of the simulator read only ``M``, ``chunk``,
    ``block``, ``token_budget`` and ``max_num_seqs``; ``bbar`` converts slots
    to seconds for the theory, the arrival plans and the reports.
    """

    M: int = field(default=PAPER_M, metadata={"help": "KV capacity of one worker, in tokens"})
    chunk: int = field(default=PAPER_CHUNK, metadata={"help": "chunked-prefill size ŝ, in tokens"})
    block: int = field(default=1, metadata={"help": "KV allocation granularity B, in tokens (vLLM: 16)"})
    g: GConvention = field(
        default="exact",
        metadata={"help": "g convention: 'exact' (partial last chunk) or the paper's 'continuous' form"},
    )
    token_budget: int | None = field(
        default=None,
        metadata={"help": "tokens per slot shared by all requests (vLLM max_num_batched_tokens); None = unlimited"},
    )
    max_num_seqs: int | None = field(
        default=None, metadata={"help": "cap on running requests (vLLM max_num_seqs); None = no cap"}
    )
    bbar: float = field(default=PAPER_BBAR, metadata={"help": "batch time b̄ in seconds per slot"})
    prefix_caching: bool = field(
        default=False,
        metadata={
            "help": "automatic prefix caching (vLLM's enable_prefix_caching): KV blocks of equal prefixes are "
            "shared, counted once against M, and their prefill is skipped (docs/MODEL.md, 'Prefix caching')"
        },
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "M", check_positive_int("M (KV capacity)", self.M))
        object.__setattr__(self, "chunk", check_positive_int("chunk ŝ", self.chunk))
        object.__setattr__(self, "block", check_positive_int("block size B", self.block))
        if self.g not in ("exact", "continuous"):
            raise InvalidArgument(f"g convention must be 'exact' or 'continuous', got {self.g!r}")
        if self.token_budget is not None:
            object.__setattr__(self, "token_budget", check_positive_int("token budget", self.token_budget))
        if self.max_num_seqs is not None:
            object.__setattr__(self, "max_num_seqs", check_positive_int("max_num_seqs", self.max_num_seqs))
        object.__setattr__(self, "bbar", positive_float("batch time b̄ (seconds per slot)", self.bbar))
        if not isinstance(self.prefix_caching, bool):
            raise InvalidArgument(f"prefix_caching must be True or False, got {self.prefix_caching!r}")
        if self.block > self.M:
            raise InvalidArgument(f"block size B={self.block} exceeds M={self.M}; need 1 <= B <= M")

    def peak(self, total: int) -> int:
        """Memory a request with ``s + o = total`` holds in its last slot, ``B⌈total/B⌉``."""
        return int(tokens_held(int(total), self.block))

    def fits_total(self, total: int) -> bool:
        """Whether a request with ``s + o = total`` can ever be served (its peak fits in ``M``)."""
        return self.peak(total) <= self.M

    def fits(self, request: Request) -> bool:
        """Whether ``request`` can ever be served: its peak memory fits in ``M``."""
        return self.fits_total(request.s + request.o)

    @staticmethod
    def help() -> dict[str, str]:
        """Help text of every field, for CLIs and docs."""
        return {f.name: str(f.metadata.get("help", "")) for f in fields(ModelParams)}


def tokens_held(progress: IntLike, block: IntLike = 1, ops: Ops = CONCRETE) -> IntLike:
    """KV tokens charged to a request that has processed ``progress`` tokens.

    Memory is allocated in blocks of ``block`` tokens, so a request holds
    ``⌈progress / B⌉·B``; with ``B = 1`` that is ``progress`` itself.
    """
    if isinstance(block, int) and block == 1:
        return progress
    return ops.ceil_div(progress, block) * block


def is_prefilling(s: IntLike, progress: IntLike, ops: Ops = CONCRETE) -> BoolLike:
    """Whether a request with prompt ``s`` and ``progress`` is still in prefill."""
    return ops.lt(progress, s)


def unit_tokens(s: IntLike, progress: IntLike, chunk: IntLike, ops: Ops = CONCRETE) -> IntLike:
    """Tokens one unit of work processes: a chunk (at most ``ŝ``, at most what is
    left of the prompt) in prefill, one token in decode."""
    return ops.ite(ops.lt(progress, s), ops.min(chunk, s - progress), 1)


def progress_after(
    s: IntLike,
    progress: IntLike,
    chunk: IntLike,
    grant: IntLike | None = None,
    ops: Ops = CONCRETE,
) -> IntLike:
    """Progress after one slot in which the request is granted ``grant`` tokens.

    ``grant=None`` means one full unit (the paper's maximal batching).  A grant
    is clamped to one unit: a slot never processes more than ``ŝ`` prompt
    tokens, nor more than one output token, for one request.
    """
    unit = unit_tokens(s, progress, chunk, ops)
    if grant is None:
        return progress + unit
    return progress + ops.max(0, ops.min(grant, unit))


def first_chunk_tokens(s: IntLike, chunk: IntLike, ops: Ops = CONCRETE) -> IntLike:
    """Progress of a fresh request after its first slot: ``min(s, ŝ)``."""
    return ops.min(s, chunk)


def prefill_slots(s: IntLike, chunk: IntLike, ops: Ops = CONCRETE) -> IntLike:
    """``n(s) = ⌈s/ŝ⌉``: the slots a prompt of ``s`` tokens takes to prefill, one chunk a slot.

    The one definition of ``n(s)``: ``g``, the lifetime ``n(s) + o`` and the
    first token's slot all count it.  ``s`` may be a numpy array of prompts
    (the concrete ``ceil_div`` is elementwise floor division)."""
    return ops.ceil_div(s, chunk)
