"""Transfer engine: copies chunks between an engine's KV tensors and host slots, as polled jobs.

The device side works on *chunk tensors* (``kvtier.device.pages``): one chunk byte for byte as
its host slot holds it in the canonical order of ``KVLayout`` (for an attention-only layout the
shape ``(layers, blocks, 2, kv_heads, block_size, head_dim)``), so a chunk moves to or from its
slot in one copy. ``pack_chunks`` gathers chunks out of per-layer caches and ``unpack_chunks``
scatters them back, with one strided copy per layer and K/V (never a loop over tokens).

Tensor parallelism: the engine of rank ``tp_rank`` of ``tp_size`` works on that rank's chunk
tensors (``KVLayout.rank_layout``: its own KV heads) and copies only its byte runs of each page
straight into the shared slot, so the shards of every rank of one engine consolidate in one
slot (one I/O operation per chunk for the tiers). A load reads the rank's runs back; the bytes
never depend on ``tp_size``.

Jobs: ``submit_store`` and ``submit_load`` return a job id at once; ``poll`` hands out finished
jobs exactly once, ``wait`` blocks for one. On CUDA the copies run on a dedicated stream out of
and into pinned host memory; an event marks each job's completion, and a store drops its device
tensor as soon as its event has fired. On CPU the copies are done before ``submit_*`` returns;
without tensor parallelism they go straight between the region's rows and the chunks: a load
into a new batch is one gather (``index_select``; 25 chunks of 128 KiB: 0.09 ms against 0.35 ms
chunk by chunk through ``copy_rank``); a store, or a load into given tensors, one
``torch._foreach_copy_`` against the slots seen as chunk tensors (28 chunks of 128 KiB: 0.31 ms
against 0.39-0.44 ms with one ``copy_`` per chunk; ``index_copy_`` goes element by element).

Thread safety: none; one engine thread submits and polls.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any, Literal

import torch

from kvtier.device.pages import chunk_dtype, chunk_shape, copy_rank
from kvtier.errors import KVTierError
from kvtier.layout import KVLayout
from kvtier.region import HostRegion

__all__ = ["CopyResult", "TransferEngine", "check_canonical", "slot_tensor"]

Op = Literal["store", "load"]


def check_canonical(layout: KVLayout) -> None:
    """The sections tile the slot and attention pages are layer-major (guards future layouts)."""
    offset = 0
    for section in layout.sections:
        assert section.offset == offset, "sections are not back to back"
        offset += section.nbytes
    assert layout.chunk_bytes == offset, "a slot is not exactly its sections"
    attention = layout.section("attention")
    if attention is not None:
        last, blocks = attention.layers[-1], layout.blocks_per_chunk
        end = layout.page_offset(last, blocks - 1) + layout.page_bytes
        assert end == attention.offset + attention.nbytes, "attention pages are not layer-major"


def slot_tensor(layout: KVLayout, region: HostRegion, slot: int) -> torch.Tensor:
    """Host slot ``slot`` as a chunk tensor sharing the region's memory."""
    raw: torch.Tensor = region.tensor(slot)
    return raw.view(chunk_dtype(layout)).view(chunk_shape(layout))


@dataclass
class CopyResult:
    """A finished job. ``chunks`` holds a load's data, ``(len(slots), *chunk_shape)``."""

    job_id: int
    op: Op
    slots: tuple[int, ...]
    chunks: torch.Tensor | None = None


@dataclass
class _Job:
    result: CopyResult
    event: Any = None  # torch.cuda.Event; None once the copy has landed
    keep_alive: torch.Tensor | None = None  # a store's device tensor, until its event fires


