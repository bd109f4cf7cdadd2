"""A rule run once on sequences of unknown length: the folds it is made of.

``kvstab.contract`` gives rules combinators to read ``view.active`` and
``view.waiting`` with (:func:`~kvstab.contract.scan` and the helpers built on
it, :func:`~kvstab.contract.fcfs_admit_projected`).  :func:`run_abstract`
shows the rule a view whose two sequences are :class:`Lazy`: they cannot be
iterated, measured or indexed — any attempt raises :class:`NotAFold` naming
the rule's line — and each combinator, instead of unrolling its step, hands it
to this module, which runs the step **once** on a fresh symbolic element and a
fresh symbolic accumulator, records the terms (:class:`Fold`) and returns
fresh symbols for the final accumulator and lazy sequences for the outputs.

What a completed run shows, structurally rather than by sampling sizes: the
rule's code outside the steps never saw how many entries there are (it could
not ask), so for ``n`` entries its decision is the ``n``-fold unrolling of the
recorded steps, for every ``n``.  The one other way a step could depend on its
position — state kept between calls — is closed by :func:`impurity`: a step
may not assign a global or an enclosing function's variable, nor capture a
mutable object.  ``kvstab.proofs.unbounded`` proves the memory invariant from
obligations about one step each.
"""

from __future__ import annotations

import dataclasses
import dis
import os
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import z3

from kvstab.contract import ActiveEntry, Decision, Projected, Scheduler, View, WaitingEntry, state_vars_of
from kvstab.errors import KvstabError
from kvstab.ops import Ops
from kvstab.proofs.encoding import OPS, Entry, Setting, call_decide, state_terms
from kvstab.symbolic import Sym, unwrap

__all__ = ["NotAFold", "Lazy", "Fold", "Retraction", "ProjectedAdmission", "Program", "run_abstract", "impurity"]

_HERE = os.path.abspath(__file__)
#: the contract package's folder: its combinators run in files there, never the rule
_CONTRACT = os.path.dirname(os.path.abspath(sys.modules[View.__module__].__file__ or ""))


class NotAFold(Exception):
    """The rule is not made of folds: it read a sequence other than through the
    contract's combinators, or a step is not a pure function (the message says where)."""


def _where() -> str:
    """``file:line (source)`` of the innermost frame outside this module and the contract."""
    import linecache

    f: types.FrameType | None = sys._getframe(1)
    while f is not None and ((path := os.path.abspath(f.f_code.co_filename)) == _HERE or os.path.dirname(path) == _CONTRACT):
        f = f.f_back
    if f is None:
        return "<unknown>"
    src = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    name = os.path.relpath(f.f_code.co_filename) if not f.f_code.co_filename.startswith("<") else f.f_code.co_filename
    return f"{name}:{f.f_lineno} ({src})" if src else f"{name}:{f.f_lineno}"


@dataclass(frozen=True, slots=True)
class Fold:
    """One recorded :func:`~kvstab.contract.scan`: its step run once on a fresh
    element and a fresh accumulator (every term flattened, leaves in order)."""

    index: int
    #: ``"active"`` or ``"waiting"``: the list whose entries the fold walks
    base: str
    #: the step's name and where it is defined
    where: str
    #: the entry the element stands for (``p`` is 0 for a waiting entry)
    entry: Entry
    #: element components that are another fold's output at the same entry: (symbol, fold, component)
    links: tuple[tuple[z3.ExprRef, int, int], ...]
    acc: tuple[z3.ExprRef, ...]
    init: tuple[z3.ExprRef, ...]
    nxt: tuple[z3.ExprRef, ...]
    final: tuple[z3.ExprRef, ...]
    #: the step's output for the element, one term per component (``None``: no output)
    outs: tuple[z3.ExprRef | None, ...]
    #: a name for each accumulator leaf, from the step's own unpacking of it (``acc[i]`` otherwise)
    names: tuple[str, ...] = ()
    #: element components that are a retraction's flag at the same entry: (symbol, retraction)
    retracted: tuple[tuple[z3.ExprRef, int], ...] = ()
    #: the values the step reads from the rule around it (its closure), by their names there
    consts: tuple[tuple[str, z3.ArithRef], ...] = ()


