"""``kvstab audit``: one scheduler variant, end to end (start reading here).

:func:`run_audit` runs four sections and a verdict:

1. **theory** — ``E[g]``, ``μ``, ``δ``, ``μ(1−δ)`` and the rate certified for
   this policy (:func:`kvstab.theory.certified.policy_guarantee`);
2. **proofs** — the memory invariant (``Proved`` / ``Refuted`` / ``Unknown``)
   and the work-conservation margin ``Δ`` at the profile's proof scale
   (:mod:`kvstab.proofs`);
3. **properties** — the Hypothesis property suite in process at the profile
   (:func:`kvstab.audit.properties.run_properties`);
4. **stability** — ``λ*`` with an interval for the variant and each baseline
   (:func:`kvstab.audit.stability.find_critical_rate`).

``Unknown`` never passes: an undecided proof or an unresolved search leaves
the verdict ``INCONCLUSIVE`` (exit 3 with ``strict``), never ``PASS``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvstab.audit.profiles import AuditProfile
from kvstab.audit.properties import PropertiesSection
from kvstab.audit.runs import Certificate
from kvstab.audit.stability import StabilityRegion, find_critical_rate
from kvstab.contract import Scheduler
from kvstab.errors import InvalidArgument, InvalidScheduler, InvariantViolation
from kvstab.jsonform import JsonRecord, record_json, to_json
from kvstab.model import DEFAULT_WINDOW, ModelParams

if TYPE_CHECKING:
    from kvstab.proofs.encoding import Setting
    from kvstab.proofs.margins import MarginResult as Search
    from kvstab.proofs.solver import Budget
    from kvstab.proofs.verdicts import Verdict
    from kvstab.theory.report import StabilityReport

__all__ = [
    "AuditConfig", "AuditResult", "Check", "run_audit", "SECTIONS", "SKIPPABLE", "EXIT", "SCHEMA_VERSION",
    "TheorySection", "Certificate", "MU_NO_SHARING", "caching_lines", "ProofsSection", "InvariantResult", "MarginResult", "ClaimsResult", "ClaimResult",
]

#: what every output of an audit with prefix caching says, until the theory gives μ under sharing (issue 25)
MU_NO_SHARING = (
    "μ is the no-sharing formula (every request holds its own KV): with prefix caching shared prompt blocks "
    "count once against M and skip their prefill, so measured/μ may exceed 1"
)

#: the version of ``report.json``'s schema (docs/audit.md, "report.json")
SCHEMA_VERSION = "kvstab.audit/1"
SECTIONS = ("theory", "proofs", "properties", "stability")
#: sections ``--skip`` may leave out (theory is cheap and every other section uses it)
SKIPPABLE = ("proofs", "properties", "stability")
#: exit status of each verdict
EXIT = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 0, "INCOMPLETE": 0}
EXIT_STRICT_INCONCLUSIVE = 3


@dataclass(frozen=True, slots=True)
class AuditConfig:
    """What to audit and how much to spend."""

    scheduler: str = field(metadata={"help": "registered name or module:attr of the variant"})
    params: ModelParams = field(metadata={"help": "the server (its batch time b̄ included)"})
    workload: str = field(metadata={"help": "workload spec (lengths); arrivals are Poisson at each rate"})
    baselines: tuple[str, ...] = field(default=("current-fit", "vllm-v1"), metadata={"help": "schedulers compared"})
    profile: AuditProfile | None = field(default=None, metadata={"help": "cost profile (dev/ci/thorough)"})
    skip: tuple[str, ...] = field(default=(), metadata={"help": "sections not run (never counted as passed)"})
    strict: bool = field(default=False, metadata={"help": "an Unknown or unresolved result fails (exit 3)"})
    require_rate: float | None = field(default=None, metadata={"help": "fail if λ* is below this rate (req/s)"})
    max_waste: float | None = field(default=None, metadata={"help": "fail if the waste just below λ* exceeds this"})
    seed: int = field(default=0, metadata={"help": "base seed of the simulations"})
    window: int = field(
        default=DEFAULT_WINDOW, metadata={"help": "the queue-head window the simulations show the rule first"}
    )

    def __post_init__(self) -> None:
        bad = [s for s in self.skip if s not in SKIPPABLE]
        if bad:
            raise InvalidArgument(f"--skip {bad[0]!r} is not a section that can be skipped; valid: {', '.join(SKIPPABLE)}")


@dataclass(frozen=True, slots=True)
class Check(JsonRecord):
    """One line of the verdict: a section's outcome."""

    name: str
    status: str  # "pass", "fail", "unknown", "skipped", "info"
    detail: str
    #: the one command line that shows a failure again (``kvstab replay``/``check``/``prove`` with the spec
    #: the user gave); left out of the JSON where the check has none
    replay_command: str | None = field(default=None, metadata={"json": "optional"})


def _with_verdict(record: InvariantResult | MarginResult | ClaimResult, first: tuple[str, ...] = ()) -> dict[str, Any]:
    """A record that carries a proof verdict, as JSON: the fields named in ``first``, the
    verdict's own fields (``verdict``, then its method, detail or reason: the form ``kvstab prove --json``
    writes too), then the rest."""
    from kvstab.proofs.verdicts import verdict_json

    rest = record_json(record)
    head = {k: rest.pop(k) for k in first}
    return {**head, **verdict_json(record.verdict), **rest}


def _verdict_word(v: Verdict) -> str:
    """``Proved``, ``Refuted`` or ``Unknown``: the ``verdict`` field of the JSON form."""
    return type(v).__name__


