"""The bounded object tier (issue 26, part 4): ``max_bytes`` and ``max_age_s`` on the S3 server.

Chunks are tiny (128 bytes of KV behind the 4 KiB header) so that thousands of objects stay
fast. What the bucket holds is read with a second, independent client (obstore straight on it).
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from typing import Any

import pytest

from kvtier import CacheIdentity, ChunkKey, KVLayout, TieringManager
from kvtier.config import ObjTierConfig
from kvtier.errors import ConfigError, TierUnavailable
from kvtier.region import HostRegion
from kvtier.telemetry.kv_events import EventKind, KVEvent
from kvtier.tiers.base import HIT, MISS, RETRY, TransferJob
from kvtier.tiers.s3 import listing, upkeep
from kvtier.tiers.s3.tier import ObjectStoreTier
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.lineage import chain_links
from tests.conftest import collect, config, fill, holds, make_keys, settle_lookup, wait_for
from tests.tiers.s3.s3_workload import store
from tests.tiers.s3_server import MotoServer

obstore = pytest.importorskip("obstore")
from tests.tiers.s3.test_s3 import BUCKET, raw_store  # noqa: E402

TINY = KVLayout(
    num_layers=1, num_kv_heads=1, head_dim=8, dtype="float16", block_size=4, blocks_per_chunk=1
)
SLOTS = 128
OBJECT = codec.HEADER_BYTES + TINY.chunk_bytes
SETTLE_S = 60.0  # a deadline for thousands of requests to a local server, not a speed bound


@pytest.fixture
def layout() -> KVLayout:
    return TINY


@pytest.fixture
def region(identity: CacheIdentity) -> HostRegion:
    return HostRegion(SLOTS, identity.layout.chunk_bytes)


@pytest.fixture
def fast_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upkeep, "SWEEP_MAX_S", 0.05)


def make(server: MotoServer, tiers: list, region: HostRegion, identity, **options: Any):
    tier = server.tier(BUCKET, region, identity, **options)
    assert isinstance(tier, ObjectStoreTier)
    tiers.append(tier)
    return tier


class Jobs:
    """Stores and loads through one tier, ``SLOTS`` keys a job."""

    def __init__(self, tier: ObjectStoreTier, region: HostRegion) -> None:
        self.tier, self.region, self.next_id = tier, region, 1

    def store(self, keys: list[ChunkKey], links: bool = False) -> None:
        for start in range(0, len(keys), SLOTS):
            part = keys[start : start + SLOTS]
            for slot, key in enumerate(part):
                fill(self.region, slot, key)
            parent = keys[start - 1] if links and start else None
            chain = tuple(chain_links(part, start, parent)) if links else ()
            self.run(
                "store", TransferJob(self.next_id, tuple(part), tuple(range(len(part))), chain)
            )

    def load(self, keys: list[ChunkKey]) -> frozenset[ChunkKey]:
        job = TransferJob(self.next_id, tuple(keys), tuple(range(len(keys))))
        result = self.run("load", job)
        assert all(holds(self.region, i, k) for i, k in enumerate(keys) if k in result)
        return result

    def run(self, op: str, job: TransferJob) -> frozenset[ChunkKey]:
        (self.tier.submit_store if op == "store" else self.tier.submit_load)(job)
        result = collect(self.tier, [job.job_id], timeout=SETTLE_S)[job.job_id]
        self.next_id += 1
        assert op == "load" or result.ok, result.error
        return result.succeeded


def names(server: MotoServer, prefix: str) -> set[str]:
    return {m["path"] for page in obstore.list(raw_store(server), prefix) for m in page}


def chunk_names(server: MotoServer, tier: ObjectStoreTier) -> set[str]:
    return {n for n in names(server, tier._prefix) if not n.endswith("identity.json")}


def name_of(tier: ObjectStoreTier, key: bytes) -> str:
    return f"{tier._prefix}/{key.hex()}"


def settled(tier: ObjectStoreTier, **wanted: int) -> None:
    """Wait until the tier's stats hold ``wanted`` (deletes run on its I/O threads)."""

    def holds_all() -> bool:
        stats = tier.stats()
        return all(stats.get(name, 0) == n for name, n in wanted.items())

    wait_for(holds_all, SETTLE_S, f"stats {wanted} (got {tier.stats()})")


