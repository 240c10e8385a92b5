"""The configuration boundary, as a third hostile sweep found it (after
``test_config_hostile.py`` and ``test_hostile_values_sweep.py``).

JSON that says one key twice, text that is not JSON text at all, a typo'd key, and a tier of
your own whose module or class cannot be a Python name: each is a ``ConfigError`` when the
configuration is read, naming the key, and ``kvtier config check`` exits 2 with one line.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvtier import TieringConfig
from kvtier.config import FsTierConfig, KVEventsConfig, ServeConfig
from kvtier.errors import ConfigError
from tests.config.test_hostile_values_sweep import assert_refused, tier, top, write

GiB = 1 << 30

# -- a key given twice in one JSON object -----------------------------------------------------

DUPLICATES = [
    ("cpu_bytes_to_use", f'{{"cpu_bytes_to_use": {GiB}, "cpu_bytes_to_use": 1}}'),
    ("port", top('"serve": {"port": 1, "host": "127.0.0.1", "port": 2}')),
    ("host", top('"serve": {"port": 1, "host": "127.0.0.1", "host": "0.0.0.0"}')),
    ("root_dir", tier('{"type": "fs", "root_dir": "/a", "root_dir": "/b"}')),
    ("options", top('"admission": [{"options": {}, "options": {"x": 1}}]')),
    ("x", top('"admission": [{"options": {"x": 1, "x": 2}}]')),
]


@pytest.mark.parametrize(("key", "text"), DUPLICATES)
def test_a_key_given_twice_in_one_object_is_refused(tmp_path, capsys, key, text):
    """JSON leaves duplicate keys undefined and Python keeps the last one silently: a reader
    (or a reviewer) of the file could believe the first. Both are refused, naming the key."""
    assert_refused(write(tmp_path, text), key, capsys)


def test_the_same_key_in_two_objects_is_not_a_duplicate():
    text = top('"serve": {"port": 1}, "kv_events": {"endpoint": "tcp://127.0.0.1:2"}')
    config = TieringConfig.from_json(text.replace('"port": 1', '"port": 1, "host": "::1"'))
    assert config.serve is not None and config.serve.host == "::1"


# -- from_json and load given something that is not JSON text or a path -----------------------


@pytest.mark.parametrize("value", [None, 1, 1.5, ["{}"], {"cpu_bytes_to_use": GiB}])
def test_from_json_of_something_not_text_is_a_config_error(value: Any):
    with pytest.raises(ConfigError, match=r"^configuration: expected JSON text"):
        TieringConfig.from_json(value)


@pytest.mark.parametrize("value", [None, 0, 1.5])
def test_load_of_something_not_a_path_is_a_config_error(value: Any):
    with pytest.raises(ConfigError, match=r"^configuration file"):
        TieringConfig.load(value)


def test_from_json_still_takes_utf8_bytes():
    assert TieringConfig.from_json(f'{{"cpu_bytes_to_use": {GiB}}}'.encode()).cpu_bytes_to_use


# -- a typo'd key: the message names the key it was probably meant to be ----------------------

TYPOS = [
    ("metrics_prot", "metrics_port", top('"metrics_prot": 9464')),
    ("secondary_tiers[0].root_dri", "root_dir", tier('{"type": "fs", "root_dri": "/x"}')),
    ("serve.hold_timout_s", "hold_timeout_s", top('"serve": {"port": 1, "hold_timout_s": 1}')),
    ("kv_conector", "kv_connector", '{"kv_conector": "X", "kv_connector_extra_config": {}}'),
]


@pytest.mark.parametrize(("key", "meant", "text"), TYPOS)
def test_an_unknown_key_names_the_close_match(key, meant, text):
    with pytest.raises(ConfigError) as raised:
        TieringConfig.from_json(text)
    message = str(raised.value)
    assert message.startswith(f"{key}: unknown key"), message
    assert f"did you mean {meant}?" in message, message


def test_an_unknown_key_like_no_known_one_suggests_nothing():
    with pytest.raises(ConfigError) as raised:
        TieringConfig.from_json(top('"zzzzzz": 1'))
    assert str(raised.value).startswith("zzzzzz: unknown key (expected one of [")


# -- a tier of your own whose module or class cannot be a Python name -------------------------

BAD_NAMES = [
    ("module_path", "no such"),
    ("module_path", ".relative"),
    ("module_path", "a..b"),
    ("module_path", "a.b."),
    ("module_path", "~"),
    ("module_path", "../../etc/x"),
    ("module_path", "1abc"),
    ("type", "Two Words"),
    ("type", "a.B"),
    ("type", "-C"),
]


@pytest.mark.parametrize(("key", "value"), BAD_NAMES)
def test_a_module_or_class_that_is_no_python_name_is_refused_at_load(tmp_path, capsys, key, value):
    entry = {"module_path": "my_tiers.disk", "type": "DiskTier", key: value}
    text = tier(str(entry).replace("'", '"'))
    assert_refused(write(tmp_path, text), f"secondary_tiers[0].{key}", capsys)


@pytest.mark.parametrize("module_path", ["m", "my_tiers.disk", "_private.x_1", "pkg.sub.mod"])
def test_a_dotted_module_name_and_class_name_are_accepted(module_path):
    entry = f'{{"module_path": "{module_path}", "type": "Tier_2"}}'
    (parsed,) = TieringConfig.from_json(tier(entry)).secondary_tiers
    assert parsed.module_path == module_path  # type: ignore[union-attr]


# -- a config built by hand: its choices and switches are checked as the parser checks them ---

HAND_BUILT = [
    (lambda: TieringConfig(cpu_bytes_to_use=GiB, eviction_policy="fifo"), "eviction_policy"),
    (lambda: TieringConfig(cpu_bytes_to_use=GiB, metrics_admin=0), "metrics_admin"),
    (lambda: FsTierConfig(root_dir="/x", o_direct="yes"), "o_direct"),
    (lambda: FsTierConfig(root_dir="/x", probe="sometimes"), "probe"),
    (lambda: FsTierConfig(root_dir="/x", fsync="no"), "fsync"),
    (lambda: FsTierConfig(root_dir="/x", encrypt=1), "encrypt"),
    (lambda: ServeConfig(port=1, accept_stores="false"), "accept_stores"),
    (lambda: KVEventsConfig(publisher="nanomsg"), "publisher"),
    (lambda: KVEventsConfig(enable_kv_cache_events=None), "enable_kv_cache_events"),
]


@pytest.mark.parametrize(("build", "key"), HAND_BUILT)
def test_a_choice_or_switch_of_a_config_built_by_hand_is_checked(build, key):
    """``from_dict`` refuses these; a dataclass built in Python refuses them too, rather than
    take ``"yes"`` for ``auto`` or ``"false"`` for true once the tier runs."""
    with pytest.raises(ConfigError, match=rf"^{key}: expected one of \["):
        build()


def test_the_choices_and_switches_given_right_by_hand_pass():
    FsTierConfig(root_dir="/x", o_direct="off", probe="inline", fsync=True, encrypt=False)
    KVEventsConfig(publisher="zmq", enable_kv_cache_events=False)
    TieringConfig(cpu_bytes_to_use=GiB, eviction_policy="arc", metrics_admin=False)


@pytest.mark.parametrize(
    ("build", "key"),
    [
        (lambda: ServeConfig(port=None), "port"),  # type: ignore[arg-type]
        (lambda: FsTierConfig(root_dir=None), "root_dir"),  # type: ignore[arg-type]
        (lambda: TieringConfig(cpu_bytes_to_use=None), "cpu_bytes_to_use"),  # type: ignore[arg-type]
        (lambda: KVEventsConfig(hwm=None), "hwm"),  # type: ignore[arg-type]
    ],
)
def test_none_for_a_key_that_is_not_optional_is_refused_when_built_by_hand(build, key):
    """``None`` passes unchecked only where the field may be ``None`` (``metrics_port``)."""
    with pytest.raises(ConfigError, match=rf"^{key}: expected"):
        build()