@dataclass(frozen=True, slots=True)
class TheorySection(JsonRecord):
    """The theory section: ``E[g]``, ``μ``, ``δ``, ``μ(1−δ)`` and the certified rates.

    Its JSON form spells out the report's figures under report.json's names (``workload``,
    ``E_g``, ``mu_per_s``, ``mu_per_slot``, ``delta``, ``mu_1_minus_delta_per_s``), then the
    certificate's fields, ``max_s``, ``max_o`` and the baselines' certificates."""

    report: StabilityReport = field(
        metadata={"help": "E[g], μ, δ, μ(1−δ) of the workload on the audited server", "json": False}
    )
    certificate: Certificate = field(metadata={"help": "the rate certified for the audited policy", "json": False})
    max_s: int = field(metadata={"help": "the workload's longest prompt"})
    max_o: int = field(metadata={"help": "the workload's longest output"})
    baselines: dict[str, Certificate] = field(default_factory=dict, metadata={"help": "each baseline's certificate"})

    def to_json(self) -> dict[str, Any]:
        """The report's figures, the certificate, the longest request, the baselines (report.json's ``theory``)."""
        r = self.report
        figures = {"workload": r.workload, "E_g": r.E_g, "mu_per_s": r.mu_per_s, "mu_per_slot": r.mu_per_slot,
                   "delta": r.delta, "mu_1_minus_delta_per_s": r.guarantee_per_s}
        return {**figures, **self.certificate.to_json(), **record_json(self)}


@dataclass(frozen=True, slots=True)
class InvariantResult(JsonRecord):
    """The memory invariant's verdict, its scope and what it took."""

    verdict: Verdict = field(metadata={"help": "Proved / Refuted / Unknown", "json": False})
    K: int = field(metadata={"help": "active requests bounded (where not unbounded)"})
    Q: int = field(metadata={"help": "queued requests bounded (where not unbounded)"})
    unbounded: bool = field(metadata={"help": "proved for any number of requests"})
    strengthening: tuple[str, ...] = field(metadata={"help": "the conjuncts that made it inductive"})
    notes: tuple[str, ...] = field(metadata={"help": "what the prover noted"})
    total_budget_s: float = field(metadata={"help": "the proofs section's wall-clock budget"})
    seconds: float = field(metadata={"help": "wall-clock seconds spent"})
    assumptions: tuple[str, ...] = field(metadata={"help": "what a Proved verdict assumes"})
    replay_command: str | None = field(
        default=None, metadata={"json": "optional", "help": "the one line that shows a refutation again"}
    )

    @property
    def scope(self) -> str:
        """What the verdict covers: any number of requests (the unbounded theorem) or its bounds."""
        if self.unbounded:
            return "any number of requests"
        return f"at most {self.K} active and {self.Q} queued requests"

    def to_json(self) -> dict[str, Any]:
        """The verdict's fields, then the record's, then ``scope``."""
        return {**_with_verdict(self), "scope": self.scope}


@dataclass(frozen=True, slots=True)
class MarginResult(JsonRecord):
    """The work-conservation margin ``Δ`` at the profile's proof scale."""

    verdict: Verdict = field(metadata={"help": "Proved / Refuted / Unknown", "json": False})
    K: int = field(metadata={"help": "active requests bounded"})
    Q: int = field(metadata={"help": "queued requests bounded"})
    delta: int | None = field(metadata={"help": "the proved margin Δ, tokens"})
    declared: int | None = field(metadata={"help": "the margin the scheduler declares"})
    M: int | None = field(metadata={"help": "the small server's memory"})
    chunk: int = field(metadata={"help": "the small server's chunk"})
    block: int = field(metadata={"help": "the small server's block"})
    max_s: int = field(metadata={"help": "longest prompt searched"})
    max_o: int = field(metadata={"help": "longest output searched"})
    paper_delta_times_M: float | None = field(metadata={"help": "the paper's δ·M, tokens"})
    declared_holds: bool | None = field(metadata={"help": "Δ ≤ the declared margin (None: either unknown)"})
    spec: str = field(metadata={"help": "the scheduler's spec"})
    every_M_from: int | None = field(
        default=None, metadata={"help": "Δ holds for every M from this one on (None: only at M)"}
    )
    audited_M: int | None = field(default=None, metadata={"help": "the audited server's M"})
    why_not_audited_M: str | None = field(
        default=None, metadata={"json": "optional", "help": "why Δ is given at the search's M, not the audited one"}
    )

    @classmethod
    def of(cls, found: Search, K: int, Q: int, server: Setting, spec: str, audited_M: int, declared: int | None,
           *, every_M_from: int | None = None, why_not_audited_M: str | None = None) -> MarginResult:
        """The record of the margin search ``found`` at bounds ``K``/``Q`` on the small ``server`` (its
        chunk and block), beside the margin the rule ``declared``; ``every_M_from`` or
        ``why_not_audited_M`` says at which ``M`` it holds."""
        delta = found.delta
        return cls(
            found.verdict, K=K, Q=Q, delta=delta, declared=declared, M=found.M, chunk=server.chunk,
            block=server.block, max_s=found.max_s, max_o=found.max_o, paper_delta_times_M=found.paper_delta_tokens,
            declared_holds=None if delta is None or declared is None else delta <= declared, spec=spec,
            every_M_from=every_M_from, audited_M=audited_M, why_not_audited_M=why_not_audited_M,
        )

    @property
    def where(self) -> str:
        """At which ``M`` the margin holds, in words: every ``M`` (so the audited one), or the search's ``M``
        named as the largest the bounded search reaches."""
        if self.M is None:
            at = "" if self.audited_M is None else f", so at the audited M = {self.audited_M}"
            return f"for every M ≥ {self.every_M_from}{at}"
        if self.audited_M is None or self.audited_M == self.M:
            return f"at M = {self.M}"
        return (f"at M = {self.M}, the largest M the bounded search reaches (not the audited M = {self.audited_M}: "
                f"{self.why_not_audited_M or 'no Δ for every M'})")

    def to_json(self) -> dict[str, Any]:
        """The verdict's fields, then the record's, then ``where`` (at which ``M``, in words)."""
        return {**_with_verdict(self), "where": self.where}


@dataclass(frozen=True, slots=True)
class ClaimResult(JsonRecord):
    """One declared claim's verdict and how to see a refutation again."""

    claim: str = field(metadata={"help": "the claim's name"})
    verdict: Verdict = field(metadata={"help": "Proved / Refuted / Unknown", "json": False})
    scope: str = field(metadata={"help": "what the verdict covers"})
    note: str = field(metadata={"help": "the prover's note"})
    witness: str = field(metadata={"help": "a refutation's witness, as text"})
    replay_commands: tuple[str, ...] = field(metadata={"help": "kvstab replay lines that show a refutation"})

    def to_json(self) -> dict[str, Any]:
        """``claim``, the verdict's fields, then the rest."""
        return _with_verdict(self, ("claim",))


