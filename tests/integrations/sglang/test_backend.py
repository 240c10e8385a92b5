"""The SGLang backend's contract, without SGLang: kvtier's environment, a host pool shaped like
SGLang's (``host_pool``), real fs tiers in a temporary directory.

Round trips zero-copy and generic, prefix semantics of lookups and loads, a corrupted chunk as
a miss, existing pages as successes, three SGLang threads at once, ``clear`` of one namespace,
the identity (dtype and revision separate caches, the DP rank does not), sidecar pools, a
switched-off tier, bad configuration naming its key, KV events with SGLang's page hashes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kvtier.errors import ConfigError
from kvtier.integrations.sglang import HiCacheBackend
from kvtier.integrations.sglang.identity import page_hash
from kvtier.integrations.sglang.stats import IoStats
from tests.integrations.sglang.host_pool import MhaHostPool, StorageConfig, extra, page_keys
from tests.tiers.s3_server import ACCESS_KEY, SECRET_KEY, MotoServer


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "l3")


def attach(pool: MhaHostPool, config: StorageConfig) -> HiCacheBackend:
    backend = HiCacheBackend(config)
    backend.register_mem_pool_host(pool)
    backend.on_host_pools_registered()
    return backend


@pytest.fixture
def opened() -> Iterator[list[HiCacheBackend]]:
    backends: list[HiCacheBackend] = []
    yield backends
    for backend in backends:
        backend.close()


def open_backend(
    opened: list[HiCacheBackend], root: str, pool: MhaHostPool | None = None, **kw: Any
) -> tuple[HiCacheBackend, MhaHostPool]:
    pool = pool or MhaHostPool()
    config = StorageConfig(extra(root, **kw.pop("kvtier", {})), **kw)
    backend = attach(pool, config)
    opened.append(backend)
    return backend, pool


def stored(
    backend: HiCacheBackend, pool: MhaHostPool, keys: list[str], first: int = 0
) -> list[torch.Tensor]:
    pages = list(range(first, first + len(keys)))
    for page in pages:
        pool.fill(page, seed=hash(keys[page - first]) % 10_000)
    assert backend.batch_set_v1(keys, pool.page_indices(pages)) == [True] * len(keys)
    return [pool.page(p) for p in pages]


def test_round_trip_in_place_and_after_restart(root: str, opened: list[HiCacheBackend]) -> None:
    backend, pool = open_backend(opened, root)
    keys = page_keys(6)
    before = stored(backend, pool, keys)
    assert backend.batch_exists(keys) == 6
    pool.kv_buffer.zero_()
    assert backend.batch_get_v1(keys, pool.page_indices([10, 11, 12, 13, 14, 15])) == [True] * 6
    assert all(torch.equal(before[i], pool.page(10 + i)) for i in range(6))
    backend.close()
    again, pool2 = open_backend(opened, root)  # a restart: the tier's scan finds the chunks
    wait_for(lambda: again.batch_exists(keys) == 6)
    assert again.batch_get_v1(keys, pool2.page_indices(list(range(6)))) == [True] * 6
    assert all(torch.equal(before[i], pool2.page(i)) for i in range(6))


def wait_for(condition: Any, tries: int = 2000) -> None:
    """Until ``condition()`` holds (a tier's probe or scan answers on its own threads)."""
    for _ in range(tries):
        if condition():
            return
        time.sleep(0.005)
    raise AssertionError("condition never held")


def test_prefix_semantics(root: str, opened: list[HiCacheBackend]) -> None:
    backend, pool = open_backend(opened, root)
    keys = page_keys(4)
    stored(backend, pool, [keys[0]])
    stored(backend, pool, [keys[2], keys[3]], first=2)
    assert backend.batch_exists(keys) == 1
    assert backend.batch_exists(keys[2:]) == 2
    assert backend.batch_get_v1(keys, pool.page_indices([8, 9, 10, 11])) == [
        True,
        False,
        False,
        False,
    ]
    assert backend.batch_exists([]) == 0 and backend.batch_get_v1([], pool.page_indices([])) == []


def test_a_corrupted_chunk_is_a_miss_and_ends_the_prefix(
    root: str, opened: list[HiCacheBackend]
) -> None:
    backend, pool = open_backend(opened, root)
    keys = page_keys(3)
    stored(backend, pool, keys)
    files = sorted(p for p in Path(root).rglob("*") if p.is_file() and len(p.name) == 64)
    assert len(files) == 6  # K and V of 3 pages
    victim = next(
        f for f in files if backend._pages._keys.chunk_key(f"{keys[1]}/1".encode()).hex() in f.name
    )  # type: ignore[union-attr]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert backend.batch_get_v1(keys, pool.page_indices([5, 6, 7])) == [True, False, False]


def test_an_existing_page_is_a_success(root: str, opened: list[HiCacheBackend]) -> None:
    backend, pool = open_backend(opened, root)
    keys = page_keys(2)
    stored(backend, pool, keys)
    assert backend.batch_set_v1(keys, pool.page_indices([0, 1])) == [True, True]
    stats = backend.take_stats()
    assert stats["backup_pgs"] == [2, 2] and backend.take_stats()["backup_pgs"] == []


def test_generic_copying_calls(root: str, opened: list[HiCacheBackend]) -> None:
    backend, pool = open_backend(opened, root, kvtier={})
    keys = page_keys(2, "generic")
    for page in (0, 1):
        pool.fill(page, seed=page)
    pages = [pool.flat_page(0), pool.flat_page(1)]
    assert backend.batch_set(keys, pages) is True
    assert backend.exists(keys[0]) and not backend.exists(page_keys(1, "other")[0])
    targets = [torch.zeros_like(pages[0]), torch.zeros_like(pages[1])]
    got = backend.batch_get(keys, targets)
    assert (
        got[0] is targets[0]
        and torch.equal(targets[0], pages[0])
        and torch.equal(targets[1], pages[1])
    )
    assert backend.get(page_keys(1, "absent")[0], torch.zeros_like(pages[0])) is None
    assert backend.batch_get(keys, [torch.zeros(3)] * 2) == [None, None]  # wrong size: a miss


def test_three_sglang_threads_at_once(root: str, opened: list[HiCacheBackend]) -> None:
    backend, pool = open_backend(opened, root, pool=MhaHostPool(pages=96))
    keys = page_keys(24, "threads")
    before = stored(backend, pool, keys[:8])
    errors: list[BaseException] = []

    def run(work: Any) -> threading.Thread:
        def body() -> None:
            try:
                work()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=body)
        thread.start()
        return thread

    def prefetch() -> None:
        for _ in range(40):
            assert backend.batch_exists(keys[:8]) == 8

    def load() -> None:
        for round_ in range(20):
            first = 32 + (round_ % 2) * 8
            assert (
                backend.batch_get_v1(keys[:8], pool.page_indices(list(range(first, first + 8))))
                == [True] * 8
            )
            assert all(torch.equal(before[i], pool.page(first + i)) for i in range(8))

    def backup() -> None:
        for page in range(8, 24):
            pool.fill(page, seed=page)
        for round_ in range(4):
            batch = keys[8 + round_ * 4 : 12 + round_ * 4]
            pages = list(range(8 + round_ * 4, 12 + round_ * 4))
            assert backend.batch_set_v1(batch, pool.page_indices(pages)) == [True] * 4

    for thread in [run(prefetch), run(load), run(backup)]:
        thread.join()
    assert not errors, errors
    assert backend.batch_exists(keys) == 24


