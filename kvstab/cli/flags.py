"""Command-line flags every command shares, declared once.

The server flags are derived from :class:`~kvstab.model.ModelParams`: its
fields' ``help`` metadata is the help text, its defaults are the defaults, and
:mod:`kvstab.validation` checks every value — so ``simulate``, ``check``,
``replay``, ``prove``, ``mu`` and the rest take the same flags with the same
meaning.  A command that fixes a value differently (``prove`` leaves ``M``
symbolic by default) says so through ``defaults``.

This module is part of the command-line floor: library code never imports it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, fields
from typing import Any

from kvstab import validation as v
from kvstab.errors import InvalidArgument
from kvstab.model import ModelParams

__all__ = [
    "SERVER_FLAGS",
    "MAX_BBAR",
    "arg_type",
    "add_server_arguments",
    "server_params",
    "positive_int",
    "nonneg_int",
    "positive_float",
    "fraction",
    "unit_fraction",
    "seed",
    "slots",
    "rate",
    "bbar",
    "window",
    "decide_timeout",
    "DEFAULT_DECIDE_TIMEOUT_S",
    "MIN_BBAR",
    "asked_decide_timeout",
    "decide_limit",
    "add_run_arguments",
]


def arg_type(check: Callable[..., Any], what: str, **bounds: Any) -> Callable[[str], Any]:
    """An argparse ``type=`` from a :mod:`kvstab.validation` check: the check's
    one-line message becomes argparse's error (exit 2, no traceback)."""

    def conv(text: str) -> Any:
        try:
            return check(what, text, **bounds)
        except InvalidArgument as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    conv.__name__ = what  # argparse names the type in some messages
    return conv


positive_int = arg_type(v.positive_int, "a positive integer")
nonneg_int = arg_type(v.nonneg_int, "a non-negative integer")
positive_float = arg_type(v.positive_float, "a positive number")
fraction = arg_type(v.fraction, "a fraction in [0, 1)")
unit_fraction = arg_type(v.unit_fraction, "a number in (0, 1]")
seed = arg_type(v.nonneg_int, "the seed", maximum=v.MAX_SEED)
slots = arg_type(v.positive_int, "the number of slots", maximum=v.MAX_SLOTS)
rate = arg_type(v.positive_float, "the arrival rate", maximum=v.MAX_RATE)

#: the longest batch time a command line accepts, in seconds (an hour a slot is a typo, not a server)
MAX_BBAR = 3600.0

#: the shortest batch time a command line accepts, in seconds: below it μ = M/(b̄·E[g]) and the rates
#: built on it overflow to infinity (1e-320 s made λ = inf, refused as a bad arrival rate)
MIN_BBAR = 1e-9


def _batch_time(name: str, value: object, *, maximum: float) -> float:
    b = v.positive_float(name, value, maximum=maximum)
    if b < MIN_BBAR:
        raise InvalidArgument(f"{name} must be at least {MIN_BBAR:g} s (a slot shorter than a nanosecond), got {value!r}")
    return b


#: the batch time b̄ in seconds per slot (ModelParams.bbar's flag; also sweep's and live's --bbar)
bbar = arg_type(_batch_time, "the batch time b̄", maximum=MAX_BBAR)

#: flag name, ModelParams field, argparse type of each server flag
SERVER_FLAGS: dict[str, tuple[str, Callable[[str], Any] | None]] = {
    "--M": ("M", arg_type(v.positive_int, "M (KV capacity in tokens)", maximum=v.MAX_TOKENS)),
    "--chunk": ("chunk", arg_type(v.positive_int, "the chunk ŝ", maximum=v.MAX_TOKENS)),
    "--block": ("block", arg_type(v.positive_int, "the block size B", maximum=v.MAX_TOKENS)),
    "--g": ("g", None),
    "--token-budget": ("token_budget", arg_type(v.positive_int, "the token budget", maximum=v.MAX_TOKENS)),
    "--max-num-seqs": ("max_num_seqs", arg_type(v.positive_int, "max_num_seqs", maximum=v.MAX_COUNT)),
    "--bbar": ("bbar", bbar),
    "--prefix-caching": ("prefix_caching", None),
}

