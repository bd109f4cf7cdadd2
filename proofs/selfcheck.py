"""The encoding checks itself: one encoded slot against ``Engine.step`` on concrete states.

A ``Proved`` verdict rests on :func:`~kvstab.proofs.encoding.encode_step`
meaning what the engine does.  :class:`CompiledStep` encodes one slot of a
rule once (``K`` active and ``Q`` queued slots, symbolic everything), reads
each post-state variable's defining term off the frame equations, and compiles
those very z3 terms into one Python function — so evaluating the encoding on
a concrete state costs microseconds instead of a solver call.
:func:`engine_step` runs the reference engine on the same state, and
:func:`compare` lists every state variable on which the two disagree.

The compiler follows z3's semantics for the operators the encoding uses
(integer division and modulus are Euclidean, which is floor division for the
positive divisors ``ŝ`` and ``B``); :meth:`CompiledStep.check_against_z3`
cross-checks it against z3's own ``simplify`` on substituted values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import z3

from kvstab.arrivals import ArrivalPlan
from kvstab.contract import Decision, Scheduler, View, initial_state, state_vars_of
from kvstab.proofs.encoding import Setting, encode_step, fresh_state
from kvstab.proofs.replaying import same_state
from kvstab.simulator import Engine

__all__ = ["Concrete", "Outcome", "CompiledStep", "engine_step", "compare", "SharedRun", "check_shared_run"]

#: a concrete state: M, active ``(s, o, progress)`` in admission order, queued ``(s, o)`` in queue order,
#: and (optionally, for a stateful rule) the scheduler's own state (default: its declared initial state)
Concrete = (
    tuple[int, tuple[tuple[int, int, int], ...], tuple[tuple[int, int], ...]]
    | tuple[int, tuple[tuple[int, int, int], ...], tuple[tuple[int, int], ...], tuple[int | float, ...]]
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """Every state variable after one slot (ids: actives ``0..`` then the queue)."""

    active: tuple[tuple[int, int, int, int], ...]  # (rid, s, o, progress) in admission order
    waiting: tuple[tuple[int, int, int], ...]  # (rid, s, o) in queue order
    charged: int
    tokens: int
    running: int
    #: the scheduler's own state after the slot (``()`` for a stateless rule)
    sched: tuple[int | float, ...] = ()


_BINARY: dict[int, str] = {
    z3.Z3_OP_LE: "<=",
    z3.Z3_OP_LT: "<",
    z3.Z3_OP_GE: ">=",
    z3.Z3_OP_GT: ">",
    z3.Z3_OP_EQ: "==",
    z3.Z3_OP_IDIV: "//",
    z3.Z3_OP_MOD: "%",
}


def _compile(outputs: Sequence[z3.ExprRef], names: dict[str, str]) -> Callable[[dict[str, Any]], list[Any]]:
    """One Python function evaluating ``outputs`` from a dict of variable values."""
    code: list[str] = []
    done: dict[int, str] = {}

    def visit(t: z3.ExprRef) -> str:
        key = t.get_id()
        if key in done:
            return done[key]
        if z3.is_int_value(t):
            done[key] = str(t.as_long())
            return done[key]
        if z3.is_rational_value(t):
            # exact: the encoding's reals are rationals (a rule's float constants, exactly)
            done[key] = f"_Fraction({t.numerator_as_long()}, {t.denominator_as_long()})"
            return done[key]
        if z3.is_true(t) or z3.is_false(t):
            done[key] = "True" if z3.is_true(t) else "False"
            return done[key]
        if z3.is_const(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            done[key] = f"env[{names.setdefault(str(t), str(t))!r}]"
            return done[key]
        kind = t.decl().kind()
        args = [visit(c) for c in t.children()]
        if kind == z3.Z3_OP_ADD:
            expr = " + ".join(args)
        elif kind == z3.Z3_OP_SUB:
            expr = " - ".join(args)
        elif kind == z3.Z3_OP_MUL:
            expr = " * ".join(args)
        elif kind == z3.Z3_OP_UMINUS:
            expr = f"-{args[0]}"
        elif kind == z3.Z3_OP_ITE:
            expr = f"({args[1]} if {args[0]} else {args[2]})"
        elif kind == z3.Z3_OP_AND:
            expr = "(" + " and ".join(args) + ")" if args else "True"
        elif kind == z3.Z3_OP_OR:
            expr = "(" + " or ".join(args) + ")" if args else "False"
        elif kind == z3.Z3_OP_NOT:
            expr = f"(not {args[0]})"
        elif kind == z3.Z3_OP_IMPLIES:
            expr = f"((not {args[0]}) or {args[1]})"
        elif kind == z3.Z3_OP_DISTINCT:
            expr = f"(len({{{', '.join(args)}}}) == {len(args)})"
        elif kind == z3.Z3_OP_TO_REAL:
            expr = f"_Fraction({args[0]})"
        elif kind == z3.Z3_OP_TO_INT:
            expr = f"_floor({args[0]})"
        elif kind == z3.Z3_OP_DIV:  # real division
            expr = f"(_Fraction({args[0]}) / {args[1]})"
        elif kind == z3.Z3_OP_IDIV or kind == z3.Z3_OP_MOD:
            # Euclidean, as z3: floor for the positive divisors the encoding uses
            expr = f"_euclid({args[0]}, {args[1]}, {kind == z3.Z3_OP_MOD})"
        elif kind in _BINARY:
            expr = f"({args[0]} {_BINARY[kind]} {args[1]})"
        else:
            raise ValueError(f"the self-check cannot evaluate {t.decl()} (in {t})")
        var = f"v{len(code)}"
        code.append(f"    {var} = {expr}")
        done[key] = var
        return var

    results = [visit(t) for t in outputs]
    src = "def _f(env):\n" + "\n".join(code) + f"\n    return [{', '.join(results)}]\n"
    scope: dict[str, Any] = {"_euclid": _euclid, "_Fraction": Fraction, "_floor": math.floor}
    exec(compile(src, "<kvstab encoding>", "exec"), scope)
    fn: Callable[[dict[str, Any]], list[Any]] = scope["_f"]
    return fn


def _euclid(a: int, b: int, mod: bool) -> int:
    q, r = divmod(a, b)
    if r < 0:  # Euclidean: 0 ≤ r < |b| (only reachable with a negative divisor)
        q, r = q + 1, r - b
    return r if mod else q


def _definitions(frame: Sequence[tuple[str, z3.BoolRef]]) -> dict[str, z3.ExprRef]:
    """``post variable name → defining term``, read off the frame equations."""
    out: dict[str, z3.ExprRef] = {}
    stack: list[z3.ExprRef] = [c for _, c in frame]
    while stack:
        c = stack.pop()
        if z3.is_and(c):
            stack.extend(c.children())
            continue
        if not z3.is_eq(c):
            raise ValueError(f"a frame condition is not an equation: {c}")
        lhs, rhs = c.arg(0), c.arg(1)
        out[str(lhs)] = rhs
    return out


class CompiledStep:
    """One encoded slot of ``scheduler``, compiled to evaluate on concrete states."""

    def __init__(self, scheduler: Scheduler, setting: Setting, K: int, Q: int) -> None:
        self.scheduler, self.setting, self.K, self.Q = scheduler, setting, K, Q
        self.svars = state_vars_of(scheduler)
        self.pre = fresh_state("pre", K, Q, self.svars, caching=setting.prefix_caching)
        self.step = encode_step(scheduler, self.pre, setting, "post")
        defs = _definitions(self.step.frame)
        post = self.step.post
        self._outputs: list[z3.ExprRef] = []
        for e in post.active:
            self._outputs += [defs[str(e.present)], defs[str(e.rid)], defs[str(e.s)], defs[str(e.o)], defs[str(e.p)]]
        for e in post.waiting:
            self._outputs += [defs[str(e.present)], defs[str(e.rid)], defs[str(e.s)], defs[str(e.o)]]
        self._outputs += [self.step.charged, self.step.tokens, self.step.n_running]
        self._outputs += [defs[str(x)] for x in post.sched]
        self._fn = _compile(self._outputs, {})
        self._state_names = [str(x) for x in self.pre.sched]
        # z3's str() is slow: name the pre-state variables once
        self._active_names = [tuple(str(v) for v in (e.present, e.rid, e.s, e.o, e.p)) for e in self.pre.active]
        self._waiting_names = [tuple(str(v) for v in (e.present, e.rid, e.s, e.o)) for e in self.pre.waiting]
        # prefix caching: each entry's shared, and a queued entry's cached prefix (its p)
        self._active_shared = [str(e.shared) for e in self.pre.active]
        self._waiting_extra = [(str(e.shared), str(e.p)) for e in self.pre.waiting]

    def env_of_view(self, view: View) -> dict[str, Any]:
        """The pre-state variables' values for a concrete view the engine showed (prefix
        caching: entries net of shared, queued ones with their cached prefix)."""
        if len(view.active) > self.K or len(view.waiting) > self.Q:
            raise ValueError(f"view has {len(view.active)} active, {len(view.waiting)} queued; bounds K={self.K}, Q={self.Q}")
        env: dict[str, Any] = {"M": int(view.M)}
        for name, var, value in zip(self._state_names, self.svars, view.state or initial_state(self.svars)):
            env[name] = Fraction(value) if var.real else value
        for i, ((np_, nr, ns, no, npg), nsh) in enumerate(zip(self._active_names, self._active_shared)):
            a = view.active[i] if i < len(view.active) else None
            env[np_] = a is not None
            env[nr], env[ns], env[no], env[npg] = (int(a.rid), int(a.s), int(a.o), int(a.progress)) if a else (-1, 0, 0, 0)
            env[nsh] = int(a.shared) if a else 0
        for j, ((np_, nr, ns, no), (nsh, nc)) in enumerate(zip(self._waiting_names, self._waiting_extra)):
            w = view.waiting[j] if j < len(view.waiting) else None
            env[np_] = w is not None
            env[nr], env[ns], env[no] = (int(w.rid), int(w.s), int(w.o)) if w else (-1, 0, 0)
            env[nsh], env[nc] = (int(w.shared), int(w.cached)) if w else (0, 0)
        return env

    def on_view(self, view: View) -> Outcome:
        """The encoding's post state for a concrete view (entries as the view shows them)."""
        return self._decode(self._fn(self.env_of_view(view)))

    def sched_of(self, state: Concrete) -> tuple[int | float, ...]:
        """The scheduler state of ``state`` (its 4th item, or the rule's initial state)."""
        return tuple(state[3]) if len(state) > 3 else initial_state(self.svars)  # type: ignore[misc]

    def env(self, state: Concrete) -> dict[str, Any]:
        """The pre-state variables' values for ``state`` (ids as the engine gives them)."""
        M, active, waiting = state[0], state[1], state[2]
        if len(active) > self.K or len(waiting) > self.Q:
            raise ValueError(f"state has {len(active)} active, {len(waiting)} queued; bounds K={self.K}, Q={self.Q}")
        env: dict[str, Any] = {"M": M}
        for name, var, value in zip(self._state_names, self.svars, self.sched_of(state)):
            env[name] = Fraction(value) if var.real else value  # a float's exact value
        for i, (np_, nr, ns, no, npg) in enumerate(self._active_names):
            here = i < len(active)
            s, o, p = active[i] if here else (0, 0, 0)
            env[np_], env[nr], env[ns], env[no], env[npg] = here, (i if here else -1), s, o, p
        for j, (np_, nr, ns, no) in enumerate(self._waiting_names):
            here = j < len(waiting)
            s, o = waiting[j] if here else (0, 0)
            env[np_], env[nr], env[ns], env[no] = here, (len(active) + j if here else -1), s, o
        return env

    def _decode(self, vals: list[Any]) -> Outcome:
        it = iter(vals)
        act, wait = [], []
        for _ in self.step.post.active:
            present, rid, s, o, p = (next(it) for _ in range(5))
            if present:
                act.append((int(rid), int(s), int(o), int(p)))
        for _ in self.step.post.waiting:
            present, rid, s, o = (next(it) for _ in range(4))
            if present:
                wait.append((int(rid), int(s), int(o)))
        charged, tokens, running = (int(next(it)) for _ in range(3))
        sched = tuple(float(x) if var.real else int(x) for var, x in zip(self.svars, it))
        return Outcome(tuple(act), tuple(wait), charged, tokens, running, sched)

    def __call__(self, state: Concrete) -> Outcome:
        """The encoding's post state for ``state``."""
        return self._decode(self._fn(self.env(state)))

    def by_z3(self, state: Concrete) -> Outcome:
        """The same, by z3 itself: substitute the values and ``simplify``."""
        env = self.env(state)
        subst: list[tuple[z3.ExprRef, z3.ExprRef]] = []
        for e in self.pre.active + self.pre.waiting:
            for var in (e.present, e.rid, e.s, e.o, e.p):
                if z3.is_const(var) and var.decl().kind() == z3.Z3_OP_UNINTERPRETED:
                    val = env[str(var)]
                    subst.append((var, z3.BoolVal(val) if isinstance(val, bool) else z3.IntVal(val)))
        subst.append((z3.Int("M"), z3.IntVal(env["M"])))
        for x in self.pre.sched:
            val = env[str(x)]
            subst.append((x, z3.RealVal(val) if x.is_real() else z3.IntVal(val)))
        vals: list[Any] = []
        for t in self._outputs:
            v = z3.simplify(z3.substitute(t, *subst))
            if z3.is_bool(v):
                vals.append(z3.is_true(v))
            elif z3.is_rational_value(v) and not z3.is_int_value(v):
                vals.append(v.as_fraction())  # type: ignore[attr-defined]
            else:
                vals.append(v.as_long())  # type: ignore[attr-defined]
        return self._decode(vals)