@dataclass(frozen=True, slots=True)
class Retraction:
    """One recorded :func:`~kvstab.contract.retract_until_fits` over the active list:
    its cost and key run once on a fresh entry, its cap and whether it may run."""

    index: int
    where: str
    entry: Entry
    cost: z3.ArithRef
    keys: tuple[z3.ExprRef, ...]
    cap: z3.ArithRef
    allowed: z3.BoolRef
    #: the flag at ``entry``, as the decision's terms name it (a host's loop renames it)
    out: z3.BoolRef


@dataclass(frozen=True, slots=True)
class ProjectedAdmission:
    """A recorded :func:`~kvstab.contract.fcfs_admit_projected`: its projection."""

    project: Callable[[Any, Any, Any, Any], Projected]
    view: View
    where: str


@dataclass(frozen=True, slots=True)
class Program:
    """What :func:`run_abstract` saw: the folds in the order they ran, a projected
    admission if any, and the decision in terms of them."""

    folds: tuple[Fold, ...]
    projected: ProjectedAdmission | None
    decision: Decision
    view: View
    #: the pre state of a stateful rule (one term per declared variable)
    state: tuple[z3.ArithRef, ...]
    n_waiting: z3.ArithRef
    retractions: tuple[Retraction, ...] = ()


class Lazy:
    """A sequence of unknown length: only the contract's combinators may read it."""

    __slots__ = ("rec", "base", "kind")

    def __init__(self, rec: _Recorder, base: str, kind: tuple[Any, ...]) -> None:
        self.rec = rec
        self.base = base
        #: ("entries",), ("out", fold, component), ("zip", parts), ("concat", parts), ("projected",),
        #: ("retracted", retraction) or ("select", condition, then, other)
        self.kind = kind

    def _refuse(self, how: str) -> NoReturn:
        why = (
            f"{_where()} {how} view.{self.base} (or a sequence made from it) other than through "
            "kvstab.contract's combinators (scan, sum_of, count_of, any_of, fcfs_admit, …)"
        )
        # remembered as well as raised: a rule that caught the exception is still outside
        self.rec.refused = self.rec.refused or why
        raise NotAFold(why)

    def __iter__(self) -> Iterator[Any]:
        self._refuse("iterates")

    def __len__(self) -> int:
        self._refuse("measures")

    def __getitem__(self, _: object) -> NoReturn:
        self._refuse("indexes")

    def __bool__(self) -> bool:
        self._refuse("tests the truth of")

    def __contains__(self, _: object) -> bool:
        self._refuse("searches")

    def __reversed__(self) -> Iterator[Any]:
        self._refuse("reverses")

    def __add__(self, other: object) -> Lazy:
        if isinstance(other, tuple) and not other:
            return self
        if not isinstance(other, Lazy):
            self._refuse("concatenates a fixed tuple to")
        return Lazy(self.rec, "grants", ("concat", (self, other)))

    def __radd__(self, other: object) -> Lazy:
        if isinstance(other, tuple) and not other:
            return self
        self._refuse("concatenates a fixed tuple to")

    def __kvstab_scan__(self, step: Callable[[Any, Any], tuple[Any, Any]], init: Any, width: int | None) -> Any:
        return self.rec.scan(self, step, init, width)

    def __kvstab_zip__(self, *seqs: Any) -> Lazy:
        if not all(isinstance(s, Lazy) and s.base == self.base for s in seqs):
            self._refuse("zips a sequence of another length with")
        return Lazy(self.rec, self.base, ("zip", (self, *seqs)))

    def __kvstab_projected__(self, view: View, ops: Any, project: Any) -> Lazy:
        return self.rec.projected_admission(view, project)

    def __kvstab_retract__(self, view: View, ops: Any, cost: Any, key: Any, cap: Any, allowed: Any) -> Lazy:
        if self.kind[0] != "entries" or self.base != "active":
            self._refuse("retracts from something other than")
        return self.rec.retraction(view, cost, key, cap, allowed)

    def __kvstab_select__(self, cond: Any, other: Any) -> Lazy:
        if not (isinstance(other, Lazy) and other.base == self.base):
            self._refuse("selects between a sequence of another length and")
        if self.rec.depth:
            raise NotAFold(f"{_where()}: a selection inside a scan's step")
        c = _term(cond, "the condition of a selection")
        if c.sort() != z3.BoolSort():
            raise NotAFold(f"{_where()}: a selection's condition is {c.sort()}, not a truth value")
        return Lazy(self.rec, self.base, ("select", c, self, other))

    def __repr__(self) -> str:
        return f"<view.{self.base} of unknown length: {self.kind[0]}>"


