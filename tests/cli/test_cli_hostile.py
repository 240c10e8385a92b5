"""``kvtier config check`` and ``kvtier events`` on bad input (issue 11, items 10c and 12).

Bad input is answered argparse-style (usage, ``kvtier: error: ...``, exit status 2), never with
a traceback; ``config check`` shows what the configuration listens on and never a credential;
``kvtier events`` skips a malformed batch with a warning and goes on.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import pytest

from kvtier.cli.main import main
from kvtier.config.checks import physical_memory_bytes
from kvtier.keys import ChunkKey
from kvtier.telemetry.kv_events import EventKind, KVEvent, encode_batch

CLI = [sys.executable, "-m", "kvtier.cli"]


def write(tmp_path, data, name="kv.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def check(argv, capsys):
    """``main(argv)``: its exit status, stdout and stderr (``SystemExit`` becomes a status)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_usage_error(code, err, message):
    assert code == 2
    assert "usage: kvtier" in err and f"kvtier: error: {message}" in err, err
    assert "Traceback" not in err


def test_config_check_shows_serve_metrics_and_kv_events(tmp_path, capsys):
    serve = {
        "host": "10.0.0.1",
        "port": 5710,
        "curve_secret_key_file": "/keys/server.secret",
        "curve_client_keys_dir": "/keys/clients",
    }
    path = write(
        tmp_path,
        {
            "cpu_bytes_to_use": 1 << 30,
            "serve": serve,
            "metrics_port": 9464,
            "kv_events": {"topic": "kv"},
        },
    )
    code, out, _ = check(["config", "check", path], capsys)
    assert code == 0
    assert "tcp://10.0.0.1:5710, CURVE on (secret key /keys/server.secret" in out
    assert "metrics:         http://127.0.0.1:9464/metrics" in out
    assert "kv events:       tcp://127.0.0.1:5557 topic 'kv'" in out


def test_config_check_never_prints_credentials(tmp_path, capsys):
    tier = {
        "type": "obj",
        "bucket": "b",
        "access_key": "AKIDHIDDEN",
        "secret_key": "S3CR3T",
        "endpoint_override": "http://user:hunter2@minio:9000/?X-Amz-Signature=sig99",
    }
    path = write(tmp_path, {"cpu_bytes_to_use": 1 << 30, "secondary_tiers": [tier]})
    code, out, err = check(["config", "check", path], capsys)
    assert code == 0 and "endpoint_override=http://***@minio:9000/?***" in out
    for secret in ("AKIDHIDDEN", "S3CR3T", "hunter2", "sig99", "user:"):
        assert secret not in out + err


def test_config_check_warns_about_memory_and_exposure(tmp_path, capsys):
    physical = physical_memory_bytes()
    assert physical is not None
    data = {
        "cpu_bytes_to_use": 2 * physical,
        "serve": {"host": "0.0.0.0", "port": 5710},
        "kv_events": {"endpoint": "tcp://*:5557"},
    }
    code, out, err = check(["config", "check", write(tmp_path, data)], capsys)
    assert code == 0 and "host tier:" in out
    assert "kvtier: warning: cpu_bytes_to_use" in err and "physical memory" in err
    assert "serve listens on 0.0.0.0 without CURVE" in err
    assert "kv events are published unauthenticated on tcp://*:5557" in err


def hostile_file(tmp_path, kind):
    path = tmp_path / kind
    if kind == "binary":
        path.write_bytes(bytes(range(256)) * 64)
    elif kind == "huge":
        path.write_text('{"cpu_bytes_to_use": 1, "x": "' + "a" * (17 << 20) + '"}')
    elif kind == "nested":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("binary", "configuration file {path}: not UTF-8 text"),
        ("huge", "configuration file {path}: larger than 16 MiB"),
        ("nested", "configuration: nested deeper than 64 levels"),
        ("directory", "configuration file {path}: not a regular file"),
        ("fifo", "configuration file {path}: not a regular file"),
    ],
)
def test_config_check_on_hostile_files_is_a_usage_error(tmp_path, kind, message):
    path = hostile_file(tmp_path, kind)
    command = [*CLI, "config", "check", path]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)  # FIFO: no hang
    assert_usage_error(result.returncode, result.stderr, message.format(path=path))


