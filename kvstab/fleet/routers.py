"""Routers: which replica of a fleet an arriving request goes to.

Two kinds, because they cost differently to simulate:

* **state-independent** routers (``state_dependent = False``) decide from the
  arrival sequence alone — round-robin, weighted round-robin, a random split.
  They implement ``assign(n, replicas, rng)``, which routes a whole plan at
  once; the fleet simulator then runs every replica on its own with the fast
  engine (exact: a replica's outcome depends only on the requests it gets).
* **state-dependent** routers (``state_dependent = True``) look at the
  replicas when a request arrives — join-shortest-queue, least KV in use,
  power-of-d, the KV-aware router.  They implement ``choose(states, rng)``;
  the simulator steps the replicas together in time order.

Every router but the prefix routers is **size-blind**: it never reads the
request's ``s`` or ``o`` (``kvstab.theory.fleet`` assumes so: each replica then
sees the workload's own length law).  The prefix routers (``prefix-affinity``,
``consistent-hash``, ``sglang-router``; ``reads_prompts = True``) read the
prompt's content and length, never ``o``: they split the traffic by content, and
:mod:`kvstab.fleet.affinity` gives the condition that adds.

Routers are found by name in one registry, like schedulers
(:mod:`kvstab.registry`): the built-ins, plug-ins advertised in the
entry-point group ``kvstab.routers`` (the value is ``module:attr`` naming a
router factory), or a ``module:attr`` spec.  A spec may carry one argument
after a colon: ``power-of-d:3``, ``random:0.7,0.3``, ``weighted-rr:mu``.
A factory is called as ``factory(arg)`` with that argument (``None`` when
there is none) and returns the router.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from kvstab.errors import InvalidArgument, import_plugin, plugin_fault
from kvstab.model import ModelParams
from kvstab.prefix import PromptSet
from kvstab.validation import positive_float, positive_int

__all__ = [
    "ReplicaInfo",
    "ReplicaState",
    "Router",
    "RouterFactory",
    "RoundRobin",
    "WeightedRoundRobin",
    "RandomSplit",
    "JoinShortestQueue",
    "LeastKV",
    "PowerOfD",
    "KVAware",
    "RoutedRequest",
    "PrefixAffinity",
    "ConsistentHash",
    "SglangRouter",
    "PromptChains",
    "reads_prompts",
    "load_router",
    "router_names",
    "register_router",
    "ENTRY_POINT_GROUP",
]

ENTRY_POINT_GROUP = "kvstab.routers"

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """What a router may know of a replica in advance (no state)."""

    index: int = field(metadata={"help": "position of the replica in the fleet"})
    mu: float = field(metadata={"help": "μ_i = M_i/(b̄_i·E_i[g]), requests per second"})
    params: ModelParams = field(metadata={"help": "the replica's server (M_i, ŝ_i, B_i, b̄_i, …)"})
    expected_g: float = field(metadata={"help": "E_i[g], token·slots of one request on this replica"})

    @property
    def M(self) -> int:
        """KV capacity of the replica, tokens (its server's ``M``)."""
        return self.params.M

    @property
    def bbar(self) -> float:
        """Batch time b̄_i of the replica, seconds per slot (its server's ``bbar``)."""
        return self.params.bbar


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """A replica as a state-dependent router sees it when a request arrives."""

    info: ReplicaInfo
    waiting: int = field(metadata={"help": "requests in the queue"})
    running: int = field(metadata={"help": "requests admitted and not finished"})
    kv_in_use: int = field(metadata={"help": "KV tokens held after the replica's last slot"})
    served_area: int = field(
        metadata={"help": "area already served to the running requests in their current attempts (token·slots)"}
    )
    cached_tokens: int = field(
        default=0,
        metadata={"help": "tokens of the arriving request's prompt this replica's block pool holds cached (its "
                          "longest cached prefix, whole blocks, at most s − 1); filled for a router that "
                          "reads_cache, else 0"},
    )

    @property
    def in_system(self) -> int:
        """Waiting plus running."""
        return self.waiting + self.running

    @property
    def predicted_drain_s(self) -> float:
        """Seconds this replica needs to clear what it holds plus one more request,
        predicted size-blind: each request counts ``E_i[g]`` of area, less the area
        the running ones have been served, at ``M_i/b̄_i`` area per second — i.e.
        the outstanding load in ``E[g]`` units over ``μ_i``."""
        i = self.info
        area = max(i.expected_g * (self.in_system + 1) - self.served_area, i.expected_g)
        return area / i.expected_g / i.mu


@runtime_checkable
class Router(Protocol):
    """A router: a ``name``, whether it reads the replicas' state, and the method of its kind."""

    name: str
    state_dependent: bool


class StaticRouter(Router, Protocol):
    """A state-independent router: routes a whole arrival sequence at once."""

    def assign(self, n: int, replicas: Sequence[ReplicaInfo], rng: np.random.Generator) -> IntArray:
        """The replica of each of ``n`` arrivals, in arrival order."""
        ...


class DynamicRouter(Router, Protocol):
    """A state-dependent router: picks one replica per arrival."""

    def choose(self, states: Sequence[ReplicaState], rng: np.random.Generator) -> int:
        """The index of the replica the arriving request goes to."""
        ...


RouterFactory = Callable[[str | None], Any]


def _weights(arg: str | None, replicas: Sequence[ReplicaInfo], default: str) -> npt.NDArray[np.float64]:
    """Shares from ``mu`` (∝ μ_i), ``equal`` or a comma list of positive weights (normalised)."""
    text = (arg or default).strip()
    n = len(replicas)
    if text == "mu":
        w = np.asarray([r.mu for r in replicas], dtype=np.float64)
    elif text == "equal":
        w = np.ones(n)
    else:
        parts = [p for p in text.split(",")]
        if len(parts) != n:
            raise InvalidArgument(
                f"router weights {text!r} give {len(parts)} shares for {n} replicas; "
                "valid: 'mu', 'equal' or one positive number per replica"
            )
        w = np.asarray([positive_float("a router weight", p.strip(), maximum=1e12) for p in parts])
    return w / w.sum()


def _no_arg(name: str, arg: str | None) -> None:
    if arg is not None:
        raise InvalidArgument(f"router {name!r} takes no argument, got {name}:{arg}")


@dataclass(frozen=True, slots=True)
class RoundRobin:
    """Request ``k`` goes to replica ``k mod N`` (the paper's 8-GPU experiment)."""

    name: str = "round-robin"
    state_dependent: bool = False

    def assign(self, n: int, replicas: Sequence[ReplicaInfo], rng: np.random.Generator) -> IntArray:
        """``0, 1, …, N−1, 0, 1, …``."""
        return np.arange(n, dtype=np.int64) % len(replicas)


@dataclass(frozen=True, slots=True)
class WeightedRoundRobin:
    """Deterministic weighted round-robin with shares ``p_i`` (default ∝ μ_i).

    Replica ``i``'s ``j``-th request is due at ``(j + ½)/p_i`` on an arrival
    counter; requests go out in order of due time (smooth WRR: after ``k``
    requests replica ``i`` has received ``k·p_i`` within ``(1 + N·p_i)/2`` —
    within one when the shares are equal).
    """

    arg: str | None = None
    name: str = "weighted-rr"
    state_dependent: bool = False

    def assign(self, n: int, replicas: Sequence[ReplicaInfo], rng: np.random.Generator) -> IntArray:
        """The replicas in order of their due times."""
        p = _weights(self.arg, replicas, "mu")
        due: list[npt.NDArray[np.float64]] = []
        who: list[IntArray] = []
        for i, pi in enumerate(p):
            if pi <= 0:
                continue
            k = int(np.ceil(n * pi)) + 1
            due.append((np.arange(k) + 0.5) / pi)
            who.append(np.full(k, i, dtype=np.int64))
        d = np.concatenate(due)
        w = np.concatenate(who)
        order = np.lexsort((w, d))  # ties: lower index first, so the sequence is reproducible
        return w[order][:n].copy()


@dataclass(frozen=True, slots=True)
class RandomSplit:
    """Each request independently to replica ``i`` with probability ``p_i`` (default equal).

    This is the split ``kvstab.theory.fleet`` proves exact results for: replica
    ``i`` sees a Poisson stream of rate ``λ·p_i``.
    """

    arg: str | None = None
    name: str = "random"
    state_dependent: bool = False

    def assign(self, n: int, replicas: Sequence[ReplicaInfo], rng: np.random.Generator) -> IntArray:
        """Independent draws from the split."""
        p = _weights(self.arg, replicas, "equal")
        return rng.choice(len(replicas), size=n, p=p).astype(np.int64)


def _argmin_random(keys: npt.NDArray[np.float64], rng: np.random.Generator) -> int:
    """Index of the smallest key, ties broken uniformly at random (a fixed tie
    order would favour low indices and bias the split) by one uniform of ``rng``
    per tie: the compiled event loop (:mod:`kvstab.fleet._fleet_kernel`) draws the
    same stream, so the two loops route alike."""
    best = np.flatnonzero(keys == keys.min())
    return int(best[0] if best.size == 1 else best[int(rng.random() * best.size)])


@dataclass(frozen=True, slots=True)
class JoinShortestQueue:
    """To the replica with the fewest requests in system (waiting + running)."""

    name: str = "jsq"
    state_dependent: bool = True

    def choose(self, states: Sequence[ReplicaState], rng: np.random.Generator) -> int:
        """The least loaded replica by count."""
        return _argmin_random(np.asarray([s.in_system for s in states], dtype=np.float64), rng)


@dataclass(frozen=True, slots=True)
class LeastKV:
    """To the replica with the smallest fraction of its KV cache in use; ties by
    requests in system."""

    name: str = "least-kv"
    state_dependent: bool = True

    def choose(self, states: Sequence[ReplicaState], rng: np.random.Generator) -> int:
        """The replica with the most free KV (as a fraction of ``M_i``)."""
        frac = np.asarray([s.kv_in_use / s.info.M for s in states], dtype=np.float64)
        # a replica with a queue is fuller than its KV says: break ties (and an idle KV
        # behind a waiting queue) by the count in system
        count = np.asarray([s.in_system for s in states], dtype=np.float64)
        return _argmin_random(frac + count * 1e-9, rng)


@dataclass(frozen=True, slots=True)
class PowerOfD:
    """Sample ``d`` distinct replicas uniformly; join the shortest of them (default ``d = 2``)."""

    arg: str | None = None
    name: str = "power-of-d"
    state_dependent: bool = True

    @property
    def d(self) -> int:
        """How many replicas are sampled per request."""
        return 2 if self.arg is None else positive_int("power-of-d's d", self.arg, maximum=1 << 20)

    def choose(self, states: Sequence[ReplicaState], rng: np.random.Generator) -> int:
        """The shortest of ``d`` sampled replicas."""
        d = min(self.d, len(states))
        picked = rng.choice(len(states), size=d, replace=False)
        counts = np.asarray([states[int(i)].in_system for i in picked], dtype=np.float64)
        return int(picked[_argmin_random(counts, rng)])


@dataclass(frozen=True, slots=True)
class KVAware:
    """To the replica that would drain soonest: the outstanding load in ``E_i[g]``
    units over ``μ_i`` (:attr:`ReplicaState.predicted_drain_s`).  On a fleet with
    different ``μ_i`` it is the rate-aware JSQ: a replica twice as fast may hold
    twice the requests."""

    name: str = "kv-aware"
    state_dependent: bool = True

    def choose(self, states: Sequence[ReplicaState], rng: np.random.Generator) -> int:
        """The replica with the least predicted drain time."""
        return _argmin_random(np.asarray([s.predicted_drain_s for s in states], dtype=np.float64), rng)


# --- routers that read the prompts ------------------------------------------------------------------------
#
# A router may declare ``reads_prompts = True``: a state-dependent one is then called as
# ``choose(states, rng, request)`` with the arriving :class:`RoutedRequest`, a state-independent one as
# ``assign(n, replicas, rng, requests)`` with a :class:`PromptChains` of the whole plan.  ``reads_cache =
# True`` asks the fleet to fill each :attr:`ReplicaState.cached_tokens` (a lookup in every replica's pool per
# arrival, so only for routers that use it).  A router with state of its own across arrivals (the SGLang
# router's tree) has ``bind(replicas) -> router``: the fleet calls it once per run for a fresh instance.


class PromptChains:
    """The block-hash chains of a run's prompts (vLLM's chained hashes of full blocks,
    :meth:`kvstab.prefix.PromptSet.block_hashes`), computed :data:`STEP` requests at a time per
    block size, as routers ask for them in arrival order (memory stays bounded on long plans).
    Without prompts (``None``: every prompt its own) each chain is empty: nothing to match."""

    STEP = 4096

    def __init__(self, prompts: PromptSet | None, n: int) -> None:
        self.prompts = prompts
        self.n = n
        self._at: dict[int, tuple[int, IntArray, IntArray]] = {}

    def chain(self, i: int, block: int) -> IntArray:
        """Request ``i``'s chain for blocks of ``block`` tokens (one hash per full block of its prompt)."""
        if self.prompts is None:
            return _EMPTY
        got = self._at.get(block)
        if got is None or not got[0] <= i < got[0] + got[1].size - 1:
            start = (i // self.STEP) * self.STEP
            off, h = self.prompts.block_hashes(block, start, min(start + self.STEP, self.n))
            got = self._at[block] = (start, off, h)
        start, off, h = got
        return h[off[i - start] : off[i - start + 1]]


_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class RoutedRequest:
    """The arriving request as a prompt-reading router sees it: its index in the plan, its prompt
    length, and its prompt's block-hash chain for any block size (never its output length)."""

    index: int
    s: int
    chains: PromptChains = field(repr=False)

    def hashes(self, block: int) -> IntArray:
        """The chain of the prompt's full blocks of ``block`` tokens."""
        return self.chains.chain(self.index, block)


def _options(name: str, arg: str | None, defaults: dict[str, float]) -> dict[str, float]:
    """``key=value`` pairs of a router spec's argument over ``defaults`` (``inf`` allowed)."""
    out = dict(defaults)
    for part in (p.strip() for p in (arg or "").split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in defaults:
            raise InvalidArgument(
                f"router {name}:{arg}: {part!r} is not KEY=VALUE with KEY one of {', '.join(defaults)}"
            )
        text = value.strip()
        try:
            x = float(text)
        except ValueError:
            raise InvalidArgument(f"router {name}:{arg}: {key.strip()}={text!r} is not a number") from None
        if not (x >= 0) or (x == float("inf") and key.strip() not in _MAY_BE_INF):
            raise InvalidArgument(f"router {name}:{arg}: {key.strip()}={text} must be a finite number >= 0")
        out[key.strip()] = x
    return out


_MAY_BE_INF = frozenset({"cap", "abs"})


@dataclass(frozen=True, slots=True)
class PrefixAffinity:
    """Longest cached prefix on the replica's own pool, weighed against load in the manner of
    llm-d's scorers, among the replicas within a load cap.

    Each replica scores ``prefix·(cached_i/s) + queue·(q_max − q_i)/(q_max − q_min) + kv·(1 −
    used_i/M_i)`` (``q``: requests in system; the queue term is 1 for all when every ``q_i`` is
    equal) and the best score wins, ties at random.  These are llm-d's prefix-cache, queue and
    KV-cache-utilisation scorers, each in [0, 1], summed with weights; defaults ``prefix=3,
    queue=2, kv=2``.  ``cap=c``: a replica holding more than ``c`` requests above the least loaded
    one is not a candidate (default 64; ``cap=inf`` turns it off).  With ``queue=0,kv=0,cap=inf``
    it is pure affinity: a hot prefix's replica takes every request of it however long its queue."""

    arg: str | None = None
    name: str = "prefix-affinity"
    state_dependent: bool = True
    reads_prompts: bool = True
    reads_cache: bool = True

    @property
    def weights(self) -> dict[str, float]:
        """The weights and the cap, parsed from the spec's argument."""
        return _options(self.name, self.arg, {"prefix": 3.0, "queue": 2.0, "kv": 2.0, "cap": 64.0})

    def choose(self, states: Sequence[ReplicaState], rng: np.random.Generator, request: RoutedRequest) -> int:
        """The best-scoring replica within the cap."""
        w = self.weights
        q = np.asarray([s.in_system for s in states], dtype=np.float64)
        cached = np.asarray([s.cached_tokens for s in states], dtype=np.float64)
        kv = np.asarray([s.kv_in_use / s.info.M for s in states], dtype=np.float64)
        spread = q.max() - q.min()
        queue = np.ones_like(q) if spread == 0 else (q.max() - q) / spread
        score = w["prefix"] * cached / max(request.s, 1) + w["queue"] * queue + w["kv"] * (1.0 - kv)
        score[q > q.min() + w["cap"]] = -np.inf
        return _argmin_random(-score, rng)


def _mix(x: IntArray) -> IntArray:
    """A 64-bit finaliser (splitmix64's), so ring points and keys spread evenly."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))).view(np.int64)


@dataclass(frozen=True, slots=True)
class ConsistentHash:
    """Consistent hashing on the first ``k`` blocks of the prompt (default ``k=1`` block of ``block=16``
    tokens, vLLM's block size): the ``k``-th hash of the prompt's chain (which names its first ``k``
    blocks) is placed on a ring of ``vnodes=64`` points per replica, and the request goes to the
    next point clockwise.  State-independent: requests with the same first blocks always meet on
    one replica, whatever its load.  A prompt shorter than ``k`` blocks keys on the blocks it has;
    one without a full block (or without content) keys on its own index."""

    arg: str | None = None
    name: str = "consistent-hash"
    state_dependent: bool = False
    reads_prompts: bool = True

    @property
    def options(self) -> dict[str, float]:
        """``k``, ``block`` and ``vnodes``, parsed from the spec's argument."""
        o = _options(self.name, self.arg, {"k": 1.0, "block": 16.0, "vnodes": 64.0})
        for key in o:
            if o[key] < 1 or o[key] != int(o[key]):
                raise InvalidArgument(f"router {self.name}:{self.arg}: {key} must be a positive integer")
        return o

    def assign(self, n: int, replicas: Sequence[ReplicaInfo], rng: np.random.Generator,
               requests: PromptChains | None = None) -> IntArray:
        """The ring's replica for each request's key."""
        o = self.options
        k, block, vnodes = int(o["k"]), int(o["block"]), int(o["vnodes"])
        points = _mix(np.arange(len(replicas) * vnodes, dtype=np.int64) * 0x5851F42D4C957F2D + 1)
        owner = np.repeat(np.arange(len(replicas), dtype=np.int64), vnodes)
        order = np.argsort(points, kind="stable")
        points, owner = points[order], owner[order]
        keys = np.empty(n, dtype=np.int64)
        for i in range(n):
            chain = requests.chain(i, block) if requests is not None else _EMPTY
            keys[i] = chain[min(k, chain.size) - 1] if chain.size else ~i  # ~i: no content, spread by index
        at = np.searchsorted(points, _mix(keys), side="left") % points.size
        return owner[at]


@dataclass(slots=True)
class SglangRouter:
    """SGLang's router, cache-aware policy: an approximate prefix tree per replica of what was routed
    there, with a balance threshold.  When the fleet is imbalanced — the most loaded replica holds
    more than ``abs=32`` requests above the least and more than ``rel=1.0001`` times it — the
    request joins the least loaded; otherwise it goes to the replica whose tree matches the largest
    fraction of its prompt if that fraction exceeds ``cache=0.5``, else to the replica with the
    smallest tree.  The tree is kept at ``block=16``-token granularity (a set of chained block
    hashes is a prefix tree), each replica's capped at what its pool holds (``M_i/block`` blocks,
    least recently routed evicted first); load is requests in system."""

    arg: str | None = None
    name: str = "sglang-router"
    state_dependent: bool = True
    reads_prompts: bool = True
    trees: list[dict[int, None]] = field(default_factory=list, repr=False)

    @property
    def options(self) -> dict[str, float]:
        """``cache``, ``abs``, ``rel`` and ``block``, parsed from the spec's argument."""
        o = _options(self.name, self.arg, {"cache": 0.5, "abs": 32.0, "rel": 1.0001, "block": 16.0})
        if o["block"] < 1 or o["block"] != int(o["block"]):
            raise InvalidArgument(f"router {self.name}:{self.arg}: block must be a positive integer")
        return o

    def bind(self, replicas: Sequence[ReplicaInfo]) -> SglangRouter:
        """A fresh router with one empty tree per replica (its state lives for one run)."""
        self.options  # noqa: B018 - refuse a bad argument before the run, not at its first arrival
        return SglangRouter(self.arg, trees=[{} for _ in replicas])

    def choose(self, states: Sequence[ReplicaState], rng: np.random.Generator, request: RoutedRequest) -> int:
        """Least load when imbalanced, else the best tree match above the threshold, else the smallest tree."""
        if len(self.trees) != len(states):  # used without bind: start empty trees now
            self.trees[:] = [{} for _ in states]
        o = self.options
        block = int(o["block"])
        load = np.asarray([s.in_system for s in states], dtype=np.float64)
        chain = request.hashes(block).tolist()
        if load.max() - load.min() > o["abs"] and load.max() > o["rel"] * load.min():
            j = _argmin_random(load, rng)
        else:
            match = np.zeros(len(states))
            for i, tree in enumerate(self.trees):
                m = 0
                for h in chain:
                    if h not in tree:
                        break
                    m += 1
                match[i] = m * block / max(request.s, 1)
            if match.max() > o["cache"]:
                j = _argmin_random(-match, rng)
            else:
                j = _argmin_random(np.asarray([len(t) for t in self.trees], dtype=np.float64), rng)
        tree = self.trees[j]
        for h in chain:  # insert (or refresh) the prompt's blocks as the newest
            tree.pop(h, None)
            tree[h] = None
        limit = max(states[j].info.M // block, 1)
        while len(tree) > limit:  # least recently routed first (a dict keeps insertion order)
            del tree[next(iter(tree))]
        return j


def _parsed(router: Any, options: str) -> Any:
    """``router`` once its argument parses (a bad spec is refused when loaded, not at its first arrival)."""
    getattr(router, options)
    return router


def reads_prompts(router: Any) -> bool:
    """Whether ``router`` is handed the requests' prompts (``reads_prompts = True``)."""
    return getattr(router, "reads_prompts", False) is True


def _plain(cls: type) -> RouterFactory:
    def make(arg: str | None) -> Any:
        _no_arg(cls.name, arg)  # type: ignore[attr-defined]
        return cls()

    return make


_BUILTINS: dict[str, RouterFactory] = {
    "round-robin": _plain(RoundRobin),
    "weighted-rr": lambda arg: WeightedRoundRobin(arg),
    "random": lambda arg: RandomSplit(arg),
    "jsq": _plain(JoinShortestQueue),
    "least-kv": _plain(LeastKV),
    "power-of-d": lambda arg: PowerOfD(arg),
    "kv-aware": _plain(KVAware),
    "prefix-affinity": lambda arg: _parsed(PrefixAffinity(arg), "weights"),
    "consistent-hash": lambda arg: _parsed(ConsistentHash(arg), "options"),
    "sglang-router": lambda arg: _parsed(SglangRouter(arg), "options"),
}


def check_router_shape(obj: Any) -> str | None:
    """What is wrong with ``obj`` as a router, or ``None``."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name.strip():
        return "it needs a non-empty string attribute 'name'"
    dep = getattr(obj, "state_dependent", None)
    if not isinstance(dep, bool):
        return "it needs a bool attribute 'state_dependent'"
    method = "choose" if dep else "assign"
    if not callable(getattr(obj, method, None)):
        kind = "choose(states, rng) -> int" if dep else "assign(n, replicas, rng) -> array of replica indices"
        return f"a {'state-dependent' if dep else 'state-independent'} router needs a method {kind}"
    return None


class _Registry:
    """Router factories keyed by name; a duplicate name raises."""

    def __init__(self) -> None:
        self.factories: dict[str, RouterFactory] = dict(_BUILTINS)
        self.broken: dict[str, str] = {}

    def add(self, name: str, factory: RouterFactory) -> None:
        if name in self.factories:
            raise InvalidArgument(f"a router named {name!r} is already registered")
        if not callable(factory):
            raise InvalidArgument(f"router {name!r}: a router factory must be callable as factory(arg)")
        self.factories[name] = factory


_REGISTRY: _Registry | None = None


def _resolve(spec: str) -> Any:
    mod_name, _, attr = spec.partition(":")
    obj: Any = import_plugin(mod_name, "router")
    for part in attr.split("."):
        if not part or not hasattr(obj, part):
            raise InvalidArgument(f"module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _registry() -> _Registry:
    global _REGISTRY
    if _REGISTRY is None:
        reg = _Registry()
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                reg.add(ep.name, _resolve(ep.value))
            except Exception as exc:  # one broken package must not disable the built-ins
                reason = f"router entry point {ep.name!r} ({ep.value}) in group {ENTRY_POINT_GROUP!r}: {exc}"
                reg.broken[ep.name] = reason
                sys.stderr.write(f"kvstab: warning: skipped {reason}\n")
        _REGISTRY = reg
    return _REGISTRY


def register_router(name: str, factory: RouterFactory) -> None:
    """Register ``factory`` (called as ``factory(arg)``) under ``name``."""
    _registry().add(name, factory)


def router_names() -> list[str]:
    """The registered router names, sorted."""
    return sorted(_registry().factories)


def _build(factory: Any, arg: str | None, spec: str) -> Any:
    try:
        obj = factory(arg)
    except (InvalidArgument, KeyboardInterrupt):
        raise
    except BaseException as exc:  # a factory calling sys.exit must not end kvstab silently
        raise InvalidArgument(f"cannot build router {spec!r}: {plugin_fault(exc)}") from None
    problem = check_router_shape(obj)
    if problem is not None:
        raise InvalidArgument(f"{spec!r} is not a router: {problem}")
    return obj


def load_router(spec: str) -> Any:
    """A router from ``name[:arg]`` (registered) or ``module:attr[:arg]`` (a factory)."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidArgument(f"router spec must be a name such as round-robin, got {spec!r}")
    spec = spec.strip()
    reg = _registry()
    name, _, arg = spec.partition(":")
    if name in reg.factories:
        return _build(reg.factories[name], arg or None, spec)
    if name in reg.broken:
        raise InvalidArgument(reg.broken[name])
    if ":" in spec:
        mod_name, _, rest = spec.partition(":")
        attr, _, plug_arg = rest.partition(":")
        if attr:
            return _build(_resolve(f"{mod_name}:{attr}"), plug_arg or None, spec)
    raise InvalidArgument(f"unknown router {spec!r}; known: {', '.join(router_names())} (or module:attr)")
