"""Trace loaders: the shared traces, generic CSV/JSONL, and every malformed row named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvstab.errors import TraceError
from kvstab.traces import load_trace

SHARED_ROWS = {
    "AzureLLMInferenceTrace_conv.csv": (19_366, "azure", True),
    "AzureLLMInferenceTrace_code.csv": (8_819, "azure", True),
    "sharegpt_8k_filtered_stats_llama2_tokenizer.csv": (30_731, "vidur", False),
    "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv": (28_257, "vidur", False),
}


@pytest.mark.parametrize("name", sorted(SHARED_ROWS))
def test_shared_traces_load_with_known_row_counts(data_dir: Path, name: str) -> None:
    rows, fmt, timed = SHARED_ROWS[name]
    tr = load_trace(data_dir / "traces" / name)
    assert len(tr) == rows and tr.format == fmt
    assert (tr.s >= 1).all() and (tr.o >= 1).all()
    assert (tr.arrival is not None) == timed
    if tr.arrival is not None:
        assert tr.arrival[0] == 0.0 and np.all(np.diff(tr.arrival) >= 0)
        assert 3000 < tr.arrival[-1] < 3700  # about one hour, as the data README says


def test_azure_conv_shape_matches_data_readme(data_dir: Path) -> None:
    tr = load_trace(data_dir / "traces" / "AzureLLMInferenceTrace_conv.csv")
    assert round(tr.s.mean()) == 1155 and tr.s.max() == 14050
    assert round(tr.o.mean()) == 211 and tr.o.max() == 1000


def test_generic_csv_and_jsonl(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("s,o,arrival\n5,3,0.0\n7,2,0.5\n")
    tr = load_trace(csv)
    assert list(tr.s) == [5, 7] and list(tr.o) == [3, 2] and list(tr.arrival) == [0.0, 0.5]
    js = tmp_path / "t.jsonl"
    js.write_text('{"prompt_len": 4, "output_len": 9}\n{"prompt_len": 1, "output_len": 1}\n')
    tr = load_trace(js)
    assert list(tr.s) == [4, 1] and tr.arrival is None


@pytest.mark.parametrize(
    "text,line,reason",
    [
        ("s,o\n5,3\n0,2\n", 3, "s=0 must be >= 1"),
        ("s,o\n5,3\n2,-1\n", 3, "o=-1 must be >= 1"),
        ("s,o\n5,3\n2.5,1\n", 3, "not an integer"),
        ("s,o\n5,abc\n", 2, "not a positive integer"),
        ("s,o\n5,3\n4\n", 3, "1 fields, the header has 2"),
        ("s,o\n5,3\n\n", None, "empty row"),
        ("a,b\n1,2\n", 1, "unknown columns"),
        ("s,o\n", None, "no rows"),
        ("", None, "empty"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,4,5\n", 2, "timestamp"),
    ],
)
def test_bad_rows_name_file_line_and_reason(tmp_path: Path, text: str, line: int | None, reason: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(TraceError) as exc:
        load_trace(f)
    msg = str(exc.value)
    assert reason in msg and str(f) in msg and "\n" not in msg
    if line is not None:
        assert f"{f}:{line}:" in msg


def test_bad_jsonl_and_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"s": 1, "o": 2}\n{"s": 1,\n')
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: not JSON"):
        load_trace(f)
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "missing.csv")