@dataclass(frozen=True, slots=True)
class ClaimsResult(JsonRecord):
    """The declared claims, proved at ``K``/``Q`` (or for any number of requests)."""

    K: int = field(metadata={"help": "active requests bounded"})
    Q: int = field(metadata={"help": "queued requests bounded"})
    claims: tuple[ClaimResult, ...] = field(metadata={"help": "one per declared claim"})


@dataclass(frozen=True, slots=True)
class ProofsSection(JsonRecord):
    """The proofs section: the memory invariant, the margin ``Δ`` and the declared claims."""

    invariant: InvariantResult = field(metadata={"help": "the memory invariant"})
    margin: MarginResult | None = field(default=None, metadata={"help": "Δ (None: the invariant is not proved)"})
    claims: ClaimsResult | None = field(default=None, metadata={"help": "the declared claims"})


@dataclass
class AuditResult:
    """Everything the audit found; :meth:`to_json` is ``report.json``."""

    config: AuditConfig
    theory: TheorySection | None = None
    proofs: ProofsSection | None = None
    properties: PropertiesSection | None = None
    regions: dict[str, StabilityRegion] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    complete: bool = False
    #: the audited scheduler's λ* with prefix caching the other way round from the run's (a workload with
    #: prefix structure only), and why there is none where there is none
    other_caching: StabilityRegion | None = None
    caching_note: str = ""

    @property
    def verdict(self) -> str:
        """``PASS`` when every check passed, ``FAIL`` when one failed, else ``INCONCLUSIVE``
        (``INCOMPLETE`` for the partial report of an audit that did not finish)."""
        st = {c.status for c in self.checks}
        if not self.complete:
            return "FAIL" if "fail" in st else "INCOMPLETE"
        if "fail" in st:
            return "FAIL"
        # a skipped section is not a pass either: the verdict word says so (exit 0 unless strict)
        if "unknown" in st or "skipped" in st:
            return "INCONCLUSIVE"
        return "PASS"

    @property
    def exit_status(self) -> int:
        """0 pass, 1 fail, 3 inconclusive under ``strict`` (0 otherwise: the verdict word still says it)."""
        if self.verdict in ("INCONCLUSIVE", "INCOMPLETE") and self.config.strict:
            return EXIT_STRICT_INCONCLUSIVE
        return EXIT[self.verdict]

    def to_json(self) -> dict[str, Any]:
        """The report as plain data (schema :data:`SCHEMA_VERSION`)."""
        c = self.config
        return {
            "schema": SCHEMA_VERSION,
            "scheduler": c.scheduler,
            "baselines": list(c.baselines),
            "server": {"M": c.params.M, "chunk": c.params.chunk, "block": c.params.block, "g": c.params.g,
                       "token_budget": c.params.token_budget, "max_num_seqs": c.params.max_num_seqs, "bbar_s": c.params.bbar,
                       "prefix_caching": c.params.prefix_caching},
            "workload": c.workload,
            "profile": c.profile.name if c.profile else None,
            "seed": c.seed,
            "window": c.window,
            "gates": {"require_rate_per_s": c.require_rate, "max_waste": c.max_waste, "strict": c.strict},
            # a report cut short before the theory section (never in practice: it runs first) keeps its old `{}`
            "theory": {} if self.theory is None else self.theory.to_json(),
            "proofs": to_json(self.proofs),
            "properties": to_json(self.properties),
            "stability": to_json(self.regions),
            "checks": to_json(self.checks),
            "prefix_caching": self.caching_json(),
            "complete": self.complete,
            "verdict": self.verdict,
            "exit_status": self.exit_status,
            "seconds": self.seconds,
        }


    def caching_json(self) -> dict[str, Any]:
        """``report.json``'s ``prefix_caching``: whether the runs cached prefixes, that ``μ`` is the
        no-sharing formula, measured/μ per scheduler, and λ* with and without caching side by side."""
        on = self.config.params.prefix_caching
        main = self.regions.get(self.config.scheduler)
        comparison = None
        if main is not None and self.other_caching is not None:
            with_, without = (main, self.other_caching) if on else (self.other_caching, main)
            comparison = {
                "scheduler": self.config.scheduler,
                "with_caching": _caching_summary(with_),
                "without_caching": _caching_summary(without),
                "ratio_with_over_without": with_.critical_rate / without.critical_rate if without.critical_rate else None,
                "other_search": self.other_caching.to_json(),
            }
        return {
            "enabled": on,
            "mu_formula": MU_NO_SHARING,
            "measured_over_mu": {name: r.saturated.throughput.value / r.mu for name, r in self.regions.items()},
            "comparison": comparison,
            "comparison_note": self.caching_note,
            "mu_sharing": _mu_sharing(self.config),
        }


def _mu_sharing(config: AuditConfig) -> dict[str, Any] | None:
    """μ with the shared part held once (``kvstab.theory.sharing``) beside the paper's μ, both per second,
    for a workload with a prefix law that has a closed form; ``None`` otherwise."""
    from kvstab.errors import KvstabError
    from kvstab.theory.sharing_area import sharing_report
    from kvstab.workload import parse_workload

    try:
        rep = sharing_report(parse_workload(config.workload), config.params)
    except KvstabError:
        return None  # a spec the theory cannot read (the audit has said so elsewhere)
    if rep is None:
        return None
    b = config.params.bbar
    return {"mu_per_s": rep.mu_per_slot / b, "mu_share_per_s": rep.mu_share_per_s,
            "predicted_per_s": rep.predicted_per_slot / b, "binding": rep.binding, "report": rep.as_dict()}


def _caching_summary(r: StabilityRegion) -> dict[str, Any]:
    """λ*, its interval and the saturated throughput of one search, beside the no-sharing μ."""
    sat = r.saturated.throughput
    return {
        "critical_rate_per_s": r.critical_rate,
        "critical_rate_ci_per_s": [r.low, r.high],
        "critical_over_mu": r.critical_rate / r.mu,
        "saturated_throughput_per_s": [sat.value, sat.low, sat.high],
        "saturated_over_mu": sat.value / r.mu,
        "resolved": r.resolved,
        "method": r.method,
    }


