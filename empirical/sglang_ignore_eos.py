"""SGLang's ``ignore_eos`` admission, specified in kvstab's terms and checked against SGLang's own logs.

With ``ignore_eos=True`` and no radix cache, SGLang 0.5.23's ``PrefillAdder.add_one_req``
takes another branch, ``add_one_req_ignore_eos`` (``srt/managers/schedule_policy.py:1241``,
dispatched at ``:1401``), and every running request is reserved at ratio 1.0
(``:787``).  kvstab's ``sglang`` rule models the ratio path only; this module is the
executable form of the specification in ``docs/empirical.md`` ("SGLang's ignore_eos
regime"), for the follow-up that gives the rule an ``ignore_eos`` knob:

* :func:`ignore_eos_pass` is one prefill pass in the ``ignore_eos`` regime over
  kvstab-level entries (:class:`Entry`: ``s``, ``o``, ``progress``, ``prior`` as the
  engine shows them), returning which waiting requests are admitted;
* :func:`check_spec` rebuilds every step's state from a log of SGLang's ``ignore_eos``
  path (:func:`~kvstab.empirical.sglang_driver.run_sglang` with ``ignore_eos=True``)
  and names the first step whose admissions, chunk or flag the specification does
  not predict — ``None`` when it predicts all of them.

In kvstab's terms (a request ``(s, max_new)`` is kvstab's ``(s, max_new − 1)``; a
retracted one resumes as ``(s + k, max_new − 1 − k)`` with ``prior = k``), SGLang's
``tokens_left = max_new − len(output_ids)`` and ``tokens_occupied = len(origin) +
len(output_ids)`` are

* a decoding request at progress ``p``: ``L = s + o − p``, ``Q = p + 1``;
* the in-flight chunk and a waiting request: ``L = o + 1``, ``Q = s``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvstab.model import ModelParams
from kvstab.schedulers.sglang import Sglang
from kvstab.steplog import SglangModelLog

__all__ = ["Entry", "PassResult", "ignore_eos_pass", "check_spec", "IGNORE_EOS_RESERVE"]

#: ``IGNORE_EOS_RESERVE_TOKENS`` (``schedule_policy.py:122``): the look-ahead's margin per live request.
IGNORE_EOS_RESERVE = 1


@dataclass(frozen=True, slots=True)
class Entry:
    """A request as the pass sees it, in kvstab's terms (what the engine's view shows)."""

    rid: int
    s: int  # prompt of the current attempt (the original prompt + prior)
    o: int  # kvstab outputs of the current attempt: max_new − 1 − prior
    progress: int  # tokens of the current attempt computed (0 while waiting)
    prior: int = 0  # outputs kept from retractions

    @property
    def max_new(self) -> int:
        """SGLang's ``max_new_tokens`` (after the arrival clip)."""
        return self.o + 1 + self.prior

    @property
    def left(self) -> int:
        """SGLang's ``tokens_left`` at ratio 1.0: ``max_new − len(output_ids)``."""
        return self.s + self.o - self.progress if self.progress >= self.s else self.o + 1

    @property
    def occupied(self) -> int:
        """SGLang's ``tokens_occupied``: ``len(origin_input_ids) + len(output_ids)``."""
        return self.progress + 1 if self.progress >= self.s else self.s


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one prefill pass decides."""

    admitted: tuple[int, ...]  # waiting requests entering the prefill batch, in order
    chunk: int  # tokens the in-flight chunk computes (0: none in flight)
    new_chunk: int  # tokens of a waiting request admitted as a chunk (0: none)
    set_full: bool  # the pass sets batch_is_full


def _paged(x: int, B: int) -> int:
    return -(-x // B) * B


def ignore_eos_pass(
    rule: Sglang,
    params: ModelParams,
    free: int,
    running: list[Entry],
    chunked: Entry | None,
    waiting: list[Entry],
    batch_is_full: bool,
) -> PassResult:
    """One prefill pass of ``_get_new_batch_prefill_raw`` (``scheduler.py:4079``) in the
    ``ignore_eos`` regime, every request ``ignore_eos`` (``docs/empirical.md`` states it step by step).

    ``rule``: SGLang's knobs; ``params``: the server; ``free``: KV tokens free before the
    pass; ``running``: the decoding requests in batch order; ``chunked``: the in-flight
    chunk; ``waiting``: the queue in order.
    """
    B, clip = params.block, rule.clip_max_new_tokens
    if not running:
        batch_is_full = False  # an empty running batch clears the flag (scheduler.py:4094)
    if (batch_is_full or not waiting) and chunked is None:
        return PassResult((), 0, 0, batch_is_full)
    # the adder's budgets; running requests reserved at ratio 1.0 (schedule_policy.py:787, :675)
    total = sum(min(a.left, clip) for a in running)
    current = 0
    rem_chunk = _paged(params.chunk, B)
    rem_input = rule.max_prefill_tokens
    in_batch: list[Entry] = []
    chunk = 0
    if chunked is not None:
        # add_chunked_req (:1140) is the ratio path's, with the ratio-1.0 offsets
        avail = min(rem_chunk, int(free - total))
        avail = avail if avail > 0 else rem_chunk
        cand = chunked.s - chunked.progress
        chunk = min(cand, avail)
        truncated = cand > avail
        total += _paged(chunk, B) + B + (0 if truncated else min(chunked.max_new, clip))
        current += _paged(chunk, B) + B
        rem_chunk -= _paged(chunk, B)
        rem_input -= _paged(chunk, B)
        in_batch.append(chunked)
    admitted: list[int] = []
    states: list[tuple[int, int]] | None = None
    new_chunk = 0
    for w in waiting:
        no_token = free - total <= 0 or free - current <= 0
        if not no_token and (rem_input <= 0 or rem_chunk <= 0):
            break  # budget_state() is OTHER (:874; NO_TOKEN comes first)
        if params.max_num_seqs is not None and len(running) + len(in_batch) >= params.max_num_seqs:
            batch_is_full = True  # the running cap (scheduler.py, the walk)
            break
        # add_one_req_ignore_eos (:1241): the prompt and a page must fit what is free and unreserved
        paged_input = _paged(w.s, B) + B
        if paged_input > min(free - current, free - total):
            batch_is_full = bool(in_batch) or bool(running)
            break
        # the look-ahead (:1259-1303): (L, Q) of this request, the running ones and the batch so far,
        # sorted by L on the pass's first call; later ones inserted before the first L' >= L, or
        # before the last entry when none is (the loop variable's last value)
        if states is None:
            states = [(e.left, e.occupied) for e in [w, *running, *in_batch] if e.left > 0]
            states.sort(key=lambda x: x[0])
        elif w.left > 0:
            i = 0
            for i in range(len(states)):
                if w.left <= states[i][0]:
                    break
            states.insert(i, (w.left, w.occupied))
        cur = free - current - paged_input
        freed = 0
        fits = True
        for i, (left, occupied) in enumerate(states):
            live = len(states) - i
            if cur + freed - left * live <= IGNORE_EOS_RESERVE * live:
                fits = False
                break
            freed += occupied
        if not fits:
            batch_is_full = bool(in_batch) or bool(running)
            break
        if w.s <= rem_chunk:  # the whole prompt (a raw comparison, :1329)
            ext, res_new = w.s, min(w.max_new, clip)
        else:  # a chunk of what the budget has left, no outputs reserved yet
            ext, res_new = rem_chunk, 0
            new_chunk = ext
        total += _paged(ext, B) + B + res_new
        current += _paged(ext, B) + B
        rem_chunk -= _paged(ext, B)
        rem_input -= _paged(ext, B)
        in_batch.append(w)
        admitted.append(w.rid)
        if free - total <= 0 or free - current <= 0:  # budget_state() after the admission
            batch_is_full = True
            break
        if new_chunk or rem_input <= 0 or rem_chunk <= 0:
            break
    return PassResult(tuple(admitted), chunk, new_chunk, batch_is_full)


def check_spec(log: SglangModelLog) -> str | None:
    """The first step of ``log`` (SGLang's ``ignore_eos`` path) whose prefill pass
    :func:`ignore_eos_pass` does not predict — admissions, the chunk, or whether a prefill
    step runs at all — as a line naming what differs; ``None`` when it predicts every step."""
    rule, params = log.rule, log.params
    B = params.block
    n = len(log.s)
    arrivals: dict[int, list[int]] = {}
    for r, t in enumerate(log.arrival):
        arrivals.setdefault(t, []).append(r)
    queue: deque[int] = deque()
    progress = [0] * n
    prior = [0] * n
    out = [0] * n
    running: list[int] = []  # decoding requests, batch order
    chunked: int | None = None
    flag = False
    kv = 0

    def entry(r: int) -> Entry:
        return Entry(r, log.s[r] + prior[r], log.max_new[r] - 1 - prior[r], progress[r], prior[r])

    for t, st in enumerate(log.steps):
        queue.extend(arrivals.get(t, ()))
        pred = ignore_eos_pass(
            rule,
            params,
            B * (params.M // B) - kv,
            [entry(r) for r in running],
            entry(chunked) if chunked is not None else None,
            [entry(r) for r in queue],
            flag,
        )
        if st.kind == "prefill":
            work = dict(st.tokens)
            if pred.admitted != st.admitted:
                return f"step {t}: SGLang admits {st.admitted}, the specification {pred.admitted}"
            if chunked is not None and work.get(chunked) != pred.chunk:
                return f"step {t}: the chunk of request {chunked} is {work.get(chunked)} on SGLang, {pred.chunk} specified"
            if pred.new_chunk and work.get(pred.admitted[-1]) != pred.new_chunk:
                return f"step {t}: request {pred.admitted[-1]} starts with {work.get(pred.admitted[-1])} tokens, {pred.new_chunk} specified"
        elif pred.admitted or pred.chunk:
            return f"step {t}: a {st.kind} step where the specification admits {pred.admitted} (chunk {pred.chunk})"
        # apply the step as the log records it
        for _ in st.admitted:
            queue.popleft()
        finished = set(st.finished)
        done_prefill: list[int] = []
        for r, k in st.tokens:
            progress[r] += k
            if st.kind == "prefill":
                if progress[r] == log.s[r] + prior[r]:
                    out[r] += 1
                    done_prefill.append(r)
                    if chunked == r:
                        chunked = None
                elif r not in finished:
                    chunked = r
            else:
                out[r] += 1
        for r in st.retracted:  # the ratio path's; none in the ignore_eos regime on these workloads
            running.remove(r)
            prior[r] = out[r]
            progress[r] = 0
            queue.append(r)
        running = [r for r in running + done_prefill if r not in finished]
        kv = st.kv_used
        flag = bool(st.batch_is_full)
    return None
