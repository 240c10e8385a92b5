"""An adversarial sweep of the ``kvtier`` command line: inputs that used to end in a traceback
or, for ``cache gc --every``, in the end of a sidecar that should have gone on.

Each test gives one command the input an outside user or a hostile file or server could give,
and checks the project's rule: one ``kvtier: error: ...`` line and a non-zero exit status (2
for bad input, 1 for a refusal), never a traceback. Commands run in-process through
``kvtier.cli.main.main``; the admin endpoint is a real HTTP server on loopback.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.plan.trace_read import read_trace
from tests.cache.cache_tree import FsCache, chain, make_identity
from tests.cli_run import run

HUGE = "9" * 400  # digits past a float's range: float() gives inf, int(inf) raises


def assert_error(code: int, err: str, message: str, status: int = 2) -> None:
    assert code == status, err
    assert f"kvtier: error: {message}" in err, err
    assert "Traceback" not in err


# -- config check ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["null", "5", "true", "[1]", '"kv_connector"'])
def test_config_check_as_vllm_of_json_that_is_not_an_object(tmp_path, capsys, text):
    """``--as vllm`` checked membership in whatever the file held: null, a number or a boolean
    raised TypeError; a list or a string passed for an object."""
    path = tmp_path / "kv.json"
    path.write_text(text)
    code, _, err = run(capsys, "config", "check", "--as", "vllm", str(path))
    assert_error(code, err, "configuration: expected a JSON object")


@pytest.mark.parametrize("kind", [[], {}, ["fs"]])
def test_config_check_of_a_tier_type_that_is_a_list_or_an_object(tmp_path, capsys, kind):
    """Shared configuration parsing: an unhashable ``type`` raised TypeError in the lookup."""
    path = tmp_path / "kv.json"
    data = {"cpu_bytes_to_use": 1 << 30, "secondary_tiers": [{"type": kind, "root_dir": "/x"}]}
    path.write_text(json.dumps(data))
    code, _, err = run(capsys, "config", "check", str(path))
    assert_error(code, err, "secondary_tiers[0].type: expected one of")


@pytest.mark.parametrize("name", [[], {"a": 1}])
def test_config_check_of_a_vllm_spec_name_that_is_a_list_or_an_object(tmp_path, capsys, name):
    path = tmp_path / "kv.json"
    extra = {"spec_name": name, "cpu_bytes_to_use": 1 << 30}
    data = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}
    path.write_text(json.dumps({**data, "kv_connector_extra_config": extra}))
    code, _, err = run(capsys, "config", "check", "--target", "vllm-cuda", str(path))
    assert_error(code, err, "kv_connector_extra_config.spec_name: expected a spec's name")


# -- plan and trace -------------------------------------------------------------------------


def small_trace(tmp_path: Path, *extra: str) -> Path:
    """A trace of two requests sharing a chunk, then ``extra`` lines."""
    header = json.dumps({"kvtier_trace": 1, "chunk_tokens": 16})
    lines = [header] + [
        json.dumps({"t": t, "prompt_tokens": 32, "chunks": ["0" * 16, f"{t:016x}"]}) for t in (1, 2)
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join([*lines, *extra]) + "\n")
    return path


def test_a_trace_line_whose_time_is_too_large_for_a_float_is_skipped(tmp_path, capsys):
    """``math.isfinite(10**400)`` raises OverflowError: a line's ``t`` ended plan in a
    traceback instead of being skipped and counted like any other bad time."""
    bad = '{"t": 1' + "0" * 400 + ', "prompt_tokens": 16, "chunks": ["' + "1" * 16 + '"]}'
    path = small_trace(tmp_path, bad)
    assert read_trace(path).skipped == {"requests without a finite time t >= 0": 1}
    out = tmp_path / "out"
    code, _, err = run(capsys, "plan", str(path), "--no-chart", "--output-dir", str(out))
    assert code == 0 and "Traceback" not in err, err
    assert (out / "plan.json").is_file()


@pytest.mark.parametrize("flag", ["--device-bytes", "--host-memory", "--memory-budget"])
@pytest.mark.parametrize("value", [HUGE, f"{HUGE}GiB"])
def test_plan_byte_sizes_past_a_floats_range_are_usage_errors(tmp_path, capsys, flag, value):
    code, _, err = run(capsys, "plan", str(small_trace(tmp_path)), flag, value)
    assert_error(code, err, f"argument {flag}: expected less than 2**62 bytes")


def test_plan_host_memory_of_zero_is_a_usage_error_not_this_machines(tmp_path, capsys):
    """``--host-memory 0`` was planned as this machine's memory (``0 or physical``)."""
    code, _, err = run(capsys, "plan", str(small_trace(tmp_path)), "--host-memory", "0")
    assert_error(code, err, "argument --host-memory: expected more than 0 bytes")
    out = tmp_path / "out"
    code, _, err = run(
        capsys,
        "plan",
        str(small_trace(tmp_path)),
        "--host-memory",
        "1",
        "--no-chart",
        "--output-dir",
        str(out),
    )  # the smallest host there is: planned as such, never as this machine's
    assert code == 0, err
    assert json.loads((out / "plan.json").read_text())["headroom"]["total"] == 1


