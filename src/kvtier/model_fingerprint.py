"""A content fingerprint of a local model, so the cache identity follows the weights, not a path.

``fingerprint_model(name)`` returns ``None`` when ``name`` is not a local path (a hub id such as
``org/model``: the identity keeps its name and revision), else a ``ModelFingerprint`` whose
``digest`` (``"sha256-<hex>"``) is the same for the same model wherever it lies, and different
when its config or weight files differ as described below. It is sha256 over:

* ``config.json``'s canonical JSON (sorted keys, no spaces), or a marker when there is none;
* for each weight file (``*.safetensors``, ``*.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``,
  ``*.gguf``), found under the directory down to ``MAX_DEPTH`` levels and sorted by relative
  path: that path, its size, for safetensors its JSON header (dtypes, shapes, offsets of every
  tensor), and ``SAMPLES`` windows of ``SAMPLE_BYTES`` spread evenly over the file (first and
  last included).

Cost: a directory listing, config.json, each safetensors header and at most
``SAMPLES * SAMPLE_BYTES`` (4 MiB) per weight file; whole files are never read. One INFO line
says what was read and how long it took. A change confined to bytes no window covers (a few
weights edited in place) is not seen: give such weights another ``revision``.

Hostile or broken inputs are a ``ConfigError`` naming the file, never a hang: a weight name that
is not a regular file (a FIFO, a device, a dangling link, a symlink loop), an unreadable file, a
safetensors header longer than ``MAX_HEADER_BYTES`` or than the file, invalid config.json, more
than ``MAX_FILES`` weight files, or a directory with neither a weight file nor config.json. A
directory with config.json alone (an engine that draws its weights from a fixed seed, like
vLLM's ``load_format=dummy``) is fingerprinted by its config, with a warning. Files are opened
non-blocking and checked to be regular before anything is read; directory symlinks are not
followed (file symlinks are, as in Hugging Face cache snapshots).

Thread safety: pure function of the files; any thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kvtier.errors import ConfigError

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")
#: A safetensors header longer than this is refused (real ones are well under 10 MB).
MAX_HEADER_BYTES = 100 * 2**20
SAMPLES = 16
SAMPLE_BYTES = 256 * 2**10
#: Directory levels searched for weight files (the model directory itself is level 0).
MAX_DEPTH = 2
MAX_FILES = 10_000
_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<rev>[0-9a-f]{40})$")


@dataclass(frozen=True)
class ModelFingerprint:
    """What ``fingerprint_model`` found: ``digest`` decides identity, the rest is for people.

    ``name`` is a display name (the directory's basename, or ``org/name`` for a Hugging Face
    cache snapshot, whose commit is ``hf_revision``); ``files`` weight files of ``total_bytes``
    in all, of which ``read_bytes`` were read, in ``seconds``.
    """

    digest: str
    name: str
    files: int
    total_bytes: int
    read_bytes: int
    seconds: float
    hf_revision: str = ""


def is_local(name: str) -> bool:
    """Whether ``name`` names something on this machine (else it is taken as a hub id)."""
    return bool(name) and os.path.lexists(name)


def fingerprint_model(name: str) -> ModelFingerprint | None:
    """The content fingerprint of the model at local path ``name``; ``None`` for a hub id.

    Raises ``ConfigError`` when the path exists but cannot be fingerprinted (module docstring).
    """
    if not is_local(name):
        return None
    start = time.perf_counter()
    try:
        root = Path(name).resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        raise ConfigError(f"model fingerprint: cannot resolve {name}: {exc}") from exc
    hasher = hashlib.sha256(b"kvtier-model-fingerprint-1\0")
    if root.is_dir():
        hasher.update(_config_text(root / "config.json"))
        weights = _weight_files(root)
    else:
        hasher.update(b"single-file\0")
        weights = [(root.name, root)]
    total = read = 0
    for relative, path in weights:
        size, done = _hash_weight_file(hasher, relative, path)
        total, read = total + size, read + done
    found = ModelFingerprint(
        digest="sha256-" + hasher.hexdigest(),
        name=display_name(root),
        files=len(weights),
        total_bytes=total,
        read_bytes=read,
        seconds=time.perf_counter() - start,
        hf_revision=_snapshot_revision(root),
    )
    log.info(
        "model fingerprint of %s: %d weight files (%.2f GiB), read %.1f MiB (config, headers, "
        "%d samples per file) in %.3f s: %s",
        root, found.files, total / 2**30, read / 2**20, SAMPLES, found.seconds, found.digest,
    )  # fmt: skip
    return found


def display_name(path: Path) -> str:
    """``org/name`` for a Hugging Face cache snapshot directory, else the path's basename."""
    match = _SNAPSHOT.search(str(path))
    return f"{match['org']}/{match['name']}" if match else path.name


