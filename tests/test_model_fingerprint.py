"""``kvtier.model_fingerprint`` and the identity built on it, on real files.

The same model under two paths gets one identity digest; a changed weight file (another
safetensors header, another size, other sampled bytes) or config value gets another; a hub id
keeps the identity it had before fingerprints; hostile files are a ``ConfigError``, never a hang.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.identity import CacheIdentity
from kvtier.layout import KVLayout
from kvtier.model_fingerprint import (
    MAX_HEADER_BYTES,
    SAMPLE_BYTES,
    SAMPLES,
    fingerprint_model,
    sample_offsets,
)
from tests.model_dir import write_model

pytestmark = pytest.mark.timeout(60)

LAYOUT = KVLayout(2, 2, 16)


def digest_of(path: Path) -> str:
    found = fingerprint_model(str(path))
    assert found is not None
    return found.digest


def identity_of(path: Path) -> CacheIdentity:
    found = fingerprint_model(str(path))
    assert found is not None
    return CacheIdentity(model=found.name, layout=LAYOUT, fingerprint=found.digest)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_model(tmp_path / "a" / "smol", bin_bytes=6 * 2**20)


def test_one_model_under_two_paths_has_one_identity(model, tmp_path):
    copy = shutil.copytree(model, tmp_path / "elsewhere" / "renamed")
    assert digest_of(model) == digest_of(copy)
    first, second = identity_of(model), identity_of(copy)
    assert (first.model, second.model) == ("smol", "renamed")  # displayed, not hashed
    assert first.digest == second.digest and first == second


def test_a_config_written_differently_is_the_same_config(model):
    before = digest_of(model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(reversed(config.items()))))
    assert digest_of(model) == before


@pytest.mark.parametrize(
    "change",
    ["safetensors_header", "safetensors_values", "bin_size", "bin_sampled_bytes", "config"],
)
def test_a_changed_model_under_the_same_path_has_another_identity(model, tmp_path, change):
    before = identity_of(model)
    if change == "safetensors_header":  # same size, another shape
        write_model(model, shape=(32, 128))
    elif change == "safetensors_values":  # same header, other weights
        write_model(model, seed=7)
    elif change == "bin_size":
        with open(model / "extra.bin", "ab") as file:
            file.write(b"\0")
    elif change == "bin_sampled_bytes":  # the middle window of a file longer than the samples
        size = (model / "extra.bin").stat().st_size
        offset = sample_offsets(size)[SAMPLES // 2]
        with open(model / "extra.bin", "r+b") as file:
            file.seek(offset)
            file.write(b"\xff" * 16)
    else:
        write_model(model, config={"model_type": "llama", "hidden_size": 128})
    assert identity_of(model).digest != before.digest


def test_a_hub_id_keeps_the_identity_it_had_before_fingerprints():
    assert fingerprint_model("org/not-a-local-path") is None
    identity = CacheIdentity(model="org/model", layout=LAYOUT, revision="abc")
    legacy = {"model": "org/model", "revision": "abc", "layout": LAYOUT.describe(), "extra": {}}
    text = json.dumps(legacy, sort_keys=True, separators=(",", ":"))
    assert identity.describe() == legacy
    assert identity.digest == hashlib.sha256(text.encode()).digest()


def test_a_hugging_face_snapshot_is_named_by_repo_and_matches_a_plain_copy(model, tmp_path):
    repo = tmp_path / "hub" / "models--org--smol"
    snapshot = repo / "snapshots" / ("ab" * 20)
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in model.iterdir():  # the hub cache's layout: snapshot files link to blobs
        blob = repo / "blobs" / hashlib.sha256(file.name.encode()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(blob)
    found = fingerprint_model(str(snapshot))
    assert found is not None
    assert (found.name, found.hf_revision) == ("org/smol", "ab" * 20)
    assert found.digest == digest_of(model)


def test_a_single_weight_file_is_a_model(model):
    assert digest_of(model / "extra.bin").startswith("sha256-")


def test_the_cost_is_stated_and_bounded(model, caplog):
    caplog.set_level(logging.INFO, logger="kvtier.model_fingerprint")
    found = fingerprint_model(str(model))
    assert found is not None and found.files == 2
    assert found.read_bytes <= found.files * (SAMPLES * SAMPLE_BYTES + 64 * 1024)
    assert found.read_bytes < found.total_bytes  # the 6 MiB file is sampled, not read
    (line,) = [r.getMessage() for r in caplog.records if "model fingerprint" in r.getMessage()]
    assert "2 weight files" in line and found.digest in line


def test_sample_windows_cover_small_files_and_both_ends_of_large_ones():
    assert sample_offsets(0) == []
    assert sample_offsets(3 * SAMPLE_BYTES) == [0, SAMPLE_BYTES, 2 * SAMPLE_BYTES]
    size = 10**9
    offsets = sample_offsets(size)
    assert len(offsets) == SAMPLES and offsets[0] == 0 and offsets[-1] == size - SAMPLE_BYTES


# -- hostile and broken inputs: a ConfigError naming the file, never a hang -------------------
def huge_header(model: Path) -> None:
    (model / "model.safetensors").write_bytes((2**62).to_bytes(8, "little") + b"{}")


def header_past_the_end(model: Path) -> None:
    (model / "model.safetensors").write_bytes((1000).to_bytes(8, "little") + b"{}")


def header_over_the_limit(model: Path) -> None:
    with open(model / "model.safetensors", "wb") as file:  # sparse: no 100 MB written
        file.write((MAX_HEADER_BYTES + 1).to_bytes(8, "little"))
        file.truncate(MAX_HEADER_BYTES + 64)


def fifo(model: Path) -> None:
    (model / "model.safetensors").unlink()
    os.mkfifo(model / "model.safetensors")


def symlink_loop(model: Path) -> None:
    (model / "model.safetensors").unlink()
    (model / "model.safetensors").symlink_to(model / "loop.bin")
    (model / "loop.bin").symlink_to(model / "model.safetensors")


def dangling_link(model: Path) -> None:
    (model / "model.safetensors").unlink()
    (model / "model.safetensors").symlink_to(model / "gone")


def device(model: Path) -> None:
    (model / "model.safetensors").unlink()
    (model / "model.safetensors").symlink_to("/dev/zero")


def bad_config(model: Path) -> None:
    (model / "config.json").write_text("{not json")


def no_weights(model: Path) -> None:
    (model / "model.safetensors").unlink()
    (model / "extra.bin").unlink()
    (model / "config.json").unlink()


@pytest.mark.parametrize(
    "damage",
    [
        huge_header,
        header_past_the_end,
        header_over_the_limit,
        fifo,
        symlink_loop,
        dangling_link,
        device,
        bad_config,
        no_weights,
    ],
)
def test_a_hostile_model_directory_is_a_config_error(model, damage):
    damage(model)
    with pytest.raises(ConfigError, match="model fingerprint"):
        fingerprint_model(str(model))


def test_a_config_only_directory_is_its_config_with_a_warning(model, caplog):
    """vLLM's load_format=dummy draws weights from the config and a fixed seed."""
    (model / "model.safetensors").unlink()
    (model / "extra.bin").unlink()
    first = digest_of(model)
    assert "no weight file" in caplog.text
    (model / "config.json").write_text(json.dumps({"hidden_size": 7}))
    assert digest_of(model) != first


def test_a_model_path_that_loops_is_a_config_error(tmp_path):
    (tmp_path / "m").symlink_to(tmp_path / "n")
    (tmp_path / "n").symlink_to(tmp_path / "m")
    with pytest.raises(ConfigError, match="cannot resolve"):
        fingerprint_model(str(tmp_path / "m"))


def test_a_directory_link_loop_inside_the_model_is_not_followed(model):
    (model / "sub").mkdir()
    (model / "sub" / "up").symlink_to(model, target_is_directory=True)
    assert digest_of(model).startswith("sha256-")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_weight_file_is_a_config_error(model):
    (model / "extra.bin").chmod(0)
    with pytest.raises(ConfigError, match="cannot open"):
        fingerprint_model(str(model))
