"""Hostile configuration values (issue 11, items 5 and 10a).

Every float is finite and in range, every port is 1-65535, hosts and endpoints are checked for
their syntax, and every error is a ``ConfigError`` whose message starts with the key's path,
whether the config comes from JSON, from a dict, or is built by hand.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import typing

import pytest

from kvtier import TieringConfig, TieringManager
from kvtier.config import (
    TIER_CONFIGS,
    KVEventsConfig,
    ObjTierConfig,
    P2PTierConfig,
    PeerAddress,
    ServeConfig,
)
from kvtier.config.addresses import redact_url
from kvtier.config.checks import check_fields, field_marks, listen_errors, physical_memory_bytes
from kvtier.errors import ConfigError, KVTierError
from tests.conftest import config, free_port

BASE = '{"cpu_bytes_to_use": 4096, %s}'
TIER = BASE % '"secondary_tiers": [%s]'
P2P = '{"type": "p2p", "host": "h", "port": 1, %s}'
OBJ = '{"type": "obj", "bucket": "b", %s}'
FS = '{"type": "fs", "root_dir": "/x", %s}'

#: (key path, JSON text with one ``%s`` where the value goes).
FLOAT_KEYS = [
    ("secondary_tiers[0].timeout_s", TIER % (P2P % '"timeout_s": %s')),
    ("secondary_tiers[0].hit_ttl_s", TIER % (P2P % '"hit_ttl_s": %s')),
    ("serve.hold_timeout_s", BASE % '"serve": {"port": 1, "hold_timeout_s": %s}'),
    ("secondary_tiers[0].negative_ttl_s", TIER % (FS % '"negative_ttl_s": %s')),
    ("secondary_tiers[0].timeout_s", TIER % (OBJ % '"timeout_s": %s')),
    ("secondary_tiers[0].reconnect_min_s", TIER % (OBJ % '"reconnect_min_s": %s')),
    ("secondary_tiers[0].reconnect_max_s", TIER % (OBJ % '"reconnect_max_s": %s')),
    ("secondary_tiers[0].max_age_s", TIER % (OBJ % '"max_age_s": %s')),
    ("secondary_tiers[0].delay_s", TIER % '{"type": "fault", "inner": {"type": "memory"}, "delay_s": %s}'),
]  # fmt: skip
INT_KEYS = [
    ("cpu_bytes_to_use", '{"cpu_bytes_to_use": %s}'),
    ("block_size", BASE % '"block_size": %s'),
    ("blocks_per_chunk", BASE % '"blocks_per_chunk": %s'),
    ("metrics_port", BASE % '"metrics_port": %s'),
    ("serve.port", BASE % '"serve": {"port": %s}'),
    ("kv_events.hwm", BASE % '"kv_events": {"hwm": %s}'),
    ("secondary_tiers[0].port", TIER % '{"type": "p2p", "host": "h", "port": %s}'),
    ("secondary_tiers[0].peers[0].port", TIER % '{"type": "p2p", "peers": [{"host": "h", "port": %s}]}'),
    ("secondary_tiers[0].capacity_bytes", TIER % '{"type": "memory", "capacity_bytes": %s}'),
    ("secondary_tiers[0].n_threads", TIER % '{"type": "memory", "n_threads": %s}'),
    ("secondary_tiers[0].n_read_threads", TIER % (FS % '"n_read_threads": %s')),
    ("secondary_tiers[0].max_bytes", TIER % (FS % '"max_bytes": %s')),
    ("secondary_tiers[0].min_free_bytes", TIER % (FS % '"min_free_bytes": %s')),
    ("secondary_tiers[0].io_threads", TIER % (OBJ % '"io_threads": %s')),
    ("secondary_tiers[0].circuit_failures", TIER % (OBJ % '"circuit_failures": %s')),
    ("secondary_tiers[0].max_bytes", TIER % (OBJ % '"max_bytes": %s')),
]  # fmt: skip
PORT_KEYS = [case for case in INT_KEYS if case[0].endswith("port")]
HOST_KEYS = [
    ("metrics_host", BASE % '"metrics_port": 9464, "metrics_host": %s'),
    ("serve.host", BASE % '"serve": {"port": 1, "host": %s}'),
    ("secondary_tiers[0].host", TIER % '{"type": "p2p", "host": %s, "port": 1}'),
    ("secondary_tiers[0].peers[0].host", TIER % '{"type": "p2p", "peers": [{"host": %s, "port": 1}]}'),
]  # fmt: skip
ENDPOINT = ("kv_events.endpoint", BASE % '"kv_events": {"endpoint": %s}')
URL = ("secondary_tiers[0].endpoint_override", TIER % (OBJ % '"endpoint_override": %s'))


def cases(keys: list[tuple[str, str]], values: list[str]) -> list[tuple[str, str]]:
    return [(key, text % value) for key, text in keys for value in values]


HOSTILE = (
    cases(FLOAT_KEYS, ["NaN", "Infinity", "-Infinity", "1e400", "1e300", "-1", "true", '"1"'])
    + cases(INT_KEYS, ["-1", "1e400", "NaN", "true", "1.5", '"7"', str(1 << 64), "9" * 30])
    + cases(PORT_KEYS, ["0", "65536", "70000"])
    + cases(HOST_KEYS, ['"999.1.1.1"', '""', '"a b"', '"1.2.3"', '"-h"', '"h\\u0000"', "7"])
    + cases([ENDPOINT], ['"tcp://nonsense:x"', '""', '"tcp://*:70000"', '"tcp://*:0"',
                         '"udp://h:1"', '"tcp://999.1.1.1:5557"', '"nonsense"', '"tcp://::1:5"'])
    + cases([URL], ['"http://999.1.1.1:x"', '"http://h:99999"', '"ftp://h"', '"http://"'])
)  # fmt: skip


@pytest.mark.parametrize(("key", "text"), HOSTILE)
def test_hostile_values_are_config_errors_naming_the_key(key, text):
    with pytest.raises(ConfigError) as raised:
        TieringConfig.from_json(text)
    assert str(raised.value).startswith(f"{key}: "), str(raised.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
        ('{"cpu_bytes_to_use": ' + "9" * 5000 + "}", "not valid JSON"),
        ('{"cpu_bytes_to_use": 1e400}', "cpu_bytes_to_use: expected an integer"),
    ],
)
def test_json_that_breaks_the_decoder_is_a_config_error(text, message):
    with pytest.raises(ConfigError, match=message):
        TieringConfig.from_json(text)


def test_deeply_nested_tiers_are_a_config_error():
    tier: dict[str, object] = {"type": "memory"}
    for _ in range(5000):
        tier = {"type": "fault", "inner": tier}
    with pytest.raises(ConfigError, match="nested deeper than"):
        TieringConfig.from_dict({"cpu_bytes_to_use": 4096, "secondary_tiers": [tier]})


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ServeConfig(port=70000), "port: expected a TCP port"),
        (lambda: ServeConfig(port=1, host="999.1.1.1"), "host: expected an IP address"),
        (lambda: ServeConfig(port=1, hold_timeout_s=float("inf")), "hold_timeout_s:"),
        (lambda: P2PTierConfig(host="h", port=1, timeout_s=float("nan")), "timeout_s:"),
        (lambda: PeerAddress("a b", 1), "host: expected an IP address"),
        (lambda: KVEventsConfig(endpoint="tcp://nonsense:x"), "endpoint: expected tcp://"),
        (lambda: KVEventsConfig(hwm=1 << 40), "hwm: expected a positive integer"),
        (lambda: TieringConfig(cpu_bytes_to_use=True), "cpu_bytes_to_use: expected an integer"),
        (lambda: TieringConfig(cpu_bytes_to_use=1, metrics_port=0), "metrics_port: expected a TCP port"),
        (lambda: ObjTierConfig(bucket="b", reconnect_min_s=40), "reconnect_max_s: expected at least"),
    ],
)  # fmt: skip
def test_configs_built_by_hand_are_checked_too(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_every_number_of_every_config_declares_its_range():
    classes = [*TIER_CONFIGS.values(), PeerAddress, ServeConfig, KVEventsConfig, TieringConfig]
    unchecked = []
    for cls in classes:
        plain, marked = typing.get_type_hints(cls), typing.get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            numeric = {int, float} & {plain[f.name], *typing.get_args(plain[f.name])}
            if numeric and not field_marks(marked[f.name]):
                unchecked.append(f"{cls.__name__}.{f.name}")
    assert unchecked == []
    check_fields(TieringConfig(cpu_bytes_to_use=1))  # a valid config passes its own checks


def test_good_hosts_endpoints_and_urls_pass():
    extra = {
        "serve": {"port": 5710, "host": "*"},
        "metrics_port": 65535,
        "metrics_host": "::1",
        "kv_events": {"endpoint": "tcp://[::1]:5557", "topic": ""},
        "secondary_tiers": [
            {"type": "p2p", "peers": [{"host": "node-1.example.com", "port": 5710}]},
            {
                "type": "obj",
                "bucket": "b",
                "endpoint_override": "https://[::1]:9000",
                "reconnect_min_s": 1,
                "reconnect_max_s": 1,
            },
        ],
    }
    parsed = TieringConfig.from_dict({"cpu_bytes_to_use": 4096, **extra})
    assert parsed.kv_events is not None and parsed.kv_events.topic == ""


def test_readme_kv_events_example_parses_and_defaults_to_loopback():
    text = '{"cpu_bytes_to_use": 4096, "kv_events": {"endpoint": "tcp://*:5557", "topic": ""}}'
    assert TieringConfig.from_json(text).kv_events == KVEventsConfig("tcp://*:5557", "")
    default = TieringConfig.from_dict({"cpu_bytes_to_use": 4096, "kv_events": {}}).kv_events
    assert default is not None and default.endpoint == "tcp://127.0.0.1:5557"


def test_a_credential_of_the_wrong_type_is_not_repeated():
    secret = 918273645546372819
    entry = {"type": "obj", "bucket": "b", "access_key": "a", "secret_key": secret}
    with pytest.raises(ConfigError) as raised:
        TieringConfig.from_dict({"cpu_bytes_to_use": 1, "secondary_tiers": [entry]})
    assert str(raised.value).startswith("secondary_tiers[0].secret_key: ")
    assert str(secret) not in str(raised.value)
    url = "http://user:hunter2@minio:9000/?X-Amz-Signature=s3cr3t"
    with pytest.raises(ConfigError) as raised:
        ObjTierConfig(bucket="b", endpoint_override=url.replace(":9000", ":x"))
    assert "hunter2" not in str(raised.value) and "s3cr3t" not in str(raised.value)
    assert redact_url(url) == "http://***@minio:9000/?***"


def test_host_memory_beyond_physical_memory_is_a_config_error(identity):
    physical = physical_memory_bytes()
    assert physical is not None
    too_much = TieringConfig.from_dict({"cpu_bytes_to_use": 2 * physical})
    before = set(threading.enumerate())
    with pytest.raises(ConfigError, match=r"cpu_bytes_to_use: .* exceed this host's physical"):
        TieringManager(too_much, identity)
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []


def held_port() -> tuple[socket.socket, int]:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder, holder.getsockname()[1]


def can_bind(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_failed_start_releases_what_was_already_started(identity):
    holder, busy = held_port()
    events_port, metrics_port = free_port(), free_port()
    extra = {
        "kv_events": {"endpoint": f"tcp://127.0.0.1:{events_port}"},
        "metrics_port": metrics_port,
        "serve": {"port": busy},
    }
    with holder, pytest.raises(KVTierError, match="serve"):
        TieringManager(config(4, **extra), identity)
    assert can_bind(events_port) and can_bind(metrics_port)


@pytest.mark.parametrize(
    ("key", "extra"),
    [
        ("metrics_host", {"metrics_port": 1, "metrics_host": "nosuchhost.invalid"}),
        ("metrics_port", {"metrics_port": "BUSY"}),
        ("kv_events.endpoint", {"kv_events": {"endpoint": "tcp://127.0.0.1:BUSY"}}),
        ("serve.port", {"serve": {"port": "BUSY"}}),
    ],
)
def test_bind_and_resolve_failures_at_start_are_config_errors(identity, key, extra):
    holder, busy = held_port()
    extra = json.loads(json.dumps(extra).replace('"BUSY"', str(busy)).replace("BUSY", str(busy)))
    with holder, pytest.raises(ConfigError) as raised:
        TieringManager(config(4, **extra), identity)
    assert key in str(raised.value).split(": ")[0]


def test_listen_errors_name_the_key_and_let_other_errors_through():
    zmq = pytest.importorskip("zmq")
    holder, busy = held_port()
    context = zmq.Context()
    failures = [
        lambda: socket.getaddrinfo("nosuchhost.invalid", 1),
        lambda: context.socket(zmq.PUB).bind(f"tcp://127.0.0.1:{busy}"),
        lambda: socket.socket().bind(("127.0.0.1", 1 << 20)),
    ]
    try:
        for fail in failures:
            expected = pytest.raises(ConfigError, match=r"^k\.e: cannot listen on h:1 ")
            with expected, listen_errors("k.e", "h:1"):
                fail()
        with pytest.raises(KeyError), listen_errors("k.e", "h:1"):
            raise KeyError("not a bind failure")
    finally:
        holder.close()
        context.destroy(linger=0)
