"""How a peer server listens: its transport (CURVE or not), the bounds on what a client may
send, and a loud warning when it is exposed beyond loopback without CURVE.

Runs once, on the thread that builds the ``PeerServer``.
"""

from __future__ import annotations

import logging

from kvtier.tiers.peer import protocol as proto
from kvtier.tiers.peer.config import ServeConfig
from kvtier.tiers.peer.curve_keys import server_keys
from kvtier.tiers.peer.transport import Listener, MessageLimits, Transport
from kvtier.tiers.peer.transports import transport_for
from kvtier.tiers.shared import codec

log = logging.getLogger("kvtier.tiers.peer.server")


def request_limits(accept_stores: bool, chunk_bytes: int) -> MessageLimits:
    """What a client's message may be: one frame, or a STORE where stores are accepted."""
    meta = proto.MAX_META_BYTES
    if not accept_stores:
        return MessageLimits(max_frame_bytes=meta, max_frames=1, max_message_bytes=meta)
    keys = proto.max_store_keys(chunk_bytes)
    chunk = codec.HEADER_BYTES + chunk_bytes
    frame = max(meta, codec.HEADER_BYTES, chunk_bytes)
    return MessageLimits(frame, 1 + 2 * keys, meta + keys * chunk)


def _server_transport(config: ServeConfig) -> Transport:
    curve = None
    if config.curve_secret_key_file and config.curve_client_keys_dir:
        curve = server_keys(config.curve_secret_key_file, config.curve_client_keys_dir)
    return transport_for(config.transport, server=curve)


def listen(
    config: ServeConfig, chunk_bytes: int, transport: Transport | None
) -> tuple[Transport, Listener]:
    """The transport (``config.transport``'s unless given) and its listener on ``config``'s port."""
    transport = transport or _server_transport(config)
    limits = request_limits(config.accept_stores, chunk_bytes)
    try:
        listener = transport.listen(config.host, config.port, limits)
    except BaseException:
        transport.close()
        raise
    log.info("peer server listening on %s:%d", config.host, config.port)
    if config.curve_secret_key_file is None and not config.loopback:
        log.warning(
            "peer server listens on %s:%d WITHOUT CURVE: every host that reaches it can read "
            "this instance's KV cache; configure serve.curve_secret_key_file and "
            "serve.curve_client_keys_dir",
            config.host,
            config.port,
        )
    return transport, listener