# -- configuration -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_bytes": 0}, "max_bytes: expected a positive integer"),
        ({"max_bytes": -1}, "max_bytes: expected a positive integer"),
        ({"max_bytes": 1.5}, "max_bytes: expected an integer"),
        ({"max_bytes": 1 << 63}, "max_bytes: expected a positive integer"),
        ({"max_age_s": math.nan}, "max_age_s: expected a number of seconds from 1"),
        ({"max_age_s": math.inf}, "max_age_s: expected a number of seconds from 1"),
        ({"max_age_s": -1.0}, "max_age_s: expected a number of seconds from 1"),
        ({"max_age_s": 0}, "max_age_s: expected a number of seconds from 1"),
        ({"max_age_s": 0.999}, "max_age_s: expected a number of seconds from 1"),
        ({"max_age_s": 36_500 * 86_400 + 1}, "max_age_s: expected a number of seconds from 1"),
    ],
)
def test_bad_bounds_are_config_errors_naming_the_key(options, message):
    with pytest.raises(ConfigError, match=message):
        ObjTierConfig(bucket="b", **options)


def test_the_ends_of_each_range_are_accepted():
    low = ObjTierConfig(bucket="b", max_bytes=1, max_age_s=1)
    high = ObjTierConfig(bucket="b", max_bytes=(1 << 63) - 1, max_age_s=36_500 * 86_400)
    assert (low.max_bytes, low.max_age_s, high.max_age_s) == (1, 1, 36_500 * 86_400)


def test_max_bytes_must_hold_one_object(s3_server, tiers, region, identity):
    """The chunk size is known at start: one byte less than one object is a ConfigError."""
    with pytest.raises(ConfigError, match=f"max_bytes: {OBJECT - 1} cannot hold one object"):
        make(s3_server, tiers, region, identity, max_bytes=OBJECT - 1)
    tier = make(s3_server, tiers, region, identity, max_bytes=OBJECT)
    keys = make_keys(identity, 3, seed=1)
    Jobs(tier, region).store(keys[:1])
    Jobs(tier, region).store(keys[1:2])
    settled(tier, evicted=1, index_chunks=1)
    assert chunk_names(s3_server, tier) == {name_of(tier, keys[1])}


def test_a_rebuild_beside_stores_evicts_each_chunk_once(
    s3_server, tiers, region, identity, monkeypatch
):
    """The listing sees key 0, then a put evicts it before the listing is merged: the merge
    must not index it again (it would be deleted and counted a second time)."""
    first_stored, second_stored = threading.Event(), threading.Event()
    run, merge_into = listing.NamespaceListing.run, listing.NamespaceListing.merge_into

    def run_after_the_first(self: listing.NamespaceListing, *args: Any) -> bool:
        first_stored.wait(SETTLE_S)
        return run(self, *args)

    def merge_after_the_second(self: listing.NamespaceListing, *args: Any) -> bool:
        second_stored.wait(SETTLE_S)
        return merge_into(self, *args)

    monkeypatch.setattr(listing.NamespaceListing, "run", run_after_the_first)
    monkeypatch.setattr(listing.NamespaceListing, "merge_into", merge_after_the_second)
    tier = make(s3_server, tiers, region, identity, max_bytes=OBJECT, io_threads=1)
    keys = make_keys(identity, 2, seed=3)
    jobs = Jobs(tier, region)
    jobs.store(keys[:1])
    first_stored.set()
    settled(tier, listing_chunks=1)
    jobs.store(keys[1:])
    settled(tier, evicted=1)
    second_stored.set()
    assert tier.wait_rebuilt(SETTLE_S)
    tier._io.submit(lambda: None).result(SETTLE_S)  # one I/O thread: every delete has run
    assert (tier.stats()["evicted"], tier.stats()["index_chunks"]) == (1, 1)
    assert tier.take_removed() == [keys[0]]
    assert chunk_names(s3_server, tier) == {name_of(tier, keys[1])}


