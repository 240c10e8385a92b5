"""``kvtier cache`` on real fs tier directories: ls, du, verify, gc, and hostile entries.

Caches are laid out as the fs tier lays them out (``cache_tree``); use times are set with
``utime`` (the tier refreshes a chunk's mtime when it reads it). Commands run through
``kvtier.cli.main.main`` as the operator runs them.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from kvtier.cache.fs_store import FsStore
from kvtier.cache.progress import Progress
from kvtier.cache.records import Problems
from kvtier.cache.verify import Verifier
from kvtier.cli.main import main
from kvtier.tiers.shared import codec
from kvtier.tiers.shared.sealing import make_sealer
from tests.cache.cache_tree import PAYLOAD, FsCache, chain, make_identity
from tests.tiers.sealing_keys import KEY_A, key_file

CHUNK = codec.HEADER_BYTES + PAYLOAD
NOW = time.time()


@pytest.fixture
def cache(tmp_path: Path) -> FsCache:
    return FsCache(tmp_path / "kv")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["cache", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def plant_foreign(root: Path, ns: Path) -> list[Path]:
    """Files beside the cache that are not kvtier's (and one named like a level)."""
    paths = [root / "notes.txt", ns / "README", ns / "ab" / "zz-not-a-chunk", ns / "ab" / "cd.bak"]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine")
    return paths


def test_ls_one_line_per_identity_with_model_layout_and_use(cache, capsys):
    a, b = make_identity("org/a"), make_identity("org/b", block_size=32)
    cache.write_chain(a, chain(a, 3), mtime=NOW - 100)
    cache.write_chain(b, chain(b, 2), mtime=NOW - 10)
    code, out, _ = run(capsys, "ls", str(cache.root), "--json")
    assert code == 0
    doc = {i["model"]: i for i in json.loads(out)["identities"]}
    assert doc["org/a"]["chunks"] == 3 and doc["org/a"]["bytes"] == 3 * CHUNK
    assert doc["org/a"]["tokens_per_chunk"] == 16 * 16 and doc["org/b"]["tokens_per_chunk"] == 512
    assert doc["org/a"]["dtype"] == "float16" and doc["org/a"]["digest"] == a.hexdigest
    assert doc["org/a"]["oldest_use"] == pytest.approx(NOW - 102)
    assert doc["org/a"]["newest_use"] == pytest.approx(NOW - 100)
    code, out, _ = run(capsys, "ls", str(cache.root))
    lines = out.splitlines()
    assert lines[0].startswith("DIGEST") and len(lines) == 3
    assert any(line.startswith(a.hexdigest[:12]) and "org/a" in line for line in lines)


def test_du_counts_disk_bytes_and_unreachable_chunks(cache, capsys):
    a, b = make_identity("org/a"), make_identity("org/b")
    cache.write_chain(a, chain(a, 4))
    keys = chain(b, 4)
    cache.write_chain(b, keys)
    cache.files[keys[1]].unlink()  # chunks 2 and 3 can no longer be reached
    code, out, _ = run(capsys, "du", str(cache.root), "--json")
    assert code == 0
    doc = json.loads(out)
    by_model = {i["model"]: i for i in doc["identities"]}
    assert by_model["org/a"]["unreachable"] == 0 and by_model["org/b"]["unreachable"] == 2
    assert doc["total"]["chunks"] == 7 and doc["total"]["unreachable"] == 2
    assert doc["total"]["disk_bytes"] >= 7 * CHUNK - 7 * 4096  # allocated blocks
    code, out, _ = run(capsys, "du", str(cache.root))
    assert out.splitlines()[-1].startswith("total") and out.splitlines()[-1].endswith("2")


def test_verify_passes_a_good_cache_and_fails_a_truncated_chunk(cache, capsys):
    a = make_identity("org/a")
    keys = chain(a, 4)
    cache.write_chain(a, keys)
    ns = cache.namespace(a)
    foreign = plant_foreign(cache.root, ns)
    code, out, _ = run(capsys, "verify", str(cache.root), "--progress", "none")
    assert code == 0 and "4 good, 0 bad" in out
    bad = cache.files[keys[2]]
    bad.write_bytes(bad.read_bytes()[:5000])
    code, out, err = run(capsys, "verify", str(cache.root), "--progress", "lines", "--jobs", "2")
    assert code == 1 and "3 good, 1 bad (length=1)" in out and bad.name in err
    assert bad.exists()  # without --repair nothing is removed
    code, out, err = run(capsys, "verify", str(cache.root), "--repair", "--progress", "none")
    assert code == 1 and "1 removed" in out and not bad.exists()
    assert all(p.exists() for p in foreign) and "foreign" in err
    assert all(cache.files[k].exists() for k in keys if k != keys[2])
    code, out, _ = run(capsys, "verify", str(cache.root), "--progress", "none")
    assert code == 0


