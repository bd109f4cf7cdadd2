"""kvstab's pytest plugin (entry point ``pytest11``): ``--scheduler``, the profiles, the self-tests.

Installed with kvstab, so the property suite runs from any directory::

    pytest --pyargs kvstab.props --scheduler NAME|module:attr

* ``--scheduler`` audits that scheduler (the option may be repeated); without
  it every registered built-in is audited, negative controls excluded.  A test
  asks for the scheduler under audit with the ``audited_scheduler`` argument
  (an :class:`AuditTarget`).
* The suite's self-tests (how-to, negative control, strategies, this plugin),
  marked ``kvstab_selftest``, are deselected — with the reason in the
  collection report — when ``--scheduler`` is given (the run audits that
  scheduler only) or when no kvstab source checkout is at hand (they read
  ``docs/``).
* Profiles ``dev``, ``ci`` and ``thorough``, chosen by ``KVSTAB_PROFILE`` or
  ``HYPOTHESIS_PROFILE`` (default ``ci``).  The same switch sets the cost of
  everything else through :func:`budget`: simulation horizons, workload sizes,
  the stateful machine's length, the shrink time and solver budgets.

The plugin acts only when kvstab's suite is in play: ``--scheduler`` or
``KVSTAB_PROFILE`` is given, kvstab's own checkout is the rootdir, or
``kvstab.props`` is collected (its
``conftest.py`` calls :func:`activate`).  Otherwise it registers nothing with
Hypothesis and loads no profile, so a project that merely has kvstab installed
keeps its own profiles, its ``HYPOTHESIS_PROFILE`` included.  kvstab's profiles
are registered with Hypothesis as ``kvstab-dev``, ``kvstab-ci`` and
``kvstab-thorough``, so they never replace a project's (or Hypothesis's own
``ci``) profile of the same short name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

from kvstab.contract import Scheduler

__all__ = [
    "Budget",
    "BUDGETS",
    "AuditTarget",
    "budget",
    "audit_targets",
    "activate",
    "active",
    "bounded_shrinking",
    "announce",
    "ShrinkNotice",
    "hypothesis_profile",
    "DEFAULT_PROFILE",
    "SELFTEST_MARK",
]

DEFAULT_PROFILE = "ci"
#: the marker of the suite's self-tests (deselected when auditing one scheduler)
SELFTEST_MARK = "kvstab_selftest"
#: environment variables that choose the profile, first set wins
PROFILE_VARIABLES = ("KVSTAB_PROFILE", "HYPOTHESIS_PROFILE")


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
    solver_rlimit: int = field(metadata={"help": "z3 resource limit per query of the props that prove (the margin Δ)"})
    shrink_seconds: int = field(metadata={"help": "most seconds Hypothesis may spend shrinking one failure"})


#: The three profiles.  ``ci`` keeps ``pytest props/`` within a few minutes on
#: two cores; ``thorough`` is for a nightly run.
BUDGETS: dict[str, Budget] = {
    "dev": Budget("dev", max_examples=15, max_requests=6, max_M=128, stateful_examples=5, stateful_steps=30,
                  stat_slots=4_000, stat_M=400, solver_rlimit=20_000_000, shrink_seconds=30),
    "ci": Budget("ci", max_examples=40, max_requests=8, max_M=256, stateful_examples=20, stateful_steps=40,
                 stat_slots=8_000, stat_M=500, solver_rlimit=30_000_000, shrink_seconds=60),
    "thorough": Budget("thorough", max_examples=400, max_requests=14, max_M=2048, stateful_examples=60,
                       stateful_steps=80, stat_slots=40_000, stat_M=2_000, solver_rlimit=300_000_000,
                       shrink_seconds=300),
}

# simulations are slow examples by Hypothesis's standards: that is expected
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
# the "explain" phase re-runs a failure many times to annotate lines; with
# simulations that can cost minutes, and the replay command says more
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)


def hypothesis_profile(name: str) -> str:
    """The name under which kvstab registers its profile ``name`` with Hypothesis."""
    return f"kvstab-{name}"


def _register_profiles() -> None:
    for b in BUDGETS.values():
        extra: dict[str, object] = {"derandomize": True, "database": None, "print_blob": True} if b.profile == "ci" else {}
        settings.register_profile(
            hypothesis_profile(b.profile), max_examples=b.max_examples, deadline=None, phases=_PHASES,
            suppress_health_check=_SLOW_OK, **extra,  # type: ignore[arg-type]
        )


@dataclass(slots=True)
class _State:
    budget: Budget | None = None
    reasons: list[str] = field(default_factory=list)
    note: str = ""
    config: pytest.Config | None = None


_STATE = _State()


def _chosen_profile() -> tuple[str, str]:
    """The profile the environment chooses, and a note when a variable named
    something that is not a kvstab profile (a project's own is left alone)."""
    for var in PROFILE_VARIABLES:
        name = os.environ.get(var, "").strip()
        if not name:
            continue
        if name in BUDGETS:
            return name, ""
        if var == "KVSTAB_PROFILE":
            raise pytest.UsageError(f"KVSTAB_PROFILE={name!r} is not a kvstab profile; valid: {', '.join(BUDGETS)}")
        return DEFAULT_PROFILE, f"{var}={name!r} is not a kvstab profile, so kvstab's props use {DEFAULT_PROFILE!r}"
    return DEFAULT_PROFILE, ""


def activate(config: pytest.Config, reason: str) -> Budget:
    """Turn kvstab's suite on for this run (idempotent): register kvstab's
    profiles with Hypothesis and load the chosen one, unless Hypothesis's own
    ``--hypothesis-profile`` was given (then Hypothesis's choice stands and only
    the budget is kvstab's).  Returns the budget in force."""
    if reason not in _STATE.reasons:
        _STATE.reasons.append(reason)
    if _STATE.budget is not None:
        return _STATE.budget
    name, note = _chosen_profile()
    _register_profiles()
    config.addinivalue_line("markers", f"{SELFTEST_MARK}: a self-test of kvstab's property suite (not an audit)")
    if config.getoption("hypothesis_profile", default=None):
        note = (note + "; " if note else "") + "--hypothesis-profile given: Hypothesis's settings are that profile's"
    else:
        settings.load_profile(hypothesis_profile(name))
    _STATE.budget, _STATE.note, _STATE.config = BUDGETS[name], note, config
    return _STATE.budget


def active() -> bool:
    """Whether kvstab's suite is on in this run."""
    return _STATE.budget is not None


def budget() -> Budget:
    """The budget of the profile in force (the environment's choice, ``ci`` by
    default, when the suite is used outside pytest)."""
    return _STATE.budget or BUDGETS[_chosen_profile()[0]]


def announce(line: str) -> None:
    """Write one line to the terminal now, past pytest's output capture (so a
    user watching a long shrink knows what is happening)."""
    config = _STATE.config
    capman = config.pluginmanager.getplugin("capturemanager") if config is not None else None
    if capman is None:
        sys.stderr.write(line + "\n")
        return
    with capman.global_and_fixture_disabled():
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def clip(text: str, width: int) -> str:
    """``text`` within ``width`` characters, cut at a word boundary and marked with ``…`` when it is
    cut (a message cut mid-word reads as a different word)."""
    if len(text) <= width:
        return text
    head = text[: width - 1]
    cut = head.rfind(" ")
    return (head[:cut] if cut > width // 2 else head).rstrip(" ,;:") + "…"


class ShrinkNotice:
    """Say once, on the first failure of a property test, that Hypothesis is
    now shrinking it and for how long at most (a silent shrink of slow
    simulations looks like a hang)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.said = False

    def __call__(self, exc: BaseException) -> None:
        if self.said:
            return
        self.said = True
        b = budget()
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        announce(
            f"\nkvstab: {self.what} failed ({clip(first, 160)}); Hypothesis is shrinking the counterexample, "
            f"for at most {b.shrink_seconds} s under profile {b.profile!r} (KVSTAB_PROFILE sets it)"
        )


@contextmanager
def bounded_shrinking(seconds: int) -> Iterator[None]:
    """Cap the time Hypothesis spends shrinking one failure at ``seconds``.

    Hypothesis's own cap (five minutes) is a module constant with no setting;
    a failing stateful run of slow simulations can use all of it.  A Hypothesis
    without that constant keeps its own cap.
    """
    try:
        from hypothesis.internal.conjecture import engine
    except ImportError:  # pragma: no cover - a Hypothesis without the module
        yield
        return
    old = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if not isinstance(old, int):
        yield
        return
    engine.MAX_SHRINKING_SECONDS = min(old, int(seconds))
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = old


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
        help="scheduler to audit with kvstab's property suite (pytest --pyargs kvstab.props; repeatable; "
        "default: every registered built-in, negative controls excluded)",
    )


_TARGETS = pytest.StashKey[list[AuditTarget]]()


def _checkout_root(config: pytest.Config) -> Path | None:
    """kvstab's source checkout, when pytest runs in one (its rootdir)."""
    root = Path(config.rootpath)
    if (root / "kvstab" / "pytest_plugin.py").is_file() and (root / "props" / "conftest.py").is_file():
        return root
    return None


@pytest.hookimpl(trylast=True)  # after Hypothesis's own plugin has read --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    """Check ``--scheduler`` (a bad spec is one line, before collection) and turn
    the suite on when it is asked for; otherwise do nothing at all."""
    specs = list(config.getoption("kvstab_scheduler", default=None) or [])
    if specs:
        config.stash[_TARGETS] = audit_targets(specs)
        activate(config, "--scheduler " + " --scheduler ".join(specs))
    elif _checkout_root(config) is not None:
        activate(config, "kvstab's own checkout")
    elif os.environ.get("KVSTAB_PROFILE", "").strip():
        activate(config, "KVSTAB_PROFILE set")  # kvstab's own switch: checked here, in one line


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say which profile (and so which budget) is in force, when the suite is on."""
    if not active():
        return None
    b = budget()
    note = f"; {_STATE.note}" if _STATE.note else ""
    return (f"kvstab: profile {b.profile} (examples {b.max_examples}, stat horizon {b.stat_slots} slots, "
            f"shrinking ≤ {b.shrink_seconds} s){note}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``audited_scheduler`` over the schedulers under audit."""
    if "audited_scheduler" in metafunc.fixturenames:
        targets = metafunc.config.stash.get(_TARGETS, None)
        if targets is None:
            targets = metafunc.config.stash[_TARGETS] = audit_targets([])
        metafunc.parametrize("audited_scheduler", targets, ids=[t.spec for t in targets])


_DESELECTED = pytest.StashKey[tuple[int, str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the suite's self-tests when they are not wanted, and say why."""
    if not active():
        return
    selftests = [it for it in items if it.get_closest_marker(SELFTEST_MARK) is not None]
    if not selftests:
        return
    specs = config.getoption("kvstab_scheduler", default=None) or []
    if specs:
        why = f"--scheduler given: this run audits {', '.join(specs)} only"
    elif not all((Path(it.path).parents[1] / "docs" / "props.md").is_file() for it in selftests):
        why = "they run in a kvstab checkout (some read its docs/, which an installed kvstab does not ship)"
    else:
        return
    keep = set(map(id, selftests))
    items[:] = [it for it in items if id(it) not in keep]
    config.hook.pytest_deselected(items=selftests)
    config.stash[_DESELECTED] = (len(selftests), why)


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    """The reason for the deselection, right under pytest's item count."""
    done = config.stash.get(_DESELECTED, None)
    if done is None:
        return None
    return f"kvstab: deselected {done[0]} self-test(s) of the property suite ({SELFTEST_MARK}): {done[1]}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Bound shrinking in kvstab's property tests by the profile's ``shrink_seconds``."""
    if not active() or "audited_scheduler" not in getattr(item, "fixturenames", ()):
        return (yield)
    with bounded_shrinking(budget().shrink_seconds):
        return (yield)
