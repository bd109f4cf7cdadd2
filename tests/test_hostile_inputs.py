"""Hostile input to every core command: one line on stderr, exit 2, no traceback,
refused before any work starts.

Each row is a command line and a fragment of the one line it must print.  The
table covers the classes of issue 9 §4 (huge values, negative seeds, bad
lengths, bad arrival slots, bad plug-ins) for ``simulate``, ``replay``,
``check`` and ``schedulers``; a new class of bad input gets a row here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvstab.cli import main

sys.path.insert(0, str(Path(__file__).parent / "plugins"))

SIM = ["simulate", "--no-progress", "--slots", "50"]
RUN = ["--scheduler", "current-fit", "--M", "100", "--chunk", "8"]
REPLAY = ["replay", *RUN]
CHECK = ["check", *RUN]

CASES: list[tuple[list[str], str]] = [
    # --- simulate: huge values, refused by the flag itself
    (["simulate", "--M", "1e23"], "M (KV capacity in tokens) is too large"),
    (["simulate", "--M", "1099511627777"], "M (KV capacity in tokens) must be at most"),
    (["simulate", "--chunk", "1e30"], "the chunk ŝ is too large"),
    (["simulate", "--block", "1e30"], "the block size B is too large"),
    (["simulate", "--token-budget", "1e40"], "the token budget is too large"),
    (["simulate", "--max-num-seqs", "1e12"], "max_num_seqs must be at most"),
    (["simulate", "--rate", "1e300"], "the arrival rate must be at most"),
    (["simulate", "--rate", "inf"], "the arrival rate must be a finite number"),
    (["simulate", "--rate", "nan"], "the arrival rate must be a finite number"),
    (["simulate", "--load", "1e300"], "the load λ/μ must be at most"),
    (["simulate", "--slots", "1e12"], "the number of slots must be at most"),
    (["simulate", "--slots", "0"], "the number of slots must be a positive integer"),
    (["simulate", "--slots", "-4"], "the number of slots must be a positive integer"),
    (["simulate", "--slots", "1e99999"], "too large"),
    (["simulate", "--bbar", "1e300"], "the batch time b̄ must be at most"),
    (["simulate", "--bbar", "-0.1"], "the batch time b̄ must be a positive number"),
    # a denormal b̄ made μ and λ infinite, and the line blamed the arrival rate λ, which was not given
    (["simulate", "--bbar", "1e-320"], "the batch time b̄ must be at least 1e-09 s"),
    (["mu", "--bbar", "1e-320"], "the batch time b̄ must be at least 1e-09 s"),
    (["simulate", "--seed", "-1"], "the seed must be a non-negative integer"),
    (["simulate", "--seed", "1e30"], "the seed is too large"),
    (["simulate", "--seed", "x"], "the seed must be an integer"),
    (["simulate", "--warmup", "1"], "must be a number in [0, 1)"),
    (["simulate", "--window", "0"], "the queue window must be a positive integer"),
    (["simulate", "--window", "1e20"], "the queue window is too large"),
    (["simulate", "--decide-timeout", "-1"], "the decide timeout must be a non-negative number"),
    (["simulate", "--decide-timeout", "inf"], "the decide timeout must be a finite number"),
    (["simulate", "--g", "fuzzy"], "invalid choice: 'fuzzy'"),
    (["simulate", "--time-scale", "1e300"], "the time scale must be at most"),
    # --- simulate: workload specs
    ([*SIM, "--workload", "s=U(1,1e12),o=U(1,5)"], "no scheduler can ever serve them"),
    ([*SIM, "--workload", "s=const(1e21),o=U(1,5)"], "const(v): v is too large"),
    ([*SIM, "--workload", "s=U(1,5),o=const(1e19)"], "const(v): v must be at most 1099511627776"),
    ([*SIM, "--workload", "s=geom(0.5,1e12),o=U(1,5)"], "no scheduler can ever serve them"),
    ([*SIM, "--workload", "s=geom(nan,10),o=U(1,5)"], "geom p must be a finite number"),
    ([*SIM, "--workload", "s=geom(0,10),o=U(1,5)"], "geom p must be a number in (0, 1]"),
    ([*SIM, "--workload", "s=U(0,10),o=U(1,5)"], "U(a, b): a must be a positive integer"),
    ([*SIM, "--workload", "s=U(10,1),o=U(1,5)"], "U(a, b) needs a <= b"),
    ([*SIM, "--workload", "s=U(1.5,10),o=U(1,5)"], "U(a, b): a must be an integer"),
    ([*SIM, "--workload", "s=U(1,10)"], "does not parse"),
    ([*SIM, "--workload", ""], "does not parse"),
    ([*SIM, "--workload", "trace(/no/such/file.csv)"], "no such file"),
    # --- simulate: silently wrong answers, now refused
    ([*SIM, "--time-scale", "2"], "--time-scale scales a trace's arrival times; it needs --trace-arrivals"),
    ([*SIM, "--M", "1000", "--rate", "100"], "no scheduler can ever serve them (pass --drop-oversize"),
    ([*SIM, "--M", "10"], "no request of workload 'paper-1:1' fits in M=10"),
    ([*SIM, "--workload", "s=U(1,10),o=U(1,5)", "--rate", "1e9", "--slots", "1000000000"], "expected arrivals"),
    # --- simulate: schedulers
    ([*SIM, "--scheduler", "nope"], "unknown scheduler 'nope'"),
    ([*SIM, "--scheduler", ""], "scheduler spec must be a registered name or 'module:attr'"),
    ([*SIM, "--scheduler", ":"], "cannot import scheduler module ''"),
    ([*SIM, "--scheduler", "os:path"], "'os:path' is not a scheduler"),
    ([*SIM, "--scheduler", "sample_plugins:MISSING"], "has no attribute 'MISSING'"),
    ([*SIM, "--scheduler", "sample_plugins:WrongArity"], "decide must take exactly (view, ops)"),
    ([*SIM, "--scheduler", "sample_plugins:IMPOSTOR"], "calls itself 'current-fit'"),
    ([*SIM, "--scheduler", "sample_plugins:RAISES", "--workload", "s=U(1,5),o=U(1,5)"], "decide raised ZeroDivisionError"),
    ([*SIM, "--scheduler", "sample_plugins:RETURNS_STRING", "--workload", "s=U(1,5),o=U(1,5)"], "returned str"),
    ([*SIM, "--scheduler", "sample_plugins:NAN_GRANTS", "--workload", "s=U(1,5),o=U(1,5)"], "is NaN"),
    ([*SIM, "--scheduler", "sample_plugins:NEGATIVE_GRANTS", "--workload", "s=U(1,5),o=U(1,5)"], "is -100, negative"),
    ([*SIM, "--scheduler", "sample_plugins:SNEAKY_SJF", "--workload", "s=U(1,5),o=U(1,5)", "--rate", "300"], "declares clairvoyant=False but read the output length o"),
    (
        [*SIM, "--scheduler", "sample_plugins:NEVER_RETURNS", "--workload", "s=U(1,5),o=U(1,5)", "--rate", "300", "--decide-timeout", "0.05"],
        "decide did not return within the 0.05 s limit",
    ),
    # --- replay
    ([*REPLAY, "--requests", "1e19:1:1"], "SLOT must be an integer in [0, "),
    ([*REPLAY, "--requests", "1e16:1:1"], "SLOT must be an integer in [0, 1000000000000000]"),
    ([*REPLAY, "--requests", "9223372036854775807:1:1"], "SLOT must be an integer in [0, "),
    ([*REPLAY, "--requests=-1:1:1"], "SLOT must be an integer in [0, "),
    ([*REPLAY, "--requests", "0:1e19:1"], "S must be an integer in [1, "),
    ([*REPLAY, "--requests", "0:1:0"], "O must be an integer in [1, "),
    ([*REPLAY, "--requests", "0:nan:1"], "S must be an integer, got 'nan'"),
    ([*REPLAY, "--requests", "0:1"], "must have 3 ':'-separated integers"),
    ([*REPLAY, "--requests", "0:90:20"], "no scheduler can ever serve it"),
    ([*REPLAY, "--requests", "0:1:1", "--active", "5:5:0"], "has progress 0; valid: 0 < progress < s + o"),
    ([*REPLAY, "--requests", "0:1:1", "--active", "5:5"], "must have 3 ':'-separated integers"),
    ([*REPLAY, "--requests", "0:1:1", "--waiting", "5:1e30"], "O is too large"),
    ([*REPLAY, "--requests", "0:1:1", "--slots", "1e12"], "the number of slots must be at most"),
    ([*REPLAY, "--requests", "0:1:1", "--window", "-1"], "the queue window must be a positive integer"),
    ([*REPLAY, "--requests", "0:1:1", "--block", "1000"], "block size B=1000 exceeds M=100"),
    (["replay", "--scheduler", "current-fit", "--M", "1e23", "--chunk", "8", "--requests", "0:1:1"], "is too large"),
    (["replay", "--scheduler", "current-fit", "--chunk", "8", "--requests", "0:1:1"], "the following arguments are required: --M"),
    (["replay", "--scheduler", "sample_plugins:STRING_GRANTS", "--M", "100", "--chunk", "8", "--requests", "0:1:1"], "decision.grants[0] is '3' (str)"),
    (["replay", "--scheduler", "sample_plugins:ADMITS_STRINGS", "--M", "100", "--chunk", "8", "--requests", "0:1:1"], "decision.admit must hold booleans"),
    # --- check
    ([*CHECK], "--requests is empty: kvstab check audits one concrete workload"),
    ([*CHECK, "--requests", " "], "--requests is empty"),
    ([*CHECK, "--requests", "1e19:1:1"], "SLOT must be an integer in [0, "),
    ([*CHECK, "--requests", "0:1e19:1"], "S must be an integer in [1, "),
    ([*CHECK, "--requests", "0:90:20"], "no scheduler can ever serve it"),
    ([*CHECK, "--requests", "0:1:1", "--M", "0"], "must be a positive integer"),
    ([*CHECK, "--requests", "0:1:1", "--token-budget", "1e30"], "the token budget is too large"),
    (["check", "--scheduler", "nope", "--M", "100", "--chunk", "8", "--requests", "0:1:1"], "unknown scheduler 'nope'"),
    (["check", "--scheduler", "sample_plugins:RAISES", "--M", "100", "--chunk", "8", "--requests", "0:1:1"], "decide raised ZeroDivisionError"),
    # --- empirical: the seed was a bare int, and a negative one reached numpy (a traceback)
    (["empirical", "compare", "--seed", "-1"], "the seed must be a non-negative integer"),
    # --- schedulers
    (["schedulers", "--bogus"], "unrecognized arguments: --bogus"),
    (["schedulers", "extra"], "unrecognized arguments: extra"),
    (["no-such-command"], "invalid choice: 'no-such-command'"),
]


@pytest.mark.parametrize("argv,needle", CASES, ids=[" ".join(a)[:70] for a, _ in CASES])
def test_hostile_input_is_one_line_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse refuses before the command runs
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert needle in err, err
    assert len(err.splitlines()) == 1 and err.endswith("\n"), err
    assert "Traceback" not in err


def test_the_table_is_large_enough() -> None:
    commands = {a[0] for a, _ in CASES}
    assert {"simulate", "replay", "check", "schedulers"} <= commands and len(CASES) >= 60
