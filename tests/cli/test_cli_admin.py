"""``kvtier admin`` against a real manager's admin endpoint (a real HTTP server on loopback),
run as a separate process the way an operator runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.control.test_admin import served as served_port  # noqa: F401 (a fixture)


def kvtier(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvtier.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def served(served_port):  # noqa: F811 (the imported fixture)
    m, port = served_port
    return m, f"http://127.0.0.1:{port}"


def test_tiers_are_listed_switched_off_with_a_reason_and_back_on(served):
    m, url = served
    listed = kvtier("admin", "--url", url, "tiers")
    assert listed.returncode == 0 and json.loads(listed.stdout) == {
        "enabled": ["fs"],
        "disabled": [],
    }
    off = kvtier("admin", "--url", url, "disable", "fs", "--reason", "nfs-maintenance")
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout) == {"tier": "fs", "enabled": False, "changed": True}
    assert m.tier_states() == ([], ["fs"])
    on = kvtier("admin", "--url", url, "enable", "fs")
    assert on.returncode == 0 and json.loads(on.stdout)["changed"] is True
    assert [(s.enabled, s.reason) for s in m.take_tier_switches()] == [
        (False, "nfs-maintenance"),
        (True, "manual"),
    ]


def test_a_refusal_says_why_and_exits_1(served):
    m, url = served
    missing = kvtier("admin", "--url", url, "disable", "nope")
    assert missing.returncode == 1 and "404" in missing.stderr and "no tier named" in missing.stderr
    m.close()
    closed = kvtier("admin", "--url", url, "tiers")
    assert closed.returncode == 1 and "no answer" in closed.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "ftp://x", "tiers"], "expected http://HOST:PORT"),
        (["--url", "http://127.0.0.1:1", "disable", "fs", "--reason", "x" * 65], "1 to 64"),
        (["--url", "http://127.0.0.1:1", "disable", "fs", "--reason", ""], "1 to 64"),
        (["--url", "http://127.0.0.1:1", "--timeout", "nan", "tiers"], "expected above 0"),
        (["--url", "http://127.0.0.1:1", "switch", "fs"], "invalid choice"),
    ],
)
def test_bad_input_is_a_usage_error(args, message):
    done = kvtier("admin", *args)
    assert done.returncode == 2 and "kvtier: error: " in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_reason_of_64_characters_is_taken_and_the_endpoint_refuses_65(served):
    m, url = served
    assert kvtier("admin", "--url", url, "disable", "fs", "--reason", "r" * 64).returncode == 0
    assert m.take_tier_switches()[0].reason == "r" * 64
    port = url.rsplit(":", 1)[1]
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/admin/tiers/fs/disable?reason={'r' * 65}", data=b"", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
