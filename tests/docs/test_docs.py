"""The README and the manual in docs/ say what the code does (issue 24).

* Every relative link (and image) in ``README.md`` and ``docs/**/*.md`` resolves to a file,
  and a ``#anchor`` to a heading of that file; every page under ``docs/`` is linked from
  another page. Every repository path given in backticks exists, and every ``kvtier.*`` name
  imports under that name.
* Fenced blocks marked ``runnable`` (the convention is stated in ``docs/README.md``) run:
  ``sh`` blocks exit 0 in a scratch directory, with this venv's ``bin`` first on ``PATH``;
  ``json`` blocks parse as kvtier configurations and pass ``kvtier config check``.
* ``docs/configuration.md`` has a row for every field of every configuration dataclass (found
  from ``TieringConfig`` and the registered tier types, ``TIER_CONFIGS``) with the field's
  default, type and range, and no row for a key the code does not have.
* The README stays short and begins with ``make bench`` and ``make test``.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import pytest

import kvtier.config
from kvtier.config import TieringConfig

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
CONFIGURATION = DOCS / "configuration.md"
#: Where a tier entry marked ``json runnable tier`` is checked.
TIER_WRAPPER = {"cpu_bytes_to_use": 1 << 30, "secondary_tiers": []}
BLOCK_TIMEOUT_S = 60
MIN_RUNNABLE_BLOCKS = 12
README_MAX_LINES = 300


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


# -- Markdown: fences, headings, links ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    words: tuple[str, ...]  # the info string's other words
    text: str

    @property
    def where(self) -> str:
        return f"{name(self.page)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return "runnable" in self.words

    def attribute(self, key: str) -> str | None:
        for word in self.words:
            if word.startswith(f"{key}="):
                return word.partition("=")[2]
        return None


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page``, in order."""
    found, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, info = opening.groups()
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        words = info.split()
        language = words[0] if words else ""
        found.append(Block(page, i + 1, language, tuple(words[1:]), "\n".join(body) + "\n"))
        i = j + 1
    return found


def prose(page: Path) -> str:
    """``page`` without its fenced blocks and code spans (links there are not links)."""
    text, kept, inside = page.read_text().splitlines(), [], None
    for line in text:
        opening = FENCE.match(line)
        if inside is None and opening:
            inside = opening.group(2)
        elif inside is not None and line.strip().startswith(inside):
            inside = None
        elif inside is None:
            kept.append(re.sub(r"`[^`]*`", "``", line))
    return "\n".join(kept)


def headings(page: Path) -> list[tuple[int, str]]:
    """(level, text) of every heading outside fenced blocks."""
    found = []
    for line in prose_lines_keeping_code(page):
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if match:
            found.append((len(match.group(1)), match.group(2)))
    return found


def prose_lines_keeping_code(page: Path) -> list[str]:
    kept, inside = [], None
    for line in page.read_text().splitlines():
        opening = FENCE.match(line)
        if inside is None and opening:
            inside = opening.group(2)
        elif inside is not None and line.strip().startswith(inside):
            inside = None
        elif inside is None:
            kept.append(line)
    return kept


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for _, text in headings(page):
        base = slug(text)
        count = seen.get(base, 0)
        result.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return result


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page))


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.IGNORECASE)


def resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = target.partition("#")
    return (page.parent / path).resolve() if path else page, anchor


# -- links -------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", pages(), ids=name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if not relative(target):
            continue
        path, anchor = resolve(page, target)
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (path.suffix != ".md" or anchor not in anchors(path)):
            broken.append(f"{target}: no heading with anchor #{anchor} in {name(path)}")
    assert not broken, f"{name(page)}: broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_another_page() -> None:
    linked = {
        resolve(page, target)[0] for page in pages() for target in links(page) if relative(target)
    }
    orphans = [name(p) for p in DOCS.rglob("*.md") if p.resolve() not in linked]
    assert not orphans, f"pages no other page links to: {orphans}"


