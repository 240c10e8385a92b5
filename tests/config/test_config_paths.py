"""Path-valued keys: a leading ``~`` is the home directory, as in a shell (issue 25, finding 7).

``root_dir: "~/kv"`` used to make a directory literally named ``~`` in the working directory.
Every key that names a file or directory on this machine (``LocalPath`` in
``kvtier.config.checks``) expands it when the configuration is built, from JSON or by hand; a
``~user`` that names nobody is a ``ConfigError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvtier import TieringConfig
from kvtier.config import TIER_CONFIGS, FsTierConfig, P2PTierConfig, ServeConfig
from kvtier.config.checks import LocalPath, field_marks
from kvtier.errors import ConfigError

BASE: dict[str, Any] = {"cpu_bytes_to_use": 1 << 30}
P2P = {"type": "p2p", "host": "10.0.0.1", "port": 5710}
SERVE = {"port": 5710}

#: (key path, configuration with the path as VALUE, the parsed value)
CASES: list[tuple[str, dict[str, Any], Callable[[TieringConfig], Any]]] = [
    (
        "secondary_tiers[0].root_dir",
        {"secondary_tiers": [{"type": "fs", "root_dir": "VALUE"}]},
        lambda c: c.secondary_tiers[0].root_dir,
    ),
    (
        "secondary_tiers[0].curve_secret_key_file",
        {"secondary_tiers": [{**P2P, "curve_secret_key_file": "VALUE",
                              "curve_server_key_file": "/k/server.key"}]},
        lambda c: c.secondary_tiers[0].curve_secret_key_file,
    ),
    (
        "secondary_tiers[0].curve_server_key_file",
        {"secondary_tiers": [{**P2P, "curve_secret_key_file": "/k/client.key_secret",
                              "curve_server_key_file": "VALUE"}]},
        lambda c: c.secondary_tiers[0].curve_server_key_file,
    ),
    (
        "serve.curve_secret_key_file",
        {"serve": {**SERVE, "curve_secret_key_file": "VALUE", "curve_client_keys_dir": "/k"}},
        lambda c: c.serve.curve_secret_key_file,
    ),
    (
        "serve.curve_client_keys_dir",
        {"serve": {**SERVE, "curve_secret_key_file": "/k/s", "curve_client_keys_dir": "VALUE"}},
        lambda c: c.serve.curve_client_keys_dir,
    ),
    ("trace_path", {"trace_path": "VALUE"}, lambda c: c.trace_path),
]  # fmt: skip
IDS = [case[0] for case in CASES]


def with_value(entry: Any, value: str) -> Any:
    if entry == "VALUE":
        return value
    if isinstance(entry, dict):
        return {k: with_value(v, value) for k, v in entry.items()}
    if isinstance(entry, list):
        return [with_value(v, value) for v in entry]
    return entry


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize(("key", "config", "parsed"), CASES, ids=IDS)
def test_a_leading_tilde_is_the_home_directory(home: Path, key, config, parsed):
    for written, expected in [("~/kv/x", home / "kv" / "x"), ("~", home)]:
        built = TieringConfig.from_dict({**BASE, **with_value(config, written)})
        assert parsed(built) == str(expected), key


@pytest.mark.parametrize(("key", "config", "parsed"), CASES, ids=IDS)
def test_a_tilde_elsewhere_is_left_alone(home: Path, key, config, parsed):
    for written in ("./~/kv", "kv/~x", "/srv/~kv"):
        assert parsed(TieringConfig.from_dict({**BASE, **with_value(config, written)})) == written


@pytest.mark.parametrize(("key", "config", "parsed"), CASES, ids=IDS)
def test_a_tilde_user_who_does_not_exist_is_refused_naming_the_key(home, key, config, parsed):
    entry = with_value(config, "~no-such-user-kvtier/kv")
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: cannot expand "):
        TieringConfig.from_dict({**BASE, **entry})


def test_configs_built_by_hand_expand_too(home: Path):
    assert FsTierConfig(root_dir="~/kv").root_dir == str(home / "kv")
    p2p = P2PTierConfig(
        host="10.0.0.1", port=1, curve_secret_key_file="~/c", curve_server_key_file="~/s"
    )
    assert (p2p.curve_secret_key_file, p2p.curve_server_key_file) == (
        str(home / "c"),
        str(home / "s"),
    )
    serve = ServeConfig(port=1, curve_secret_key_file="~/s", curve_client_keys_dir="~/clients")
    assert serve.curve_client_keys_dir == str(home / "clients")
    config = TieringConfig(cpu_bytes_to_use=1 << 30, trace_path="~/trace.jsonl")
    assert config.trace_path == str(home / "trace.jsonl")
    with pytest.raises(ConfigError, match=r"^root_dir: cannot expand '~no-such-user-kvtier/kv'"):
        FsTierConfig(root_dir="~no-such-user-kvtier/kv")


def _fields_named(cls: type[Any], words: tuple[str, ...]) -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.name.endswith(words)]


def test_every_key_that_names_a_local_path_is_a_local_path():
    """Every ``*_file``, ``*_dir`` and ``*_path`` key of the tiers and of the configuration
    carries the ``LocalPath`` check (so no path key is left that makes a literal ``~``);
    ``spec_module_path`` names a Python module, not a file."""
    classes = [*TIER_CONFIGS.values(), ServeConfig, TieringConfig]
    words = ("_file", "_dir", "_path")
    found = [(c.__name__, n, h) for c in classes for n, h in _fields_named(c, words)]
    paths = [(c, n) for c, n, h in found if n != "spec_module_path"]
    assert ("FsTierConfig", "root_dir") in paths and ("TieringConfig", "trace_path") in paths
    for cls, name, hint in found:
        if name == "spec_module_path":
            continue
        assert any(isinstance(m, LocalPath) for m in field_marks(hint)), f"{cls}.{name}"
