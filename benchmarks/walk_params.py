"""Follow one server object through a run: the house figure of issue 24.

Traces one ``kvstab.engine.run`` (or the reference ``kvstab.simulator.simulate``)
of a small paper-style workload and counts, among the Python calls the run
makes (compiled kernels are one call each):

- **stops**: the distinct functions one of whose arguments or locals is the server object
  (``ModelParams``) or one of its values (``M``, ``ŝ``, ``B``, ``b̄``, chosen
  so no other number coincides with them);
- **modules**: the modules those functions live in;
- **returns**: a stop in a module the walk had already left (a return to it);
- **names**: the distinct local names such values go by.

The compiled kernels run as plain Python here (``NUMBA_DISABLE_JIT=1``, set
before kvstab is imported), so the walk goes through their phases too.

usage: python benchmarks/walk_params.py [--engine fast|reference] [--scheduler NAME]
"""

from __future__ import annotations

import argparse
import os
import sys
from types import FrameType
from typing import Any

#: values no request length, progress or slot of the plan below can take
M_VALUE, CHUNK_VALUE, BLOCK_VALUE = 131_071, 997, 1021


def walk(engine: str, scheduler: str) -> dict[str, Any]:
    """Run once and return the figures (see the module docstring)."""
    from kvstab.arrivals import fixed_arrivals
    from kvstab.model import ModelParams
    from kvstab.registry import load_scheduler

    params = ModelParams(M=M_VALUE, chunk=CHUNK_VALUE, block=BLOCK_VALUE)
    values = {M_VALUE, CHUNK_VALUE, BLOCK_VALUE}
    bbar = getattr(params, "bbar", None)
    plan = fixed_arrivals([(0, 700, 40), (0, 20, 3), (1, 300, 7), (3, 64, 100), (5, 9, 2)])
    rule = load_scheduler(scheduler)
    if engine == "fast":
        from kvstab.engine import run

        def go() -> None:
            run(rule, params, plan, drain=True)
    else:
        from kvstab.simulator import simulate

        def go() -> None:
            simulate(rule, params, plan, drain=True)

    go()  # warm: compile and import before tracing
    stops: list[tuple[str, str]] = []
    names: set[str] = set()

    def holds(v: object) -> bool:
        if v is params:
            return True
        if type(v) is int and v in values:
            return True
        return bbar is not None and type(v) is float and v == bbar

    def prof(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        mod = frame.f_globals.get("__name__", "?")
        if not mod.startswith("kvstab"):
            return
        hit = [k for k, v in frame.f_locals.items() if holds(v)]
        if hit:
            stops.append((mod, frame.f_code.co_name))
            names.update(hit)

    sys.setprofile(prof)
    try:
        go()
    finally:
        sys.setprofile(None)
    # each function once, in the order the run first reaches it (a slot loop repeats its stops)
    stops = list(dict.fromkeys(stops))
    seen: list[str] = []
    returns = 0
    for mod, _ in stops:
        if seen and mod != seen[-1] and mod in seen:
            returns += 1
        seen.append(mod)
    return {
        "stops": len(stops),
        "modules": len(set(m for m, _ in stops)),
        "returns": returns,
        "names": len(names),
        "module_list": sorted(set(m for m, _ in stops)),
        "name_list": sorted(names),
    }


def main() -> int:
    """Print the walk's figures."""
    os.environ["NUMBA_DISABLE_JIT"] = "1"  # before kvstab imports numba
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("fast", "reference"), default="fast")
    ap.add_argument("--scheduler", default="current-fit")
    args = ap.parse_args()
    from kvstab.errors import KvstabError

    try:
        out = walk(args.engine, args.scheduler)
    except KvstabError as exc:
        print(f"walk_params: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.engine} engine, {args.scheduler}: {out['stops']} stops in {out['modules']} modules, "
          f"{out['returns']} returns to a module already left, {out['names']} names")
    print("  modules:", ", ".join(out["module_list"]))
    print("  names:", ", ".join(out["name_list"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