def test_trace_from_events_output_bound_past_a_floats_range_is_a_usage_error(tmp_path, capsys):
    capture = tmp_path / "capture.msgpack"
    capture.write_bytes(b"")
    out = str(tmp_path / "t.jsonl")
    argv = ("trace", "from-events", str(capture), "--out", out, "--max-output-bytes", HUGE)
    code, _, err = run(capsys, *argv)
    assert_error(code, err, "argument --max-output-bytes: expected less than 2**62 bytes")


@pytest.mark.parametrize(
    "document",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"results": [{"strategy": "recompute", "conversations": 1, "throughput_tok_s": 5}], '
        f'"strategies": [], "capacities": {{"chunk_bytes": 1{"0" * 400}, "chunk_tokens": 1}}}}',
        '{"results": [{"strategy": "recompute", "conversations": 1, "throughput_tok_s": 5}, '
        '{"strategy": "tiers", "conversations": 1, "seconds": 2, "prompt_tokens_from": []}, '
        '{"strategy": "ceiling", "conversations": 1, "seconds": 1}], '
        '"strategies": ["recompute", "host", "tiers"], '
        '"capacities": {"chunk_bytes": 1, "chunk_tokens": 1}}',
    ],
    ids=["nested-too-deep", "huge-integer", "sources-not-an-object"],
)
def test_plan_calibrate_with_a_hostile_bench_json_is_a_usage_error(tmp_path, capsys, document):
    bench = tmp_path / "bench.json"
    bench.write_text(document)
    argv = ["--no-chart", "--output-dir", str(tmp_path / "out"), "--calibrate", str(bench)]
    code, _, err = run(capsys, "plan", str(small_trace(tmp_path)), *argv)
    assert_error(code, err, f"bench JSON {bench}: not a kvtier bench result")


def test_trace_synth_mix_shares_whose_sum_overflows_are_a_usage_error(tmp_path, capsys):
    """Each share finite, their sum inf: numpy's choice raised 'probabilities do not sum to 1'."""
    out = tmp_path / "t.jsonl"
    argv = ("trace", "synth", "--out", str(out), "--requests", "10", "--mix", "1e308,1e308,0")
    code, _, err = run(capsys, *argv)
    assert_error(code, err, "argument --mix: expected three shares")
    assert not out.exists()


# -- admin ----------------------------------------------------------------------------------


