"""The records the compiled engines share: every index into their arrays, each name with one value.

The three compiled loops (:mod:`~kvstab.engine._kernel` for the built-ins,
:mod:`~kvstab.engine._kernel_sglang` for ``sglang``, :mod:`~kvstab.engine._plugin_kernel`
for a taped rule) and the Python driver around them (:mod:`~kvstab.engine._drive`) talk
through flat int64 records, indexed by the names here:

* ``cfg`` — a run's settings, read once per call (``C_*``);
* ``st`` — the scalar state a loop carries from one call to the next (``ST_*``): one layout for
  every kernel, so that the driver reads the clock, the arrivals, a violation, the streamed
  totals and the work counters at the same index whichever kernel ran; a kernel leaves the
  fields of the others alone;
* ``bp`` — the streamed batch-means bins (``BP_*``);
* the request tables ``R`` (one column per request): ``F_*`` rows for the built-ins,
  ``G_*`` rows for ``sglang`` (whose finish heap and admission-order list sit at the same rows,
  so the two kernels share the heap and list helpers);
* ``out`` — the per-slot rows (:data:`COLUMNS`), and sglang's step log (``L_*``).

numba compiles these values into the kernels as constants: a kernel that reads this module
carries its hash (``LAYOUT_SHA``), so that changing a value here recompiles it.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

# ---- codes
# rule codes of the built-ins' kernel (``C_POL``)
CURRENT_FIT, NO_PREEMPT, RESERVE, LOOKAHEAD, VLLM_V1 = 0, 1, 2, 3, 4
# lifecycle codes (``C_LIFE``): kvstab's, vLLM's, SGLang's (the last for the sglang rule only)
KVSTAB_LIFE, VLLM_LIFE, SGLANG_LIFE = 0, 1, 2
# what a call of a kernel returns (BROKEN: the prefix-cache kernel's rule that never preempts met a
# full pool, which the reference engine reports)
REACHED, VIOLATION, DRAINED, NEED_TAPE, BAIL, BROKEN = 0, 1, 2, 3, 4, 5
# violation kinds (``st[ST_VKIND]``)
V_MEMORY, V_SEQS, V_BUDGET = 1, 2, 3
# request modes (``R[F_MODE]``, ``R[G_MODE]``): not running, a lazy decoder, stepped explicitly
M_OUT, M_LAZY, M_EXPL = 0, 1, 2

# ---- ``cfg``: a run's settings (``-1``: no token budget, no ``max_num_seqs``)
C_POL, C_LIFE, C_M, C_CHUNK, C_B, C_BUDGET, C_MAXSEQ, C_CHECK, C_COMP = range(9)
C_T_END, C_DRAIN, C_DRAIN_MIN, C_T_BASE = 9, 10, 11, 12
# sglang's knobs (its float knobs travel in ``fcfg``)
C_MPT, C_CLIP, C_RDS = 13, 14, 15
# the plug-in loop's window
C_WINDOW = 16
C_SIZE = 17
# ``fcfg``: sglang's ratio knobs
FC_INIT, FC_MIN, FC_DECAY = 0, 1, 2
FC_SIZE = 3

# ---- ``st``: the scalar state
# every kernel: the clock, the plan's next arrival, the queue ring, the actives
ST_T, ST_I, ST_QH, ST_QL, ST_NA = 0, 1, 2, 3, 4
ST_AH, ST_AT = 5, 6  # head (oldest) and tail (newest) of the list of actives (admission or batch order)
ST_VKIND, ST_VSLOT, ST_VVALUE, ST_VMEM = 7, 8, 9, 10  # the violation a loop stopped at
ST_NL, ST_DL, ST_NE, ST_HN = 11, 12, 13, 14  # lazy decoders, the memory they hold, explicit requests, heap size
ST_DONE, ST_MEMSUM = 15, 16  # completions so far; streamed Σ memory from the steady window's start
# work counters (what a run cost, for benchmarks/bench_engine.py)
ST_FULL, ST_SKIP, ST_STRETCH, ST_EXPL, ST_ADMIT, ST_PREEMPT, ST_RUNSUM = range(17, 24)
# the built-ins' kernel
ST_RESV, ST_CL = 24, 25  # reserve's reserved total; Σ d over the lazy decoders
ST_LAH, ST_LAW = 26, 27  # lookahead: the refused head and the first slot it can pass its test
ST_BUDGET, ST_BUDREQ, ST_LATEST = 28, 29, 30  # counters: budget slots, stalls, lookahead tests
# sglang's kernel: the clip heap and its sums, the decode clock, the areas' sums, the batch flag,
# ranks, the step log's cursor and batch dump, and its counters
ST_CN, ST_NU, ST_RU, ST_NC, ST_TAU, ST_W2, ST_CALL = 31, 32, 33, 34, 35, 36, 37
ST_BATCH_FULL, ST_RANKC, ST_EVP, ST_BVER, ST_DUMPV, ST_DUMPO, ST_DUMPL = 38, 39, 40, 41, 42, 43, 44
ST_RETRACT, ST_EXACT = 45, 46
# the plug-in loop: the slot's arrivals not yet decided on, the shape it needs, hidden slots,
# this slot's answers of the rule itself, and whether the need is an ASK row's
ST_PEND, ST_NEEDK, ST_NEEDQ, ST_HID, ST_NONCE, ST_ASK = 47, 48, 49, 50, 51, 52
ST_SIZE = 53

# ---- ``fs``: sglang's float state
FS_RATIO = 0
FS_SIZE = 1

# ---- ``bp``: streamed batch-means parameters: throughput bins, queue-slope bins, Σ memory from BP_MEM
BP_ON, BP_F1, BP_S1, BP_N1, BP_F2, BP_S2, BP_N2, BP_MEM = 0, 1, 2, 3, 4, 5, 6, 7
BP_SIZE = 8

# ---- the per-slot output block (``out``, one column per slot)
COLUMNS = (
    "arrived admitted preempted completed running memory wasted tokens queue "
    "scheduled prefill_tokens decode_tokens kv_attended prefill_reqs prefill_ctx prefill_sq decode_ctx recomputed"
).split()
NCOLS = len(COLUMNS)
#: the columns a SimResult keeps (the rest: the built-ins' compute counters, vLLM's replay)
NSIM = 9

# ---- the built-ins' request table (``R``, arrival order)
F_S, F_O, F_PROG, F_TB, F_ATT, F_SERVED, F_WASTED, F_NPRE, F_FIRST, F_FIN = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
F_RECOMP, F_MODE, F_NXT, F_PRV, F_HPOS, F_EPOS, F_GRANT, F_TA, F_FSLOT, F_TF = 10, 11, 12, 13, 14, 15, 16, 17, 18, 19
NF = 20

# ---- sglang's request table: the finish heap's positions and the list at the built-ins' rows
G_S, G_O, G_PROG, G_D, G_ATT, G_SERVED, G_WASTED, G_NPRE, G_FIRST, G_FIN = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
G_RECOMP, G_MODE, G_NXT, G_PRV, G_HPOS, G_PRIOR, G_RANK, G_TB, G_W2S, G_PS = 10, 11, 12, 13, 14, 15, 16, 17, 18, 19
G_CPOS, G_GRANT, G_EPOS, G_CLIP = 20, 21, 22, 23
NG = 24
# the clip heap runs the heap functions on the view ``R[C_SHIFT:]``, whose row F_HPOS is G_CPOS
C_SHIFT = G_CPOS - F_HPOS

# ---- sglang's step log (``lg`` rows)
L_KIND, L_NADM, L_NRET, L_NFIN, L_NTOK, L_TOKOFF, L_PF, L_DC, L_KV, L_FULL, L_QUEUE, L_RET, L_FIN = range(13)
NLOG = 13
K_IDLE, K_PREFILL, K_DECODE = 0, 1, 2

# the rows the two tables share (the heap and list helpers, arrivals, a victim's loss, a finish run on either)
assert (G_HPOS, G_NXT, G_PRV, G_MODE, G_S, G_O) == (F_HPOS, F_NXT, F_PRV, F_MODE, F_S, F_O) and C_SHIFT > 0
assert (G_ATT, G_WASTED, G_PROG, G_NPRE, G_FIN) == (F_ATT, F_WASTED, F_PROG, F_NPRE, F_FIN)
assert len({v for k, v in globals().items() if k.startswith("ST_") and k != "ST_SIZE"}) == ST_SIZE


def stale(guards: tuple[tuple[str, str], ...]) -> list[str]:
    """The guards ``(file, sha)`` of a kernel module whose file in this folder no longer has that
    hash (a prefix of its sha256).

    numba keys a cached kernel by the text of its own file alone, so a kernel that inlines a
    helper of another file, or compiles in this module's constants, writes that file's hash
    into its own text: a change there must change the kernel's text, or its cache keeps the
    old copy.  After editing such a file, write ``sha256sum kvstab/engine/FILE | cut -c1-16``
    into the constant each guard names."""
    here = Path(__file__).parent
    return [
        f"{name} (sha {sha}, now {now})"
        for name, sha in guards
        if (now := hashlib.sha256((here / name).read_bytes()).hexdigest()[:16]) != sha
    ]


def warn_if_stale(module: str, guards: tuple[tuple[str, str], ...]) -> None:
    """Warn (at import) that ``module``'s cached kernels may run an old copy of a changed file."""
    bad = stale(guards)
    if bad:
        warnings.warn(
            f"{module}: the hash of {', '.join(bad)} is not the one recorded: a cached kernel may run "
            "the old text; update the recorded hash (see kvstab.engine._layout.stale)",
            stacklevel=2,
        )
