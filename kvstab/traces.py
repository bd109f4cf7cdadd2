"""Loaders for request traces: lengths ``(s, o)`` and, where recorded, arrival times.

The format is detected from the columns (CSV header) or the keys of the first
object (JSON Lines); a file whose first non-blank character is ``{`` (or whose
name ends in ``.jsonl``) is read as JSON Lines, anything else as CSV:

=============  ==========================================  =========================  ======================
format         s, o columns                                arrival column             arrival unit
=============  ==========================================  =========================  ======================
``azure``      ``ContextTokens``, ``GeneratedTokens``      ``TIMESTAMP``              date-time (see below)
``burstgpt``   ``Request tokens``, ``Response tokens``     ``Timestamp``              seconds
``mooncake``   ``input_length``, ``output_length``         ``timestamp``              milliseconds
``vidur``      ``num_prefill_tokens``, ``num_decode_…``    none
``generic``    ``s``, ``o``                                ``arrival`` (optional)     seconds
``generic-…``  ``prompt_len``, ``output_len``              ``arrival`` (optional)     seconds
=============  ==========================================  =========================  ======================

* Azure LLM inference traces, both releases: 2023 (Splitwise,
  ``2023-11-16 18:17:03.9799600``, no zone) and 2024 (DynamoLLM, one week,
  ``2024-05-10 00:00:00.009930+00:00``).  A time without a zone is read as UTC:
  only differences matter, and UTC has no daylight-saving jumps.
* BurstGPT (``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``):
  its files with failures mark a failed request with 0 tokens, which is refused
  with a pointer to the ``*_without_fails_*`` files.
* Mooncake (FAST'25) JSON Lines: ``timestamp`` (ms), ``input_length``,
  ``output_length``, ``hash_ids``: one id per 512-token block of the prompt
  (:data:`MOONCAKE_BLOCK`), the last block possibly partial; equal ids are
  equal blocks.  Kept as :attr:`Trace.prompts` (:mod:`kvstab.prefix`): block
  ``i`` is the segment ``(id_i, 512)``, the last one ``s − 512·(n − 1)``
  tokens long, and a chain shorter than the prompt's blocks leaves the rest
  of the prompt as the request's own tokens.  A chain longer than
  ``⌈s/512⌉``, an id that is not an integer, or ``hash_ids`` on some rows
  but not on others is an error naming the row.

Every row must parse: a bad row is an error naming the file, the line, the
column and the value; nothing is skipped silently.  Lengths are checked with
:mod:`kvstab.validation` (integers in ``[1, MAX_TOKENS]``), arrivals must be
finite non-negative numbers (``nan``, ``inf`` or ``true`` are refused).
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import numpy.typing as npt

from kvstab import validation
from kvstab.data import TRACES, trace_path
from kvstab.errors import InvalidArgument, TraceError
from kvstab.prefix import PromptSet, content_ids

__all__ = ["Trace", "load_trace", "TRACE_FORMATS", "ARRIVAL_UNITS", "MAX_ARRIVAL_S", "MOONCAKE_BLOCK"]

IntArray = npt.NDArray[np.int64]

#: column names (s, o, arrival) of each known format, tried in this order
TRACE_FORMATS: dict[str, tuple[str, str, str | None]] = {
    "azure": ("ContextTokens", "GeneratedTokens", "TIMESTAMP"),
    "burstgpt": ("Request tokens", "Response tokens", "Timestamp"),
    "mooncake": ("input_length", "output_length", "timestamp"),
    "vidur": ("num_prefill_tokens", "num_decode_tokens", None),
    "generic": ("s", "o", "arrival"),
    "generic-long": ("prompt_len", "output_len", "arrival"),
}

#: seconds per unit of each format's arrival column (``None``: a date-time string)
ARRIVAL_UNITS: dict[str, float | None] = {
    "azure": None,
    "burstgpt": 1.0,
    "mooncake": 1e-3,
    "generic": 1.0,
    "generic-long": 1.0,
}

#: the largest arrival time accepted, in seconds (about 31,700 years: far beyond
#: any trace, small enough that arrival slots stay exact integers)
MAX_ARRIVAL_S = 1e12

#: tokens per Mooncake ``hash_ids`` block, as the FAST'25 release publishes it
MOONCAKE_BLOCK = 512

_TS = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?\s*(Z|[+-]\d{2}:?\d{2})?$"
)


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """Rows of a trace: lengths and, if the file records them, arrival times in
    seconds since the first row's arrival and the prompts' prefix structure
    (``prompts``: Mooncake's ``hash_ids``, else ``None``)."""

    s: IntArray
    o: IntArray
    arrival: npt.NDArray[np.float64] | None
    path: str
    format: str
    prompts: PromptSet | None = None

    def __len__(self) -> int:
        return int(self.s.size)


def _timestamp(text: object) -> float:
    """Seconds since the epoch of an Azure ``TIMESTAMP`` (2023: naive, 7 digits; 2024: ``+00:00``)."""
    m = _TS.match(str(text).strip())
    if not m:
        raise ValueError(f"timestamp {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]'")
    y, mo, d, h, mi, sec, frac, zone = m.groups()
    tz: timezone = UTC
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    try:
        base = datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec), tzinfo=tz).timestamp()
    except ValueError as exc:
        raise ValueError(f"timestamp {text!r} is not a valid date-time ({exc})") from None
    # datetime keeps microseconds only; the 2023 files carry 7 digits, so add the fraction ourselves
    return base + (float("0." + frac) if frac else 0.0)


