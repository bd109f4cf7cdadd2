"""``kvstab replay`` on the fast engine: the reference engine's records, exactly.

The fast engine keeps per-slot counts; the replay names the requests from them
(admitted: the queue's first ones; preempted: the newest actives; completed: by
finish slot) and counts the slots in which the queue window hid requests.  Every
field of every record, the violation (message, slot, memory, requests, its own
row), what is pending and the window count must be the reference's, and the
command line must print the same lines but the one naming the engine.
"""

from __future__ import annotations

import json
import random

import pytest
from test_cli import run as _cli
from test_engine_differential import COMPILED

from kvstab.contract import state_vars_of
from kvstab.engine.fast_replay import replay_fast, why_not_fast
from kvstab.model import ModelParams
from kvstab.registry import load_scheduler
from kvstab.replay import ReplayOutcome, parse_requests, replay


def _key(out: ReplayOutcome) -> tuple[object, ...]:
    v = out.violation
    why = None if v is None else (str(v), v.slot, v.memory, v.capacity, v.requests, v.record)
    return out.records, why, out.pending, out.window, out.window_hid_slots


def _requests(seed: int, n: int, span: int, s: int, o: int) -> str:
    rng = random.Random(seed)
    return ",".join(f"{rng.randrange(span)}:{rng.randrange(1, s)}:{rng.randrange(1, o)}" for _ in range(n))


CASES = [  # (server, requests, replay's keywords): crowded and roomy, blocks, caps, windows, horizons
    (ModelParams(M=80, chunk=8), _requests(1, 40, 30, 20, 30), {}),
    (ModelParams(M=80, chunk=8, block=4, max_num_seqs=3), _requests(2, 40, 30, 20, 30), {"window": 1}),
    (ModelParams(M=60, chunk=5, token_budget=9), _requests(3, 25, 60, 15, 25), {"window": 2, "max_slots": 50}),
    (ModelParams(M=120, chunk=16, block=3), _requests(4, 30, 200, 30, 40), {"slots": 90}),
    (ModelParams(M=20, chunk=4), "0:4:8,0:4:8", {"max_slots": 3}),
]


#: the built-ins whose replay runs on the fast engine: a stateful one (sglang) keeps the reference,
#: whose records show the rule's state after every slot
REPLAYED_FAST = [r for r in COMPILED if not state_vars_of(load_scheduler(r))]


def test_a_stateful_built_in_replays_on_the_reference_engine_and_says_why() -> None:
    assert "sglang" in COMPILED and "sglang" not in REPLAYED_FAST
    why = why_not_fast(load_scheduler("sglang"), parse_requests("0:4:8"), None, None, None, None)
    assert why.startswith("a stateful rule: the records show its state after every slot")
    assert all(why_not_fast(load_scheduler(r), parse_requests("0:4:8"), None, None, None, None) == ""
               for r in REPLAYED_FAST)  # fmt: skip


@pytest.mark.parametrize("rule", REPLAYED_FAST)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fast_replay_gives_the_reference_records(rule: str, case: int) -> None:
    params, requests, kw = CASES[case]
    plan = parse_requests(requests)
    ref = replay(rule, params, plan, **kw)  # type: ignore[arg-type]
    fast = replay_fast(
        load_scheduler(rule), params, plan, kw.get("slots"), kw.get("max_slots", 100_000), kw.get("window", 8)
    )
    assert fast is not None and (ref.engine, fast.engine) == ("reference", "fast")
    assert _key(fast) == _key(ref)


def test_replay_prints_the_same_violation_on_both_engines(capsys: pytest.CaptureFixture[str]) -> None:
    """The negative control breaks M: exit 1, the same rows, slot and message; only the line
    (and the JSON fields) naming the engine differ."""
    argv = ["replay", "--scheduler", "current-fit-no-preempt", "--M", "40", "--chunk", "4",
            "--requests", "0:4:8,0:4:8,1:6:20,3:2:30,9:5:5"]  # fmt: skip
    outs = {}
    for engine in ("auto", "reference"):
        rc, text, err = _cli([*argv, "--engine", engine], capsys)
        assert rc == 1, err
        outs[engine] = text.splitlines()
    assert outs["auto"][-1] == "(fast engine: compiled fast path of a built-in rule)"
    assert outs["reference"][-1].startswith("(reference engine:")
    assert outs["auto"][:-1] == outs["reference"][:-1]
    assert any(line.startswith("VIOLATION reproduced: slot ") for line in outs["auto"])
    docs = {}
    for engine in ("fast", "reference"):
        rc, text, _ = _cli([*argv, "--engine", engine, "--json"], capsys)
        assert rc == 1
        docs[engine] = json.loads(text)
    assert docs["fast"].pop("engine") == "fast" and docs["reference"].pop("engine") == "reference"
    docs["fast"].pop("engine_reason"), docs["reference"].pop("engine_reason")
    assert docs["fast"] == docs["reference"] and docs["fast"]["violation_slot"] is not None


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (["--scheduler", "sample_plugins:SHORTEST_PROMPT_FIRST"], "no compiled fast path"),
        (["--scheduler", "current-fit", "--active", "4:8:2"], "starts from the empty system"),
        (["--scheduler", "current-fit", "--decide-timeout", "5"], "--decide-timeout"),
        (["--scheduler", "current-fit", "--requests", "99999999999:1:1"], "past the fast engine's"),
    ],
)
def test_replay_takes_the_reference_engine_where_the_fast_one_cannot(
    extra: list[str], why: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """auto says why it ran the reference engine; --engine fast refuses in one line (exit 2)."""
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent / "plugins"))
    base = ["replay", "--M", "40", "--chunk", "4", "--requests", "0:4:8,1:3:3"]
    argv = base + extra if "--requests" not in extra else base[:5] + extra
    rc, text, err = _cli([*argv, "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(text)
    assert doc["engine"] == "reference" and why in doc["engine_reason"], doc["engine_reason"]
    rc, _, err = _cli([*argv, "--engine", "fast"], capsys)
    assert rc == 2 and why in err and len(err.strip().splitlines()) == 1, err


def test_check_says_it_keeps_the_reference_engine(capsys: pytest.CaptureFixture[str]) -> None:
    rc, text, _ = _cli(["--help"], capsys)
    assert rc == 0 and "on the reference engine's states" in " ".join(text.split())
