"""``kvstab mu`` and ``kvstab derive`` end to end, and the document's compile."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from kvstab.cli import main
from kvstab.model import ModelParams
from kvstab.theory.area import expected_g, mu
from kvstab.theory.claims import is_closed
from kvstab.theory.document import Instance, all_claims, derivation_tex
from kvstab.workload import PAPER_WORKLOADS, Workload


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_mu_paper_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "mu", "--json", "--lambda", "40", "--rho", "0.9")
    assert code == 0 and err == ""
    d = json.loads(out)
    want = mu(PAPER_WORKLOADS["paper-1:1"], ModelParams(bbar=0.0372))
    assert d["mu_per_s"] == pytest.approx(want)
    assert d["replicas"] == -(-40 // (0.9 * want))
    assert d["guarantee_empty"] is False and d["guarantee_per_s"] < d["mu_per_s"]


def test_mu_text_with_derivation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mu", "--workload", "paper-2:1", "--derivation", "--block", "16")
    assert code == 0
    assert "E[g] = ŝ(E[n²] − E[n])/2" in out and "μ = M/(b̄·E[g])" in out and "reserve limit" in out


def test_mu_trace_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("s,o\n100,20\n300,5\n", encoding="utf-8")
    code, out, _ = run(capsys, "mu", "--trace", str(p), "--chunk", "64", "--json")
    assert code == 0
    w = Workload.joint([100, 300], [20, 5])
    assert json.loads(out)["E_g"] == pytest.approx(expected_g(w, ModelParams(chunk=64)))


def test_mu_shared_trace(capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    trace = data_dir / "traces" / "AzureLLMInferenceTrace_conv.csv"
    code, out, _ = run(capsys, "mu", "--workload", f"trace({trace})", "--json")
    assert code == 0
    assert json.loads(out)["moments"]["corr"] < 0  # the conv trace is negatively correlated


def test_mu_empty_guarantee(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "mu", "--M", "3000", "--lambda", "1")
    assert code == 1
    assert "none: the stability guarantee is empty" in out
    assert "-" not in re.search(r"μ\(1−δ\)\s*=\s*(.*)", out).group(1).split(":")[0]  # type: ignore[union-attr]
    assert err.count("\n") == 1 and "guarantee is empty" in err


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["mu", "--workload", "s=U(5,2),o=U(1,3)"], "a <= b"),
        (["mu", "--workload", "s=const(9),o=geom(1.5,10)"], "(0, 1]"),
        (["mu", "--bbar", "0"], "positive number"),
        (["mu", "--bbar", "-2"], "positive number"),
        (["mu", "--rho", "1.2"], "(0, 1]"),
        (["mu", "--rho", "0"], "(0, 1]"),
        (["mu", "--lambda", "-1"], "positive number"),
        (["derive", "--pdf"], "--out"),
    ],
)
def test_bad_input_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse-level errors
        code = int(exc.code or 0)
    _, err = capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and needle in err


def test_empty_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "empty.csv"
    p.write_text("s,o\n", encoding="utf-8")
    code, _, err = run(capsys, "mu", "--trace", str(p))
    assert code == 2 and "no rows" in err and err.count("\n") == 1


def test_every_claim_in_the_document_is_proved() -> None:
    # the document re-checks all of them; here with the 3-type WAIT identity
    claims = all_claims()
    assert [c.name for c in claims if not c.holds()] == [] and len(claims) >= 40
    # and every side of every claim came out of sympy closed (no unevaluated Sum)
    assert [c.name for c in claims if not (is_closed(c.lhs) and is_closed(c.rhs))] == []


def test_document_matches_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(
        capsys,
        "derive",
        "--workload",
        "paper-1:1",
        "--M",
        "131000",
        "--chunk",
        "512",
        "--bbar",
        "0.0372",
        "--out",
        str(tmp_path / "d.tex"),
    )
    assert code == 0
    text = (tmp_path / "d.tex").read_text(encoding="ascii")
    assert "NOT proved" not in text and "\\end{document}" in text
    want = mu(PAPER_WORKLOADS["paper-1:1"], ModelParams(bbar=0.0372))
    row = re.search(r"mu = M/\(\\bar\{b\}\\,\\mathbb\{E\}\[g\]\)\$ \(requests/s\) & ([0-9.e+-]+)", text)
    sym = re.search(r"from the symbolic formula & ([0-9.e+-]+)", text)
    assert row and sym
    assert float(row.group(1)) == pytest.approx(want, rel=1e-5)
    assert float(sym.group(1)) == pytest.approx(want, rel=1e-5)
    eg = re.findall(r"mathbb\{E\}\[g\]\$ \((?:numeric code|moment formula above)\) & ([0-9.e+-]+)", text)
    assert len(eg) == 2 and all(
        float(v) == pytest.approx(expected_g(PAPER_WORKLOADS["paper-1:1"], ModelParams()), rel=1e-9) for v in eg
    )


def test_document_without_numbers_has_no_numbers_section() -> None:
    assert "The numbers for this workload" not in derivation_tex(None)


def test_document_compiles_or_pdf_is_refused_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # with TeX (CI installs texlive-latex-base) the document compiles; without it,
    # `derive --pdf` says so in one line before writing anything
    out = tmp_path / "derivation.tex"
    argv = ["derive", "--workload", "paper-1:1", "--block", "16", "--lambda", "30", "--out", str(out), "--pdf"]
    if shutil.which("pdflatex") is None:
        assert os.environ.get("CI") != "true", "CI must install pdflatex (texlive-latex-base)"
        code, _, err = run(capsys, *argv)
        assert code == 2 and "pdflatex not found" in err and err.count("\n") == 1 and not out.exists()
        return
    code, stdout, _ = run(capsys, *argv)
    assert code == 0, stdout
    pdf = tmp_path / "derivation.pdf"
    assert pdf.is_file() and pdf.read_bytes()[:5] == b"%PDF-" and os.path.getsize(pdf) > 10_000


def test_instance_with_empty_guarantee() -> None:
    text = derivation_tex(Instance(PAPER_WORKLOADS["paper-1:1"], ModelParams(M=3000, bbar=0.03)))
    assert "guarantee is empty" in text and "& none" in text


def test_workload_and_trace_are_exclusive(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("s,o\n10,2\n", encoding="utf-8")
    code, _, err = run(capsys, "mu", "--workload", "paper-1:1", "--trace", str(p))
    assert code == 2 and "either --workload or --trace" in err


def test_derive_with_trace_instantiates(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("s,o\n100,20\n3000,5\n", encoding="utf-8")
    code, out, _ = run(capsys, "derive", "--trace", str(p))
    assert code == 0 and "The numbers for this workload" in out and "t.csv" in out


def test_how_to_commands_in_docs_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data_dir: Path
) -> None:
    # every `$ kvstab …` line of docs/theory.md's how-to runs as written
    doc = Path(__file__).resolve().parents[2] / "docs" / "theory.md"
    lines = [ln[2:].split("#")[0] for ln in doc.read_text(encoding="utf-8").splitlines() if ln.startswith("$ kvstab")]
    assert len(lines) >= 4
    monkeypatch.chdir(tmp_path)
    for line in lines:
        argv = shlex.split(line.replace("kvstab/data", str(data_dir)))[1:]
        if "--pdf" in argv and shutil.which("pdflatex") is None:
            continue
        code, _, err = run(capsys, *argv)
        assert code == 0, f"{line}: {err}"
