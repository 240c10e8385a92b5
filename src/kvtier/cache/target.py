"""Which cache a command works on: an fs directory, ``s3://bucket/prefix``, or a tier entry of
a kvtier configuration (``--config FILE --tier NAME``).

``open_target`` returns the ``Store`` and the integrity key file that goes with it (a tier
entry's ``integrity_key_file``; ``verify`` uses it for sealed chunks). An s3 target takes the
obj tier's options: ``endpoint`` and ``region``, the keys from ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY`` (or the AWS credential chain) as the tier does. Anything wrong is a
``TargetError`` naming it.

Thread safety: plain functions, on the caller's thread.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvtier.cache.fs_store import FsStore, TargetError
from kvtier.cache.store import Store
from kvtier.errors import KVTierError


@dataclass(frozen=True)
class TargetSpec:
    """What the command line said: ``target`` (a path or ``s3://...``) or ``config`` + ``tier``;
    ``endpoint``/``region`` for s3 targets."""

    target: str | None = None
    config: str | None = None
    tier: str | None = None
    endpoint: str | None = None
    region: str | None = None


def open_target(spec: TargetSpec) -> tuple[Store[Any], str | None]:
    """The store ``spec`` names and its integrity key file; ``TargetError`` when it cannot be
    opened or is named wrongly."""
    if (spec.target is None) == (spec.config is None):
        raise TargetError("give a TARGET (a directory or s3://bucket/prefix) or --config, not both")
    if spec.config is not None:
        return _from_config(spec)
    assert spec.target is not None
    if spec.target.startswith("s3://"):
        return _s3(_s3_config(spec.target, spec.endpoint, spec.region)), None
    if spec.endpoint or spec.region:
        raise TargetError("--endpoint and --region are for s3:// targets")
    return FsStore(spec.target), None


def _s3_config(url: str, endpoint: str | None, region: str | None) -> Any:
    from kvtier.tiers.s3.config import ObjTierConfig

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not bucket:
        raise TargetError(f"{url}: expected s3://BUCKET/PREFIX")
    try:
        return ObjTierConfig(
            bucket=bucket, prefix=prefix.strip("/"), endpoint_override=endpoint, region=region
        )
    except KVTierError as exc:
        raise TargetError(str(exc)) from None


def _s3(config: Any) -> Store[Any]:
    from kvtier.cache.s3_store import S3Store

    return S3Store(config)


def _from_config(spec: TargetSpec) -> tuple[Store[Any], str | None]:
    from kvtier.config.schema import TieringConfig

    if spec.tier is None:
        raise TargetError("--config needs --tier NAME (the tier entry's name or type)")
    try:
        config = TieringConfig.load(spec.config or "")
    except KVTierError as exc:
        raise TargetError(f"--config {spec.config}: {exc}") from None
    tier = _find_tier(config.secondary_tiers, spec.tier)
    key_file = getattr(tier, "integrity_key_file", None)
    if tier.type_name == "fs":
        return FsStore(tier.root_dir), key_file
    if tier.type_name == "obj":
        overrides = {k: v for k, v in (("endpoint_override", spec.endpoint),) if v}
        return _s3(replace(tier, **overrides)), key_file
    raise TargetError(f"--tier {spec.tier}: a {tier.type_name} tier holds no shared cache")


def _find_tier(tiers: tuple[Any, ...], name: str) -> Any:
    named = [t for t in tiers if (getattr(t, "name", None) or t.type_name) == name]
    if len(named) != 1:
        have = ", ".join(getattr(t, "name", None) or t.type_name for t in tiers) or "none"
        raise TargetError(f"--tier {name}: no single tier of that name (tiers: {have})")
    return named[0]
