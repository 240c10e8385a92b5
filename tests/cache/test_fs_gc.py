"""``kvtier cache gc`` on real fs tier directories: one bound across identities in the tiers'
eviction order, age, purges, dry runs, and the sidecar's clean exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvtier.cli.main import main
from kvtier.tiers.fs.scan import STALE_TMP_S
from kvtier.tiers.shared import codec
from tests.cache.cache_tree import PAYLOAD, FsCache, chain, make_identity
from tests.cache.test_fs_commands import plant_foreign, run
from tests.conftest import read_line

CHUNK = codec.HEADER_BYTES + PAYLOAD
NOW = time.time()


@pytest.fixture
def cache(tmp_path: Path) -> FsCache:
    return FsCache(tmp_path / "kv")


def chunk_files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() and len(p.name) == 64}


def test_max_bytes_bounds_every_identity_together_keeping_the_most_recently_used(cache, capsys):
    models = [make_identity(f"org/m{i}") for i in range(3)]
    chains = {m.model: chain(m, 4) for m in models}
    for age, m in zip((300, 200, 100), models, strict=True):  # m2 used most recently
        cache.write_chain(m, chains[m.model], mtime=NOW - age)
    foreign = plant_foreign(cache.root, cache.namespace(models[0]))
    code, out, _ = run(capsys, "gc", str(cache.root), "--max-bytes", str(6 * CHUNK))
    assert code == 0 and "deleted 6" in out
    left = chunk_files(cache.root)
    assert sum(p.stat().st_size for p in left) <= 6 * CHUNK
    assert {cache.files[k] for k in chains["org/m2"]} <= left  # the newest model whole
    assert {cache.files[k] for k in chains["org/m1"][:2]} <= left  # the next one's head
    assert not {cache.files[k] for k in chains["org/m0"]} & left
    assert all(p.exists() for p in foreign)


def test_a_prefix_goes_from_its_tail_never_its_head(cache, capsys):
    a = make_identity("org/a")
    keys = chain(a, 5)
    cache.write_chain(a, keys)
    for i, key in enumerate(keys):  # the tail looks used most recently: still the head stays
        os.utime(cache.files[key], (NOW - 100 + i, NOW - 100 + i))
    run(capsys, "gc", str(cache.root), "--max-bytes", str(2 * CHUNK))
    assert chunk_files(cache.root) == {cache.files[keys[0]], cache.files[keys[1]]}


def test_unreachable_chunks_go_before_anything_else(cache, capsys):
    a = make_identity("org/a")
    old, orphaned = chain(a, 3), chain(a, 3, seed=1)
    cache.write_chain(a, old, mtime=NOW - 1000)
    cache.write_chain(a, orphaned, mtime=NOW)
    cache.files[orphaned[0]].unlink()  # the newest chunks lost their head
    _code, out, _ = run(capsys, "gc", str(cache.root), "--max-bytes", str(3 * CHUNK))
    assert "2 unreachable" in out
    assert chunk_files(cache.root) == {cache.files[k] for k in old}


def test_dry_run_deletes_nothing(cache, capsys):
    a = make_identity("org/a")
    cache.write_chain(a, chain(a, 4))
    before = chunk_files(cache.root)
    code, out, _ = run(capsys, "gc", str(cache.root), "--max-bytes", "0", "--dry-run")
    assert code == 0 and "would delete 4" in out and "deleted nothing" in out
    assert chunk_files(cache.root) == before


def test_older_than_and_purges_by_identity_and_model(cache, capsys):
    a, b, c = (make_identity(f"org/{n}") for n in "abc")
    cache.write_chain(a, chain(a, 2), mtime=NOW - 8 * 86_400)
    cache.write_chain(a, chain(a, 2, seed=1), mtime=NOW - 3600)
    cache.write_chain(b, chain(b, 3), mtime=NOW)
    cache.write_chain(c, chain(c, 3), mtime=NOW)
    run(capsys, "gc", str(cache.root), "--older-than", "7d")
    assert len(chunk_files(cache.root / a.hexdigest)) == 2
    run(capsys, "gc", str(cache.root), "--identity", b.hexdigest[:10])
    assert not chunk_files(cache.root / b.hexdigest) and (cache.root / b.hexdigest).is_dir()
    code, out, _ = run(capsys, "gc", str(cache.root), "--model", "org/c")
    assert code == 0 and "purge=3" in out and not chunk_files(cache.root / c.hexdigest)
    assert len(chunk_files(cache.root)) == 2


def test_gc_needs_something_to_delete(cache, capsys):
    cache.namespace(make_identity("org/a"))
    with pytest.raises(SystemExit) as stopped:
        main(["cache", "gc", str(cache.root)])
    assert stopped.value.code == 2 and "--max-bytes" in capsys.readouterr().err


def test_a_missing_target_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["cache", "ls", str(tmp_path / "nothing")])
    assert stopped.value.code == 2 and "cannot open the cache directory" in capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_every_keeps_running_until_a_signal_and_exits_cleanly(cache, sig):
    a = make_identity("org/a")
    cache.write_chain(a, chain(a, 3))
    argv = ["-m", "kvtier.cli.main", "cache", "gc", str(cache.root), "--max-bytes", "0"]
    proc = subprocess.Popen(
        [sys.executable, *argv, "--every", "3600"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert b"deleted 3" in read_line(proc, 60, "the first round's summary")
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        err = proc.stderr.read() if proc.stderr else b""
        assert b"stopped" in err and b"Traceback" not in err
    finally:
        proc.kill()
        proc.wait()
    assert not chunk_files(cache.root)


def plant_temporary(cache: FsCache, key: bytes, age: float, body: bytes = b"half a chunk") -> Path:
    """A write's temporary file beside chunk ``key``'s place, last written ``age`` s ago.

    Ages count from now, not from the module's import: in a full run minutes pass between the
    two, and a temporary planted 30 s short of stale would already be stale."""
    path = cache.files[key].with_name(f"{key.hex()}.0a1b2c3d-4242-deadbeef-7.tmp")
    path.write_bytes(body)
    written = time.time() - age
    os.utime(path, (written, written))
    return path


def test_gc_removes_temporaries_of_writes_that_never_finished_once_stale(cache, capsys):
    """A writer that crashed leaves its temporary file; the tier's own start-up scan removes it,
    but only for its identity: one no server runs any more kept them for ever. Both sides of
    STALE_TMP_S (600 s); a dry run removes nothing; chunks and foreign files stay."""
    gone = make_identity("org/retired")
    keys = chain(gone, 3)
    cache.write_chain(gone, keys, mtime=NOW - 50)
    stale = plant_temporary(cache, keys[0], age=STALE_TMP_S + 30, body=b"x" * 1000)
    fresh = plant_temporary(cache, keys[1], age=STALE_TMP_S - 30)  # a writer may still be at it
    foreign = plant_foreign(cache.root, cache.namespace(gone))
    code, out, _ = run(capsys, "gc", str(cache.root), "--max-bytes", "1T", "--dry-run")
    assert code == 0 and "1 stale temporary files" in out and stale.exists()
    code, out, _ = run(capsys, "gc", str(cache.root), "--max-bytes", "1T")
    assert code == 0 and "1 stale temporary files, 1000 B" in out
    assert not stale.exists() and fresh.exists()
    assert chunk_files(cache.root) == {cache.files[k] for k in keys}
    assert all(p.exists() for p in foreign)


def test_gc_leaves_a_link_or_fifo_named_like_a_temporary_and_what_it_points_to(cache, capsys):
    gone = make_identity("org/retired")
    keys = chain(gone, 2)
    cache.write_chain(gone, keys, mtime=NOW - 50)
    target = cache.root.parent / "precious"
    target.write_text("not the cache's")
    link = cache.files[keys[0]].with_name(f"{keys[0].hex()}.0a1b-1-ff-0.tmp")
    link.symlink_to(target)
    fifo = cache.files[keys[1]].with_name(f"{keys[1].hex()}.0a1b-1-ff-0.tmp")
    os.mkfifo(fifo)
    old = NOW - STALE_TMP_S - 100
    os.utime(target, (old, old))  # followed, the link would look like a stale temporary
    os.utime(link, (old, old), follow_symlinks=False)
    os.utime(fifo, (old, old))
    code, out, _ = run(capsys, "gc", str(cache.root), "--older-than", "1d")
    assert code == 0 and "temporary" not in out
    assert link.is_symlink() and target.read_text() == "not the cache's" and fifo.exists()
