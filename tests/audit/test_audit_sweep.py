"""``kvstab sweep``: any executor gives the same rows, and a killed sweep resumes
to exactly the rows of an uninterrupted one."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvstab.audit.sweep import CHECKPOINT, CSV_COLUMNS, SweepGrid, read_checkpoint, run_sweep
from kvstab.cli import main

GRID = ["--scheduler", "current-fit,reserve", "--workload", "s=U(1,16),o=U(1,16)", "--M", "240", "--chunk", "8",
        "--bbar", "0.05", "--loads", "0.6,1.2", "--slots", "1500", "--quiet"]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The grid's CSV, every point run in this process, one after another."""
    out = tmp_path_factory.mktemp("sweep-inline")
    assert main(["sweep", *GRID, "--workers", "1", "--out", str(out)]) == 0
    return (out / "sweep.csv").read_bytes()


def test_csv_has_one_row_per_point(in_process: bytes) -> None:
    lines = in_process.decode().splitlines()
    assert lines[0].split(",") == CSV_COLUMNS
    assert len(lines) == 1 + 2 * 2  # schedulers × loads


def test_process_pool_gives_the_same_rows(in_process: bytes, tmp_path: Path) -> None:
    assert main(["sweep", *GRID, "--workers", "2", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "sweep.csv").read_bytes() == in_process


def test_dask_local_cluster_gives_the_same_rows(in_process: bytes, tmp_path: Path) -> None:
    assert main(["sweep", *GRID, "--dask", "local", "--workers", "2", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "sweep.csv").read_bytes() == in_process


def test_seeds_do_not_depend_on_grid_order(tmp_path: Path) -> None:
    kw = dict(workloads=("s=U(1,16),o=U(1,16)",), M=(240,), chunk=(8,), bbar=(0.05,), slots=600)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = run_sweep(SweepGrid(schedulers=("current-fit",), loads=(0.5, 1.1), **kw), tmp_path / "a")  # type: ignore[arg-type]
    b = run_sweep(SweepGrid(schedulers=("current-fit",), loads=(1.1, 0.5), **kw), tmp_path / "b")  # type: ignore[arg-type]
    assert a == list(reversed(b))


def test_killed_sweep_resumes_to_identical_results(in_process: bytes, tmp_path: Path) -> None:
    # points long enough (about a second each on the fast engine) for the kill to land between them
    grid = [a if a != "1500" else "1500000" for a in GRID]
    whole = tmp_path / "whole"
    assert main(["sweep", *grid, "--workers", "1", "--out", str(whole)]) == 0
    cut = tmp_path / "cut"
    proc = subprocess.Popen([sys.executable, "-m", "kvstab.cli", "sweep", *grid, "--workers", "1", "--out", str(cut)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(read_checkpoint(cut / CHECKPOINT)) < 1 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    finished = len(read_checkpoint(cut / CHECKPOINT))
    assert 1 <= finished < 4, f"the kill landed after {finished} of 4 points"
    assert not (cut / "sweep.csv").exists()
    # without --resume the checkpoint is not overwritten
    assert main(["sweep", *grid, "--workers", "1", "--out", str(cut)]) == 2
    assert main(["sweep", *grid, "--workers", "1", "--out", str(cut), "--resume"]) == 0
    assert (cut / "sweep.csv").read_bytes() == (whole / "sweep.csv").read_bytes()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--dask", "udp://nowhere"], "--dask"),
        (["--loads", "0.5,,1"], "comma-separated"),
        (["--scheduler", "missing"], "unknown scheduler"),
    ],
)
def test_bad_sweep_input_is_one_line_and_exit_2(
    args: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["sweep", *GRID, *args, "--out", str(tmp_path)])
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and fragment in err, err


def test_json_output_is_strict_json_with_the_undefined_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 40 slots and o = 100: no request finishes, so the latency percentiles are undefined
    argv = ["sweep", "--workload", "s=const(10),o=const(100)", "--M", "1000", "--rates", "1", "--slots", "40",
            "--workers", "1", "--quiet", "--json", "--out", str(tmp_path)]
    assert main(argv) == 0

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    rows = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert rows[0]["ttft_p50_slots"] is None and rows[0]["e2e_p99_slots"] is None
    assert "no request" in rows[0]["undefined"]["ttft_p50_slots"]
    assert rows[0]["throughput_per_s"] == 0.0 and "throughput_per_s" not in rows[0]["undefined"]
    # the checkpoint is JSON too, and reads back with the undefined values NaN again (as in the CSV)
    (line,) = (tmp_path / CHECKPOINT).read_text().splitlines()
    assert json.loads(line, parse_constant=refuse)["row"]["ttft_p50_slots"] is None
    (row,) = read_checkpoint(tmp_path / CHECKPOINT).values()
    assert math.isnan(row["ttft_p50_slots"]) and "undefined" not in row


def test_drop_oversize_runs_the_requests_that_fit_against_their_own_mu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvstab.model import ModelParams
    from kvstab.theory import stability_report
    from kvstab.workload import parse_workload

    spec = "s=U(1,400),o=U(1,400)"  # about one request in five fits M = 250
    argv = ["sweep", "--workload", spec, "--M", "250", "--chunk", "64", "--loads", "1.2", "--slots", "2000",
            "--workers", "1", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 2
    assert "pass --drop-oversize" in capsys.readouterr().err
    assert main([*argv, "--drop-oversize", "--json", "--out", str(tmp_path / "b")]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    params = ModelParams(M=250, chunk=64)
    law, p = parse_workload(spec).given_fit(params)
    mu = stability_report(law, params).mu_per_s
    assert row["mu_per_s"] == pytest.approx(mu) and row["fit_probability"] == pytest.approx(p)
    assert row["load_over_mu"] == pytest.approx(1.2) and row["rate_per_s"] == pytest.approx(1.2 * mu / p)
    assert row["dropped_oversize"] > row["arrived"]  # most arrivals could not fit
