"""The registry, plug-ins, and the contract's rejection of Python control flow."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvstab.arrivals import fixed_arrivals
from kvstab.contract import ActiveEntry, View, WaitingEntry
from kvstab.errors import InvalidArgument, InvalidScheduler
from kvstab.model import ModelParams
from kvstab.registry import Registry, builtin_names, load_scheduler, registry
from kvstab.simulator import simulate
from kvstab.symbolic import Z3Ops

sys.path.insert(0, str(Path(__file__).parent / "plugins"))


def test_builtins_are_registered() -> None:
    names = registry().names()
    for n in ("current-fit", "reserve", "lookahead", "current-fit-no-preempt"):
        assert n in names
    assert "current-fit-no-preempt" not in builtin_names()
    assert "current-fit-no-preempt" in builtin_names(include_negative=True)


def test_duplicate_name_raises() -> None:
    reg = Registry()
    reg.register(load_scheduler("current-fit"))
    with pytest.raises(InvalidScheduler, match="already registered"):
        reg.register(load_scheduler("current-fit"))


@pytest.mark.parametrize(
    "obj,msg",
    [
        ("NoDescription", "'description'"),
        ("WrongArity", r"decide must take exactly \(view, ops\)"),
        (42, "non-empty string attribute 'name'"),
    ],
)
def test_wrong_shape_is_rejected_at_registration(obj: object, msg: str) -> None:
    import sample_plugins

    target = getattr(sample_plugins, obj)() if isinstance(obj, str) else obj
    with pytest.raises(InvalidScheduler, match=msg):
        Registry().register(target)


def test_module_attr_loading() -> None:
    s = load_scheduler("sample_plugins:ADMIT_NOTHING")
    assert s.name == "admit-nothing"
    cls = load_scheduler("sample_plugins:AdmitNothing")  # a class is instantiated
    assert cls.name == "admit-nothing"


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("no-such-scheduler", "unknown scheduler 'no-such-scheduler'; known: current-fit"),
        ("no_such_module_xyz:THING", "cannot import scheduler module 'no_such_module_xyz'"),
        ("sample_plugins:MISSING", "has no attribute 'MISSING'"),
    ],
)
def test_bad_specs_are_one_line(spec: str, msg: str) -> None:
    with pytest.raises(InvalidArgument, match=msg) as exc:
        load_scheduler(spec)
    assert "\n" not in str(exc.value)


def test_wrong_shape_plugin_by_spec() -> None:
    with pytest.raises(InvalidScheduler, match="not a scheduler"):
        load_scheduler("sample_plugins:WrongArity")


def test_entry_point_plugins_are_loaded(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A package advertising ``kvstab.schedulers`` gets its scheduler registered;
    a broken or colliding one is skipped with one warning line, the built-ins
    keep working, and asking for it by name gives its error."""
    from importlib.metadata import EntryPoint

    import kvstab.registry as reg_mod

    eps = [EntryPoint(name="nothing", value="sample_plugins:ADMIT_NOTHING", group="kvstab.schedulers")]
    monkeypatch.setattr(reg_mod, "entry_points", lambda group: eps if group == "kvstab.schedulers" else [])
    monkeypatch.setattr(reg_mod, "_REGISTRY", None)
    assert "admit-nothing" in reg_mod.registry().names()
    bad = [
        EntryPoint(name="bad", value="sample_plugins:WrongArity", group="kvstab.schedulers"),
        EntryPoint(name="gone", value="no_such_module_xyz:X", group="kvstab.schedulers"),
        EntryPoint(name="impostor", value="sample_plugins:IMPOSTOR", group="kvstab.schedulers"),
    ]
    monkeypatch.setattr(reg_mod, "entry_points", lambda group: bad)
    monkeypatch.setattr(reg_mod, "_REGISTRY", None)
    reg = reg_mod.registry()
    assert "current-fit" in reg.names() and reg.get("current-fit") is load_scheduler("current-fit")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("kvstab: warning: skipped scheduler entry point") for line in err)
    assert "'bad'" in err[0] and "'gone'" in err[1] and "'impostor'" in err[2] and "already registered" in err[2]
    with pytest.raises(InvalidScheduler, match="entry point 'bad'.*decide must take exactly"):
        load_scheduler("bad")
    monkeypatch.setattr(reg_mod, "_REGISTRY", None)


def test_a_plugin_cannot_pass_itself_off_as_a_builtin() -> None:
    with pytest.raises(InvalidScheduler, match="'sample_plugins:IMPOSTOR' calls itself 'current-fit', the name of a registered"):
        load_scheduler("sample_plugins:IMPOSTOR")
    # the built-in itself, by module:attr or a fresh instance of its class, is fine
    assert load_scheduler("kvstab.schedulers.current_fit:SCHEDULER") is load_scheduler("current-fit")
    assert load_scheduler("kvstab.schedulers.current_fit:CurrentFit") == load_scheduler("current-fit")