@pytest.mark.parametrize("damage", ["checksum", "key", "identity", "magic", "short"])
def test_verify_names_each_kind_of_damage(cache, capsys, damage):
    a, other = make_identity("org/a"), make_identity("org/other")
    keys = chain(a, 2)
    cache.write_chain(a, keys)
    path, body = cache.files[keys[1]], bytearray(cache.files[keys[1]].read_bytes())
    if damage == "checksum":
        body[-1] ^= 1
    elif damage == "key":  # the bytes of another chunk under this name
        body[:] = FsCache(cache.root).write_chain(a, [keys[0]])[0].read_bytes()
    elif damage == "identity":
        body[:4096] = codec.encode_header(other.digest, keys[1], bytes(body[4096:]))
    elif damage == "magic":
        body[:8] = b"NOTKVTIE"
    else:
        del body[100:]
    path.write_bytes(bytes(body))
    code, out, _ = run(capsys, "verify", str(cache.root), "--progress", "none")
    assert code == 1 and f"({damage}=1)" in out


def test_sealed_chunks_are_unverifiable_without_the_key_and_good_with_it(cache, capsys, tmp_path):
    a = make_identity("org/a")
    keys = chain(a, 2)
    cache.write_chain(a, keys)
    sealer = make_sealer(key_file(tmp_path / "key", KEY_A))
    payload = bytes(PAYLOAD)
    header = sealer.seal(a.digest, keys[1], payload)
    cache.files[keys[1]].write_bytes(header + payload)
    code, out, _ = run(capsys, "verify", str(cache.root), "--progress", "none")
    assert code == 0 and "1 good, 0 bad" in out and "1 sealed, not verifiable" in out
    key = str(tmp_path / "key")
    code, out, _ = run(capsys, "verify", str(cache.root), "--integrity-key-file", key)
    assert code == 0 and "2 good, 0 bad" in out


def test_bad_identity_json_fifo_and_links_are_lines_and_counters(cache, capsys, tmp_path):
    a, b = make_identity("org/a"), make_identity("org/b")
    keys = chain(a, 3)
    cache.write_chain(a, keys)
    cache.write_chain(b, chain(b, 1))
    (cache.root / b.hexdigest / "identity.json").write_text("{not json")
    fifo = cache.path(a, chain(a, 5, seed=1)[0])
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    outside = tmp_path / "outside"
    outside.write_bytes(cache.files[keys[0]].read_bytes())
    link = cache.path(a, chain(a, 5, seed=2)[0])
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    (cache.root / a.hexdigest / "ee").symlink_to(tmp_path)  # a level that is a link
    (cache.root / ("f" * 64)).symlink_to(cache.root / a.hexdigest)  # a namespace that is one
    for argv in (["ls"], ["du"], ["verify", "--progress", "none"]):
        code, _, err = run(capsys, argv[0], str(cache.root), *argv[1:])
        assert "Traceback" not in err
        assert "bad_identity" in err and "not JSON" in err and "not_regular=4" in err
    assert code == 1  # verify: a bad identity.json is something bad
    code, _out, err = run(capsys, "gc", str(cache.root), "--max-bytes", "0")
    assert fifo.exists() and link.is_symlink() and outside.exists()
    assert not any(cache.files[k].exists() for k in keys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_an_unreadable_directory_is_counted_and_the_rest_listed(cache, capsys):
    a, b = make_identity("org/a"), make_identity("org/b")
    cache.write_chain(a, chain(a, 2))
    keys = chain(b, 2)
    cache.write_chain(b, keys)
    locked = cache.files[keys[0]].parent
    locked.chmod(0)
    try:
        code, out, err = run(capsys, "ls", str(cache.root), "--json")
    finally:
        locked.chmod(0o700)
    assert code == 0 and "EACCES" in err and "cannot" in err
    assert sum(i["chunks"] for i in json.loads(out)["identities"]) >= 2


def test_a_chunk_deleted_while_verify_reads_is_not_a_fault(cache):
    a = make_identity("org/a")
    keys = chain(a, 4)
    cache.write_chain(a, keys)

    class Evicting(FsStore):
        def read(self, ns, name, size, scratch):  # type: ignore[no-untyped-def]
            if name == keys[2].hex():
                cache.files[keys[2]].unlink()  # a server evicts it just before the read
            return super().read(ns, name, size, scratch)

    store, problems = Evicting(str(cache.root)), Problems()
    try:
        report = Verifier(store, problems, Progress("none"), jobs=2).run()
    finally:
        store.close()
    assert report.good == 3 and not report.bad
    assert problems.counts["vanished"] == 1 and problems.serious() == 0