def test_a_probe_that_finds_an_object_being_deleted_is_a_miss_and_evicts_nothing(
    s3_server, tiers, region, identity, monkeypatch
):
    """Key 0 was evicted; its delete has not run when a lookup's HEAD finds the object still
    there. Indexed, it would evict the live key 1 for an object about to go: it is a miss
    (``probe_raced_delete``) and key 1 stays."""
    release, real = threading.Event(), ObjectStoreTier._delete

    def slow_delete(self: ObjectStoreTier, key: ChunkKey) -> None:
        release.wait(SETTLE_S)
        real(self, key)

    monkeypatch.setattr(ObjectStoreTier, "_delete", slow_delete)
    tier = make(s3_server, tiers, region, identity, max_bytes=OBJECT, negative_ttl_s=0.05)
    assert tier.wait_rebuilt(SETTLE_S)
    keys = make_keys(identity, 2, seed=4)
    jobs = Jobs(tier, region)
    jobs.store(keys[:1])
    jobs.store(keys[1:])  # evicts key 0; its delete waits
    try:
        assert name_of(tier, keys[0]) in chunk_names(s3_server, tier)
        assert tier.lookup(keys[0]) is MISS  # remembered at the eviction, told once
        time.sleep(0.1)  # and now expired: the next lookup probes
        assert settle_lookup(tier, keys[0]) is MISS
        assert tier.stats()["probe_raced_delete"] == 1
        assert keys[1] in tier._bound.index and tier.lookup(keys[1]) is HIT
    finally:
        release.set()
    settled(tier, evicted=1, index_chunks=1)
    assert chunk_names(s3_server, tier) == {name_of(tier, keys[1])}


def test_an_evicted_object_written_again_by_another_instance_is_found_by_a_probe(
    s3_server, tiers, region, identity
):
    """Once its delete has ended, an evicted key is no longer skipped: another instance may put
    it again, and a probe finds it."""
    prefix = f"again-{uuid.uuid4().hex[:8]}"
    tier = make(
        s3_server, tiers, region, identity, prefix=prefix, max_bytes=OBJECT, negative_ttl_s=0.05
    )
    assert tier.wait_rebuilt(SETTLE_S)
    keys = make_keys(identity, 2, seed=6)
    Jobs(tier, region).store(keys[:1])
    Jobs(tier, region).store(keys[1:])
    settled(tier, evicted=1)
    assert tier.lookup(keys[0]) is MISS  # remembered at the eviction, told once
    writer = make(s3_server, tiers, region, identity, prefix=prefix)
    Jobs(writer, region).store(keys[:1])
    time.sleep(0.1)  # the remembered miss has expired
    assert settle_lookup(tier, keys[0]) is HIT
    assert tier.stats().get("probe_raced_delete", 0) == 0


def test_a_store_during_a_probe_that_found_nothing_is_a_hit(
    s3_server, tiers, region, identity, monkeypatch
):
    """A lookup's HEAD finds no object; before its answer is recorded, a store of the same key
    completes. The probe's miss is older than the store: the key is a hit (it was a miss for
    ``negative_ttl_s``, and recomputed)."""
    headed, release = threading.Event(), threading.Event()
    tier = make(s3_server, tiers, region, identity, negative_ttl_s=60.0)
    real = tier._client.size_of

    def held_head(name: str) -> int | None:
        size = real(name)
        headed.set()
        release.wait(SETTLE_S)
        return size

    monkeypatch.setattr(tier._client, "size_of", held_head)
    key = make_keys(identity, 1, seed=8)[0]
    assert tier.lookup(key) is RETRY
    assert headed.wait(SETTLE_S)
    Jobs(tier, region).store([key])
    release.set()
    wait_for(lambda: tier.stats().get("probe_miss", 0) == 1, timeout=SETTLE_S)
    wait_for(lambda: tier.stats()["probes_in_flight"] == 0, timeout=SETTLE_S)
    assert tier.lookup(key) is HIT
    assert Jobs(tier, region).load([key]) == {key}


