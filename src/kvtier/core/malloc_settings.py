"""glibc malloc's thresholds, set at start where glibc itself takes them in a long-lived process.

glibc's ``malloc`` serves a block above ``mmap_threshold`` from a mapping of its own, unmapped
when freed, and gives the free memory at the top of a heap back to the kernel past
``trim_threshold``. It starts at 128 KiB for both, and each time the process frees a mapped block
above ``mmap_threshold`` (up to 32 MiB) it raises ``mmap_threshold`` to that block's size and
``trim_threshold`` to twice it. A serving process that has freed a mapped block close to 32 MiB
runs at 32 MiB and 64 MiB from then on; ``apply`` sets those values at once (``mallopt``).

Why: until then, memory freed by the tiers' threads goes back to the kernel and is faulted in
again a page at a time: libzmq allocates every frame the peer tier receives, an engine built on
transformers allocates tensors for every request. Measured (``benchmarks/malloc_ab.py``,
``docs/performance/2026-12-07-malloc-settings.md``): the peer tier over ZeroMQ at 2 MiB chunks
faulted 3 times per GB received instead of 36,487, at 0.71x raw pyzmq instead of 0.58x;
``kvtier bench``'s host+fs came 1.025x closer to its ceiling.

The cost is the one glibc's own adjustment has: blocks up to 32 MiB come from heaps, and up to
64 MiB free at a heap's top stays in the process. ``apply`` leaves malloc alone where the
operator chose: ``GLIBC_TUNABLES`` with a ``glibc.malloc`` setting, a ``MALLOC_*_`` variable, or
another allocator in ``LD_PRELOAD``; and where the C library is not glibc. ``RuntimeConfig``'s
``tune_malloc: false`` leaves it alone too.

Thread safety: ``apply`` may be called from any thread, any number of times; the settings are
made once per process.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 32 << 20  #: glibc's highest (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit)
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  #: what glibc pairs with it
_M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_OPERATOR_VARIABLES = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
)

_lock = threading.Lock()
_outcome: str | None = None  # what the first ``apply`` found, once per process


def operator_choice(environ: Mapping[str, str]) -> str | None:
    """Which of the operator's settings of the allocator ``environ`` holds, or ``None``."""
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    for name in _OPERATOR_VARIABLES:
        if name in environ:
            return name
    if "malloc" in environ.get("LD_PRELOAD", ""):  # jemalloc, tcmalloc, mimalloc
        return "LD_PRELOAD"
    return None


def describe(tune: bool, where: str = "") -> str:
    """What a configuration does to malloc, for ``kvtier config check``: set (``where``, if
    given: in which process) or left as it is."""
    if not tune:
        return "as it is (tune_malloc)"
    return f"glibc's thresholds set at start{where} (tune_malloc)"


def apply() -> str:
    """Set the thresholds unless left alone (module doc); say what happened.

    ``"set"`` (this call set them), ``"already set"`` (an earlier call did), ``"operator:
    NAME"`` (the operator's ``NAME`` decides), ``"not glibc"`` or ``"refused"`` (``mallopt``
    failed). Only the first call looks; later calls repeat its answer or ``"already set"``.
    """
    global _outcome
    with _lock:
        if _outcome is None:
            _outcome = _first_apply()
            return _outcome
    return "already set" if _outcome == "set" else _outcome


def _first_apply() -> str:
    chosen = operator_choice(os.environ)
    if chosen is not None:
        return f"operator: {chosen}"
    mallopt = _mallopt()
    if mallopt is None:
        return "not glibc"
    if not mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        log.warning("glibc refused malloc's thresholds; malloc left as it was")
        return "refused"
    mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)  # glibc takes any value
    log.info(
        "glibc malloc: mmap_threshold 32 MiB, trim_threshold 64 MiB, as glibc sets them itself "
        "once a 32 MiB block has been freed (tune_malloc: false leaves malloc as it is)"
    )
    return "set"


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or ``None`` under another C library."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
    except (ValueError, OSError):  # not a glibc system: the name is unknown
        return None
    try:
        function = ctypes.CDLL(None).mallopt  # the process's own symbols, glibc's among them
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int)
    function.restype = ctypes.c_int
    return function
