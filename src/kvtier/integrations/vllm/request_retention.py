"""Retention priority under vLLM: read from a request's ``kv_transfer_params``.

A request asks for retention with ``kv_transfer_params={"kvtier_retention": {...}}``
(``SamplingParams(extra_args={"kv_transfer_params": ...})`` offline, or the request body's
``kv_transfer_params`` with vLLM's server)::

    {"priority": 80, "duration_s": 600,
     "ranges": [{"start": 0, "end": 1024, "priority": 95}]}

Every key is optional (and ``MAX_RANGES`` ranges at most). ``priority`` (0-100) and
``duration_s`` (> 0) apply to the request's chunks; a range gives its own to the chunks whose
last token lies in ``[start, end)`` (token positions, as vLLM records them for each chunk). The
semantics are kvtier's and TensorRT-LLM's: eviction takes lower priorities first, an expired
duration drops the chunk back to the default priority (35), and a request without retention
leaves the priority of the chunks it uses alone.

``request_retention`` parses once per request (kept in vLLM's per-request state). A malformed
entry never fails the request: it is ignored and logged (throttled), and ``is_invalid`` tells
the engine's runtime, which counts it (``kvtier_retention_ignored_total{reason="invalid"}``).
Nothing here imports vLLM.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.errors import InvalidArgumentError
from kvtier.policies.priority import DEFAULT_PRIORITY, checked_priority
from kvtier.telemetry.logs import ThrottledLog

RETENTION_KEY = "kvtier_retention"
_FIELDS = {"priority", "duration_s", "ranges"}
_RANGE_FIELDS = {"start", "end", "priority", "duration_s"}
#: Ranges one request may give: each chunk's retention is a scan of them on vLLM's scheduler.
MAX_RANGES = 64

warn = ThrottledLog(logging.getLogger(__name__))


@dataclass(frozen=True)
class Retention:
    """A priority (0-100), for ``duration_s`` seconds or (``None``) until changed."""

    priority: int = DEFAULT_PRIORITY
    duration_s: float | None = None


@dataclass(frozen=True)
class TokenRange:
    start: int
    end: int
    retention: Retention


@dataclass(frozen=True)
class RequestRetention:
    """What one request asks for: a retention for its chunks, and per token range."""

    default: Retention | None = None
    ranges: tuple[TokenRange, ...] = ()

    def at(self, end_token: int | None) -> Retention | None:
        """The retention of the chunk ending at ``end_token`` (``None``: leave it alone)."""
        if end_token is not None:
            for span in self.ranges:
                if span.start < end_token <= span.end:
                    return span.retention
        return self.default


def parse_retention(params: Mapping[str, Any] | None) -> RequestRetention | None:
    """The request's ``kvtier_retention``; ``None`` if absent. ``InvalidArgumentError`` if bad."""
    raw = (params or {}).get(RETENTION_KEY)
    if raw is None:
        return None
    entry = _mapping(raw, RETENTION_KEY, _FIELDS)
    default = _retention(entry, RETENTION_KEY) if "priority" in entry else None
    if "duration_s" in entry and default is None:
        raise InvalidArgumentError(f"{RETENTION_KEY}.duration_s: given without a priority")
    spans = entry.get("ranges", [])
    if not isinstance(spans, list) or len(spans) > MAX_RANGES:
        limit = f"a list of {MAX_RANGES} at most"
        raise InvalidArgumentError(f"{RETENTION_KEY}.ranges: expected {limit}")
    ranges = tuple(_range(span, f"{RETENTION_KEY}.ranges[{i}]") for i, span in enumerate(spans))
    return RequestRetention(default, ranges)


def _mapping(raw: Any, path: str, fields: set[str]) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise InvalidArgumentError(f"{path}: expected an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise InvalidArgumentError(f"{path}.{unknown[0]}: unknown key")
    return raw


def _retention(entry: Mapping[str, Any], path: str) -> Retention:
    try:
        priority = checked_priority(entry.get("priority"))
    except ValueError as exc:
        raise InvalidArgumentError(f"{path}.priority: {exc}") from None
    duration = entry.get("duration_s")
    if duration is not None and (
        isinstance(duration, bool)
        or not isinstance(duration, int | float)
        or not (math.isfinite(duration) and duration > 0)
    ):
        raise InvalidArgumentError(f"{path}.duration_s: expected a finite number > 0")
    return Retention(priority, None if duration is None else float(duration))


def _range(raw: Any, path: str) -> TokenRange:
    span = _mapping(raw, path, _RANGE_FIELDS)
    if "end" not in span:
        raise InvalidArgumentError(f"{path}.end: required")
    start, end = span.get("start", 0), span.get("end", -1)
    for name, value in (("start", start), ("end", end)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(f"{path}.{name}: expected an integer >= 0, got {value!r}")
    if end <= start:
        raise InvalidArgumentError(f"{path}: end ({end}) must be above start ({start})")
    return TokenRange(start, end, _retention(span, path))


@dataclass(frozen=True)
class _Parsed:
    retention: RequestRetention | None
    invalid: bool = False


def request_retention(req_context: Any) -> RequestRetention | None:
    """The retention ``req_context``'s request asks for, parsed once and kept in its state."""
    return _parsed(req_context).retention


def is_invalid(req_context: Any) -> bool:
    """Whether ``req_context``'s request gave a malformed ``kvtier_retention`` (ignored)."""
    return _parsed(req_context).invalid


def _parsed(req_context: Any) -> _Parsed:
    parsed: _Parsed | None = req_context.get_state(_Parsed)
    if parsed is None:
        parsed = _checked(getattr(req_context, "kv_transfer_params", None), req_context)
        req_context.set_state(parsed)
    return parsed


def _checked(params: Any, req_context: Any) -> _Parsed:
    try:
        return _Parsed(parse_retention(params if isinstance(params, Mapping) else None))
    except InvalidArgumentError as exc:
        request = getattr(req_context, "req_id", "?")
        warn.warning("retention", "request %s: %s ignored: %s", request, RETENTION_KEY, exc)
        return _Parsed(None, invalid=True)


def retention_by_key(req_context: Any) -> Callable[[bytes], Retention | None] | None:
    """Each key's retention in ``req_context``'s request, or ``None`` if it asks for none."""
    asked = request_retention(req_context)
    if asked is None:
        return None
    if not asked.ranges:
        return lambda key: asked.default
    return lambda key: asked.at(req_context.get_offload_key_position(key))
