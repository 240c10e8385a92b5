"""Plant small, realistic bugs one at a time in a copy of the tree and see which the suite catches.

Each ``Bug`` names a file under ``src/``, an exact snippet of it (found exactly once), the
snippet to put in its place, and the tests expected to catch it: one or more pytest
selections, each run on its own (a rule shared by the manager and the vLLM adapter lists a
selection per path, and counts as caught only when every path catches it). Nothing in the
working tree is changed: the script copies ``src``, ``tests`` and ``pyproject.toml`` to a
temporary directory per bug and runs pytest there with ``PYTHONPATH`` pointing at the copy.

    .venv/bin/python -m tests.audit.planted_bugs              # every bug, then a table
    .venv/bin/python -m tests.audit.planted_bugs A1 S2        # some of them
    .venv/bin/python -m tests.audit.planted_bugs --list       # the bugs, nothing run
    .venv/bin/python -m tests.audit.planted_bugs --baseline   # the selections pass unplanted

``tests/audit/test_planted_bugs.py`` checks at every run of the suite that each snippet is
still found exactly once, so the list cannot rot silently when the code moves. How the audit
was done and its last result: ``docs/testing.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("src", "tests", "pyproject.toml")
TIMEOUT_S = 900


@dataclass(frozen=True)
class Bug:
    id: str
    file: str  # relative to the repository root
    old: str  # found exactly once in ``file``
    new: str
    tests: tuple[str, ...]  # pytest selections; each must fail for the bug to count as caught
    what: str


ADMISSION = "src/kvtier/control/admission"
PRIORITY = "src/kvtier/policies/priority.py"
HOST = "src/kvtier/core/host_slots.py"
GUARD = "src/kvtier/control/slo_guard.py"
VLLM = "src/kvtier/integrations/vllm"
BOUNDS = "tests/control/test_admission_bounds.py"
VLLM_BOUNDS = "tests/integrations/vllm/test_retention_bounds.py"
PRIORITY_BOUNDS = "tests/policies/test_priority_bounds.py"
GUARD_BOUNDS = "tests/control/test_slo_guard_bounds.py"

BUGS: tuple[Bug, ...] = (
    # -- admission: thresholds, windows, the sketch ------------------------------------------
    Bug("A1", f"{ADMISSION}/rules.py",
        "recent[index] < config.min_frequency", "recent[index] <= config.min_frequency",
        (f"{BOUNDS}::test_min_frequency_keeps_a_chunk_seen_exactly_that_often",
         f"{VLLM_BOUNDS}::test_min_frequency_through_the_adapters_gate"),
        "min_frequency needs one sighting more than it says"),
    Bug("A2", f"{ADMISSION}/rules.py",
        "offer.prefix_chunks[index] < config.min_prefix_chunks",
        "offer.prefix_chunks[index] <= config.min_prefix_chunks",
        (f"{BOUNDS}::test_min_prefix_chunks_keeps_a_prefix_exactly_that_long",
         f"{VLLM_BOUNDS}::test_min_prefix_chunks_through_the_adapters_gate"),
        "a prefix exactly min_prefix_chunks long is dropped"),
    Bug("A3", f"{ADMISSION}/rules.py",
        "elif seen < config.min_reuse:", "elif seen <= config.min_reuse:",
        (f"{BOUNDS}::test_min_reuse_keeps_a_chunk_from_exactly_its_nth_sighting",
         f"{VLLM_BOUNDS}::test_min_reuse_through_the_adapters_gate"),
        "min_reuse needs one sighting more than it says"),
    Bug("A4", f"{ADMISSION}/gate.py",
        '"priority" if p < floor else None', '"priority" if p <= floor else None',
        (f"{BOUNDS}::test_secondary_min_priority_keeps_a_chunk_exactly_at_the_floor",
         f"{VLLM_BOUNDS}::test_the_priority_floor_through_the_adapters_gate"),
        "a chunk exactly at secondary_min_priority is kept from the tiers"),
    Bug("A5", f"{ADMISSION}/gate.py",
        "FrequencySketch(decay_every=window)", "FrequencySketch()",
        (f"{BOUNDS}::test_the_frequency_window_halves_counts_at_its_length_and_not_before",
         f"{VLLM_BOUNDS}::test_the_frequency_window_through_the_adapters_gate"),
        "the frequency filter never decays (its window ignored)"),
    Bug("A6", f"{ADMISSION}/gate.py",
        "FrequencySketch(decay_every=window)", "FrequencySketch(decay_every=window + 1)",
        (f"{BOUNDS}::test_the_frequency_window_halves_counts_at_its_length_and_not_before",),
        "the frequency window is one sighting too long"),
    Bug("A7", f"{ADMISSION}/sketch.py",
        "np.where(seen < 255, seen + 1, seen)", "seen + 1",
        (f"{BOUNDS}::test_sketch_counters_saturate_instead_of_wrapping",),
        "sketch counters wrap to 0 past 255"),
    Bug("A8", f"{ADMISSION}/sketch.py",
        "self._counts >>= min(halvings, 8)", "self._counts >>= 1",
        ("tests/control/test_admission.py::test_counts_are_halved_once_per_window_even_within_one_call",),
        "one halving per call, however many windows it crossed"),
    Bug("A9", f"{ADMISSION}/gate.py",
        "            for sketch in self._windows.values():\n                sketch.record(keys)\n",
        "",
        (f"{BOUNDS}::test_min_frequency_keeps_a_chunk_seen_exactly_that_often",
         f"{VLLM_BOUNDS}::test_min_frequency_through_the_adapters_gate"),
        "sightings never reach the frequency filter"),
    Bug("A10", "src/kvtier/core/runtime.py",
        "if offer_id is None or offer != self._last_offer:", "if offer != self._last_offer:",
        (f"{VLLM_BOUNDS}::test_offers_without_an_id_are_each_a_sighting",),
        "the adapter's same keys offered twice without an id count once"),
    # -- priorities: the range, durations and expiries ---------------------------------------
    Bug("R1", PRIORITY,
        "if not MIN_PRIORITY <= number <= MAX_PRIORITY:",
        "if not MIN_PRIORITY <= number < MAX_PRIORITY:",
        (f"{PRIORITY_BOUNDS}::test_the_priority_range_through_the_manager",
         f"{VLLM_BOUNDS}::test_the_priority_range_through_a_requests_retention"),
        "priority 100 is refused"),
    Bug("R2", PRIORITY,
        "if not MIN_PRIORITY <= number <= MAX_PRIORITY:",
        "if not MIN_PRIORITY < number <= MAX_PRIORITY:",
        (f"{PRIORITY_BOUNDS}::test_the_priority_range_through_the_manager",
         f"{VLLM_BOUNDS}::test_the_priority_range_through_a_requests_retention"),
        "priority 0 is refused"),
    Bug("R3", PRIORITY,
        "if not (math.isfinite(seconds) and seconds > 0):",
        "if not (math.isfinite(seconds) and seconds >= 0):",
        (f"{PRIORITY_BOUNDS}::test_a_duration_must_be_above_zero_through_the_manager",
         f"{VLLM_BOUNDS}::test_a_duration_must_be_above_zero_in_a_requests_retention"),
        "a duration of 0 seconds is accepted"),
    Bug("R4", PRIORITY,
        "        self._until.pop(key, None)\n        if until is None:\n            return\n",
        "        if until is None:\n            return\n        self._until.pop(key, None)\n",
        (f"{PRIORITY_BOUNDS}::test_an_expiry_is_renewed_replaced_and_removed",
         f"{VLLM_BOUNDS}::test_an_expiry_is_removed_by_a_use_without_a_duration"),
        "a priority given without a duration keeps the old expiry"),
    Bug("R5", PRIORITY,
        "while self._heap and self._heap[0][0] <= now:",
        "while self._heap and self._heap[0][0] < now:",
        (f"{PRIORITY_BOUNDS}::test_an_expiry_is_renewed_replaced_and_removed",),
        "a priority ends just after its end instead of at it"),
    Bug("R6", PRIORITY,
        "given[1] is not None and now >= given[1]", "given[1] is not None and now > given[1]",
        (f"{PRIORITY_BOUNDS}::test_the_operators_retention_ends_exactly_at_its_end",),
        "the operator's retention outlasts its end by an instant"),
    Bug("R7", PRIORITY,
        "if cap is not None and priority != DEFAULT_PRIORITY:", "if cap is not None:",
        ("tests/policies/test_request_limits.py",),
        "a retention at the default priority gets the duration cap"),
    Bug("R8", PRIORITY,
        "duration_s = cap if duration_s is None else min(duration_s, cap)",
        "duration_s = cap if duration_s is None else max(duration_s, cap)",
        ("tests/policies/test_request_limits.py",),
        "a duration is raised to the cap instead of cut to it"),
    Bug("R9", PRIORITY,
        "priority = min(priority, self.max_priority)",
        "priority = min(priority, self.max_priority - 1)",
        (f"{PRIORITY_BOUNDS}::test_a_request_may_ask_for_exactly_the_cap",
         f"{VLLM_BOUNDS}::test_a_request_may_ask_for_exactly_the_cap"),
        "a request asking for exactly the cap is cut below it"),
    Bug("R10", "src/kvtier/control/retention.py",
        "self._operator.lift(key)\n        self._admission.seen(new)",
        "pass\n        self._admission.seen(new)",
        (f"{PRIORITY_BOUNDS}::test_a_chunk_stored_anew_is_no_longer_the_operators",),
        "a chunk stored anew keeps the operator's retention of its earlier copy"),
    # -- the vLLM adapter's retention --------------------------------------------------------
    Bug("V1", f"{VLLM}/request_retention.py",
        "if span.start < end_token <= span.end:", "if span.start <= end_token <= span.end:",
        (f"{VLLM_BOUNDS}::test_a_range_covers_chunks_ending_just_inside_it_only",),
        "a range also covers the chunk ending at its start"),
    Bug("V2", f"{VLLM}/request_retention.py",
        "len(spans) > MAX_RANGES", "len(spans) >= MAX_RANGES",
        (f"{VLLM_BOUNDS}::test_a_request_may_give_exactly_max_ranges",),
        "a request with exactly MAX_RANGES ranges is refused"),
    Bug("V3", f"{VLLM}/request_retention.py",
        "if end <= start:", "if end < start:",
        (f"{VLLM_BOUNDS}::test_an_empty_range_is_refused",),
        "an empty range (end == start) is accepted"),
    Bug("V4", f"{VLLM}/priority_cache.py",
        "        if retention.operator:\n            self._operator.give(key, retention.priority, until)\n        self.mark(key, evictable)",
        "        self.mark(key, evictable)",
        ("tests/integrations/vllm/test_retention.py",),
        "the operator's retention given with a new chunk is not recorded"),
    Bug("V5", f"{VLLM}/request_retention.py",
        "return -(-max(ends, default=0) // chunk_tokens), priorities",
        "return max(ends, default=0) // chunk_tokens, priorities",
        (f"{VLLM_BOUNDS}::test_min_prefix_chunks_through_the_adapters_offer",),
        "the adapter offers a prefix rounded down to whole chunks"),
    Bug("V6", f"{VLLM}/request_retention.py",
        "priorities.append(DEFAULT_PRIORITY if retention is None else retention.priority)",
        "priorities.append(0 if retention is None else retention.priority)",
        (f"{VLLM_BOUNDS}::test_the_offered_priorities_are_each_keys_retention_or_the_default",),
        "the adapter offers chunks without retention at priority 0, not the default"),
    # -- holds ----------------------------------------------------------------------------------
    Bug("H1", HOST,
        "            if not n:\n                break\n",
        "            if not n:\n                continue\n",
        ("tests/core/test_host_holds.py",),
        "a release of held and unheld keys releases past the unheld one, puts back the wrong ones"),
    Bug("H2", HOST,
        "return all(get(key, 0) > 0 for key in keys)", "return all(get(key, 0) >= 0 for key in keys)",
        ("tests/core/test_host_holds.py",),
        "can_release says yes for keys the owner does not hold"),
    Bug("H3", HOST,
        "            if n > 1:\n                held[key] = n - 1\n",
        "            if n >= 1:\n                held[key] = n - 1\n",
        ("tests/core/test_host_holds.py",),
        "a released last hold stays recorded (at 0) for its owner"),
    Bug("H4", HOST,
        "self.hold(keys[:released], owner)  # puts back",
        "self.hold(keys[: max(0, released - 1)], owner)  # puts back",
        ("tests/core/test_host.py::test_a_release_that_fails_changes_nothing",),
        "a failed release puts back one hold too few"),
    # -- the SLO guard and the switches --------------------------------------------------------
    Bug("S1", GUARD,
        "backoff = min(previous.backoff * 2, MAX_BACKOFF)", "backoff = previous.backoff * 2",
        (f"{GUARD_BOUNDS}::test_the_backoff_doubles_up_to_its_cap_and_no_further",),
        "the cool-down backoff grows without its cap"),
    Bug("S2", "src/kvtier/control/tier_switches.py",
        "if self.guard is not None:\n            self.guard.switched_by_hand(name)",
        "if changed and self.guard is not None:\n            self.guard.switched_by_hand(name)",
        (f"{GUARD_BOUNDS}::test_a_switch_by_hand_that_changes_nothing_still_tells_the_guard",),
        "the guard is not told of a switch by hand that changed nothing"),
    Bug("S3", GUARD,
        "if now - since >= self.config.sustain_s:", "if now - since > self.config.sustain_s:",
        (f"{GUARD_BOUNDS}::test_the_guard_trips_exactly_at_sustain_s",),
        "a breach must last longer than sustain_s"),
    Bug("S4", GUARD,
        "trip.returned_at is not None or now < trip.until",
        "trip.returned_at is not None or now <= trip.until",
        (f"{GUARD_BOUNDS}::test_a_tier_returns_exactly_at_the_end_of_its_cool_down",),
        "a tier returns only after its cool-down, not at its end"),
    Bug("S5", GUARD,
        "now - previous.returned_at < self.config.window_s",
        "now - previous.returned_at <= self.config.window_s",
        (f"{GUARD_BOUNDS}::test_a_trip_exactly_window_s_after_the_return_starts_the_backoff_over",),
        "a trip exactly window_s after the return still doubles the cool-down"),
    Bug("S6", GUARD,
        "self._samples[0][0] < now - self.seconds", "self._samples[0][0] <= now - self.seconds",
        (f"{GUARD_BOUNDS}::test_a_sample_stays_in_the_window_until_window_s_have_passed",),
        "a sample leaves the window an instant early"),
    Bug("S7", GUARD,
        "if len(values) < min_samples:", "if len(values) <= min_samples:",
        (f"{GUARD_BOUNDS}::test_a_budget_is_judged_from_exactly_min_samples",),
        "a budget needs one sample more than min_samples"),
    Bug("S8", GUARD,
        "return values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)]",
        "return values[min(len(values) - 1, math.ceil(0.99 * len(values)))]",
        (f"{GUARD_BOUNDS}::test_the_p99_of_100_samples_is_the_99th",),
        "the p99 is one sample too high"),
    Bug("S9", GUARD,
        "sample = max(seconds, 2 * budget) if failed else seconds",
        "sample = max(seconds, budget) if failed else seconds",
        (f"{GUARD_BOUNDS}::test_failed_promotions_break_the_budget_however_fast",),
        "a fast failed promotion counts as within the budget"),
    Bug("S10", GUARD,
        "return budget is None or p99 is None or p99 < budget * self.config.recover_ratio",
        "return budget is None or p99 is None or p99 <= budget * self.config.recover_ratio",
        (f"{GUARD_BOUNDS}::test_a_request_budget_recovers_only_below_recover_ratio",),
        "a request budget exactly at recover_ratio counts as recovered"),
    Bug("S11", GUARD,
        "if trip is not None and trip.returned_at is None:\n            trip.returned_at = self.clock()",
        "if trip is not None and trip.returned_at is None:\n            pass",
        (f"{GUARD_BOUNDS}::test_switch_by_hand_cool_down_and_trip_in_every_order",),
        "a switch by hand does not end a pending cool-down"),
    # -- the planner's estimator ------------------------------------------------------------
    Bug("P1", "src/kvtier/plan/stack.py",
        "marks = np.where(sub_hot, 1.0, 1.0 / sub_rate)",
        "marks = np.where(sub_hot, 1.0, 1.0 / rate)",
        ("tests/plan/test_shards_estimate.py",),
        "SHARDS distances drop the sub-sample factor (a weighting)"),
    Bug("P2", "src/kvtier/plan/stack.py",
        "weight = np.where(sub_hot, tokens, tokens * normal_usable / sampled_usable) / parts",
        "weight = np.where(sub_hot, tokens, tokens * normal_usable / sampled_usable)",
        ("tests/plan/test_shards_estimate.py",),
        "SHARDS hit weights are not divided among the sub-samples"),
    Bug("P3", "src/kvtier/plan/stack.py",
        "marks = np.where(sub_hot, 1.0, 1.0 / sub_rate)",
        "marks = np.where(sub_hot, 1.0 / sub_rate, 1.0 / sub_rate)",
        ("tests/plan/test_shards_estimate.py",),
        "the hot keys kept in every sub-sample are weighted as sampled ones"),
    Bug("P4", "src/kvtier/plan/stack.py",
        "if len(stream) <= exact_limit:", "if len(stream) < exact_limit:",
        ("tests/plan/test_shards_estimate.py",),
        "a trace of exactly exact_limit references is sampled"),
    Bug("P5", "src/kvtier/plan/curves.py",
        ".std(axis=0, ddof=1).max() / np.sqrt(len(parts))", ".std(axis=0, ddof=1).max()",
        ("tests/plan/test_shards_estimate.py",),
        "the standard error is the sub-samples' spread, not over sqrt(K)"),
    Bug("P6", "src/kvtier/plan/curves.py",
        "index = np.searchsorted(values[usable][order], capacities, side=\"left\")",
        "index = np.searchsorted(values[usable][order], capacities, side=\"right\")",
        ("tests/plan/test_shards_estimate.py",),
        "a chunk at stack distance C counts as a hit in a cache of C"),
    # -- the fs tier's "auto" reads -------------------------------------------------------------
    Bug("F1", "src/kvtier/tiers/fs/reader.py",
        "direct = not CACHESTAT.is_cached(fd, found.st_size)",
        "direct = CACHESTAT.is_cached(fd, found.st_size)",
        ("tests/tiers/fs/test_filesystem_read_path.py",),
        "auto reads cached chunks with O_DIRECT and cold ones through the page cache"),
    Bug("F2", "src/kvtier/tiers/fs/page_cache.py",
        "return pages is not None and pages * PAGE >= size",
        "return pages is not None and pages * PAGE > size",
        ("tests/tiers/fs/test_filesystem_read_path.py",),
        "a wholly cached chunk of whole pages counts as not cached"),
    Bug("F3", "src/kvtier/tiers/fs/page_cache.py",
        "return pages is not None and pages * PAGE >= size",
        "return pages is not None and (pages + 1) * PAGE >= size",
        ("tests/tiers/fs/test_filesystem_read_path.py",),
        "a chunk missing its last page counts as cached"),
    Bug("F4", "src/kvtier/tiers/fs/files.py",
        'self.adaptive = o_direct == "auto" and self.o_direct and CACHESTAT.available',
        "self.adaptive = False",
        ("tests/tiers/fs/test_filesystem_read_path.py",),
        "auto is plain O_DIRECT even where cachestat is available"),
    Bug("F5", "src/kvtier/tiers/fs/page_cache.py",
        "if self._room < nbytes:", "if self._room <= nbytes:",
        ("tests/tiers/fs/test_filesystem_page_cache.py::test_writes_use_the_cache_only_while_memory_is_free",),
        "a write that exactly fits the page-cache room goes O_DIRECT"),
    Bug("F6", "src/kvtier/tiers/fs/page_cache.py",
        "return max(0, free - int(total * self._reserve_fraction))", "return max(0, free)",
        ("tests/tiers/fs/test_filesystem_page_cache.py::test_writes_use_the_cache_only_while_memory_is_free",),
        "the page-cache reserve is ignored"),
)  # fmt: skip


def apply(bug: Bug, root: Path) -> None:
    """Plant ``bug`` in the tree at ``root``; ``ValueError`` unless its snippet is found once."""
    path = root / bug.file
    text = path.read_text()
    found = text.count(bug.old)
    if found != 1:
        raise ValueError(f"{bug.id}: snippet found {found} times in {bug.file}")
    path.write_text(text.replace(bug.old, bug.new))


def copy_tree(into: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(
                source, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(source, into / name)


def run_selection(root: Path, selection: str) -> tuple[str, str]:
    """(``caught``, the first failing test) / (``survived``, "") / (``error``, why)."""
    env = {**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"}
    env.pop("PYTEST_ADDOPTS", None)
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider"]
    try:
        done = subprocess.run(
            [*command, selection],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return "caught", "(timed out)"
    if done.returncode == 0:
        return "survived", ""
    if done.returncode == 1:
        failed = re.search(r"^FAILED (.+?)(?: - .*)?$", done.stdout, re.MULTILINE)
        return "caught", failed.group(1) if failed else "(failed)"
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return "error", f"exit {done.returncode}: {' | '.join(tail)}"


def audit(bug: Bug | None) -> list[tuple[str, str]]:
    """Each selection's outcome with ``bug`` planted (``None``: nothing planted)."""
    with tempfile.TemporaryDirectory(prefix="kvtier-plant-") as scratch:
        root = Path(scratch)
        copy_tree(root)
        if bug is not None:
            apply(bug, root)
        selections = bug.tests if bug is not None else tuple(sorted(_all_selections()))
        return [run_selection(root, selection) for selection in selections]


