"""One solver query in one fresh frame, with a deterministic budget, a wall-clock
budget, and Ctrl-C that is honoured.

Every query runs in its own :class:`z3.Solver` with a fixed random seed and a
resource limit (``rlimit``, deterministic across machines) as the budget; a
wall-clock budget per query is the backstop.  z3 does not look at Python's
signals while it is inside C, so the check runs in a worker thread while the
calling thread waits: at the wall-clock budget, or on Ctrl-C
(``KeyboardInterrupt`` in the waiting thread), the waiting thread calls
``ctx.interrupt()`` and z3 stops within milliseconds.  A query that comes back
``unknown`` is written to an ``.smt2`` file so that it can be rerun or sent to
another solver.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import z3

from kvstab.errors import InvalidArgument

__all__ = [
    "Budget",
    "Answer",
    "Status",
    "Interrupted",
    "solve",
    "save_query",
    "to_smt2",
    "MAX_RLIMIT",
    "register_bounds",
    "product_bounds",
    "DEFAULT_TOTAL_S",
    "progress_after",
]

#: the wall-clock budget of one whole ``kvstab prove`` run (seconds), by default
DEFAULT_TOTAL_S = 120.0

#: how often an interrupt is repeated until z3 stops (seconds)
INTERRUPT_EVERY_S = 0.5

#: z3 keeps ``rlimit`` in an unsigned 32-bit parameter: larger values wrap
MAX_RLIMIT = 2**32 - 1


class Status(enum.Enum):
    """What the solver said."""

    SAT = "sat"
    UNSAT = "unsat"
    UNKNOWN = "unknown"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while the solver ran (the message names the query it stopped)."""


#: set by :func:`ctrl_c_stops_solving`'s handler; the solver loop stops at the next safe point
_STOP = threading.Event()