def test_clear_deletes_this_namespace_only(root: str, opened: list[HiCacheBackend]) -> None:
    mine, pool = open_backend(opened, root, kvtier={"revision": "mine"})
    other, other_pool = open_backend(opened, root, kvtier={"revision": "other"})
    keys = page_keys(3, "clear")
    stored(mine, pool, keys)
    stored(other, other_pool, keys)
    foreign = Path(root) / "not-kvtiers.txt"
    foreign.write_text("keep me")
    assert mine.clear() is True
    assert mine.batch_get_v1(keys, pool.page_indices([10, 11, 12])) == [False] * 3
    assert other.batch_get_v1(keys, other_pool.page_indices([10, 11, 12])) == [True] * 3
    assert foreign.read_text() == "keep me"


def test_identity_separates_dtype_and_revision_but_not_dp_rank(
    root: str, opened: list[HiCacheBackend]
) -> None:
    writer, pool = open_backend(opened, root)
    keys = page_keys(2, "identity")
    stored(writer, pool, keys)
    replica, _ = open_backend(opened, root, dp_rank=3)
    wait_for(lambda: replica.batch_exists(keys) == 2)
    bf16, _ = open_backend(opened, root, pool=MhaHostPool(dtype=torch.bfloat16, dim=16))
    revised, _ = open_backend(opened, root, kvtier={"revision": "v2"})
    other_tp, _ = open_backend(opened, root, tp_rank=1, tp_size=2)
    for _ in range(20):  # a miss, and still one once the tiers' probes have answered
        assert [b.batch_exists(keys) for b in (bf16, revised, other_tp)] == [0, 0, 0]
        time.sleep(0.005)