class _Endpoint(http.server.BaseHTTPRequestHandler):
    """Not an admin endpoint: ``/admin/tiers`` answers JSON nested too deep, anything else a
    404 HTML page (what another web server or a proxy answers)."""

    def do_GET(self) -> None:
        if self.path == "/admin/tiers":
            self._answer(200, b"[" * 200_000 + b"]" * 200_000, "application/json")
        else:
            self._answer(404, b"<html><body>Not Found</body></html>", "text/html")

    do_POST = do_GET

    def _answer(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_admin_refused_with_a_page_that_is_not_json_says_the_status(endpoint, capsys):
    """The refusal's body was parsed inside the HTTPError handler: its ValueError escaped."""
    code, _, err = run(capsys, "admin", "--url", endpoint, "disable", "fs")
    assert_error(code, err, "404 Not Found", status=1)


def test_admin_answer_nested_too_deep_is_not_an_admin_answer(endpoint, capsys):
    code, _, err = run(capsys, "admin", "--url", endpoint, "tiers")
    assert_error(code, err, f"no answer from {endpoint}: not an admin endpoint's answer", 1)


# -- cache gc --every -----------------------------------------------------------------------


class _Rounds:
    """Stands in for ``threading.Event`` in ``cache_run``: each wait between two rounds runs
    the next step (the cache root moved away, then back) and the last one stops the loop."""

    def __init__(self, steps: list[object]) -> None:
        self._steps, self._set = steps, False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True

    def wait(self, _timeout: float) -> bool:
        if not self._steps:
            self._set = True
            return True
        self._steps.pop(0)()  # type: ignore[operator]
        return False


def test_gc_every_goes_on_when_the_target_cannot_be_opened_for_a_round(
    tmp_path, capsys, monkeypatch
):
    """A mount or an endpoint away between two rounds ended the sidecar with a usage error
    (exit status 2); docs/cache.md: a round that fails says why and the next one runs."""
    from kvtier.cli import cache_run

    cache = FsCache(tmp_path / "kv")
    a = make_identity("org/a")
    cache.write_chain(a, chain(a, 2))
    away = tmp_path / "away"
    steps = [lambda: cache.root.rename(away), lambda: away.rename(cache.root)]
    rounds = _Rounds(steps)
    monkeypatch.setattr(cache_run, "threading", type("T", (), {"Event": lambda: rounds}))
    code, out, err = run(
        capsys, "cache", "gc", str(cache.root), "--max-bytes", "1G", "--every", "1"
    )
    assert code == 0, err
    assert "cannot open the cache directory" in err and "Traceback" not in err
    assert out.count("gc: found 2 chunks") == 2  # the round before and the round after
    assert "kvtier cache gc: stopped" in err


def test_an_identity_json_that_is_a_fifo_is_named_once_in_its_problem(tmp_path, capsys):
    """``NotRegularError`` names the file already: the problem read "identity.json:
    identity.json: not a regular file", on stderr and in ``ls --json``."""
    cache = FsCache(tmp_path / "kv")
    a = make_identity("org/a")
    cache.write_chain(a, chain(a, 2))
    path = cache.root / a.hexdigest / "identity.json"
    path.unlink()
    os.mkfifo(path)
    code, out, err = run(capsys, "cache", "ls", str(cache.root), "--json")
    assert code == 0, err
    [found] = json.loads(out)["identities"]
    assert found["identity_problem"] == "identity.json: not a regular file or directory"
    assert "identity.json: not a regular file" in err and "identity.json: identity.json" not in err


def test_gc_older_than_past_a_floats_range_is_a_usage_error(tmp_path, capsys):
    """A duration of 400 digits was taken as infinite: ``gc`` ran and deleted nothing, where
    ``--max-bytes`` of the same digits is refused."""
    cache = FsCache(tmp_path / "kv")
    a = make_identity("org/a")
    cache.write_chain(a, chain(a, 2))
    code, _, err = run(capsys, "cache", "gc", str(cache.root), "--older-than", f"{HUGE}s")
    assert_error(code, err, "", status=2)
    assert "expected a finite duration" in err
    assert len(list(cache.root.rglob("*"))) > 2  # nothing deleted