# --- pytrees: an accumulator is a value or a (nested) tuple of values


def _leaves(tree: Any) -> list[Any]:
    if isinstance(tree, tuple):
        return [x for t in tree for x in _leaves(t)]
    return [tree]


def _rebuild(tree: Any, leaves: Iterator[Any]) -> Any:
    if isinstance(tree, tuple):
        return tuple(_rebuild(t, leaves) for t in tree)
    return next(leaves)


def _shape(tree: Any) -> Any:
    return tuple(_shape(t) for t in tree) if isinstance(tree, tuple) else None


def _term(x: Any, what: str) -> z3.ExprRef:
    """A leaf as a z3 term (Python bools, ints and floats become values)."""
    if x is None or isinstance(x, (str, bytes, Lazy)) or not isinstance(z := unwrap(x), z3.ExprRef):
        raise NotAFold(f"{what} holds {x!r}, not a number or a truth value")
    return z


def _coerce(z: z3.ExprRef, like: z3.ExprRef, what: str) -> z3.ExprRef:
    """``z`` in the sort of ``like`` (an integer term where a real is kept is widened)."""
    if z.sort() == like.sort():
        return z
    if isinstance(z, z3.ArithRef) and z.is_int() and isinstance(like, z3.ArithRef) and like.is_real():
        return z3.ToReal(z)
    raise NotAFold(f"{what}: the step turns a {like.sort()} into a {z.sort()}")


def _fresh(leaf: z3.ExprRef, name: str) -> z3.ExprRef:
    if leaf.sort() == z3.BoolSort():
        return z3.Bool(name)
    if isinstance(leaf, z3.ArithRef) and leaf.is_real():
        return z3.Real(name)
    if isinstance(leaf, z3.ArithRef) and leaf.is_int():
        return z3.Int(name)
    raise NotAFold(f"{name}: an accumulator of sort {leaf.sort()} (only integers, reals and truth values)")


# --- purity: a step may not keep state between calls

#: how deep captured values and called functions are followed
_DEPTH = 12


def _mutable(v: Any, depth: int, seen: set[int]) -> str | None:
    """Why ``v`` (a value a step captured) could carry state between calls, or ``None``."""
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes, range)):
        return None
    if isinstance(v, (types.FunctionType, types.MethodType)):
        return impurity(v, depth + 1, seen)  # it keeps its own record of what it checked
    if id(v) in seen:
        return None
    seen.add(id(v))
    if isinstance(v, (Sym, z3.AstRef, Lazy, types.ModuleType, type, types.BuiltinFunctionType)) or isinstance(v, Ops):
        return None  # terms, the opaque sequences, modules, classes, builtins, the stateless ops
    if depth > _DEPTH:
        return f"a value nested too deep to check ({type(v).__name__})"
    if isinstance(v, (tuple, frozenset)):
        return next((w for x in v if (w := _mutable(x, depth + 1, seen))), None)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        if not type(v).__dataclass_params__.frozen:  # type: ignore[attr-defined]
            return f"a mutable {type(v).__name__}"
        return next((w for f in dataclasses.fields(v) if (w := _mutable(getattr(v, f.name), depth + 1, seen))), None)
    return f"a mutable {type(v).__name__}"