@contextmanager
def ctrl_c_stops_solving() -> Iterator[None]:
    """Within this block Ctrl-C only sets a flag, which :func:`solve` checks before a
    query and while one runs (then it interrupts z3 and raises :class:`Interrupted`).

    Why not Python's ``KeyboardInterrupt``: raised asynchronously, it can land inside
    z3's Python API between a C call and its reference bookkeeping, and the process
    then dies at exit (a "double free" was seen with Ctrl-C between two queries).
    Only the main thread can install the handler; elsewhere the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: _STOP.set())
    _STOP.clear()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _STOP.clear()


def _default_dir() -> Path:
    return Path(tempfile.gettempdir()) / "kvstab-smt2"


@dataclass(frozen=True, slots=True)
class Budget:
    """How much each query may spend, and where undecided queries are kept."""

    rlimit: int = field(default=200_000_000, metadata={"help": "z3 resource limit per query (deterministic budget)"})
    seed: int = field(default=0, metadata={"help": "z3 random seed (fixed: solving is deterministic)"})
    timeout_ms: int = field(default=300_000, metadata={"help": "wall-clock budget per query, milliseconds"})
    smt2_dir: Path = field(default_factory=_default_dir, metadata={"help": "where Unknown queries are saved"})
    #: keep every query (not only the undecided ones) as SMT-LIB under ``smt2_dir``
    keep_all: bool = field(default=False, metadata={"help": "save every obligation as .smt2 (certificates)"})
    #: the wall-clock budget of the whole run (seconds; None: only the per-query budget)
    total_s: float | None = field(default=None, metadata={"help": "wall-clock budget of the whole run, seconds"})
    #: when that budget ends (``time.monotonic()``); set by :meth:`started`
    deadline: float | None = field(default=None, compare=False, metadata={"help": "end of the total budget"})
    #: seconds of the total budget this phase leaves to a later one (``kvstab prove --claims`` keeps the claims' share)
    reserved_s: float = field(default=0.0, metadata={"help": "seconds of the total kept for a later phase"})
    #: told the name of each obligation group as it starts (progress for a long run)
    progress: Callable[[str], None] | None = field(
        default=None, compare=False, repr=False, metadata={"help": "called with each obligation group's name"}
    )

    def __post_init__(self) -> None:
        if isinstance(self.rlimit, bool) or not isinstance(self.rlimit, int) or not 1 <= self.rlimit <= MAX_RLIMIT:
            raise InvalidArgument(f"rlimit must be an integer in [1, {MAX_RLIMIT}] (z3's limit), got {self.rlimit!r}")
        if isinstance(self.timeout_ms, bool) or not isinstance(self.timeout_ms, int) or self.timeout_ms < 1:
            raise InvalidArgument(f"timeout_ms must be a positive integer, got {self.timeout_ms!r}")
        if self.total_s is not None and (
            isinstance(self.total_s, bool) or not isinstance(self.total_s, (int, float)) or not self.total_s > 0
        ):
            raise InvalidArgument(f"total_s must be a positive number of seconds or None, got {self.total_s!r}")

    def started(self) -> Budget:
        """This budget with its total clock started now (unchanged when it has no
        total, or its clock already runs: a run's phases share one deadline)."""
        if self.total_s is None or self.deadline is not None:
            return self
        return dataclasses.replace(self, deadline=time.monotonic() + float(self.total_s))

    def left(self) -> float | None:
        """Seconds left of the total budget, less what is kept for later (None: no total budget; ≤ 0: spent)."""
        return None if self.deadline is None else self.deadline - self.reserved_s - time.monotonic()

    def keeping(self, seconds: float) -> Budget:
        """This budget (its clock started) for a phase that must leave ``seconds`` of it to a later one."""
        return dataclasses.replace(self.started(), reserved_s=self.reserved_s + max(0.0, seconds))

    def kept_note(self) -> str:
        """``" (less R s kept for the declared claims)"`` for a phase that keeps some of the budget, else ``""``."""
        return f" (less {self.reserved_s:g} s kept for the declared claims)" if self.reserved_s else ""

    def spent(self) -> bool:
        """Whether the total budget is used up (never, without one)."""
        left = self.left()
        return left is not None and left <= 0

    def group(self, name: str) -> None:
        """Announce that the obligation group ``name`` starts (to :attr:`progress`)."""
        if self.progress is not None:
            self.progress(name)

    def spent_reason(self) -> str:
        """The reason an obligation not decided for lack of total budget gives."""
        return (
            f"total budget of {self.total_s:g} s{self.kept_note()} spent (raise --total-timeout, or lower --K/--Q or --bmc "
            "to make the queries smaller)"
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """``status``; ``model`` on sat, ``smt2`` (the saved query) and ``reason`` on unknown."""

    status: Status
    model: z3.ModelRef | None = None
    smt2: str | None = None
    reason: str = ""


def progress_after(write: Callable[[str], None], after_s: float = 3.0) -> Callable[[str], None]:
    """A :attr:`Budget.progress` that passes each group, with the seconds since it
    was made, to ``write`` — once the run has taken ``after_s`` (a quick run stays quiet)."""
    t0 = time.monotonic()

    def tell(group: str) -> None:
        elapsed = time.monotonic() - t0
        if elapsed >= after_s:
            write(f"[{elapsed:6.1f} s] {group} …")

    return tell


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:80] or "query"


def _check(s: z3.Solver, name: str, wall_s: float) -> tuple[z3.CheckSatResult | None, bool]:
    """``s.check()`` in a worker thread; the caller's thread honours Ctrl-C and
    the wall-clock budget by interrupting z3.  Returns (result, timed_out)."""
    box: list[z3.CheckSatResult | BaseException] = []

    def work() -> None:
        try:
            box.append(s.check())
        except BaseException as exc:  # z3 raises Z3Exception when interrupted in some versions
            box.append(exc)

    th = threading.Thread(target=work, name=f"z3:{name}", daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + wall_s
        while th.is_alive() and not _STOP.is_set() and time.monotonic() < deadline:
            th.join(min(0.05, max(0.0, deadline - time.monotonic())))
        if _STOP.is_set():
            while th.is_alive():  # stop z3 first: the thread must not outlive the run
                s.ctx.interrupt()
                th.join(INTERRUPT_EVERY_S)
            raise Interrupted(f"interrupted (Ctrl-C) while solving {name!r}; no verdict")
        timed_out = th.is_alive()
        while th.is_alive():
            # z3 honours an interrupt only where it polls for it, and one sent while it moves
            # between sub-solvers can be lost (an audit of sglang sat minutes past its budget
            # in a join after a single interrupt): repeat it until the check returns
            s.ctx.interrupt()
            th.join(INTERRUPT_EVERY_S)
    except KeyboardInterrupt:
        s.ctx.interrupt()
        th.join()
        raise Interrupted(f"interrupted (Ctrl-C) while solving {name!r}; no verdict") from None
    res = box[0] if box else None
    if isinstance(res, BaseException):
        if timed_out:
            return None, True
        raise res
    return res, timed_out


#: declared bounds of the scheduler-state variables (name → (lo, hi)), as
#: :func:`register_bounds` recorded them when the encoding made the variables
_BOUNDS: dict[str, tuple[Fraction, Fraction]] = {}


def register_bounds(var: z3.ArithRef, lo: int | float, hi: int | float) -> None:
    """Record that ``var`` is declared within ``[lo, hi]`` (a scheduler state
    variable), so that :func:`product_bounds` can bound its products."""
    _BOUNDS[str(var)] = (Fraction(lo), Fraction(hi))


def _bounded_factor(t: z3.ExprRef) -> tuple[z3.ArithRef, tuple[Fraction, Fraction]] | None:
    if z3.is_const(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED and str(t) in _BOUNDS:
        return t, _BOUNDS[str(t)]  # type: ignore[return-value]
    return None


def product_bounds(assertions: Sequence[z3.BoolRef]) -> list[z3.BoolRef]:
    """Linear facts about every product ``r · t`` of a declared-bounded state
    variable ``r`` with another term ``t`` in ``assertions``.

    A real state variable times an integer term makes a query non-linear, and
    z3's non-linear arithmetic can take minutes on the memory goal of a rule
    like "admit if used + first + ratio·Σ remaining ≤ M".  For ``r ∈ [lo, hi]``
    the product lies between ``lo·t`` and ``hi·t`` (in the order the sign of
    ``t`` gives) — a fact of arithmetic, valid in every model, stated here as
    ``lo ≤ r ≤ hi ⇒ (t ≥ 0 ? lo·t ≤ r·t ≤ hi·t : hi·t ≤ r·t ≤ lo·t)``.  Adding
    valid facts keeps the query equivalent (so every answer stands, and a saved
    certificate carries them), and their linear bounds on the product are
    usually all a proof needs.  The facts do not rely on the bounds being
    right: each is conditioned on them.

    The facts of each assertion are remembered (:data:`_PRODUCT_FACTS`): a proof
    asks many queries that share most of their assertions, and walking those
    terms again in Python took longer than the solver (``kvstab prove
    --scheduler sglang``).
    """
    out: list[z3.BoolRef] = []
    ids: set[int] = set()
    for a in assertions:
        for f in _facts_under(a):
            if f.get_id() not in ids:
                ids.add(f.get_id())
                out.append(f)
    return out


#: per term (by id): the term itself (kept alive, so that its id stays its own) and the product
#: facts of every product under it; cleared when it grows past _UNDER_MAX terms
_UNDER: dict[int, tuple[z3.ExprRef, tuple[z3.BoolRef, ...]]] = {}
_UNDER_MAX = 1 << 18


def _facts_under(t: z3.ExprRef) -> tuple[z3.BoolRef, ...]:
    """The facts of the products under ``t``, children first (remembered per subterm: a
    proof's queries share most of their terms, and walking them again in Python took
    longer than the solver on ``kvstab prove --scheduler sglang``)."""
    if len(_UNDER) > _UNDER_MAX:
        _UNDER.clear()
    memo = _UNDER
    stack: list[tuple[z3.ExprRef, bool]] = [(t, False)]
    while stack:
        x, ready = stack.pop()
        i = x.get_id()
        if i in memo:
            continue
        kids = x.children()
        if not ready:
            stack.append((x, True))
            stack.extend((c, False) for c in reversed(kids) if c.get_id() not in memo)
            continue
        facts: list[z3.BoolRef] = []
        seen: set[int] = set()
        for c in kids:
            for f in memo[c.get_id()][1]:
                if f.get_id() not in seen:
                    seen.add(f.get_id())
                    facts.append(f)
        own = _product_fact(x)
        if own is not None and own.get_id() not in seen:
            facts.append(own)
        memo[i] = (x, tuple(facts))
    return memo[t.get_id()][1]


def _product_fact(t: z3.ExprRef) -> z3.BoolRef | None:
    """The fact of ``t`` if it is a product ``r · u`` of a bounded state variable ``r``."""
    if not (z3.is_app_of(t, z3.Z3_OP_MUL) and t.num_args() >= 2):
        return None
    args = t.children()
    for i, a in enumerate(args):
        hit = _bounded_factor(a)
        if hit is None:
            continue
        r, (lo, hi) = hit
        rest = args[:i] + args[i + 1 :]
        other = rest[0] if len(rest) == 1 else z3.Product(*rest)
        if z3.is_rational_value(other) or z3.is_int_value(other):
            return None  # linear already
        lo_t, hi_t = _scaled(lo, other), _scaled(hi, other)
        env = z3.If(other >= 0, z3.And(lo_t <= t, t <= hi_t), z3.And(hi_t <= t, t <= lo_t))
        return z3.Implies(z3.And(_num(lo, r) <= r, r <= _num(hi, r)), env)  # type: ignore[return-value]
    return None


def _num(v: Fraction, like: z3.ArithRef) -> z3.ArithRef:
    return z3.RealVal(v) if like.is_real() else z3.IntVal(int(v))


def _scaled(c: Fraction, t: z3.ArithRef) -> z3.ArithRef:
    """``c · t`` as a linear term of ``t``'s sort (real when ``c`` is not an integer)."""
    if c.denominator == 1 and t.is_int():
        return z3.IntVal(int(c)) * t
    return z3.RealVal(c) * (z3.ToReal(t) if t.is_int() else t)


def solve(assertions: Sequence[z3.BoolRef], budget: Budget, name: str) -> Answer:
    """Check ``assertions`` in a fresh solver frame under ``budget`` (with the
    valid linear facts :func:`product_bounds` adds for non-linear products)."""
    if _STOP.is_set():  # Ctrl-C between two queries (see ctrl_c_stops_solving)
        raise Interrupted(f"interrupted (Ctrl-C) before solving {name!r}; no verdict")
    left = budget.left()
    if left is not None and left <= 0:
        # the whole run's budget is spent: the query is not asked (nor saved: it was never tried)
        return Answer(Status.UNKNOWN, reason=budget.spent_reason())
    if _BOUNDS:
        assertions = list(assertions) + product_bounds(assertions)
    wall_ms = budget.timeout_ms if left is None else max(1, min(budget.timeout_ms, int(left * 1000)))
    s = z3.Solver()
    s.set("random_seed", budget.seed)
    s.set("rlimit", budget.rlimit)
    s.set("timeout", wall_ms)
    # z3's own SIGINT handler would cancel only the current query and let the
    # run go on; Python's handler (in the waiting thread) stops the whole run
    s.set("ctrl_c", False)
    s.add(*assertions)
    r, timed_out = _check(s, name, wall_ms / 1000 + 1.0)
    if r == z3.sat or r == z3.unsat:
        status = Status.SAT if r == z3.sat else Status.UNSAT
        # a certificate records what z3 answered, for another solver to confirm
        smt2 = save_query(assertions, budget, name, f"z3: {status.value}") if budget.keep_all else None
        return Answer(status, model=s.model() if status is Status.SAT else None, smt2=smt2)
    if budget.spent():
        # the run's clock, not this query's own budget, stopped it: it is not kept (writing a large
        # query out takes long — past the budget it exists to keep — and an rlimit-bound query,
        # the one worth rerunning, is kept below)
        return Answer(Status.UNKNOWN, reason=budget.spent_reason())
    reason = "wall-clock budget" if timed_out else (s.reason_unknown() or "unknown")
    smt2 = save_query(assertions, budget, name, f"z3 said unknown: {reason}")
    return Answer(Status.UNKNOWN, smt2=smt2, reason=reason)


#: a symbol z3 prints bare although SMT-LIB does not allow it bare (it holds a ``'``)
_PRIMED = re.compile(r"(?<![|\w.'])([A-Za-z_][\w.~!@$%^&*+=<>?/-]*'[\w.~!@$%^&*+=<>?/'-]*)")


def to_smt2(assertions: Sequence[z3.BoolRef]) -> str:
    """The SMT-LIB text of ``assertions`` (with ``(check-sat)``), portable to
    other solvers: symbols with a prime are quoted as ``|x'|``."""
    s = z3.Solver()
    s.add(*assertions)
    return _PRIMED.sub(r"|\1|", s.to_smt2())


def save_query(assertions: Sequence[z3.BoolRef], budget: Budget, name: str, note: str) -> str:
    """Write ``assertions`` as an ``.smt2`` file under ``budget.smt2_dir``; return its path."""
    text = to_smt2(assertions)
    budget.smt2_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = budget.smt2_dir / f"{_slug(name)}-{digest}.smt2"
    # comments in ASCII: some solvers' lexers stop at the first other byte
    head = f"; kvstab query: {name}\n; {note}\n".encode("ascii", "backslashreplace").decode("ascii")
    path.write_text(head + "(set-logic ALL)\n" + text, encoding="utf-8")
    return str(path)
