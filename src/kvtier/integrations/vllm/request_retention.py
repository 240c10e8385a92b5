"""Retention priority under vLLM: read from a request's ``kv_transfer_params``.

A request asks for retention with ``kv_transfer_params={"kvtier_retention": {...}}``
(``SamplingParams(extra_args={"kv_transfer_params": ...})`` offline, or the request body's
``kv_transfer_params`` with vLLM's server)::

    {"priority": 80, "duration_s": 600,
     "ranges": [{"start": 0, "end": 1024, "priority": 85}]}

Every key is optional (and ``MAX_RANGES`` ranges at most). ``priority`` (0-100) and
``duration_s`` (> 0) apply to the request's chunks; a range gives its own to the chunks whose
last token lies in ``[start, end)`` (token positions, as vLLM records them for each chunk). The
semantics are kvtier's and TensorRT-LLM's: eviction takes lower priorities first, an expired
duration drops the chunk back to the default priority (35), and a request without retention
leaves the priority of the chunks it uses alone.

What a request asks for is cut to the operator's caps (``max_request_priority``,
``max_request_duration_s`` in ``kv_connector_extra_config``, installed by the engine's runtime
with ``set_limits``; ``RequestLimits.clamp``, the manager's clamp too), and flagged
(``is_capped``) so that the runtime counts it (``kvtier_retention_ignored_total{reason=
"capped"}``). The operator's retention comes instead in the request's ``kv_hints``, which only
code calling vLLM's engine API can give (``LLMEngine.add_request``, ``AsyncLLM.generate``; not
an HTTP client): an action of type ``"kvtier_retention"`` whose payload has the same keys. It is
not capped, and no request's retention changes the chunks it retains while it lasts
(``priority_cache``).

``request_retention`` parses once per request (kept in vLLM's per-request state). A malformed
entry (numbers of any size included) never fails the request: it is ignored and logged
(throttled), and ``is_invalid`` tells the engine's runtime, which counts it
(``kvtier_retention_ignored_total{reason="invalid"}``). Nothing here imports vLLM.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.errors import InvalidArgumentError, shown
from kvtier.policies.priority import (
    DEFAULT_PRIORITY,
    RequestLimits,
    checked_duration,
    checked_priority,
)
from kvtier.telemetry.logs import ThrottledLog

RETENTION_KEY = "kvtier_retention"
#: The ``action_type`` of the operator's retention in a request's ``kv_hints``.
HINT_ACTION = "kvtier_retention"
_FIELDS = {"priority", "duration_s", "ranges"}
_RANGE_FIELDS = {"start", "end", "priority", "duration_s"}
#: Ranges one request may give: each chunk's retention is a scan of them on vLLM's scheduler.
MAX_RANGES = 64

warn = ThrottledLog(logging.getLogger(__name__))


@dataclass(frozen=True)
class Retention:
    """A priority (0-100), for ``duration_s`` seconds or (``None``) until changed;
    ``operator``: the operator's (from ``kv_hints``), else a request's."""

    priority: int = DEFAULT_PRIORITY
    duration_s: float | None = None
    operator: bool = False

    def within(self, limits: RequestLimits) -> Retention:
        """A request's retention cut to the operator's caps."""
        return Retention(*limits.clamp(self.priority, self.duration_s))


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

    def within(self, limits: RequestLimits) -> RequestRetention:
        """Every retention of the request cut to the operator's caps."""
        default = None if self.default is None else self.default.within(limits)
        spans = (dataclasses.replace(s, retention=s.retention.within(limits)) for s in self.ranges)
        return RequestRetention(default, tuple(spans))

    def by_operator(self) -> RequestRetention:
        """The same retention, given by the operator."""
        default = None if self.default is None else _operators(self.default)
        spans = (dataclasses.replace(s, retention=_operators(s.retention)) for s in self.ranges)
        return RequestRetention(default, tuple(spans))


def _operators(retention: Retention) -> Retention:
    return dataclasses.replace(retention, operator=True)


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
    unknown = [key for key in raw if key not in fields]
    if unknown:
        name = unknown[0] if isinstance(unknown[0], str) and len(unknown[0]) <= 40 else None
        raise InvalidArgumentError(f"{path}.{name or shown(unknown[0])}: unknown key")
    return raw


def _retention(entry: Mapping[str, Any], path: str) -> Retention:
    try:
        priority = checked_priority(entry.get("priority"))
    except ValueError as exc:
        raise InvalidArgumentError(f"{path}.priority: {exc}") from None
    duration = entry.get("duration_s")
    if duration is None:
        return Retention(priority)
    try:
        return Retention(priority, checked_duration(duration))
    except ValueError as exc:
        raise InvalidArgumentError(f"{path}.duration_s: {exc}") from None


