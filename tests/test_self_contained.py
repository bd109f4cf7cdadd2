"""The project stands alone: no tracked file points outside the clone for its data or specification."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# spelled in pieces so this file does not match itself
OUTSIDE = ("../" + "shared", "shared" + "/data")


def test_no_tracked_file_refers_outside_the_clone() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix in {".csv"}:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if any(o in line for o in OUTSIDE):
                offenders.append(f"{name}:{i}: {line.strip()}")
    assert not offenders, "tracked files refer to a folder outside the clone:\n" + "\n".join(offenders)


def test_shipped_data_is_installed_with_its_licences() -> None:
    from kvstab.data import TRACES, data_dir, profile_dir, trace_path

    d = data_dir()
    for name in TRACES:
        assert trace_path(name).stat().st_size > 100_000
    licences = {p.name for p in (d / "traces").glob("LICENSE-*")}
    assert licences == {
        "LICENSE-azure-CC-BY-4.0",
        "LICENSE-mooncake-Apache-2.0",
        "LICENSE-sarathi-serve-Apache-2.0",
        "LICENSE-vidur-MIT",
    }
    prof = profile_dir()
    assert (prof / "mlp.csv").is_file() and (prof / "LICENSE-vidur-MIT").is_file()


def test_kvstab_data_env_points_elsewhere(tmp_path: Path, monkeypatch) -> None:
    import pytest

    from kvstab.data import data_dir
    from kvstab.errors import InvalidArgument

    (tmp_path / "traces").mkdir()
    monkeypatch.setenv("KVSTAB_DATA", str(tmp_path))
    assert data_dir() == tmp_path
    monkeypatch.setenv("KVSTAB_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(InvalidArgument, match="KVSTAB_DATA"):
        data_dir()
