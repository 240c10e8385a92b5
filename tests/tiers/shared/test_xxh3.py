"""The compiled XXH3-128 (``xxh3.h`` through ``_checksum``) against the ``xxhash`` package.

Written from the specification, so it is checked byte for byte against the reference library
on every input-length path (0, 1-3, 4-8, 9-16, 17-128, 129-240, long inputs: block edges,
the last partial stripe) and on random contents.
"""

from __future__ import annotations

import os
import sys

import pytest
import xxhash

from kvtier.tiers.shared import codec

_checksum = pytest.importorskip("kvtier.tiers.shared._checksum")

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