# -- the bound ---------------------------------------------------------------------------------
def test_thousands_of_stores_stay_within_max_bytes(s3_server, tiers, region, identity):
    """3,000 stores under a bound of 300 objects: the bucket ends with the newest 300, every
    eviction is deleted and reported once by take_removed."""
    tier = make(s3_server, tiers, region, identity, max_bytes=300 * OBJECT, io_threads=8)
    keys = make_keys(identity, 3000, seed=2)
    Jobs(tier, region).store(keys)
    settled(tier, evicted=2700, index_chunks=300, index_bytes=300 * OBJECT)
    stored = chunk_names(s3_server, tier)
    assert len(stored) == 300
    removed = tier.take_removed()
    assert len(removed) == len(set(removed)) == 2700 and not tier.take_removed()
    assert {name_of(tier, k) for k in removed} | stored == {name_of(tier, k) for k in keys}
    assert {name_of(tier, k) for k in keys[-SLOTS:]} <= stored  # the last job is the newest


def test_recently_loaded_chunks_are_kept(s3_server, tiers, region, identity):
    """Least recently used goes first, and a load is a use."""
    tier = make(s3_server, tiers, region, identity, max_bytes=10 * OBJECT)
    jobs, keys = Jobs(tier, region), make_keys(identity, 15, seed=3)
    for key in keys[:10]:
        jobs.store([key])
    assert jobs.load(keys[:2]) == set(keys[:2])
    for key in keys[10:]:
        jobs.store([key])
    settled(tier, evicted=5)
    kept = {name_of(tier, k) for k in keys[:2] + keys[7:]}
    assert chunk_names(s3_server, tier) == kept


def test_a_prefix_is_evicted_from_its_tail(s3_server, tiers, region, identity):
    """A chain stored with its links loses its last chunks first, never its head."""
    tier = make(s3_server, tiers, region, identity, max_bytes=6 * OBJECT)
    jobs = Jobs(tier, region)
    chain, other = make_keys(identity, 6, seed=4), make_keys(identity, 2, seed=5)
    jobs.store(chain, links=True)
    jobs.store(other)
    settled(tier, evicted=2)
    assert set(tier.take_removed()) == set(chain[-2:])


def test_a_chain_split_over_concurrent_jobs_is_stored_whole(
    s3_server, tiers, region, identity, monkeypatch
):
    """A full bound, and a chain stored as two jobs at once: the second job's first chunk has
    its parent still being put by the first. It is stored (not taken for an orphan and
    skipped), and the older unrelated chunks are evicted instead."""
    tier = make(s3_server, tiers, region, identity, max_bytes=8 * OBJECT, io_threads=8)
    jobs, chain, old = Jobs(tier, region), make_keys(identity, 8, seed=17), make_keys(identity, 8)
    jobs.store(old)
    first_of_second, put = name_of(tier, chain[4]), tier._client.put
    second_started = threading.Event()

    def put_after_the_second_job_starts(name: str, data: memoryview) -> None:
        if name == first_of_second:
            second_started.set()
        elif not second_started.wait(5):
            raise AssertionError("the second job's first put was never sent")
        put(name, data)

    monkeypatch.setattr(tier._client, "put", put_after_the_second_job_starts)
    links = chain_links(chain)
    for job_id, part in ((100, range(4)), (101, range(4, 8))):
        slots = tuple(range(part.start, part.stop))
        for slot in slots:
            fill(region, slot, chain[slot])
        keys, chained = tuple(chain[i] for i in part), tuple(links[i] for i in part)
        tier.submit_store(TransferJob(job_id, keys, slots, chained))
    assert all(r.ok for r in collect(tier, [100, 101], timeout=SETTLE_S).values())
    settled(tier, evicted=8, index_chunks=8)
    assert "store_skipped_bound" not in tier.stats()
    assert chunk_names(s3_server, tier) == {name_of(tier, k) for k in chain}


