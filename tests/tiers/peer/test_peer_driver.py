"""The peer server's driver: a request is never left waiting for a wake-up that was lost."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from kvtier import CacheIdentity
from kvtier.config import ServeConfig
from kvtier.region import HostRegion
from kvtier.tiers.peer.server import PeerServer
from tests.conftest import free_port


class SetAsItTimesOut(threading.Event):
    """A request is submitted just after the driver's wait timed out, before it went on."""

    def wait(self, timeout: float | None = None) -> bool:
        if super().wait(0):
            return True
        self.set()
        return False


@pytest.fixture
def server(identity: CacheIdentity) -> Iterator[PeerServer]:
    region = HostRegion(4, identity.layout.chunk_bytes, pin=False)
    peer_server = PeerServer(ServeConfig(port=free_port()), region, identity)
    yield peer_server
    peer_server.close()


def test_a_wake_up_as_the_wait_times_out_is_not_lost(server: PeerServer) -> None:
    """Before: the timed-out wait cleared the event the request had just set, and the driver,
    seeing neither a wake-up nor tier jobs, never stepped for that request (the client timed
    out unless another request came)."""
    server._work_ready = SetAsItTimesOut()
    assert not server.wait_for_work(0.01)
    assert server.wait_for_work(0.01), "the request's wake-up was lost"