def _all_selections() -> set[str]:
    return {selection for bug in BUGS for selection in bug.tests}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ids", nargs="*", help="bugs to plant (default: all)")
    parser.add_argument("--list", action="store_true", help="list the bugs, run nothing")
    parser.add_argument(
        "--baseline", action="store_true", help="run every selection with nothing planted"
    )
    args = parser.parse_args(argv)
    known = {bug.id: bug for bug in BUGS}
    unknown = [i for i in args.ids if i not in known]
    if unknown:
        parser.error(f"no such bug: {', '.join(unknown)}")
    chosen = [known[i] for i in args.ids] if args.ids else list(BUGS)
    if args.list:
        for bug in chosen:
            print(f"{bug.id:4} {bug.file}: {bug.what}")
        return 0
    if args.baseline:
        failing = [
            (s, o) for s, o in zip(sorted(_all_selections()), audit(None)) if o[0] != "survived"
        ]
        for selection, outcome in failing:
            print(f"FAILS UNPLANTED: {selection}: {outcome}")
        print("baseline: every selection passes" if not failing else "baseline: broken")
        return 1 if failing else 0
    missed = 0
    print("| bug | planted in | what | caught by |")
    print("|---|---|---|---|")
    for bug in chosen:
        outcomes = audit(bug)
        caught = all(status == "caught" for status, _ in outcomes)
        missed += not caught
        by = "; ".join(
            detail if status == "caught" else f"{status.upper()}: {selection} {detail}".strip()
            for selection, (status, detail) in zip(bug.tests, outcomes, strict=True)
        )
        print(f"| {bug.id} | `{bug.file.removeprefix('src/kvtier/')}` | {bug.what} | {by} |")
        sys.stdout.flush()
    print(f"\n{len(chosen) - missed} of {len(chosen)} planted bugs caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
