"""glibc malloc's thresholds (``kvtier.core.malloc_settings``), observed through glibc itself.

Each case runs in a fresh child process (the settings are the process's, made once): the child
builds a ``TieringManager`` through the public API, then asks glibc's ``mallinfo2`` whether a
block was given a mapping of its own (``hblks``) and how much free memory the top of the main
heap kept (``keepcost``) after blocks were freed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvtier import TieringConfig
from kvtier.core import malloc_settings
from kvtier.core.malloc_settings import operator_choice
from kvtier.errors import ConfigError
from tests.child_process import child_env

MiB = 1 << 20

CHILD = """
import ctypes, json, sys
from kvtier import CacheIdentity, KVLayout, TieringConfig, TieringManager
from kvtier.core import malloc_settings

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS.split()]
libc.mallinfo2.restype = Info

def mapped(size):
    before = libc.mallinfo2().hblks
    block = libc.malloc(size)
    after = libc.mallinfo2().hblks
    libc.free(block)
    return after > before

def kept(sizes):
    blocks = [libc.malloc(size) for size in sizes]
    for block in reversed(blocks):
        libc.free(block)
    return libc.mallinfo2().keepcost

layout = KVLayout(
    num_layers=2, num_kv_heads=2, head_dim=16, dtype="float32", block_size=4, blocks_per_chunk=2
)
identity = CacheIdentity(model="test/model", revision="r1", layout=layout)
config = TieringConfig(cpu_bytes_to_use=1 << 20, tune_malloc=sys.argv[1] == "on")
with TieringManager(config, identity):
    pass
MiB = 1 << 20
print(json.dumps({
    "mapped": {mib: mapped(mib * MiB) for mib in (4, 31, 33)},
    "kept_60": kept([30 * MiB, 30 * MiB]),
    "kept_70": kept([30 * MiB, 30 * MiB, 10 * MiB]),
    "apply": malloc_settings.apply(),
}))
"""


def run_child(tune: str, **env: str) -> dict[str, object]:
    base = {k: v for k, v in child_env().items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, tune],
        env=base | env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


pytestmark = pytest.mark.skipif(
    not hasattr(os, "confstr") or "glibc" not in (os.confstr("CS_GNU_LIBC_VERSION") or ""),
    reason="glibc's malloc only",
)


def test_a_manager_sets_the_thresholds_for_its_process_once() -> None:
    got = run_child("on")
    # up to 32 MiB from the heap, above it a mapping of its own
    assert got["mapped"] == {"4": False, "31": False, "33": True}
    # 60 MiB freed at the top of the heap stays; 70 MiB is given back (to the 128 KiB pad)
    assert isinstance(got["kept_60"], int) and got["kept_60"] >= 60 * MiB
    assert isinstance(got["kept_70"], int) and got["kept_70"] < 1 * MiB
    assert got["apply"] == "already set"


def test_tune_malloc_false_leaves_malloc_as_it_is() -> None:
    got = run_child("off")
    assert got["mapped"] == {"4": True, "31": True, "33": True}  # glibc's own 128 KiB start
    assert got["apply"] == "set"  # nothing had set them before


@pytest.mark.parametrize(
    "env",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1048576"},
        {"MALLOC_MMAP_THRESHOLD_": "1048576"},
    ],
)
def test_the_operators_own_settings_win(env: dict[str, str]) -> None:
    got = run_child("on", **env)
    assert got["mapped"] == {"4": True, "31": True, "33": True}  # the operator's 1 MiB
    assert got["apply"] == f"operator: {next(iter(env))}"


@pytest.mark.parametrize(
    ("environ", "chosen"),
    [
        ({}, None),
        ({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}, None),
        ({"GLIBC_TUNABLES": "glibc.cpu.x86_shstk=on:glibc.malloc.hugetlb=1"}, "GLIBC_TUNABLES"),
        ({"MALLOC_ARENA_MAX": "2"}, "MALLOC_ARENA_MAX"),
        ({"MALLOC_TOP_PAD_": "0"}, "MALLOC_TOP_PAD_"),
        ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "LD_PRELOAD"),
        ({"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}, "LD_PRELOAD"),
        ({"LD_PRELOAD": "/usr/lib/libgomp.so.1"}, None),
    ],
)
def test_operator_choice(environ: dict[str, str], chosen: str | None) -> None:
    assert operator_choice(environ) == chosen


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_tune_malloc_takes_a_boolean_only(value: object) -> None:
    with pytest.raises(ConfigError, match="tune_malloc"):
        TieringConfig(cpu_bytes_to_use=MiB, tune_malloc=value)  # type: ignore[arg-type]


def test_another_c_library_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(malloc_settings, "_outcome", None)
    for name in ("GLIBC_TUNABLES", "LD_PRELOAD", *malloc_settings._OPERATOR_VARIABLES):
        monkeypatch.delenv(name, raising=False)

    def unknown(name: str) -> str:
        raise ValueError(f"unrecognized configuration name {name!r}")  # musl, macOS

    monkeypatch.setattr(malloc_settings.os, "confstr", unknown)
    assert malloc_settings.apply() == "not glibc"
    assert malloc_settings.apply() == "not glibc"  # asked once


def test_a_refusal_is_said_and_warned_of(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(malloc_settings, "_outcome", None)
    for name in ("GLIBC_TUNABLES", "LD_PRELOAD", *malloc_settings._OPERATOR_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    calls: list[tuple[int, int]] = []

    def refusing(parameter: int, value: int) -> int:
        calls.append((parameter, value))
        return 0

    monkeypatch.setattr(malloc_settings, "_mallopt", lambda: refusing)
    assert malloc_settings.apply() == "refused"
    assert calls == [(-3, 32 * MiB)]  # the trim threshold is not set alone
    assert "refused" in caplog.text
