"""Hostile inputs to ``kvstab mu`` and ``kvstab derive``: one line on stderr and exit 2.

Every case is refused before any work; none may end in a traceback (which
``main`` would let through as an exception) or a hang.  The long-context and
too-long-request workloads answer instead of hanging.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

import kvstab.cli.theory as theory_cli
from kvstab.cli import main


def _code_and_err(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses a value with exit 2 and one line
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    trace = tmp_path / "t.csv"
    trace.write_text("s,o\n100,20\n300,5\n", encoding="utf-8")
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    big = tmp_path / "big.csv"
    big.write_text("s,o\n10000000000000000000,20\n", encoding="utf-8")
    folder = tmp_path / "folder"
    folder.mkdir()
    return {
        "TRACE": str(trace),
        "BIG": str(big),
        "DIR": str(folder),
        "FIFO": str(fifo),
        "MISSING": str(tmp_path / "missing.csv"),
        "NOPARENT": str(tmp_path / "no" / "such" / "d.tex"),
    }


# (argv, a fragment the one line must contain); PATH names are filled from ``files``
HOSTILE: list[tuple[list[str], str]] = [
    (["mu", "--M", "1e23"], "--M"),
    (["mu", "--M", "0"], "--M"),
    (["mu", "--M", "-5"], "--M"),
    (["mu", "--M", "abc"], "--M"),
    (["mu", "--chunk", "1e30"], "--chunk"),
    (["mu", "--block", "1e30"], "--block"),
    (["mu", "--block", "4096", "--M", "1000"], "exceeds M"),
    (["mu", "--M", "1099511627776", "--block", "8388608"], "B/gcd"),
    (
        ["mu", "--M", "1099511627776", "--block", "1048575", "--workload", "s=U(1,1000000000),o=const(9)"],
        "lcm(B, ŝ)",
    ),
    (["mu", "--lambda", "1e9", "--rho", "1e-300"], "replicas, more than"),
    (["mu", "--lambda", "1e9", "--rho", "1e-10"], "replicas, more than"),
    (["mu", "--bbar", "nan"], "--bbar"),
    (["mu", "--bbar", "inf"], "--bbar"),
    (["mu", "--bbar", "-1"], "--bbar"),
    (["mu", "--lambda", "1e300"], "--lambda"),
    (["mu", "--lambda", "nan"], "--lambda"),
    (["mu", "--lambda", "-3"], "--lambda"),
    (["mu", "--rho", "2"], "--rho"),
    (["mu", "--rho", "nan"], "--rho"),
    (["mu", "--g", "bogus"], "--g"),
    (["mu", "--trace", "DIR"], "is a directory"),
    (["mu", "--trace", "FIFO"], "not a regular file"),
    (["mu", "--trace", "MISSING"], "no such file"),
    (["mu", "--trace", "TRACE", "--workload", "paper-1:1"], "either --workload or --trace"),
    (["mu", "--workload", "s=U(1,1e13),o=U(1,2)"], "must be at most"),
    (["mu", "--workload", "s=const(1e21),o=const(1)"], "too large"),
    (["mu", "--workload", "s=U(1,10000000000000),o=const(1)"], "at most"),
    (["mu", "--workload", "s=U(5,2),o=U(1,2)"], "a <= b"),
    (["mu", "--workload", "nonsense"], "does not parse"),
    (["mu", "--workload", ""], "does not parse"),
    (["mu", "--workload", "s=U(1,2)"], "does not parse"),
    (["mu", "--workload", "s=geom(nan,10),o=const(1)"], "finite number"),
    (["mu", "--workload", "s=geom(0,10),o=const(1)"], "(0, 1]"),
    (["mu", "--workload", "s=const(0),o=const(1)"], "positive integer"),
    (["mu", "--workload", "s=const(-4),o=const(1)"], "positive integer"),
    (["mu", "--workload", "trace(DIR)"], "is a directory"),
    (["mu", "--workload", "s=empirical(MISSING),o=const(3)"], "no such file"),
    (["mu", "--replicas-mu", "0"], "--replicas-mu"),
    (["mu", "--replicas-mu", "1", "nan"], "--replicas-mu"),
    (["mu", "--replicas-mu", "-2"], "--replicas-mu"),
    (["mu", "--replicas-M", "0"], "--replicas-M"),
    (["mu", "--replicas-M", "1e30"], "--replicas-M"),
    (["mu", "--replicas-M", "10", "--block", "16"], "below the block size"),
    (["mu", "--replicas-M", "131000", "--replicas-mu", "3"], "not allowed"),
    (["mu", "--trace", "BIG"], "the most kvstab accepts"),
    (["derive", "--pdf"], "--out"),
    (["derive", "--out", ""], "empty"),
    (["derive", "--numbers", "--lambda", "1e9", "--rho", "1e-300"], "replicas, more than"),
    (["derive", "--out", "DIR"], "is a directory"),
    (["derive", "--out", "NOPARENT"], "does not exist"),
    (["derive", "--trace", "DIR"], "is a directory"),
    (["derive", "--M", "1e23"], "--M"),
]


@pytest.mark.parametrize("argv,needle", HOSTILE, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_hostile_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    filled = [files.get(a, a) for a in argv]
    filled = [a.replace("(DIR)", f"({files['DIR']})").replace("(MISSING)", f"({files['MISSING']})") for a in filled]
    code, out, err = _code_and_err(filled, capsys)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and needle in err, err
    assert "Traceback" not in err


def test_derive_pdf_without_pdflatex_refuses_before_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(theory_cli.shutil, "which", lambda name: None)

    def no_work(*args: object, **kwargs: object) -> str:
        raise AssertionError("derive computed the document before checking for pdflatex")

    import kvstab.theory.document as document

    monkeypatch.setattr(document, "derivation_tex", no_work)
    out = tmp_path / "d.tex"
    code, _, err = _code_and_err(["derive", "--numbers", "--out", str(out), "--pdf"], capsys)
    assert code == 2 and "pdflatex not found" in err and err.count("\n") == 1
    assert not out.exists()


def test_requests_larger_than_M_print_numbers_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    # all requests exceed M, and some do: the numbers, one stderr line, exit 1
    for spec in ("s=U(1000,6000),o=U(1,4000)", "s=U(1,600),o=U(1,600)"):
        code, out, err = _code_and_err(["mu", "--workload", spec, "--M", "1000", "--json"], capsys)
        assert code == 1 and err.count("\n") == 1 and "guarantee is empty" in err
        d = json.loads(out)
        assert d["mu_per_s"] > 0 and d["guarantee_per_s"] is None


def test_long_context_law_answers(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["mu", "--workload", "s=U(1000,600000),o=U(1,4000)", "--M", "1000000", "--json"]
    for block in ("1", "16"):
        code, out, _ = _code_and_err([*argv, "--block", block], capsys)
        d = json.loads(out)
        assert code == 0 and d["delta"] == pytest.approx(0.604 if block == "1" else 604000 / 1e6)
        # E[g] of two independent uniforms, B = 1: the closed form in the moments
        Es, Eo = (1000 + 600000) / 2, (1 + 4000) / 2
        assert d["E_g"] > Es * Eo


def test_huge_supports_answer(capsys: pytest.CaptureFixture[str]) -> None:
    for spec in ("s=U(1,1000000000),o=U(1,10)", "s=geom(0.001,1000000000),o=geom(0.0000001,100000000000)"):
        for block in ("1", "16"):
            code, out, err = _code_and_err(["mu", "--workload", spec, "--M", "1000000", "--block", block], capsys)
            assert code in (0, 1) and "μ = M/(b̄·E[g])" in out, err


def test_non_ascii_trace_path_in_derive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import kvstab.theory.document as document

    # the derivation sections hold no user text (the full document is built in test_theory_cli);
    # the workload's name reaches only the numbers section
    monkeypatch.setattr(document, "SECTIONS", ())
    p = tmp_path / "tracé-日本.csv"
    p.write_text("s,o\n100,20\n300,5\n", encoding="utf-8")
    out = tmp_path / "d.tex"
    code, _, err = _code_and_err(["derive", "--trace", str(p), "--out", str(out)], capsys)
    assert code == 0, err
    text = out.read_text(encoding="ascii")
    assert "trac[U+00E9]-[U+65E5][U+672C].csv" in text


def test_mu_fleet_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _code_and_err(["mu", "--replicas-mu", "2", "1", "--json"], capsys)
    d = json.loads(out)["fleet"]
    assert code == 0
    assert d["round_robin_rate"] == pytest.approx(2.0) and d["ideal_rate"] == pytest.approx(3.0)
    code, out, _ = _code_and_err(["mu", "--replicas-mu", "2", "1"], capsys)
    assert code == 0 and "round-robin" in out and "Σ μ_i" in out


def test_theory_cli_does_not_import_the_top_cli() -> None:
    # kvstab.cli imports the sub-CLIs; a sub-CLI importing kvstab.cli back would be a loop
    tree = ast.parse(Path(theory_cli.__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert "kvstab.cli" not in imported
