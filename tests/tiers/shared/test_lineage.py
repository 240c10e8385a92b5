"""The link a chunk carries in its header block: round trip, and anything else reads as none."""

from __future__ import annotations

import pytest

from kvtier.tiers.shared.codec import HEADER_BYTES, encode_header
from kvtier.tiers.shared.lineage import (
    LINK_BYTES,
    LINK_OFFSET,
    Link,
    chain_links,
    encode_link,
    linked,
    read_link,
)
from kvtier.tiers.shared.sealing import make_sealer

PARENT = bytes(range(32))


def header() -> bytes:
    return encode_header(b"i" * 32, b"k" * 32, b"payload")


@pytest.mark.parametrize("link", [Link(PARENT, 7), Link(None, 0), Link(None, -1)])
def test_a_link_written_into_a_header_reads_back(link: Link) -> None:
    block = linked(header(), link)
    assert len(block) == HEADER_BYTES and read_link(block) == link
    assert read_link(block[LINK_OFFSET : LINK_OFFSET + LINK_BYTES]) == link


def test_a_header_without_a_link_or_with_a_garbled_one_reads_as_none() -> None:
    assert read_link(header()) is None  # written before links existed
    block = bytearray(linked(header(), Link(PARENT, 3)))
    block[LINK_OFFSET + 20] ^= 1
    assert read_link(block) is None
    assert read_link(b"") is None and read_link(b"KVTLINK1") is None


def test_the_link_leaves_what_the_checksum_and_the_tag_cover_alone(tmp_path) -> None:
    from kvtier.tiers.shared import codec

    payload = b"x" * 100
    block = linked(encode_header(b"i" * 32, b"k" * 32, payload), Link(PARENT, 1))
    codec.verify(block, payload, b"i" * 32, b"k" * 32)
    key_file = tmp_path / "key"
    key_file.write_text("ab" * 32 + "\n")
    key_file.chmod(0o600)
    sealer = make_sealer(str(key_file))
    sealed = linked(sealer.seal(b"i" * 32, b"k" * 32, payload), Link(PARENT, 1))
    sealer.open(sealed, bytearray(payload), b"i" * 32, b"k" * 32)
    assert read_link(sealed) == Link(PARENT, 1)


def test_chain_links_name_each_predecessor() -> None:
    keys = [b"a" * 32, b"b" * 32, b"c" * 32]
    assert chain_links(keys) == [Link(None, 0), Link(keys[0], 1), Link(keys[1], 2)]
    assert chain_links(keys[1:], 1, keys[0]) == [Link(keys[0], 1), Link(keys[1], 2)]
    assert chain_links([]) == []
    assert encode_link(Link(None, 0)) != encode_link(Link(None, -1))
