"""Deliberately broken schedulers for the mutation check (``tests/test_mutation.py``).

Each module defines ``SCHEDULER``: a small variant of a built-in rule, written
against :class:`kvstab.ops.Ops` like the built-ins, with one realistic bug.  It
declares the built-in's attributes (``fcfs``, ``work_conserving``, ``margin``…)
as a buggy port would, so the property suite holds it to those claims.
:data:`MUTANTS` lists the modules; ``MUTANT_DOC`` says what each breaks.
Audit one by hand with ``PYTHONPATH=tests pytest props/ --scheduler mutants.NAME:SCHEDULER``
(or ``pytest --pyargs kvstab.props --scheduler …`` from any directory).
"""

MUTANTS: tuple[str, ...] = (
    "chunk_off_by_one",
    "ignores_first_chunk",
    "wrong_victim",
    "release_early",
    "idles_with_fit",
    "one_per_slot",
    "skips_blocked_head",
    "half_chunk",
    "preempts_all",
    "idles_at_three_quarters",
    "reserve_peak_off_by_one",
    "lookahead_idles",
)

#: rule mutants whose bug shows only with prefix caching (shared KV blocks): without
#: caching each is current-fit's decision, so they are not in :data:`MUTANTS` (the
#: mutation check runs without caching); ``tests/proofs/test_proofs_caching.py`` and
#: ``props/test_props_caching.py`` catch them.  ``mutants.pools`` holds the mutant
#: block pools (bugs of the mechanism, not of a rule).
CACHING_MUTANTS: tuple[str, ...] = (
    "evicts_referenced",
    "full_hit_no_recompute",
    "keeps_behind_victim",
)