def engine_step(scheduler: Scheduler, setting: Setting, state: Concrete) -> Outcome:
    """The reference engine's post state for ``state`` (one slot, no checks)."""
    M, active, waiting = state[0], state[1], state[2]
    eng = Engine(scheduler, setting.params(M), check=False)
    eng.load_state(list(active), list(waiting), sched_state=tuple(state[3]) if len(state) > 3 else None)  # type: ignore[misc]
    rec = eng.step()
    return Outcome(
        active=tuple((r.rid, r.s, r.o, r.progress) for r in eng.active),
        waiting=tuple((r.rid, r.s, r.o) for r in eng.waiting),
        charged=rec.memory,
        tokens=rec.tokens,
        running=rec.running,
        sched=tuple(eng.sched_state),
    )


def compare(encoded: Outcome, engine: Outcome) -> list[str]:
    """The state variables on which the two outcomes differ (empty: they agree)."""
    out = []
    for name in ("active", "waiting", "charged", "tokens", "running"):
        a, b = getattr(encoded, name), getattr(engine, name)
        if a != b:
            out.append(f"{name}: encoding {a}, engine {b}")
    # the scheduler's state after the slot: a real one up to float rounding (exact in z3)
    if not same_state(encoded.sched, engine.sched):
        out.append(f"scheduler state: encoding {list(encoded.sched)}, engine {list(engine.sched)}")
    return out