def theory_section(scheduler: Scheduler, params: ModelParams, workload: str,
                   baselines: Sequence[tuple[str, Scheduler]] = ()) -> TheorySection:
    """``E[g]``, ``μ``, ``δ``, ``μ(1−δ)`` and the rate certified for this policy and each baseline."""
    from kvstab.audit.runs import load_workload
    from kvstab.theory import stability_report

    w = load_workload(workload)
    rep = stability_report(w, params)
    return TheorySection(
        rep, Certificate.of(scheduler, params, w, rep.mu_per_s), max_s=w.max_s, max_o=w.max_o,
        baselines={name: Certificate.of(b, params, w, rep.mu_per_s) for name, b in baselines},
    )


#: the wall-clock budget of the proofs section, seconds, by profile (invariant and margin together):
#: a rule whose queries do not finish gets an ``Unknown`` that says so, never a hang
PROOF_TOTAL_S = {"dev": 60.0, "ci": 180.0, "thorough": 600.0}

#: seconds of the proofs' budget kept for the declared claims (at most a quarter of it)
CLAIMS_RESERVE_S = 20.0


def proofs_section(scheduler: Scheduler, spec: str, params: ModelParams, profile: AuditProfile,
                   smt2_dir: Path | None, log: Callable[[str], None] = lambda _line: None) -> ProofsSection:
    """The memory invariant (any ``M``, this server's ``ŝ``, ``B``, caps), the margin ``Δ``
    at the profile's proof scale with the scheduler's declared margin beside it, and
    the claims the scheduler declares (FCFS, non-clairvoyance, the progress premises).

    The invariant and each claim are proved for any number of requests where the
    rule is in the unbounded theorem's class (:mod:`kvstab.proofs.unbounded`), else
    at the profile's ``K``/``Q``; the ``scope`` fields say which.  All share the
    profile's total budget (:data:`PROOF_TOTAL_S`; the claims keep
    :data:`CLAIMS_RESERVE_S` of it); ``log`` hears each obligation group as it starts."""
    from kvstab.proofs.encoding import Setting
    from kvstab.proofs.prove import prove
    from kvstab.proofs.solver import Budget, progress_after

    total = PROOF_TOTAL_S.get(profile.name, PROOF_TOTAL_S["ci"])
    budget = Budget(rlimit=profile.proof_rlimit, seed=0, total_s=total,
                    progress=progress_after(lambda line: log(f"proofs: {line}")))
    if smt2_dir is not None:
        budget = dataclasses.replace(budget, smt2_dir=smt2_dir)
    budget = budget.started()
    setting = Setting.from_params(params, symbolic_M=True)
    # the declared claims are one-slot queries (seconds): the invariant and the margin leave them their
    # share of the budget, so that a long bounded flow cannot leave every claim Unknown
    first = budget.keeping(min(CLAIMS_RESERVE_S, total / 4))
    # the spec the user gave, where it loads this very object: every replay line then names the rule as they did
    rep = prove(_by_spec(scheduler, spec), K=profile.proof_K, Q=profile.proof_Q, setting=setting, budget=first,
                unbounded=True)
    inv = InvariantResult(rep.verdict, K=rep.K, Q=rep.Q, unbounded=rep.unbounded,
                          strengthening=tuple(rep.strengthening), notes=tuple(rep.notes), total_budget_s=total,
                          seconds=rep.seconds, assumptions=tuple(getattr(rep.verdict, "assumptions", ())))
    if _verdict_word(rep.verdict) == "Refuted":
        inv = dataclasses.replace(inv, replay_command=_invariant_replay(inv, spec, params))
    margin = None
    if _verdict_word(rep.verdict) == "Proved":
        margin = _margin(scheduler, spec, params, profile, rep.strengthening, first)
    return ProofsSection(inv, margin, _claims(scheduler, spec, setting, profile, budget))


def _by_spec(scheduler: Scheduler, spec: str) -> Scheduler | str:
    """``spec`` where it loads ``scheduler`` itself (so a proof's replay lines name the rule by the
    spec the user gave, never by its ``name``), else the object."""
    from kvstab.registry import load_scheduler

    try:
        return spec if load_scheduler(spec) is scheduler else scheduler
    except Exception:  # a spec that does not load this object: the object, named as before
        return scheduler


