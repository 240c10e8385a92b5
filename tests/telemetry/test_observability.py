"""Metrics scraped over HTTP and KV events over ZeroMQ, checked against what a workload did."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtier import RETRY, TieringConfig, TieringManager
from kvtier.telemetry.kv_events import EventKind, EventSubscriber
from tests.child_process import child_env
from tests.conftest import fill, has_output, make_keys, on_a_free_port, read_line

SLOTS = 4


def make_manager(identity, tmp_path: Path, tiers: list, **extra) -> TieringManager:
    stride = -(-identity.layout.chunk_bytes // 4096) * 4096
    config = TieringConfig.from_dict(
        {"cpu_bytes_to_use": SLOTS * stride, "secondary_tiers": tiers, **extra}
    )
    return TieringManager(config, identity)


def store(m, keys):
    plan = m.prepare_store(keys)
    for key, slot in zip(plan.keys, plan.slots):
        fill(m.region, slot, key)
    m.complete_store(plan.keys)
    assert m.wait_idle(10)


def settle(m, keys):
    deadline = time.monotonic() + 10
    while (n := m.lookup(keys)) is RETRY:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    return n


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_over_http_match_the_workload(identity, tmp_path):
    tiers = [
        {"type": "fs", "root_dir": str(tmp_path / "fs"), "n_read_threads": 2, "n_write_threads": 2},
        {"type": "fault", "inner": {"type": "memory"}, "fail_store": True, "name": "flaky"},
    ]
    chunk = identity.layout.chunk_bytes
    tokens = identity.layout.tokens_per_chunk
    m, port = on_a_free_port(lambda p: make_manager(identity, tmp_path, tiers, metrics_port=p))
    with m:
        prefix = make_keys(identity, 3, seed=1)
        store(m, prefix)
        store(m, make_keys(identity, SLOTS, seed=2))  # pushes the prefix out of host
        assert settle(m, prefix) == 3
        m.prepare_load(prefix)
        m.complete_load(prefix)
        unknown = make_keys(identity, 2, seed=3)
        assert settle(m, unknown) == 0
        m.touch(make_keys(identity, 1, seed=4))
        m.touch(make_keys(identity, 3, seed=5), hit=False)  # recency only: not a hit
        got = scrape(port)

    def value(name, **labels):
        return got.get((name, tuple(sorted(labels.items()))), 0)

    stored = 3 + SLOTS
    assert value("kvtier_stored_chunks_total") == stored
    assert value("kvtier_tier_chunks_total", tier="fs", op="store", outcome="ok") == stored
    assert value("kvtier_tier_bytes_total", tier="fs", op="store") == stored * chunk
    assert value("kvtier_tier_chunks_total", tier="flaky", op="store", outcome="failed") == stored
    assert value("kvtier_tier_job_failures_total", tier="flaky", op="store") == 2
    assert value("kvtier_tier_chunks_total", tier="fs", op="load", outcome="ok") == 3
    assert value("kvtier_tier_job_seconds_count", tier="fs", op="load") == 1
    assert value("kvtier_tier_bytes_total", tier="fs", op="load") == 3 * chunk
    assert value("kvtier_evicted_chunks_total") == 3 + 3  # the prefix, then room for promotions
    assert value("kvtier_prompt_tokens_total", source="fs") == 3 * tokens
    assert value("kvtier_prompt_tokens_total", source="accelerator") == tokens
    assert value("kvtier_prompt_tokens_total", source="recomputed") == 2 * tokens
    assert value("kvtier_recomputed_chunks_total", reason="never_stored") == 2
    assert value("kvtier_transfer_bytes_total", direction="accelerator_to_host") == stored * chunk
    assert value("kvtier_transfer_bytes_total", direction="host_to_accelerator") == 3 * chunk
    assert value("kvtier_host_fill_ratio") == 1.0
    assert value("kvtier_host_slots", state="free") == 0
    assert value("kvtier_tier_lookups_total", tier="fs", result="hit") >= 3
    assert value("kvtier_tier_lookups_total", tier="flaky", result="miss") >= 1  # unknown keys
    assert value("kvtier_tier_lookups_total", tier="flaky", result="hit") == 0


def reason_counts(m) -> dict[str, float]:
    prefix = "kvtier_recomputed_chunks_total{reason="
    return {
        k[len(prefix) : -1]: v for k, v in m.stats()["counters"].items() if k.startswith(prefix)
    }


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ({"fail_store": True}, "evicted"),
        ({"raise_in_lookup": True}, "tier_unavailable"),
        ({"fail_load": True}, "promotion_failed"),
    ],
)
def test_each_recomputed_chunk_has_one_reason(identity, tmp_path, fault, reason):
    tiers = [{"type": "fault", "inner": {"type": "memory"}, **fault}]
    with make_manager(identity, tmp_path, tiers) as m:
        keys = make_keys(identity, 2)
        store(m, keys)
        store(m, make_keys(identity, SLOTS, seed=9))
        assert settle(m, keys) == 0
        assert reason_counts(m) == {reason: 2}


def test_integrity_failure_is_its_own_reason(identity, tmp_path):
    root = tmp_path / "fs"
    with make_manager(identity, tmp_path, [{"type": "fs", "root_dir": str(root)}]) as m:
        keys = make_keys(identity, 1)
        store(m, keys)
        store(m, make_keys(identity, SLOTS, seed=9))
        (path,) = [p for p in root.rglob(keys[0].hex())]
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        assert settle(m, keys) == 0
        assert reason_counts(m) == {"integrity_failure": 1}
        assert m.metrics.telemetry.get("kvtier_tier_integrity_failures_total", tier="fs") == 1


def test_host_full_and_store_in_flight_reasons(identity, tmp_path):
    with make_manager(identity, tmp_path, [{"type": "memory"}]) as m:
        keys = make_keys(identity, 1)
        store(m, keys)
        pinned = make_keys(identity, SLOTS, seed=9)
        store(m, pinned)
        m.prepare_load(pinned)
        assert settle(m, keys) == 0
        m.complete_load(pinned)
        writing = make_keys(identity, 1, seed=10)
        m.prepare_store(writing)
        assert m.lookup(writing) == 0
        assert reason_counts(m) == {"host_full": 1, "store_in_flight": 1}


class BlockStored(msgspec.Struct, tag=True):
    """The shape vLLM consumers decode (vllm.distributed.kv_events), written from its docs:
    tagged maps (vLLM >= 0.32)."""

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: list[bytes]
    medium: str | None


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[BlockStored | BlockRemoved]


class ArrayBlockStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    """The same events as tagged arrays (vLLM before 0.32)."""

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class ArrayBlockRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[bytes]
    medium: str | None


class ArrayKVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[ArrayBlockStored | ArrayBlockRemoved]


def publishing_manager(identity, tmp_path, tiers, topic=None):
    """A manager publishing KV events on a port it found free, and that endpoint."""

    def bind(port):
        events_config = {"endpoint": f"tcp://127.0.0.1:{port}"}
        if topic is not None:
            events_config["topic"] = topic
        return make_manager(identity, tmp_path, tiers, kv_events=events_config)

    m, port = on_a_free_port(bind)
    return m, f"tcp://127.0.0.1:{port}"


def extras(event) -> dict:
    """kvtier's own keys of a wire event (``seq``, ``kind``, ``source``, ``destination``): keys
    of the event's map, or the trailing map of an array-like event."""
    return event if isinstance(event, dict) else event[-1]


