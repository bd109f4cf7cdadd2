"""kvstab's pytest plugin (entry point ``pytest11``): ``--scheduler`` and the profiles.

Installed with kvstab, so it works from any directory:

* ``pytest props/ --scheduler NAME|module:attr`` audits that scheduler (the
  option may be repeated); without it every registered built-in is audited,
  negative controls excluded.  A test asks for the scheduler under audit with
  the ``audited_scheduler`` argument (an :class:`AuditTarget`).
* Hypothesis profiles ``dev``, ``ci`` and ``thorough``, chosen by
  ``HYPOTHESIS_PROFILE`` (default ``ci``, so a plain ``pytest`` is bounded) or
  by Hypothesis's own ``--hypothesis-profile``.  The same switch sets the cost
  of everything else through :func:`budget`: simulation horizons, workload
  sizes, the stateful machine's length and solver budgets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, settings

from kvstab.contract import Scheduler

__all__ = ["Budget", "BUDGETS", "AuditTarget", "budget", "audit_targets", "DEFAULT_PROFILE"]

DEFAULT_PROFILE = "ci"


@dataclass(frozen=True, slots=True)
class Budget:
    """How much one profile may spend, beyond Hypothesis's example counts."""

    profile: str = field(metadata={"help": "profile name"})
    max_examples: int = field(metadata={"help": "Hypothesis examples per property test"})
    max_requests: int = field(metadata={"help": "most requests in one drawn workload"})
    max_M: int = field(metadata={"help": "largest KV capacity drawn for per-slot properties"})
    stateful_examples: int = field(metadata={"help": "runs of the stateful machine per scheduler"})
    stateful_steps: int = field(metadata={"help": "rules per stateful run"})
    stat_slots: int = field(metadata={"help": "horizon (slots) of one statistical simulation"})
    stat_M: int = field(metadata={"help": "KV capacity of the statistical simulations"})
    solver_rlimit: int = field(metadata={"help": "z3 resource limit per query, for suites that prove"})


#: The three profiles.  ``ci`` keeps ``pytest props/`` within a few minutes on
#: two cores; ``thorough`` is for a nightly run.
BUDGETS: dict[str, Budget] = {
    "dev": Budget("dev", max_examples=15, max_requests=6, max_M=128, stateful_examples=5, stateful_steps=30,
                  stat_slots=4_000, stat_M=400, solver_rlimit=2_000_000),
    "ci": Budget("ci", max_examples=40, max_requests=8, max_M=256, stateful_examples=20, stateful_steps=40,
                 stat_slots=8_000, stat_M=500, solver_rlimit=5_000_000),
    "thorough": Budget("thorough", max_examples=400, max_requests=14, max_M=2048, stateful_examples=60,
                       stateful_steps=80, stat_slots=40_000, stat_M=2_000, solver_rlimit=50_000_000),
}

# simulations are slow examples by Hypothesis's standards: that is expected
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
# the "explain" phase re-runs a failure many times to annotate lines; with
# simulations that can cost minutes, and the replay command says more
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
settings.register_profile("dev", max_examples=BUDGETS["dev"].max_examples, deadline=None,
                          phases=_PHASES, suppress_health_check=_SLOW_OK)
settings.register_profile("ci", max_examples=BUDGETS["ci"].max_examples, derandomize=True, deadline=None,
                          database=None, print_blob=True, phases=_PHASES, suppress_health_check=_SLOW_OK)
settings.register_profile("thorough", max_examples=BUDGETS["thorough"].max_examples, deadline=None,
                          phases=_PHASES, suppress_health_check=_SLOW_OK)

_active: str | None = None


def _profile_from_env() -> str:
    name = os.environ.get("HYPOTHESIS_PROFILE", "").strip() or DEFAULT_PROFILE
    if name not in BUDGETS:
        raise pytest.UsageError(
            f"HYPOTHESIS_PROFILE={name!r} is not a kvstab profile; valid: {', '.join(BUDGETS)}"
        )
    return name


def budget() -> Budget:
    """The budget of the profile in force (``ci`` when nothing chose one)."""
    return BUDGETS[_active or _profile_from_env()]


@dataclass(frozen=True, slots=True)
class AuditTarget:
    """A scheduler under audit and the spec that names it in replay commands."""

    spec: str
    scheduler: Scheduler

    def __str__(self) -> str:
        return self.spec


def audit_targets(specs: list[str]) -> list[AuditTarget]:
    """Load each spec (registered name or ``module:attr``); none given means
    every registered scheduler except negative controls."""
    from kvstab.errors import KvstabError
    from kvstab.registry import builtin_names, load_scheduler

    names = specs or builtin_names(include_negative=False)
    out = []
    for spec in names:
        try:
            out.append(AuditTarget(spec, load_scheduler(spec)))
        except KvstabError as exc:
            raise pytest.UsageError(f"--scheduler {spec}: {exc}") from None
    return out


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--scheduler NAME|module:attr`` (repeatable)."""
    group = parser.getgroup("kvstab", "kvstab scheduler audit")
    group.addoption(
        "--scheduler",
        action="append",
        default=[],
        metavar="NAME|module:attr",
        dest="kvstab_scheduler",
        help="scheduler to audit in props/ (repeatable; default: every registered built-in, negative controls excluded)",
    )


_TARGETS = pytest.StashKey[list[AuditTarget]]()


def pytest_configure(config: pytest.Config) -> None:
    """Check ``--scheduler`` (a bad spec is one line, before collection) and load
    the profile chosen by ``--hypothesis-profile`` or ``HYPOTHESIS_PROFILE``."""
    global _active
    specs = list(config.getoption("kvstab_scheduler", default=None) or [])
    if specs:
        config.stash[_TARGETS] = audit_targets(specs)
    explicit = config.getoption("hypothesis_profile", default=None)
    if explicit:
        # Hypothesis's own plugin loads it; follow it when it is one of ours
        _active = explicit if explicit in BUDGETS else DEFAULT_PROFILE
        return
    _active = _profile_from_env()
    settings.load_profile(_active)


def pytest_report_header(config: pytest.Config) -> str:
    """Say which profile (and so which budget) is in force."""
    b = budget()
    return f"kvstab: profile {b.profile} (examples {b.max_examples}, stat horizon {b.stat_slots} slots)"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``audited_scheduler`` over the schedulers under audit."""
    if "audited_scheduler" in metafunc.fixturenames:
        targets = metafunc.config.stash.get(_TARGETS, None)
        if targets is None:
            targets = metafunc.config.stash[_TARGETS] = audit_targets([])
        metafunc.parametrize("audited_scheduler", targets, ids=[t.spec for t in targets])
