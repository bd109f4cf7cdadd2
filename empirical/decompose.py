"""Where the paper formula's gap to vLLM comes from: an exact accounting of one replay.

Over the steady-state window ``W`` of ``T`` steps, every KV token-step of
memory belongs either to an attempt that finishes (useful area) or to one a
preemption throws away.  Hence, with ``Ū`` the mean memory in use, ``w̄`` the
area preemptions threw away per step and ``ḡ`` the mean area of the finishing
attempts of the ``C`` requests completed in ``W``,

    C / T  =  (Ū − w̄) / ḡ · e^(−r)

where ``r`` is the window boundary: the area the requests completing in ``W``
were served before it, less the area of attempts still in progress at its end.
A replay records both (its ``checkpoint`` columns), so ``r`` is computed, not
left over; the residual is then zero up to rounding.  The paper's
``μ·b̄ = M / E[g_paper]`` therefore departs from the measured ``C / T`` by

    ln(μ_paper·b̄ / (C/T)) = ln(M / M_vllm)               capacity (block multiple, null block)
                          + ln(M_vllm / Ū)               idle memory (split by cause below)
                          + ln(Ū / (Ū − w̄))              preemption waste
                          + r                            window boundary
                          + ln(ḡ / E[g_paper])          area per request (split below)

and the area term splits along a chain of per-request areas, each averaged
over the completed requests: the sample itself (``g_paper`` over them vs its
expectation), partial last chunks (exact ``g`` vs the continuous form), the
first output token sampled by the last prefill step (``o − 1`` decode steps),
block rounding (``B⌈·/B⌉``), the recompute shortcut (a resumed request's
outputs re-enter as one chunked prefill), and the token budget (chunks shorter
than ``ŝ`` when the budget is shared).  Idle memory splits in proportion to the
idle token-steps of steps where the ``max_num_seqs`` cap bound, where a
preemption stopped admission, where the token budget was spent with requests
waiting (the server is compute-bound, not memory-bound: the formula's premise
fails), and the rest (the whole-prompt admission check, head-of-line blocking).  Terms are natural logs; ``100·term`` is the share of
the gap in percent (log points).

With prefix caching on, the same plan runs on the same server twice, caching on
and off, and :func:`decompose_caching` splits ``ln(μ_on / μ_off)`` the same way:
shared memory (a block held by several requests counts once in ``Ū`` but is part
of each holder's own table), the area per completed request (a hit's prefill
starts past its cached blocks), memory in use, waste and the window boundary;
:class:`CachingDecomposition` also gives the prefill tokens the hits saved per
completion and the compute ceilings they move.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kvstab.errors import InvalidArgument
from kvstab.steplog import StepLog
from kvstab.theory.area import g_blocks, g_continuous, g_exact

__all__ = [
    "GapDecomposition",
    "decompose_gap",
    "TERMS",
    "CACHING_TERMS",
    "CachingDecomposition",
    "WindowAccount",
    "decompose_caching",
    "window_account",
]

#: (key, label) of every term, in the order of the accounting above.
TERMS: tuple[tuple[str, str], ...] = (
    ("capacity", "capacity: (num_blocks−1)·B vs M"),
    ("idle_cap", "idle memory: max_num_seqs cap"),
    ("idle_preempt", "idle memory: no admission after a preemption"),
    ("idle_budget", "idle memory: token budget spent (compute-bound)"),
    ("idle_admission", "idle memory: whole-prompt admission, head-of-line"),
    ("waste", "preemption waste (area thrown away)"),
    ("boundary", "window boundary (work before it, in progress after it)"),
    ("sample", "sample of completed requests vs E[g]"),
    ("partial_chunks", "partial last chunk (exact vs continuous g)"),
    ("first_token", "first token sampled by the last prefill step"),
    ("block_rounding", "block rounding B⌈·/B⌉"),
    ("recompute_shortcut", "recompute: outputs re-enter as one prefill"),
    ("token_budget", "token budget: chunks shorter than ŝ"),
)


@dataclass(frozen=True, slots=True)
class GapDecomposition:
    """The paper formula's gap to a replay, term by term (log points)."""

    mu_paper: float  # per step
    mu_measured: float  # C / T
    gap: float  # ln(mu_paper / mu_measured)
    terms: dict[str, float]
    residual: float  # gap − Σ terms: rounding when the replay recorded the window boundary
    window_steps: int
    completed: int
    #: ``(key, label)`` of every term, in the accounting's order: vLLM's :data:`TERMS` unless
    #: the decomposition is another engine's (:data:`kvstab.empirical.decompose_sglang.SGLANG_TERMS`)
    labels: tuple[tuple[str, str], ...] = TERMS

    @classmethod
    def of(
        cls,
        mu_paper: float,
        mu_measured: float,
        terms: dict[str, float],
        window_steps: int,
        completed: int,
        labels: tuple[tuple[str, str], ...] = TERMS,
    ) -> GapDecomposition:
        """The decomposition whose terms are ``terms`` (put in the order of ``labels``); the gap and the
        residual follow from the two rates."""
        gap = float(np.log(mu_paper / mu_measured))
        return cls(
            mu_paper=mu_paper,
            mu_measured=mu_measured,
            gap=gap,
            terms={k: terms[k] for k, _ in labels},
            residual=gap - float(sum(terms.values())),
            window_steps=window_steps,
            completed=completed,
            labels=labels,
        )

    @property
    def explained(self) -> float:
        """Σ of the terms."""
        return float(sum(self.terms.values()))

    def rows(self) -> list[tuple[str, float]]:
        """``(label, percent)`` for every term, then the residual and the total."""
        out = [(label, 100.0 * self.terms[key]) for key, label in self.labels]
        out.append(("residual", 100.0 * self.residual))
        out.append(("total: ln(μ_paper / μ_measured)", 100.0 * self.gap))
        return out