def _snapshot_revision(path: Path) -> str:
    match = _SNAPSHOT.search(str(path))
    return match["rev"] if match else ""


def _config_text(path: Path) -> bytes:
    """config.json as canonical JSON bytes (a fixed marker when the file is absent)."""
    if not os.path.lexists(path):
        return b"no-config\0"
    with _open_regular(path) as file:
        raw = _read_bounded(file, path, MAX_HEADER_BYTES)
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"model fingerprint: {path} is not valid JSON: {exc}") from exc
    return json.dumps(parsed, sort_keys=True, separators=(",", ":")).encode() + b"\0"


def _weight_files(root: Path) -> list[tuple[str, Path]]:
    """Weight files under ``root`` (depth ``MAX_DEPTH``), as (relative path, path), sorted."""
    found: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(root, followlinks=False, onerror=_walk_error):
        depth = len(Path(folder).relative_to(root).parts)
        dirs[:] = [] if depth >= MAX_DEPTH else sorted(d for d in dirs if not d.startswith("."))
        for file in files:
            if file.endswith(WEIGHT_SUFFIXES):
                path = Path(folder) / file
                found.append((path.relative_to(root).as_posix(), path))
        if len(found) > MAX_FILES:
            raise ConfigError(f"model fingerprint: more than {MAX_FILES} weight files in {root}")
    if not found:
        if not (root / "config.json").is_file():
            names = ", ".join(WEIGHT_SUFFIXES)
            raise ConfigError(f"model fingerprint: no weight file ({names}) in {root}")
        log.warning(
            "model fingerprint: %s has a config.json and no weight file: its identity is its "
            "config alone (right for weights an engine draws from a fixed seed, e.g. vLLM's "
            "load_format=dummy; give real weights loaded from elsewhere a revision)",
            root,
        )
    return sorted(found)


def _walk_error(exc: OSError) -> None:
    raise ConfigError(f"model fingerprint: cannot list {exc.filename}: {exc.strerror}") from exc


def _hash_weight_file(hasher: hashlib._Hash, relative: str, path: Path) -> tuple[int, int]:
    """Hash one weight file's name, size, header and samples; returns (size, bytes read)."""
    try:
        return _hash_open_file(hasher, relative, path)
    except OSError as exc:
        raise ConfigError(f"model fingerprint: cannot read {path}: {exc.strerror}") from exc


def _hash_open_file(hasher: hashlib._Hash, relative: str, path: Path) -> tuple[int, int]:
    with _open_regular(path) as file:
        size = os.fstat(file.fileno()).st_size
        hasher.update(f"file\0{relative}\0{size}\0".encode())
        read = 0
        if relative.endswith(".safetensors"):
            header = _safetensors_header(file, path, size)
            hasher.update(len(header).to_bytes(8, "little") + header)
            read += 8 + len(header)
        for offset in sample_offsets(size):
            file.seek(offset)
            chunk = file.read(SAMPLE_BYTES)
            hasher.update(chunk)
            read += len(chunk)
    return size, read


def sample_offsets(size: int) -> list[int]:
    """Start offsets of the sampled windows of a ``size``-byte file (sorted, distinct)."""
    if size <= SAMPLES * SAMPLE_BYTES:
        return list(range(0, size, SAMPLE_BYTES))
    last = size - SAMPLE_BYTES
    return [last * i // (SAMPLES - 1) for i in range(SAMPLES)]


def _safetensors_header(file: BinaryIO, path: Path, size: int) -> bytes:
    """The JSON header of a safetensors file; ``ConfigError`` when its length is implausible."""
    head = file.read(8)
    if len(head) < 8:
        raise ConfigError(f"model fingerprint: {path} is too short for a safetensors file")
    length = int.from_bytes(head, "little")
    if length > MAX_HEADER_BYTES or length > size - 8:
        raise ConfigError(
            f"model fingerprint: {path} claims a {length}-byte safetensors header "
            f"(file {size} bytes, limit {MAX_HEADER_BYTES}): not a safetensors file"
        )
    file.seek(8)
    return _read_bounded(file, path, length, exact=True)


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, refused unless it is a regular file; never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"model fingerprint: cannot open {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"model fingerprint: {path} is not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _read_bounded(file: BinaryIO, path: Path, limit: int, exact: bool = False) -> bytes:
    """At most ``limit`` bytes (exactly ``limit`` when ``exact``); ``ConfigError`` otherwise."""
    try:
        data = file.read(limit + (0 if exact else 1))
    except OSError as exc:
        raise ConfigError(f"model fingerprint: cannot read {path}: {exc.strerror}") from exc
    if (exact and len(data) != limit) or (not exact and len(data) > limit):
        raise ConfigError(f"model fingerprint: {path} is not {limit} bytes as expected")
    return data
