"""A killed bench takes the engine servers it started with it (``bench.orphans``), though
they run in their own session: real processes, a parent killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

PARENT = """
import os, subprocess, sys
from kvtier.bench.orphans import die_with_parent
hook = die_with_parent(os.getpid()) if sys.argv[1] == "hooked" else None
child = subprocess.Popen(["sleep", "120"], start_new_session=True, preexec_fn=hook)
print(child.pid, flush=True)
sys.stdin.read()
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie awaiting its reaper is gone too
        return stat.read().split(")")[-1].split()[0] != "Z"


def orphan_after_parent_killed(mode: str) -> int:
    """The pid of the child a parent in ``mode`` started, once that parent was SIGKILLed."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert alive(child)
    parent.kill()
    parent.wait()
    return child


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_started_with_the_hook_dies_with_a_killed_bench() -> None:
    child = orphan_after_parent_killed("hooked")
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_without_the_hook_a_new_session_outlives_its_parent() -> None:
    """What the hook is for: the orphan stays (the control of the test above)."""
    child = orphan_after_parent_killed("plain")
    try:
        time.sleep(0.5)
        assert alive(child)
    finally:
        os.kill(child, signal.SIGKILL)
