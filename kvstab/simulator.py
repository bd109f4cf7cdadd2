"""The reference simulator: a readable discrete-time slot loop.

It is the executable definition of the model in ``docs/MODEL.md``:
everything else (the z3 encoding, the property suite, the vLLM cross-check) is
checked against it.  It favours clarity over speed.

One slot ``t``:

1. the requests that arrive in slot ``t`` join the tail of the queue;
2. the scheduler sees a :class:`~kvstab.contract.View` and returns a decision;
3. preempted requests lose their memory and progress (the area they had been
   served is *wasted*) and return to the head of the queue, oldest admission
   first; admitted requests join the active set;
4. every active request advances by its grant (one unit by default) and is
   charged the memory it holds after that work (:func:`kvstab.model.tokens_held`);
   the engine checks ``Σ memory ≤ M`` (and the token budget and
   ``max_num_seqs`` when set) and raises :class:`InvariantViolation` otherwise;
5. requests that produced their last token release their memory.
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter
from types import FrameType

import numpy as np
import numpy.typing as npt

from kvstab.arrivals import ArrivalPlan
from kvstab.contract import (
    ActiveEntry,
    Decision,
    Scheduler,
    View,
    WaitingEntry,
    check_decision_shape,
    check_decision_values,
    check_next_state,
    hidden_output,
    initial_state,
    state_vars_of,
    traits_of,
    visible_view,
)
from kvstab.errors import InvalidArgument, InvalidScheduler, InvariantViolation, KvstabError
from kvstab.model import DEFAULT_WINDOW, ModelParams, progress_after, tokens_held
from kvstab.ops import CONCRETE
from kvstab.prefix import Prompt, content_id
from kvstab.prefix_cache import Entering, Hit, Kept, PrefixCache, own_content
from kvstab.validation import MAX_SLOTS, positive_float, positive_int

__all__ = [
    "Engine", "Horizon", "RequestState", "SimResult", "SlotRecord", "simulate", "DEFAULT_WINDOW", "DecideInterrupted",
]


IntArray = npt.NDArray[np.int64]


@dataclass(slots=True)
class RequestState:
    """A request's mutable state inside an engine (engines and their subclasses only;
    schedulers see the frozen :class:`~kvstab.contract.View`)."""

    rid: int
    s: int
    o: int
    arrival: int
    progress: int = 0
    attempt_area: int = 0  # area served in the current attempt (wasted if preempted)
    served: int = 0  # all area ever served, wasted attempts included
    wasted: int = 0
    preemptions: int = 0
    first_admit: int = -1
    finish: int = -1
    prior: int = 0  # outputs kept from earlier attempts (lifecycles that resume; shown as entry.prior)
    cached: int = 0  # prompt tokens found in the prefix cache at its latest admission (computed by nobody)


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """What happened in one slot."""

    slot: int
    arrived: int
    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    completed: tuple[int, ...]
    running: int  # active requests that did work this slot
    memory: int  # Σ tokens held after this slot's work (the area served)
    wasted: int  # area thrown away by this slot's preemptions
    tokens: int  # tokens processed this slot
    queue: int  # waiting at the end of the slot
    active_after: int  # active at the end of the slot (after releases)
    hidden: int = 0  # waiting requests the queue window hid from the rule's final decision
    state: tuple[int | float, ...] = ()  # the scheduler's own state after this slot (stateful rules only)


@dataclass(frozen=True, slots=True, eq=False)
class SimResult:
    """Per-slot series and per-request outcomes of one run."""

    scheduler: str
    params: ModelParams
    slots: int
    # per slot
    arrived: IntArray
    admitted: IntArray
    preempted: IntArray
    completed: IntArray
    running: IntArray
    memory: IntArray
    wasted: IntArray
    tokens: IntArray
    queue: IntArray
    # per request (arrival order)
    s: IntArray
    o: IntArray
    arrival: IntArray
    first_admit: IntArray
    finish: IntArray
    preemptions: IntArray
    served: IntArray
    request_wasted: IntArray
    dropped: int = 0
    #: the initial queue-head window the rule was shown
    window: int = DEFAULT_WINDOW
    #: slots in which the window hid waiting requests from the rule's final decision
    #: (the rule then left requests waiting; a failure should mention it)
    window_hid_slots: int = 0

    @property
    def in_system(self) -> IntArray:
        """Requests in the system (waiting + active) at the end of each slot."""
        return np.cumsum(self.arrived) - np.cumsum(self.completed)


@dataclass(frozen=True, slots=True)
class Horizon:
    """Where a run stops: at slot ``slots``, or with ``drain`` once every request has finished (and
    not before slot ``slots`` if given); ``max_slots`` slots at the most either way."""

    slots: int | None
    drain: bool
    max_slots: int

    @property
    def fixed(self) -> bool:
        """A fixed horizon: ``slots`` slots and no drain."""
        return self.slots is not None and not self.drain

    @property
    def end(self) -> int:
        """The slot a run steps towards: ``slots`` on a fixed horizon, else ``max_slots``."""
        return int(self.slots) if self.slots is not None and not self.drain else self.max_slots

    @property
    def drain_min(self) -> int:
        """The slot a drain does not stop before (0 without ``slots``)."""
        return 0 if self.slots is None else int(self.slots)


class DecideInterrupted(KeyboardInterrupt):
    """Ctrl-C arrived while a scheduler's ``decide`` was running: the message
    names the scheduler and the slot (a rule that never returns is the usual cause)."""


class DecideTimeout(BaseException):
    """Raised by the alarm handler inside a ``decide`` that ran past its limit.  A
    ``BaseException``, as ``KeyboardInterrupt`` is: a rule's own ``except Exception``
    (or a caller's that turns a rule's error into a fallback) must not swallow it."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`DecideTimeout` in the main thread after ``seconds`` of wall time.

    ``signal.setitimer`` is the only way to interrupt pure-Python code that
    never returns without a second process; it works in the main thread only,
    which is where the command line runs.
    """
    if seconds is None:
        yield
        return

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise DecideTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _ids(reqs: list[RequestState], most: int = 12) -> str:
    ids = [r.rid for r in reqs]
    shown = ", ".join(str(i) for i in ids[:most])
    return f"[{shown}{', …' if len(ids) > most else ''}] ({len(ids)} in all)"


class Engine:
    """A steppable reference engine (the simulator and the stateful tests drive it).

    ``window`` is the initial number of queue-head entries shown to the rule;
    if the rule admits every one of them and more are waiting, the engine
    doubles the window and asks again, so a head-of-line rule sees as much of
    the queue as it could possibly admit.  :attr:`window_hid_slots` counts the
    slots in which the window still hid waiting requests from the rule's
    final decision (a rule that is not head-of-line may behave differently
    with a wider window; a failure should say so).

    ``spec`` is how the scheduler is named in every message (its registered
    name or the ``module:attr`` it was loaded from; default its ``name``).
    A rule is shown only what its traits allow (:func:`~kvstab.contract.visible_view`).
    An error inside ``decide``, a decision of the wrong shape or type, a
    negative or non-integer grant, or (with ``decide_timeout``) a decision that
    takes longer than that many seconds raises :class:`InvalidScheduler`
    naming the scheduler and the slot; Ctrl-C during ``decide`` raises
    :class:`DecideInterrupted` naming them too.
    """

    #: the least output length a request may have; an engine with another
    #: request lifecycle may lower it (vLLM samples the first output token in
    #: the last prefill step, so ``max_tokens = 1`` is no decode unit at all)
    min_output: int = 1

    def __init__(
        self,
        scheduler: Scheduler,
        params: ModelParams,
        *,
        check: bool = True,
        window: int = DEFAULT_WINDOW,
        spec: str | None = None,
        decide_timeout: float | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.params = params
        self.check = check
        self.window = positive_int("the queue window", window, maximum=2**31 - 1)
        self.spec = spec or scheduler.name
        self.traits = traits_of(scheduler)
        self.state_vars = state_vars_of(scheduler)
        #: the scheduler's own state (``view.state``), carried from slot to slot
        self.sched_state: tuple[int | float, ...] = initial_state(self.state_vars)
        if decide_timeout is not None:
            decide_timeout = positive_float("the decide timeout", decide_timeout, maximum=86_400.0)
            if threading.current_thread() is not threading.main_thread():
                raise InvalidArgument("a decide timeout needs the main thread (it uses signal.setitimer)")
        self.decide_timeout = decide_timeout
        self.slot = 0
        self.requests: list[RequestState] = []
        self.active: list[RequestState] = []  # admission order
        self.waiting: deque[RequestState] = deque()
        self.records: list[SlotRecord] = []
        self.window_hid_slots = 0
        self._pending_arrivals = 0
        #: the KV block pool with prefix caching (``params.prefix_caching``), else ``None``:
        #: each request then holds tokens_held(progress) of its own
        self.cache: PrefixCache | None = PrefixCache(params) if params.prefix_caching else None
        self._trial: PrefixCache | None = None  # the pool after the decision being carried out
        self._met: dict[int, Hit] = {}  # the hits the queue head met in that trial
        self._short = 0  # blocks that decision lacked (a broken memory invariant when > 0)

    # --- inputs
    def output_tokens(self, o: int) -> int:
        """How many output tokens a request of output length ``o`` produces (its content's
        tail, for prefix caching): ``o`` here; a lifecycle that maps lengths says otherwise."""
        return o

    def arrive(self, s: int, o: int, prompt: Prompt | None = None, output: int | None = None) -> int:
        """A request arrives in the current slot (before its decision); returns its id.

        With prefix caching, ``prompt`` is its prompt's content (``s`` tokens) and
        ``output`` the content id of its output tokens; a request without them
        shares nothing with any other request."""
        for name, v, least in (("s", s, 1), ("o", o, self.min_output)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
                raise InvalidArgument(f"request length {name} must be an integer >= {least}, got {v!r}")
        if not self.params.fits_total(int(s) + int(o)):
            raise InvalidArgument(
                f"request (s={s}, o={o}) needs {self.params.peak(int(s) + int(o))} tokens at its peak but "
                f"M={self.params.M}: no scheduler can ever serve it"
            )
        r = RequestState(rid=len(self.requests), s=int(s), o=int(o), arrival=self.slot)
        if self.cache is not None:
            self.cache.register(r.rid, self._content(r.rid, r.s, self.output_tokens(r.o), prompt, output))
        self.requests.append(r)
        self.waiting.append(r)
        self._pending_arrivals += 1
        return r.rid

    @staticmethod
    def _content(rid: int, s: int, outputs: int, prompt: Prompt | None, output: int | None) -> Prompt:
        """A request's whole KV content: its prompt, then its ``outputs`` output tokens."""
        if prompt is None:
            return own_content(rid, s, outputs)
        if prompt.s != s:
            raise InvalidArgument(f"request {rid}: its prompt content has {prompt.s} tokens, but s={s}")
        # outputs of their own unless the plan names them (a conversation's next turn holds this answer)
        return prompt.extended(content_id("output", rid) if output is None else int(output), outputs)

    def load_state(
        self,
        active: list[tuple[int, int, int]] = (),  # type: ignore[assignment]
        waiting: list[tuple[int, int]] = (),  # type: ignore[assignment]
        sched_state: tuple[int | float, ...] | None = None,
    ) -> None:
        """Start from a given state instead of the empty system (used to replay
        a counterexample to induction): ``active`` as ``(s, o, progress)`` in
        admission order, ``waiting`` as ``(s, o)`` in queue order, and the
        scheduler's own state (``None``: its initial state).  Only on a
        fresh engine; ids are given in that order (active first)."""
        if self.requests:
            raise InvalidArgument("load_state needs a fresh engine (no request has arrived yet)")
        if self.cache is not None:
            raise InvalidArgument("load_state starts from a state without prefix caching (turn prefix_caching off)")
        if sched_state is not None:
            probe = Decision(admit=(), preempt=(), state=tuple(sched_state))
            try:
                self.sched_state = check_next_state(probe, self.sched_state, self.state_vars, self.spec)
            except InvalidScheduler as exc:
                raise InvalidArgument(f"load_state: {exc}") from None
        for s, o, prog in active:
            rid = self.arrive(s, o)
            r = self.requests[rid]
            if not (0 < prog < s + o):
                raise InvalidArgument(
                    f"active request {rid} (s={s}, o={o}) has progress {prog}; valid: 0 < progress < s + o"
                )
            self.waiting.pop()
            r.progress = int(prog)
            r.first_admit = -1
            self.active.append(r)
        for s, o in waiting:
            self.arrive(s, o)
        # a loaded state is not an arrival of this slot
        self._pending_arrivals = len(waiting)

    def requeue(self, victims: list[RequestState]) -> None:
        """Put this slot's preempted requests (admission order) back in the queue.

        kvstab's model, like vLLM v1, puts them at the head, oldest admission
        first (vLLM's repeated prepend); an engine with another lifecycle may
        put them elsewhere (SGLang appends retracted requests to the tail)."""
        self.waiting.extendleft(reversed(victims))

    def on_preempt(self, r: RequestState) -> None:
        """Called for each victim of a preemption while it still has its
        progress, just before that progress is lost.  The reference model
        restarts the request from scratch (nothing to do); an engine with
        another lifecycle may change the request's lengths here."""

    # --- the view
    def view(self, window: int | None = None, shown: dict[int, Hit] | None = None) -> View:
        """The immutable view the scheduler sees now (queue head of ``window``
        entries); for a rule that is not clairvoyant, every ``o`` is hidden
        (:func:`~kvstab.contract.visible_view`), built so in one pass.

        With prefix caching every entry is shown with the tokens older requests
        already hold taken off (``shared``), and a waiting entry with the prefix
        it would find in the cache (``cached``; ``shown`` gives it per request,
        default: the pool as it is now)."""
        w = self.window if window is None else window
        head = [self.waiting[i] for i in range(min(w, len(self.waiting)))]
        if self.cache is not None:
            return self._cached_view(head, shown)
        if self.traits.clairvoyant:
            active = tuple(ActiveEntry(r.rid, r.s, r.o, r.progress, True, r.prior) for r in self.active)
            waiting = tuple(WaitingEntry(r.rid, r.s, r.o, True, r.prior) for r in head)
        else:
            who = self.spec
            active = tuple(
                ActiveEntry(r.rid, r.s, hidden_output(who, r.rid), r.progress, True, r.prior) for r in self.active
            )
            waiting = tuple(WaitingEntry(r.rid, r.s, hidden_output(who, r.rid), True, r.prior) for r in head)
        return self._framed(active, waiting)

    def _framed(self, active: tuple[ActiveEntry, ...], waiting: tuple[WaitingEntry, ...]) -> View:
        """The view of these entries under this engine's server, queue length and state."""
        return View.under(self.params, active, waiting, len(self.waiting), self.sched_state)

    def _cached_view(self, head: list[RequestState], shown: dict[int, Hit] | None) -> View:
        """:meth:`view` with prefix caching: entries shifted by what older requests hold."""
        assert self.cache is not None
        if shown is None:
            shown = self.cache.preview([(r.rid, r.s) for r in head])
        seen = self.traits.clairvoyant
        who = self.spec
        active = tuple(
            ActiveEntry(r.rid, r.s - sh, r.o if seen else hidden_output(who, r.rid), r.progress - sh, True, r.prior, sh)
            for r, sh in zip(self.active, self.cache.shares([r.rid for r in self.active]), strict=True)
        )
        waiting = tuple(
            WaitingEntry(
                r.rid,
                r.s - h.shared,
                r.o if seen else hidden_output(who, r.rid),
                True,
                r.prior,
                h.cached - h.shared,
                h.shared,
            )
            for r, h in ((r, shown[r.rid]) for r in head)
        )
        return self._framed(active, waiting)

    def _ask(self, view: View) -> Decision:
        """One call of the rule on ``view``, with the plug-in's faults made kvstab's errors."""
        where = f"scheduler {self.spec!r} in slot {self.slot}"
        shown = visible_view(view, self.traits, self.spec)
        try:
            with time_limit(self.decide_timeout):
                decision = self.scheduler.decide(shown, CONCRETE)
        except DecideTimeout:
            raise InvalidScheduler(
                f"{where}: decide did not return within the {self.decide_timeout:g} s limit (--decide-timeout)"
            ) from None
        except KeyboardInterrupt:
            raise DecideInterrupted(f"while {where} was deciding (decide had not returned)") from None
        except InvalidScheduler as exc:
            raise InvalidScheduler(f"{where}: {self._unnamed(exc)}") from None
        except KvstabError:
            raise
        except BaseException as exc:  # the plug-in's own fault (SystemExit too): say so, with its name and the slot
            raise InvalidScheduler(
                f"{where}: decide raised {type(exc).__name__}: {exc} (an error in the scheduler, not in kvstab)"
            ) from exc
        return self._checked(decision, view, where)

    def _checked(self, decision: object, view: View, where: str) -> Decision:
        """``decision`` if it has the contract's shape and types, else :class:`InvalidScheduler`."""
        try:
            checked = check_decision_values(check_decision_shape(decision, view, self.spec), self.spec)
            if checked.state is not None:
                check_next_state(checked, view.state, self.state_vars, self.spec)
            return checked
        except InvalidScheduler as exc:
            raise InvalidScheduler(f"{where}: {self._unnamed(exc)}") from None

    def _unnamed(self, exc: InvalidScheduler) -> str:
        """``exc``'s message without a leading ``scheduler 'X'`` (the engine names it once, with the slot)."""
        msg = str(exc)
        prefix = f"scheduler {self.spec!r}"
        return msg[len(prefix) :].lstrip(": ") if msg.startswith(prefix) else msg

    def decide(self) -> tuple[View, Decision]:
        """Ask the scheduler, widening the queue window while it admits all it sees.

        With prefix caching the decision is carried out on a copy of the pool
        (:meth:`_trial_run`); if the queue head met other hits there than it was
        shown, the rule is asked again, shown what it met, until the two agree (at
        most one round per entry for a head-of-line rule: each round settles the
        next entry in queue order)."""
        w = self.window
        while True:
            shown: dict[int, Hit] | None = None
            rounds = 0
            while True:
                # a lifecycle may refine view(window) (SGLang's shows prior outputs); only the
                # prefix cache's later rounds pass what the head met
                view = self.view(w) if shown is None else self.view(w, shown)
                decision = self._ask(view)
                if self.cache is None:
                    break
                met = self._trial_run(view, decision)
                if all(met[e.rid] == self._hit_shown(e) for e in view.waiting):
                    break
                shown = met
                rounds += 1
                if rounds > len(view.waiting) + 1:
                    raise InvalidScheduler(
                        f"scheduler {self.spec!r} in slot {self.slot}: its decision does not settle with prefix "
                        f"caching (the queue head's cache hits changed with each of {rounds} decisions)"
                    )
            if len(view.waiting) < len(self.waiting) and len(view.waiting) > 0 and all(decision.admit):
                w *= 2
                continue
            return view, decision

    @staticmethod
    def _hit_shown(e: WaitingEntry) -> Hit:
        """The hit a waiting entry was shown, in the pool's terms (unshifted)."""
        return Hit(int(e.cached) + int(e.shared), int(e.shared))

    def _trial_run(self, view: View, decision: Decision) -> dict[int, Hit]:
        """Carry ``decision`` out on a copy of the pool (kept as the step's outcome) and
        return each queue-head entry's hit as met at its turn."""
        assert self.cache is not None
        p = self.params
        n_act = len(view.active)
        grants = decision.grants
        trial = self.cache.clone()
        kept = []
        victims = []
        for i, (r, v) in enumerate(zip(self.active, decision.preempt, strict=True)):
            if v:
                victims.append(r.rid)
                continue
            g = None if grants is None else int(grants[i])
            after = int(progress_after(r.s, r.progress, p.chunk, g, CONCRETE))
            kept.append(Kept(r.rid, r.progress, after, max(r.s, after)))
        heads = []
        for j, (e, a) in enumerate(zip(view.waiting, decision.admit, strict=True)):
            g = p.chunk if grants is None else int(grants[n_act + j])
            heads.append(Entering(int(e.rid), self.requests[int(e.rid)].s, bool(a), g))
        met, short = trial.carry_out(kept, victims, heads)
        self._trial = trial
        self._met = met
        self._short = short
        return met

    def step(self) -> SlotRecord:
        """Run one slot; raise :class:`InvariantViolation` if it breaks an invariant."""
        p = self.params
        t = self.slot
        view, decision = self.decide()
        hidden = len(self.waiting) - len(view.waiting)
        if hidden:
            self.window_hid_slots += 1
        actives = list(self.active)
        heads = [self.waiting[i] for i in range(len(view.waiting))]
        grants = decision.grants

        # preemption: free memory, lose progress, back to the head of the queue
        victims = [r for r, v in zip(actives, decision.preempt) if v]
        wasted = 0
        for r in victims:
            self.on_preempt(r)
            wasted += r.attempt_area
            r.wasted += r.attempt_area
            r.attempt_area = 0
            r.progress = 0
            r.preemptions += 1
        # admission (from the queue head window, in queue order)
        admitted = [r for r, a in zip(heads, decision.admit) if a]
        if self.cache is not None:
            for r in admitted:  # its prefill starts past the prefix it found in the cache
                r.cached = r.progress = self._met[r.rid].cached
        if admitted:
            # admissions come from the head window only: pop it, push back the rest
            for _ in heads:
                self.waiting.popleft()
            self.waiting.extendleft(reversed([r for r, a in zip(heads, decision.admit) if not a]))
        victim_ids = {r.rid for r in victims}
        kept = [r for r in actives if r.rid not in victim_ids]
        if victims:
            self.requeue(victims)
        for r in admitted:
            if r.first_admit < 0:
                r.first_admit = t
        running = kept + admitted

        # work: every running request advances by its grant
        grant_of: dict[int, int | None] = {}
        if grants is not None:
            for r, gnt in zip(actives + heads, grants):
                grant_of[r.rid] = int(gnt)
        tokens = 0
        memory = 0
        for r in running:
            before = r.progress
            r.progress = int(progress_after(r.s, r.progress, p.chunk, grant_of.get(r.rid), CONCRETE))
            tokens += r.progress - before
            held = int(tokens_held(r.progress, p.block))  # its whole block table, shared blocks included
            r.attempt_area += held
            r.served += held
            memory += held
        self.active = running
        if self.cache is not None and self._trial is not None:
            # the pool the decision was carried out on is the step's: memory is its distinct blocks
            self.cache, self._trial = self._trial, None
            memory = self.cache.used_tokens + self._short * p.block
            assert self._short or all(
                self.cache.held_blocks(r.rid) == -(-r.progress // p.block) for r in running
            ), "the block tables disagree with the progress (an engine bug)"

        broken: str | None = None
        if self.check or self._short:  # a block pool cannot hold more than M: caching always checks
            if memory > p.M:
                broken = (
                    f"slot {t}: scheduler {self.spec!r} uses {memory} tokens of KV memory, M={p.M} "
                    f"(active requests {_ids(running)})"
                )
            elif p.max_num_seqs is not None and len(running) > p.max_num_seqs:
                broken = f"slot {t}: scheduler {self.spec!r} runs {len(running)} requests, more than max_num_seqs={p.max_num_seqs}"
            elif p.token_budget is not None and tokens > p.token_budget:
                broken = (
                    f"slot {t}: scheduler {self.spec!r} processes {tokens} tokens, more than the token budget "
                    f"{p.token_budget} (a rule that ignores the budget breaks it)"
                )

        if broken is not None:
            # raised before the release, as always; the breaking slot's row travels with the
            # violation (a replay shows it) but is not kept among the records
            finishing = tuple(r.rid for r in running if r.progress >= r.s + r.o)
            row = SlotRecord(
                slot=t,
                arrived=self._pending_arrivals,
                admitted=tuple(r.rid for r in admitted),
                preempted=tuple(r.rid for r in victims),
                completed=finishing,
                running=len(running),
                memory=memory,
                wasted=wasted,
                tokens=tokens,
                queue=len(self.waiting),
                active_after=len(running) - len(finishing),
                hidden=hidden,
            )
            raise InvariantViolation(
                broken, slot=t, memory=memory, capacity=p.M, requests=tuple(r.rid for r in running), record=row
            )

        # release finished requests at the end of the slot
        done = [r for r in running if r.progress >= r.s + r.o]
        if done:
            for r in done:
                r.finish = t
                if self.cache is not None:
                    self.cache.free(r.rid)  # in the order vLLM frees them: the step's scheduled order
            self.active = [r for r in running if r.progress < r.s + r.o]

        if decision.state is not None:  # checked by _checked; the state moves with the slot
            self.sched_state = tuple(v.item() if isinstance(v, np.generic) else v for v in decision.state)
        rec = SlotRecord(
            slot=t,
            arrived=self._pending_arrivals,
            admitted=tuple(r.rid for r in admitted),
            preempted=tuple(r.rid for r in victims),
            completed=tuple(r.rid for r in done),
            running=len(running),
            memory=memory,
            wasted=wasted,
            tokens=tokens,
            queue=len(self.waiting),
            active_after=len(self.active),
            hidden=hidden,
            state=self.sched_state,
        )
        self.records.append(rec)
        self._pending_arrivals = 0
        self.slot += 1
        return rec

    def skip_to(self, slot: int) -> None:
        """Jump an idle engine ahead to ``slot``: slots in which nothing waits,
        runs or arrives change nothing, so long gaps in a trace cost nothing."""
        if not self.idle or self._pending_arrivals:
            raise InvalidArgument("skip_to needs an idle engine with no arrivals pending")
        if slot > self.slot:
            self.slot = int(slot)

    def _idle_is_still(self) -> bool:
        """Whether an idle slot would change nothing: always for a stateless
        rule; for a stateful one only if the rule, shown the empty system,
        keeps its state (SGLang resets its ratio when idle: that slot is
        stepped, and the gap after it skipped)."""
        if not self.state_vars:
            return True
        _, decision = self.decide()
        return decision.state is None or tuple(decision.state) == self.sched_state

    @property
    def idle(self) -> bool:
        """No request waiting or active."""
        return not self.active and not self.waiting

    def drain_checked(self, plan: ArrivalPlan, check: Callable[[int], list[str]], max_slots: int) -> list[str]:
        """Run ``plan`` until it drains (idle slots skipped, at most ``max_slots``), calling
        ``check(t)`` after each slot: the run stops at the first slot whose check finds problems
        and returns them (``[]``: every slot passed).  What the run raises propagates."""
        found: list[str] = []

        def after(t: int) -> None:
            found.extend(check(t))
            if found:
                raise _Stop

        try:
            self.run(plan, None, drain=True, skip_idle=True, on_slot=after, max_slots=max_slots)
        except _Stop:
            pass
        return found

    def run(
        self,
        plan: ArrivalPlan,
        slots: int | None = None,
        *,
        drain: bool = False,
        skip_idle: bool = False,
        on_slot: Callable[[int], None] | None = None,
        max_slots: int = MAX_SLOTS,
    ) -> int:
        """The one run loop: feed ``plan``'s arrivals in their slots, step, record.

        ``plan``'s slots are the engine's own (absolute) slots; a row whose
        slot has already passed arrives in the current slot.  Without
        ``drain`` the run stops when the engine reaches slot ``slots``; with
        ``drain`` once every row has arrived and the system is empty (and not
        before slot ``slots`` if given).  ``skip_idle`` jumps over slots in
        which nothing waits, runs or arrives (no record is kept for them; a
        stateful rule is stepped through idle slots until its state stops changing);
        ``on_slot(t)`` is called after each simulated slot.  At most
        ``max_slots`` slots are stepped.  Returns how many rows of ``plan``
        were fed: fewer than ``len(plan)``, or a non-idle engine after a
        drain, means the run stopped at ``max_slots``.

        An :class:`InvariantViolation` (with ``check``) or an
        :class:`InvalidScheduler` propagates; the records up to it are kept.
        """
        if slots is None and not drain:
            raise InvalidArgument("a run needs a number of slots, or drain=True")
        arr = plan.slot
        n = len(plan)
        prompts = plan.prompts if self.cache is not None else None
        i = 0
        steps = 0
        while True:
            t = self.slot
            if drain:
                if i >= n and self.idle and (slots is None or t >= slots):
                    break
            elif slots is not None and t >= slots:
                break
            if steps >= max_slots:
                break
            if skip_idle and self.idle and not self._pending_arrivals and self._idle_is_still():
                nxt = int(arr[i]) if i < n else None
                if nxt is None:
                    target = slots
                elif drain or slots is None:
                    target = nxt
                else:
                    target = min(nxt, slots)
                if target is not None and target > t:
                    self.skip_to(target)  # nothing happens in an idle gap
                    continue
            while i < n and arr[i] <= t:
                if prompts is None:
                    self.arrive(int(plan.s[i]), int(plan.o[i]))
                else:  # prefix caching: the request's content, so equal prefixes share blocks
                    out = None if prompts.output is None else int(prompts.output[i])
                    self.arrive(int(plan.s[i]), int(plan.o[i]), prompts.prompt(i), out)
                i += 1
            self.step()
            steps += 1
            if on_slot is not None:
                on_slot(t)
        return i

    def simulate(self, plan: ArrivalPlan, h: Horizon) -> SimResult:
        """:meth:`run` ``plan`` to ``h``'s end and return the result, refusing a run that stopped at
        ``h.max_slots`` before slot ``h.slots`` or, with ``h.drain``, before every request finished
        (the plan is taken as given: the caller has checked it against the server)."""
        fed = self.run(plan, h.slots, drain=h.drain, max_slots=h.max_slots)
        unfinished = (fed < len(plan) or not self.idle) if h.drain else (h.slots is not None and self.slot < h.slots)
        if unfinished:
            raise InvalidArgument(f"simulation did not drain within max_slots={h.max_slots}")
        return self.result(dropped=plan.dropped)

    def result(self, dropped: int = 0) -> SimResult:
        """The run so far as arrays."""
        recs = self.records
        col = lambda f: np.fromiter((f(r) for r in recs), dtype=np.int64, count=len(recs))  # noqa: E731
        req = self.requests
        rcol = lambda f: np.fromiter((f(r) for r in req), dtype=np.int64, count=len(req))  # noqa: E731
        # the columns a slot record or a request state holds under the result's own name
        same = {k: col(attrgetter(k)) for k in ("arrived", "running", "memory", "wasted", "tokens", "queue")}
        same |= {k: rcol(attrgetter(k)) for k in ("s", "o", "arrival", "first_admit", "finish", "preemptions", "served")}
        return SimResult(
            scheduler=self.spec,
            params=self.params,
            slots=len(recs),
            admitted=col(lambda r: len(r.admitted)),
            preempted=col(lambda r: len(r.preempted)),
            completed=col(lambda r: len(r.completed)),
            request_wasted=rcol(lambda r: r.wasted),
            dropped=dropped,
            **same,
            window=self.window,
            window_hid_slots=self.window_hid_slots,
        )


class _Stop(Exception):
    """Stops :meth:`Engine.drain_checked` at the first slot whose check finds problems."""


def simulate(
    scheduler: Scheduler,
    params: ModelParams,
    plan: ArrivalPlan,
    slots: int | None = None,
    *,
    drain: bool = False,
    check: bool = True,
    window: int = DEFAULT_WINDOW,
    on_slot: Callable[[int], None] | None = None,
    max_slots: int = 10_000_000,
    spec: str | None = None,
    decide_timeout: float | None = None,
) -> SimResult:
    """Run ``plan`` through ``scheduler`` for ``slots`` slots (or, with
    ``drain``, until every request has finished, at most ``max_slots``).

    Raises :class:`InvariantViolation` at the first slot that breaks the
    memory invariant (unless ``check=False``); ``spec``, ``window`` and
    ``decide_timeout`` are :class:`Engine`'s.
    """
    if slots is None and not drain:
        raise InvalidArgument("simulate needs a number of slots, or drain=True")
    if slots is not None:
        slots = positive_int("slots", slots, maximum=MAX_SLOTS)
    plan = plan.fit_to(params)
    eng = Engine(scheduler, params, check=check, window=window, spec=spec, decide_timeout=decide_timeout)
    fed = eng.run(plan, slots, drain=drain, on_slot=on_slot, max_slots=max_slots)
    if drain and (fed < len(plan) or not eng.idle):
        raise InvalidArgument(f"simulation did not drain within max_slots={max_slots}")
    return eng.result(dropped=plan.dropped)
