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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvstab.errors import InvalidArgument
from kvstab.steplog import StepLog
from kvstab.theory.area import g_blocks, g_continuous, g_exact

__all__ = ["GapDecomposition", "decompose_gap", "TERMS"]

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
    wasted_total = float(log.wasted[w].sum())
    before = after = 0.0  # the window boundary, when the replay recorded it at this window's start
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
    s2 = log.final_s[done]
    o2 = s + o - 1 - s2  # decode units of the finishing attempt: same peak s + o − 1
    a_paper = g_continuous(s, o, chunk).mean()
    a_exact = g_exact(s, o, chunk).mean()
    a_first = area(s, o - 1, chunk, 1).mean()
    a_block = area(s, o - 1, chunk, B).mean()
    a_resumed = area(s2, o2, chunk, B).mean()
    a_final = float(log.area[done].mean())

    terms = {
        "capacity": float(np.log(M_paper / Mv)),
        "idle_cap": ln_idle * share(cap),
        "idle_preempt": ln_idle * share(pre),
        "idle_budget": ln_idle * share(spent),
        "idle_admission": ln_idle * share(rest),
        "waste": float(np.log(U / useful)),
        "boundary": float(np.log(useful / (useful - (after - before) / T))),
        "sample": float(np.log(a_paper / E_g_paper)),
        "partial_chunks": float(np.log(a_exact / a_paper)),
        "first_token": float(np.log(a_first / a_exact)),
        "block_rounding": float(np.log(a_block / a_first)),
        "recompute_shortcut": float(np.log(a_resumed / a_block)),
        "token_budget": float(np.log(a_final / a_resumed)),
    }
    gap = float(np.log(mu_paper / mu_meas))
    return GapDecomposition(
        mu_paper=mu_paper,
        mu_measured=mu_meas,
        gap=gap,
        terms=terms,
        residual=gap - float(sum(terms.values())),
        window_steps=T,
        completed=C,
    )
