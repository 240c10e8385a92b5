"""``kvtier config check``: the resolved configuration, or the error."""

from __future__ import annotations

import json
import subprocess
import sys

from kvtier.cli.main import main


def write(tmp_path, data):
    path = tmp_path / "kv.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_config_check_prints_slots_and_tiers_in_order(tmp_path, capsys):
    path = write(
        tmp_path,
        {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "cpu_bytes_to_use": 1 << 30,
                "block_size": 64,
                "secondary_tiers": [
                    {"type": "fs", "root_dir": "/mnt/kv"},
                    {
                        "type": "obj",
                        "bucket": "b",
                        "access_key": "AKIDSECRET",
                        "secret_key": "S3CR3T",
                    },
                ],
            },
        },
    )
    assert (
        main(
            [
                "config",
                "check",
                path,
                "--as",  # kvtier's own config in vLLM's wrapper: vLLM would read it otherwise
                "kvtier",
                "--num-layers",
                "4",
                "--num-kv-heads",
                "2",
                "--head-dim",
                "64",
                "--dtype",
                "float16",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    chunk = 4 * 2 * 2 * 64 * 64 * 2  # layers * K,V * heads * tokens * dim * bytes
    assert "64 tokens" in out and f"{chunk // 1024}.0 KiB per slot" in out
    assert f"{(1 << 30) // chunk} slots" in out
    assert out.index("1. fs") < out.index("2. obj")
    assert "AKIDSECRET" not in out and "S3CR3T" not in out
    assert "malloc:          glibc's thresholds set at start (tune_malloc)" in out


def test_config_check_says_when_malloc_is_left_as_it_is(tmp_path, capsys):
    path = write(tmp_path, {"cpu_bytes_to_use": 1 << 30, "tune_malloc": False})
    assert main(["config", "check", path]) == 0
    assert "malloc:          as it is (tune_malloc)" in capsys.readouterr().out


def test_config_check_reports_the_error(tmp_path):
    path = write(tmp_path, {"cpu_bytes_to_use": 1, "secondary_tiers": [{"type": "fs"}]})
    result = subprocess.run(
        [sys.executable, "-m", "kvtier.cli", "config", "check", path],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "secondary_tiers[0].root_dir: required" in result.stderr
