"""Docstrings name only what exists: a module, class, function or key named in a docstring that
the package no longer has (a module renamed or moved, say) fails here.

Two kinds of reference are checked, in every docstring of ``src/kvtier``:

* dotted paths starting with ``kvtier.`` must name a module, or a name defined in one;
* double-backquoted identifiers that look like module names (``snake_case``, or ``name.py``)
  must be a name the package's code uses somewhere: a module, a definition, an argument, an
  attribute, a key in a string. Docstrings themselves do not count as use, so a name that
  survives only in prose is caught.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from tests.test_architecture import PACKAGE, module_name, modules

DOTTED = re.compile(r"(?<![\w.])kvtier(?:\.\w+)+")
#: Names of other projects' APIs that docstrings quote (a kernel field, a torch method, a crate).
EXTERNAL = {"bytes_received", "index_copy_", "object_store"}
QUOTED = re.compile(r"``([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*(?:\.py)?)``")


def docstrings(tree: ast.AST) -> Iterator[ast.Constant]:
    """The docstring node of a module, class or function in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield value


def defined_names(tree: ast.AST) -> set[str]:
    """Names a module defines at its top level (what ``module.name`` may refer to)."""
    names: set[str] = set()
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def used_words(tree: ast.AST, skip: set[int]) -> set[str]:
    """Every identifier the code uses, and every word of its string literals (not docstrings)."""
    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            words.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            words.add(node.name)
        elif isinstance(node, ast.alias):
            words |= set(node.name.split(".")) | {node.asname or ""}
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
        ):
            words |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.value))
    return words


def _imported(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


class Package:
    """What ``src/kvtier`` defines and uses, read once."""

    def __init__(self, root: Path = PACKAGE) -> None:
        self.paths = modules()
        self.trees = {
            name: ast.parse(path.read_text(), str(path)) for name, path in self.paths.items()
        }
        self.defined = {name: defined_names(tree) for name, tree in self.trees.items()}
        self.words: set[str] = {part for name in self.paths for part in name.split(".")}
        self.basenames = {path.stem for path in self.paths.values()}
        self.foreign = {m.split(".")[0] for t in self.trees.values() for m in _imported(t)} - {
            "kvtier"
        }
        for tree in self.trees.values():
            skip = {id(doc) for doc in docstrings(tree)}
            self.words |= used_words(tree, skip)

    def dotted_exists(self, path: str) -> bool:
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if module in self.paths:
                rest = parts[cut:]
                return not rest or rest[0] in self.defined[module]
        return False

    def stale(self, text: str) -> list[str]:
        found = [
            p.rstrip(".") for p in DOTTED.findall(text) if not self.dotted_exists(p.rstrip("."))
        ]
        for token in QUOTED.findall(text):
            if token.startswith("kvtier."):
                continue  # checked as a dotted path above
            words = token.removesuffix(".py").split(".")
            if token.endswith(".py") and words[-1] not in self.basenames:
                found.append(token)
                continue
            if words[0] in self.foreign or token in EXTERNAL:
                continue  # another project's name (``os.makedirs``, ``vllm.config``)
            if "_" not in token and not token.endswith(".py") and len(words) == 1:
                continue  # a plain word (``name``, ``host``): prose, not a reference
            found += [token for word in words if word not in self.words]
        return found


def test_no_docstring_names_what_does_not_exist():
    package = Package()
    stale = [
        f"{module_name(package.paths[name])}:{doc.lineno}: {ref}"
        for name, tree in package.trees.items()
        if name != "kvtier._moved"  # it names the old paths on purpose
        for doc in docstrings(tree)
        for ref in package.stale(doc.value)
    ]
    assert stale == []


def test_the_check_sees_planted_stale_names():
    package = Package()
    assert package.stale("see ``kvtier.fs_paths``") == ["kvtier.fs_paths"]
    assert package.stale("``serve_holds`` keeps them") == ["serve_holds"]
    assert package.stale("``transport_guard.py``") == ["transport_guard.py"]
    assert package.stale("``host.py`` is gone, ``host_slots.py`` is not") == ["host.py"]
    assert package.stale("``kvtier.core.manager.TieringManager``, ``host_slots``") == []
    assert package.stale("``kvtier.core.manager.NoSuchThing``") == [
        "kvtier.core.manager.NoSuchThing"
    ]