def _margin(scheduler: Scheduler, spec: str, params: ModelParams, profile: AuditProfile,
            strengthening: Sequence[str], budget: Budget) -> MarginResult:
    """The margin ``Δ`` over the states of the invariant just proved: one ``Δ`` for every ``M``
    (so at the audited one) where the policy has one, else the search at the profile's small
    ``M`` — the largest the bounded search reaches: with at most ``K`` active requests a larger
    server is never full, and every query there is vacuous."""
    from kvstab.model import tokens_held
    from kvstab.proofs.encoding import Setting
    from kvstab.proofs.invariants import MENU
    from kvstab.proofs.margins import work_conservation_margin

    # the margin is a search over Δ token by token: it runs on a server with this one's chunk and
    # block (capped so a prompt spans a few chunks), M symbolic first, then the profile's small M
    def server(M: int | None) -> Setting:
        return Setting(M=M, chunk=min(params.chunk, profile.margin_max_s), block=min(params.block, 4),
                       token_budget=None, max_num_seqs=params.max_num_seqs)

    small = server(profile.margin_M)
    used = [MENU[n] for n in strengthening if n in MENU]
    K, Q = profile.proof_K, profile.proof_Q
    k2, q2 = max(2, K // 2), max(1, Q // 2)
    smaller = (k2, q2) != (K, Q)
    max_s, max_o = profile.margin_max_s, profile.margin_max_o

    def search(M: int | None, k: int, q: int, keep: float | None = None) -> tuple[Any, int, int]:
        b = budget.keeping(keep) if keep is not None else budget
        return work_conservation_margin(scheduler, server(M), k, q, max_s, max_o, conjuncts=used, budget=b), k, q

    def half_then_full(M: int | None, share: bool) -> tuple[Any, int, int]:
        """The search at half the bounds, then at the profile's where the budget allows and the
        smaller one did not already refute (with ``share``, each takes at most half of what is left)."""
        def keep() -> float | None:
            left = budget.left()
            return left / 2 if share and left is not None else None

        t0, left0 = time.perf_counter(), budget.left()
        first = search(M, k2, q2, keep()) if smaller else None
        left1 = budget.left()
        # what the smaller search took, on the budget's own clock (the wall clock without one)
        taken = left0 - left1 if left0 is not None and left1 is not None else time.perf_counter() - t0
        if first is not None and (_verdict_word(first[0].verdict) == "Refuted" and M is None
                                  or not _affordable(budget, taken)):
            return first
        full = search(M, K, Q, keep())
        return full if first is None or _verdict_word(full[0].verdict) != "Unknown" else first

    # Both searches run at half the bounds first.  Their queries grow fast with the bounds (a
    # lookahead-style projection is O(K²) terms: at K = 4, Q = 2 the search at M = 64 takes ~15 s,
    # at K = 8, Q = 4 it does not end in the ci budget), and what a smaller search finds still
    # holds: a witness with fewer requests is a state at the full bounds too, and a Δ proved
    # over fewer states is a lower bound on the full one.  The full bounds are then tried only
    # where the budget left is GROWTH times what the smaller search took.
    # One constant Δ for every M that holds the longest request first: a query per Δ (seconds).
    every, ke, qe = half_then_full(None, share=True)
    if _verdict_word(every.verdict) == "Proved" and every.delta is not None:
        fn = getattr(scheduler, "margin", None)
        # what the rule declares at the audited M (with the search's lengths, chunk and block)
        declared = int(fn(server(params.M).params(params.M), max_s, max_o)) if callable(fn) else None
        return MarginResult.of(every, ke, qe, small, spec, params.M, declared,
                               every_M_from=int(tokens_held(max_s + max_o, small.block)))
    why_small = ("no constant Δ holds for every M" if _verdict_word(every.verdict) == "Refuted"
                 else "one Δ for every M was not decided")
    # the search at the profile's small M (the largest the bounded search reaches)
    m, K, Q = half_then_full(profile.margin_M, share=False)
    return MarginResult.of(m, K, Q, small, spec, params.M, m.declared, why_not_audited_M=why_small)


#: how much longer than the search at half the bounds the one at the profile's bounds is taken to
#: take; it is tried only where the budget left covers that.  Measured at the ci profile (M = 64):
#: current-fit 0.3 → 3.5 s (every M), reserve 0.2 → 0.6 s, a lookahead-style projection 15.5 s →
#: not done in 144 s (its walk is O(K²) terms)
GROWTH = 16.0


def _affordable(budget: Budget, taken: float) -> bool:
    """Whether the budget left covers :data:`GROWTH` times ``taken`` seconds (always, with no budget)."""
    left = budget.left()
    return left is None or left > GROWTH * taken


def _claims(scheduler: Scheduler, spec: str, setting: Setting, profile: AuditProfile, budget: Budget) -> ClaimsResult:
    """What the scheduler declares (FCFS, non-clairvoyance, the progress premises), each for any
    number of requests where its rule is made of folds, else at the profile's bounds (capped at
    :data:`kvstab.proofs.claims.CLAIMS_MAX`, as ``kvstab prove --claims`` caps them)."""
    from kvstab.proofs.claims import CLAIMS_MAX, prove_claims
    from kvstab.proofs.claims_folds import SCOPE

    K, Q = min(profile.proof_K, CLAIMS_MAX), min(profile.proof_Q, CLAIMS_MAX)
    budget.group("declared claims")
    res = prove_claims(scheduler, setting, K=K, Q=Q, spec=spec, budget=budget)
    out = []
    for c in res.claims:
        witness, commands = c.witness, () if c.pair is None else tuple(c.pair.commands)
        if c.pair is None and c.state is not None and _verdict_word(c.verdict) == "Refuted":
            # the text a reader checks against the replay line is written from that very replay
            witness, command = replayed_witness(c.name, scheduler, spec, setting, c.state)
            commands = (command,)
        out.append(ClaimResult(
            claim=c.name,
            verdict=c.verdict,
            scope=c.scope if c.scope == SCOPE else f"at most {K} active and {Q} queued requests",
            note=c.note,
            witness=witness,
            replay_commands=commands,
        ))
    return ClaimsResult(K, Q, tuple(out))


def _requests(ids: Sequence[int]) -> str:
    """``nobody``, ``request 3`` or ``requests 1, 4``."""
    if not ids:
        return "nobody"
    return f"request {ids[0]}" if len(ids) == 1 else "requests " + ", ".join(map(str, ids))


def replayed_witness(
    claim: str,
    scheduler: Scheduler,
    spec: str,
    setting: Setting,
    state: tuple[int, Sequence[tuple[int, int, int]], Sequence[tuple[int, int]], Sequence[int | float]],
) -> tuple[str, str]:
    """A bounded refutation of ``claim`` as its witness text and the ``kvstab replay`` line that shows it.

    The state is run one slot on the reference engine, as that line runs it, and the text says
    what that slot did (whom it admitted, whether the oldest request advanced, how the ranking
    moved) — so the text and the replay cannot disagree.  Where the slot does not break the claim
    (a rule declaring ``clairvoyant=False`` is shown ``o`` by the claim's check, never by the
    engine) the text says so."""
    from kvstab.contract import initial_state, state_vars_of
    from kvstab.errors import KvstabError
    from kvstab.replay import replay_command
    from kvstab.simulator import Engine, SlotRecord

    M, act, wait, sched = state
    params = setting.params(M)
    command = replay_command(spec, params, [], active=list(act) or None, waiting=list(wait) or None) + " --slots 1"
    start = tuple(sched) if sched else None
    if start is not None and start != initial_state(state_vars_of(scheduler)):
        # `kvstab replay` starts every run from the rule's declared initial state (as kvstab prove says too)
        command += f"  # from scheduler state {list(start)}: Engine.load_state(..., sched_state={start!r})"
    shown = (f"M={M}: " + ("empty server" if not act else f"active {list(act)}") + f", waiting {list(wait)}"
             + (f", scheduler state {list(start)}" if start else ""))
    eng = Engine(scheduler, params, spec=spec)
    eng.load_state(list(act), list(wait), start)
    broke = ""
    try:
        rec = eng.step()
    except InvariantViolation as exc:
        if not isinstance(exc.record, SlotRecord):
            return f"{shown}: the replayed slot breaks the memory invariant: {exc}", command
        # the slot's own row travels with the violation: what it admitted and preempted is still what it did
        rec, broke = exc.record, f"; the slot then breaks the memory invariant ({exc})"
    except KvstabError as exc:
        return f"{shown}: the replayed slot stops: {exc}", command
    n = len(act)
    queued = [i for i in range(n, n + len(wait)) if i in rec.admitted]
    said = f"the replay admits {_requests(queued)}"
    breaks: bool
    if claim == "FCFS admissions":
        skipped = [(j, i) for j in queued for i in range(n, j) if i not in rec.admitted]
        breaks = bool(skipped)
        what = f"{said}: request {skipped[0][0]} is admitted while request {skipped[0][1]} ahead of it is not" \
            if skipped else f"{said}, a prefix of the queue"
    elif claim == "lone head admitted":
        breaks = not act and bool(wait) and n not in rec.admitted
        what = f"{said}; the head (request {n}) is " + ("not admitted" if breaks else "admitted")
    elif claim == "empty server admits":
        breaks = not act and bool(wait) and not queued
        what = said
    elif claim == "oldest running request progresses":
        p = act[0][2] if act else 0
        first = eng.requests[0] if act else None
        # (after a violation the engine's progress is not the slot's: only a preemption is read then)
        stalled = first is not None and not broke and first.progress <= p
        breaks = first is not None and (0 in rec.preempted or stalled)
        what = ("no request runs" if first is None
                else "the oldest running request (request 0) is preempted" if 0 in rec.preempted
                else f"the oldest running request (request 0) goes from progress {p} to {first.progress}" if not broke
                else "the oldest running request (request 0) is not preempted")
    else:  # the ranking ρ = N·(T + 1) + r, as (N, r) lexicographically
        T = max(s + o for s, o, *_ in [*act, *wait])
        # (after a violation the engine's queues are not the slot's: the ranking is read only from a slot that ran)
        before = (n + len(wait), act[0][0] + act[0][1] - act[0][2] if act else T + 1)
        head = eng.active[0] if eng.active else None
        after = (len(eng.active) + len(eng.waiting), head.s + head.o - head.progress if head else T + 1)
        breaks = not broke and not after < before
        what = ("the ranking is not measured" if broke
                else f"(N, r) goes from {before} to {after}: the ranking " + ("does not fall" if breaks else "falls"))
    if not breaks and not broke:
        what += " (this replay does not break the claim; the claim's check showed the rule every o)"
    return f"{shown}: {what}{broke}", command


_STATUS = {"Proved": "pass", "Refuted": "fail"}


def _check_claims(p: ProofsSection) -> list[Check]:
    """One check per declared claim: a refutation fails the audit (its witness in the detail)."""
    out = []
    for c in () if p.claims is None else p.claims.claims:
        v = _verdict_word(c.verdict)
        detail = f"{v} for {c.scope}"
        replay = None
        if v == "Refuted" and c.witness:
            # the witness's first line says what differs; the replay lines show it (the whole witness is in the JSON)
            detail += ": " + c.witness.splitlines()[0].strip().rstrip(":")
            if c.replay_commands:
                # of two states that differ only in o the first is enough: the engine hides o from a rule
                # declaring clairvoyant=False, and its replay stops where the rule reads it (both are in the JSON)
                replay = c.replay_commands[0]
        elif v == "Unknown":
            detail += f" ({getattr(c.verdict, 'reason', '')})"
        out.append(Check(f"claim: {c.claim}", _STATUS.get(v, "unknown"), detail, replay))
    return out


def _prove_command(spec: str, params: ModelParams, K: int, Q: int) -> str:
    """The ``kvstab prove`` line of the audit's invariant proof (``M`` symbolic, as the audit proves it)."""
    import shlex

    parts = ["kvstab", "prove", "--scheduler", spec, "--K", str(K), "--Q", str(Q), "--chunk", str(params.chunk)]
    if params.block != 1:
        parts += ["--block", str(params.block)]
    if params.token_budget is not None:
        parts += ["--token-budget", str(params.token_budget)]
    if params.max_num_seqs is not None:
        parts += ["--max-num-seqs", str(params.max_num_seqs)]
    return " ".join(shlex.quote(x) for x in parts)


def _invariant_replay(inv: InvariantResult, spec: str, params: ModelParams) -> str:
    """The line that shows a refuted memory invariant: the replay of its counterexample, or (a
    refutation that is no run: a conjunct not preserved) the ``kvstab prove`` line that finds it."""
    trace = getattr(inv.verdict, "trace", None)
    if trace is not None and trace.replayed and "#" not in trace.replay_command:
        return str(trace.replay_command)
    return _prove_command(spec, params, inv.K, inv.Q)


def _check_proofs(p: ProofsSection) -> list[Check]:
    inv = p.invariant
    v = _verdict_word(inv.verdict)
    scope = f" for {inv.scope}"
    checks = [Check("memory invariant", _STATUS.get(v, "unknown"),
                    f"{v}" + (scope if v == "Proved" else "")
                    + (f" ({getattr(inv.verdict, 'reason', None)})" if v == "Unknown" else "")
                    + (f": {getattr(inv.verdict, 'detail', None)}" if v == "Refuted" else ""),
                    inv.replay_command)]
    m = p.margin
    if m is None:
        checks.append(Check("margin Δ", "unknown", "not established (the invariant is not proved)"))
    elif _verdict_word(m.verdict) != "Proved" or m.delta is None:
        checks.append(Check("margin Δ", "unknown", f"{_verdict_word(m.verdict)}: {getattr(m.verdict, 'reason', '')}"))
    elif m.declared_holds is False:
        checks.append(Check("margin Δ", "fail", f"proved Δ = {m.delta} exceeds the declared Δ = {m.declared} "
                            f"({m.where}, at most {m.K} active and {m.Q} queued requests): the declared margin certifies "
                            "a rate the policy does not keep"))
    else:
        declared = "none declared" if m.declared is None else f"declared {m.declared}"
        checks.append(Check("margin Δ", "pass", f"Δ = {m.delta} tokens {m.where}, at most {m.K} active "
                            f"and {m.Q} queued requests ({declared})"))
    return checks + _check_claims(p)


def run_audit(
    config: AuditConfig,
    *,
    scheduler_object: Scheduler | None = None,
    executor: Executor | None = None,
    smt2_dir: Path | None = None,
    log: Callable[[str], None] = lambda _line: None,
    on_progress: Callable[[AuditResult], None] = lambda _res: None,
) -> AuditResult:
    """Run every section of the audit not in ``config.skip``; see the module docstring.
    ``on_progress`` sees the (incomplete) result after each section and each
    scheduler's region, so a caller can keep what is done if the run is cut short."""
    from kvstab.audit.properties import run_properties, short_name, violation_replay
    from kvstab.audit.runs import load_workload
    from kvstab.registry import load_scheduler

    profile = config.profile
    if profile is None:
        raise InvalidArgument("an audit needs a profile (dev, ci or thorough)")
    sched = scheduler_object if scheduler_object is not None else load_scheduler(config.scheduler)
    baselines = [(b, load_scheduler(b)) for b in config.baselines if b != config.scheduler]
    w = load_workload(config.workload)
    from kvstab.model import tokens_held

    peak = int(tokens_held(w.max_total, config.params.block))
    if peak > config.params.M:
        # a request that can never be served would stop every simulation part-way
        raise InvalidArgument(f"workload {config.workload!r} has requests needing {peak} tokens at their peak but "
                              f"M={config.params.M}; raise --M to at least {peak}")
    res = AuditResult(config)
    t = time.perf_counter()
    th = res.theory = theory_section(sched, config.params, config.workload, baselines)
    res.seconds["theory"] = time.perf_counter() - t
    rep, md = th.report, th.report.guarantee_per_s
    res.checks.append(Check("theory", "info", f"μ = {rep.mu_per_s:.5g}/s, δ = {rep.delta:.4f}, μ(1−δ) = "
                            + (f"{md:.5g}/s" if md is not None else "none (δ ≥ 1)")
                            + f"; certified: {th.certificate.certified_basis}"))
    log(f"theory: {res.checks[-1].detail}")

    if "proofs" in config.skip:
        res.checks.append(Check("proofs", "skipped", "not run (--skip proofs)"))
    else:
        t = time.perf_counter()
        log("proofs: memory invariant, margin Δ and the declared claims …")
        res.proofs = proofs_section(sched, config.scheduler, config.params, profile, smt2_dir, log)
        got = _check_proofs(res.proofs)
        res.checks += got
        res.seconds["proofs"] = time.perf_counter() - t
        claims = [c for c in got if c.name.startswith("claim: ")]
        passed = sum(c.status == "pass" for c in claims)
        log(f"proofs: memory invariant {got[0].detail}; margin: {got[1].detail}; "
            f"{passed} of {len(claims)} declared claims proved")
        on_progress(res)

    if "properties" in config.skip:
        res.checks.append(Check("properties", "skipped", "not run (--skip properties)"))
    else:
        t = time.perf_counter()
        log(f"properties: the Hypothesis suite at profile {profile.name} …")
        pr = run_properties(config.scheduler if scheduler_object is None else None, profile.name)
        res.properties = pr
        status = "pass" if pr.status == "passed" else "fail" if pr.status == "failed" else "unknown"
        res.checks.append(Check("properties", status, pr.summary))
        res.seconds["properties"] = time.perf_counter() - t
        log(f"properties: {pr.summary}")
        for f in pr.findings or ():
            log(f"  {short_name(f.test)}: {f.message}")
            if f.audit or f.replay:
                log(f"    reproduce: {f.audit or f.replay}")
        on_progress(res)

    if "stability" in config.skip:
        res.checks.append(Check("stability", "skipped", "not run (--skip stability)"))
        res.checks += _check_caching(res)
        res.complete = True
        return res
    t = time.perf_counter()
    mu = th.report.mu_per_s
    for name, obj in [(config.scheduler, sched), *baselines]:
        log(f"stability: {name}")
        try:
            region = find_critical_rate(
                name, config.params, config.workload, mu, profile,
                scheduler_object=obj if obj is scheduler_object else None, seed=config.seed, executor=executor,
                log=log, window=config.window,
            )
        except (InvariantViolation, InvalidScheduler) as exc:
            # the scheduler broke the model in the audit's own simulations: that is a finding, not bad input;
            # run in this process, the violation's run gives its replay line (from a worker it has no traceback)
            replay = violation_replay(exc, name)[0] if isinstance(exc, InvariantViolation) else ""
            res.checks.append(Check(f"simulation of {name}", "fail", f"{type(exc).__name__}: {exc}", replay or None))
            log(f"  {name} broke the model in simulation: {exc}")
            res.seconds["stability"] = time.perf_counter() - t
            res.complete = True
            return res
        res.regions[name] = region
        log(f"  λ* = {region.critical_rate:.5g}/s [{region.low:.5g}, {region.high:.5g}] = {region.critical_rate / mu:.4f}·μ")
        on_progress(res)
    broke = _caching_comparison(res, w, sched, scheduler_object, mu, profile, executor, log)
    res.seconds["stability"] = time.perf_counter() - t
    res.checks += _check_stability(res, res.regions[config.scheduler])
    if broke is None:
        res.checks += _check_caching(res)
    else:
        res.checks.append(broke)
    res.complete = True
    return res


def _caching_comparison(
    res: AuditResult, w: Any, sched: Scheduler, scheduler_object: Scheduler | None, mu: float,
    profile: AuditProfile, executor: Executor | None, log: Callable[[str], None],
) -> Check | None:
    """On a workload with prefix structure, λ* of the audited scheduler again with prefix caching the
    other way round (kept in ``res.other_caching``; ``res.caching_note`` says why not where it is not
    run).  A model broken by the second search is returned as the failing check."""
    from kvstab.audit.properties import violation_replay

    config = res.config
    flipped = not config.params.prefix_caching
    if w.prefix is None:
        res.caching_note = ("the workload has no prefix structure (no prefix= law): nothing is shared between "
                            "requests, so λ* was searched once")
        if config.workload.strip().startswith("trace("):
            # a trace's rows resampled as a length law keep no content: its hash_ids replay only with its own arrivals
            res.caching_note += ("; a trace's rows as a length law carry no prompt content (kvstab simulate "
                                 "--trace-arrivals replays a Mooncake trace's hash_ids)")
        return None
    if flipped and sched.name == "sglang":
        res.caching_note = "no λ* with caching: SGLang's radix cache is not modelled yet"
        return None
    word = "on" if flipped else "off"
    log(f"stability: {config.scheduler} with prefix caching {word} (the workload has prefix structure)")
    try:
        region = find_critical_rate(
            config.scheduler, dataclasses.replace(config.params, prefix_caching=flipped), config.workload, mu,
            profile, scheduler_object=scheduler_object, seed=config.seed, executor=executor, log=log,
            window=config.window,
        )
    except (InvariantViolation, InvalidScheduler) as exc:
        replay = violation_replay(exc, config.scheduler)[0] if isinstance(exc, InvariantViolation) else ""
        res.caching_note = f"the search with prefix caching {word} broke the model"
        return Check(f"simulation of {config.scheduler} with prefix caching {word}", "fail",
                     f"{type(exc).__name__}: {exc}", replay or None)
    res.other_caching = region
    log(f"  λ* = {region.critical_rate:.5g}/s [{region.low:.5g}, {region.high:.5g}] = {region.critical_rate / mu:.4f}·μ "
        f"with prefix caching {word}")
    return None


def caching_lines(data: dict[str, Any]) -> list[str]:
    """What report.json's ``prefix_caching`` says, in lines for the terminal and the reports: caching on
    or off, μ the no-sharing formula with measured/μ, and λ* with and without caching side by side."""
    pc = data.get("prefix_caching")
    if not pc:
        return []
    on = pc["enabled"]
    lines = [f"prefix caching {'on' if on else 'off'}; {pc['mu_formula']}"
             # the proofs and the property suite take no server flags: they are of the model without the pool
             + ("; the proofs and properties check the model without caching" if on else "")]
    if pc["measured_over_mu"]:
        lines.append("measured/μ (saturated throughput / μ): "
                     + ", ".join(f"{name} {x:.4f}" for name, x in pc["measured_over_mu"].items()))
    cmp_ = pc.get("comparison")
    if cmp_ is not None:
        def one(d: dict[str, Any]) -> str:
            lo, hi = d["critical_rate_ci_per_s"]
            return f"λ* = {d['critical_rate_per_s']:.5g}/s [{lo:.5g}, {hi:.5g}] = {d['critical_over_mu']:.4f}·μ"

        ratio = cmp_["ratio_with_over_without"]
        lines.append(f"{cmp_['scheduler']} with prefix caching: {one(cmp_['with_caching'])}; without: "
                     f"{one(cmp_['without_caching'])}" + (f"; with/without = {ratio:.3f}×" if ratio is not None else ""))
    elif pc.get("comparison_note"):
        lines.append(f"λ* with and without caching: {pc['comparison_note']}")
    ms = pc.get("mu_sharing")
    if ms is not None:
        lines.append(f"μ with sharing (docs/theory.md, 'Prefix caching'): μ_share = {ms['mu_share_per_s']:.5g}/s beside the "
                     f"paper's μ = {ms['mu_per_s']:.5g}/s; saturated ≈ {ms['predicted_per_s']:.5g}/s ({ms['binding']})")
    return lines


def _check_caching(res: AuditResult) -> list[Check]:
    """An ``info`` line where caching matters: caching on, or a comparison run (the audit's every
    output then says that μ is the no-sharing formula)."""
    if not res.config.params.prefix_caching and res.other_caching is None:
        return []
    return [Check("prefix caching", "info", "; ".join(caching_lines({"prefix_caching": res.caching_json()})))]


def _check_stability(res: AuditResult, r: StabilityRegion) -> list[Check]:
    c = res.config
    mu = r.mu
    out = [Check(
        "stability region",
        # undecided rates classified by their point estimate are reported in the
        # notes; an interval wider than the tolerance is not a result
        "pass" if r.resolved else "unknown",
        f"λ* = {r.critical_rate:.5g}/s [{r.low:.5g}, {r.high:.5g}] = {r.critical_rate / mu:.4f}·μ "
        f"(±{r.half_width / mu:.2%} of μ, target ±{r.tolerance:.2%})" + ("" if not r.notes else "; " + "; ".join(r.notes)),
    )]
    for name, b in res.regions.items():
        if name == c.scheduler:
            continue
        # in words, from the two 95 % intervals: apart (higher or lower) or overlapping (no difference shown)
        if r.low > b.high:
            word, why = "higher than", "the intervals do not overlap"
        elif r.high < b.low:
            word, why = "lower than", "the intervals do not overlap"
        else:
            word, why = "not distinguishable from", "the intervals overlap"
        out.append(Check(f"λ* against {name}", "info",
                         f"{c.scheduler}'s λ* = {r.critical_rate:.5g}/s [{r.low:.5g}, {r.high:.5g}] is {word} {name}'s "
                         f"λ* = {b.critical_rate:.5g}/s [{b.low:.5g}, {b.high:.5g}] ({why})"))
    if c.require_rate is not None:
        ok = r.critical_rate >= c.require_rate
        out.append(Check("gate --require-rate", "pass" if ok else "fail",
                         f"λ* = {r.critical_rate:.5g}/s {'≥' if ok else '<'} required {c.require_rate:.5g}/s"))
    if c.max_waste is not None:
        ev = r.below if r.below is not None else r.saturated
        ok = ev.waste <= c.max_waste
        out.append(Check("gate --max-waste", "pass" if ok else "fail",
                         f"waste {ev.waste:.4f} of served area at λ = {ev.rate:.5g}/s (just below λ*) "
                         f"{'≤' if ok else '>'} {c.max_waste:.4f}"))
    cert = None if res.theory is None else res.theory.certificate.certified_rate_per_s
    if cert is not None and r.high < cert * (1 - r.tolerance):
        out.append(Check("certified rate", "fail", f"λ* ≤ {r.high:.5g}/s lies below the certified rate {cert:.5g}/s: "
                         "the certificate's premise (the margin Δ) does not hold for this policy"))
    return out

