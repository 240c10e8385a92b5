"""The fs tier's configuration (``type: "fs"``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from kvtier.config.checks import (
    Bytes,
    DirMode,
    FilePath,
    PositiveBytes,
    Seconds,
    Threads,
    TierName,
    check_fields,
)


@dataclass(frozen=True)
class FsTierConfig:
    """``type: "fs"``: content-addressed files under ``root_dir`` (local disk or shared mount).

    ``dir_mode`` is the mode of the directories the tier creates (``root_dir`` and its parents
    too, where missing); its files get the same bits without execute (``kvtier.config.file_modes``).
    ``integrity_key_file`` seals every chunk with a keyed tag, ``encrypt`` also encrypts it
    (``kvtier.tiers.shared.sealing``); ``None`` takes the configuration's top-level key.

    ``max_bytes`` bounds what this instance keeps of its own identity's folder;
    ``root_dir_max_bytes`` bounds everything under ``root_dir``, every identity and every
    instance that sets it (``kvtier.tiers.fs.shared_bound``). Each is at least 1 here (0 holds
    no chunk file); the tier refuses at start one that cannot hold a chunk file.

    ``probe``: where a lookup of an unknown key runs its ``stat`` (``kvtier.tiers.fs.probes``).
    """

    type_name: ClassVar[str] = "fs"
    root_dir: FilePath
    n_read_threads: Threads = 16
    n_write_threads: Threads = 16
    max_bytes: PositiveBytes | None = None
    root_dir_max_bytes: PositiveBytes | None = None
    min_free_bytes: Bytes = 256 << 20
    o_direct: Literal["auto", "on", "off"] = "auto"
    fsync: bool = False
    negative_ttl_s: Seconds = 1.0
    probe: Literal["auto", "inline", "background"] = "auto"
    dir_mode: DirMode = "0700"
    integrity_key_file: FilePath | None = None
    encrypt: bool = False
    name: TierName | None = None

    def __post_init__(self) -> None:
        check_fields(self)
