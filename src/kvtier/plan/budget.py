"""``--memory-budget``: how the trace commands share out the memory they may take.

``kvtier plan`` and ``kvtier trace from-events`` take one budget (``MemoryBudget``) and split it:

* **Lines.** The longest trace line read or written is ``line_bytes``: a 256th of the budget, at
  most the format's ``MAX_LINE_BYTES`` (16 MiB, reached at 4 GiB). The reader skips and counts a
  longer line without holding it; ``from-events`` never writes one.
* **Parsing.** The reader parses lines in batches of at most ``line_bytes`` bytes. Parsing JSON
  takes at most ``PARSE_EXPANSION`` times the bytes parsed (measured worst case: nested empty
  arrays, 36x, plus the batch, its joined copy and its decoding, 4x with one astral character).
* **The plan.** The rest (``plan_bytes``) holds the trace read so far and, afterwards, its
  analysis: ``PLAN_BYTES_PER_KEY`` per chunk key and ``PLAN_BYTES_PER_REQUEST`` per request
  (measured: 69 to 76 bytes a key on synthetic mix, chat, RAG and unique traces, exact or
  sampled; about 32 more a request). A trace that needs more is refused while it is read.
* **Events.** ``from-events`` decodes msgpack batches of at most ``event_batch_bytes`` (decoding
  takes at most ``EVENT_EXPANSION`` times its bytes: empty maps, 74x measured), keeps at most
  ``parent_links`` block -> parent links (a quarter of the budget, 7/16 while they are pruned)
  and writes requests out once more than ``pending_keys`` keys wait (a quarter).

The interpreter and its libraries (about 50 MiB, 100 MiB with the chart) come on top. Frozen;
any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.plan.trace import MAX_LINE_BYTES

MiB, GiB = 1 << 20, 1 << 30
DEFAULT_MEMORY_BUDGET = 8 * GiB
MIN_MEMORY_BUDGET = 64 * MiB
MAX_MEMORY_BUDGET = 1 << 50
LINE_SHARE = 256
PARSE_EXPANSION = 48
PLAN_BYTES_PER_KEY = 96
PLAN_BYTES_PER_REQUEST = 96
EVENT_BATCH_SHARE = 1024
EVENT_EXPANSION = 96
MAX_EVENT_BATCH_BYTES = 64 * MiB
PARENT_LINK_BYTES = 256
PENDING_KEY_BYTES = 16
#: The fewest bytes a chunk key adds to a request line: 16 hex digits, 2 quotes, a comma.
LINE_BYTES_PER_KEY = 19


def text_of(n: int) -> str:
    """``n`` bytes in words: ``8 GiB``, ``1.5 GiB``, ``64 MiB``, ``300 KiB``, ``12 bytes``."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} bytes"


@dataclass(frozen=True)
class MemoryBudget:
    """``total`` bytes, shared out as the module docstring says (any ``total`` >= 1 works; the
    command line asks for at least ``MIN_MEMORY_BUDGET``)."""

    total: int = DEFAULT_MEMORY_BUDGET

    @property
    def line_bytes(self) -> int:
        """The longest line, newline excluded, that is read or written."""
        return max(1, min(MAX_LINE_BYTES, self.total // LINE_SHARE))

    @property
    def line_keys(self) -> int:
        """More chunk keys than this cannot fit in a line of ``line_bytes``."""
        return self.line_bytes // LINE_BYTES_PER_KEY

    @property
    def plan_bytes(self) -> int:
        """What the trace and its analysis may take."""
        return max(0, self.total - self.line_bytes * PARSE_EXPANSION)

    @staticmethod
    def total_for(plan_bytes: int) -> int:
        """A budget that leaves at least ``plan_bytes`` to the plan (the smallest, but for a few
        bytes of rounding)."""
        large = plan_bytes + MAX_LINE_BYTES * PARSE_EXPANSION
        if large // LINE_SHARE >= MAX_LINE_BYTES:
            return large
        return -(-(plan_bytes + PARSE_EXPANSION) * LINE_SHARE // (LINE_SHARE - PARSE_EXPANSION))

    def plan_needs(self, keys: int, requests: int) -> int:
        """Bytes the analysis of ``keys`` chunk keys in ``requests`` requests takes (estimate)."""
        return keys * PLAN_BYTES_PER_KEY + requests * PLAN_BYTES_PER_REQUEST

    @property
    def event_batch_bytes(self) -> int:
        """The largest msgpack batch ``from-events`` decodes."""
        return max(4096, min(MAX_EVENT_BATCH_BYTES, self.total // EVENT_BATCH_SHARE))

    @property
    def parent_links(self) -> int:
        return max(2, self.total // 4 // PARENT_LINK_BYTES)

    @property
    def pending_keys(self) -> int:
        return max(self.line_keys, self.total // 4 // PENDING_KEY_BYTES)

    def __str__(self) -> str:
        return f"--memory-budget {text_of(self.total)}"
