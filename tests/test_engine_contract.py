"""What the engine refuses from a scheduler, and what it never shows one.

A plug-in's faults (its own exception, a decision of the wrong type, a bad
grant, a decide that never returns, Ctrl-C) are reported as the plug-in's,
naming its spec and the slot; a rule declaring ``clairvoyant=False`` is never
shown ``o``; the queue window is reported.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvstab.arrivals import fixed_arrivals
from kvstab.contract import ActiveEntry, HiddenOutput, Traits, View, WaitingEntry, traits_of, visible_view
from kvstab.errors import InvalidScheduler
from kvstab.model import ModelParams
from kvstab.registry import builtin_names, load_scheduler
from kvstab.replay import replay
from kvstab.simulator import DecideInterrupted, Engine, simulate
from kvstab.symbolic import Z3Ops

sys.path.insert(0, str(Path(__file__).parent / "plugins"))

P = ModelParams(M=100, chunk=8)
PLAN = fixed_arrivals([(0, 3, 3), (2, 4, 4)])


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("sample_plugins:NEGATIVE_GRANTS", "decision.grants[0] is -100, negative"),
        ("sample_plugins:NAN_GRANTS", "decision.grants[0] is NaN"),
        ("sample_plugins:STRING_GRANTS", "decision.grants[0] is '3' (str), not an integer"),
        ("sample_plugins:FLOAT_GRANTS", "decision.grants[0] is 2.5 (float), not an integer"),
        ("sample_plugins:RAISES", "decide raised ZeroDivisionError: integer division or modulo by zero (an error in the scheduler"),
        ("sample_plugins:RETURNS_STRING", "returned str, expected kvstab.Decision"),
        ("sample_plugins:ADMITS_STRINGS", "decision.admit must hold booleans, got 'yes'"),
        ("sample_plugins:GARBAGE", "decision.admit has 0 entries"),
    ],
)
def test_plugin_faults_name_the_spec_and_the_slot(spec: str, needle: str) -> None:
    with pytest.raises(InvalidScheduler) as exc:
        simulate(load_scheduler(spec), P, PLAN, 5, spec=spec)
    msg = str(exc.value)
    assert msg.startswith(f"scheduler {spec!r} in slot 0: "), msg
    assert needle in msg and "\n" not in msg


def test_a_decide_that_never_returns_is_stopped_by_the_timeout() -> None:
    spec = "sample_plugins:NEVER_RETURNS"
    with pytest.raises(InvalidScheduler, match=r"'sample_plugins:NEVER_RETURNS' in slot 0: decide did not return within the 0.05 s"):
        simulate(load_scheduler(spec), P, PLAN, 5, spec=spec, decide_timeout=0.05)


def test_ctrl_c_in_decide_names_the_scheduler_and_slot() -> None:
    spec = "sample_plugins:INTERRUPTED"
    with pytest.raises(DecideInterrupted, match=r"while scheduler 'sample_plugins:INTERRUPTED' in slot 0 was deciding"):
        replay(spec, P, PLAN)


def test_ctrl_c_reaches_the_command_line_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from kvstab.cli import main

    rc = main(["replay", "--scheduler", "sample_plugins:INTERRUPTED", "--M", "100", "--chunk", "8", "--requests", "0:3:3"])
    err = capsys.readouterr().err
    assert rc == 130
    assert err == "kvstab replay: interrupted while scheduler 'sample_plugins:INTERRUPTED' in slot 0 was deciding (decide had not returned)\n"


def test_a_non_clairvoyant_rule_is_never_shown_o() -> None:
    sneaky = load_scheduler("sample_plugins:SNEAKY_SJF")
    with pytest.raises(InvalidScheduler, match="declares clairvoyant=False but read the output length o of request 0"):
        simulate(sneaky, P, PLAN, 5, spec="sample_plugins:SNEAKY_SJF")
    # the same rule declaring what it reads runs
    simulate(load_scheduler("sample_plugins:HONEST_SJF"), P, PLAN, 5)


def test_the_hidden_o_refuses_every_use() -> None:
    import z3

    from kvstab.symbolic import Sym

    h = HiddenOutput("x", 0)
    uses = [
        lambda: h + 1, lambda: 1 + h, lambda: h - 1, lambda: 2 * h, lambda: h // 2, lambda: -h,
        lambda: h < 3, lambda: h == 3, lambda: 3 >= h, lambda: bool(h), lambda: int(h), lambda: float(h),
        lambda: f"{h}", lambda: str(h), lambda: sum([h]), lambda: min(1, h),
        lambda: z3.IntVal(h), lambda: Sym(z3.Int("a")) + h, lambda: Z3Ops().ite(Sym(z3.Bool("c")), h, 0),
        lambda: Z3Ops().le(h, Sym(z3.Int("a"))),
    ]
    for use in uses:
        with pytest.raises(InvalidScheduler, match="scheduler 'x' declares clairvoyant=False"):
            use()
    assert repr(h) == "<o hidden: not clairvoyant>" and hash(h) == hash(h)


def _symbolic_view() -> View:
    import z3

    from kvstab.symbolic import Sym

    iv = lambda n: Sym(z3.Int(n))  # noqa: E731
    return View(
        active=tuple(ActiveEntry(i, iv(f"as{i}"), iv(f"ao{i}"), iv(f"ap{i}"), Sym(z3.Bool(f"aq{i}"))) for i in range(2)),
        waiting=tuple(WaitingEntry(2 + j, iv(f"ws{j}"), iv(f"wo{j}"), Sym(z3.Bool(f"wq{j}"))) for j in range(2)),
        M=iv("M"),
        chunk=8,
    )


@pytest.mark.parametrize("name", builtin_names(include_negative=True))
def test_builtins_read_o_only_if_they_declare_it(name: str) -> None:
    """Concretely and on z3 terms, every built-in runs on the view its traits allow."""
    sched = load_scheduler(name)
    traits = traits_of(sched)
    res = simulate(sched, ModelParams(M=400, chunk=8, block=4), fixed_arrivals([(t % 5, 1 + t % 13, 1 + t % 7) for t in range(30)]), drain=True)
    assert res.completed.sum() == 30
    view = visible_view(_symbolic_view(), traits, name)
    assert all(isinstance(w.o, HiddenOutput) for w in view.waiting) == (not traits.clairvoyant)
    d = sched.decide(view, Z3Ops())  # raises if a non-clairvoyant rule reads o
    assert len(d.admit) == 2


def test_visible_view_replaces_only_o() -> None:
    v = View(active=(ActiveEntry(0, 5, 6, 2),), waiting=(WaitingEntry(1, 3, 4),), M=50, chunk=4)
    assert visible_view(v, Traits(clairvoyant=True)) is v
    h = visible_view(v, Traits(clairvoyant=False), "me")
    assert (h.active[0].s, h.active[0].progress, h.waiting[0].s, h.M) == (5, 2, 3, 50)
    assert isinstance(h.active[0].o, HiddenOutput) and isinstance(h.waiting[0].o, HiddenOutput)


def test_the_window_is_reported_when_it_hid_requests() -> None:
    """A shortest-prompt-first rule admits from what the window shows: the run
    says in how many slots the window hid waiting requests."""
    sched = load_scheduler("sample_plugins:SHORTEST_PROMPT_FIRST")
    plan = fixed_arrivals([(0, 9 - (i % 9), 1) for i in range(12)])
    narrow = simulate(sched, ModelParams(M=100, chunk=16), plan, drain=True, window=2)
    wide = simulate(sched, ModelParams(M=100, chunk=16), plan, drain=True, window=16)
    assert narrow.window == 2 and narrow.window_hid_slots > 0
    assert wide.window == 16 and wide.window_hid_slots == 0
    # what it saw decided the order: the narrow run admitted another request first
    assert list(narrow.first_admit) != list(wide.first_admit)


def test_engine_run_is_the_one_loop() -> None:
    """Engine.run drains, stops at a slot count, and skips idle gaps."""
    sched = load_scheduler("current-fit")
    eng = Engine(sched, P)
    fed = eng.run(fixed_arrivals([(0, 3, 3), (10**9, 2, 2)]), drain=True, skip_idle=True)
    assert fed == 2 and eng.idle and len(eng.records) < 20 and eng.slot > 10**9
    eng = Engine(sched, P)
    assert eng.run(PLAN, 2) == 1 and eng.slot == 2 and len(eng.records) == 2


def test_the_engine_shows_a_non_clairvoyant_rule_no_o() -> None:
    """Engine.view is the view the rule sees: o hidden for current-fit, shown for reserve."""
    for name, hidden in (("current-fit", True), ("reserve", False)):
        eng = Engine(load_scheduler(name), P)
        eng.arrive(3, 5)
        v = eng.view()
        assert isinstance(v.waiting[0].o, HiddenOutput) == hidden
        assert visible_view(v, traits_of(eng.scheduler), name) is v  # idempotent: nothing left to hide
        if not hidden:
            assert v.waiting[0].o == 5


def test_a_real_ctrl_c_in_a_stuck_decide_is_one_line(tmp_path: Path) -> None:
    """SIGINT to the console script while a plug-in's decide spins: one line
    naming the scheduler and the slot, exit 130, no traceback."""
    import os
    import signal
    import subprocess
    import time

    marker = tmp_path / "marker"
    env = {**os.environ, "KVSTAB_TEST_MARKER": str(marker), "PYTHONPATH": str(Path(__file__).parent / "plugins")}

    def as_at_a_terminal() -> None:
        # Ctrl-C reaches a foreground job with SIGINT at its default and unblocked; the test runner may
        # not have it so (a suite started as a background job of a non-interactive shell, `pytest &`
        # in a CI script, inherits SIGINT ignored, and an ignored SIGINT stays ignored across exec and
        # in Python, so the signal below would be dropped and decide would spin forever)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    proc = subprocess.Popen(
        [sys.executable, "-m", "kvstab.cli", "replay", "--scheduler", "sample_plugins:STUCK", "--M", "100",
         "--chunk", "8", "--requests", "0:3:3"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_at_a_terminal,
    )
    try:
        deadline = time.monotonic() + 120  # a guard against a broken run, not a timed assertion
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err == "kvstab replay: interrupted while scheduler 'sample_plugins:STUCK' in slot 0 was deciding (decide had not returned)\n"
