"""``kvtier cache verify`` and ``gc``: running them and printing what they did.

``run_gc`` with ``--every`` runs a round, then waits ``--every`` seconds, until SIGTERM or
SIGINT: the signal ends the wait at once, or the round in progress between two deletions,
and the command exits 0. Each round opens the target again (namespaces made since are seen);
a round whose target cannot be opened says why on stderr and is skipped, not the end.

Thread safety: the main thread only (signal handlers are installed there).
"""

from __future__ import annotations

import argparse
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from kvtier.cache.gc import GcOptions, GcReport, collect_garbage
from kvtier.cache.inventory import size
from kvtier.cache.progress import Progress
from kvtier.cache.records import Problems
from kvtier.cache.store import Store
from kvtier.cache.target import TargetSpec, open_target
from kvtier.cache.verify import Verifier, VerifyReport
from kvtier.cli.common import UsageError, one_line
from kvtier.errors import KVTierError


def reopen(args: argparse.Namespace) -> Store[Any]:
    """The target of ``args`` opened again (a ``gc --every`` round)."""
    return open_store(args)[0]


def open_store(args: argparse.Namespace) -> tuple[Store[Any], str | None]:
    """The target of ``args`` and its integrity key file; ``UsageError`` when it cannot be
    opened. Raises the soft limit on open files first (``allow_open_files``)."""
    allow_open_files()
    spec = TargetSpec(args.target, args.config, args.tier, args.endpoint, args.region)
    try:
        return open_target(spec)
    except KVTierError as exc:
        raise UsageError(str(exc)) from None


def allow_open_files() -> None:
    """Raise this process's soft limit on open files to its hard limit: an fs store keeps
    every namespace's directory open while a command runs (``FsStore``), and whoever can write
    the cache can make empty namespaces by the thousand. Left as it is where it cannot be."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def report_problems(problems: Problems) -> None:
    """Each problem's line on stderr, then the counters."""
    for line in problems.lines:
        print(f"kvtier cache: {line}", file=sys.stderr)
    if problems.counts:
        print(f"kvtier cache: counted: {problems.summary()}", file=sys.stderr)


def run_verify(args: argparse.Namespace, store: Store[Any], key_file: str | None) -> int:
    """Verify every chunk; exit status 1 when one was bad or something could not be read."""
    from kvtier.tiers.shared.sealing import make_sealer

    try:
        sealer = make_sealer(key_file) if key_file else None
    except KVTierError as exc:
        store.close()
        raise UsageError(f"--integrity-key-file: {exc}") from None
    problems = Problems()
    verifier = Verifier(
        store,
        problems,
        Progress(args.progress),
        jobs=args.jobs,
        repair=args.repair,
        sealer=sealer,
        max_chunk_bytes=args.max_chunk_bytes,
    )
    try:
        report = verifier.run()
    except KVTierError as exc:
        print(f"kvtier: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    finally:
        store.close()
    report_problems(problems)
    print(verify_summary(report, problems))
    return 1 if report.bad or problems.serious() else 0


def verify_summary(report: VerifyReport, problems: Problems) -> str:
    """One line: chunks, bytes, time, read rate, good and bad by reason, removed."""
    bad = sum(report.bad.values())
    reasons = ", ".join(f"{k}={n}" for k, n in sorted(report.bad.items()))
    parts = [
        f"verified {report.chunks} chunks, {size(report.bytes)} in {report.seconds:.1f} s "
        f"({size(int(report.rate))}/s)",
        f"{report.good} good",
        f"{bad} bad" + (f" ({reasons})" if reasons else ""),
    ]
    for kind, what in (("sealed_unverified", "sealed, not verifiable without the key"),):
        if problems.counts[kind]:
            parts.append(f"{problems.counts[kind]} {what}")
    if problems.counts["vanished"]:
        parts.append(f"{problems.counts['vanished']} deleted meanwhile (not a fault)")
    if report.removed:
        parts.append(f"{report.removed} removed")
    return ": ".join(parts[:1]) + ": " + ", ".join(parts[1:])


def run_gc(args: argparse.Namespace, store: Store[Any]) -> int:
    """One round of gc (exit status 1 when it failed), or (``--every``) rounds until a
    signal, a failed round logged and the next one run (exit status 0)."""
    options = GcOptions(args.max_bytes, args.older_than, args.identity, args.model, args.dry_run)
    if args.every is None:
        return 0 if _gc_round(store, options, None) else 1
    stop = threading.Event()
    found: Store[Any] | None = store
    with _stopping_on_signals(stop.set):
        while not stop.is_set():
            if found is not None:
                _gc_round(found, options, stop)
            if stop.wait(args.every):
                break
            found = _reopened(args)
    print("kvtier cache gc: stopped", file=sys.stderr)
    return 0


def _reopened(args: argparse.Namespace) -> Store[Any] | None:
    """The target opened again for the next round; ``None``, its error said on stderr, when
    it cannot be now (a mount or endpoint away for a while): the sidecar goes on."""
    try:
        return reopen(args)
    except UsageError as exc:
        print(f"kvtier: error: {one_line(str(exc))}", file=sys.stderr, flush=True)
        return None


def _gc_round(store: Store[Any], options: GcOptions, stop: threading.Event | None) -> bool:
    """One round, its problems and summary printed; whether it ran (else its error is)."""
    problems = Problems()
    try:
        report = collect_garbage(store, problems, options, time.time(), stop)
    except KVTierError as exc:
        print(f"kvtier: error: {one_line(str(exc))}", file=sys.stderr)
        return False
    finally:
        store.close()
    report_problems(problems)
    print(gc_summary(report, options.dry_run), flush=True)
    return True


def gc_summary(report: GcReport, dry_run: bool) -> str:
    """One line: what was found, chosen (by why), deleted and left."""
    why = ", ".join(f"{k}={n}" for k, n in sorted(report.chosen.items())) or "nothing"
    chosen = sum(report.chosen.values())
    found = f"found {report.chunks} chunks, {size(report.bytes)}"
    unreachable = f", {report.unreachable_first} unreachable" if report.unreachable_first else ""
    temporaries = (
        f"; {report.temporaries} stale temporary files, {size(report.temporaries_bytes)}"
        if report.temporaries
        else ""
    )
    if dry_run:
        return (
            f"gc (dry run): {found}: would delete {chosen} ({why}{unreachable}), "
            f"{size(report.chosen_bytes)}{temporaries}; deleted nothing"
        )
    return (
        f"gc: {found}: deleted {report.deleted} ({why}{unreachable}), "
        f"{size(report.deleted_bytes)}{temporaries}; {report.skipped} skipped (used or gone "
        f"meanwhile); {size(report.left_bytes)} left"
    )


class _stopping_on_signals:
    """Install ``handler`` for SIGTERM and SIGINT for the block; the old ones after it."""

    def __init__(self, handler: Callable[[], None]) -> None:
        self._handler = handler
        self._old: dict[int, Any] = {}

    def __enter__(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, lambda *_: self._handler())

    def __exit__(self, *_: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