def _symbolic_view(k: int, q: int) -> View:
    import z3

    from kvstab.symbolic import Sym

    def iv(n: str) -> Sym:
        return Sym(z3.Int(n))

    return View(
        active=tuple(ActiveEntry(i, iv(f"as{i}"), iv(f"ao{i}"), iv(f"ap{i}"), Sym(z3.Bool(f"aq{i}"))) for i in range(k)),
        waiting=tuple(WaitingEntry(k + j, iv(f"ws{j}"), iv(f"wo{j}"), Sym(z3.Bool(f"wq{j}"))) for j in range(q)),
        M=iv("M"),
        chunk=8,
    )


def test_python_if_on_symbolic_value_is_rejected_with_its_line() -> None:
    sched = load_scheduler("sample_plugins:BRANCHES")
    # concretely it runs
    simulate(sched, ModelParams(M=100, chunk=8), fixed_arrivals([(0, 3, 3)]), 3)
    with pytest.raises(InvalidScheduler) as exc:
        sched.decide(_symbolic_view(1, 2), Z3Ops())
    msg = str(exc.value)
    assert "sample_plugins.py" in msg and "if w.s < 10" in msg and "ops.ite" in msg


@pytest.mark.parametrize("name", builtin_names(include_negative=True))
def test_builtins_run_symbolically(name: str) -> None:
    """Every built-in rule is written against ops: it runs on z3 terms."""
    import z3

    from kvstab.symbolic import Sym

    d = load_scheduler(name).decide(_symbolic_view(3, 2), Z3Ops())
    assert len(d.admit) == 2 and len(d.preempt) == 3
    for x in d.admit + d.preempt:
        assert isinstance(x, (bool, Sym)) and (isinstance(x, bool) or z3.is_bool(x.z))


def test_bad_decision_shape_is_rejected() -> None:
    with pytest.raises(InvalidScheduler, match="decision.admit has 0 entries"):
        simulate(load_scheduler("sample_plugins:GARBAGE"), ModelParams(M=100, chunk=8), fixed_arrivals([(0, 3, 3)]), 2)


def test_traits_are_declared_once_and_misspellings_are_refused() -> None:
    from dataclasses import dataclass

    from kvstab.contract import Decision, Traits, traits_of
    from kvstab.errors import InvalidScheduler
    from kvstab.ops import Ops
    from kvstab.registry import Registry

    @dataclass(frozen=True)
    class Flat:
        name: str = "flat"
        description: str = "declares a trait as a plain attribute"
        work_conservng: bool = True  # misspelled, and outside traits

        def decide(self, view: View, ops: Ops) -> Decision:
            return Decision(admit=tuple(False for _ in view.waiting), preempt=tuple(False for _ in view.active))

    with pytest.raises(InvalidScheduler, match="did you mean 'work_conserving'"):
        Registry().register(Flat())
    with pytest.raises(TypeError):
        Traits(work_conservng=True)  # type: ignore[call-arg]
    with pytest.raises(InvalidScheduler, match="True or False"):
        Traits(fcfs=1)  # type: ignore[arg-type]
    assert traits_of(load_scheduler("current-fit")) == Traits(fcfs=True, work_conserving=True, clairvoyant=False, preempts=True)


def test_a_plugin_beside_the_user_loads_from_the_console_script(tmp_path: Path) -> None:
    """The console script's ``sys.path`` starts at its ``bin/``, not the current folder: a plug-in
    module standing in the folder the command runs from is found as ``python -m`` finds it, and a
    module that stands nowhere gets one line saying where kvstab looked."""
    import shutil
    import subprocess

    exe = shutil.which("kvstab", path=str(Path(sys.executable).parent))
    assert exe is not None
    (tmp_path / "my_rule_here.py").write_text("from kvstab.schedulers.current_fit import SCHEDULER as BASE\n"
                                               "import dataclasses\n"
                                               "SCHEDULER = dataclasses.replace(BASE, name='my-rule-here')\n")
    common = ["check", "--M", "16", "--chunk", "16", "--requests", "0:15:1"]
    ok = subprocess.run([exe, *common, "--scheduler", "my_rule_here:SCHEDULER"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "all properties hold" in ok.stdout, ok.stderr
    bad = subprocess.run([exe, *common, "--scheduler", "not_here_xyz:SCHEDULER"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    err = bad.stderr.strip()
    assert bad.returncode == 2 and len(err.splitlines()) == 1
    assert "not_here_xyz" in err and "current folder" in err and "PYTHONPATH" in err
