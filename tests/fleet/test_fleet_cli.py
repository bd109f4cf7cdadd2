"""`kvstab fleet …` and `kvstab plan` on the command line: output, trace load, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvstab.cli import main
from kvstab.data import trace_path
from kvstab.fleet.arrivals import peak_window, piecewise_poisson, window_rates
from kvstab.traces import load_trace
from kvstab.workload import parse_workload

SMALL = ["--replica", "count=1,M=150,chunk=4,bbar=0.01,name=fast", "--replica", "count=1,M=150,chunk=4,bbar=0.02",
         "--workload", "s=U(1,8),o=U(1,8)"]  # fmt: skip

MENU = """
[[gpu]]
name = "small"
M = 150
chunk = 4
bbar = 0.02
cost_per_hour = 2.0
available = 4

[[gpu]]
name = "big"
M = 150
chunk = 4
bbar = 0.01
cost_per_hour = 3.0
available = 2
"""


def test_fleet_simulate_prints_the_path_the_theory_and_per_replica_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "simulate", *SMALL, "--router", "jsq", "--lambda", "300", "--horizon", "10"]) == 0
    out = capsys.readouterr().out
    assert "event loop" in out and "round-robin     : critical at" in out and "fast" in out and "fleet" in out
    assert main(["fleet", "simulate", *SMALL, "--lambda", "300", "--horizon", "10", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["path"] == "static" and d["engines"] == ["fast", "fast"] and d["fleet"]["arrived"] > 2000


def test_fleet_simulate_follows_a_trace_rate(capsys: pytest.CaptureFixture[str]) -> None:
    # the Azure conversation trace's own rate per minute, time compressed 100× (about 35 s, ~550 req/s)
    args = ["fleet", "simulate", *SMALL, "--trace", "azure-conv", "--time-scale", "0.01", "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    tr = load_trace(trace_path("azure-conv"))
    assert d["horizon_s"] == pytest.approx(60 * len(window_rates(tr, 60.0)) * 0.01)
    # as many requests as the trace, within Poisson noise
    assert abs(d["fleet"]["arrived"] - len(tr)) < 5 * np.sqrt(len(tr))


def test_window_rates_count_every_request_and_the_peak_is_the_busiest_window() -> None:
    tr = load_trace(trace_path("azure-code"))
    r = window_rates(tr, 60.0)
    assert r.sum() * 60.0 == pytest.approx(len(tr))
    i, peak = peak_window(r)
    assert peak == r.max() and peak > r.mean()
    arr = piecewise_poisson(parse_workload("paper-1:1"), r, 60.0, seed=0)
    counts = np.bincount((arr.time // 60.0).astype(int), minlength=r.size)
    # the busiest window of the draw is the trace's, within Poisson noise
    assert abs(counts[i] - peak * 60) < 5 * np.sqrt(peak * 60)


def test_plan_markdown_and_json_verified(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    menu = tmp_path / "menu.toml"
    menu.write_text(MENU)
    base = ["plan", "--menu", str(menu), "--workload", "s=U(1,8),o=U(1,8)", "--lambda", "400", "--rho", "0.8",
            "--horizon", "20"]  # fmt: skip
    assert main([*base, "--slo-e2e", "p99=5"]) == 0
    out = capsys.readouterr().out
    assert "| big |" in out and "measured margin" in out and "Verdict: PASS" in out and "met" in out
    assert main([*base, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["verification"]["passed"] and d["plan"]["cost_per_hour"] == pytest.approx(5.0)  # one big (2μ, cost 3) + one small (μ, 2): 3μ ≈ 539 ≥ 400/0.8
    # an SLO no fleet meets: the plan stands, the verification fails (exit 1)
    assert main([*base, "--slo-ttft", "p50=0.000001"]) == 1
    assert "MISSED" in capsys.readouterr().out


def test_plan_for_a_trace_peak(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--trace", "azure-code", "--no-verify", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    tr = load_trace(trace_path("azure-code"))
    assert d["plan"]["lambda_per_s"] == pytest.approx(window_rates(tr, 60.0).max())
    assert "peak of trace azure-code" in d["source"]


def test_fleet_critical_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["fleet", "critical", *SMALL, "--horizon", "20", "--tolerance", "0.02", "--quiet", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    # round-robin on μ = (2μ_1, μ_1): theory 2μ_1 = Σμ·2/3, λ* a few % under it
    assert d["theory_critical_per_s"] == pytest.approx(d["mu_total_per_s"] * 2 / 3)
    assert 0.9 < d["critical_rate_per_s"] / d["theory_critical_per_s"] < 1.0
    lo, hi = d["interval_per_s"]
    assert lo <= d["critical_rate_per_s"] <= hi


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["fleet", "simulate", "--router", "nope", "--lambda", "1"], "unknown router"),
        (["fleet", "simulate", "--replica", "count=2,colour=red", "--lambda", "1"], "KEY=VALUE"),
        (["fleet", "simulate", "--replica", "count=0", "--lambda", "1"], "count must be a positive integer"),
        (["fleet", "simulate", "--replica", "M=-3", "--lambda", "1"], "M (KV capacity)"),
        (["fleet", "simulate", "--lambda", "-1"], "arrival rate"),
        (["fleet", "simulate"], "either --lambda"),
        (["fleet", "simulate", "--lambda", "1", "--trace", "azure-conv"], "either --lambda"),
        (["fleet", "simulate", "--trace", "sharegpt"], "no arrival times"),
        (["fleet", "simulate", "--trace", "/no/such.csv"], "no such file"),
        (["fleet", "simulate", "--lambda", "1", "--path", "static", "--router", "jsq"], "needs the event loop"),
        (["fleet", "simulate", "--lambda", "1e9", "--horizon", "1e6"], "more than a fleet run holds"),
        # flags that shape a trace's rate do nothing with --lambda, and a trace runs for its own span
        (["fleet", "simulate", "--lambda", "1", "--window", "30"], "--window shapes the rate of a --trace"),
        (["fleet", "simulate", "--lambda", "1", "--time-scale", "2"], "--time-scale shapes the rate of a --trace"),
        (["fleet", "simulate", "--lambda", "1", "--window", "30", "--time-scale", "2"],
         "--window and --time-scale shape the rate of a --trace; with --lambda they do nothing"),
        (["fleet", "simulate", "--trace", "azure-conv", "--horizon", "10"], "drop --horizon"),
        (["plan", "--lambda", "5", "--time-scale", "0.5"], "--time-scale shapes the rate of a --trace"),
        (["plan", "--lambda", "5", "--window", "10"], "drop --window or give --trace"),
        (["fleet", "critical", "--seeds", "1"], "at least 2"),
        (["plan", "--lambda", "1e6", "--no-verify"], "available"),
        (["plan"], "either --lambda"),
        (["plan", "--lambda", "5", "--rho", "1.5"], "(0, 1]"),
        (["plan", "--lambda", "5", "--menu", "/no/such.toml"], "cannot read GPU menu"),
        (["plan", "--lambda", "5", "--slo-ttft", "p42=1"], "PCT=SECONDS"),
        (["plan", "--lambda", "5", "--slo-ttft", "p99=1", "--no-verify"], "drop --no-verify"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals exit from inside the parser
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


def test_plan_names_the_gpu_type_a_workload_does_not_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    menu = tmp_path / "menu.toml"
    menu.write_text(MENU)
    assert main(["plan", "--menu", str(menu), "--lambda", "5", "--workload", "s=U(1,200),o=U(1,8)", "--no-verify"]) == 2
    err = capsys.readouterr().err
    # plan takes no --drop-oversize, so its message must not send the user to it
    assert err.count("\n") == 1 and "GPU type small (M = 150)" in err and "raise its M in the menu" in err
    assert "--drop-oversize" not in err


def test_critical_refuses_a_horizon_too_short_to_trust(capsys: pytest.CaptureFixture[str]) -> None:
    """A run of a few request lifetimes reads the queue's warm-up as growth (λ* biased low with a
    confident interval): such a horizon is refused in one line that says what would do."""
    from kvstab.cli import main as cli_main

    assert cli_main(["fleet", "critical", "--horizon", "200"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mean request lifetimes" in err and "--horizon" in err