@pytest.mark.parametrize(
    "argv",
    [["--num-layers", "0"], ["--head-dim", "-4"], ["--num-kv-heads", "99999999999999999999"],
     ["--engine-block-size", "x"]],
)  # fmt: skip
def test_config_check_bad_shape_is_a_usage_error(tmp_path, capsys, argv):
    path = write(tmp_path, {"cpu_bytes_to_use": 1 << 30})
    code, _, err = check(["config", "check", path, *argv], capsys)
    assert_usage_error(code, err, f"argument {argv[0]}:")


def test_config_check_error_in_the_config_is_a_usage_error(tmp_path, capsys):
    path = write(tmp_path, {"cpu_bytes_to_use": 1, "serve": {"port": 70000}})
    code, _, err = check(["config", "check", path], capsys)
    assert_usage_error(code, err, "serve.port: expected a TCP port from 1 to 65535, got 70000")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--connect", "tcp://nonsense:x"], "argument --connect: expected tcp://HOST:PORT"),
        (["--connect", "tcp://*:5557"], "argument --connect: expected tcp://HOST:PORT"),
        (["--connect", "tcp://127.0.0.1:1", "--timeout", "nan"], "argument --timeout:"),
        (["--connect", "tcp://127.0.0.1:1", "--timeout", "-1"], "argument --timeout:"),
    ],
)
def test_events_bad_arguments_are_usage_errors(argv, message):
    # a process, not main(): an accepted timeout of -1 would wait forever
    result = subprocess.run([*CLI, "events", *argv], capture_output=True, text=True, timeout=120)
    assert_usage_error(result.returncode, result.stderr, message)


def read_stderr_line(proc, timeout):
    """The next line ``proc`` writes to stderr; ``AssertionError`` if none comes in time."""
    fd, line, deadline = proc.stderr.fileno(), b"", time.monotonic() + timeout
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 1) if ready else b""
        assert chunk, f"no line on stderr (got {line!r}, exit {proc.poll()})"
        line += chunk
    return line.decode()


def test_events_skips_malformed_batches_and_goes_on():
    zmq = pytest.importorskip("zmq")
    context = zmq.Context()
    publisher = context.socket(zmq.XPUB)  # an XPUB hears the subscription arrive
    publisher.setsockopt(zmq.LINGER, 0)
    publisher.bind("tcp://127.0.0.1:*")
    endpoint = publisher.getsockopt_string(zmq.LAST_ENDPOINT)
    printer = subprocess.Popen(
        [*CLI, "events", "--connect", endpoint, "--timeout", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert publisher.poll(60_000), "the subscription never arrived"
        publisher.recv()
        assert read_stderr_line(printer, 60) == f"kvtier events: subscribed to {endpoint}\n"
        key = ChunkKey(bytes(range(32)))
        good = encode_batch([KVEvent(0, EventKind.STORED, key, "accelerator", "host")], 4, 1.0)
        for frames in (
            [b"", (0).to_bytes(8, "big"), b"\xc1 not msgpack"],
            [b"", b"two"],
            [b"", b"short", good],
            [b"", (1).to_bytes(8, "big"), good],
        ):
            publisher.send_multipart(frames)
        out, err = printer.communicate(timeout=120)
    finally:
        printer.kill()
        context.destroy(linger=0)
    assert printer.returncode == 0 and b"Traceback" not in err
    (line,) = out.decode().splitlines()  # only the good batch's one event
    assert line.startswith("#0 stored") and key.hex()[:16] in line
    assert b"skipped malformed batch 0 (" in err
    assert err.count(b"kvtier events: skipped a malformed message") == 2


def test_ctrl_c_is_one_line_and_status_130_not_a_traceback(tmp_path, monkeypatch, capsys):
    """A long verify (or any command) interrupted from the keyboard ends as shells expect."""
    from kvtier.cli import cache_run

    def interrupted(*args: object, **kwargs: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cache_run.Verifier, "run", interrupted)
    (tmp_path / "kv").mkdir()
    code = main(["cache", "verify", str(tmp_path / "kv"), "--progress", "none"])
    err = capsys.readouterr().err
    assert code == 130 and err == "kvtier cache verify: interrupted\n"


def test_config_check_says_a_tcp_server_is_plain_and_warns_beyond_loopback(tmp_path, capsys):
    data = {
        "cpu_bytes_to_use": 1 << 30,
        "serve": {"host": "0.0.0.0", "port": 5710, "transport": "tcp"},
    }
    code, out, err = check(["config", "check", write(tmp_path, data)], capsys)
    assert code == 0
    assert "tcp://0.0.0.0:5710, plain TCP (unauthenticated, unencrypted)" in out
    assert "serve listens on 0.0.0.0 without CURVE" in err