#: the rules whose real engines turn prefix caching on by default (vLLM 0.33:
#: ``enable_prefix_caching = True``, ``vllm/config/cache.py:257``).  SGLang's radix cache is on by
#: default too and is modelled (``kvstab.lifecycles.sglang_radix``, ``--prefix-caching on``), but
#: ``sglang`` stays off unless asked until the commands that search λ* (audit, fleet) run it
CACHING_BY_DEFAULT = frozenset({"vllm-v1"})


def prefix_caching_for(args: argparse.Namespace, scheduler: str) -> bool:
    """``--prefix-caching on|off`` as given, else what the engine modelled defaults to:
    on for the rules in :data:`CACHING_BY_DEFAULT`, off for the paper's rules."""
    given = getattr(args, "prefix_caching", None)
    if given is None:
        return scheduler in CACHING_BY_DEFAULT
    return bool(given)


def refuse_radix_cache(name: str, caching: bool, what: str, command: str) -> None:
    """Refuse, before any work, a ``command`` that would run ``sglang`` with prefix caching where
    the layer behind it models only vLLM's block pool (the proofs' encoding of shared blocks,
    and the audit built on them).  ``simulate``, ``compare`` and ``fleet`` run SGLang's radix
    cache itself (:mod:`kvstab.lifecycles.sglang_radix`) and do not call this."""
    if caching and name == "sglang":
        raise InvalidArgument(
            f"--prefix-caching on: {what} is sglang, and kvstab {command} models vLLM's block pool, not SGLang's "
            "radix cache (kvstab simulate and kvstab empirical compare --sglang run the radix cache); "
            "pass --prefix-caching off, or leave sglang out"
        )


def add_server_arguments(
    p: argparse.ArgumentParser,
    *,
    defaults: Mapping[str, Any] | None = None,
    required: Iterable[str] = (),
    omit: Iterable[str] = (),
    caching: bool = False,
) -> None:
    """Add the server flags (``--M --chunk --block --g --token-budget
    --max-num-seqs --bbar --prefix-caching``, one per :class:`ModelParams` field) to ``p``.

    ``defaults`` overrides a field's default by field name (e.g. ``{"M": None}``
    for a symbolic ``M``); ``required`` names fields that must be given;
    ``omit`` names fields the command does not take.  ``--prefix-caching`` is
    added only with ``caching`` (the commands whose runs carry the cache); its
    default is "as the engine modelled" (:func:`prefix_caching_for`).
    """
    overrides = dict(defaults or {})
    need = set(required)
    skip = set(omit) | (set() if caching else {"prefix_caching"})
    by_name = {f.name: f for f in fields(ModelParams)}
    for flag, (field_name, kind) in SERVER_FLAGS.items():
        if field_name in skip:
            continue
        f = by_name[field_name]
        default = overrides.get(field_name, f.default if f.default is not MISSING else None)
        help_text = str(f.metadata.get("help", ""))
        kwargs: dict[str, Any] = {"dest": field_name, "help": help_text}
        if field_name == "g":
            kwargs["choices"] = ("exact", "continuous")
        elif field_name == "prefix_caching":
            add_prefix_caching(p, follows_engine=True)
            continue
        else:
            kwargs["type"] = kind
        if field_name in need:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
            kwargs["help"] = f"{help_text} (default {default})"
        p.add_argument(flag, **kwargs)


def add_prefix_caching(p: argparse.ArgumentParser, *, follows_engine: bool) -> None:
    """``--prefix-caching on|off`` (:class:`ModelParams`' ``prefix_caching``).  With
    ``follows_engine`` its default is "as the engine modelled" (:func:`prefix_caching_for`);
    without, off (``kvstab replay``/``check``: a line printed before caching existed must
    replay as it did)."""
    help_text = ModelParams.help()["prefix_caching"]
    default = (
        f"as the engine modelled — on for {', '.join(sorted(CACHING_BY_DEFAULT))}, as vLLM's default; off for the "
        "paper's rules and sglang" if follows_engine else "off"
    )
    p.add_argument(
        "--prefix-caching", dest="prefix_caching", type=_on_off, default=None, metavar="on|off",
        help=f"{help_text} (default: {default})",
    )  # fmt: skip