def test_sidecar_pools_get_no_hit(root: str, opened: list[HiCacheBackend]) -> None:
    backend, pool = open_backend(opened, root)
    keys = page_keys(2, "sidecar")
    stored(backend, pool, keys)
    backend.register_mem_host_pool_v2(MhaHostPool(), "mamba")
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, pool.page_indices([4, 5])) == [False, False]


def test_a_switched_off_tier_is_skipped_and_stores_still_succeed(
    root: str, opened: list[HiCacheBackend]
) -> None:
    backend, pool = open_backend(opened, root)
    runtime = backend.runtime
    assert runtime is not None
    (name,) = runtime.tiers.names()
    assert runtime.disable_tier(name)
    keys = page_keys(2, "off")
    assert stored(backend, pool, keys)  # done, nothing written
    assert backend.batch_exists(keys) == 0
    assert runtime.enable_tier(name)
    assert backend.batch_exists(keys) == 0  # skipped while off: a miss, never written
    counters = runtime.metrics.counters_of(name)
    assert any("tier_disabled" in k for k in counters), counters


@pytest.mark.parametrize(
    ("kvtier", "named"),
    [
        (
            {"secondary_tiers": [{"type": "fs", "root_dir": "/tmp/x", "max_bytes": -1}]},
            "kvtier.secondary_tiers[0].max_bytes",
        ),
        ({"secondary_tiers": [{"type": "nope"}]}, "kvtier.secondary_tiers[0].type"),
        ({"secondary_tiers": []}, "kvtier.secondary_tiers"),
        ({"cpu_bytes_to_use": 1}, "kvtier.cpu_bytes_to_use"),
        ({"metrics_port": "x"}, "kvtier.metrics_port"),
        ({"slo_guard": {"ttft_p99_s": 1.0}}, "kvtier.slo_guard.ttft_p99_s"),
        ({"revision": 3}, "kvtier.revision"),
        ({"surprise": 1}, "kvtier.surprise"),
        ({"tune_malloc": "off"}, "kvtier.tune_malloc"),
    ],
)
def test_bad_configuration_fails_the_attach_naming_the_key(
    root: str, kvtier: dict[str, Any], named: str
) -> None:
    config = StorageConfig(extra(root, **kvtier))
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        HiCacheBackend(config)


def test_no_kvtier_key_fails_the_attach() -> None:
    with pytest.raises(ConfigError, match="kvtier: required"):
        HiCacheBackend(StorageConfig({"backend_name": "kvtier"}))


def test_kv_events_carry_sglangs_page_hashes(root: str, opened: list[HiCacheBackend]) -> None:
    from kvtier.telemetry.kv_events import EventSubscriber

    endpoint = "tcp://127.0.0.1:5781"
    backend, pool = open_backend(opened, root, kvtier={"kv_events": {"endpoint": endpoint}})
    subscriber = EventSubscriber(endpoint)
    try:
        events: list[dict[str, Any]] = []
        for attempt in range(50):  # PUB/SUB: the subscription takes a moment to arrive
            keys = page_keys(2, f"events{attempt}")
            stored(backend, pool, keys)
            events = [e for _, _, batch in subscriber.batches(timeout_s=0.1) for e in batch]
            if events:
                break
    finally:
        subscriber.close()
    (event,) = events
    assert event["type"] == "BlockStored" and event["medium"] == "DISK"
    assert event["block_hashes"] == [page_hash(k) for k in keys]
    assert event["block_size"] == pool.page_size