def _length(value: object, column: str, fmt: str) -> int:
    try:
        n = validation.positive_int(column, value, maximum=2**64)
    except InvalidArgument as exc:
        if "too large" in str(exc):
            raise ValueError(f"{column}={value!r} is larger than {validation.MAX_TOKENS}, the most kvstab accepts") from None
        hint = ""
        if fmt == "burstgpt" and str(value).strip() == "0":
            # BurstGPT_*.csv records failed requests with 0 tokens
            hint = "; BurstGPT marks failed requests with 0 tokens: use the BurstGPT_without_fails_*.csv files"
        raise ValueError(f"{column}={value!r} is not a positive integer{hint}") from None
    if n > validation.MAX_TOKENS:
        raise ValueError(f"{column}={value!r} is larger than {validation.MAX_TOKENS}, the most kvstab accepts")
    return n


def _arrival(value: object, column: str, fmt: str) -> float:
    unit = ARRIVAL_UNITS[fmt]
    if unit is None:
        return _timestamp(value)
    try:
        seconds = validation.nonneg_float(column, value) * unit
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None
    if seconds > MAX_ARRIVAL_S:
        raise ValueError(f"{column}={value!r} is {seconds:g} s; arrival times must be at most {MAX_ARRIVAL_S:g} s")
    return seconds


def _detect(header: list[str], path: str) -> tuple[str, tuple[str, str, str | None]]:
    names = {h.strip() for h in header}
    for fmt, cols in TRACE_FORMATS.items():
        if cols[0] in names and cols[1] in names:
            arrival = cols[2] if cols[2] is not None and cols[2] in names else None
            return fmt, (cols[0], cols[1], arrival)
    shown = sorted(names)
    listed = ", ".join(repr(n) for n in shown[:8]) + (", …" if len(shown) > 8 else "")
    raise TraceError(
        path,
        1,
        f"unknown columns [{listed}]; expected one of "
        + "; ".join(f"{k}: {v[0]},{v[1]}" for k, v in TRACE_FORMATS.items()),
    )


