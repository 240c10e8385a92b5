"""``root_dir: "~/kv"`` is the cache under the home directory, as a shell would read it; it
used to make a directory literally named ``~`` in the working directory (issue 25, finding 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier import TieringConfig
from kvtier.region import HostRegion
from kvtier.tiers.base import TransferJob
from kvtier.tiers.fs.tier import FilesystemTier
from tests.conftest import collect, fill, make_keys


def test_a_root_dir_under_tilde_is_made_in_the_home_directory(
    tmp_path: Path, identity, monkeypatch
):
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    config = TieringConfig.from_dict(
        {"cpu_bytes_to_use": 1 << 30, "secondary_tiers": [{"type": "fs", "root_dir": "~/kv"}]}
    )
    region = HostRegion(2, identity.layout.chunk_bytes)
    tier = FilesystemTier(config.secondary_tiers[0], region, identity)
    try:
        keys = make_keys(identity, 2)
        for slot, key in enumerate(keys):
            fill(region, slot, key)
        tier.submit_store(TransferJob(1, tuple(keys), (0, 1)))
        assert collect(tier, [1])[1].ok
    finally:
        tier.close()
    assert Path(tier.namespace).parent == home / "kv"
    assert len(list((home / "kv").rglob("*.json"))) == 1  # identity.json of the namespace
    assert list(work.iterdir()) == []  # no directory named "~" here
    with pytest.raises(FileNotFoundError):
        (work / "~").stat()