def wire_seq(event) -> int:
    """The kvtier sequence number a wire event carries."""
    return extras(event)["seq"]


def warm_up(m, identity, arrived, timeout=30.0):
    """Store warm-up chunks until ``arrived(seq)`` says the subscriber got the event ``seq``.

    A PUB socket drops what it sends before a subscription reaches it (ZeroMQ's slow joiner),
    so the subscriber is ready once one batch came through; everything published later arrives.
    Each try waits for the latest event, so none of the warm-up is still on its way afterwards;
    its local events are taken too.
    """
    deadline = time.monotonic() + timeout
    for seed in itertools.count(10_000):
        store(m, make_keys(identity, 1, seed=seed))  # wait_idle: every event is published
        if arrived(m.take_events()[-1].seq):
            return
        assert time.monotonic() < deadline, f"no published event arrived within {timeout} s"


def test_events_on_the_socket_match_the_chunk_movements(identity, tmp_path):
    tiers = [{"type": "memory", "name": "ram"}]
    m, endpoint = publishing_manager(identity, tmp_path, tiers, topic="kv")
    with m:
        subscriber = EventSubscriber(endpoint, "kv")

        def arrived(last):
            batches = subscriber.batches(timeout_s=0.1)
            return any(wire_seq(e) == last for _, _, events in batches for e in events)

        warm_up(m, identity, arrived)
        keys = make_keys(identity, 2)
        store(m, keys)
        store(m, make_keys(identity, SLOTS, seed=5))
        settle(m, keys)
        m.poll()
        local = m.take_events()
        received = list(stream_until(subscriber.batches(timeout_s=10.0), len(local)))
        subscriber.close()
    batches = [seq for seq, _, _ in received]
    assert batches == list(range(batches[0], batches[0] + len(batches)))
    wire = [e for _, _, events in received for e in events]
    assert [wire_seq(e) for e in wire] == [e.seq for e in local]
    assert [(extras(e)["kind"], extras(e)["source"], extras(e)["destination"]) for e in wire] == [
        (e.kind.value, e.source, e.destination) for e in local
    ]
    assert {e.kind for e in local} == {
        EventKind.STORED,
        EventKind.WRITTEN,
        EventKind.EVICTED,
        EventKind.PROMOTED,
    }
    if isinstance(wire[0], dict):  # vLLM >= 0.32: tagged maps, secondary tiers are STORAGE
        mediums = {(e["type"], e["medium"], e["ownership"]) for e in wire}
        stored_in_ram = ("BlockStored", "STORAGE", "ram")
        assert mediums == {
            ("BlockStored", "CPU", None),
            stored_in_ram,
            ("BlockRemoved", "CPU", None),
        }
    else:  # tagged arrays, a secondary tier's medium is its name
        mediums = {(e[0], e[2] if e[0] == "BlockRemoved" else e[6]) for e in wire}
        assert mediums == {("BlockStored", "CPU"), ("BlockStored", "RAM"), ("BlockRemoved", "CPU")}