def _hash_ids(value: object, s: int) -> list[int]:
    """A Mooncake row's ``hash_ids``: a list of 64-bit integers, at most ``⌈s/512⌉`` of them."""
    if not isinstance(value, list):
        raise ValueError(f"hash_ids={str(value)[:40]!r} is not a list of integers")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or not -(2**63) <= v < 2**63:
            raise ValueError(f"hash_ids[{i}]={v!r} is not a 64-bit integer")
    blocks = -(-s // MOONCAKE_BLOCK)
    if len(value) > blocks:
        raise ValueError(
            f"hash_ids has {len(value)} ids but input_length={s} is only {blocks} blocks of {MOONCAKE_BLOCK} tokens"
        )
    return value


def _mooncake_prompts(s: IntArray, chains: list[list[int]]) -> PromptSet:
    """Each row's prompt: its hash blocks of 512 tokens (the last one cut at ``s``), then its own tokens, if any."""
    n = np.array([len(c) for c in chains], dtype=np.int64)
    own = np.maximum(s - n * MOONCAKE_BLOCK, 0)  # tokens the chain does not cover
    per_row = n + (own > 0)
    off = np.concatenate(([0], np.cumsum(per_row))).astype(np.int64)
    ids = np.fromiter((h for c in chains for h in c), dtype=np.int64, count=int(n.sum()))
    rows = np.arange(s.size, dtype=np.int64)
    content = np.empty(int(off[-1]), dtype=np.int64)
    length = np.full(int(off[-1]), MOONCAKE_BLOCK, dtype=np.int64)
    first = off[:-1]
    hash_pos = np.repeat(first, n) + (np.arange(ids.size) - np.repeat(np.cumsum(n) - n, n))
    content[hash_pos] = content_ids("mooncake", ids)
    has = n > 0
    # the last hash block is cut at the prompt's end (s need not be a multiple of 512)
    last = first[has] + n[has] - 1
    length[last] = np.minimum(MOONCAKE_BLOCK, s[has] - (n[has] - 1) * MOONCAKE_BLOCK)
    tail = own > 0
    content[off[1:][tail] - 1] = content_ids("own", rows[tail])
    length[off[1:][tail] - 1] = own[tail]
    return PromptSet(off, content, length, output=content_ids("output", rows))


def _finish(
    path: str, fmt: str, s: list[int], o: list[int], arr: list[float] | None, chains: list[list[int]] | None = None
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
    s_arr = np.asarray(s, dtype=np.int64)
    prompts = _mooncake_prompts(s_arr, chains) if chains is not None else None
    return Trace(s_arr, np.asarray(o, dtype=np.int64), arrival, path, fmt, prompts)


def _load_csv(path: str) -> Trace:
    # utf-8-sig: a byte-order mark (Excel, some Azure downloads) must not become part of the first column's name
    with open(path, newline="", encoding="utf-8-sig") as fh:
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
                s.append(_length(row[i_s], cs, fmt))
                o.append(_length(row[i_o], co, fmt))
                if arr is not None and i_a is not None and ca is not None:
                    arr.append(_arrival(row[i_a], ca, fmt))
            except ValueError as exc:
                raise TraceError(path, line, str(exc)) from None
    return _finish(path, fmt, s, o, arr)


def _load_jsonl(path: str) -> Trace:
    s: list[int] = []
    o: list[int] = []
    arr: list[float] = []
    cols: tuple[str, str, str | None] | None = None
    fmt = "generic"
    chains: list[list[int]] | None = None  # Mooncake's hash_ids, if the first row has them
    with open(path, encoding="utf-8-sig") as fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                raise TraceError(path, line, "empty line")
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(path, line, f"not JSON ({exc.msg})") from None
            except RecursionError:
                raise TraceError(path, line, "not JSON (nested too deeply)") from None
            if not isinstance(obj, dict):
                raise TraceError(path, line, "each line must be a JSON object")
            if cols is None:
                fmt, cols = _detect(list(obj), path)
                if fmt == "mooncake" and "hash_ids" in obj:
                    chains = []
            cs, co, ca = cols
            try:
                if cs not in obj or co not in obj:
                    raise ValueError(f"missing field {cs!r} or {co!r}")
                s.append(_length(obj[cs], cs, fmt))
                o.append(_length(obj[co], co, fmt))
                if ca is not None:
                    if ca not in obj:
                        raise ValueError(f"missing field {ca!r}")
                    arr.append(_arrival(obj[ca], ca, fmt))
                if fmt == "mooncake" and ("hash_ids" in obj) != (chains is not None):
                    raise ValueError(
                        "hash_ids is missing here but present on line 1" if chains is not None
                        else "hash_ids is present here but missing on line 1; give it on every row or on none"
                    )
                if chains is not None:
                    chains.append(_hash_ids(obj["hash_ids"], s[-1]))
            except (ValueError, TypeError) as exc:
                raise TraceError(path, line, str(exc)) from None
    return _finish(path, fmt, s, o, arr if cols is not None and cols[2] is not None else None, chains)


def _is_jsonl(path: str) -> bool:
    """JSON Lines by name, or by content: the first non-blank character is ``{``."""
    if path.endswith(".jsonl"):
        return True
    with open(path, "rb") as fh:
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"{")


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Load a trace file in any format of :data:`TRACE_FORMATS` (detected from its columns),
    or a trace shipped with kvstab by its short name (``azure-conv``, …; see :mod:`kvstab.data`).

    Raises :class:`~kvstab.errors.TraceError` (one line: file, line, reason)
    for a missing, unreadable or malformed file.
    """
    p = os.fspath(path)
    if not os.path.exists(p) and p in TRACES:
        p = str(trace_path(p))  # a shipped trace by its short name (azure-conv, azure-code, sharegpt, arxiv)
    if os.path.isdir(p):
        raise TraceError(p, None, "is a directory; give a trace file (CSV or JSON Lines) inside it")
    if not os.path.exists(p):
        raise TraceError(p, None, f"no such file (nor a shipped trace: {', '.join(sorted(TRACES))})")
    if not os.path.isfile(p):
        raise TraceError(p, None, "is not a regular file; give a trace file (CSV or JSON Lines)")
    try:
        if _is_jsonl(p):
            return _load_jsonl(p)
        return _load_csv(p)
    except PermissionError:
        raise TraceError(p, None, "permission denied: the file cannot be read by this user") from None
    except UnicodeDecodeError as exc:
        raise TraceError(p, None, f"not UTF-8 text ({exc.reason})") from None
    except csv.Error as exc:
        raise TraceError(p, None, f"malformed CSV ({exc})") from None
    except OSError as exc:
        raise TraceError(p, None, f"cannot be read ({exc.strerror or exc})") from None
