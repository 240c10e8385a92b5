"""Hostile values a sweep of every documented key found still getting through (the earlier
sweeps: ``test_config_hostile.py``).

Each is refused when the configuration is read, with a ``ConfigError`` whose message starts
with the key's path, and ``kvtier config check`` answers it with exit status 2, one line and no
traceback; the valid side of each bound is still accepted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvtier import TieringConfig
from kvtier.cli.main import main
from kvtier.errors import ConfigError

GiB = 1 << 30
VLLM = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}


def write(tmp_path: Path, text: str) -> Path:
    """``text`` (JSON) in a configuration file under ``tmp_path``."""
    path = tmp_path / "kvtier.json"
    path.write_text(text, encoding="utf-8")
    return path


def tier(entry: str) -> str:
    return f'{{"cpu_bytes_to_use": {GiB}, "secondary_tiers": [{entry}]}}'


def top(keys: str) -> str:
    return f'{{"cpu_bytes_to_use": {GiB}, {keys}}}'


def config_check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Any, str]:
    """``kvtier config check path``: its exit status and stderr."""
    try:
        code = main(["config", "check", str(path)])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def assert_refused(path: Path, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``load`` raises a ``ConfigError`` naming ``key``; ``config check`` exits 2, one line."""
    with pytest.raises(ConfigError) as raised:
        TieringConfig.load(path)
    assert str(raised.value).startswith(f"{key}: "), str(raised.value)
    code, err = config_check(path, capsys)
    assert code == 2 and "Traceback" not in err, err
    reason = [line for line in err.splitlines() if line.startswith("kvtier: error: ")]
    assert len(reason) == 1 and reason[0].startswith(f"kvtier: error: {key}: "), err


# -- keys that are not strings (a dict built in Python) ---------------------------------------

MIXED_KEYS = [
    ("", {"cpu_bytes_to_use": GiB, None: 1, "zz": 1}),
    ("serve.", {"cpu_bytes_to_use": GiB, "serve": {"port": 1, 2: 3, "x": 1}}),
    ("secondary_tiers[0].", {"cpu_bytes_to_use": GiB, "secondary_tiers": [{"type": "memory", 1: 2, "a": 1}]}),
    ("admission[0].", {"cpu_bytes_to_use": GiB, "admission": [{(1,): 2, "a": 1}]}),
    ("", {**VLLM, "kv_connector_extra_config": {"cpu_bytes_to_use": GiB}, None: 1, "zz": 1}),
]  # fmt: skip


@pytest.mark.parametrize(("prefix", "data"), MIXED_KEYS)
def test_keys_of_mixed_types_are_an_unknown_key_not_a_type_error(prefix, data):
    with pytest.raises(ConfigError, match="unknown key") as raised:
        TieringConfig.from_dict(data)
    assert str(raised.value).startswith(prefix), str(raised.value)


@pytest.mark.parametrize(
    ("key", "data"),
    [
        ("cpu_bytes_to_use", {"cpu_bytes_to_use": 10**5000}),
        ("cpu_bytes_to_use", {"cpu_bytes_to_use": [10**5000]}),
        ("eviction_policy", {"cpu_bytes_to_use": GiB, "eviction_policy": 10**5000}),
        (
            "max_request_duration_s",
            {"cpu_bytes_to_use": GiB, "max_request_duration_s": -(10**5000)},
        ),
    ],
)
def test_an_integer_too_long_to_print_is_a_config_error_not_a_value_error(key, data):
    with pytest.raises(ConfigError, match="an integer of more than 4300 digits") as raised:
        TieringConfig.from_dict(data)
    assert str(raised.value).startswith(f"{key}: "), str(raised.value)


# -- strings that are not Unicode text (a lone surrogate written as a JSON escape) -----------

S = "\\ud800"  # a lone surrogate, as JSON writes it
TEXT_KEYS = [
    ("secondary_tiers[0].root_dir", tier(f'{{"type": "fs", "root_dir": "/tmp/kv{S}"}}')),
    ("secondary_tiers[0].name", tier(f'{{"type": "memory", "name": "m{S}"}}')),
    ("secondary_tiers[0].bucket", tier(f'{{"type": "obj", "bucket": "b{S}"}}')),
    ("trace_path", top(f'"trace_path": "/tmp/t{S}"')),
    ("secondary_tiers[0].prefix", tier(f'{{"type": "obj", "bucket": "b", "prefix": "p{S}"}}')),
    ("kv_events.topic", top(f'"kv_events": {{"topic": "{S}"}}')),
    ("integrity_key_file", top(f'"integrity_key_file": "/k{S}"')),
]


@pytest.mark.parametrize(("key", "text"), TEXT_KEYS)
def test_a_lone_surrogate_in_a_string_is_refused(tmp_path, capsys, key, text):
    assert_refused(write(tmp_path, text), key, capsys)


# -- integers of 2**63 or more where a number of seconds is expected -------------------------


@pytest.mark.parametrize("value", [str(1 << 63), str(10**30)])
def test_an_integer_past_2_63_is_refused_where_a_number_is_expected(tmp_path, capsys, value):
    path = write(tmp_path, top(f'"max_request_duration_s": {value}'))
    assert_refused(path, "max_request_duration_s", capsys)


