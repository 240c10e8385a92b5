"""ThrottledLog: a failure that repeats on the data path is logged once per interval."""

from __future__ import annotations

import logging
import time

from kvtier.telemetry.logs import ThrottledLog


def test_repeats_are_counted_and_reported_with_the_next_warning(caplog):
    log = ThrottledLog(logging.getLogger("kvtier.test"), interval_s=0.2)
    with caplog.at_level(logging.WARNING):
        for i in range(100):
            log.warning("lookup:fs", "tier fs lookup failed: %s", i)
        log.warning("lookup:obj", "tier obj lookup failed")
        time.sleep(0.25)
        log.warning("lookup:fs", "tier fs lookup failed: %s", "again")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "tier fs lookup failed: 0",
        "tier obj lookup failed",
        "tier fs lookup failed: again (and 99 more like it in the last 0.2 s)",
    ]


def test_a_tier_failing_every_lookup_does_not_flood_the_log(identity, caplog):
    from kvtier import TieringManager
    from tests.conftest import config, make_keys

    tiers = [{"type": "fault", "inner": {"type": "memory"}, "raise_in_lookup": True}]
    with (
        TieringManager(config(4, secondary_tiers=tiers), identity) as m,
        caplog.at_level(logging.WARNING),
    ):
        for seed in range(200):
            assert m.lookup(make_keys(identity, 1, seed=seed)) == 0
    failures = [r for r in caplog.records if "lookup failed" in r.getMessage()]
    assert len(failures) <= 1  # 200 failing lookups; the throttle is per process, so maybe 0
    assert (
        m.metrics.telemetry.get("kvtier_tier_errors_total", tier=m.tiers[0].name, where="lookup")
        == 200
    )


def _stderr_of(code: str) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return done.stderr


def test_in_a_process_without_logging_set_up_kvtiers_records_get_level_and_logger():
    err = _stderr_of(
        "import logging; from kvtier.telemetry.logs import log_to_stderr; log_to_stderr(); "
        "logging.getLogger('kvtier.x').warning('removed it')"
    )
    assert "WARNING" in err and "[kvtier.x] removed it" in err


def test_where_the_application_set_up_logging_nothing_is_added():
    err = _stderr_of(
        "import logging; logging.basicConfig(format='APP %(message)s'); "
        "from kvtier.telemetry.logs import log_to_stderr; log_to_stderr(); "
        "logging.getLogger('kvtier.x').warning('removed it')"
    )
    assert err.strip() == "APP removed it"
