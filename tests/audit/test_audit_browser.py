"""``report.html`` opens in a real headless browser, offline, and shows something.

Chromium comes from Debian (``apt-get install -y chromium``); CI installs it,
so a missing browser fails this test rather than skipping it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError("no Chromium on PATH: install it with `apt-get update && apt-get install -y chromium`")


def test_html_report_renders_non_blank_in_headless_chromium(
    small_audit: tuple[int, Path, dict[str, Any]], tmp_path: Path
) -> None:
    shot = tmp_path / "shot.png"
    html = small_audit[1] / "report.html"
    proc = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--user-data-dir=" + str(tmp_path / "profile"), "--window-size=1200,2400",
         f"--screenshot={shot}", html.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert shot.exists(), proc.stderr[-2000:]
    import matplotlib.image as mpimg

    img = np.asarray(mpimg.imread(shot))[..., :3]
    # non-blank: many distinct colours, and a good share of non-white pixels (text, tables, plots)
    distinct = np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0).shape[0]
    inked = float((img.mean(axis=2) < 0.9).mean())
    assert distinct > 50, distinct
    assert inked > 0.02, inked
