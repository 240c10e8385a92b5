"""Credentials embedded in an object store's endpoint URL never reach errors or logs."""

from __future__ import annotations

import logging
import socket

import pytest

from kvtier import KVTierError, TieringManager
from tests.conftest import config, make_keys


def dead_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_password_in_the_endpoint_url_is_never_shown(identity, caplog):
    endpoint = f"http://kvuser:hunter2@127.0.0.1:{dead_port()}"
    tier = {
        "type": "obj",
        "bucket": "b",
        "endpoint_override": endpoint,
        "access_key": "AKIAEXAMPLE",
        "secret_key": "s3cr3t",
        "timeout_s": 0.5,
    }
    messages = []
    with caplog.at_level(logging.DEBUG, logger="kvtier"):
        try:
            with TieringManager(config(2, secondary_tiers=[tier]), identity) as m:
                m.lookup(make_keys(identity, 2))
                m.wait_idle(5)
                messages.append(repr(m.stats()))
        except KVTierError as exc:
            messages.append(str(exc))
    messages += [record.getMessage() for record in caplog.records]
    text = "\n".join(messages)
    assert "hunter2" not in text and "s3cr3t" not in text
    if "127.0.0.1" in text:
        assert "***@127.0.0.1" in text or "kvuser" not in text


@pytest.mark.parametrize("bad", ["ftp://kvuser:hunter2@host", "kvuser:hunter2@host"])
def test_a_bad_endpoint_error_hides_the_password(identity, bad):
    tier = {"type": "obj", "bucket": "b", "endpoint_override": bad}
    with pytest.raises(KVTierError) as raised:
        TieringManager(config(2, secondary_tiers=[tier]), identity)
    assert "hunter2" not in str(raised.value)