def _on_off(text: str) -> bool:
    """``on`` or ``off`` (a yes/no flag that reads like vLLM's server option)."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


def server_params(args: argparse.Namespace, **override: Any) -> ModelParams:
    """The :class:`ModelParams` the parsed server flags describe (fields a
    command omitted keep ModelParams' defaults, as does ``--prefix-caching``
    left to its default: resolve it with :func:`prefix_caching_for`; ``override`` wins)."""
    kw: dict[str, Any] = {}
    for _flag, (field_name, _kind) in SERVER_FLAGS.items():
        if not hasattr(args, field_name):
            continue
        value = getattr(args, field_name)
        if field_name == "prefix_caching" and value is None:
            continue  # "as the engine modelled": the command resolves it (prefix_caching_for)
        kw[field_name] = value
    kw.update(override)
    return ModelParams(**kw)


#: the queue-head window (a count of requests)
window = arg_type(v.positive_int, "the queue window", maximum=v.MAX_COUNT)


class _DefaultLimit(float):
    """The default decide limit: a float kvstab set, told apart from one the user asked for
    (``replay`` keeps the fast engine for a built-in unless a limit was asked for)."""


#: the default limit on one call of a plug-in's ``decide`` on the command line, in seconds.
#: Measured on the reference engine at 1.5·μ, paper-1:1, M = 131000, ŝ = 512 (the suite's
#: workload): the built-ins' slowest call is lookahead's, 74 ms (the others ≤ 8.3 ms); 60 s is
#: about 800 times that, so a plug-in of that cost is far from it while one that never returns
#: ends within a minute with one line instead of hanging.  The built-ins run with no default
#: limit: lookahead's reference-engine step grows steeply with the active set (44 s with 309
#: requests of ≤ 16 tokens at M = 8000), so no fixed limit fits them all, and they are kvstab's
#: own code (see docs/scheduler-contract.md).
DEFAULT_DECIDE_TIMEOUT_S = _DefaultLimit(60.0)


def _limit_or_none(name: str, value: object, *, maximum: float) -> float | None:
    limit = v.nonneg_float(name, value, maximum=maximum)
    return None if limit == 0 else limit  # 0: no limit


#: a per-decision wall-clock limit in seconds (0: none)
decide_timeout = arg_type(_limit_or_none, "the decide timeout", maximum=86_400.0)


def decide_limit(args: argparse.Namespace, scheduler: object) -> float | None:
    """The limit on each call of ``scheduler``'s ``decide``: ``--decide-timeout`` as given
    (0: none); by default :data:`DEFAULT_DECIDE_TIMEOUT_S` for a plug-in and none for a
    built-in (kvstab's own rules, whose cost grows with the state, not a hang)."""
    limit = getattr(args, "decide_timeout", None)
    if isinstance(limit, _DefaultLimit) and type(scheduler).__module__.startswith("kvstab.schedulers."):
        return None
    return None if limit is None else float(limit)


def asked_decide_timeout(args: argparse.Namespace) -> float | None:
    """The ``--decide-timeout`` the user gave (``None`` for the default or 0)."""
    limit = getattr(args, "decide_timeout", None)
    return None if limit is None or isinstance(limit, _DefaultLimit) else float(limit)


def add_run_arguments(
    p: argparse.ArgumentParser, *, scheduler_default: str | None = None, timeout: bool = True
) -> None:
    """The flags that say how a scheduler is run, shared by every command that
    runs one: ``--scheduler`` (required unless ``scheduler_default``),
    ``--window`` (the queue-head window the engine shows the rule first) and
    ``--decide-timeout`` (a wall-clock limit on each call of ``decide``)."""
    from kvstab.model import DEFAULT_WINDOW

    if scheduler_default is None:
        p.add_argument("--scheduler", required=True, help="registered name or module:attr")
    else:
        p.add_argument(
            "--scheduler", default=scheduler_default, help=f"registered name or module:attr (default {scheduler_default})"
        )
    p.add_argument(
        "--window",
        type=window,
        default=DEFAULT_WINDOW,
        help=f"queue-head window shown to the rule first; it doubles while the rule admits all it sees "
        f"(default {DEFAULT_WINDOW})",
    )
    if not timeout:
        return
    p.add_argument(
        "--decide-timeout",
        type=decide_timeout,
        default=DEFAULT_DECIDE_TIMEOUT_S,
        metavar="S",
        help=f"fail if one call of the scheduler's decide takes longer than S seconds (default "
        f"{DEFAULT_DECIDE_TIMEOUT_S:g} for a plug-in, none for a built-in; 0: no limit)",
    )