def impurity(fn: Any, depth: int = 0, seen: set[int] | None = None) -> str | None:
    """Why ``fn`` may not be a pure function of its arguments, or ``None``.

    A fold's step is run once here and unrolled ``n`` times in a real slot; a
    step that kept state between calls (a counter in a captured list, a
    ``nonlocal`` or ``global`` it assigns) could depend on its position, which
    the one run would not show.  Checked: no ``STORE_GLOBAL``, no assignment
    to an enclosing function's variable (in the step or a function nested in
    it), and every captured value (closure, defaults, a bound method's object)
    immutable — numbers, terms, tuples, frozen dataclasses, functions that pass
    this check — recursively.
    """
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return None
    seen.add(id(fn))
    if isinstance(fn, types.MethodType):
        return _mutable(fn.__self__, depth + 1, seen) or impurity(fn.__func__, depth + 1, seen)
    if isinstance(fn, types.BuiltinFunctionType):
        return None
    code = getattr(fn, "__code__", None)
    if code is None:
        if dataclasses.is_dataclass(fn) and callable(fn):
            # a frozen object with a __call__: its fields and that method
            return _mutable(fn, depth + 1, seen) or impurity(type(fn).__call__, depth + 1, seen)
        return f"{type(fn).__name__} is not a function whose code can be checked"
    if depth > _DEPTH:
        return f"{fn.__qualname__} calls functions nested too deep to check"
    outer = set(code.co_freevars)
    glb = getattr(fn, "__globals__", {})
    stack = [code]
    while stack:
        c = stack.pop()
        for ins in dis.get_instructions(c):
            if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                return f"{fn.__qualname__} assigns the global {ins.argval!r}"
            if ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in outer:
                return f"{fn.__qualname__} assigns {ins.argval!r} of an enclosing function"
            if ins.opname == "LOAD_GLOBAL" and ins.argval in glb:
                # a module-level value it reads: a function is checked in turn, data must be immutable
                why = _mutable(glb[ins.argval], depth + 1, seen)
                if why:
                    return f"{fn.__qualname__} reads the global {ins.argval!r}, {why}"
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell: a name assigned later in the enclosing function
            return f"{fn.__qualname__} reads {name!r} before its enclosing function assigns it"
        why = _mutable(v, depth + 1, seen)
        if why:
            return f"{fn.__qualname__} captures {name!r}, {why}"
    for v in (fn.__defaults__ or ()) + tuple((fn.__kwdefaults__ or {}).values()):
        why = _mutable(v, depth + 1, seen)
        if why:
            return f"{fn.__qualname__} has a default value that is {why}"
    return None


def _qualname(fn: Any) -> str:
    f = getattr(fn, "__func__", fn)
    code = getattr(f, "__code__", None)
    name = getattr(f, "__qualname__", type(fn).__name__)
    if code is None:
        return name
    return f"{name} ({os.path.relpath(code.co_filename)}:{code.co_firstlineno})"


def leaf_names(step: Any, shape: Any) -> tuple[str, ...]:
    """Names for the accumulator's leaves, for reports: the step's own words where
    its body unpacks the accumulator (``prefix, kept = acc``), else ``acc[i]``."""
    import ast
    import inspect
    import textwrap

    n = len(_leaves(shape))
    fallback = tuple("acc" if n == 1 else f"acc[{i}]" for i in range(n))
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(step, "__func__", step))))
    except (OSError, TypeError, SyntaxError):
        return fallback
    fn = next((x for x in ast.walk(tree) if isinstance(x, (ast.FunctionDef, ast.Lambda))), None)
    if fn is None or len(fn.args.args) < 2:
        return fallback
    acc_name = fn.args.args[1].arg
    if not isinstance(shape, tuple):
        return (acc_name,)
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Name)
            and node.value.id == acc_name
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Tuple)
            and len(node.targets[0].elts) == len(shape)
            and all(isinstance(e, ast.Name) for e in node.targets[0].elts)
        ):
            names: list[str] = []
            for e, sub in zip(node.targets[0].elts, shape):
                k = len(_leaves(sub))
                assert isinstance(e, ast.Name)
                names += [e.id] if k == 1 else [f"{e.id}[{i}]" for i in range(k)]
            return tuple(names)
    return fallback


