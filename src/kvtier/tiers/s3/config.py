"""The object tier's configuration (``type: "obj"``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar

from kvtier.config.addresses import HttpUrl
from kvtier.config.checks import (
    Age,
    Count,
    FilePath,
    PositiveBytes,
    Seconds,
    Text,
    Threads,
    TierName,
    Timeout,
    check_fields,
)
from kvtier.errors import ConfigError


@dataclass(frozen=True)
class ObjTierConfig:
    """``type: "obj"``: objects in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW).

    ``max_bytes`` bounds the objects this tier indexes under its namespace (at least one object:
    the tier checks that at start, when the chunk size is known); ``max_age_s`` deletes objects
    unused for longer (``kvtier.tiers.s3.bound``). ``integrity_key_file`` seals every chunk
    with a keyed tag, ``encrypt`` also encrypts it (``kvtier.tiers.shared.sealing``); ``None``
    takes the configuration's top-level key.
    """

    type_name: ClassVar[str] = "obj"
    bucket: str
    endpoint_override: Annotated[str, HttpUrl()] | None = None
    prefix: Annotated[str, Text(empty=True)] = "kvtier"  # "": the bucket's root
    region: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    io_threads: Threads = 16
    timeout_s: Timeout = 5.0
    negative_ttl_s: Seconds = 1.0
    circuit_failures: Count = 3
    reconnect_min_s: Timeout = 0.5
    reconnect_max_s: Timeout = 30.0
    max_bytes: PositiveBytes | None = None
    max_age_s: Age | None = None
    integrity_key_file: FilePath | None = None
    encrypt: bool = False
    name: TierName | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        _check_prefix(self.prefix)
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ConfigError(
                f"reconnect_max_s: expected at least reconnect_min_s ({self.reconnect_min_s}), "
                f"got {self.reconnect_max_s}"
            )


def _check_prefix(prefix: str) -> None:
    """Object names are ``<prefix>/...``: the client refuses empty, ``.`` and ``..`` segments
    and control characters in every request, which would look like an endpoint that is down."""
    segments = prefix.strip("/").split("/") if prefix.strip("/") else []
    bad = [s for s in segments if s in ("", ".", "..")]
    if bad or any(ord(c) < 0x20 or ord(c) == 0x7F for c in prefix):
        raise ConfigError(
            f"prefix: expected names separated by single '/', without '.' or '..' segments "
            f"or control characters, got {prefix!r}"
        )