@pytest.mark.parametrize("value", [(1 << 63) - 1, 1e-300, 86_401, 1e30])
def test_max_request_duration_s_takes_any_finite_number_above_0(value):
    config = TieringConfig.from_dict({"cpu_bytes_to_use": GiB, "max_request_duration_s": value})
    assert config.max_request_duration_s == float(value)


# -- endpoint_override: whitespace and control characters -----------------------------------

URL_TEXT = tier('{"type": "obj", "bucket": "b", "endpoint_override": %s}')


@pytest.mark.parametrize(
    "url",
    ["http://minio:9000\n", "http://minio:9000\t", " http://minio:9000", "http://min\rio:9000",
     "http://minio:9000/a b", "http://minio:9000/\u0000"],
)  # fmt: skip
def test_an_endpoint_url_with_whitespace_or_control_characters_is_refused(tmp_path, capsys, url):
    path = write(tmp_path, URL_TEXT % json.dumps(url))
    assert_refused(path, "secondary_tiers[0].endpoint_override", capsys)


# -- a tier of your own (module_path): its module, class and name ---------------------------

EXTERNAL = '{"module_path": %s, "type": %s, "name": %s}'


@pytest.mark.parametrize(
    ("key", "module", "cls", "name"),
    [
        ("module_path", "a\u0000b", "T", "t"),
        ("module_path", "a\ud800", "T", "t"),
        ("type", "tiers.mine", "", "t"),
        ("type", "tiers.mine", "T\u0000", "t"),
        ("name", "tiers.mine", "T", ""),
        ("name", "tiers.mine", "T", "t\u0000"),
        ("name", "tiers.mine", "T", "t\u001b[2J"),
    ],
)
def test_a_bad_module_class_or_name_of_a_tier_of_your_own_is_refused(
    tmp_path, capsys, key, module, cls, name
):
    entry = EXTERNAL % (json.dumps(module), json.dumps(cls), json.dumps(name))
    assert_refused(write(tmp_path, tier(entry)), f"secondary_tiers[0].{key}", capsys)


NAME_LIMIT = "n" * 100


@pytest.mark.parametrize("kind", ["fs", "obj", "p2p", "memory", "module"])
@pytest.mark.parametrize(
    "name",
    [
        "disk\nkvtier: counted: forged=1",  # a log line of its own
        "disk\u001b]0;owned\u0007",  # a terminal escape
        "disk\u202egnp.exe",  # a bidirectional override
        "disk\u2028two",  # a line separator
        "disk\u200b",  # a zero-width space (format character)
        " disk",
        "disk ",
        NAME_LIMIT + "n",
    ],
)
def test_a_tier_name_that_could_forge_a_line_or_drive_a_terminal_is_refused(
    tmp_path, capsys, kind, name
):
    assert_refused(write(tmp_path, tier(named(kind, name))), "secondary_tiers[0].name", capsys)


@pytest.mark.parametrize("name", ["диск-ß", "磁盘 缓存", "nvme0 (rack 3)", "fs#2", NAME_LIMIT, "ü"])
def test_a_tier_name_in_any_script_with_inner_spaces_and_up_to_the_limit_is_accepted(
    tmp_path, name
):
    for kind in ("fs", "obj", "p2p", "memory", "module"):
        (parsed,) = TieringConfig.load(write(tmp_path, tier(named(kind, name)))).secondary_tiers
        assert parsed.name == name


def named(kind: str, name: str) -> str:
    """A tier entry of ``kind`` called ``name``."""
    entries = {
        "fs": '{"type": "fs", "root_dir": "/tmp/kv"',
        "obj": '{"type": "obj", "bucket": "kv", "endpoint_override": "http://127.0.0.1:9"',
        "p2p": '{"type": "p2p", "host": "127.0.0.1", "port": 5710',
        "memory": '{"type": "memory"',
        "module": '{"module_path": "tiers.mine", "type": "T"',
    }
    return f'{entries[kind]}, "name": {json.dumps(name)}}}'


def test_a_tier_of_your_own_with_a_dotted_module_name_is_accepted(tmp_path):
    entry = EXTERNAL % ('"my_tiers.sub_2"', '"MyTier"', '"mine"')
    (parsed,) = TieringConfig.load(write(tmp_path, tier(entry))).secondary_tiers
    assert (parsed.module_path, parsed.class_name, parsed.name) == (
        "my_tiers.sub_2",
        "MyTier",
        "mine",
    )


# -- fs bounds: at least one chunk file ------------------------------------------------------


@pytest.mark.parametrize("key", ["max_bytes", "root_dir_max_bytes"])
def test_an_fs_bound_of_0_bytes_is_refused(tmp_path, capsys, key):
    path = write(tmp_path, tier(f'{{"type": "fs", "root_dir": "/tmp/kv", "{key}": 0}}'))
    assert_refused(path, f"secondary_tiers[0].{key}", capsys)


