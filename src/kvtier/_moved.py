"""Old module paths from before the folders (``kvtier.manager`` is now ``kvtier.core.manager``).

Importing an old path still works and gives the new module itself (one module object, one set of
classes), with a ``DeprecationWarning`` naming the new path. A moved package's submodules follow
it. Installed by ``kvtier/__init__.py`` as the first finder on ``sys.meta_path``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

#: Old module path -> where it lives now.
MOVED = {
    "kvtier.admin": "kvtier.control.admin",
    "kvtier.admission": "kvtier.control.admission",
    "kvtier.admission.policies": "kvtier.control.admission.rules",
    "kvtier.cli_about": "kvtier.cli.about",
    "kvtier.cli_admin": "kvtier.cli.admin",
    "kvtier.cli_events": "kvtier.cli.events",
    "kvtier.cli_files": "kvtier.cli.files",
    "kvtier.cli_types": "kvtier.cli.common",
    "kvtier.clock": "kvtier.telemetry.transfer_meter",
    "kvtier.config_checks": "kvtier.config.checks",
    "kvtier.config_parser": "kvtier.config.parser",
    "kvtier.events": "kvtier.telemetry.kv_events",
    "kvtier.file_modes": "kvtier.config.file_modes",
    "kvtier.guards": "kvtier.core.entry_checks",
    "kvtier.host": "kvtier.core.host_slots",
    "kvtier.integrations.vllm.cache_policy": "kvtier.integrations.vllm.priority_policy",
    "kvtier.integrations.vllm.retention": "kvtier.integrations.vllm.request_retention",
    "kvtier.logs": "kvtier.telemetry.logs",
    "kvtier.manager": "kvtier.core.manager",
    "kvtier.metrics": "kvtier.telemetry.metrics",
    "kvtier.metrics_http": "kvtier.telemetry.endpoint",
    "kvtier.operations": "kvtier.core.manager",
    "kvtier.peer_host": "kvtier.core.peer_service",
    "kvtier.plan.events": "kvtier.plan.trace_from_events",
    "kvtier.progress": "kvtier.core.progress",
    "kvtier.promotion": "kvtier.core.promotion",
    "kvtier.provenance": "kvtier.core.provenance",
    "kvtier.retention": "kvtier.control.retention",
    "kvtier.runtime": "kvtier.core.runtime",
    "kvtier.services": "kvtier.core.peer_service",
    "kvtier.slo": "kvtier.control.slo_guard",
    "kvtier.slots": "kvtier.core.slot_allocator",
    "kvtier.tier_control": "kvtier.control.tier_switches",
    "kvtier.tier_set": "kvtier.core.tier_set",
    "kvtier.tiers.fs.cache_policy": "kvtier.tiers.fs.page_cache",
    "kvtier.tiers.peer.guard": "kvtier.tiers.peer.connection_bounds",
    "kvtier.tiers.peer.host": "kvtier.tiers.peer.host_view",
    "kvtier.tiers.peer.listener": "kvtier.tiers.peer.zmq_listener",
    "kvtier.tiers.peer.server_listen": "kvtier.tiers.peer.server_transport",
}

_LONGEST_FIRST = sorted(MOVED.items(), key=lambda item: -len(item[0]))


def new_name(name: str) -> str | None:
    """Where module ``name`` lives now, or ``None`` if it did not move."""
    for old, new in _LONGEST_FIRST:
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path to the module at its new path."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = new_name(spec.name)
        assert new is not None
        warnings.warn(f"{spec.name} is deprecated: import {new}", DeprecationWarning, 2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module was run at its new path."""


def install() -> None:
    """Put ``MovedModules`` first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
