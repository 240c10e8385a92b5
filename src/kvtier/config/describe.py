"""A configuration in words, for people: what ``kvtier config check`` prints.

Credentials never appear: ``repr=False`` fields are left out and URLs lose their user:password.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from typing import Any

from kvtier.config.addresses import is_loopback, redact_url
from kvtier.config.file_modes import DEFAULT_DIR_MODE, open_to_others, parse_mode
from kvtier.config.schema import KVEventsConfig, TieringConfig
from kvtier.core import malloc_settings
from kvtier.layout import KVLayout
from kvtier.region import ALIGNMENT, round_up
from kvtier.tiers.base import TierConfig
from kvtier.tiers.catalog import ExternalTierConfig
from kvtier.tiers.fs.config import FsTierConfig
from kvtier.tiers.peer.config import ServeConfig


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


def describe_tier(tier: TierConfig) -> str:
    """One line per tier; credentials (``repr=False`` fields, a URL's user:password) never shown."""
    if isinstance(tier, ExternalTierConfig):
        return f"{tier.module_path}.{tier.class_name} options={sorted(tier.options)}"
    shown = [f for f in dataclasses.fields(tier) if f.repr and f.name != "name"]
    parts = [f"{f.name}={_short(getattr(tier, f.name))}" for f in shown]
    return f"{tier.type_name:<6} " + " ".join(parts)


def _short(value: Any) -> str:
    if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
        return ",".join(f"{v.host}:{v.port}" for v in value)
    if dataclasses.is_dataclass(value):
        return f"[{describe_tier(value)}]"  # type: ignore[arg-type]
    return redact_url(value) if isinstance(value, str) else str(value)


def describe_config(config: TieringConfig, layout: KVLayout) -> str:
    """The resolved configuration, one setting per line (no credentials)."""
    stride = round_up(layout.chunk_bytes, ALIGNMENT)
    num_slots = config.host_slots(layout.chunk_bytes, check_memory=False)
    lines = []
    if config.kv_connector:
        lines.append(f"connector:       {config.kv_connector} ({config.kv_role or 'no role'})")
    lines += [
        f"spec:            {config.spec_name}",
        f"layout:          {layout.num_layers} layers x {layout.num_kv_heads} KV heads x "
        f"{layout.head_dim} head dim, {layout.dtype}",
        f"chunk:           {layout.blocks_per_chunk} blocks x {layout.block_size} tokens = "
        f"{layout.tokens_per_chunk} tokens, {human_bytes(layout.chunk_bytes)} per slot",
        f"host tier:       {num_slots} slots ({human_bytes(num_slots * stride)} of "
        f"{human_bytes(config.cpu_bytes_to_use)}), eviction {config.eviction_policy}",
        "secondary tiers: " + ("none" if not config.secondary_tiers else "(lookup order)"),
    ]
    lines += [f"  {i}. {describe_tier(t)}" for i, t in enumerate(config.secondary_tiers, 1)]
    lines.append(f"malloc:          {malloc_settings.describe(config.tune_malloc)}")
    return "\n".join(lines + describe_services(config))


def describe_services(config: TieringConfig) -> list[str]:
    """What this configuration listens on: the peer server, metrics and KV events."""
    metrics = "off"
    if config.metrics_port is not None:
        metrics = f"http://{_host_port(config.metrics_host, config.metrics_port)}/metrics"
    return [
        f"serve:           {_describe_serve(config.serve)}",
        f"metrics:         {metrics}",
        f"kv events:       {_describe_events(config.kv_events)}",
    ]


def _describe_serve(serve: ServeConfig | None) -> str:
    if serve is None:
        return "off"
    security = "CURVE off (unauthenticated, unencrypted)"
    if serve.transport == "tcp":
        security = "plain TCP (unauthenticated, unencrypted)"
    elif serve.curve_secret_key_file is not None:
        security = (
            f"CURVE on (secret key {serve.curve_secret_key_file}, "
            f"clients {serve.curve_client_keys_dir})"
        )
    stores = "accepted" if serve.accept_stores else "refused"
    return (
        f"tcp://{_host_port(serve.host, serve.port)}, {security}, stores from peers "
        f"{stores}, hold_timeout_s {serve.hold_timeout_s:g}"
    )


def _describe_events(events: KVEventsConfig | None) -> str:
    if events is None:
        return "off"
    if not events.enable_kv_cache_events:
        return "off (enable_kv_cache_events is false)"
    return (
        f"{events.endpoint} topic {events.topic or ''!r} hwm {events.hwm} "
        "(ZeroMQ PUB, unauthenticated)"
    )


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def config_warnings(config: TieringConfig) -> Iterator[str]:
    """Settings that work but are likely a mistake or an exposure."""
    physical = config.exceeds_memory()
    if physical is not None:
        yield (
            f"cpu_bytes_to_use ({human_bytes(config.cpu_bytes_to_use)}) exceeds this host's "
            f"physical memory ({human_bytes(physical)}); the manager will refuse to start here"
        )
    serve = config.serve
    if serve is not None and serve.curve_secret_key_file is None and not serve.loopback:
        yield (
            f"serve listens on {serve.host} without CURVE: any host that reaches it can fetch "
            "this cache's chunks"
        )
    events = config.kv_events
    if events is not None and events.enable_kv_cache_events and not _loopback_endpoint(events):
        yield f"kv events are published unauthenticated on {events.endpoint}"
    yield from _open_cache_dirs(config.secondary_tiers)
    yield from _unsealed_group_caches(config.secondary_tiers)


def _open_cache_dirs(tiers: Iterable[TierConfig]) -> Iterator[str]:
    """An fs tier's existing ``root_dir`` that is no directory, or more open than its
    ``dir_mode``."""
    for tier in tiers:
        if not isinstance(tier, FsTierConfig):
            continue
        if os.path.lexists(tier.root_dir) and not os.path.isdir(tier.root_dir):
            yield f"fs root_dir {tier.root_dir}: not a directory; the fs tier cannot start"
            continue
        problem = open_to_others(tier.root_dir, parse_mode(tier.dir_mode) or DEFAULT_DIR_MODE)
        if problem:
            yield f"fs root_dir {tier.root_dir}: {problem} (chunks hold prompt content)"


def _unsealed_group_caches(tiers: Iterable[TierConfig]) -> Iterator[str]:
    """An fs tier whose group may write its chunks, without an integrity key."""
    for tier in tiers:
        if isinstance(tier, FsTierConfig) and tier.integrity_key_file is None:
            mode = parse_mode(tier.dir_mode) or DEFAULT_DIR_MODE
            if mode & 0o022:
                yield (
                    f"fs root_dir {tier.root_dir}: dir_mode {tier.dir_mode} lets others write "
                    "chunks, and without integrity_key_file whoever writes one chooses the KV "
                    "served (docs/security.md, sealed chunks)"
                )


def _loopback_endpoint(events: KVEventsConfig) -> bool:
    scheme, _, rest = events.endpoint.partition("://")
    return scheme != "tcp" or is_loopback(rest.rpartition(":")[0].strip("[]"))
