"""Generate ``docs/api.md``, the API reference a rule author reads, from the docstrings.

usage: python scripts/gen_api.py [--check]

The page lists, module by module, the public names a scheduler author and a
user of the property suite touch: each one's signature, its docstring and,
for dataclasses, its fields with the help text their metadata carries.  The
output depends only on the source (no addresses, no timestamps), so
``tests/test_api_docs.py`` can require the committed page to be current;
``--check`` exits 1 when it is not.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"

#: (module, names, what the section is for), in reading order
SECTIONS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "kvstab.contract",
        ("View", "ActiveEntry", "WaitingEntry", "Decision", "Scheduler", "Traits", "traits_of",
         "fcfs_admit", "preempt_newest", "held_now", "held_next", "held_first", "used_now", "used_next",
         "scan", "sum_of", "count_of", "any_of", "no_preemption", "zipped", "fcfs_admit_with_grants",
         "fcfs_admit_projected", "Projected", "retract_until_fits", "pops_before", "select",
         "visible_view", "check_decision_values"),
        "What a rule sees and returns, what it claims, the helpers every built-in uses, and how engines "
        "show a rule its view (no `o` for a non-clairvoyant rule) and check its decision.",
    ),
    ("kvstab.ops", ("Ops", "CONCRETE"), "The operations a rule is written against (run concretely or by z3)."),
    ("kvstab.model", ("ModelParams", "Request", "tokens_held", "first_chunk_tokens", "progress_after"),
     "The server and the one memory-accounting function."),
    ("kvstab.simulator", ("Engine", "SlotRecord", "SimResult", "simulate"), "The reference simulator."),
    ("kvstab.arrivals", ("ArrivalPlan", "fixed_arrivals", "poisson_arrivals", "conversation_arrivals"), "Arrival plans."),
    ("kvstab.prefix", ("Prompt", "PromptSet", "block_hashes", "token_ids", "common_prefix", "content_id"),
     "Prompt content with prefix structure: segments, vLLM-style block-hash chains, token ids."),
    ("kvstab.prefix_laws", ("Shared", "Tenants", "FewShot", "Conversation"),
     "Synthetic laws of prompt content (a workload spec's ,prefix=LAW)."),
    ("kvstab.registry", ("load_scheduler", "register", "builtin_names"), "Finding schedulers by name."),
    ("kvstab.testing.checks", ("PROPERTIES", "Auditor", "audit_plan", "PropertyViolation", "margin_of"),
     "The per-slot property checks of the audit suite."),
    ("kvstab.testing.strategies", ("model_params", "request_lengths", "workloads", "arrivals", "packed_arrivals",
                           "windows", "scenarios", "saturated_scenarios", "largest_total"),
     "Hypothesis strategies for adversarial workloads (for your own tests)."),
    ("kvstab.testing.pytest_plugin", ("AuditTarget", "Budget", "BUDGETS", "budget"),
     "The pytest plugin: the scheduler under audit and the profiles' budgets."),
    ("kvstab.engine", ("run", "simulate", "Run", "Summary", "fast_rule"),
     "The fast engine: the reference model's outcomes at compiled speed, and which engine ran."),
    ("kvstab.audit", ("run_point", "Point", "PointResult", "find_critical_rate", "StabilityRegion", "get_profile"),
     "The end-to-end audit's building blocks: one simulation point and the critical rate."),
    ("kvstab.fleet", ("Replica", "simulate_fleet", "load_router", "register_router", "ReplicaState", "ReplicaInfo"),
     "Fleets and routers."),
    ("kvstab.data", ("data_dir", "trace_path", "profile_dir"), "The data shipped with kvstab."),
    ("kvstab.errors", ("KvstabError", "InvalidArgument", "InvalidScheduler", "InvariantViolation"),
     "The exceptions kvstab raises."),
)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _clean(text: str) -> str:
    """Text with object addresses removed, so the page is the same run to run."""
    return _ADDRESS.sub("", text)


def _signature(obj: Any) -> str | None:
    try:
        return _clean(str(inspect.signature(obj)))
    except (TypeError, ValueError):
        return None


def _doc(obj: Any) -> str:
    doc = inspect.getdoc(obj)
    return doc.strip() if doc else "*(no docstring)*"


def _fields(cls: type) -> list[str]:
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f"`{_clean(repr(f.default))}`"
        elif f.default_factory is not dataclasses.MISSING:
            default = "*(factory)*"
        else:
            default = "*(required)*"
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        help_text = str(f.metadata.get("help", "")).replace("|", "\\|")
        kind = kind.replace("|", "\\|")  # a union's bar would end the table cell
        rows.append(f"| `{f.name}` | `{kind}` | {default} | {help_text} |")
    return rows


def _methods(cls: type) -> list[str]:
    out = []
    for name, member in sorted(vars(cls).items()):
        if name.startswith("_") or not (inspect.isfunction(member) or isinstance(member, (staticmethod, classmethod, property))):
            continue
        fn = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        sig = "" if isinstance(member, property) else (_signature(fn) or "(…)")
        first = (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")
        out.append(f"- `{name}{sig}`" + (f" — {first}" if first else ""))
    return out


def _entry(module: str, name: str) -> list[str]:
    obj = getattr(importlib.import_module(module), name)
    lines = [f"### `{name}`", ""]
    if inspect.isclass(obj) or inspect.isfunction(obj):
        sig = _signature(obj)
        kind = "class" if inspect.isclass(obj) else "def"
        lines += ["```python", f"{kind} {name}{sig if sig is not None else ''}", "```", ""]
        lines += [_doc(obj), ""]
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
            lines += _fields(obj) + [""]
        if inspect.isclass(obj):
            methods = _methods(obj)
            if methods:
                lines += ["Methods:", ""] + methods + [""]
    else:
        kind = type(obj).__name__
        lines += [f"A `{kind}` constant.", ""]
        if isinstance(obj, dict):
            lines += ["| key | value |", "|---|---|"]
            lines += [f"| `{k}` | {_clean(str(v)).replace('|', chr(92) + '|')} |" for k, v in obj.items()] + [""]
    return lines


def render() -> str:
    """The page, as ``docs/api.md`` must hold it."""
    lines = [
        "# API reference",
        "",
        "<!-- generated by scripts/gen_api.py from the docstrings; do not edit by hand -->",
        "",
        "The public names a scheduler author and a user of the property suite touch, with",
        "their docstrings. Regenerate with `python scripts/gen_api.py` after changing one;",
        "`tests/test_api_docs.py` fails while this page is stale.",
        "",
    ]
    lines += [f"- [`{module}`](#{module.replace('.', '')})" for module, _, _ in SECTIONS] + [""]
    for module, names, what in SECTIONS:
        lines += [f"## `{module}`", "", what, ""]
        for name in names:
            lines += _entry(module, name)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    """Write the page, or with ``--check`` exit 1 if the committed one is stale."""
    text = render()
    if argv[1:] == ["--check"]:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/gen_api.py", file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print("usage: python scripts/gen_api.py [--check]", file=sys.stderr)
        return 2
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