def captured(step: Any) -> tuple[tuple[str, z3.ArithRef], ...]:
    """The numbers a step reads from the rule around it (its closure's terms), by the
    names the rule gives them: the constants of the fold's loop (``free``, ``n_active`` …)."""
    fn = getattr(step, "__func__", step)
    code = getattr(fn, "__code__", None)
    out: list[tuple[str, z3.ArithRef]] = []
    for name, cell in zip(code.co_freevars if code else (), getattr(fn, "__closure__", None) or ()):
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        z = unwrap(v) if isinstance(v, Sym) else None
        if isinstance(z, z3.ArithRef) and not z3.is_rational_value(z) and not z3.is_int_value(z):
            out.append((name, z))
    return tuple(out)


# --- one element of a list


def fresh_element(tag: str, active: bool, caching: bool) -> Entry:
    """The fresh terms of one entry a step reads (``tag.x.*``).  With prefix caching
    every entry has a symbolic ``shared`` and a waiting one a symbolic cached prefix
    (its ``p``: admitted, it starts there); without, both are the integer 0, built as
    the same terms as before caching existed."""
    if active:
        p: z3.ArithRef = z3.Int(f"{tag}.x.p")
    else:
        p = z3.Int(f"{tag}.x.cached") if caching else z3.IntVal(0)
    shared = z3.Int(f"{tag}.x.shared") if caching else z3.IntVal(0)
    return Entry(z3.BoolVal(True), z3.Int(f"{tag}.x.rid"), z3.Int(f"{tag}.x.s"), z3.Int(f"{tag}.x.o"), p, shared)


def entry_view(entry: Entry, active: bool, caching: bool) -> ActiveEntry | WaitingEntry:
    """The view's entry a step is shown for ``entry`` (see :func:`fresh_element`)."""
    rid, s, o = Sym(entry.rid), Sym(entry.s), Sym(entry.o)
    if active:
        if caching:
            return ActiveEntry(rid, s, o, Sym(entry.p), True, 0, Sym(entry.shared))
        return ActiveEntry(rid, s, o, Sym(entry.p), True, 0)
    if caching:
        return WaitingEntry(rid, s, o, True, 0, Sym(entry.p), Sym(entry.shared))
    return WaitingEntry(rid, s, o, True, 0)


# --- the recorder


