"""A lookahead-style plug-in for `benchmarks/bench_audit.py`: the paper's lookahead rule,
built from the contract's projection combinator (:func:`kvstab.contract.fcfs_admit_projected`)
over lookahead's own projection, admitting only while the projected peak stays within
``M − H``: a headroom of ``H = M/16`` tokens kept free while anything runs, the shape of
rule a user derives from ``lookahead``.  An empty server takes its head against the whole
``M`` (a request that fits ``M`` but not ``M − H`` would otherwise wait for ever: property 8).

Run: python benchmarks/bench_audit.py --scheduler benchmarks.plugins.lookahead_headroom:SCHEDULER
(from the project root, so that ``benchmarks`` is importable).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvstab.contract import Decision, Traits, View, count_of, fcfs_admit_projected, no_preemption
from kvstab.model import ModelParams
from kvstab.ops import BoolLike, IntLike, Ops
from kvstab.schedulers.lookahead import Projection
from kvstab.schedulers.reserve import future_memory_margin


@dataclass(frozen=True, slots=True)
class LookaheadHeadroom:
    """FCFS, clairvoyant: lookahead's projected-peak admission against ``M − M/16`` while any
    request runs, against ``M`` on an empty server."""

    name: str = "lookahead-headroom"
    description: str = (
        "lookahead admitting while the projected peak stays within 15/16 of M (M on an empty server); never preempts"
    )
    traits: Traits = Traits(fcfs=True, work_conserving=False, clairvoyant=True, preempts=False)

    def margin(self, params: ModelParams, max_s: int, max_o: int) -> int:
        """Lookahead's margin plus the headroom left idle."""
        return future_memory_margin(params) + params.M // 16

    def decide(self, view: View, ops: Ops) -> Decision:
        """Admit the head while the projected peak of everyone admitted fits in ``M − M/16``
        (``M`` when nothing runs)."""
        running = count_of(view.active, lambda a: a.present, ops)
        tight = dataclasses.replace(view, M=ops.ite(ops.le(running, 0), view.M, view.M - view.M // 16))

        def project(s: IntLike, o: IntLike, p: IntLike, present: BoolLike) -> Projection:
            return Projection.of(tight, s, o, p, present, ops)

        return Decision(admit=fcfs_admit_projected(tight, ops, project), preempt=no_preemption(view))


SCHEDULER = LookaheadHeadroom()
