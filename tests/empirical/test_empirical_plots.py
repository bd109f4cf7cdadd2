"""``kvstab empirical compare`` draws its plots, and refuses an unwritable ``--out`` before any run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvstab.cli import main
from kvstab.empirical import compare as compare_mod
from kvstab.empirical.compare import plot_queues


def test_plots_are_drawn_and_not_blank(tmp_path: Path) -> None:
    import matplotlib.image

    paths = plot_queues(str(tmp_path), steps=200, seed=0, use_vllm=False)
    assert sorted(Path(p).name for p in paths) == ["kv.png", "queue.png"]
    for p in paths:
        img = matplotlib.image.imread(p)
        assert img.shape[0] > 200 and img.shape[1] > 400  # 7 × 3.5 in at 110 dpi
        # a drawn figure: axes, labels and two curves, not one flat colour
        assert len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 20, p


def test_compare_refuses_an_unwritable_out_before_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def denied(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(13, "Permission denied")

    ran: list[object] = []
    monkeypatch.setattr(compare_mod.tempfile, "mkstemp", denied)  # a read-only folder (tests may run as root)
    monkeypatch.setattr(compare_mod, "run_case", lambda *a, **k: ran.append(a))
    code = main(["empirical", "compare", "--no-vllm", "--cases", "small", "--no-profile", "--quiet",
                 "--out", str(tmp_path / "report")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not ran
    assert "\n" not in err and "cannot write the report there (Permission denied)" in err


def test_compare_refuses_an_out_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    code = main(["empirical", "compare", "--no-vllm", "--cases", "small", "--no-profile", "--no-plots", "--quiet",
                 "--out", str(tmp_path / "file" / "report")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "--out" in err
