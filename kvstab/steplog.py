"""What a replay against a real scheduler records, step by step, in that server's terms.

vLLM's side: :class:`ReplayConfig` (the server, in vLLM's parameter names),
:func:`check_plan` (the requests vLLM would refuse), :class:`StepLog` (every step
and every request of one replay) and the :class:`StepRecorder` that fills it.
kvstab's reference model (:func:`kvstab.empirical.replay.replay_model`), the
fast engine (:func:`kvstab.engine.replay_model`) and vLLM's own scheduler
(:func:`kvstab.empirical.replay.replay_vllm`) all return a :class:`StepLog`, so
that they can be compared step for step and fed to the same estimators.

SGLang's side: :class:`SglangStep` and :class:`SglangModelLog`, which the
model's replay (:func:`kvstab.lifecycles.sglang.replay_reference`, the compiled
engine) and SGLang's own scheduler (:mod:`kvstab.empirical.sglang_driver`) both
write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from kvstab.arrivals import ArrivalPlan
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams, check_positive_int
from kvstab.schedulers.sglang import Sglang
from kvstab.simulator import SimResult

__all__ = [
    "ReplayConfig",
    "check_plan",
    "check_vllm_peaks",
    "StepLog",
    "StepRecorder",
    "replay_horizon",
    "SglangStep",
    "SglangModelLog",
    "STEP_FIELDS",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

#: vLLM 0.33.0's default block size for full attention on GPU.
DEFAULT_BLOCK = 16


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """The vLLM server both replays emulate (vLLM's own parameter names)."""

    num_blocks: int = field(metadata={"help": "KV blocks in the pool, the reserved null block included; M = (num_blocks - 1)·B"})
    block_size: int = field(default=DEFAULT_BLOCK, metadata={"help": "KV block size B in tokens"})
    max_num_batched_tokens: int = field(default=512, metadata={"help": "token budget of one step (also the prefill chunk ŝ)"})
    max_num_seqs: int = field(default=256, metadata={"help": "cap on running requests"})
    max_model_len: int | None = field(
        default=None, metadata={"help": "longest s + o vLLM accepts; None = the longest request of the plan"}
    )
    enable_prefix_caching: bool = field(
        default=False,
        metadata={
            "help": "vLLM's automatic prefix caching (its server default is on); the requests' token ids "
            "then come from the plan's prompts (kvstab.prefix), so shared prefixes hit"
        },
    )

    def __post_init__(self) -> None:
        if not isinstance(self.enable_prefix_caching, bool):
            raise InvalidArgument(f"enable_prefix_caching must be True or False, got {self.enable_prefix_caching!r}")
        object.__setattr__(self, "num_blocks", check_positive_int("num_blocks", self.num_blocks))
        object.__setattr__(self, "block_size", check_positive_int("block size", self.block_size))
        object.__setattr__(
            self, "max_num_batched_tokens", check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        )
        object.__setattr__(self, "max_num_seqs", check_positive_int("max_num_seqs", self.max_num_seqs))
        if self.max_model_len is not None:
            object.__setattr__(self, "max_model_len", check_positive_int("max_model_len", self.max_model_len))
        if self.num_blocks < 2:
            raise InvalidArgument(f"num_blocks must be >= 2 (one is vLLM's reserved null block), got {self.num_blocks}")

    @classmethod
    def for_capacity(cls, M: int, block_size: int = DEFAULT_BLOCK, **kw: int | None) -> ReplayConfig:
        """The pool whose usable capacity is the largest multiple of ``B`` not above ``M`` tokens."""
        M = check_positive_int("M", M)
        block_size = check_positive_int("block size", block_size)
        if M < block_size:
            raise InvalidArgument(f"M={M} is less than one block of {block_size} tokens")
        return cls(num_blocks=M // block_size + 1, block_size=block_size, **kw)  # type: ignore[arg-type]

    @property
    def M(self) -> int:
        """Usable KV capacity in tokens: ``(num_blocks − 1)·B``."""
        return (self.num_blocks - 1) * self.block_size

    @classmethod
    def from_params(cls, params: ModelParams, *, max_model_len: int | None = None) -> ReplayConfig:
        """vLLM's configuration of the server ``params``: ``num_blocks = M/B + 1``
        (vLLM's reserved null block), ``block_size = B``,
        ``max_num_batched_tokens = ŝ``, ``max_num_seqs`` and prefix caching.

        The inverse of :meth:`params` (``from_params(c.params()) == c`` for a
        config ``c`` without ``max_model_len``).  Refused, naming the field, for
        a server vLLM cannot be: ``M`` not a whole number of blocks, a token
        budget other than the chunk (vLLM's one budget is both), or no cap on
        running requests.  ``b̄`` and the ``g`` convention are not vLLM's
        settings: :meth:`params` gives ModelParams' defaults back for them.
        """
        if params.M % params.block:
            raise InvalidArgument(
                f"vLLM's pool is whole blocks: M={params.M} is not a multiple of the block size B={params.block}"
            )
        if params.token_budget != params.chunk:
            raise InvalidArgument(
                f"vLLM's max_num_batched_tokens is both the token budget and the prefill chunk: need "
                f"token_budget == chunk, got token_budget={params.token_budget}, chunk={params.chunk}"
            )
        if params.max_num_seqs is None:
            raise InvalidArgument("vLLM always caps the running requests: give the server a max_num_seqs")
        return cls(
            num_blocks=params.M // params.block + 1,
            block_size=params.block,
            max_num_batched_tokens=params.chunk,
            max_num_seqs=params.max_num_seqs,
            max_model_len=max_model_len,
            enable_prefix_caching=params.prefix_caching,
        )

    def params(self) -> ModelParams:
        """The kvstab parameters of the same server (chunk = token budget, as vLLM has no other cap)."""
        return ModelParams(
            M=self.M,
            chunk=self.max_num_batched_tokens,
            block=self.block_size,
            token_budget=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            prefix_caching=self.enable_prefix_caching,
        )

    def model_len(self, plan: ArrivalPlan) -> int:
        """``max_model_len`` for ``plan``: the configured one, or the longest ``s + o`` in it."""
        if self.max_model_len is not None:
            return self.max_model_len
        return int((plan.s + plan.o).max()) if len(plan) else self.block_size

    @staticmethod
    def help() -> dict[str, str]:
        """Help text of every field."""
        return {f.name: str(f.metadata.get("help", "")) for f in fields(ReplayConfig)}


def _first(mask: npt.NDArray[np.bool_]) -> int | None:
    """The first index ``mask`` marks (the first request over a bound, the first step two logs differ at), or ``None``."""
    hit = np.flatnonzero(mask)
    return int(hit[0]) if hit.size else None


def check_plan(plan: ArrivalPlan, config: ReplayConfig) -> None:
    """Raise :class:`InvalidArgument` naming the first request vLLM would refuse or never finish."""
    if not len(plan):
        raise InvalidArgument("the arrival plan holds no request")
    total = plan.s + plan.o
    max_len = config.model_len(plan)
    i = _first(total > max_len)
    if i is not None:
        raise InvalidArgument(
            f"request {i} has s + o = {int(total[i])} (s={int(plan.s[i])}, o={int(plan.o[i])}) over "
            f"max_model_len={max_len}; raise max_model_len or drop the request"
        )
    check_vllm_peaks(plan, config.block_size, config.M, "M=(num_blocks-1)·B", "vLLM would preempt it forever")


def check_vllm_peaks(plan: ArrivalPlan, block: int, M: int, capacity: str, fate: str) -> None:
    """Raise :class:`InvalidArgument` naming the first request of ``plan`` (vLLM's terms) whose peak
    KV exceeds ``M`` tokens (``capacity``: how the message names ``M``; ``fate``: what vLLM would do
    with the request)."""
    # vLLM's peak KV for (s, o) is s + o - 1 tokens (the last token is sampled, never cached)
    peak = -(-(plan.s + plan.o - 1) // block) * block
    i = _first(peak > M)
    if i is not None:
        raise InvalidArgument(
            f"request {i} (s={int(plan.s[i])}, o={int(plan.o[i])}) needs {int(peak[i])} tokens of KV at its "
            f"peak but {capacity}={M}: {fate}"
        )


@dataclass(frozen=True, slots=True, eq=False)
class StepLog:
    """Every step of one replay, and every request's outcome (vLLM's terms: ``o = max_tokens``)."""

    source: str  # "vllm" or "model"
    config: ReplayConfig
    # per step
    arrived: IntArray
    admitted: IntArray  # requests that entered the running list
    preempted: IntArray
    completed: IntArray
    running: IntArray  # length of the running list after scheduling (scheduled or not)
    scheduled: IntArray  # requests that did work
    memory: IntArray  # KV tokens held after the step's allocation, B·blocks in use
    wasted: IntArray  # area thrown away by this step's preemptions
    tokens: IntArray  # tokens scheduled
    prefill_tokens: IntArray
    decode_tokens: IntArray
    kv_attended: IntArray  # Σ context (computed + new) of the scheduled requests
    prefill_reqs: IntArray  # requests that ran a prefill chunk
    prefill_ctx: IntArray  # Σ chunk × tokens cached before it, over prefill chunks
    prefill_sq: IntArray  # Σ chunk², over prefill chunks
    decode_ctx: IntArray  # Σ context (computed + 1) over decoding requests
    recomputed: IntArray  # tokens computed again after a preemption
    queue: IntArray  # waiting after the step
    # per request (plan order)
    s: IntArray
    o: IntArray
    arrival: IntArray
    first_admit: IntArray
    finish: IntArray
    preemptions: IntArray
    area: IntArray  # area of the attempt that finished (-1 if unfinished)
    final_s: IntArray  # kvstab prompt of the attempt that finished: s, or s + outputs recomputed (-1 if unfinished)
    request_wasted: IntArray
    request_recomputed: IntArray
    # the window boundary, for an exact area accounting (kvstab.empirical.decompose)
    checkpoint: int = 0  # the step at which the two columns below were taken (before its work)
    area_at_checkpoint: IntArray | None = None  # area of each request's attempt in progress then (0 if none)
    preemptions_at_checkpoint: IntArray | None = None  # preemptions each request had suffered by then
    area_at_end: IntArray | None = None  # area of each request's attempt in progress after the last step
    wall_s: float = 0.0  # wall-clock seconds the replay took

    @property
    def steps(self) -> int:
        """Number of steps replayed."""
        return int(self.arrived.size)

    @property
    def in_system(self) -> IntArray:
        """Requests waiting or running at the end of each step."""
        return np.cumsum(self.arrived) - np.cumsum(self.completed)

    def step_times(self, cost: Callable[[StepLog], FloatArray] | float) -> FloatArray:
        """Seconds of each step: a constant ``b̄`` or a batch-time model
        (anything with ``times(log)``, e.g. :class:`~kvstab.empirical.batchtime.BatchTimeModel`)."""
        if isinstance(cost, (int, float)):
            if not cost > 0:
                raise InvalidArgument(f"batch time b̄ must be > 0 seconds, got {cost!r}")
            return np.full(self.steps, float(cost))
        times = getattr(cost, "times", cost)
        return np.asarray(times(self), dtype=np.float64)

    def to_sim_result(self) -> SimResult:
        """The run as a :class:`~kvstab.simulator.SimResult` (for :mod:`kvstab.metrics`)."""
        return SimResult(
            scheduler=f"vllm-v1 ({self.source})",
            params=self.config.params(),
            slots=self.steps,
            served=np.where(self.area >= 0, self.area, 0) + self.request_wasted,
            **{k: getattr(self, k) for k in _SIM_COLUMNS},
        )

    def first_difference(self, other: StepLog) -> str | None:
        """Where ``other`` first departs from this log (a step-level or request-level field), or ``None``."""
        n = min(self.steps, other.steps)
        if self.steps != other.steps:
            return f"{self.source} ran {self.steps} steps, {other.source} {other.steps}"
        for name in StepRecorder.STEP:
            a, b = getattr(self, name)[:n], getattr(other, name)[:n]
            t = _first(a != b)
            if t is not None:
                return f"step {t}: {name} is {int(a[t])} on {self.source}, {int(b[t])} on {other.source}"
        for name in (
            "first_admit finish preemptions area final_s request_wasted request_recomputed area_at_checkpoint "
            "preemptions_at_checkpoint area_at_end"
        ).split():
            a, b = getattr(self, name), getattr(other, name)
            i = _first(a != b)
            if i is not None:
                return f"request {i}: {name} is {int(a[i])} on {self.source}, {int(b[i])} on {other.source}"
        return None


class StepRecorder:
    """Accumulates the per-step and per-request columns of a :class:`StepLog`."""

    STEP = (
        "arrived admitted preempted completed running scheduled memory wasted tokens prefill_tokens "
        "decode_tokens kv_attended prefill_reqs prefill_ctx prefill_sq decode_ctx recomputed queue"
    ).split()

    def __init__(self, plan: ArrivalPlan, checkpoint: int) -> None:
        n = len(plan)
        self.checkpoint = checkpoint
        self.area_at_checkpoint = np.zeros(n, dtype=np.int64)
        self.preemptions_at_checkpoint = np.zeros(n, dtype=np.int64)
        self.area_at_end = np.zeros(n, dtype=np.int64)
        self.cols: dict[str, list[int]] = {k: [] for k in self.STEP}
        self.s = plan.s.astype(np.int64).copy()
        self.o = plan.o.astype(np.int64).copy()
        self.arrival = np.full(n, -1, dtype=np.int64)
        self.first_admit = np.full(n, -1, dtype=np.int64)
        self.finish = np.full(n, -1, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.area = np.full(n, -1, dtype=np.int64)
        self.final_s = np.full(n, -1, dtype=np.int64)
        self.wasted = np.zeros(n, dtype=np.int64)
        self.recomputed = np.zeros(n, dtype=np.int64)

    def step(self, **values: int) -> None:
        """Append one step's values, one for each name in :attr:`STEP`."""
        for k in self.STEP:
            self.cols[k].append(int(values[k]))

    def at_step_start(self, t: int, attempt: dict[Any, int]) -> None:
        """Before step ``t``'s work: snapshot the attempts in progress at the checkpoint."""
        if t == self.checkpoint:
            for rid, a in attempt.items():
                self.area_at_checkpoint[int(rid)] = a
            self.preemptions_at_checkpoint[:] = self.preemptions

    def at_end(self, attempt: dict[Any, int]) -> None:
        """After the last step: the attempts still in progress."""
        for rid, a in attempt.items():
            self.area_at_end[int(rid)] = a

    def log(self, source: str, config: ReplayConfig, wall_s: float) -> StepLog:
        """The finished :class:`StepLog` of a replay on ``source`` (``"model"`` or ``"vllm"``)."""
        arr = {k: np.asarray(v, dtype=np.int64) for k, v in self.cols.items()}
        return StepLog(
            source=source,
            config=config,
            **arr,
            **{k: getattr(self, k) for k in _REQUEST_COLUMNS},
            area=self.area,
            final_s=self.final_s,
            request_wasted=self.wasted,
            request_recomputed=self.recomputed,
            checkpoint=self.checkpoint,
            area_at_checkpoint=self.area_at_checkpoint,
            preemptions_at_checkpoint=self.preemptions_at_checkpoint,
            area_at_end=self.area_at_end,
            wall_s=wall_s,
        )


def replay_horizon(plan: ArrivalPlan, steps: int | None) -> int:
    """The number of steps a replay of ``plan`` runs: ``steps``, which must be given (a positive integer)."""
    if steps is None:
        raise InvalidArgument("a replay needs a number of steps")
    return check_positive_int("steps", steps)


@dataclass(frozen=True, slots=True)
class SglangStep:
    """One SGLang step as the model replays it."""

    step: int
    kind: str  # "prefill", "decode" or "idle"
    admitted: tuple[int, ...]  # requests that entered the batch this step (first admissions and resumptions)
    retracted: tuple[int, ...]  # in SGLang's retraction order
    finished: tuple[int, ...]
    tokens: tuple[tuple[int, int], ...]  # (request, tokens computed this step), batch order
    prefill_tokens: int
    decode_tokens: int
    kv_used: int  # KV tokens held after the step, finished requests released
    new_token_ratio: float  # after the step
    batch_is_full: int  # after the step
    queue: int  # waiting after the step

    @classmethod
    def collected(
        cls,
        step: int,
        kind: str,
        lists: tuple[list[int], list[int], list[int], list[tuple[int, int]]],
        work: tuple[int, int],
        after: tuple[int, float, int, int],
    ) -> SglangStep:
        """A step from what a replay collects as it goes: the ``(admitted, retracted, finished,
        tokens)`` lists (frozen here), the ``(prefill, decode)`` tokens and the state after it,
        ``(kv_used, new_token_ratio, batch_is_full, queue)``: one constructor for the model's
        replay and SGLang's own."""
        admitted, retracted, finished, tokens = lists
        kv_used, ratio, full, queue = after
        return cls(
            step, kind, tuple(admitted), tuple(retracted), tuple(finished), tuple(tokens), work[0], work[1],
            kv_used, float(ratio), int(full), queue,
        )  # fmt: skip


@dataclass(frozen=True, slots=True, eq=False)
class SglangModelLog:
    """Every step of one replay on the model, and every request's outcome (SGLang's terms)."""

    rule: Sglang  # SGLang's own knobs
    params: ModelParams  # the server the replay ran on
    steps: tuple[SglangStep, ...]
    # per request, plan order
    s: tuple[int, ...]
    max_new: tuple[int, ...]  # after SGLang's arrival clip
    arrival: tuple[int, ...]
    first_admit: tuple[int, ...]
    finish: tuple[int, ...]
    retractions: tuple[int, ...]
    recomputed: tuple[int, ...]
    source: str = "model"  # "model", or "sglang" for SGLang's own scheduler (kvstab.empirical.sglang_driver)
    wall_s: float = 0.0  # wall-clock seconds the replay took
    engine: str = "reference"  # the model's engine: "fast" (compiled, kvstab.engine.sglang) or "reference"

    def first_difference(self, other: SglangModelLog) -> str | None:
        """Where ``other`` first departs from this log (a step field, then a request field), or ``None``."""
        for a, b in zip(self.steps, other.steps):
            for name in STEP_FIELDS:
                x, y = getattr(a, name), getattr(b, name)
                if x != y:
                    return f"step {a.step}: {name} is {x!r} on {self.source}, {y!r} on {other.source}"
        if len(self.steps) != len(other.steps):
            return f"{self.source} ran {len(self.steps)} steps, {other.source} {len(other.steps)}"
        for name in ("s", "max_new", "arrival", "first_admit", "finish", "retractions", "recomputed"):
            xs, ys = getattr(self, name), getattr(other, name)
            for k, (x, y) in enumerate(zip(xs, ys)):
                if x != y:
                    return f"request {k}: {name} is {x} on {self.source}, {y} on {other.source}"
            if len(xs) != len(ys):
                return f"{name}: {len(xs)} requests on {self.source}, {len(ys)} on {other.source}"
        return None


#: The per-request columns a :class:`StepLog` shares by name with its recorder and with a
#: :class:`~kvstab.simulator.SimResult`.
_REQUEST_COLUMNS = ("s", "o", "arrival", "first_admit", "finish", "preemptions")
#: Every column a :class:`StepLog` hands to :meth:`StepLog.to_sim_result` under its own name.
_SIM_COLUMNS = (
    "arrived", "admitted", "preempted", "completed", "running", "memory", "wasted", "tokens", "queue",
    *_REQUEST_COLUMNS, "request_wasted",
)

#: The step fields :meth:`SglangModelLog.first_difference` compares, in the order it reports them
#: (every :class:`SglangStep` field but ``step``).
STEP_FIELDS = (
    "kind", "admitted", "retracted", "finished", "tokens", "prefill_tokens", "decode_tokens", "kv_used",
    "new_token_ratio", "batch_is_full", "queue",
)
