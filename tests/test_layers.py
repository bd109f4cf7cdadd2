"""The house: one-way floors and no import cycle between packages.

The map is declared once, in ``pyproject.toml``: ``[tool.setuptools]
package-dir`` says which folder is installed as which part of the ``kvstab``
namespace, and ``[tool.kvstab] floors`` lists the floors lowest first.  This
test derives everything from those two tables — it copies neither — and fails
on:

- a module that imports a floor above its own, at module level or inside a
  function (a lazy import is still a dependency);
- a module no floor places;
- a cycle between packages (``kvstab.X`` for a sub-package, or a module of the
  core root), through any import, lazy ones included;
- ``docs/ARCHITECTURE.md``'s floor table saying something else than pyproject;
- a package folder that pyproject does not install.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]

#: folder → import name (pyproject's package-dir), e.g. ``theory`` → ``kvstab.theory``
PACKAGES: dict[str, str] = {folder.rstrip("/"): name for name, folder in SETUPTOOLS["package-dir"].items()}

#: ``[(floor name, [entries])]``, lowest first
FLOORS: list[tuple[str, list[str]]] = [(row[0], list(row[1:])) for row in PYPROJECT["tool"]["kvstab"]["floors"]]
FLOOR_NAMES = [name for name, _ in FLOORS]


def floor(module: str) -> int | None:
    """The floor index of ``module`` (a ``kvstab.…`` name), or ``None`` if no entry places it."""
    best: tuple[int, int] | None = None  # (length of the matching entry, floor); an exact entry beats any prefix
    for index, (_, entries) in enumerate(FLOORS):
        for entry in entries:
            if entry.startswith("="):
                if module == entry[1:]:
                    return index
                continue
            if module == entry or module.startswith(entry + "."):
                if best is None or len(entry) > best[0]:
                    best = (len(entry), index)
    return None if best is None else best[1]




def modules() -> dict[str, Path]:
    """Every module of the installed namespace, by import name (data files left out)."""
    out: dict[str, Path] = {}
    for folder, name in PACKAGES.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            if "__pycache__" in rel.parts:
                continue
            # a folder another package-dir entry maps is that package's, not this one's
            if folder == "kvstab" and rel.parts and rel.parts[0] == "data" and path.name != "__init__.py":
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([name, *parts])] = path
    return out


MODULES = modules()


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    """``(line, imported kvstab module)`` for every import in the file, nested ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # `from kvstab.cli import flags` imports the module kvstab.cli.flags; the package itself
            # counts only when a name that is not a module is taken from it
            submodules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            found += [(node.lineno, m) for m in submodules]
            if len(submodules) < len(node.names):
                found.append((node.lineno, target))
    return [(line, name) for line, name in found if name == "kvstab" or name.startswith("kvstab.")]


