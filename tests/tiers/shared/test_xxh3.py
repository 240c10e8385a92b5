"""The compiled XXH3-128 (``xxh3.h`` through ``_checksum``) against the ``xxhash`` package.

Written from the specification, so it is checked byte for byte against the reference library
on every input-length path (0, 1-3, 4-8, 9-16, 17-128, 129-240, long inputs: block edges,
the last partial stripe) and on random contents.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import types

import pytest
import xxhash

import kvtier.tiers.shared
from kvtier.tiers.shared import codec

_checksum = pytest.importorskip("kvtier.tiers.shared._checksum")


@pytest.fixture(params=["compiled", "fallback"])
def either_build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``codec``'s compiled checksum, or its pure-Python fallback (``_checksum`` missing)."""
    if request.param == "fallback":
        monkeypatch.setattr(codec, "_checksum", None)
    return str(request.param)


EDGES = [0, 1, 2, 3, 4, 8, 9, 16, 17, 32, 33, 127, 128, 129, 239, 240, 241, 1023, 1024, 1025]
LONG = [2047, 2048, 2049, 4096 + 63, 4096 + 64, 4096 + 65, 128 * 1024 + 7, (1 << 20) + 1024]


@pytest.mark.parametrize("length", EDGES + LONG)
def test_digest_is_xxhash_xxh3_128(length: int):
    for _ in range(3):
        data = os.urandom(length)
        assert _checksum.digest(data) == xxhash.xxh3_128_digest(data)


def test_every_length_up_to_three_blocks():
    data = os.urandom(3 * 1024 + 200)
    for length in range(len(data) + 1):
        assert _checksum.digest(data[:length]) == xxhash.xxh3_128_digest(data[:length]), length


@pytest.mark.parametrize("length", [0, 5, 240, 241, 128 * 1024, 128 * 1024 + 1, 3 << 20])
def test_copy_digest_copies_and_hashes_the_source(length: int):
    source = os.urandom(length)
    target = bytearray(b"\xaa" * (length + 100))
    assert _checksum.copy_digest(target, source) == xxhash.xxh3_128_digest(source)
    assert target[:length] == source and target[length:] == b"\xaa" * 100


def test_copy_digest_refuses_a_target_too_small():
    with pytest.raises(ValueError, match="do not fit"):
        _checksum.copy_digest(bytearray(10), b"x" * 11)
    with pytest.raises(TypeError):
        _checksum.copy_digest(b"read-only", b"x")


def test_codec_uses_the_compiled_checksum():
    data = os.urandom(5000)
    target = bytearray(5000)
    assert codec.checksum(data) == xxhash.xxh3_128_digest(data)
    assert codec.copy_checksum(memoryview(target), memoryview(data)) == codec.checksum(data)
    assert target == data
    assert codec.COMPILED_CHECKSUM is sys.platform.startswith("linux")


@pytest.mark.parametrize("length", [0, 100, 241, 1024, 1025, 300_000, (1 << 20) + 7])
def test_filling_folds_a_buffer_as_it_fills_in_any_pieces(length: int):
    source = os.urandom(length)
    target = bytearray(length)
    filling = codec.filling(memoryview(target))
    done, step = 0, 1
    while done < length:  # pieces of every size, none aligned to a block
        piece = min(length - done, step)
        target[done : done + piece] = source[done : done + piece]
        done += piece
        filling.feed(done)
        step = step * 3 + 7
    assert filling.digest(length) == xxhash.xxh3_128_digest(source)
    assert filling.digest(length) == xxhash.xxh3_128_digest(source)  # finishing kept no state


def test_filling_of_a_prefix_and_misuse():
    source = os.urandom(5000)
    filling = codec.filling(memoryview(bytearray(source)))
    filling.feed(3000)
    assert filling.digest(2999) == xxhash.xxh3_128_digest(source[:2999])
    for wrong in (-1, 5001):
        with pytest.raises(ValueError, match="outside the buffer"):
            filling.feed(wrong)
        with pytest.raises(ValueError, match="outside the buffer"):
            filling.digest(wrong)