@dataclass(slots=True)
class _Recorder:
    setting: Setting
    folds: list[Fold] = field(default_factory=list)
    retractions: list[Retraction] = field(default_factory=list)
    projected: ProjectedAdmission | None = None
    depth: int = 0
    #: the first refusal, kept even if the rule swallowed the exception
    refused: str | None = None

    def element(
        self,
        seq: Lazy,
        tag: str,
        entry: Entry,
        links: list[tuple[z3.ExprRef, int, int]],
        retracted: list[tuple[z3.ExprRef, int]],
    ) -> Any:
        """What the step sees for one element of ``seq`` (entry terms are ``entry``'s)."""
        kind = seq.kind[0]
        if kind == "entries":
            return entry_view(entry, seq.base == "active", self.setting.prefix_caching)
        if kind == "out":
            j, c = seq.kind[1], seq.kind[2]
            src = self.folds[j].outs[c]
            assert src is not None  # a fold without outputs returns no output sequence
            var = _fresh(src, f"{tag}.x.out{j}_{c}")
            links.append((var, j, c))
            return Sym(var)
        if kind == "retracted":
            var = z3.Bool(f"{tag}.x.retracted{seq.kind[1]}_{len(retracted)}")
            retracted.append((var, seq.kind[1]))
            return Sym(var)
        if kind == "zip":
            return tuple(self.element(p, tag, entry, links, retracted) for p in seq.kind[1])
        if kind == "projected":
            return Sym(z3.Bool(f"{tag}.x.admitted{len(links)}"))  # no link: any truth value
        seq._refuse("folds a selection of" if kind == "select" else "folds a concatenation of")

    def scan(self, seq: Lazy, step: Callable[[Any, Any], tuple[Any, Any]], init: Any, width: int | None) -> Any:
        if self.depth:
            raise NotAFold(f"{_where()}: a scan inside another scan's step (nested folds are outside the class)")
        why = impurity(step)
        if why:
            raise NotAFold(f"the step {_qualname(step)} may not be a pure function: {why}")
        n = len(self.folds)
        tag = f"fold{n}"
        base = seq.base
        entry = fresh_element(tag, base == "active", self.setting.prefix_caching)
        links: list[tuple[z3.ExprRef, int, int]] = []
        retracted: list[tuple[z3.ExprRef, int]] = []
        elem = self.element(seq, tag, entry, links, retracted)
        init_leaves = [_term(x, f"{tag}: the initial accumulator") for x in _leaves(init)]
        shape = _shape(init)
        # a leaf that starts as an integer and becomes a real (Python's 0 + x·ratio) is a real
        # from the start: the step runs again with it widened
        for _ in range(len(init_leaves) + 1):
            acc = [_fresh(x, f"{tag}.acc{i}") for i, x in enumerate(init_leaves)]
            self.depth += 1
            try:
                res = step(elem, _rebuild(shape, iter([Sym(a) for a in acc])))
            finally:
                self.depth -= 1
            if not (isinstance(res, tuple) and len(res) == 2):
                raise NotAFold(f"the step {_qualname(step)} returned {res!r}, not (output, accumulator)")
            out, nxt = res
            if _shape(nxt) != shape:
                raise NotAFold(f"the step {_qualname(step)} changes the accumulator's shape")
            widen = [
                i for i, (x, a) in enumerate(zip(_leaves(nxt), acc))
                if isinstance(z := unwrap(x), z3.ArithRef) and z.is_real() and isinstance(a, z3.ArithRef) and a.is_int()
            ]
            if not widen:
                break
            init_leaves = [z3.ToReal(x) if i in widen else x for i, x in enumerate(init_leaves)]  # type: ignore[arg-type]
        nxt_leaves = [
            _coerce(_term(x, f"{tag}: the next accumulator"), a, f"the step {_qualname(step)}")
            for x, a in zip(_leaves(nxt), acc)
        ]
        init_leaves = [_coerce(x, a, f"{tag}: the initial accumulator") for x, a in zip(init_leaves, acc)]
        if width is None:
            outs: tuple[z3.ExprRef | None, ...] = (None if out is None else _term(out, f"{tag}: the output"),)
        else:
            if not (isinstance(out, tuple) and len(out) == width):
                raise NotAFold(f"the step {_qualname(step)} emits {out!r}, not {width} values")
            outs = tuple(_term(x, f"{tag}: the output") for x in out)
        final = [_fresh(x, f"{tag}.final{i}") for i, x in enumerate(acc)]
        self.folds.append(
            Fold(
                n, base, _qualname(step), entry, tuple(links), tuple(acc), tuple(init_leaves), tuple(nxt_leaves),
                tuple(final), outs, leaf_names(step, shape), tuple(retracted), captured(step),
            )
        )
        seqs = [Lazy(self, base, ("out", n, c)) for c in range(len(outs))]
        final_tree = _rebuild(shape, iter([Sym(f) for f in final]))
        return (seqs[0] if width is None else tuple(seqs)), final_tree

    def retraction(self, view: View, cost: Any, key: Any, cap: Any, allowed: Any) -> Lazy:
        if self.depth:
            raise NotAFold(f"{_where()}: a retraction inside a scan's step")
        for what, fn in (("cost", cost), ("key", key)):
            why = impurity(fn)
            if why:
                raise NotAFold(f"the retraction's {what} {_qualname(fn)} may not be a pure function: {why}")
        r = len(self.retractions)
        tag = f"retract{r}"
        entry = fresh_element(tag, True, self.setting.prefix_caching)
        elem = entry_view(entry, True, self.setting.prefix_caching)
        self.depth += 1  # cost and key read one entry: no fold inside them
        try:
            c = _term(cost(elem), f"{tag}: the cost")
            keys = tuple(_term(k, f"{tag}: the key") for k in key(elem))
        finally:
            self.depth -= 1
        if not isinstance(c, z3.ArithRef):
            raise NotAFold(f"{tag}: the cost is {c.sort()}, not a number")
        cap_t = _term(cap, f"{tag}: the cap")
        allowed_t = _term(allowed, f"{tag}: allowed")
        if not isinstance(cap_t, z3.ArithRef) or allowed_t.sort() != z3.BoolSort():
            raise NotAFold(f"{tag}: the cap must be a number and allowed a truth value")
        self.retractions.append(
            Retraction(r, _where(), entry, c, keys, cap_t, allowed_t, z3.Bool(f"{tag}.x.out"))  # type: ignore[arg-type]
        )
        return Lazy(self, "active", ("retracted", r))

    def projected_admission(self, view: View, project: Any) -> Lazy:
        if self.depth:
            raise NotAFold(f"{_where()}: a projected admission inside a scan's step")
        if self.projected is not None:
            raise NotAFold(f"{_where()}: a second projected admission")
        why = impurity(project)
        if why:
            raise NotAFold(f"the projection {_qualname(project)} may not be a pure function: {why}")
        self.projected = ProjectedAdmission(project, view, _where())
        return Lazy(self, "waiting", ("projected",))


