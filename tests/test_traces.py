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
        ("s,o\n5,3\n0,2\n", 3, "s='0' is not a positive integer"),
        ("s,o\n5,3\n2,-1\n", 3, "o='-1' is not a positive integer"),
        ("s,o\n5,3\n2.5,1\n", 3, "s='2.5' is not a positive integer"),
        ("s,o\n5,abc\n", 2, "o='abc' is not a positive integer"),
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


# --- issue 9: answers that were silently wrong, and tracebacks


def test_azure_with_byte_order_mark_keeps_its_timestamps(tmp_path: Path) -> None:
    f = tmp_path / "bom.csv"
    f.write_bytes(
        "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n".encode()
    )
    tr = load_trace(f)
    assert tr.format == "azure" and tr.arrival is not None
    assert tr.arrival[1] == pytest.approx(50.9951690 - 46.6805900)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "true", "-1", "1e13"])
def test_bad_arrival_in_csv_is_refused_with_file_line_and_value(tmp_path: Path, value: str) -> None:
    f = tmp_path / "arr.csv"
    f.write_text(f"s,o,arrival\n5,3,0.0\n5,3,{value}\n")
    with pytest.raises(TraceError) as exc:
        load_trace(f)
    msg = str(exc.value)
    assert msg.startswith(f"{f}:3:") and "arrival" in msg and value in msg and "\n" not in msg


@pytest.mark.parametrize("value", ["NaN", "Infinity", "true", "false", "null", '"soon"'])
def test_bad_arrival_in_jsonl_is_refused(tmp_path: Path, value: str) -> None:
    f = tmp_path / "arr.jsonl"
    f.write_text('{"s": 1, "o": 2, "arrival": 0}\n' + f'{{"s": 1, "o": 2, "arrival": {value}}}\n')
    with pytest.raises(TraceError, match=r"arr\.jsonl:2: .*arrival"):
        load_trace(f)


@pytest.mark.parametrize("value", ["1e19", "10000000000000000000", "true"])
def test_huge_or_boolean_length_is_refused_with_the_bound(tmp_path: Path, value: str) -> None:
    f = tmp_path / "big.jsonl"
    f.write_text(f'{{"s": {value}, "o": 2}}\n')
    with pytest.raises(TraceError) as exc:
        load_trace(f)
    msg = str(exc.value)
    assert msg.startswith(f"{f}:1: s=")
    if value != "true":
        assert "larger than" in msg


def test_directory_is_named_as_a_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="is a directory"):
        load_trace(tmp_path)


def test_unreadable_trace_is_one_line(tmp_path: Path) -> None:
    import os

    f = tmp_path / "secret.csv"
    f.write_text("s,o\n1,2\n")
    f.chmod(0)
    try:
        if os.access(f, os.R_OK):  # root reads anything: check the message through a simulated refusal
            from unittest import mock

            with mock.patch("kvstab.traces._is_jsonl", side_effect=PermissionError(13, "Permission denied")):
                with pytest.raises(TraceError) as exc:
                    load_trace(f)
        else:
            with pytest.raises(TraceError) as exc:
                load_trace(f)
    finally:
        f.chmod(0o644)
    assert "permission denied" in str(exc.value) and "\n" not in str(exc.value)


# --- the formats users have


def test_azure_2024_timestamps_with_offset(tmp_path: Path) -> None:
    f = tmp_path / "AzureLLMInferenceTrace_code_1week.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,2000,10\n"
        "2024-05-10 00:00:01.509930+00:00,30,2\n"
        "2024-05-10 02:00:02.009930+02:00,40,3\n"  # the same instant zone-shifted: 2 s after the first row
    )
    tr = load_trace(f)
    assert tr.format == "azure" and list(tr.s) == [2000, 30, 40]
    assert tr.arrival is not None and tr.arrival == pytest.approx([0.0, 1.5, 2.0])


def test_burstgpt_csv(tmp_path: Path) -> None:
    f = tmp_path / "BurstGPT_without_fails_1.csv"
    f.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,230,1317,API log\n"
    )
    tr = load_trace(f)
    assert tr.format == "burstgpt" and list(tr.s) == [472, 1087] and list(tr.o) == [18, 230]
    assert tr.arrival is not None and list(tr.arrival) == [0.0, 40.0]


def test_burstgpt_failed_rows_point_to_the_files_without_failures(tmp_path: Path) -> None:
    f = tmp_path / "BurstGPT_1.csv"
    f.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n1106,ChatGPT,0,0,0,Conversation log\n"
    )
    with pytest.raises(TraceError, match=r"BurstGPT_1\.csv:3: Request tokens=.0. .*without_fails"):
        load_trace(f)


def test_mooncake_jsonl_timestamps_are_milliseconds(tmp_path: Path) -> None:
    f = tmp_path / "conversation_trace.jsonl"
    f.write_text(
        '{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}\n'
        '{"timestamp": 27482, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47]}\n'
    )
    tr = load_trace(f)
    assert tr.format == "mooncake" and list(tr.s) == [6955, 6472] and list(tr.o) == [52, 26]
    assert tr.arrival is not None and list(tr.arrival) == [0.0, 27.482]


def test_jsonl_is_detected_by_content_whatever_the_name(tmp_path: Path) -> None:
    f = tmp_path / "trace.json"
    f.write_text('{"input_length": 3, "output_length": 4, "timestamp": 0}\n')
    assert load_trace(f).format == "mooncake"


def test_new_formats_feed_the_workload_spec(tmp_path: Path) -> None:
    from kvstab.workload import parse_workload

    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": []}\n')
    w = parse_workload(f"trace({f})")
    assert w.max_total == 15
