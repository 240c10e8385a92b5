"""The package's import rules (docs/architecture.md), read from the source with ``ast``.

* no import cycle, counting every import: module-level, lazy (inside a function) and
  ``if TYPE_CHECKING:`` ones;
* tiers import only the vocabulary below them (``TIER_ALLOWED``): never the manager's side,
  the operator's controls, the command line or anything that serves HTTP;
* policies import nothing that does I/O (only keys, errors and the standard library's pure parts);
* the core imports neither torch nor transformers at import time: only ``device/``, the engine
  integrations and the bench may, so ``import kvtier`` works without them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "kvtier"

#: What a tier may import from the rest of the package: the words every part uses. Everything
#: else (``core``, ``control``, ``cli``, ``bench``, ``plan``, ``integrations``, the HTTP
#: endpoint) sits above the tiers; a tier importing it would call back up.
TIER_ALLOWED = (
    "kvtier.tiers", "kvtier.config.checks", "kvtier.config.addresses",
    "kvtier.config.file_modes", "kvtier.config.parser",
    "kvtier.errors", "kvtier.identity", "kvtier.keys", "kvtier.region", "kvtier.layout",
    "kvtier.telemetry.logs", "kvtier.telemetry.metrics",
)  # fmt: skip
#: Modules that serve or speak HTTP: no tier reaches them, even through another module.
HTTP = ("kvtier.telemetry.endpoint", "kvtier.control.admin", "wsgiref", "http", "urllib.request")
#: Where importing torch (or transformers) at import time is allowed.
TORCH_ALLOWED = ("kvtier.device", "kvtier.integrations", "kvtier.bench")
#: What a policy may import.
POLICY_ALLOWED = (
    "kvtier.policies", "kvtier.keys", "kvtier.errors", "__future__", "collections", "numbers",
    "typing", "dataclasses", "abc", "enum", "math", "itertools", "functools", "heapq",
)  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, *, top_level_only: bool) -> Iterator[str]:
    """Modules ``path`` imports; ``top_level_only``: those run when it is imported."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else None
    yield from _walk(tree.body if top_level_only else list(ast.walk(tree)), package, top_level_only)


def _walk(nodes: list[ast.AST], package: str | None, top_only: bool) -> Iterator[str]:
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield from _from(node, package)
        elif top_only and isinstance(node, ast.If) and not _is_type_checking(node):
            yield from _walk([*node.body, *node.orelse], package, top_only)
        elif top_only and isinstance(node, ast.Try):
            yield from _walk([*node.body, *node.finalbody], package, top_only)


def _from(node: ast.ImportFrom, package: str | None) -> Iterator[str]:
    base = node.module or ""
    if node.level and package is not None:
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
    yield base
    for alias in node.names:  # ``from kvtier.tiers import fs`` imports a module too
        yield f"{base}.{alias.name}"


def known(names: Iterator[str], universe: dict[str, Path]) -> set[str]:
    return {name for name in names if name in universe}


def graph(*, top_level_only: bool = False) -> dict[str, set[str]]:
    """Each module's imports within the package (every import, unless ``top_level_only``)."""
    universe = modules()
    return {
        name: known(imports(path, top_level_only=top_level_only), universe) - {name}
        for name, path in universe.items()
    }


def every_import(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, ``TYPE_CHECKING`` blocks and function bodies included."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield from _from(node, package)


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``edges``, or ``None``."""
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if nxt.startswith(node + "."):
                continue  # a package importing its own submodules is not a cycle
            if state.get(nxt) == 1:
                raise _Cycle([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    try:
        for start in sorted(edges):
            if start not in state:
                visit(start, [start])
    except _Cycle as cycle:
        return cycle.path
    return None


class _Cycle(Exception):
    def __init__(self, path: list[str]) -> None:
        self.path = path


def test_no_import_cycle_counting_lazy_and_type_checking_imports():
    edges = {
        name: known(every_import(path), modules()) - {name} for name, path in modules().items()
    }
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_sees_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert find_cycle({"p": {"p.x"}, "p.x": {"p"}}) is None  # a package and its own submodule


def test_tiers_import_only_what_lies_below_them():
    universe = modules()
    offenders = [
        f"{name} imports {target}"
        for name, path in universe.items()
        if name.startswith("kvtier.tiers")
        for target in known(every_import(path), universe)
        if not _under(target, TIER_ALLOWED)
    ]
    assert offenders == []


def test_no_tier_reaches_http_even_through_another_module():
    universe = modules()
    reached: dict[str, set[str]] = {}

    def reach(name: str) -> set[str]:
        if name not in reached:
            reached[name] = set()
            direct = set(every_import(universe[name]))
            inside = {t for t in direct if t in universe}
            reached[name] = direct | {r for t in inside for r in reach(t)}
        return reached[name]

    offenders = [
        f"{name} reaches {target}"
        for name in universe
        if name.startswith("kvtier.tiers")
        for target in reach(name)
        if _under(target, HTTP)
    ]
    assert offenders == []


def test_policies_do_no_io():
    universe = modules()
    offenders = [
        f"{name} imports {target}"
        for name, path in universe.items()
        if name.startswith("kvtier.policies")
        for target in imports(path, top_level_only=False)
        if not _under(target, POLICY_ALLOWED)
    ]
    assert offenders == []


def test_the_core_imports_no_torch_at_import_time():
    universe = modules()
    offenders = [
        f"{name} imports {target}"
        for name, path in universe.items()
        if not _under(name, TORCH_ALLOWED)
        for target in imports(path, top_level_only=True)
        if _under(target, ("torch", "transformers"))
    ]
    assert offenders == []


def test_the_rules_see_a_planted_violation(tmp_path):
    """The reader must find a lazy import inside a function, and skip TYPE_CHECKING blocks."""
    source = tmp_path / "kvtier_probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import torch\n"
        "def f():\n    from kvtier.core.manager import TieringManager\n"
    )
    tree = ast.parse(source.read_text())
    top = set(_walk(tree.body, None, True))
    everywhere = set(_walk(list(ast.walk(tree)), None, False))
    assert "torch" not in top and "kvtier.core.manager" not in top
    assert "kvtier.core.manager" in everywhere
