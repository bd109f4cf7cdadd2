"""Fresh solver frames with a deterministic budget.

Every query runs in its own :class:`z3.Solver` with a fixed random seed and a
resource limit (``rlimit``, deterministic across machines) as the budget; a
wall-clock timeout is only a backstop.  A query that comes back ``unknown`` is
written to an ``.smt2`` file so that it can be rerun or sent to another solver.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import z3

__all__ = ["Budget", "Answer", "solve", "save_query"]


def _default_dir() -> Path:
    return Path(tempfile.gettempdir()) / "kvstab-smt2"


@dataclass(frozen=True, slots=True)
class Budget:
    """How much each query may spend, and where undecided queries are kept."""

    rlimit: int = field(default=200_000_000, metadata={"help": "z3 resource limit per query (deterministic budget)"})
    seed: int = field(default=0, metadata={"help": "z3 random seed (fixed: solving is deterministic)"})
    timeout_ms: int = field(default=300_000, metadata={"help": "wall-clock backstop per query, milliseconds"})
    smt2_dir: Path = field(default_factory=_default_dir, metadata={"help": "where Unknown queries are saved"})


@dataclass(frozen=True, slots=True)
class Answer:
    """``status`` is ``"sat"``, ``"unsat"`` or ``"unknown"``; ``model`` on sat,
    ``smt2`` (the saved query) and ``reason`` on unknown."""

    status: str
    model: z3.ModelRef | None = None
    smt2: str | None = None
    reason: str = ""


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:80] or "query"


def solve(assertions: Sequence[z3.BoolRef], budget: Budget, name: str) -> Answer:
    """Check ``assertions`` in a fresh solver frame under ``budget``."""
    s = z3.Solver()
    s.set("random_seed", budget.seed)
    s.set("rlimit", budget.rlimit)
    s.set("timeout", budget.timeout_ms)
    s.add(*assertions)
    r = s.check()
    if r == z3.sat:
        return Answer("sat", model=s.model())
    if r == z3.unsat:
        return Answer("unsat")
    reason = s.reason_unknown() or "unknown"
    return Answer("unknown", smt2=save_query(assertions, budget, name, f"z3 said unknown: {reason}"), reason=reason)


def save_query(assertions: Sequence[z3.BoolRef], budget: Budget, name: str, note: str) -> str:
    """Write ``assertions`` as an ``.smt2`` file under ``budget.smt2_dir``; return its path."""
    s = z3.Solver()
    s.add(*assertions)
    text = s.to_smt2()
    budget.smt2_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = budget.smt2_dir / f"{_slug(name)}-{digest}.smt2"
    path.write_text(f"; kvstab query: {name}\n; {note}\n{text}", encoding="utf-8")
    return str(path)