def run_abstract(scheduler: Scheduler, setting: Setting) -> Program:
    """Run ``scheduler.decide`` once on a view of unknown length (see the module
    docstring).  Raises :class:`NotAFold` when the rule is not made of folds;
    a rule that branches on a symbolic value raises the bounded encoding's
    :class:`~kvstab.errors.InvalidScheduler`."""
    rec = _Recorder(setting)
    svars = state_vars_of(scheduler)
    state = state_terms("lazy", svars)
    n_waiting = z3.Int("lazy.n_waiting")
    view = View(
        active=Lazy(rec, "active", ("entries",)),  # type: ignore[arg-type]
        waiting=Lazy(rec, "waiting", ("entries",)),  # type: ignore[arg-type]
        M=Sym(setting.M_term) if setting.M is None else setting.M,
        chunk=setting.chunk,
        block=setting.block,
        token_budget=setting.token_budget,
        max_num_seqs=setting.max_num_seqs,
        n_waiting=Sym(n_waiting),
        state=tuple(Sym(x) for x in state),
    )
    try:
        d = call_decide(scheduler, view, OPS)
    except NotAFold:
        raise
    except KvstabError:
        if rec.refused:
            raise NotAFold(rec.refused) from None
        raise
    except Exception as exc:
        if rec.refused:
            raise NotAFold(rec.refused) from None
        raise NotAFold(
            f"the rule failed on a view of unknown length ({type(exc).__name__}: {exc}); "
            "a rule made of folds reads the view's sequences only through kvstab.contract's combinators"
        ) from None
    if rec.refused:
        raise NotAFold(rec.refused)
    if not isinstance(d, Decision):
        raise NotAFold(f"the rule returned {type(d).__name__}, not a Decision")
    return Program(tuple(rec.folds), rec.projected, d, view, state, n_waiting, tuple(rec.retractions))