def stream_until(stream, count):
    seen = 0
    for item in stream:
        yield item
        seen += len(item[2])
        if seen >= count:
            return


def test_wire_format_decodes_with_vllm_structs(identity, tmp_path):
    from kvtier.telemetry.kv_events import encode_batch

    with make_manager(identity, tmp_path, [{"type": "memory"}]) as m:
        keys = make_keys(identity, 1)
        store(m, keys)
        store(m, make_keys(identity, SLOTS, seed=5))
        local = m.take_events()
    payload = encode_batch(local, 8, 1.5)
    maps = isinstance(msgspec.msgpack.decode(payload)[1][0], dict)
    batch = msgspec.msgpack.decode(payload, type=KVEventBatch if maps else ArrayKVEventBatch)
    stored, removed = (BlockStored, BlockRemoved) if maps else (ArrayBlockStored, ArrayBlockRemoved)
    assert batch.ts == 1.5 and len(batch.events) == len(local)
    first = batch.events[0]
    assert isinstance(first, stored) and first.block_hashes == [bytes(keys[0])]
    assert first.medium == "CPU" and first.block_size == 8
    removed = [e for e in batch.events if isinstance(e, removed)]
    assert [e.block_hashes[0] for e in removed] == [bytes(keys[0])]


def test_kvtier_events_prints_what_arrives(identity, tmp_path):
    """``kvtier events`` says on stderr once it is subscribed; then it prints each event."""
    m, endpoint = publishing_manager(identity, tmp_path, [])
    command = [
        sys.executable,
        "-m",
        "kvtier.cli",
        "events",
        "--connect",
        endpoint,
        "--timeout",
        "120",
    ]
    with m:
        printer = subprocess.Popen(
            command, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            said = read_line(printer, 60, "kvtier events to subscribe", printer.stderr)
            assert said.startswith(b"kvtier events: subscribed to "), said

            def arrived(last):
                if not has_output(printer.stdout, 0.1):
                    return False
                while not read_line(printer, 10, "warm-up event").startswith(b"#%d " % last):
                    pass
                return True

            warm_up(m, identity, arrived)
            keys = make_keys(identity, 2)
            store(m, keys)
            stored = m.take_events()
            lines = [read_line(printer, 10, f"event {i}").decode() for i in range(2)]
        finally:
            printer.terminate()
            rest, errors = printer.communicate(timeout=30)
    assert lines[0].startswith(f"#{stored[0].seq} stored") and "accelerator -> host" in lines[0]
    assert lines[1].startswith(f"#{stored[1].seq} stored")
    assert keys[1].hex()[:16] in lines[1] and "CPU" in lines[1]
    assert rest == b"", "nothing else was published"
    assert b"missed" not in errors


def test_grafana_dashboard_uses_only_exported_metrics():
    import json
    import re

    from kvtier.telemetry.metrics import MANAGER_FAMILIES

    dashboard = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "kvtier-dashboard.json"
    exprs = [t["expr"] for p in json.loads(dashboard.read_text())["panels"] for t in p["targets"]]
    used = {
        re.sub(r"_(bucket|sum|count)$", "", n) for e in exprs for n in re.findall(r"kvtier_\w+", e)
    }
    exported = {name for name, _, _ in MANAGER_FAMILIES} | {
        "kvtier_host_slots",
        "kvtier_host_fill_ratio",
        "kvtier_tier_enabled",  # a gauge of TieringManager.prometheus_collector
    }
    assert used and used <= exported


def test_a_tier_registers_its_own_metrics_and_they_are_exported(identity, tmp_path):
    from prometheus_client import generate_latest

    tiers = [{"module_path": "tests.plugins.outside_tier", "type": "MeteredTier", "name": "m1"}]
    with make_manager(identity, tmp_path, tiers) as m:
        store(m, make_keys(identity, 1))
        store(m, make_keys(identity, SLOTS, seed=2))
        settle(m, make_keys(identity, 1))
        text = generate_latest(m.prometheus_registry()).decode()
    assert 'kvtier_tier_probes_total{kind="lookup",tier="m1"} 1.0' in text
    assert 'kvtier_tier_probe_seconds_bucket{le="0.005",tier="m1"} 1.0' in text
    assert 'kvtier_tier_depth{tier="m1"} 7.0' in text
    assert 'kvtier_tier_stat{stat="circuit_state",tier="m1"} 1.0' in text


def test_events_switched_off_for_publishing_fill_no_outbox(identity, tmp_path):
    """``enable_kv_cache_events: false`` opens no socket, and nothing queues events for one:
    they stay in ``take_events`` only (a bounded log), not in a second copy nobody drains."""
    events = {"enable_kv_cache_events": False}
    with make_manager(identity, tmp_path, [], kv_events=events) as m:
        keys = make_keys(identity, 3)
        store(m, keys)
        assert m._events.take_outbox() == []
        assert [e.kind for e in m.take_events()] == [EventKind.STORED] * 3
