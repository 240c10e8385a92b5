"""The objects of a capture of msgpack payloads (``kvtier trace from-events``), within a limit.

msgpack's streaming ``Unpacker`` decodes an object of any size from a file, whatever its
``max_buffer_size`` (it keeps the part built so far, not the bytes), and a decoded object can
take 74 times its bytes (empty maps). So ``objects`` first finds where each object ends without
building it (``Unpacker.skip``), holding at most ``limit`` of its bytes, and then decodes those
bytes alone (``msgpack.unpackb``): decoding never starts on more than ``limit`` bytes.

* An object over ``limit`` bytes ends the reading (the stream cannot be resynchronised): counted.
* An object that is framed but does not decode (invalid UTF-8, a map keyed by a list) is
  skipped and counted; the next one is read.
* Bytes that are not msgpack, or an object cut off by the end of the file, end the reading:
  counted.

Runs on the caller's thread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import IO, Any

from kvtier.plan.cost import PlanInputError

READ_BYTES = 1 << 16


def objects(capture: IO[bytes], limit: int, skipped: Counter[str], over: str) -> Iterator[Any]:
    """The decoded objects of ``capture``, each from at most ``limit`` bytes; what is skipped
    or ends the reading is counted in ``skipped`` (``over`` names an object over ``limit``)."""
    msgpack = _msgpack()
    for frame in _frames(capture, limit, skipped, over):
        try:
            yield msgpack.unpackb(frame, raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            skipped[f"batches that do not decode ({type(exc).__name__})"] += 1


def _frames(capture: IO[bytes], limit: int, skipped: Counter[str], over: str) -> Iterator[bytes]:
    """The bytes of each msgpack object in ``capture`` (see ``objects``)."""
    sizer = _msgpack().Unpacker(max_buffer_size=limit + READ_BYTES)
    pending, start = bytearray(), 0  # bytes not yet framed, from stream offset ``start``
    while chunk := capture.read(READ_BYTES):
        sizer.feed(chunk)
        pending += chunk
        ends, error = _ends(sizer)
        for end in ends:
            if end - start > limit:
                break
            yield bytes(pending[: end - start])
            del pending[: end - start]
            start = end
        reason = over if len(pending) > limit else error
        if reason:
            skipped[reason] += 1
            return
    if pending:
        skipped["undecodable bytes at the end (an incomplete batch)"] += 1


def _ends(sizer: Any) -> tuple[list[int], str | None]:
    """Stream offsets where the objects fed to ``sizer`` so far end, and why the bytes after
    them are not msgpack (``None`` while they may be)."""
    msgpack, ends = _msgpack(), list[int]()
    while True:
        try:
            sizer.skip()
        except msgpack.OutOfData:
            return ends, None
        except (ValueError, msgpack.UnpackException) as exc:
            return ends, f"undecodable bytes at the end ({type(exc).__name__})"
        ends.append(sizer.tell())


def _msgpack() -> Any:
    try:
        import msgpack
    except ImportError:
        raise PlanInputError(
            "from-events needs msgpack: pip install -e '.[events]' in kvtier's clone"
        ) from None
    return msgpack
