"""FilesystemTier (``type: "fs"``): content-addressed chunk files on a local disk or shared mount.

Layout, atomic writes and verified reads are in ``files``; which chunks are on disk (LRU, the
capacity bound) in ``shared.chunk_index``, recent misses in ``shared.misses``, the probes of
unseen keys in ``probes``, deletions and the keys they removed in ``removals``. This module
ties them to the tier contract:

* ``lookup`` answers from memory for keys this instance wrote or has seen, and for misses less
  than ``negative_ttl_s`` old; any other key takes one ``stat`` (``probes``: on the caller's
  thread on a local file system, else on a probe thread while ``lookup`` answers ``RETRY``);
* loads and stores run on separate thread pools; each chunk file is written, and each load
  job's files are read, by one call into the compiled path (``native``: the GIL released once)
  or by ``os`` calls; with CPUs to spare a load job is read as parts on several read threads
  (``LOAD_PART_CHUNKS``, ``LOAD_PARTS``): a request waits for the slowest part, not the sum;
* at start a background scan rebuilds the index (oldest ``mtime`` coldest) and removes the
  temporary files of dead writers; an entry it cannot read is skipped and counted
  (``scan_skipped.<reason>``);
* ``max_bytes`` deletes the least recently used files to stay under it; ``min_free_bytes``
  stops stores before the file system fills;
* directories it creates get ``dir_mode`` (0700), files the same bits without execute; an
  existing ``root_dir`` more open is warned about and left as it is (``config.file_modes``);
* a restart on a full or read-only file system starts *read-only* (``read_only`` in stats, one
  warning): it serves what is on disk and fails stores (``store_failed.read_only``) until the
  namespace can be written again (``namespace``).

Every failure is a miss or a failed job plus a counter in ``stats()``, never wrong bytes: a file
that fails verification is deleted (``integrity.<reason>``; with ``integrity_key_file`` every
chunk carries a keyed tag, so a file that whoever can write ``root_dir`` planted is
``integrity.forged``, and with ``encrypt`` its payload is encrypted: ``shared.sealing``); a
missing file is a plain miss (``load_missing``); a store that cannot be written fails its job
(``store_failed.<errno>``) while loads keep being served. A FIFO, socket, device, directory or
symlink at a chunk path is never opened in a way that blocks or followed (``paths``): it is a
miss (``probe_failed.not_regular``) or a failed key (``load_failed.not_regular``), left in place
until a store of that key replaces it.

Each read is counted by its way, ``read_path.page_cache`` or ``read_path.o_direct`` (with
``o_direct: "auto"``, cached chunks are read through the page cache, cold ones with O_DIRECT).

Thread safety: lookups (and inline probes) and job submission come from the manager's thread;
jobs, background probes and the scan run on the tier's threads. Shared state lives in
``ChunkIndex``, ``RecentMisses``, ``Counters`` and ``Prober``, each with its own lock.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Literal

from kvtier.config.file_modes import DEFAULT_DIR_MODE, parse_mode
from kvtier.errors import CapacityError, ConfigError, IntegrityError, TierError
from kvtier.identity import CacheIdentity
from kvtier.keys import ChunkKey
from kvtier.region import HostRegion
from kvtier.tiers.base import HIT, MISS, JobOutcome, Lookup, TransferJob
from kvtier.tiers.fs import native
from kvtier.tiers.fs.config import FsTierConfig
from kvtier.tiers.fs.files import CPUS, ChunkFiles
from kvtier.tiers.fs.index import UseStamps, remembered_chunks
from kvtier.tiers.fs.namespace import SpaceGuard, warn_if_open, warn_if_read_only
from kvtier.tiers.fs.paths import NotRegularError, failure_reason
from kvtier.tiers.fs.probes import Prober, probes_inline
from kvtier.tiers.fs.reader import Read
from kvtier.tiers.fs.removals import Removals
from kvtier.tiers.fs.rows import o_direct_for
from kvtier.tiers.fs.shared_bound import open_shared_bound
from kvtier.tiers.shared import workers
from kvtier.tiers.shared.chunk_index import ChunkIndex
from kvtier.tiers.shared.codec import HEADER_BYTES
from kvtier.tiers.shared.counters import Counters
from kvtier.tiers.shared.jobs import JobRunner, PooledTier
from kvtier.tiers.shared.lineage import Link
from kvtier.tiers.shared.misses import RecentMisses
from kvtier.tiers.shared.sealing import make_sealer

log = logging.getLogger(__name__)

#: A chunk's mtime records its last use (for a restart's scan and ``kvtier cache``) at most
#: this often: a chunk read again and again costs one ``utime`` a minute, not one per read.
USE_STAMP_S = 60.0

#: ``fault_hook(op, key)`` runs before each file operation ("store", "load", "probe"); it may
#: raise ``OSError`` (or block) to inject faults in tests and drills.
FaultHook = Callable[[str, ChunkKey], None]
_LoadOutcome = Literal["loaded", "absent", "corrupt", "unreadable"]

#: The fewest chunks a part of a load job has: each part is one compiled call (one GIL
#: release), so a part needs several chunks for that to pay; a job of fewer than twice this
#: many is read whole.
LOAD_PART_CHUNKS = 4
#: The most parts of one load job at once (within ``n_read_threads``): the CPUs but one, which
#: the engine keeps busy; parts beyond take CPU from the model (under vLLM on 2 CPUs, 2 parts
#: gave 0.91x vLLM's throughput [0.88, 0.95] with 1.08x its CPU; whole jobs 0.98x [0.94, 1.05]).
LOAD_PARTS = max(1, CPUS - 1)


class FilesystemTier(PooledTier):
    """Chunks as files under ``config.root_dir``; see the module docstring.

    Raises ``TierError`` at start when ``root_dir`` cannot be written for another reason than
    a full or read-only filesystem (or ``o_direct`` is "on" and the filesystem refuses it), and
    ``ConfigError`` when ``max_bytes`` cannot hold a single chunk or ``o_direct`` is "on" over
    host rows that O_DIRECT cannot move in place (``rows``; "auto" takes the page cache there).
    """

    def __init__(self, config: FsTierConfig, region: HostRegion, identity: CacheIdentity) -> None:
        self.name = config.name or "fs"
        self._region = region
        self._file_bytes = HEADER_BYTES + region.slot_bytes
        for option in ("max_bytes", "root_dir_max_bytes"):
            bound = getattr(config, option)
            if bound is not None and bound < self._file_bytes:
                raise ConfigError(
                    f"{option}: {bound} cannot hold one chunk file of {self._file_bytes}"
                )
        dir_mode = parse_mode(config.dir_mode) or DEFAULT_DIR_MODE  # checked by the config
        self._files = ChunkFiles(
            config.root_dir,
            identity,
            o_direct=o_direct_for(config.o_direct, region),
            fsync=config.fsync,
            dir_mode=dir_mode,
            sealer=make_sealer(config.integrity_key_file, config.encrypt),
        )
        warn_if_open(config.root_dir, self._files.namespace, dir_mode)
        self._space = SpaceGuard(self._files.directory, config.min_free_bytes)
        self._shared = open_shared_bound(config, identity, dir_mode)
        self._index = ChunkIndex(config.max_bytes, remembered_chunks(config, self._file_bytes))
        self._scan_mark = self._index.mark()  # the start-up scan runs beside the first writes
        self._misses = RecentMisses(config.negative_ttl_s)
        self._stamps = UseStamps(USE_STAMP_S)
        self._counters = Counters()
        self._removals = Removals(
            self._files, self._index, self._shared, self._counters, self._file_bytes
        )
        self.fault_hook: FaultHook | None = None
        self._closed = threading.Event()
        self._scanned = threading.Event()
        self._runner = JobRunner(self.name, config.n_read_threads, config.n_write_threads)
        self.load_part_chunks = LOAD_PART_CHUNKS
        self.load_threads = min(config.n_read_threads, LOAD_PARTS)
        inline = probes_inline(config.probe, self._files.namespace)
        notify, count = self.notify_progress, self._counters.add
        self._prober = Prober(self.name, inline, self._probe, notify, count)
        warn_if_read_only(self.name, self._files.directory)
        self._scanner = threading.Thread(target=self._scan, name=f"{self.name}-scan", daemon=True)
        self._scanner.start()

    @property
    def namespace(self) -> str:
        """The directory holding this identity's chunks."""
        return self._files.namespace

    @property
    def o_direct(self) -> bool:
        return self._files.o_direct

    # -- the contract -----------------------------------------------------------------------
    def lookup(self, key: ChunkKey) -> Lookup:
        if key in self._index:
            return HIT
        if key in self._misses or self._closed.is_set():
            return MISS
        return self._prober.ask(key, may_inline=self.fault_hook is None)  # a hook may block

    def close(self) -> None:
        """Finish queued jobs, stop probing and scanning, and stop every thread, waiting
        ``workers.CLOSE_WAIT_S`` at most in all. Threads still busy then (I/O stuck on the
        medium) are left running, and the namespace's descriptors stay open under them:
        closing one could let a stuck write land wherever its number is reused."""
        if self._closed.is_set():
            return
        self._closed.set()
        deadline = time.monotonic() + workers.CLOSE_WAIT_S
        busy = self._runner.close(workers.left(deadline))
        busy += self._prober.close(workers.left(deadline))
        self._scanner.join(workers.left(deadline))
        if busy or self._scanner.is_alive():
            log.warning("%s: threads still busy at close; its files stay open", self.name)
            return
        self._files.close()
        if self._shared is not None:
            self._shared.close()

    def stats(self) -> dict[str, int]:
        """Counters (see the module docstring) plus ``index_chunks``, ``index_bytes``, ..."""
        return {
            **self._counters.snapshot(),
            **self._files.reader.read_path_counts(),
            "index_chunks": len(self._index),
            "index_bytes": self._index.used_bytes,
            "unreachable_chunks": self._index.unreachable_count(),
            "index_forgotten": self._index.forgotten_count(),
            "o_direct": int(self.o_direct),
            "native_io": int(native.usable()),
            "read_only": int(self._files.directory.read_only),
            "scan_done": int(self._scanned.is_set()),
            "inline_probes": int(self._prober.inline),
        }

    # -- extras -----------------------------------------------------------------------------
    def wait_scanned(self, timeout: float | None = None) -> bool:
        """Wait for the start-up scan (index rebuild, temp-file scrub); ``False`` on timeout."""
        return self._scanned.wait(timeout)

    def take_removed(self) -> list[ChunkKey]:
        """Keys whose files this tier deleted (evicted or corrupt) since the last call."""
        return self._removals.take()

    # -- stores -----------------------------------------------------------------------------
    def submit_store(self, job: TransferJob) -> None:
        self._index.expect(job.chain())  # in submission order, before any thread reserves
        super().submit_store(job)

    def _store(self, job: TransferJob) -> list[ChunkKey]:
        try:
            for i, (key, slot) in enumerate(zip(job.keys, job.slots, strict=True)):
                self._store_one(key, slot, job.link_of(i))
        finally:
            self._index.forget(job.keys)
        self._index.touch_many(job.keys)  # the job's prefix: its head ends most recent
        return list(job.keys)

    def _store_one(self, key: ChunkKey, slot: int, link: Link | None) -> None:
        """Write one chunk unless already on disk; raises ``TierError`` when it cannot."""
        if not self._files.directory.may_write():
            self._counters.add("store_failed.read_only")
            raise TierError(f"{self.name}: read-only, {self.namespace} cannot be written")
        try:
            if self._on_disk(key):
                self._counters.add("store_skipped_present")
                return
            if not self._write(key, slot, link):
                self._counters.add("store_skipped_bound")  # a prefix longer than max_bytes
                return
        except (OSError, CapacityError) as exc:
            reason = failure_reason(exc) if isinstance(exc, OSError) else "capacity"
            self._counters.add(f"store_failed.{reason}")
            raise TierError(f"{self.name}: cannot store chunk {key.hex()[:16]}: {exc}") from exc
        self._misses.discard(key)
        self._stamps.written(key)  # a load soon after need not stamp it again (a utime each)
        self._counters.add_pair("stored_chunks", "stored_bytes", self._file_bytes)

    def _on_disk(self, key: ChunkKey) -> bool:
        """Whether an indexed ``key`` still has its file (another instance may have evicted it,
        or something not a regular file may stand there now: the write replaces it)."""
        if not self._index.touch(key):
            return False
        with suppress(NotRegularError):
            if self._files.size_of(key) == self._file_bytes:
                return True
        self._index.discard(key)
        return False

    def _write(self, key: ChunkKey, slot: int, link: Link | None) -> bool:
        """Write one chunk file; ``False`` when the bound leaves no room for it but by evicting
        its own prefix (its tail is then not written: ``ChunkIndex.reserve``)."""
        nbytes = self._file_bytes
        if not self._space.allows(nbytes):
            raise OSError(errno.ENOSPC, "min_free_bytes reached")
        victims = self._index.reserve(nbytes, link.parent if link is not None else None, key)
        if victims is None:
            return False
        self._removals.delete(victims, "evicted")
        if not self._removals.reserve_shared(nbytes, key):
            self._index.release(nbytes, key)
            return False
        try:
            self._hook("store", key)
            self._files.write(key, self._region, slot, link)
        except BaseException:
            self._index.release(nbytes, key)
            if self._shared is not None:
                self._shared.release(nbytes, key)
            raise
        self._index.commit(key, nbytes, link.parent if link is not None else None)
        self._space.wrote(nbytes)
        if self._shared is not None:
            self._shared.wrote(key)
        return True

    # -- loads ------------------------------------------------------------------------------
    def _load(self, job: TransferJob) -> JobOutcome:
        mark = self._index.mark()  # a chunk evicted while read is served, not indexed again
        reads = zip(job.keys, self._read(job), strict=True)
        outcomes = [(key, self._outcome(key, read, mark)) for key, read in reads]
        return JobOutcome(
            [key for key, outcome in outcomes if outcome == "loaded"],
            [key for key, outcome in outcomes if outcome == "corrupt"],
        )

    def _loaded(self, job: TransferJob) -> None:
        self._index.touch_many(job.keys)  # once, after every part: the head ends most recent

    def _read(self, job: TransferJob) -> list[Read]:
        """Each chunk of ``job`` read into its slot: in one call for the whole job, or chunk by
        chunk with the fault hook (``load``) before each read (its fault is the read's)."""
        if self.fault_hook is None:
            return self._files.reader.read_many(job.keys, self._region, job.slots)
        return [self._hooked_read(key, slot) for key, slot in zip(job.keys, job.slots, strict=True)]

    def _hooked_read(self, key: ChunkKey, slot: int) -> Read:
        try:
            self._hook("load", key)
        except Exception as exc:
            return exc
        return self._files.reader.read_many([key], self._region, [slot])[0]

    def _outcome(self, key: ChunkKey, read: Read, mark: int) -> _LoadOutcome:
        """Count what reading ``key`` came to (never raises but for a bug: then the job fails)."""
        try:
            if isinstance(read, Exception):
                raise read
            size, link = read
        except FileNotFoundError:
            self._index.discard(key)
            self._counters.add("load_missing")
            return "absent"
        except IntegrityError as exc:
            log.warning("%s: deleted chunk %s: %s", self.name, key.hex()[:16], exc)
            self._index.discard(key)
            self._removals.deleted_elsewhere(key)
            self._counters.add(f"integrity.{exc.reason}")
            return "corrupt"
        except NotRegularError:
            self._index.discard(key)  # a miss from now on, until a store replaces it
            self._misses.add(key)
            self._counters.add("load_failed.not_regular")
            return "unreadable"
        except OSError as exc:
            self._counters.add(f"load_failed.{failure_reason(exc)}")
            return "unreadable"
        victims = self._index.add(key, size, link.parent if link else None, since=mark)
        self._removals.delete(victims or [], "evicted")
        self._counters.add_pair("loaded_chunks", "loaded_bytes", size)
        self._mark_used(key)
        return "loaded"

    def _mark_used(self, key: ChunkKey) -> None:
        """Record the use in the file's mtime (throttled: ``USE_STAMP_S``); a failure only
        costs the record, counted."""
        if not self._stamps.due(key):
            return
        try:
            self._files.mark_used(key)
        except OSError as exc:
            self._counters.add(f"mark_used_failed.{failure_reason(exc)}")

    # -- background -------------------------------------------------------------------------
    def _probe(self, key: ChunkKey) -> bool:
        """Whether ``key``'s file is there (one ``stat``), indexed or remembered as a miss. A
        file this tier deleted while the ``stat`` ran is a miss (``probe_raced_delete``)."""
        mark = self._index.mark()
        try:
            self._hook("probe", key)
            size = self._files.size_of(key)
        except OSError as exc:
            self._counters.add(f"probe_failed.{failure_reason(exc)}")
            size = None
        victims = None if size is None else self._index.add(key, self._file_bytes, since=mark)
        if victims is None:
            self._misses.add(key)
            self._counters.add("probe_misses" if size is None else "probe_raced_delete")
            return False
        if size != self._file_bytes:  # counted at a chunk's size: its load fails and deletes it
            self._counters.add("probe_wrong_size")
        self._removals.delete(victims, "evicted")
        self._counters.add("probe_hits")
        return True

    def _scan(self) -> None:
        try:
            result = self._files.scan(self._closed)
            nbytes = self._file_bytes  # not st_size: a planted sparse file would evict the rest
            if wrong := sum(1 for chunk in result.chunks if chunk[2] != nbytes):
                self._counters.add("scan_wrong_size", wrong)  # their loads fail and delete them
            found = [(key, nbytes, parent) for _, key, _, parent in sorted(result.chunks)]
            self._removals.delete(self._index.merge_cold(found, self._scan_mark), "evicted")
            self._counters.add("scan_found_chunks", len(found))
            self._counters.add("scrubbed_tmp_files", result.stale_removed)
            for reason, count in result.skipped.items():
                self._counters.add(f"scan_skipped.{reason}", count)
        except OSError as exc:
            log.warning("%s: start-up scan of %s failed: %s", self.name, self.namespace, exc)
            self._counters.add(f"scan_failed.{failure_reason(exc)}")
        finally:
            self._scanned.set()

    def _hook(self, op: str, key: ChunkKey) -> None:
        if self.fault_hook is not None:
            self.fault_hook(op, key)