# --- states with shared blocks (prefix caching)


class _Recording(Engine):
    """The reference engine, keeping the settled view and decision of each slot."""

    seen: list[tuple[View, Decision]]

    def decide(self) -> tuple[View, Decision]:
        view, decision = super().decide()
        self.seen.append((view, decision))
        return view, decision


@dataclass(frozen=True, slots=True)
class SharedRun:
    """What the self-check with shared blocks compared: slots checked, slots whose view
    showed a shared block or a cached prefix, and the disagreements (empty: they agree)."""

    slots: int
    sharing: int
    problems: tuple[str, ...]


def view_premises(view: View, block: int) -> list[str]:
    """The encoding's premises on a view with shared blocks that ``view`` breaks: every
    ``shared`` whole blocks and ``≥ 0``, a queued entry's cached prefix whole blocks in
    ``[0, s − 1]`` (net of its shared part, as the view shows both)."""
    out = []
    for a in view.active:
        if int(a.shared) < 0 or int(a.shared) % block:
            out.append(f"request {a.rid}: shared {a.shared} is not whole blocks ≥ 0")
        if not 0 < int(a.progress) < int(a.s) + int(a.o):
            out.append(f"request {a.rid}: progress {a.progress} outside (0, s + o) of the view's s = {a.s}, o = {a.o}")
    for w in view.waiting:
        if int(w.shared) < 0 or int(w.shared) % block:
            out.append(f"queued request {w.rid}: shared {w.shared} is not whole blocks ≥ 0")
        if not (0 <= int(w.cached) <= int(w.s) - 1) or int(w.cached) % block:
            hit, s = int(w.cached) + int(w.shared), int(w.s) + int(w.shared)
            out.append(f"queued request {w.rid}: a cache hit of {hit} tokens, not whole blocks in [0, s − 1 = {s - 1}] "
                       "(vLLM recomputes a prompt's last token)")
    return out


