"""``kvstab schedulers``: the registered schedulers, one line each (or JSON)."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    from kvstab.contract import traits_of
    from kvstab.registry import registry

    rows = [{"name": s.name, "description": s.description, "tags": traits_of(s).tags()} for s in registry()]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            print(f"{r['name']:<{width}}  {r['description']}")
    return 0


def register(sub: Any) -> None:
    """Add ``kvstab schedulers`` to the dispatcher's sub-parsers."""
    sch = sub.add_parser("schedulers", help="list the registered schedulers")
    sch.add_argument("--json", action="store_true")
    sch.set_defaults(func=_run)