def test_a_load_teaches_the_index_a_chunk_s_parent(s3_server, tiers, region, identity):
    """After a restart parents are unknown (heads); a load reads the link from the header, so
    once a chain's head is gone its tail counts as unreachable and is evicted first."""
    prefix = "lineage"
    chain, extra = make_keys(identity, 4, seed=6), make_keys(identity, 2, seed=7)
    first = make(s3_server, tiers, region, identity, prefix=prefix)
    Jobs(first, region).store(chain, links=True)
    first.close()
    tier = make(s3_server, tiers, region, identity, prefix=prefix, max_bytes=5 * OBJECT)
    assert tier.wait_rebuilt(SETTLE_S)
    assert tier.stats()["unreachable_chunks"] == 0
    jobs = Jobs(tier, region)
    assert jobs.load(chain[1:]) == set(chain[1:])
    obstore.delete(raw_store(s3_server), name_of(tier, chain[0]))
    assert jobs.load(chain[:1]) == frozenset()  # not found: forgotten
    settled(tier, unreachable_chunks=3, index_chunks=3)
    jobs.store(extra)
    settled(tier, evicted=0, index_chunks=5)
    jobs.store(make_keys(identity, 1, seed=8))
    settled(tier, evicted=1)
    (victim,) = tier.take_removed()
    assert victim in chain[1:]


def test_a_corrupt_object_is_unindexed_and_stored_again(s3_server, tiers, region, identity):
    """An object that fails verification leaves the index (it is not deleted: it may be another
    key's writer's), so the next store of its key puts it again instead of skipping it."""
    tier = make(s3_server, tiers, region, identity, max_bytes=4 * OBJECT)
    jobs, (key,) = Jobs(tier, region), make_keys(identity, 1, seed=16)
    jobs.store([key])
    raw = raw_store(s3_server)
    good = bytes(obstore.get(raw, name_of(tier, key)).bytes())
    obstore.put(raw, name_of(tier, key), good[:-1] + bytes([good[-1] ^ 1]))
    assert jobs.load([key]) == frozenset()
    assert tier.stats()["index_chunks"] == 0 and tier.stats()["integrity.checksum"] == 1
    jobs.store([key])
    assert jobs.load([key]) == {key} and tier.stats()["store_ok"] == 2


# -- max_age_s ---------------------------------------------------------------------------------
def test_objects_unused_for_max_age_are_deleted(s3_server, tiers, region, identity, fast_sweeps):
    """On a stepped clock: what was loaded within max_age_s stays, the rest goes."""
    tier = make(s3_server, tiers, region, identity, max_age_s=10)
    now = [1_000_000.0]
    tier._bound.now = lambda: now[0]
    jobs, keys = Jobs(tier, region), make_keys(identity, 4, seed=9)
    jobs.store(keys)
    now[0] += 6
    assert jobs.load(keys[:1]) == {keys[0]}
    now[0] += 6  # keys[1:] unused for 12 s, keys[0] for 6 s
    settled(tier, expired=3, index_chunks=1)
    assert chunk_names(s3_server, tier) == {name_of(tier, keys[0])}
    assert set(tier.take_removed()) == set(keys[1:])
    now[0] += 11
    settled(tier, expired=4, index_chunks=0)
    assert chunk_names(s3_server, tier) == set()
    tier.close()  # the upkeep thread stops with the tier
    assert not [t for t in threading.enumerate() if t.name == f"{tier.name}-upkeep"]


# -- restart -----------------------------------------------------------------------------------
FOREIGN_INSIDE = ["README", "sub/" + "ab" * 32, "AB" * 32, "ab" * 31, "ab" * 32 + ".tmp"]