@pytest.mark.parametrize("key", ["max_bytes", "root_dir_max_bytes"])
def test_an_fs_bound_of_1_byte_is_left_to_the_tier_which_knows_the_chunk_size(tmp_path, key):
    path = write(tmp_path, tier(f'{{"type": "fs", "root_dir": "/tmp/kv", "{key}": 1}}'))
    (parsed,) = TieringConfig.load(path).secondary_tiers
    assert getattr(parsed, key) == 1


# -- both sides of each documented bound (docs/configuration.md) -----------------------------

DAY = 86_400
CENTURY = 36_500 * DAY


def at(path: str, value: Any) -> dict[str, Any]:
    """A configuration with ``value`` at ``path`` (``serve.port``, ``secondary_tiers[0].x``)."""
    entries: dict[str, dict[str, Any]] = {
        "serve": {"port": 1},
        "kv_events": {},
        "slo_guard": {"ttft_p99_s": 1},
        "deadlines": {},
        "admission": {},
        "fs": {"type": "fs", "root_dir": "/tmp/kv"},
        "obj": {"type": "obj", "bucket": "b", "reconnect_min_s": 1e-9},
        "p2p": {"type": "p2p", "host": "h", "port": 1},
        "fault": {"type": "fault", "inner": {"type": "memory"}},
    }
    head, _, key = path.partition(".")
    if not key:
        return {"cpu_bytes_to_use": GiB, head: value}
    entry = {**entries[head], key: value}
    if head == "admission":
        return {"cpu_bytes_to_use": GiB, "admission": [entry]}
    if head in ("fs", "obj", "p2p", "fault"):
        return {"cpu_bytes_to_use": GiB, "secondary_tiers": [entry]}
    return {"cpu_bytes_to_use": GiB, head: entry}


BOUNDS = [
    ("store_threshold", [1, 255], [0, 256]),
    ("secondary_min_priority", [0, 100], [-1, 101]),
    ("max_request_priority", [0, 100], [-1, 101]),
    ("max_request_duration_s", [1e-9, 2 * CENTURY], [0, -1e-9]),
    ("metrics_port", [1, 65535], [0, 65536]),
    ("serve.hold_timeout_s", [1e-9, DAY], [0, DAY + 0.001]),
    ("kv_events.hwm", [1, (1 << 31) - 1], [0, 1 << 31]),
    ("admission.min_reuse", [1, 255], [0, 256]),
    ("admission.min_frequency", [1, 255], [0, 256]),
    ("admission.frequency_window", [1, 1 << 40], [0, (1 << 40) + 1]),
    ("admission.min_prefix_chunks", [0, 1 << 40], [-1, (1 << 40) + 1]),
    ("slo_guard.promotion_p99_s", [1e-9, DAY], [0, DAY + 0.001]),
    ("slo_guard.window_s", [1e-9, DAY], [0, DAY + 0.001]),
    ("slo_guard.sustain_s", [1e-9, DAY], [0, DAY + 0.001]),
    ("slo_guard.cooldown_s", [1e-9, DAY], [0, DAY + 0.001]),
    ("slo_guard.min_samples", [1, 4096], [0, 4097]),
    ("slo_guard.recover_ratio", [1e-9, 1], [0, 1.000001, -0.5]),
    ("deadlines.promotion_s", [1e-9, DAY], [0, DAY + 0.001]),
    ("deadlines.store_s", [1e-9, DAY], [0, DAY + 0.001]),
    ("deadlines.probe_s", [1e-9, DAY], [0, DAY + 0.001]),
    ("fs.n_write_threads", [1, 1024], [0, 1025]),
    ("fs.negative_ttl_s", [0, DAY], [-1e-9, DAY + 0.001]),
    ("obj.io_threads", [1, 1024], [0, 1025]),
    ("obj.circuit_failures", [1, (1 << 63) - 1], [0, 1 << 63]),
    ("obj.max_age_s", [1, CENTURY], [0.999, CENTURY + 1]),
    ("obj.reconnect_max_s", [1e-9, DAY], [0, DAY + 0.001]),
    ("p2p.hit_ttl_s", [0, DAY], [-1e-9, DAY + 0.001]),
    ("p2p.timeout_s", [1e-9, DAY], [0, DAY + 0.001]),
    ("fault.delay_s", [0, DAY], [-1e-9, DAY + 0.001]),
]


def _cases(side: int) -> list[tuple[str, Any]]:
    return [(path, value) for path, *values in BOUNDS for value in values[side]]


@pytest.mark.parametrize(("path", "value"), _cases(0))
def test_a_value_at_a_documented_bound_is_accepted(path, value):
    TieringConfig.from_dict(at(path, value))


@pytest.mark.parametrize(("path", "value"), _cases(1))
def test_a_value_just_past_a_documented_bound_is_refused_naming_the_key(path, value):
    head, _, key = path.partition(".")
    where = {"admission": "admission[0]", "fs": "secondary_tiers[0]", "obj": "secondary_tiers[0]",
             "p2p": "secondary_tiers[0]", "fault": "secondary_tiers[0]"}.get(head, head)  # fmt: skip
    with pytest.raises(ConfigError) as raised:
        TieringConfig.from_dict(at(path, value))
    assert str(raised.value).startswith(f"{where}.{key}: " if key else f"{head}: ")
