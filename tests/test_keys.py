"""Identity and keys: deterministic everywhere, prefix-stable, disjoint across identities/salts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import CacheIdentity, KVLayout, chunk_keys
from kvtier.errors import InvalidKeyError

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, block_size=2, blocks_per_chunk=2)
IDENTITY = CacheIdentity(model="org/model", revision="abc", layout=LAYOUT)
TOKENS = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=40)


@given(TOKENS)
def test_one_key_per_full_chunk(tokens):
    assert len(chunk_keys(tokens, IDENTITY)) == len(tokens) // LAYOUT.tokens_per_chunk


@given(TOKENS, TOKENS)
def test_prefix_stable(prefix, suffix):
    """Appending tokens never changes the keys of the chunks already complete."""
    short = chunk_keys(prefix, IDENTITY)
    assert chunk_keys(prefix + suffix, IDENTITY)[: len(short)] == short


@given(TOKENS, TOKENS, st.sampled_from([None, "tenant"]))
def test_known_keys_of_a_prefix_give_the_keys_of_the_whole(prefix, suffix, salt):
    """The chain resumes after the known keys: the same keys as hashing from the start, with
    any prefix length (a partial last chunk of the prefix is hashed with the suffix)."""
    known = chunk_keys(prefix, IDENTITY, salt)
    assert chunk_keys(prefix + suffix, IDENTITY, salt, known=known) == chunk_keys(
        prefix + suffix, IDENTITY, salt
    )


def test_known_keys_past_the_tokens_are_cut_and_wrong_ones_refused():
    tokens = list(range(20))  # 5 chunks of 4
    whole = chunk_keys(tokens, IDENTITY)
    assert chunk_keys(tokens[:9], IDENTITY, known=whole) == whole[:2]
    other = chunk_keys(list(range(100, 108)), IDENTITY)
    assert chunk_keys(tokens, IDENTITY, known=other)[2:] != whole[2:], "the chain follows known"
    for bad in ([b"short"], [whole[0], 7], ["x" * 32]):
        with pytest.raises(InvalidKeyError):
            chunk_keys(tokens, IDENTITY, known=bad)  # type: ignore[arg-type]


@given(TOKENS, TOKENS)
def test_key_depends_on_the_whole_prefix(a, b):
    """Equal i-th keys imply equal token prefixes up to the end of chunk i."""
    n = LAYOUT.tokens_per_chunk
    for i, (ka, kb) in enumerate(zip(chunk_keys(a, IDENTITY), chunk_keys(b, IDENTITY))):
        assert (ka == kb) == (a[: (i + 1) * n] == b[: (i + 1) * n])


@given(TOKENS.filter(lambda t: len(t) >= 4), st.text(min_size=1), st.text(min_size=1))
def test_disjoint_across_identities_and_salts(tokens, salt_a, salt_b):
    other = CacheIdentity(model="org/model", revision="def", layout=LAYOUT)
    base = set(chunk_keys(tokens, IDENTITY))
    assert base.isdisjoint(chunk_keys(tokens, other))
    salted = set(chunk_keys(tokens, IDENTITY, salt=salt_a))
    assert base.isdisjoint(salted)
    if salt_a != salt_b:
        assert salted.isdisjoint(chunk_keys(tokens, IDENTITY, salt=salt_b))


@settings(max_examples=20)
@given(st.sampled_from(["float32", "bfloat16"]), st.integers(1, 4), st.integers(1, 4))
def test_every_layout_field_changes_the_identity(dtype, heads, blocks):
    layout = KVLayout(
        num_layers=2,
        num_kv_heads=heads,
        head_dim=8,
        dtype=dtype,
        block_size=2,
        blocks_per_chunk=blocks,
    )
    same = layout == LAYOUT
    assert (CacheIdentity("org/model", layout, "abc").digest == IDENTITY.digest) == same


def test_extra_settings_are_order_independent_and_matter():
    a = CacheIdentity("m", LAYOUT, extra={"rope": "yarn", "quant": "fp8"})
    b = CacheIdentity("m", LAYOUT, extra={"quant": "fp8", "rope": "yarn"})
    c = CacheIdentity("m", LAYOUT, extra={"quant": "fp8"})
    assert a.digest == b.digest != c.digest


def test_keys_identical_in_other_processes_with_other_hash_seeds():
    tokens = list(range(1000, 1037))
    expected = [k.hex() for k in chunk_keys(tokens, IDENTITY)]
    script = (
        "from kvtier import CacheIdentity, KVLayout, chunk_keys\n"
        "l = KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, block_size=2, blocks_per_chunk=2)\n"
        "i = CacheIdentity(model='org/model', revision='abc', layout=l)\n"
        f"print(','.join(k.hex() for k in chunk_keys({tokens}, i)))\n"
    )
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert out.split(",") == expected


def test_numpy_and_list_inputs_agree():
    import numpy as np

    tokens = list(range(17))
    assert chunk_keys(np.array(tokens, dtype=np.int32), IDENTITY) == chunk_keys(tokens, IDENTITY)
