"""``kvtier cache`` against what others (and attackers) write into a shared directory:
hostile ``identity.json`` files, chunk files far larger than their header says, and ``gc``
options at their edges. Every command must answer without a traceback, in bounded memory,
and delete nothing but the chunks it was asked to."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvtier.cache import fs_records
from kvtier.cache.fs_store import FsStore
from kvtier.cache.records import Problems
from kvtier.cache.store import Scratch
from kvtier.tiers.shared import codec
from tests.cache.cache_tree import PAYLOAD, FsCache, chain, make_identity
from tests.cache.test_fs_commands import run
from tests.cache.test_fs_gc import chunk_files

CHUNK = codec.HEADER_BYTES + PAYLOAD
NOW = time.time()
COMMANDS = (["ls"], ["ls", "--json"], ["du"], ["du", "--json"], ["verify", "--progress", "none"])


@pytest.fixture
def cache(tmp_path: Path) -> FsCache:
    return FsCache(tmp_path / "kv")


def two_models(cache: FsCache) -> tuple[Path, Path]:
    """Identities ``org/a`` and ``org/b`` with a chain each; their identity.json paths."""
    a, b = make_identity("org/a"), make_identity("org/b")
    cache.write_chain(a, chain(a, 3), mtime=NOW - 100)
    cache.write_chain(b, chain(b, 2), mtime=NOW - 100)
    return (cache.root / a.hexdigest / "identity.json", cache.root / b.hexdigest / "identity.json")


def rewrite_identity(path: Path, **fields: object) -> None:
    doc = json.loads(path.read_text())
    doc["identity"].update(fields.pop("top", {}))
    doc["identity"]["layout"].update(fields)
    path.write_text(json.dumps(doc))


def test_a_deeply_nested_identity_json_is_a_bad_identity_not_a_crash(cache, capsys):
    _, b = two_models(cache)
    b.write_text("[" * 200_000)
    for argv in [*COMMANDS, ["gc", "--max-bytes", "1T"]]:
        code, out, err = run(capsys, argv[0], str(cache.root), *argv[1:])
        assert "Traceback" not in err and "bad_identity" in err, argv
    code, out, _ = run(capsys, "ls", str(cache.root), "--json")
    assert code == 0 and len(json.loads(out)["identities"]) == 2


def test_an_identity_json_with_huge_numbers_prints_without_a_crash(cache, capsys):
    _, b = two_models(cache)
    rewrite_identity(b, block_size=int("9" * 4000), blocks_per_chunk=int("9" * 4000))
    for argv in COMMANDS:
        code, out, err = run(capsys, argv[0], str(cache.root), *argv[1:])
        assert code == 0 and "Traceback" not in err, argv
    code, out, _ = run(capsys, "ls", str(cache.root), "--json")
    tokens = {i["model"]: i["tokens_per_chunk"] for i in json.loads(out)["identities"]}
    assert tokens == {"org/a": 256, "org/b": None}


@pytest.mark.parametrize("command", ["ls", "du"])
def test_control_characters_from_identity_json_never_reach_the_terminal(cache, capsys, command):
    _, b = two_models(cache)
    rewrite_identity(b, dtype="f\x1b]0;owned\x07", top={"model": "evil\x1b[31m\nfake line"})
    code, out, _ = run(capsys, command, str(cache.root))
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert len(out.splitlines()) == (3 if command == "ls" else 4)  # header, 2 identities, total
    assert "evil\\x1b[31m\\nfake line" in out
    code, out, _ = run(capsys, command, str(cache.root), "--json")
    assert "evil\x1b[31m\nfake line" in {i["model"] for i in json.loads(out)["identities"]}


def test_verify_reads_no_more_of_a_chunk_than_its_header_claims(cache):
    a = make_identity("org/a")
    keys = chain(a, 2)
    path = cache.write_chain(a, keys)[1]
    os.truncate(path, 256 << 20)  # a sparse tail: 256 MiB on the listing, nothing on disk
    store, scratch = FsStore(str(cache.root)), Scratch()
    try:
        (ns,) = store.namespaces(Problems())
        got = store.read(ns, keys[1].hex(), 0, scratch)
    finally:
        store.close()
    assert got is not None and len(got.header) == codec.HEADER_BYTES
    assert len(got.payload) == PAYLOAD + 1  # one byte past the claim: enough to say "length"
    assert len(scratch.view(0).obj) <= CHUNK + 1  # type: ignore[arg-type]


def test_a_huge_sparse_file_named_like_a_chunk_is_bad_and_repaired_not_an_error(cache, capsys):
    a = make_identity("org/a")
    keys = chain(a, 3)
    paths = cache.write_chain(a, keys)
    hostile = cache.path(a, chain(a, 1, seed=7)[0])
    hostile.parent.mkdir(parents=True, exist_ok=True)
    with open(hostile, "wb") as file:
        file.truncate(1 << 40)  # 1 TiB of nothing: neither read nor held in memory
    code, out, err = run(capsys, "verify", str(cache.root), "--repair", "--progress", "none")
    assert code == 1 and "3 good, 1 bad (magic=1)" in out and "1 removed" in out
    assert "error" not in err and not hostile.exists() and all(p.exists() for p in paths)


def test_an_empty_identity_prefix_purges_nothing(cache, capsys):
    two_models(cache)
    before = chunk_files(cache.root)
    with pytest.raises(SystemExit) as stopped:
        run(capsys, "gc", str(cache.root), "--max-bytes", "1T", "--identity", "")
    assert stopped.value.code == 2 and "--identity" in capsys.readouterr().err
    for bad in ("xyz", "a" * 65, " "):
        with pytest.raises(SystemExit):
            run(capsys, "gc", str(cache.root), "--identity", bad)
    assert chunk_files(cache.root) == before


def test_the_unknown_model_placeholder_matches_no_namespace(cache, capsys):
    a, b = two_models(cache)
    b.unlink()  # no identity.json: its model shows as "?"
    a.write_text(json.dumps({"identity": {"model": ""}}))  # an empty model shows as "-"
    before = chunk_files(cache.root)
    for placeholder in ("?", "-"):
        code, out, _ = run(capsys, "gc", str(cache.root), "--model", placeholder)
        assert code == 0 and "deleted 0" in out, placeholder
    assert chunk_files(cache.root) == before


def test_older_than_zero_is_a_bound_not_a_missing_option(cache, capsys):
    two_models(cache)
    code, out, _ = run(capsys, "gc", str(cache.root), "--older-than", "0s")
    assert code == 0 and "deleted 5 (age=5)" in out and not chunk_files(cache.root)


def test_a_level_that_cannot_be_listed_makes_no_chunk_unreachable(cache, capsys, monkeypatch):
    hot, cold = make_identity("org/hot"), make_identity("org/cold")
    seed = next(s for s in range(100) if len({k[0] for k in chain(hot, 3, seed=s)}) == 3)
    hot_keys = chain(hot, 3, seed=seed)
    hidden = f"{hot_keys[0][0]:02x}"  # the hot chain's head sits in a level that fails
    seed = next(s for s in range(100) if all(f"{k[0]:02x}" != hidden for k in chain(cold, 3, s)))
    cold_keys = chain(cold, 3, seed=seed)
    cache.write_chain(hot, hot_keys, mtime=NOW)
    cache.write_chain(cold, cold_keys, mtime=NOW - 1000)
    real = fs_records.open_level_dir

    def failing(name: str, dir_fd: int) -> int:
        if name == hidden:
            raise PermissionError(errno.EACCES, "Permission denied", name)
        return real(name, dir_fd)

    monkeypatch.setattr(fs_records, "open_level_dir", failing)
    code, out, err = run(capsys, "gc", str(cache.root), "--max-bytes", str(4 * CHUNK))
    assert code == 0 and "EACCES" in err and "deleted 1 (bound=1)" in out
    assert "unreachable" not in out  # the hot chain's tail is reachable: its head is there
    assert all(cache.files[k].exists() for k in hot_keys)
    assert not cache.files[cold_keys[2]].exists()  # the least recently used, from its tail


def test_many_namespaces_do_not_exhaust_open_files(cache):
    a = make_identity("org/a")
    cache.write_chain(a, chain(a, 3))
    for i in range(300):  # empty directories named like namespaces: anyone may make them
        (cache.root / f"{i:064x}").mkdir()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the hard limit on open files is {hard}")

    def few_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))

    argv = [sys.executable, "-m", "kvtier.cli.main", "cache", "ls", str(cache.root), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, preexec_fn=few_files)
    assert done.returncode == 0 and "EMFILE" not in done.stderr
    assert json.loads(done.stdout)["total"]["chunks"] == 3


@pytest.mark.parametrize("repair", [False, True])
def test_a_chunk_over_the_read_bound_is_too_large_not_read_nor_removed(cache, capsys, repair):
    """``--max-chunk-bytes`` bounds each reader's buffer (a header may claim any length):
    a chunk of exactly the bound is read and judged, one byte more is counted ``too_large``,
    fails the status, and stays, even with ``--repair`` (it may be a real, huge chunk)."""
    a = make_identity("org/a")
    big = 64 << 10
    paths = cache.write_chain(a, chain(a, 2), size=big)
    size = codec.HEADER_BYTES + big
    flags = ["--progress", "none", *(["--repair"] if repair else [])]
    code, out, err = run(capsys, "verify", str(cache.root), "--max-chunk-bytes", str(size), *flags)
    assert code == 0 and "2 good" in out and "too_large" not in err
    code, out, err = run(
        capsys, "verify", str(cache.root), "--max-chunk-bytes", str(size - 1), *flags
    )
    assert code == 1 and "verified 0 chunks" in out and "too_large=2" in err
    assert all(p.exists() for p in paths)


@pytest.mark.parametrize("bound", ["4095", "0", "-1", "nan", "1e400"])
def test_a_read_bound_below_a_header_or_not_a_size_is_refused(cache, capsys, bound):
    cache.write_chain(make_identity("org/a"), chain(make_identity("org/a"), 1))
    with pytest.raises(SystemExit) as stopped:
        run(capsys, "verify", str(cache.root), "--max-chunk-bytes", bound)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "kvtier: error:" in err and "--max-chunk-bytes" in err
    code, _, _ = run(capsys, "verify", str(cache.root), "--max-chunk-bytes", "4096")
    assert code == 1, "a bound of one header block is accepted (the chunk is too large)"


def test_an_identity_prefix_that_starts_two_identities_deletes_nothing(cache, capsys):
    """Like a short commit id: a prefix must name one identity, or gc fails (exit 1) before
    it deletes anything; the digit that tells them apart is enough."""
    a = make_identity("org/a")
    b = next(  # another identity whose digest starts with the same digit
        i
        for i in (make_identity(f"org/b{n}") for n in range(256))
        if i.hexdigest[0] == a.hexdigest[0]
    )
    cache.write_chain(a, chain(a, 2), mtime=NOW - 100)
    cache.write_chain(b, chain(b, 3), mtime=NOW - 100)
    before = chunk_files(cache.root)
    shared = a.hexdigest[
        : next(i for i, (x, y) in enumerate(zip(a.hexdigest, b.hexdigest)) if x != y)
    ]
    for prefix in (shared[:1], shared, shared.upper()):
        code, _, err = run(capsys, "gc", str(cache.root), "--identity", prefix)
        assert code == 1 and "starts 2 identities" in err and "nothing deleted" in err
        assert chunk_files(cache.root) == before
    code, out, _ = run(capsys, "gc", str(cache.root), "--identity", a.hexdigest[: len(shared) + 1])
    assert code == 0 and "deleted 2 (purge=2)" in out
    assert len(chunk_files(cache.root)) == len(before) - 2


def test_du_says_unreachable_is_unknown_where_a_level_cannot_be_listed(cache, capsys, monkeypatch):
    """A chain whose head sits in a level that cannot be listed is not unreachable: du shows
    ``?`` for that identity and the total instead of a count that would be wrong."""
    a, b = make_identity("org/a"), make_identity("org/b")
    keys = chain(a, 3)
    cache.write_chain(a, keys)
    cache.write_chain(b, chain(b, 2))
    hidden = f"{keys[0][0]:02x}"
    real = fs_records.open_level_dir

    def failing(name: str, dir_fd: int) -> int:
        if name == hidden:
            raise PermissionError(errno.EACCES, "Permission denied", name)
        return real(name, dir_fd)

    _, out, _ = run(capsys, "du", str(cache.root), "--json")
    assert [e["unreachable"] for e in json.loads(out)["identities"]] == [0, 0]
    monkeypatch.setattr(fs_records, "open_level_dir", failing)
    _, out, err = run(capsys, "du", str(cache.root), "--json")
    doc = json.loads(out)
    unknown = {e["digest"][:12]: e["unreachable"] for e in doc["identities"]}
    assert "EACCES" in err and unknown[a.hexdigest[:12]] is None
    assert unknown[b.hexdigest[:12]] == 0 and doc["total"]["unreachable"] is None
