"""Every ``kvtier`` command as a newcomer meets it: ``--help``, no arguments, unknown options,
and hostile values for every option and positional argument (issue 30).

The commands are found by walking ``build_parser()``; ``TARGETS`` says how to run each one
cheaply, and ``test_every_command_has_a_target`` fails when a new command has none. Each run is
in-process (``main``), under an alarm, in its own working directory:

* ``--help`` exits 0 with the command's usage, and every option has a help text that says its
  default when it has one;
* no arguments, an unknown option or a hostile value (bad paths, a FIFO, ``/dev/zero``, a
  directory, huge numbers, NaN, empty and very long strings) ends in one of three shapes: exit 0;
  exit 1 with a ``kvtier...`` line on stderr (a runtime failure such as no answer); or exit 2
  with the command's own usage line and ``kvtier: error: ...``. Never a traceback (an
  exception out of ``main``), never a hang, and a failed run leaves no file behind.

``kvtier bench`` would run its benchmark when its input is accepted: its model loading
(``_build``, ``VllmBench``) is replaced by a stub that ends the run there, counted as accepted.
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from kvtier.cli.main import build_parser, main

#: Where the option or value under test goes in a target's argv.
HOLE = "<HOLE>"
#: Endpoints nobody answers on (port 1 is never served here).
URL, ENDPOINT = "http://127.0.0.1:1", "tcp://127.0.0.1:1"
ADMIN = ["admin", "--url", URL, "--timeout", "0.5"]

#: A cheap run of each command, with HOLE where options (or a positional) under test go.
TARGETS: dict[str, list[str]] = {
    "config check": ["config", "check", "{config}", HOLE],
    "events": ["events", "--connect", ENDPOINT, "--timeout", "0.2", HOLE],
    "bench": ["bench", "--no-progress", HOLE],
    "peer keygen": ["peer", "keygen", "--out", "keys", HOLE],
    "admin": [*ADMIN, HOLE, "tiers"],
    "admin tiers": [*ADMIN, "tiers", HOLE],
    "admin disable": [*ADMIN, "disable", "fs", HOLE],
    "admin enable": [*ADMIN, "enable", "fs", HOLE],
    "plan": ["plan", "{trace}", "--no-chart", HOLE],
    "trace synth": ["trace", "synth", "--out", "out.jsonl", "--requests", "40", HOLE],
    "trace from-events": ["trace", "from-events", "{capture}", "--out", "out.jsonl", HOLE],
    "cache ls": ["cache", "ls", "{directory}", HOLE],
    "cache du": ["cache", "du", "{directory}", HOLE],
    "cache verify": ["cache", "verify", "{directory}", "--progress", "none", HOLE],
    "cache gc": ["cache", "gc", "{directory}", "--dry-run", "--max-bytes", "0", HOLE],
}
#: Targets whose positional argument is attacked: argv with HOLE where it goes.
POSITIONALS: dict[str, list[str]] = {
    "config check": ["config", "check", HOLE],
    "admin disable": [*ADMIN, "disable", HOLE],
    "plan": ["plan", HOLE, "--no-chart"],
    "trace from-events": ["trace", "from-events", HOLE, "--out", "out.jsonl"],
    "cache ls": ["cache", "ls", HOLE],
    "cache gc": ["cache", "gc", HOLE, "--max-bytes", "0"],
}

#: Values a newcomer (or a script gone wrong) passes; ``{name}`` are paths made per test.
HOSTILE = {
    "empty": "",
    "nan": "nan",
    "inf": "inf",
    "negative": "-1",
    "zero": "0",
    "huge": "9" * 40,
    "overflow": "1e400",
    "long": "x" * 300,
    "newline": "a\nb",
    "fifo": "{fifo}",
    "dev-zero": "/dev/zero",
    "directory": "{directory}",
    "file": "{file}",
    "absent": "absent/x",
    "unmakeable": "/proc/kvtier-absent/x",
}

#: Seconds one run may take before it counts as a hang.
HANG_S = 60


class Hang(Exception):
    """A run outlived ``HANG_S``."""


class Reached(Exception):
    """The stub where ``kvtier bench`` would start its real work."""


# -- the parser's tree ------------------------------------------------------------------------
def commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser under ``kvtier`` (intermediate ones too), by its words: "peer keygen"."""

    def walk(
        words: str, parser: argparse.ArgumentParser
    ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        yield words, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(f"{words} {name}".strip(), child)

    yield from walk("", build_parser())


def is_leaf(parser: argparse.ArgumentParser) -> bool:
    return not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


PARSERS = dict(commands())


def valued_options(words: str) -> list[str]:
    """The options of command ``words`` that take a value."""
    return [
        action.option_strings[-1]
        for action in PARSERS[words]._actions
        if action.option_strings and action.nargs != 0 and action.dest != "help"
    ]


# -- running one command ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Valid inputs the targets read: a kvtier config, a trace, a KV event capture."""
    root = tmp_path_factory.mktemp("inputs")
    (root / "kv.json").write_text('{"cpu_bytes_to_use": 1073741824}')
    assert main(["trace", "synth", "--out", str(root / "trace.jsonl"), "--requests", "40"]) == 0
    stored = ["BlockStored", [1, 2, 3], None, [], 16, None, "GPU"]
    (root / "capture.msgpack").write_bytes(msgpack.packb([1.0, [stored]]))
    return {
        "config": str(root / "kv.json"),
        "trace": str(root / "trace.jsonl"),
        "capture": str(root / "capture.msgpack"),
    }


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory with a FIFO, a directory and a file to point options at; the
    benchmark stubbed where it would start."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "directory").mkdir()
    (tmp_path / "file").write_text("not what any command reads\n")
    monkeypatch.chdir(tmp_path)

    def reached(*_: object, **__: object) -> None:
        raise Reached

    monkeypatch.setattr("kvtier.bench.cli._build", reached)
    monkeypatch.setattr("kvtier.bench.vllm_bench.VllmBench", reached)
    return tmp_path


def fill(argv: list[str], inputs: dict[str, str], workdir: Path) -> list[str]:
    paths = {**inputs, **{n: str(workdir / n) for n in ("fifo", "directory", "file")}}
    return [word.format(**paths) if word.startswith("{") else word for word in argv]


def run(argv: list[str]) -> int | str:
    """``main(argv)`` under an alarm: its exit status, or "reached" (the bench stub). Output goes
    to the caller's capsys; an exception other than ``SystemExit`` fails the test (it would be
    a traceback)."""

    def alarm(*_: object) -> None:
        raise Hang(f"kvtier {' '.join(argv)[:200]} ran past {HANG_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(HANG_S)
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except Reached:
        return "reached"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def check_shape(
    argv: list[str], code: int | str, out: str, err: str, words: str, exact: bool = False
) -> None:
    """One of the three allowed shapes (see the module docstring). Exit 2 shows the usage of
    command ``words`` or of one of its subcommands, or (unless ``exact``) of a command above
    it."""
    shown = (
        f"kvtier {' '.join(argv)[:300]!r}: exit {code}\nstdout: {out[-500:]}\nstderr: {err[-1500:]}"
    )
    assert "Traceback" not in out + err, shown
    assert code in (0, 1, 2, "reached"), shown
    lines = err.rstrip("\n").splitlines()
    if code == 2:
        usage = [usage_command(line) for line in lines if line.startswith("usage: kvtier")]
        assert usage and lines[-1].startswith("kvtier: error: "), shown
        shown_words, command = usage[-1], words.split()
        below = shown_words[: len(command)] == command  # the command or one of its own
        above = command[: len(shown_words)] == shown_words  # a command on its way
        assert below or (above and not exact), shown
    elif code == 1:
        assert lines and lines[-1].startswith("kvtier"), shown


def usage_command(line: str) -> list[str]:
    """The command words of a usage line: ``usage: kvtier admin disable [-h] ...`` -> admin,
    disable."""
    words = line.split()[2:]
    end = next((i for i, w in enumerate(words) if w.startswith(("[", "-"))), len(words))
    return words[:end]


def new_files(workdir: Path, before: set[Path]) -> list[Path]:
    return [p for p in workdir.rglob("*") if p not in before and not p.is_dir()]


def attack(argv: list[str], words: str, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = set(workdir.rglob("*"))
    code = run(argv)
    captured = capsys.readouterr()
    check_shape(argv, code, captured.out, captured.err, words)
    if code not in (0, "reached"):
        assert not new_files(workdir, before), (
            f"kvtier {argv}: exit {code} left {new_files(workdir, before)}"
        )


# -- the tests ---------------------------------------------------------------------------------
def test_every_command_has_a_target():
    leaves = {words for words, parser in PARSERS.items() if words and is_leaf(parser)}
    owners = {words for words in PARSERS if words and valued_options(words)}
    assert leaves | owners <= set(TARGETS), sorted((leaves | owners) - set(TARGETS))


@pytest.mark.parametrize("words", sorted(PARSERS))
def test_help_is_for_users(words, capsys):
    argv = [*words.split(), "--help"]
    code = run(argv)
    out = capsys.readouterr().out
    assert code == 0 and out.startswith(f"usage: kvtier {words}".rstrip()), out
    assert "Traceback" not in out and "``" not in out and "UsageError" not in out
    for action in PARSERS[words]._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = action.option_strings[-1]
        assert action.help, f"kvtier {words} {flag} has no help text"
        default = action.default
        if not (default is None or default is False or default in ("", argparse.SUPPRESS)):
            text = PARSERS[words].formatter_class("kvtier")._expand_help(action)
            assert "default" in text, f"kvtier {words} {flag}: its help does not give its default"


@pytest.mark.parametrize("words", sorted(w for w in PARSERS if w))
def test_no_arguments(words, workdir, capsys):
    attack(words.split(), words, workdir, capsys)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_unknown_option(target, inputs, workdir, capsys):
    argv = fill([w if w != HOLE else "--no-such-option" for w in TARGETS[target]], inputs, workdir)
    code = run(argv)
    err = capsys.readouterr().err
    check_shape(argv, code, "", err, target, exact=True)
    assert code == 2 and "unrecognized arguments: --no-such-option" in err, err


def option_cases() -> Iterator[tuple[str, str, str]]:
    for target in sorted(TARGETS):
        for flag in valued_options(target):
            for name in HOSTILE:
                yield target, flag, name


@pytest.mark.parametrize(("target", "flag", "value"), list(option_cases()))
def test_hostile_option_values(target, flag, value, inputs, workdir, capsys):
    hostile = [flag, fill([HOSTILE[value]], inputs, workdir)[0]]
    argv = [*fill([w for w in TARGETS[target] if w != HOLE], inputs, workdir)]
    at = TARGETS[target].index(HOLE)
    argv[at:at] = hostile
    attack(argv, target, workdir, capsys)


@pytest.mark.parametrize(
    ("target", "value"), [(t, v) for t in sorted(POSITIONALS) for v in HOSTILE]
)
def test_hostile_positional_values(target, value, inputs, workdir, capsys):
    argv = fill([HOSTILE[value] if w == HOLE else w for w in POSITIONALS[target]], inputs, workdir)
    attack(argv, target, workdir, capsys)
