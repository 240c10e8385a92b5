"""One kvtier runtime per vLLM engine: the operator plane inside vLLM's engine core process.

vLLM builds each ``secondary_tiers`` entry as its own ``SecondaryTierManager``. Every kvtier
tier of one engine (keyed by vLLM's ``engine_id``) joins the same ``EngineRuntime``: one
``kvtier.core.runtime.Runtime`` holding those tiers, their jobs, switches, the SLO guard, admission
and metrics, configured from kvtier's keys at the top of ``kv_connector_extra_config``
(``engine_config``). The first tier to join starts ``/metrics`` and the admin endpoint
(``metrics_port``, ``metrics_admin``); the last to leave closes them.

Under vLLM, host memory is vLLM's: ``retention_policy`` says whether its cache policy is
kvtier's (``KvtierPriorityPolicy``), without which a request's ``kvtier_retention`` cannot act
on host memory (``note_request`` counts and logs such requests). The operator's caps on what a
request may ask for (``max_request_priority``, ``max_request_duration_s``) are installed for
the process's requests when the engine starts (``request_retention.set_limits``); a request
cut to them is counted (``kvtier_retention_ignored_total{reason="capped"}``).

Thread safety: ``join`` and ``leave`` take a module lock (vLLM builds tiers on one thread, but
two engines may share a process in tests); everything else runs on vLLM's scheduler thread
under the runtime's lock, and the endpoint's threads take that lock too. Nothing here imports
vLLM.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from kvtier.core.runtime import Runtime
from kvtier.integrations.vllm import shm
from kvtier.integrations.vllm.engine_config import engine_config, unknown_keys
from kvtier.integrations.vllm.request_retention import (
    RETENTION_KEY,
    current_limits,
    is_capped,
    is_invalid,
    request_retention,
    set_limits,
)
from kvtier.policies.priority import RequestLimits
from kvtier.telemetry.logs import ThrottledLog, log_to_stderr

log = logging.getLogger(__name__)
warn = ThrottledLog(log)

#: vLLM's cache policy names under which ``kvtier_retention`` acts on host memory.
RETENTION_POLICIES = ("KvtierPriorityPolicy", "KvtierPriorityARCPolicy")
POLICY_MODULE = "kvtier.integrations.vllm"

_lock = threading.Lock()
_engines: dict[str, EngineRuntime] = {}


@dataclass
class EngineRuntime:
    """The runtime of one vLLM engine and what the adapter needs to know of the engine."""

    engine_id: str
    runtime: Runtime
    retention_policy: bool
    users: int = 0
    _noted: set[str] = field(default_factory=set)

    def note_request(self, req_context: Any) -> None:
        """A request started: count a ``kvtier_retention`` cut to the operator's caps, a
        malformed one and one that cannot act (no kvtier cache policy), each once per request
        (scheduler thread)."""
        req_id = str(getattr(req_context, "req_id", ""))
        if req_id in self._noted:
            return
        self._noted.add(req_id)
        if len(self._noted) > 65_536:  # request ids are never reused; keep the memo bounded
            self._noted.clear()
        for reason in self._ignored(req_context, req_id):
            self.runtime.metrics.count("retention_ignored", reason=reason)

    def _ignored(self, req_context: Any, req_id: str) -> list[str]:
        """Why ``req_context``'s retention could not act as asked (none, one or two reasons)."""
        reasons = ["capped"] if is_capped(req_context) else []
        if is_invalid(req_context):
            reasons.append("invalid")
        elif request_retention(req_context) is not None and not self.retention_policy:
            reasons.append("no_priority_policy")
            warn.warning(
                "retention-policy",
                "request %s: %s has no effect on host memory without "
                '"eviction_policy": "KvtierPriorityPolicy" and "cache_policy_module_path": '
                '"%s" in kv_connector_extra_config',
                req_id,
                RETENTION_KEY,
                POLICY_MODULE,
            )
        return reasons


def join(offloading_spec: Any, chunk_bytes: int) -> EngineRuntime:
    """The runtime of ``offloading_spec``'s engine, made (and its endpoint started) on first
    use; ``ConfigError`` naming the key for a bad or unsupported kvtier key."""
    engine_id = str(getattr(offloading_spec.config, "engine_id", "") or "default")
    log_to_stderr()
    with _lock:
        engine = _engines.get(engine_id)
        if engine is None:
            engine = _start(engine_id, offloading_spec, chunk_bytes)
            _engines[engine_id] = engine
        engine.users += 1
        return engine


def _start(engine_id: str, offloading_spec: Any, chunk_bytes: int) -> EngineRuntime:
    extra = dict(getattr(offloading_spec, "extra_config", None) or {})
    config = engine_config(extra)
    runtime = Runtime(config, chunk_bytes)
    _install_limits(RequestLimits(config.max_request_priority, config.max_request_duration_s))
    unknown = unknown_keys(extra)
    if unknown:
        log.warning(
            "kv_connector_extra_config: %s read by neither vLLM nor kvtier (ignored)",
            ", ".join(unknown),
        )
    policy = extra.get("eviction_policy") in RETENTION_POLICIES
    policy = policy and extra.get("cache_policy_module_path") == POLICY_MODULE
    # this process's workers' removals at start (relayed by the spec before the tiers exist)
    runtime.metrics.count("shm_regions_removed", shm.regions_removed())
    runtime.metrics.count("shm_bytes_removed", shm.bytes_removed())
    runtime.serve({})
    return EngineRuntime(engine_id, runtime, policy)


def _install_limits(limits: RequestLimits) -> None:
    """The caps for this process's requests (one set per process: vLLM runs one engine core in
    each; a second engine with other caps replaces them, with a warning)."""
    if _engines and current_limits() != limits:
        log.warning(
            "max_request_priority / max_request_duration_s: %s replaces %s for every "
            "engine of this process",
            limits,
            current_limits(),
        )
    set_limits(limits)


def leave(engine: EngineRuntime) -> None:
    """A tier of ``engine`` shut down; the last one closes the runtime's endpoint."""
    with _lock:
        engine.users -= 1
        if engine.users > 0:
            return
        _engines.pop(engine.engine_id, None)
        if not _engines:
            set_limits(RequestLimits())
    engine.runtime.close(close_tiers=False)