def test_the_fallback_gives_the_same_values(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(codec, "_checksum", None)
    data = os.urandom(3000)
    target = bytearray(3000)
    assert codec.checksum(data) == xxhash.xxh3_128_digest(data)
    assert codec.copy_checksum(memoryview(target), data) == xxhash.xxh3_128_digest(data)
    assert target == data
    with pytest.raises(ValueError, match="do not fit"):
        codec.copy_checksum(memoryview(bytearray(2)), data)
    filling = codec.filling(memoryview(target))
    filling.feed(3000)
    assert filling.digest(3000) == xxhash.xxh3_128_digest(data)


def test_copy_digest_refuses_overlapping_views():
    buffer = memoryview(bytearray(os.urandom(4096)))
    with pytest.raises(ValueError, match="overlap"):
        _checksum.copy_digest(buffer[100:], buffer[:1000])
    assert _checksum.copy_digest(buffer[2048:], buffer[:2048]) == xxhash.xxh3_128_digest(
        buffer[:2048]
    )


@pytest.mark.parametrize("slack", [0, 64])
@pytest.mark.parametrize("length", [0, 100, 241, 1024, 1025, 300_000, (3 << 20) + 7])
def test_copy_in_lands_pieces_held_elsewhere_and_folds_them(
    either_build: str, slack: int, length: int
):
    """Exactly filled (the digest is what was folded) or with room left (a fresh pass)."""
    source = os.urandom(length)
    target = bytearray(length + slack)
    filling = codec.filling(memoryview(target))
    done, step = 0, 1
    while done < length:  # copied in, or written in place and fed, in turn
        piece = min(length - done, step)
        if step % 2:
            filling.copy_in(memoryview(source)[done : done + piece])
        else:
            target[done : done + piece] = source[done : done + piece]
            filling.feed(done + piece)
        done += piece
        step = step * 5 + 2
    assert bytes(target[:length]) == source
    assert filling.digest(length) == xxhash.xxh3_128_digest(source)


def test_copy_in_refuses_what_does_not_fit(either_build: str):
    target = bytearray(4096)
    filling = codec.filling(memoryview(target))
    filling.copy_in(b"a" * 4000)
    with pytest.raises(ValueError, match="do not fit"):
        filling.copy_in(b"b" * 97)
    filling.copy_in(b"c" * 96)  # the refused piece left the mark where it was
    assert bytes(target) == b"a" * 4000 + b"c" * 96
    assert filling.digest(4096) == xxhash.xxh3_128_digest(bytes(target))


def test_copy_in_refuses_overlap():
    buffer = memoryview(bytearray(os.urandom(8192)))
    filling = _checksum.Filling(buffer[4096:])
    with pytest.raises(ValueError, match="overlap"):
        filling.copy_in(buffer[4000:4200])


@pytest.mark.parametrize("abi", [1, codec.CHECKSUM_ABI])
def test_a_checksum_module_of_another_build_is_not_used(abi: int, monkeypatch: pytest.MonkeyPatch):
    """A ``_checksum`` left from an older build (no ``copy_in``) must not be called."""
    build = types.SimpleNamespace(ABI=abi)
    monkeypatch.setattr(kvtier.tiers.shared, "_checksum", build)
    spec = importlib.util.spec_from_file_location("codec_again", codec.__file__)
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "codec_again", fresh)  # its dataclasses look it up
    spec.loader.exec_module(fresh)
    assert fresh.COMPILED_CHECKSUM is (abi == codec.CHECKSUM_ABI)


@pytest.mark.parametrize("length", [(128 << 10) - 1, 128 << 10, (1 << 20) + 7, 8 << 20])
def test_one_copy_in_of_a_whole_payload_is_its_checksum(length: int):
    """One frame filling its slot exactly, as the peer tier lands it: below and above the size
    from which the copy runs without the GIL."""
    source, target = os.urandom(length), bytearray(length)
    filling = _checksum.Filling(target)
    filling.copy_in(source)
    assert target == source and filling.digest(length) == xxhash.xxh3_128_digest(source)


def test_copy_in_refuses_a_read_only_target(either_build: str):
    target = bytes(64)
    filling = codec.filling(memoryview(target))
    with pytest.raises(ValueError, match="read-only"):
        filling.copy_in(b"x" * 8)
    assert target == bytes(64)


def test_a_filling_in_use_by_another_thread_refuses_calls():
    """While one thread copies in without the GIL, another thread's calls raise instead of
    folding into the same state or copying to the same place; the copy is unharmed."""
    source, target = os.urandom(64 << 20), bytearray(64 << 20)
    filling = _checksum.Filling(target)
    copier = threading.Thread(target=filling.copy_in, args=(source,))
    refused = []
    copier.start()
    while copier.is_alive() and not refused:
        for call in (
            lambda: filling.copy_in(b""),
            lambda: filling.feed(0),
            lambda: filling.digest(0),
        ):
            try:
                call()
            except RuntimeError as exc:
                refused.append(str(exc))
    copier.join()
    assert refused and "in use by another thread" in refused[0]
    assert target == source and filling.digest(len(target)) == xxhash.xxh3_128_digest(source)
