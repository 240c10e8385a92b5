"""The admin endpoint beside /metrics: off by default, loopback only, switches tiers."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest

from kvtier import ConfigError, TieringConfig, TieringManager
from kvtier.control.admin import admin_app
from tests.conftest import config


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def call(
    port: int, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method, data=b"", headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        body = error.read()
        return error.code, json.loads(body) if body.startswith(b"{") else {}


@pytest.fixture
def served(identity, tmp_path):
    port = free_port()
    tiers = [{"type": "fs", "root_dir": str(tmp_path)}]
    cfg = config(2, secondary_tiers=tiers, metrics_port=port, metrics_admin=True)
    with TieringManager(cfg, identity) as m:
        yield m, port


def test_tiers_are_switched_off_and_on_over_http(served):
    m, port = served
    assert call(port, "/admin/tiers") == (200, {"enabled": ["fs"], "disabled": []})
    status, body = call(port, "/admin/tiers/fs/disable", "POST")
    assert status == 200 and body == {"tier": "fs", "enabled": False, "changed": True}
    assert m.stats()["disabled_tiers"] == ["fs"]
    assert call(port, "/admin/tiers/fs/enable", "POST")[1]["changed"] is True
    assert m.stats()["disabled_tiers"] == []
    assert [s.reason for s in m.take_tier_switches()] == ["admin", "manual"]


@pytest.mark.parametrize(
    ("path", "method", "status"),
    [("/admin/tiers/nope/disable", "POST", 404), ("/admin/tiers/fs/disable", "GET", 405),
     ("/admin/tiers", "POST", 405), ("/admin/other", "GET", 404),
     ("/admin/tiers/fs/disable%0A", "POST", 404)],
)  # fmt: skip
def test_bad_admin_requests_change_nothing(served, path, method, status):
    m, port = served
    assert call(port, path, method)[0] == status
    assert m.stats()["disabled_tiers"] == []


def test_the_admin_endpoint_is_off_by_default(identity):
    port = free_port()
    with TieringManager(config(2, metrics_port=port), identity):
        assert call(port, "/admin/tiers")[0] == 404


def test_the_admin_endpoint_refuses_a_metrics_address_beyond_loopback():
    with pytest.raises(ConfigError, match="metrics_admin"):
        TieringConfig.from_dict(
            {
                "cpu_bytes_to_use": 1 << 20,
                "metrics_port": 9464,
                "metrics_host": "0.0.0.0",
                "metrics_admin": True,
            }
        )


def test_the_admin_endpoint_without_a_metrics_port_is_refused():
    with pytest.raises(ConfigError, match=r"metrics_admin.*metrics_port"):
        TieringConfig.from_dict({"cpu_bytes_to_use": 1 << 20, "metrics_admin": True})


def test_a_client_that_is_not_loopback_is_refused(served):
    m, _ = served
    app = admin_app(m)
    statuses = []
    environ = {
        "PATH_INFO": "/admin/tiers/fs/disable",
        "REQUEST_METHOD": "POST",
        "REMOTE_ADDR": "10.1.2.3",
    }
    app(environ, lambda status, headers: statuses.append(status))  # type: ignore[arg-type]
    assert statuses == ["403 Forbidden"] and m.stats()["disabled_tiers"] == []


def test_a_tier_named_beyond_ascii_is_switched_by_its_utf8_path(identity):
    port = free_port()
    tiers = [{"type": "memory", "name": "cach\u00e9"}]
    with TieringManager(
        config(2, secondary_tiers=tiers, metrics_port=port, metrics_admin=True), identity
    ) as m:
        status, body = call(port, "/admin/tiers/cach%C3%A9/disable", "POST")
        assert (status, body["tier"]) == (200, "cach\u00e9")
        assert m.tier_states() == ([], ["cach\u00e9"])
        assert call(port, "/admin/tiers/cach%E9/disable", "POST")[0] == 404, "not UTF-8"


def test_a_closed_manager_answers_503_and_switches_nothing(served):
    m, _ = served
    m.close()
    statuses = []
    environ = {
        "PATH_INFO": "/admin/tiers/fs/disable",
        "REQUEST_METHOD": "POST",
        "REMOTE_ADDR": "127.0.0.1",
    }
    admin_app(m)(environ, lambda status, headers: statuses.append(status))  # type: ignore[arg-type]
    assert statuses == ["503 Service Unavailable"] and m.tier_states() == (["fs"], [])


@pytest.mark.parametrize(
    "headers",
    [{"Origin": "http://evil.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"},
     {"Host": "evil.example:80"}, {"Host": "rebound.example"}],
)  # fmt: skip
def test_requests_a_browser_sends_for_a_web_page_are_refused(served, headers):
    """A page in a local browser reaches loopback too: a form POST (no preflight) or a
    DNS-rebound name must not switch a tier."""
    m, port = served
    status, body = call(port, "/admin/tiers/fs/disable", "POST", headers)
    assert status == 403 and "web pages" in body["error"]
    assert call(port, "/admin/tiers", headers=headers)[0] == 403
    assert m.stats()["disabled_tiers"] == []
    for host in (f"localhost:{port}", f"[::1]:{port}", f"127.0.0.1:{port}"):
        assert call(port, "/admin/tiers", headers={"Host": host})[0] == 200