def _resolve(name: str) -> str:
    """The module an import refers to (``kvstab.model.tokens_held`` → ``kvstab.model``)."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def edges() -> list[tuple[str, str, str]]:
    """``(importer, imported, file:line)`` for every kvstab import in the tree."""
    out: list[tuple[str, str, str]] = []
    for module, path in sorted(MODULES.items()):
        rel = str(path.relative_to(ROOT))
        for line, target in imports(path, module):
            out.append((module, _resolve(target), f"{rel}:{line}"))
    return out


EDGES = edges()


def upward_imports() -> tuple[list[str], list[str]]:
    """Violations as ``file:line`` lines, and the modules no floor places."""
    unplaced = sorted(m for m in MODULES if floor(m) is None)
    bad = []
    for module, target, where in EDGES:
        mine, theirs = floor(module), floor(target)
        if mine is None or theirs is None or theirs <= mine:
            continue
        bad.append(f"{where}: {module} ({FLOOR_NAMES[mine]}) imports {target} ({FLOOR_NAMES[theirs]})")
    return bad, unplaced


def package_of(module: str) -> str:
    """The unit of the cycle check: ``kvstab.X`` (a sub-package, or a module of the core root)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def package_cycles(graph_edges: list[tuple[str, str, str]]) -> list[list[str]]:
    """The strongly connected groups of two or more packages (Tarjan), each with one edge per step."""
    graph: dict[str, set[str]] = {}
    for a, b, _ in graph_edges:
        pa, pb = package_of(a), package_of(b)
        if pa != pb and pa.startswith("kvstab.") and pb.startswith("kvstab."):
            graph.setdefault(pa, set()).add(pb)
            graph.setdefault(pb, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _cycle_lines(group: list[str]) -> list[str]:
    """The imports that tie one cyclic group together, as ``file:line`` lines."""
    inside = set(group)
    return [
        f"{where}: {a} imports {b}"
        for a, b, where in EDGES
        if package_of(a) in inside and package_of(b) in inside and package_of(a) != package_of(b)
    ]


def test_every_module_has_a_floor() -> None:
    _, unplaced = upward_imports()
    assert not unplaced, f"modules no entry of [tool.kvstab] floors in pyproject.toml places: {unplaced}"


def test_no_module_imports_a_floor_above_its_own() -> None:
    bad, _ = upward_imports()
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_cycle_between_packages() -> None:
    groups = package_cycles(EDGES)
    assert not groups, "import cycles between packages:\n" + "\n".join(
        f"{' <-> '.join(g)}:\n  " + "\n  ".join(_cycle_lines(g)) for g in groups
    )


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The scan is not vacuous: a function-level and a relative import are found."""
    f = tmp_path / "fake.py"
    f.write_text("def f():\n    from kvstab.theory import g\n    from .cli import main\n")
    got = [name for _, name in imports(f, "kvstab.model")]
    assert "kvstab.theory.g" in got and "kvstab.cli" in got
    assert FLOOR_NAMES[floor("kvstab.model") or 0] == "core"
    assert FLOOR_NAMES[floor("kvstab.theory.g") or 0] == "theory"
    assert floor("kvstab.cli") == FLOOR_NAMES.index("dispatcher")
    assert floor("kvstab.cli.simulate") == FLOOR_NAMES.index("commands")


def test_the_cycle_check_finds_a_lazy_cycle() -> None:
    """A cycle closed by a function-level import, through three packages, is found."""
    fake = [
        ("kvstab.engine.driver", "kvstab.lifecycles.vllm", "a.py:1"),
        ("kvstab.lifecycles.vllm", "kvstab.replay", "b.py:1"),
        ("kvstab.replay", "kvstab.engine", "c.py:9"),  # e.g. inside a function
        ("kvstab.model", "kvstab.ops", "d.py:1"),
    ]
    assert package_cycles(fake) == [["kvstab.engine", "kvstab.lifecycles", "kvstab.replay"]]


def test_commands_loaded_by_name_are_commands() -> None:
    """kvstab.cli imports its commands by string (importlib): the AST scan cannot
    see those imports, so each name must itself be a module of the commands floor."""
    from kvstab.cli import COMMANDS

    for command in COMMANDS:
        assert floor(command.module) == FLOOR_NAMES.index("commands"), command
        assert command.module in MODULES, f"{command.module} is not a module of the project"


def test_pyproject_installs_every_package_folder() -> None:
    """Each folder with an ``__init__.py`` under a mapped folder is in pyproject's ``packages``."""
    listed = set(SETUPTOOLS["packages"])
    found = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert found == listed, f"missing from packages: {sorted(found - listed)}; listed but absent: {sorted(listed - found)}"


def test_architecture_doc_states_the_same_floors() -> None:
    """docs/ARCHITECTURE.md's floor table names each floor, lowest first, with its entries."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+)\. ([^|]+?) \| ([^|]+) \|", text, flags=re.M)
    assert [(int(n), name.strip()) for n, name, _ in rows] == list(enumerate(FLOOR_NAMES)), rows
    for (_, _, cell), (_, entries) in zip(rows, FLOORS, strict=True):
        for entry in entries:
            assert f"`{entry.lstrip('=')}`" in cell, f"docs/ARCHITECTURE.md's floor row lacks `{entry.lstrip('=')}`"


def test_architecture_doc_has_a_line_per_module() -> None:
    """docs/ARCHITECTURE.md names every module of the namespace by its path, in a table row of its own."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rows = {m.group(1) for m in re.finditer(r"^\| `([^`]+\.py)` \|", text, flags=re.M)}
    paths = {str(p.relative_to(ROOT)) for m, p in MODULES.items() if not m.startswith("kvstab.props")}
    assert not paths - rows, f"modules without a row in docs/ARCHITECTURE.md: {sorted(paths - rows)}"
    assert not rows - paths, f"rows in docs/ARCHITECTURE.md for modules that do not exist: {sorted(rows - paths)}"


def test_no_module_takes_another_packages_private_names() -> None:
    """``from kvstab.X import _name`` only inside the package ``kvstab.X`` belongs to."""
    bad = []
    for module, path in sorted(MODULES.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if not node.module.startswith("kvstab.") or package_of(node.module) == package_of(module):
                continue
            for a in node.names:
                if a.name.startswith("_") and f"{node.module}.{a.name}" not in MODULES:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {module} takes {node.module}.{a.name}")
    assert not bad, "private names taken across packages:\n" + "\n".join(bad)