def check_shared_run(
    compiled: CompiledStep, plan: ArrivalPlan, *, slots: int = 60, engine: Callable[[Engine], None] | None = None
) -> SharedRun:
    """Run ``plan`` on the reference engine with prefix caching (``compiled.setting`` with
    a fixed ``M``) and compare every slot with the encoding evaluated on the view the engine
    settled on: the memory charged (the pool's distinct blocks), the tokens, the requests
    run, and each running request's progress (the view's, plus its shared part).  The views
    must satisfy the encoding's premises (:func:`view_premises`).  ``engine`` may change the
    fresh engine first (a test installs a mutant block pool there).  A slot with more
    requests than ``K``/``Q`` in view is run but not compared."""
    se = compiled.setting
    assert se.prefix_caching and se.M is not None, "the shared self-check runs a cached engine of a fixed M"
    eng = _Recording(compiled.scheduler, se.params(se.M), check=True, window=compiled.Q)
    eng.seen = []
    if engine is not None:
        engine(eng)
    problems: list[str] = []
    counts = [0, 0]  # slots compared, slots with sharing in view

    def compare_slot(t: int) -> list[str]:
        shown, _ = eng.seen[-1]
        # a rule that is not clairvoyant was shown no o: the encoding is evaluated on the true one
        view = dataclasses.replace(
            shown,
            active=tuple(dataclasses.replace(a, o=eng.requests[int(a.rid)].o) for a in shown.active),
            waiting=tuple(dataclasses.replace(w, o=eng.requests[int(w.rid)].o) for w in shown.waiting),
        )
        rec = eng.records[-1]
        if len(view.active) > compiled.K or len(view.waiting) > compiled.Q:
            return []
        bad = view_premises(view, se.block)
        if bad:
            return [f"slot {t}: {b}" for b in bad]
        counts[0] += 1
        if any(int(a.shared) for a in view.active) or any(int(w.cached) or int(w.shared) for w in view.waiting):
            counts[1] += 1
        enc = compiled.on_view(view)
        shift = {int(a.rid): int(a.shared) for a in view.active} | {int(w.rid): int(w.shared) for w in view.waiting}
        mine = sorted((rid, p + shift[rid]) for rid, _, _, p in enc.active)
        theirs = sorted((r.rid, r.progress) for r in eng.active)
        out: list[str] = []
        if (enc.charged, enc.tokens, enc.running) != (rec.memory, rec.tokens, rec.running):
            out.append(f"slot {t}: charged/tokens/running: encoding {(enc.charged, enc.tokens, enc.running)}, "
                       f"engine {(rec.memory, rec.tokens, rec.running)}")
        if mine != theirs:
            out.append(f"slot {t}: progress after the slot: encoding {mine}, engine {theirs}")
        return out

    try:
        problems += eng.drain_checked(plan, compare_slot, slots)
    except Exception as exc:  # an overflow, or a pool that breaks its own checks
        problems.append(f"slot {eng.slot}: the engine raised {type(exc).__name__}: {exc}")
    checked, sharing = counts
    return SharedRun(checked, sharing, tuple(problems))

