"""The peer tier's configuration (``type: "p2p"``) and the peer server's (``serve``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from kvtier.config.addresses import BindHost, HostName, is_loopback
from kvtier.config.checks import FilePath, Port, Seconds, TierName, Timeout, check_fields
from kvtier.errors import ConfigError

#: How peers connect: ZeroMQ (CURVE possible) or plain TCP (one copy fewer, never encrypted).
Transport = Literal["zmq", "tcp"]


@dataclass(frozen=True)
class PeerAddress:
    host: HostName
    port: Port

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class P2PTierConfig:
    """``type: "p2p"``: fetch chunks from the host memory of peer instances.

    Peers are ``host`` + ``port`` and/or ``peers``. With CURVE, give both this client's secret
    key file and the server's public key file (as written by ``kvtier peer keygen``).
    ``transport``: ``"zmq"`` (ZeroMQ, with CURVE if configured) or ``"tcp"`` (plain TCP,
    faster, never encrypted: ``tcp_transport``); it must be the peers' ``serve.transport``. With
    ``integrity_key_file`` (``None``: the configuration's top-level key), fetched chunks must
    carry a tag made with it, and stored ones are sealed with it
    (``kvtier.tiers.shared.sealing``).
    """

    type_name: ClassVar[str] = "p2p"
    host: HostName | None = None
    port: Port | None = None
    peers: tuple[PeerAddress, ...] = ()
    timeout_s: Timeout = 1.0
    hit_ttl_s: Seconds = 2.0
    curve_secret_key_file: FilePath | None = None
    curve_server_key_file: FilePath | None = None
    integrity_key_file: FilePath | None = None
    name: TierName | None = None
    transport: Transport = "zmq"

    def __post_init__(self) -> None:
        check_fields(self)
        _check_transport(self.transport, self.curve_secret_key_file)
        if (self.host is None) != (self.port is None):
            raise ConfigError("host, port: give both (or list the peers under peers)")
        if self.host is None and not self.peers:
            raise ConfigError("peers: name at least one peer (host + port, or peers)")
        _check_pair("curve_secret_key_file", "curve_server_key_file", self)

    @property
    def addresses(self) -> tuple[PeerAddress, ...]:
        if self.host is None or self.port is None:
            return self.peers
        first = PeerAddress(self.host, self.port)
        return (first, *(p for p in self.peers if p != first))


@dataclass(frozen=True)
class ServeConfig:
    """``serve``: answer lookups and fetches of peer instances out of this instance's host tier.

    Binds ``host`` (loopback unless told otherwise). With ``curve_secret_key_file`` and
    ``curve_client_keys_dir`` (every ``*.public`` file in it is an allowed client), connections
    are encrypted and clients outside the allow-list are refused. ``accept_stores`` lets peers
    write chunks into this host tier; it is refused beyond loopback without CURVE (any host that
    reaches the port could write the cache) unless ``allow_insecure_stores`` forces it.
    ``hold_timeout_s`` bounds how long a slow client pins a slot. With ``integrity_key_file``
    (``None``: the configuration's top-level key) a stored chunk is taken only with a tag made
    with that key, and fetched chunks carry one. ``transport`` as ``P2PTierConfig``'s.
    """

    port: Port
    host: BindHost = "127.0.0.1"
    curve_secret_key_file: FilePath | None = None
    curve_client_keys_dir: FilePath | None = None
    accept_stores: bool = False
    hold_timeout_s: Timeout = 5.0
    allow_insecure_stores: bool = False
    integrity_key_file: FilePath | None = None
    transport: Transport = "zmq"

    def __post_init__(self) -> None:
        check_fields(self)
        _check_pair("curve_secret_key_file", "curve_client_keys_dir", self)
        _check_transport(self.transport, self.curve_secret_key_file)
        insecure = self.curve_secret_key_file is None and not self.loopback
        if self.accept_stores and insecure and not self.allow_insecure_stores:
            raise ConfigError(
                f"accept_stores: refused on {self.host} without CURVE (any host that reaches the "
                "port could write this cache); configure CURVE, bind loopback, or set "
                "allow_insecure_stores"
            )

    def check_stores_authenticated(self) -> None:
        """With integrity keys on (some tier seals its chunks), a chunk a peer stores here is
        written through to those tiers, sealed: refuse ``accept_stores`` unless CURVE admits
        only listed clients or this server checks each stored chunk's tag (its own key)."""
        trusted = self.curve_secret_key_file is not None or self.integrity_key_file is not None
        if self.accept_stores and not trusted:
            raise ConfigError(
                "accept_stores: refused without CURVE or integrity_key_file while tiers seal "
                "chunks with an integrity key: any client could store chunks that would be "
                "written through sealed; configure CURVE, or the key here too"
            )

    @property
    def loopback(self) -> bool:
        """Whether ``host`` is a loopback address (only this machine can connect)."""
        return is_loopback(self.host)


def _check_pair(first: str, second: str, config: object) -> None:
    if (getattr(config, first) is None) != (getattr(config, second) is None):
        raise ConfigError(f"{first}, {second}: CURVE needs both (or neither)")


def _check_transport(transport: str, curve_secret_key_file: str | None) -> None:
    if transport == "tcp" and curve_secret_key_file is not None:
        raise ConfigError(
            'transport: "tcp" encrypts nothing; CURVE keys need transport "zmq" (or drop the '
            "keys on a network only trusted hosts reach)"
        )
