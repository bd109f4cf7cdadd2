"""Every failure an audit of the test plug-ins reports prints one line that replays it — with the spec
the user typed — in the terminal, report.md, report.html and report.json, and running that line shows
the same violation."""

from __future__ import annotations

import contextlib
import html
import io
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from _audit_support import SMALL

from kvstab.audit.properties import findings_of
from kvstab.cli import main
from kvstab.model import ModelParams
from kvstab.testing.checks import PropertyViolation

TESTS = Path(__file__).resolve().parents[1]

#: each buggy plug-in, and the sections its audit runs (the claims' plug-ins break no property the proofs miss)
PLUGINS = {
    "mutants.chunk_off_by_one:SCHEDULER": ["--skip", "stability"],
    "claims_plugins:FIRST_FIT_FOLDS": ["--skip", "stability", "--skip", "properties"],
    "claims_plugins:BUSY_ONLY_FOLDS": ["--skip", "stability", "--skip", "properties"],
    "claims_plugins:OLDEST_VICTIM_FOLDS": ["--skip", "stability", "--skip", "properties"],
    "claims_plugins:PEAK_CHECK_FOLDS": ["--skip", "stability", "--skip", "properties"],
}


def _run(argv: list[str]) -> tuple[int, str, str]:
    """``kvstab ARGV`` in process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


class _Audits:
    """Each plug-in's audit — (terminal output, report folder, report.json) — run the first time a test asks
    for it, so that a worker runs only the audits of the tests it was given (the mutant's alone shrinks
    Hypothesis failures for about a minute; the claims' plug-ins take seconds)."""

    def __init__(self, tmp: pytest.TempPathFactory) -> None:
        self.tmp = tmp
        self.done: dict[str, tuple[str, Path, dict[str, Any]]] = {}

    def __getitem__(self, spec: str) -> tuple[str, Path, dict[str, Any]]:
        if spec not in self.done:
            out = self.tmp.mktemp("replays")
            sys.path[:0] = [str(TESTS), str(TESTS / "proofs")]
            try:
                code, text, _ = _run(["audit", "--scheduler", spec, *SMALL, "--profile", "dev", "--baseline", "none",
                                      *PLUGINS[spec], "--out", str(out), "--quiet"])
            finally:
                del sys.path[:2]
            assert code == 1, (spec, text)
            self.done[spec] = (text, out, json.loads((out / "report.json").read_text()))
        return self.done[spec]


@pytest.fixture(scope="module")
def audits(tmp_path_factory: pytest.TempPathFactory) -> _Audits:
    """Each plug-in's audit, run on first use."""
    return _Audits(tmp_path_factory)


def _printed(text: str) -> list[tuple[str, str]]:
    """The terminal's failure lines: (what failed, as printed; the line that replays it)."""
    lines = text.splitlines()
    out = []
    for i, ln in enumerate(lines):
        m = re.match(r"^\s+(?:replay|reproduce): (kvstab .*)$", ln)
        if m:
            out.append((lines[i - 1].strip(), m.group(1)))
    return out


def _json_commands(data: dict[str, Any]) -> set[str]:
    """Every replay line report.json holds."""
    found: set[str] = set()

    def walk(x: object) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ("replay_command", "replay", "audit") and isinstance(v, str) and v:
                    found.add(v)
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(data)
    return found


def _violation(text: str) -> tuple[int, int] | None:
    """(slot, memory) of a memory violation as a failure or a replay states it."""
    m = re.search(r"slot (\d+)\b.*?(?:memory|uses) (\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


@pytest.mark.parametrize("spec", list(PLUGINS))
def test_every_printed_failure_line_is_in_every_report_and_replays_the_same_violation(
    spec: str, audits: _Audits, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.syspath_prepend(str(TESTS / "proofs"))
    text, out, data = audits[spec]
    failed = [c for c in data["checks"] if c["status"] == "fail"]
    findings = (data["properties"] or {}).get("findings", [])
    printed = _printed(text)
    # one line per failed proof or claim, one per property failure
    assert len(printed) == len([c for c in failed if c["name"] != "properties"]) + len(findings), text
    md, page, commands = (out / "report.md").read_text(), (out / "report.html").read_text(), _json_commands(data)
    for what, line in printed:
        argv = shlex.split(line)
        # the plug-in by the spec the user typed, never by its name
        assert argv[:2] in (["kvstab", "replay"], ["kvstab", "check"], ["kvstab", "prove"]), line
        assert argv[argv.index("--scheduler") + 1] == spec, line
        assert line in md and html.escape(line) in page, line
        assert line in commands, line
        _shows_the_same(what, line)
    # every failure in report.json has its line as `replay_command`
    assert [f["replay_command"] for f in findings] == [f["audit"] or f["replay"] for f in findings]
    assert all(c.get("replay_command") for c in failed if c["name"] != "properties")
    # no kvstab source in what the report keeps of a failure
    for d in (data["properties"] or {}).get("details", []):
        assert not any(ln.startswith("    ") for ln in d.splitlines()), d


def _shows_the_same(what: str, line: str) -> None:
    argv = shlex.split(line.split("  #")[0])[1:]
    if argv[0] == "check":
        code, out, _ = _run(argv)
        prop = re.search(r"property (\d+)", what)
        assert code == 1 and prop is not None and f"property {prop.group(1)}" in out, (line, out)
        return
    if "--slots" in argv and "--requests" in argv and argv[argv.index("--requests") + 1] == "":
        # a claim's one-slot state: the slot the witness describes
        code, out, err = _run([*argv, "--json"])
        if "claim: non-clairvoyant" in what:
            # the engine hides o from the rule and names the read
            assert code == 2 and "read the output length o" in err, (what, err)
            return
        got = json.loads(out)
        if got["violation"] is not None:
            # the state's slot breaks memory too: the witness says so, with the same slot and memory
            assert "breaks the memory invariant" in what and code == 1, (what, got)
            assert _violation(what.split("breaks the memory invariant")[1]) == _violation(got["violation"])
            return
        slot = got["slots"][0]
        admits = re.search(r"the replay admits (nobody|requests? [\d, ]+)", what)
        if admits:
            ids = [int(x) for x in re.findall(r"\d+", admits.group(1))]
            queued = len(argv[argv.index("--active") + 1].split(",")) if "--active" in argv else 0
            assert [i for i in slot["admitted"] if i >= queued] == ids, (what, slot)
        if "(request 0) is preempted" in what:
            assert 0 in slot["preempted"], (what, slot)
        return
    code, out, _ = _run(argv)
    assert code == 1 and "VIOLATION reproduced" in out, (line, out)
    want = _violation(what)
    if want is not None:
        assert _violation(out.split("VIOLATION reproduced:")[1]) == want, (what, out)


def test_a_two_state_refutation_keeps_both_states_in_the_json(
    audits: _Audits,
) -> None:
    _, _, data = audits["claims_plugins:PEAK_CHECK_FOLDS"]
    (check,) = [c for c in data["checks"] if c["name"] == "claim: non-clairvoyant"]
    (claim,) = [c for c in data["proofs"]["claims"]["claims"] if c["claim"] == "non-clairvoyant"]
    assert len(claim["replay_commands"]) == 2 and check["replay_command"] == claim["replay_commands"][0]


def test_a_group_of_failures_keeps_each_members_message_and_line() -> None:
    params = ModelParams(M=8, chunk=4)
    one = PropertyViolation(1, "x:R", 0, "memory 9 > M=8", params, [(0, 5, 4)])
    two = PropertyViolation(7, "x:R", 3, "idles", params, [(0, 2, 2), (1, 3, 3)])
    group = ExceptionGroup("Hypothesis found 2 distinct failures.", [one, ExceptionGroup("inner", [two])])
    got = findings_of("props/test_props_stateful.py::test_stateful_machine[x:R]", "", group, "x:R")
    assert [f.message.split(" (")[0] for f in got] == ["property 1", "property 7"]
    assert [f.audit for f in got] == [one.audit, two.audit] and all(f.replay for f in got)
    assert all("(no message)" not in f.message for f in got)


def test_the_proof_scope_and_why_it_is_bounded_are_in_the_terminal_and_report_md(
    audits: _Audits,
) -> None:
    text, out, data = audits["mutants.chunk_off_by_one:SCHEDULER"]
    inv = data["proofs"]["invariant"]
    assert inv["unbounded"] is False
    md = (out / "report.md").read_text()
    for where in (text, md):
        line = next(ln for ln in where.splitlines() if "scope: at most" in ln)
        assert f"at most {inv['K']} active and {inv['Q']} queued requests" in line, line
        assert f"K = {inv['K']} and Q = {inv['Q']} of profile dev" in line, line
        assert "because it is not proved for every number of requests (outside the prefix-fold class" in line, line
    text, out, _ = audits["claims_plugins:FIRST_FIT_FOLDS"]
    for where in (text, (out / "report.md").read_text()):
        assert "scope: any number of requests (the unbounded theorem" in where
