"""Loaders for request traces: lengths ``(s, o)`` and, where recorded, arrival times.

Formats (detected from the header line):

* Azure LLM inference traces: ``TIMESTAMP,ContextTokens,GeneratedTokens``
  (``s`` = ContextTokens, ``o`` = GeneratedTokens, arrival = TIMESTAMP);
* vidur / sarathi-serve length stats: ``num_prefill_tokens,num_decode_tokens,…``;
* generic CSV or JSONL with columns named ``s`` and ``o`` (or ``prompt_len`` /
  ``output_len``) and optionally ``arrival`` (seconds).

Every row must parse: a bad row is an error naming the file, the line and the
reason; nothing is skipped silently.
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import numpy.typing as npt

from kvstab.errors import TraceError

__all__ = ["Trace", "load_trace", "TRACE_FORMATS"]

IntArray = npt.NDArray[np.int64]

#: column names (s, o, arrival) of each known format
TRACE_FORMATS: dict[str, tuple[str, str, str | None]] = {
    "azure": ("ContextTokens", "GeneratedTokens", "TIMESTAMP"),
    "vidur": ("num_prefill_tokens", "num_decode_tokens", None),
    "generic": ("s", "o", "arrival"),
    "generic-long": ("prompt_len", "output_len", "arrival"),
}

_TS = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?$")


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """Rows of a trace: lengths and, if the file records them, arrival times in
    seconds since the first row's arrival."""

    s: IntArray
    o: IntArray
    arrival: npt.NDArray[np.float64] | None
    path: str
    format: str

    def __len__(self) -> int:
        return int(self.s.size)


def _timestamp(text: str) -> float:
    m = _TS.match(text.strip())
    if not m:
        raise ValueError(f"timestamp {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'")
    y, mo, d, h, mi, sec, frac = m.groups()
    base = datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec)).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def _length(text: object, column: str) -> int:
    if isinstance(text, bool):
        raise ValueError(f"{column}={text!r} is not a positive integer")
    if isinstance(text, int):
        v = text
    else:
        t = str(text).strip()
        try:
            v = int(t)
        except ValueError:
            try:
                f = float(t)
            except ValueError:
                raise ValueError(f"{column}={t!r} is not a positive integer") from None
            if not f.is_integer():
                raise ValueError(f"{column}={t!r} is not an integer") from None
            v = int(f)
    if v < 1:
        raise ValueError(f"{column}={v} must be >= 1")
    return v


def _detect(header: list[str], path: str) -> tuple[str, tuple[str, str, str | None]]:
    names = {h.strip() for h in header}
    for fmt, cols in TRACE_FORMATS.items():
        if cols[0] in names and cols[1] in names:
            arrival = cols[2] if cols[2] is not None and cols[2] in names else None
            return fmt, (cols[0], cols[1], arrival)
    raise TraceError(
        path,
        1,
        f"unknown columns {sorted(names)}; expected one of "
        + "; ".join(f"{k}: {v[0]},{v[1]}" for k, v in TRACE_FORMATS.items()),
    )


def _finish(
    path: str, fmt: str, s: list[int], o: list[int], arr: list[float] | None
) -> Trace:
    if not s:
        raise TraceError(path, None, "the trace has no rows")
    arrival = None
    if arr is not None:
        a = np.asarray(arr, dtype=np.float64)
        if np.any(np.diff(a) < 0):
            bad = int(np.argmax(np.diff(a) < 0)) + 1
            # sorted arrivals are part of the format; say which row breaks it
            raise TraceError(path, None, f"arrival times are not sorted (row {bad + 1} comes before row {bad})")
        arrival = a - a[0]
    return Trace(np.asarray(s, dtype=np.int64), np.asarray(o, dtype=np.int64), arrival, path, fmt)


def _load_csv(path: str) -> Trace:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise TraceError(path, None, "the file is empty (no header)") from None
        fmt, (cs, co, ca) = _detect(header, path)
        idx = {h.strip(): i for i, h in enumerate(header)}
        i_s, i_o = idx[cs], idx[co]
        i_a = idx[ca] if ca is not None else None
        s: list[int] = []
        o: list[int] = []
        arr: list[float] | None = [] if i_a is not None else None
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                raise TraceError(path, line, "empty row")
            if len(row) != len(header):
                raise TraceError(path, line, f"{len(row)} fields, the header has {len(header)}")
            try:
                s.append(_length(row[i_s], cs))
                o.append(_length(row[i_o], co))
                if arr is not None and i_a is not None:
                    arr.append(_timestamp(row[i_a]) if fmt == "azure" else float(row[i_a]))
            except ValueError as exc:
                raise TraceError(path, line, str(exc)) from None
    return _finish(path, fmt, s, o, arr)


def _load_jsonl(path: str) -> Trace:
    s: list[int] = []
    o: list[int] = []
    arr: list[float] = []
    cols: tuple[str, str, str | None] | None = None
    fmt = "generic"
    with open(path, encoding="utf-8") as fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                raise TraceError(path, line, "empty line")
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(path, line, f"not JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceError(path, line, "each line must be a JSON object")
            if cols is None:
                fmt, cols = _detect(list(obj), path)
            cs, co, ca = cols
            try:
                if cs not in obj or co not in obj:
                    raise ValueError(f"missing field {cs!r} or {co!r}")
                s.append(_length(obj[cs], cs))
                o.append(_length(obj[co], co))
                if ca is not None:
                    if ca not in obj:
                        raise ValueError(f"missing field {ca!r}")
                    arr.append(float(obj[ca]))
            except (ValueError, TypeError) as exc:
                raise TraceError(path, line, str(exc)) from None
    return _finish(path, fmt, s, o, arr if cols is not None and cols[2] is not None else None)


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Load a trace file (CSV, or JSONL when the name ends in ``.jsonl``)."""
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise TraceError(p, None, "no such file")
    try:
        if p.endswith(".jsonl"):
            return _load_jsonl(p)
        return _load_csv(p)
    except UnicodeDecodeError as exc:
        raise TraceError(p, None, f"not UTF-8 text ({exc.reason})") from None
    except csv.Error as exc:
        raise TraceError(p, None, f"malformed CSV ({exc})") from None