@pytest.fixture
def filled(s3_server, region, identity) -> tuple[str, list[ChunkKey]]:
    """A prefix holding 3,000 chunks of ``identity``, stored by an unbounded tier, and
    foreign objects inside its namespace and around it."""
    prefix = f"filled-{id(region):x}"
    tier = s3_server.tier(BUCKET, region, identity, prefix=prefix, io_threads=8)
    try:
        keys = make_keys(identity, 3000, seed=10)
        Jobs(tier, region).store(keys)  # type: ignore[arg-type]
    finally:
        tier.close()
    raw, namespace = raw_store(s3_server), f"{prefix}/{identity.hexdigest}"
    for name in FOREIGN_INSIDE:
        obstore.put(raw, f"{namespace}/{name}", b"not kvtier's")
    for name in foreign_outside(prefix, identity):
        obstore.put(raw, name, bytes(OBJECT))
    return prefix, keys


def foreign_outside(prefix: str, identity: CacheIdentity) -> list[str]:
    return [
        f"{prefix}/notes.txt",
        f"{prefix}/{'cd' * 32}/{'ef' * 32}",  # another identity's chunk
        f"other-{prefix}/{identity.hexdigest}/{'ab' * 32}",
    ]


def test_a_restart_rebuilds_the_index_from_a_paged_listing(
    s3_server, tiers, region, identity, filled, monkeypatch
):
    """3,000 chunks listed 128 a page: all indexed, 2,000 evicted down to the bound; foreign
    objects inside the namespace and around it are never indexed nor deleted."""
    monkeypatch.setattr(listing, "PAGE_SIZE", 128)
    monkeypatch.setattr(listing, "MERGE_BATCH", 500)
    prefix, keys = filled
    tier = make(s3_server, tiers, region, identity, prefix=prefix, max_bytes=1000 * OBJECT)
    assert tier.wait_rebuilt(SETTLE_S)
    stats = tier.stats()
    assert stats["listing_chunks"] == 3000 and stats["rebuild_done"] == 1
    assert stats["listing_ignored"] == len(FOREIGN_INSIDE) + 1  # and identity.json
    assert stats["listing_pages"] == math.ceil((3000 + len(FOREIGN_INSIDE) + 1) / 128)
    settled(tier, evicted=2000, index_chunks=1000)
    namespace = tier._prefix
    left = chunk_names(s3_server, tier)
    assert {f"{namespace}/{n}" for n in FOREIGN_INSIDE} <= left
    assert len(left - {f"{namespace}/{n}" for n in FOREIGN_INSIDE}) == 1000
    assert set(foreign_outside(prefix, identity)) <= names(s3_server, "")
    kept = [k for k in keys if name_of(tier, k) in left][:SLOTS]
    assert all(tier.lookup(k) is HIT for k in kept)  # indexed: no probe needed
    assert tier.stats().get("probe_hit", 0) == 0
    assert Jobs(tier, region).load(kept) == set(kept)


def test_lookups_loads_and_stores_go_on_while_the_index_is_rebuilt(
    s3_server, tiers, region, identity, monkeypatch
):
    """A listing held back: the tier answers as an unbounded one; what it stores meanwhile is
    indexed, and the older listed objects go first once the listing is in."""
    prefix, keys = "meanwhile", make_keys(identity, 6, seed=11)
    first = make(s3_server, tiers, region, identity, prefix=prefix)
    Jobs(first, region).store(keys[:3])
    first.close()
    release = threading.Event()
    run = listing.NamespaceListing.run
    monkeypatch.setattr(
        listing.NamespaceListing, "run", lambda self, *a: release.wait() and run(self, *a)
    )
    tier = make(s3_server, tiers, region, identity, prefix=prefix, max_bytes=4 * OBJECT)
    jobs = Jobs(tier, region)
    assert settle_lookup(tier, keys[0]) is HIT
    assert jobs.load(keys[:3]) == set(keys[:3])  # found by probe and load: indexed now
    jobs.store(keys[3:])
    assert not tier.wait_rebuilt(0) and tier.stats()["rebuild_done"] == 0
    release.set()
    assert tier.wait_rebuilt(SETTLE_S)
    settled(tier, evicted=2, index_chunks=4)


