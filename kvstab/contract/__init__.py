"""The scheduler contract: an immutable view in, a decision out.

Each slot the engine shows a scheduler a :class:`View` — the active requests
with their progress (oldest admission first), the head of the waiting queue in
queue order, ``M``, ``ŝ`` and the other server parameters — and the scheduler
returns a :class:`Decision`: which waiting requests to admit, which active
requests to preempt, and (optionally) how many tokens of work each request is
granted this slot.  The engine applies it: preempted requests lose their memory
and progress and go back to the queue; admitted ones join the active set;
every active request advances by its grant (one unit by default); memory is
charged; finished requests release it.

The rule is written once, against :class:`kvstab.ops.Ops`, and must not use
Python control flow on values it reads from the view.  Every entry of a view
carries a ``present`` flag: in the simulator it is always ``True`` (views hold
only real requests); in the z3 encoding an entry is a *slot* that may be empty.
A rule therefore masks with ``present`` (``ops.and_(r.present, …)``), which is
what makes it correct for both.  See ``docs/scheduler-contract.md``.

The modules, each importing only those above it:

* ``traits`` — what a rule claims (:class:`Traits`, :func:`traits_of`);
* ``view`` — the view and the decision, the :class:`Scheduler` protocol, and
  the view a non-clairvoyant rule is shown (:func:`visible_view`);
* ``state`` — a rule's own state (:class:`StateVar`), carried and checked by the engine;
* ``folds`` — the combinators a rule reads the view's lists with (:func:`scan`, …);
* ``memory`` — the memory helpers (:func:`held_now`, :func:`used_next`, …);
* ``admission`` — FCFS walks of the queue (:func:`fcfs_admit`, …);
* ``preemption`` — preemption orders (:func:`preempt_newest`, :func:`retract_until_fits`);
* ``checks`` — what an engine checks of a scheduler and of its decisions.
"""

from kvstab.contract.admission import Projected, fcfs_admit, fcfs_admit_projected, fcfs_admit_with_grants
from kvstab.contract.checks import check_decision_shape, check_decision_values, check_scheduler_shape
from kvstab.contract.folds import any_of, count_of, no_preemption, scan, select, sum_of, zipped
from kvstab.contract.memory import first_progress, first_step, held_first, held_next, held_now, used_next, used_now
from kvstab.contract.preemption import pops_before, preempt_newest, retract_until_fits
from kvstab.contract.state import StateVar, check_next_state, initial_state, state_vars_of
from kvstab.contract.traits import Traits, traits_of
from kvstab.contract.view import (
    ActiveEntry,
    DecideFn,
    Decision,
    HiddenOutput,
    Scheduler,
    View,
    WaitingEntry,
    hidden_output,
    visible_view,
)

__all__ = [
    "ActiveEntry",
    "WaitingEntry",
    "View",
    "Decision",
    "Scheduler",
    "Traits",
    "traits_of",
    "DecideFn",
    "held_now",
    "held_next",
    "held_first",
    "first_progress",
    "first_step",
    "used_now",
    "used_next",
    "fcfs_admit",
    "fcfs_admit_with_grants",
    "fcfs_admit_projected",
    "Projected",
    "preempt_newest",
    "retract_until_fits",
    "pops_before",
    "select",
    "scan",
    "zipped",
    "sum_of",
    "count_of",
    "any_of",
    "no_preemption",
    "check_decision_shape",
    "check_decision_values",
    "check_scheduler_shape",
    "HiddenOutput",
    "visible_view",
    "hidden_output",
    "StateVar",
    "state_vars_of",
    "initial_state",
    "check_next_state",
]