def _range(raw: Any, path: str) -> TokenRange:
    span = _mapping(raw, path, _RANGE_FIELDS)
    if "end" not in span:
        raise InvalidArgumentError(f"{path}.end: required")
    start, end = span.get("start", 0), span.get("end", -1)
    for name, value in (("start", start), ("end", end)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgumentError(
                f"{path}.{name}: expected an integer >= 0, got {shown(value)}"
            )
    if end <= start:
        raise InvalidArgumentError(
            f"{path}: end ({shown(end)}) must be above start ({shown(start)})"
        )
    return TokenRange(start, end, _retention(span, path))


def parse_hints(hints: Any) -> RequestRetention | None:
    """The operator's retention in a request's ``kv_hints`` (vLLM's ``KvHintsEnvelope``): the
    payload of its one action of type ``HINT_ACTION``, with the keys of ``kvtier_retention``;
    ``None`` if there is none; ``InvalidArgumentError`` if malformed or given twice."""
    actions = getattr(hints, "actions", None)
    if not isinstance(actions, list | tuple):
        return None
    ours = [a for a in actions if getattr(a, "action_type", None) == HINT_ACTION]
    if len(ours) > 1:
        raise InvalidArgumentError(f"kv_hints: {len(ours)} {HINT_ACTION} actions, expected one")
    given = parse_retention({RETENTION_KEY: getattr(ours[0], "payload", None)}) if ours else None
    return None if given is None else given.by_operator()


class _Limits:
    """The operator's caps on what requests ask for, in this process (``set_limits``)."""

    current = RequestLimits()


def set_limits(limits: RequestLimits) -> None:
    """The caps applied to requests parsed from now on: the engine's runtime installs those of
    ``kv_connector_extra_config`` at start (``RequestLimits()``, the defaults, until then)."""
    _Limits.current = limits


def current_limits() -> RequestLimits:
    return _Limits.current


@dataclass(frozen=True)
class _Parsed:
    retention: RequestRetention | None  # the request's, within the caps
    operator: RequestRetention | None = None  # the operator's, from kv_hints
    invalid: bool = False
    capped: bool = False


def request_retention(req_context: Any) -> RequestRetention | None:
    """The retention ``req_context``'s request asks for, within the operator's caps (parsed
    once and kept in its state)."""
    return _parsed(req_context).retention


def operator_retention(req_context: Any) -> RequestRetention | None:
    """The operator's retention for ``req_context``'s request (its ``kv_hints``), if any."""
    return _parsed(req_context).operator


def is_invalid(req_context: Any) -> bool:
    """Whether ``req_context``'s request gave a malformed ``kvtier_retention`` or ``kv_hints``
    action (ignored)."""
    return _parsed(req_context).invalid


def is_capped(req_context: Any) -> bool:
    """Whether ``req_context``'s request asked for more than the operator's caps (cut)."""
    return _parsed(req_context).capped


def _parsed(req_context: Any) -> _Parsed:
    parsed: _Parsed | None = req_context.get_state(_Parsed)
    if parsed is None:
        parsed = _parse(req_context)
        req_context.set_state(parsed)
    return parsed


def _parse(req_context: Any) -> _Parsed:
    params = getattr(req_context, "kv_transfer_params", None)
    params = params if isinstance(params, Mapping) else None
    asked, bad = _checked(lambda: parse_retention(params), req_context, RETENTION_KEY)
    hints = getattr(req_context, "kv_hints", None)
    given, bad_hint = _checked(lambda: parse_hints(hints), req_context, "kv_hints")
    capped = None if asked is None else asked.within(_Limits.current)
    return _Parsed(capped, given, bad or bad_hint, capped != asked)


def _checked(
    parse: Callable[[], RequestRetention | None], req_context: Any, what: str
) -> tuple[RequestRetention | None, bool]:
    """What ``parse`` returns, and ``False``; ``None`` and ``True`` (logged) if malformed."""
    try:
        return parse(), False
    except InvalidArgumentError as exc:
        request = getattr(req_context, "req_id", "?")
        warn.warning("retention", "request %s: %s ignored: %s", request, what, exc)
        return None, True


def retention_by_key(req_context: Any) -> Callable[[bytes], Retention | None] | None:
    """Each key's retention in ``req_context``'s request (the operator's where it gives one,
    else the request's), or ``None`` if neither asks for any."""
    parsed = _parsed(req_context)
    asked = [r for r in (parsed.operator, parsed.retention) if r is not None]
    if not asked:
        return None
    if not any(r.ranges for r in asked):
        found = next((r.default for r in asked if r.default is not None), None)
        return lambda key: found
    position = req_context.get_offload_key_position
    return lambda key: _first(asked, position(key))


def _first(asked: list[RequestRetention], end_token: int | None) -> Retention | None:
    for retention in asked:
        found = retention.at(end_token)
        if found is not None:
            return found
    return None


def offer_terms(
    offload_keys: Sequence[bytes], req_context: Any, chunk_tokens: int
) -> tuple[int, list[int]]:
    """What the adapter tells a tier's admission about a store of ``offload_keys``: the length
    in chunks of the request's prefix they end (the last token position vLLM recorded for any
    of them, rounded up to whole chunks), and each key's retention priority (the default
    where the request gives none)."""
    retention_of = retention_by_key(req_context)
    priorities = []
    for key in offload_keys:
        retention = retention_of(key) if retention_of is not None else None
        priorities.append(DEFAULT_PRIORITY if retention is None else retention.priority)
    ends = [req_context.get_offload_key_position(key) or 0 for key in offload_keys]
    return -(-max(ends, default=0) // chunk_tokens), priorities