# -- failed deletes ----------------------------------------------------------------------------
def test_a_failed_delete_is_counted_retried_and_never_an_error(
    s3_server, tiers, region, identity, fast_sweeps
):
    """Deletes refused by a fault hook: stores and loads go on, the failures are counted and
    kept; once deletes work again the retries bring the bucket back within the bound."""
    tier = make(s3_server, tiers, region, identity, max_bytes=5 * OBJECT)
    failing = threading.Event()
    failing.set()

    def hook(op: str, key: bytes) -> None:
        if op == "delete" and failing.is_set():
            raise TierUnavailable("injected")

    tier.fault_hook = hook
    jobs, keys = Jobs(tier, region), make_keys(identity, 10, seed=12)
    for key in keys:
        jobs.store([key])
    wait_for(lambda: tier.stats().get("delete_retried", 0) >= 5, SETTLE_S)  # failed, retried
    wait_for(lambda: tier.stats()["delete_pending"] == 5, SETTLE_S)  # between two retries
    assert tier.stats()["delete_failed.unavailable"] >= 10 and tier.stats()["circuit_state"] == 0
    assert len(chunk_names(s3_server, tier)) == 10
    assert jobs.load(keys[5:]) == set(keys[5:])
    failing.clear()
    settled(tier, evicted=5, delete_pending=0)
    assert chunk_names(s3_server, tier) == {name_of(tier, k) for k in keys[5:]}


def test_deletes_while_the_server_is_down_wait_for_it(identity, region, tiers, fast_sweeps):
    """A stopped server: deletes fail (counted, the circuit opens, nothing raises); after a
    restart on the same port the retries delete the evicted objects."""
    server = MotoServer().start()
    try:
        server.create_bucket(BUCKET)
        options = {"max_bytes": 2 * OBJECT, "timeout_s": 1.0, "circuit_failures": 1}
        tier = make(server, tiers, region, identity, reconnect_min_s=0.1, **options)
        keys = make_keys(identity, 3, seed=13)
        Jobs(tier, region).store(keys[:2])
        gate = threading.Event()
        tier.fault_hook = lambda op, key: gate.wait() if op == "delete" else None
        Jobs(tier, region).store(keys[2:])  # its eviction's delete waits at the gate
        server.stop()
        gate.set()
        # a retry takes the key off delete_pending while it resends: wait for the count instead
        wait_for(lambda: tier.stats().get("delete_failed.unavailable", 0) >= 1, SETTLE_S)
        assert tier.stats().get("evicted", 0) == 0  # not deleted yet: nothing says it was
        server.start()
        server.create_bucket(BUCKET)  # moto keeps objects in memory: the bucket is empty again
        settled(tier, evicted=1, delete_pending=0, circuit_state=0)
    finally:
        server.stop()


# -- through the manager -----------------------------------------------------------------------
def test_the_manager_publishes_what_the_bound_deletes(s3_server, identity):
    """From the JSON entry to KV events: evicted objects come out as REMOVED from the obj tier,
    each once, and the tier's stats say so."""
    entry = s3_server.tier_config(BUCKET).__dict__ | {"type": "obj", "max_bytes": 8 * OBJECT}
    entry.pop("name")
    keys = make_keys(identity, 24, seed=14)
    with TieringManager(config(8, TINY, secondary_tiers=[entry]), identity) as manager:
        for start in range(0, 24, 8):
            store(manager, keys[start : start + 8])
        wait_for(lambda: manager.stats()["tiers"]["obj"].get("evicted", 0) == 16, SETTLE_S)
        events: list[KVEvent] = []
        wait_for(lambda: removed_by(manager, events) == 16, SETTLE_S, "16 REMOVED events")
    removed = [e.key for e in events if e.kind is EventKind.REMOVED and e.source == "obj"]
    assert sorted(removed) == sorted(keys[:16])


def removed_by(manager: TieringManager, events: list[KVEvent]) -> int:
    manager.lookup(make_keys(manager.identity, 1, seed=15))  # a call that polls the tiers
    events += manager.take_events()
    return sum(e.kind is EventKind.REMOVED and e.source == "obj" for e in events)