def area(s: np.ndarray, o: np.ndarray, chunk: int, block: int) -> np.ndarray:
    """Lifetime area ``g`` with blocks of ``block`` tokens, also for ``o = 0`` (a request that
    ends with its prefill, as a vLLM request with ``max_tokens = 1`` does in kvstab's terms):
    ``g(s, 0) = g(s, 1) − B⌈(s + 1)/B⌉``, the last decode slot taken off."""
    o1 = np.maximum(o, 1)
    full = g_blocks(s, o1, chunk, block) if block > 1 else g_exact(s, o1, chunk)
    last = block * (-(-(s + 1) // block))
    return np.where(o == 0, full - last, full)


def area_chain(
    s: np.ndarray, o_paper: np.ndarray, o: np.ndarray, s2: np.ndarray, chunk: int, block: int
) -> tuple[float, float, float, float, float]:
    """The mean areas per completed request along the chain of the area term: the paper's continuous
    ``g`` and the exact ``g`` (of ``o_paper`` outputs), the first token sampled by the last prefill
    step (``o − 1`` decode steps), rounded to ``block``, and the finishing attempt's (prompt ``s2``
    and the decode steps left to the same peak ``s + o − 1``)."""
    o2 = s + o - 1 - s2
    return (
        float(g_continuous(s, o_paper, chunk).mean()),
        float(g_exact(s, o_paper, chunk).mean()),
        float(area(s, o - 1, chunk, 1).mean()),
        float(area(s, o - 1, chunk, block).mean()),
        float(area(s2, o2, chunk, block).mean()),
    )


def waste_to_first_token(
    U: float, useful: float, boundary: float, T: int, E_g_paper: float, a_paper: float, a_exact: float, a_first: float
) -> dict[str, float]:
    """The terms every engine's accounting has, in its order: the waste (mean memory ``U``, of it
    ``useful``), the window boundary (``boundary`` token-steps over ``T`` steps), and the first
    links of the area chain (:func:`area_chain`) from ``E[g]`` to the first token."""
    return {
        "waste": float(np.log(U / useful)),
        "boundary": float(np.log(useful / (useful - boundary / T))),
        "sample": float(np.log(a_paper / E_g_paper)),
        "partial_chunks": float(np.log(a_exact / a_paper)),
        "first_token": float(np.log(a_first / a_exact)),
    }


def _boundary(log: StepLog, w: slice, done: np.ndarray) -> tuple[float, float, float]:
    """The area thrown away in the window ``w`` (its part before ``w`` taken off), the area served before
    ``w`` to the attempts that complete in it, and the area in ``w`` of the attempts still in progress at
    the end; the last two are 0 unless the replay recorded its checkpoint at ``w``'s start."""
    wasted_total = float(log.wasted[w].sum())
    before = after = 0.0
    if (
        log.checkpoint == w.start
        and log.area_at_checkpoint is not None
        and log.preemptions_at_checkpoint is not None
        and log.area_at_end is not None
    ):
        A0 = log.area_at_checkpoint.astype(np.float64)
        same = log.preemptions == log.preemptions_at_checkpoint  # the attempt of the checkpoint goes on
        before = float(A0[done & same].sum())  # served before W to attempts that complete in W
        wasted_total -= float(A0[~same].sum())  # the part before W of attempts thrown away in W
        open_ = log.finish < 0
        after = float((log.area_at_end[open_] - np.where(same[open_], A0[open_], 0.0)).sum())
    return wasted_total, before, after


def decompose_gap(log: StepLog, M_paper: int, E_g_paper: float, warmup: float = 0.25) -> GapDecomposition:
    """Decompose ``ln(M_paper / E_g_paper / (C/T))`` for ``log`` (see the module docstring).

    ``E_g_paper`` is the paper's ``E[g]`` (continuous form, chunk ``ŝ``) of the
    workload the plan was drawn from.
    """
    from kvstab.empirical.estimators import window

    w = window(log, warmup)
    T = w.stop - w.start
    cfg = log.config
    chunk = cfg.max_num_batched_tokens
    B = cfg.block_size
    done = (log.finish >= w.start) & (log.finish < w.stop)
    C = int(done.sum())
    if C == 0:
        raise InvalidArgument("no request completed in the steady-state window; run longer")
    mu_paper = M_paper / E_g_paper
    mu_meas = C / T
    mem = log.memory[w].astype(np.float64)
    Mv = float(cfg.M)
    U = float(mem.mean())
    wasted_total, before, after = _boundary(log, w, done)
    wasted = wasted_total / T
    useful = U - wasted
    if useful <= 0 or useful - (after - before) / T <= 0:
        raise InvalidArgument("the window's memory is all wasted area; the decomposition is undefined")

    # idle memory by cause, per step (the categories are exclusive, in this order)
    idle = Mv - mem
    waiting = log.queue[w] > 0
    cap = (log.running[w] >= cfg.max_num_seqs) & waiting
    pre = (log.preempted[w] > 0) & ~cap
    spent = (log.tokens[w] >= cfg.max_num_batched_tokens) & waiting & ~cap & ~pre
    rest = ~cap & ~pre & ~spent
    idle_total = float(idle.sum())
    ln_idle = float(np.log(Mv / U))
    share = (lambda m: float(idle[m].sum()) / idle_total if idle_total > 0 else 0.0)

    s = log.s[done]
    o = log.o[done]
    a_paper, a_exact, a_first, a_block, a_resumed = area_chain(s, o, o, log.final_s[done], chunk, B)
    a_final = float(log.area[done].mean())

    terms = {
        "capacity": float(np.log(M_paper / Mv)),
        "idle_cap": ln_idle * share(cap),
        "idle_preempt": ln_idle * share(pre),
        "idle_budget": ln_idle * share(spent),
        "idle_admission": ln_idle * share(rest),
        **waste_to_first_token(U, useful, after - before, T, E_g_paper, a_paper, a_exact, a_first),
        "block_rounding": float(np.log(a_block / a_first)),
        "recompute_shortcut": float(np.log(a_resumed / a_block)),
        "token_budget": float(np.log(a_final / a_resumed)),
    }
    return GapDecomposition.of(mu_paper, mu_meas, terms, T, C)


#: (key, label) of every term of the caching gap ``ln(μ_on / μ_off)`` (:func:`decompose_caching`), in order.
CACHING_TERMS: tuple[tuple[str, str], ...] = (
    ("shared", "(b) shared memory: blocks counted once (sharing on / off)"),
    ("area", "(a) saved prefill compute: area per completed request (hits skip prefill steps)"),
    ("idle", "memory in use (on / off)"),
    ("waste", "preemption waste"),
    ("boundary", "window boundary"),
)


@dataclass(frozen=True, slots=True)
class WindowAccount:
    """One replay's steady-state window as the caching accounting reads it (per step unless said)."""

    steps: int  # T
    completed: int  # C
    memory: float  # Ū: distinct KV tokens in use (a shared block once)
    charged: float  # Ā: Σ of every request's own block table (a shared block once per holder)
    wasted: float  # w̄: area preemptions threw away
    boundary: float  # (area in progress at the end − area served before the window) / T
    area: float  # ḡ: mean area of the completing attempts (their own tables)
    prompt: float  # prompt tokens per completion
    prefill: float  # prefill tokens computed per completion (hits are not computed)
    computed: float  # tokens computed per completion, prefill and decode
    budget_spent: float  # share of steps whose token budget was spent with requests waiting

    @property
    def sharing(self) -> float:
        """σ = Ā / Ū: how many requests' tables the memory in use holds per token (1 without sharing)."""
        return self.charged / self.memory

    @property
    def rate(self) -> float:
        """Completions per step, ``C / T``."""
        return self.completed / self.steps


def window_account(log: StepLog, warmup: float = 0.25) -> WindowAccount:
    """The steady-state window of ``log``: ``C/T = (Ā − w̄ − boundary) / ḡ`` exactly, where ``Ā`` is the
    requests' own block tables summed (the per-request areas the replay recorded), so ``Ā = Ū`` when
    nothing is shared and ``Ā > Ū`` when blocks are held by several requests at once."""
    from kvstab.empirical.estimators import window

    w = window(log, warmup)
    T = w.stop - w.start
    done = (log.finish >= w.start) & (log.finish < w.stop)
    C = int(done.sum())
    if C == 0:
        raise InvalidArgument("no request completed in the steady-state window; run longer")
    wasted_total, before, after = _boundary(log, w, done)
    served = float(log.area[done].sum())
    # every token-step a request's own table held in W: its completing, thrown-away and open attempts
    charged = (served - before + wasted_total + after) / T
    waiting = log.queue[w] > 0
    spent = (log.tokens[w] >= log.config.max_num_batched_tokens) & waiting
    return WindowAccount(
        steps=T,
        completed=C,
        memory=float(log.memory[w].mean()),
        charged=charged,
        wasted=wasted_total / T,
        boundary=(after - before) / T,
        area=served / C,
        prompt=float(log.s[done].mean()),
        prefill=float(log.prefill_tokens[w].sum()) / C,
        computed=float(log.tokens[w].sum()) / C,
        budget_spent=float(spent.mean()),
    )


@dataclass(frozen=True, slots=True)
class CachingDecomposition:
    """Prefix caching on against off on the same plan: ``ln(μ_on / μ_off)`` term by term
    (:data:`CACHING_TERMS`), and the prefill compute the hits saved."""

    on: WindowAccount
    off: WindowAccount
    gap: float  # ln(μ_on / μ_off), μ = C / T of each run
    terms: dict[str, float]
    residual: float  # gap − Σ terms: rounding when both replays recorded the window boundary
    budget: int  # the token budget of one step

    @property
    def ratio(self) -> float:
        """μ_on / μ_off."""
        return float(np.exp(self.gap))

    @property
    def saved(self) -> float:
        """Prefill tokens per completion not computed thanks to hits (off's less on's)."""
        return self.off.prefill - self.on.prefill

    def ceilings(self) -> tuple[float, float, float]:
        """The compute ceilings ``budget / tokens computed per completion`` (completions per step) off,
        on, and on without the saving (sharing memory but computing every prompt token)."""
        b = float(self.budget)
        return b / self.off.computed, b / self.on.computed, b / (self.on.computed + self.saved)

    def rows(self) -> list[tuple[str, float]]:
        """``(label, log points)`` for every term, then the residual and the total."""
        out = [(label, 100.0 * self.terms[key]) for key, label in CACHING_TERMS]
        out.append(("residual", 100.0 * self.residual))
        out.append(("total: ln(μ_on / μ_off)", 100.0 * self.gap))
        return out


def decompose_caching(on: StepLog, off: StepLog, warmup: float = 0.25) -> CachingDecomposition:
    """Why caching on completes more requests per step than off, on the same plan and server.

    With ``f = (Ā − w̄ − boundary)/Ā`` the share of the charged area that completes in the window,
    ``C/T = Ū · σ · f / ḡ`` in each run, so ``ln(μ_on/μ_off)`` is exactly the sum of: shared memory
    ``ln(σ_on/σ_off)`` (a shared block is one block of ``Ū`` but part of every holder's table), the
    area per completed request ``ln(ḡ_off/ḡ_on)`` (a hit's prefill starts past the cached blocks, so
    its lifetime loses the prefill steps that computed them), memory in use ``ln(Ū_on/Ū_off)``,
    preemption waste and the window boundary (``f`` in two links).
    """
    if not on.config.enable_prefix_caching or replace(on.config, enable_prefix_caching=False) != off.config:
        raise InvalidArgument("the caching decomposition compares two runs of one server, caching on and off")
    a, b = window_account(on, warmup), window_account(off, warmup)

    def links(x: WindowAccount) -> tuple[float, float]:
        useful = x.charged - x.wasted
        return useful / x.charged, (useful - x.boundary) / useful

    (wa, ba), (wb, bb) = links(a), links(b)
    terms = {
        "shared": float(np.log(a.sharing / b.sharing)),
        "area": float(np.log(b.area / a.area)),
        "idle": float(np.log(a.memory / b.memory)),
        "waste": float(np.log(wa / wb)),
        "boundary": float(np.log(ba / bb)),
    }
    gap = float(np.log(a.rate / b.rate))
    return CachingDecomposition(
        on=a, off=b, gap=gap, terms=terms, residual=gap - float(sum(terms.values())),
        budget=off.config.max_num_batched_tokens,
    )