class TransferEngine:
    """Moves chunk tensors between ``device`` and the slots of ``region``, for one TP rank.

    ``device`` defaults to CUDA when ``torch.cuda.is_available()``, else CPU. Chunk tensors are
    those of ``local_layout`` (the whole layout when ``tp_size`` is 1).
    """

    def __init__(
        self,
        layout: KVLayout,
        region: HostRegion,
        device: str | torch.device | None = None,
        *,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        check_canonical(layout)
        self.local_layout = layout.rank_layout(tp_rank, tp_size)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        if region.slot_bytes != layout.chunk_bytes:
            raise KVTierError(
                f"region slots hold {region.slot_bytes} bytes, chunks need {layout.chunk_bytes}"
            )
        default = "cuda" if torch.cuda.is_available() else "cpu"
        self.layout, self.region = layout, region
        self.device = torch.device(device if device is not None else default)
        self.dtype = chunk_dtype(self.local_layout)
        cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if cuda else None  # type: ignore[no-untyped-call]
        batched = self.device.type == "cpu" and tp_size == 1
        self._rows: torch.Tensor | None = region.rows() if batched else None
        self._slot_chunks = (
            None if self._rows is None else _as_chunks(self._rows, self.local_layout)
        )
        self._ids = count()
        self._jobs: dict[int, _Job] = {}

    def submit_store(self, chunks: torch.Tensor, slots: Sequence[int]) -> int:
        """Copy ``chunks[i]`` into host slot ``slots[i]``; returns the job id."""
        self._check(chunks, slots)
        job = _Job(CopyResult(next(self._ids), "store", tuple(slots)))
        with self._on_stream():
            if self._slot_chunks is not None:
                torch._foreach_copy_([self._slot_chunks[s] for s in slots], chunks.unbind(0))
            else:
                for chunk, slot in zip(chunks, slots, strict=True):
                    self._copy(chunk, slot, to_slot=True)
            job.event, job.keep_alive = self._record(), chunks
        self._jobs[job.result.job_id] = job
        return job.result.job_id

    def submit_load(self, slots: Sequence[int], out: Sequence[torch.Tensor] | None = None) -> int:
        """Copy host ``slots`` into device chunk tensors; returns the job id.

        Into ``out[i]`` when ``out`` is given (one contiguous chunk tensor per slot, e.g. the
        engine's own KV slots: no new memory; ``CopyResult.chunks`` is then ``None``), else
        into a new tensor (``CopyResult.chunks``). ``out`` must stay untouched until the job
        is handed out. A wrong ``out``: ``KVTierError``, before any copy.
        """
        if out is not None:
            self._check_out(out, slots)
        shape = (len(slots), *chunk_shape(self.local_layout))
        targets = torch.empty(shape, dtype=self.dtype, device=self.device) if out is None else out
        batch = targets if isinstance(targets, torch.Tensor) else None
        job = _Job(CopyResult(next(self._ids), "load", tuple(slots), batch))
        with self._on_stream():
            if batch is not None and self._rows is not None:
                torch.index_select(self._rows, 0, _index(slots), out=_byte_rows(batch))
            else:
                self._load_each(slots, targets)
            job.event = self._record()
        self._jobs[job.result.job_id] = job
        return job.result.job_id

    def poll(self) -> list[CopyResult]:
        """Finished jobs since the last call, each handed out once."""
        done = [job_id for job_id, job in self._jobs.items() if self._landed(job)]
        return [self._take(job_id) for job_id in done]

    def wait(self, job_id: int, timeout: float | None = None) -> CopyResult:
        """Block until job ``job_id`` has finished and hand it out (then ``poll`` won't)."""
        job = self._jobs[job_id]
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._landed(job):
            if deadline is not None and time.monotonic() > deadline:
                raise KVTierError(f"transfer job {job_id} did not finish in {timeout} s")
            if deadline is None:
                job.event.synchronize()
            else:
                time.sleep(0.0001)
        return self._take(job_id)

    def tracks(self, job_id: int) -> bool:
        """Whether job ``job_id`` is still to be handed out (by ``poll`` or ``wait``)."""
        return job_id in self._jobs

    @property
    def num_pending_jobs(self) -> int:
        return len(self._jobs)

    # -- helpers -----------------------------------------------------------------------------
    def _copy(self, chunk: torch.Tensor, slot: int, to_slot: bool) -> None:
        raw = self.region.tensor(slot)
        copy_rank(chunk, raw, self.layout, self.tp_rank, self.tp_size, to_slot)

    def _load_each(self, slots: Sequence[int], out: Sequence[torch.Tensor] | torch.Tensor) -> None:
        if self._slot_chunks is not None:
            torch._foreach_copy_(list(out), [self._slot_chunks[s] for s in slots])
            return
        for chunk, slot in zip(out, slots, strict=True):
            self._copy(chunk, slot, to_slot=False)

    def _check_out(self, out: Sequence[torch.Tensor], slots: Sequence[int]) -> None:
        shape = chunk_shape(self.local_layout)
        for chunk in out:
            if (
                not isinstance(chunk, torch.Tensor)
                or tuple(chunk.shape) != shape
                or chunk.dtype != self.dtype
                or not _on(chunk, self.device)
                or not chunk.is_contiguous()
            ):
                raise KVTierError(f"out: expected contiguous {shape} {self.dtype} on {self.device}")
        if len(out) != len(slots):
            raise KVTierError(f"out: {len(out)} chunk tensors for {len(slots)} slots")

    def _check(self, chunks: torch.Tensor, slots: Sequence[int]) -> None:
        expected = (len(slots), *chunk_shape(self.local_layout))
        if tuple(chunks.shape) != expected or chunks.dtype != self.dtype:
            raise KVTierError(
                f"chunks of shape {tuple(chunks.shape)} {chunks.dtype}, expected "
                f"{expected} {self.dtype}"
            )

    def _on_stream(self) -> Any:
        if self._stream is None:
            return _NoStream()
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self._stream)

    def _record(self) -> Any:
        if self._stream is None:
            return None
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(self._stream)
        return event

    def _landed(self, job: _Job) -> bool:
        if job.event is not None and not job.event.query():
            return False
        job.event, job.keep_alive = None, None  # releases a store's device memory at once
        return True

    def _take(self, job_id: int) -> CopyResult:
        return self._jobs.pop(job_id).result


def _on(chunk: torch.Tensor, device: torch.device) -> bool:
    """Whether ``chunk`` lies on ``device`` ("cuda" without an index: any CUDA device)."""
    same_index = device.index is None or chunk.device.index == device.index
    return chunk.device.type == device.type and same_index


def _as_chunks(rows: torch.Tensor, layout: KVLayout) -> torch.Tensor:
    """The region's ``(slots, slot bytes)`` rows as ``(slots, *chunk_shape)`` chunk tensors."""
    return rows.view(chunk_dtype(layout)).view(len(rows), *chunk_shape(layout))


def _index(slots: Sequence[int]) -> torch.Tensor:
    return torch.tensor(slots, dtype=torch.long)


def _byte_rows(chunks: torch.Tensor) -> torch.Tensor:
    """A contiguous chunk batch as ``(chunks, chunk bytes)`` uint8, sharing its memory."""
    return chunks.view(len(chunks), -1).view(torch.uint8)


class _NoStream:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