def test_the_link_checker_sees_links_and_anchors(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A `title`: here\n\n[one](other.md#part-two) ![img](pic.png) `[no](code.md)`\n\n"
        "```sh\n[no](fenced.md)\n```\n"
    )
    (tmp_path / "other.md").write_text("## Part two\n")
    assert links(page) == ["other.md#part-two", "pic.png"]
    assert anchors(page) == {"a-title-here"}
    assert anchors(tmp_path / "other.md") == {"part-two"}


REPO_PATH = re.compile(r"`((?:tests|benchmarks|examples|docs|src)/[\w./-]*)`")
DOTTED = re.compile(r"`(kvtier(?:\.[A-Za-z_]\w*)+)")
FILE_SUFFIXES = {"json", "jsonl", "md", "py", "png"}


def named_paths(page: Path) -> list[str]:
    return REPO_PATH.findall(page.read_text())


def named_objects(page: Path) -> list[str]:
    names = DOTTED.findall(page.read_text())
    return [n for n in names if n.rpartition(".")[2] not in FILE_SUFFIXES]


def resolve_object(dotted: str) -> str | None:
    """``None`` if ``dotted`` names a module of kvtier under its own name (not an old name kept
    for compatibility), or an attribute of one; else why not."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        if found.__name__ != module_name:
            return f"{module_name} is an old name of {found.__name__}"
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return f"{module_name} has no {'.'.join(parts[cut:])}"
            found = getattr(found, attribute)
        return None
    return "no such module"


@pytest.mark.parametrize("page", pages(), ids=name)
def test_every_path_and_kvtier_name_the_docs_give_exists(page: Path) -> None:
    problems = [f"{p}: no such file" for p in named_paths(page) if not (REPO / p).exists()]
    for dotted in named_objects(page):
        problem = resolve_object(dotted)
        if problem:
            problems.append(f"{dotted}: {problem}")
    assert not problems, f"{name(page)}:\n" + "\n".join(problems)


def test_the_name_check_sees_a_stale_name() -> None:
    assert resolve_object("kvtier.config.TieringConfig") is None
    assert resolve_object("kvtier.config.NoSuchConfig") is not None
    assert resolve_object("kvtier.no_such_module") is not None


# -- runnable blocks ---------------------------------------------------------------------------

LANGUAGES = {"sh", "json"}
JSON_WORDS = {"runnable", "tier", "vllm-cpu", "vllm-cuda"}
SH_WORDS = {"runnable"}


def runnable_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.runnable]


def pages_with_runnable_blocks() -> list[Path]:
    return [p for p in pages() if runnable_blocks(p)]


def test_there_are_runnable_blocks_to_test() -> None:
    count = sum(len(runnable_blocks(p)) for p in pages())
    assert count >= MIN_RUNNABLE_BLOCKS, f"only {count} runnable blocks in the docs"


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["MPLBACKEND"] = "Agg"
    env.pop("PYTHONPATH", None)
    return env


def run(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        env=environment(),
        timeout=BLOCK_TIMEOUT_S,
    )


def check_block(block: Block, scratch: Path) -> None:
    """Run or check one runnable block; an ``AssertionError`` says where and why it failed."""
    allowed = {"sh": SH_WORDS, "json": JSON_WORDS}.get(block.language)
    assert allowed is not None, f"{block.where}: runnable {block.language!r} blocks are not run"
    unknown = [w for w in block.words if w not in allowed and not w.startswith("file=")]
    assert not unknown, f"{block.where}: unknown words in the info string: {unknown}"
    target = block.attribute("file")
    if target is not None:
        (scratch / target).write_text(block.text)
    if block.language == "sh":
        result = run(["bash", "-e", "-o", "pipefail", "-s"], scratch, block.text)
        assert result.returncode == 0, f"{block.where}: exit {result.returncode}\n{result.stderr}"
    else:
        check_json(block, scratch)


def check_json(block: Block, scratch: Path) -> None:
    try:
        data = json.loads(block.text)
    except ValueError as exc:
        raise AssertionError(f"{block.where}: not JSON: {exc}") from None
    targets = [w for w in block.words if w.startswith("vllm-")]
    if "tier" in block.words:
        data = {**TIER_WRAPPER, "secondary_tiers": [data]}
    if not targets:
        try:
            TieringConfig.from_json(json.dumps(data))
        except Exception as exc:
            raise AssertionError(f"{block.where}: not a kvtier configuration: {exc}") from None
    path = scratch / f".block-{block.line}.json"
    path.write_text(json.dumps(data))
    mode = ["--as", "vllm", "--target", targets[0]] if targets else ["--as", "kvtier"]
    result = run(["kvtier", "config", "check", *mode, str(path)], scratch)
    assert result.returncode == 0, f"{block.where}: kvtier config check:\n{result.stderr}"


@pytest.mark.parametrize("page", pages_with_runnable_blocks(), ids=name)
def test_runnable_blocks_run(page: Path, tmp_path: Path) -> None:
    """A page's blocks run in order in one scratch directory (later ones use earlier files)."""
    for block in runnable_blocks(page):
        check_block(block, tmp_path)


def planted(tmp_path: Path, text: str) -> Block:
    page = tmp_path / "planted.md"
    page.write_text(text)
    (block,) = runnable_blocks(page)
    return block


@pytest.mark.parametrize(
    "text",
    [
        '```json runnable\n{"cpu_bytes_to_use": 1073741824, "secondary_tierz": []}\n```\n',
        '```json runnable tier\n{"type": "fs", "root_dir": "/tmp/x", "n_read_threads": 0}\n```\n',
        '```json runnable\n{"cpu_bytes_to_use": 1073741824,\n```\n',
        '```json runnable vllm-cpu\n{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",'
        ' "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",'
        ' "cpu_bytes_to_use": 1073741824}}\n```\n',
        "```sh runnable\nkvtier config check missing.json\n```\n",
        "```sh runnable\nfalse\necho never reached\n```\n",
        "```python runnable\nprint(1)\n```\n",
        "```sh runnable quick\ntrue\n```\n",
    ],
    ids=[
        "unknown-key",
        "bad-tier",
        "not-json",
        "vllm-spec-on-cpu",
        "exit-2",
        "set-e",
        "python",
        "unknown-word",
    ],
)
def test_a_bad_runnable_block_fails(tmp_path: Path, text: str) -> None:
    with pytest.raises(AssertionError):
        check_block(planted(tmp_path, text), tmp_path)


def test_a_good_runnable_block_passes_and_leaves_its_file(tmp_path: Path) -> None:
    entry = '{"type": "fs", "root_dir": "/tmp/kvtier-docs-test"}'
    check_block(planted(tmp_path, f"```json runnable tier file=t.json\n{entry}\n```\n"), tmp_path)
    assert json.loads((tmp_path / "t.json").read_text())["type"] == "fs"
    check_block(
        planted(tmp_path, "```sh runnable\ntest -f t.json && kvtier --version\n```\n"), tmp_path
    )


# -- the configuration page against the config dataclasses -------------------------------------


def strip_annotated(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    if typing.get_origin(hint) is Annotated:
        return hint.__origin__, tuple(hint.__metadata__)
    return hint, ()


def optional_inner(hint: Any) -> Any:
    """``X`` of ``X | None`` (``hint`` itself otherwise)."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint


def dataclasses_in(hint: Any) -> Iterator[type[Any]]:
    """The dataclasses a field's type refers to (through optionals, tuples, unions)."""
    hint, _ = strip_annotated(hint)
    if dataclasses.is_dataclass(hint):
        yield hint  # type: ignore[misc]
    for arg in typing.get_args(hint):
        if arg is not Ellipsis:
            yield from dataclasses_in(arg)


@dataclasses.dataclass(frozen=True)
class Documented:
    """A config dataclass, and the heading word that marks its section in the page."""

    cls: type[Any]
    marker: str


def config_classes() -> list[Documented]:
    """Every configuration dataclass: ``TieringConfig``, each registered tier type's
    (``TIER_CONFIGS``), a tier of your own's (``ExternalTierConfig``), and every dataclass their
    fields hold, found by walking the field types.

    A class with a ``type_name`` (a tier entry) is documented under the heading that names its
    ``type`` (``module_path`` for a tier of your own); a nested object under the heading that
    names the key holding it.
    """
    seeds = [*kvtier.config.TIER_CONFIGS.values(), kvtier.config.ExternalTierConfig]
    found: dict[type[Any], str] = {TieringConfig: "Top-level keys"}
    found |= {cls: f"`{getattr(cls, 'type_name', 'module_path')}`" for cls in seeds}
    queue = list(found)
    while queue:
        cls = queue.pop(0)
        hints = typing.get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            for inner in dataclasses_in(hints[f.name]):
                if inner not in found:
                    found[inner] = f"`{getattr(inner, 'type_name', f.name)}`"
                    queue.append(inner)
    return [Documented(cls, marker) for cls, marker in found.items()]


def sections(page: Path) -> list[tuple[str, list[str]]]:
    """(heading, lines up to the next heading of any level) for every heading of ``page``."""
    result: list[tuple[str, list[str]]] = []
    for line in prose_lines_keeping_code(page):
        match = re.match(r"^#{1,6}\s+(.*)$", line)
        if match:
            result.append((match.group(1), []))
        elif result:
            result[-1][1].append(line)
    return result


def section_of(doc: Documented, page: Path) -> list[str]:
    matches = [lines for heading, lines in sections(page) if doc.marker in heading]
    assert len(matches) == 1, (
        f"{name(page)}: expected one heading naming {doc.marker} for {doc.cls.__name__}, "
        f"found {len(matches)}"
    )
    return matches[0]


def rows(lines: list[str]) -> dict[str, list[str]]:
    """Table rows by the key in their first cell: ``| `key` | type | default | meaning |``."""
    found = {}
    for line in lines:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        keys = re.findall(r"`([^`]+)`", cells[0]) if cells else []
        if len(cells) >= 4 and keys:
            assert len(keys) == 1, f"one key per row: {line}"
            found[keys[0]] = cells
    return found


def number_words(value: float) -> set[str]:
    words = {repr(value), str(value)}
    if float(value).is_integer():
        n = int(value)
        words |= {str(n), f"{n:,}"}
        for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
            if n and n % (1 << shift) == 0:
                words.add(f"{n >> shift} {unit}")
                break
    return words


def default_words(f: dataclasses.Field[Any]) -> set[str] | None:
    """What the default cell may say; ``None`` when any "off" word will do."""
    if f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
        if dataclasses.is_dataclass(default):  # its own table gives each field's default
            return {f"(#{f.name})"}
        return {json.dumps(default)}
    value = f.default
    if value is dataclasses.MISSING:
        return {"required"}
    if value is None:
        return None
    if isinstance(value, bool):
        return {f"`{json.dumps(value)}`"}
    if isinstance(value, str):
        return {f"`{value}`", f'`"{value}"`'}
    if isinstance(value, tuple):
        return {f"`{json.dumps(list(value))}`", json.dumps(list(value))}
    return number_words(value)


def has_word(cell: str, word: str) -> bool:
    return re.search(rf"(?<![\w.,]){re.escape(word)}(?![\w]|\.\d|,\d)", cell) is not None


def type_problems(hint: Any, type_cell: str) -> list[str]:
    bare, marks = strip_annotated(optional_inner(hint))
    bare, more = strip_annotated(bare)
    marks += more
    problems = []
    origin = typing.get_origin(bare)
    if origin is Literal:
        problems += [f"no `{v}`" for v in typing.get_args(bare) if f"`{v}`" not in type_cell]
    else:
        word = {bool: "boolean", int: "integer", float: "number", str: "string", tuple: "list"}
        expected = word.get(origin or bare, "object")
        if expected not in type_cell:
            problems.append(f"type {expected!r} not named")
    for mark in marks:
        low, high = getattr(mark, "low", None), getattr(mark, "high", None)
        if low is None or high is None or high > 1_000_000:
            continue  # an unbounded count: "integer" says it
        for end in (low, high):
            if not any(has_word(type_cell, w) for w in number_words(end)):
                problems.append(f"range end {end} not stated")
    return problems


def field_problems(doc: Documented, page: Path) -> list[str]:
    table = rows(section_of(doc, page))
    hints = typing.get_type_hints(doc.cls, include_extras=True)
    fields = [f for f in dataclasses.fields(doc.cls) if f.init]
    problems = []
    for f in fields:
        cells = table.get(f.name)
        if cells is None:
            problems.append(f"{f.name}: no row")
            continue
        _, type_cell, default_cell = cells[:3]
        expected = default_words(f)
        if expected is None:
            if not default_cell:
                problems.append(f"{f.name}: empty default")
        elif not any(has_word(default_cell, w) for w in expected):
            problems.append(f"{f.name}: default {default_cell!r}, code has {sorted(expected)}")
        problems += [f"{f.name}: {p}" for p in type_problems(hints[f.name], type_cell)]
    known = {f.name for f in fields}
    problems += [f"{key}: a row, but no such field" for key in table if key not in known]
    return problems


@pytest.mark.parametrize("doc", config_classes(), ids=lambda d: d.cls.__name__)
def test_the_configuration_page_documents_every_field(doc: Documented) -> None:
    problems = field_problems(doc, CONFIGURATION)
    assert not problems, f"{doc.cls.__name__} in {name(CONFIGURATION)}:\n" + "\n".join(problems)


def test_the_field_walk_finds_the_nested_and_tier_classes() -> None:
    found = {d.cls.__name__ for d in config_classes()}
    assert {"TieringConfig", "ServeConfig", "KVEventsConfig", "SLOGuardConfig"} <= found
    assert {"AdmissionConfig", "PeerAddress", "ExternalTierConfig"} <= found
    markers = {d.marker for d in config_classes()}
    assert {"`memory`", "`fs`", "`obj`", "`p2p`", "`fault`", "`module_path`"} <= markers


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        (
            "| `hwm` | integer, 1\u20132147483647 | 100000 |",
            "| `hwm` | integer, 1\u20132147483647 | 1000 |",
            "hwm: default",
        ),
        ("| `publisher` | `zmq` |", "| `publisher` | string |", "publisher: no `zmq`"),
        ("| `hwm` |", "| `high_water_mark` |", "hwm: no row"),
        ("| `hwm` |", "| `high_water_mark` |", "high_water_mark: a row, but no such field"),
        ("| `endpoint` | string, endpoint |", "| `endpoint` | text |", "endpoint: type 'string'"),
    ],
)
def test_the_field_check_fails_on_a_wrong_page(
    tmp_path: Path, old: str, new: str, problem: str
) -> None:
    (doc,) = [d for d in config_classes() if d.marker == "`kv_events`"]
    text = "\n".join(section_of(doc, CONFIGURATION))
    assert old in text
    page = tmp_path / "configuration.md"
    page.write_text(f"### `kv_events`\n{text.replace(old, new)}")
    assert any(p.startswith(problem) for p in field_problems(doc, page))


def test_the_range_check_fails_when_a_range_is_not_stated(tmp_path: Path) -> None:
    (doc,) = [d for d in config_classes() if d.marker == "`serve`"]
    text = "\n".join(section_of(doc, CONFIGURATION))
    page = tmp_path / "configuration.md"
    page.write_text("### `serve`\n" + text.replace("integer, 1\u201365535", "integer"))
    assert "port: range end 65535 not stated" in field_problems(doc, page)


# -- the README --------------------------------------------------------------------------------


def test_the_readme_is_short() -> None:
    count = len(README.read_text().splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines"


def test_the_readme_begins_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert lines[0].startswith("# "), "the README starts with its title"
    first = blocks(README)[0]
    before = [line for line in lines[1 : first.line - 1] if line.strip()]
    assert not before, f"text before the first block: {before}"
    commands = [line.split("#")[0].split() for line in first.text.splitlines()]
    assert first.language == "sh" and commands == [["make", "bench"], ["make", "test"]]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^bench:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