def test_page_hash_is_sglangs() -> None:
    assert page_hash("ffffffffffffffff" + "0" * 48) == -1
    assert page_hash("7fffffffffffffff" + "0" * 48) == (1 << 63) - 1


def test_fs_and_obj_tiers_together(
    root: str, opened: list[HiCacheBackend], moto: MotoServer
) -> None:
    """Pages go to every tier; with the fs tier off they come from the bucket; ``clear`` empties
    this identity's namespace in both."""
    bucket = moto.create_bucket()
    obj = {
        "type": "obj",
        "bucket": bucket,
        "endpoint_override": moto.endpoint,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "prefix": "sglang",
    }
    tiers = [{"type": "fs", "root_dir": root}, obj]
    backend, pool = open_backend(opened, root, kvtier={"secondary_tiers": tiers})
    runtime = backend.runtime
    assert runtime is not None and runtime.tiers.names() == ["fs", "obj"]
    keys = page_keys(3, "two tiers")
    before = stored(backend, pool, keys)
    assert runtime.disable_tier("fs")
    wait_for(lambda: backend.batch_exists(keys) == 3)  # the obj tier's probes answer
    assert backend.batch_get_v1(keys, pool.page_indices([20, 21, 22])) == [True] * 3
    assert all(torch.equal(before[i], pool.page(20 + i)) for i in range(3))
    assert runtime.metrics.counters_of("obj")
    assert backend.clear() is True
    assert backend.batch_get_v1(keys, pool.page_indices([20, 21, 22])) == [False] * 3


def test_a_peer_tier_serves_pages_from_another_instances_memory(
    root: str, opened: list[HiCacheBackend]
) -> None:
    """The p2p tier: pages stored into a kvtier instance's host memory over ZeroMQ and read back
    (the instance serves with this backend's identity, as a peer of the same model would)."""
    from kvtier import TieringConfig, TieringManager
    from kvtier.region import round_up
    from tests.tiers.s3_server import free_port

    probe, pool = open_backend(opened, root)
    identity = probe.identity
    port = free_port()
    stride = round_up(identity.layout.chunk_bytes, 4096)
    serve = {"port": port, "accept_stores": True}
    config = TieringConfig.from_dict({"cpu_bytes_to_use": 64 * stride, "serve": serve})
    with TieringManager(config, identity):
        # hits remembered for a minute: lookups on a loaded machine must not outlast them
        peer = [{"type": "p2p", "host": "127.0.0.1", "port": port, "hit_ttl_s": 60}]
        backend, pool = open_backend(opened, root, kvtier={"secondary_tiers": peer})
        keys = page_keys(3, "peer")
        runtime = backend.runtime
        assert runtime is not None
        # until the peer's handshake says it takes stores, the tier is skipped (as kvtier's
        # manager skips it): the backup is done, nothing is written
        wait_for(lambda: runtime.tiers[0].accepts_stores)
        before = stored(backend, pool, keys)
        wait_for(lambda: backend.batch_exists(keys) == 3)
        assert backend.batch_get_v1(keys, pool.page_indices([30, 31, 32])) == [True] * 3
        assert all(torch.equal(before[i], pool.page(30 + i)) for i in range(3))
        backend.close()


def test_stats_nobody_takes_keep_only_the_last_calls_of_each_kind() -> None:
    """Without ``--enable-metrics`` SGLang never asks: a server running for months keeps at
    most ``max_samples`` calls of each kind, the newest, and exactly that many when it asks."""
    stats = IoStats(max_samples=3)
    for pages in range(1, 6):
        stats.record("store", pages, pages << 20, 0.001)
    for pages in (7, 8, 9):
        stats.record("load", pages, 1 << 20, 0.001)
    taken = stats.take()
    assert taken["backup_pgs"] == [3, 4, 5] and taken["prefetch_pgs"] == [7, 8, 9]
    assert len(taken["backup_bandwidth"]) == 3 and taken["backup_bandwidth"][-1] > 5.0
    assert stats.take()["backup_pgs"] == []
