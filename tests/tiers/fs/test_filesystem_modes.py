"""The fs tier's cache is private unless configured otherwise (issue 30): chunks hold prompt
content, so what the tier creates is 0700 (directories) and 0600 (files), or ``dir_mode``'s bits;
an existing cache directory that is more open is warned about at start, never chmod-ed.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier import CacheIdentity
from kvtier.cli.main import main
from kvtier.config import FsTierConfig, TieringConfig
from kvtier.errors import ConfigError
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs.tier import FilesystemTier
from tests.conftest import collect, fill, make_keys

#: Every test runs with the compiled chunk-file I/O and with the os-module path.
pytestmark = pytest.mark.usefixtures("fs_io")


@pytest.fixture
def umask() -> Iterator[object]:
    """Sets the process umask for one test (``umask.set(0o022)``); restores it afterwards."""
    previous = os.umask(0o022)

    class Umask:
        @staticmethod
        def set(mask: int) -> None:
            os.umask(mask)

    yield Umask
    os.umask(previous)


def start(root: Path, identity: CacheIdentity, **options: object) -> FilesystemTier:
    config = FsTierConfig(root_dir=str(root), o_direct="off", **options)  # type: ignore[arg-type]
    return FilesystemTier(config, HostRegion(4, identity.layout.chunk_bytes), identity)


def store_two(tier: FilesystemTier, identity: CacheIdentity) -> None:
    keys = make_keys(identity, 2)
    region = tier._region
    for slot, key in enumerate(keys):
        fill(region, slot, key)
    tier.submit_store(TransferJob(1, tuple(keys), (0, 1)))
    assert collect(tier, [1])[1].ok


def modes(top: Path) -> tuple[set[int], set[int]]:
    """The modes of every directory (``top`` included) and of every file under ``top``."""
    entries = [top, *top.rglob("*")]
    dirs = {stat.S_IMODE(p.stat().st_mode) for p in entries if p.is_dir()}
    files = {stat.S_IMODE(p.stat().st_mode) for p in entries if p.is_file()}
    return dirs, files


@pytest.mark.parametrize(
    ("options", "dir_mode", "file_mode"),
    [({}, 0o700, 0o600), ({"dir_mode": "0750"}, 0o750, 0o640), ({"dir_mode": "770"}, 0o770, 0o660)],
)
def test_what_the_tier_creates_has_dir_mode_and_its_files_lose_x(
    umask, tmp_path, identity, options, dir_mode, file_mode
):
    """root_dir and its missing parents, the namespace and the chunk levels: ``dir_mode``;
    chunks and identity.json: ``dir_mode`` without x. The usual umask 022 takes nothing away
    from the default."""
    umask.set(0o002)
    top = tmp_path / "new"
    tier = start(top / "parent" / "cache", identity, **options)
    try:
        store_two(tier, identity)
    finally:
        tier.close()
    dirs, files = modes(top)
    assert dirs == {dir_mode} and files == {file_mode}
    assert len(list(top.rglob("identity.json"))) == 1 and len(list(top.rglob("*/??/??/*"))) == 2


def test_the_umask_narrows_dir_mode_and_never_widens_it(umask, tmp_path, identity):
    umask.set(0o027)
    tier = start(tmp_path / "cache", identity, dir_mode="0777")
    try:
        store_two(tier, identity)
    finally:
        tier.close()
    assert modes(tmp_path / "cache") == ({0o750}, {0o640})


def test_an_open_cache_directory_is_warned_about_at_start_and_left_alone(
    umask, tmp_path, identity, caplog
):
    root = tmp_path / "cache"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="kvtier.tiers.fs.tier"):
        start(root, identity).close()
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"fs tier: {root}: mode 0755 lets its group and other users in")
    assert "chunks hold prompt content" in warning
    assert stat.S_IMODE(root.stat().st_mode) == 0o755


def test_a_private_or_group_cache_directory_is_not_warned_about(umask, tmp_path, identity, caplog):
    private, shared = tmp_path / "private", tmp_path / "shared"
    private.mkdir(mode=0o700)
    shared.mkdir()
    shared.chmod(0o750)
    with caplog.at_level(logging.WARNING, logger="kvtier.tiers.fs.tier"):
        start(private, identity).close()
        start(shared, identity, dir_mode="0750").close()
    assert caplog.records == []


@pytest.mark.parametrize("value", ["0600", "0o1700", "abc", "", "7777", 448, "0800"])
def test_dir_mode_must_be_an_octal_string_that_leaves_the_owner_rwx(tmp_path, value):
    entry = {"type": "fs", "root_dir": str(tmp_path), "dir_mode": value}
    with pytest.raises(ConfigError, match=r"secondary_tiers\[0\]\.dir_mode: expected"):
        TieringConfig.from_dict({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [entry]})


def test_config_check_warns_about_an_open_root_dir(tmp_path, capsys):
    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(0o755)
    config = tmp_path / "kv.json"
    config.write_text(
        f'{{"cpu_bytes_to_use": 1073741824, "secondary_tiers": '
        f'[{{"type": "fs", "root_dir": "{root}"}}]}}'
    )
    assert main(["config", "check", str(config)]) == 0
    captured = capsys.readouterr()
    assert "dir_mode=0700" in captured.out
    assert (
        f"kvtier: warning: fs root_dir {root}: mode 0755 lets its group and other" in captured.err
    )


@pytest.mark.parametrize("kind", ["file", "dangling link"])
def test_config_check_says_a_root_dir_that_is_no_directory_cannot_serve(tmp_path, capsys, kind):
    """Not a mode warning about a file: the tier cannot start on it at all."""
    root = tmp_path / "cache"
    if kind == "file":
        root.write_text("not a directory")
        root.chmod(0o644)
    else:
        root.symlink_to(tmp_path / "gone")
    config = tmp_path / "kv.json"
    config.write_text(
        f'{{"cpu_bytes_to_use": 1073741824, "secondary_tiers": '
        f'[{{"type": "fs", "root_dir": "{root}"}}]}}'
    )
    assert main(["config", "check", str(config)]) == 0
    err = capsys.readouterr().err
    assert f"fs root_dir {root}: not a directory; the fs tier cannot start" in err
    assert "lets its group" not in err
