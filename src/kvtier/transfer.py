"""Transfer engine: copies chunks between an engine's KV tensors and host slots, as polled jobs.

The device side works on *chunk tensors* in the canonical page order of DESIGN.md. One chunk is
a tensor of shape ``(layers, blocks, 2, kv_heads, block_size, head_dim)``: for each layer, for
each block of the chunk, one page holding K then V of every head. That is byte for byte the
layout of a host slot (``KVLayout.page_offset``), so a chunk moves to or from its slot in one
copy. ``pack_chunks`` gathers chunks out of per-layer K/V tensors and ``unpack_chunks`` scatters
them back, with one strided copy per layer and K/V (never a loop over tokens).

Jobs: ``submit_store`` and ``submit_load`` return a job id at once; ``poll`` hands out finished
jobs exactly once, ``wait`` blocks for one. On CUDA the copies run on a dedicated stream out of
and into pinned host memory; an event marks each job's completion, and a store drops its device
tensor as soon as its event has fired. On CPU the copies are done before ``submit_*`` returns.

Thread safety: none; one engine thread submits and polls.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any, Literal

import torch

from kvtier.errors import KVTierError
from kvtier.layout import KVLayout
from kvtier.region import HostRegion

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "uint8": torch.uint8,
}

Op = Literal["store", "load"]
KV = tuple[torch.Tensor, torch.Tensor]  # one layer's K and V


def chunk_shape(layout: KVLayout) -> tuple[int, int, int, int, int, int]:
    """Shape of one canonical chunk tensor: (layers, blocks, K/V, kv heads, block size, dim)."""
    return (
        layout.num_layers,
        layout.blocks_per_chunk,
        2,
        layout.num_kv_heads,
        layout.block_size,
        layout.head_dim,
    )


def check_canonical(layout: KVLayout) -> None:
    """The chunk tensor's strides must be the layout's page offsets (guards future layouts)."""
    layers, blocks, _, heads, _, _ = chunk_shape(layout)
    page = layout.page_bytes
    last = layout.page_offset(layers - 1, blocks - 1)
    assert last == ((layers - 1) * blocks + blocks - 1) * page, "pages are not layer-major"
    assert page == 2 * heads * layout.head_bytes, "a page is not K ++ V of every head"
    assert layout.chunk_bytes == last + page, "a slot is not exactly its pages"


def slot_tensor(layout: KVLayout, region: HostRegion, slot: int) -> torch.Tensor:
    """Host slot ``slot`` as a canonical chunk tensor sharing the region's memory."""
    raw: torch.Tensor = region.tensor(slot)
    return raw.view(TORCH_DTYPES[layout.dtype]).view(chunk_shape(layout))


def _as_heads(tensor: torch.Tensor, layout: KVLayout) -> torch.Tensor:
    """A layer's K or V, ``[1, H, T, D]`` or ``[H, T, D]``, as ``[H, T, D]``."""
    if tensor.dim() == 4:
        if tensor.shape[0] != 1:
            raise KVTierError("pack_chunks: only batch size 1 is supported")
        tensor = tensor[0]
    if tensor.shape[0] != layout.num_kv_heads or tensor.shape[-1] != layout.head_dim:
        raise KVTierError(f"KV tensor of shape {tuple(tensor.shape)} does not match {layout}")
    return tensor


def pack_chunks(
    layers: Sequence[KV],
    layout: KVLayout,
    first_chunk: int,
    num_chunks: int,
) -> torch.Tensor:
    """Chunks ``first_chunk ..`` of per-layer (K, V) tensors as ``(num_chunks, *chunk_shape)``.

    Each K/V is ``[1, H, T, D]`` or ``[H, T, D]`` with ``T`` covering the chunks asked for.
    """
    if len(layers) != layout.num_layers:
        raise KVTierError(f"pack_chunks: {len(layers)} layers given, layout has {layout}")
    _, blocks, _, heads, block_size, dim = chunk_shape(layout)
    per_chunk = layout.tokens_per_chunk
    start, stop = first_chunk * per_chunk, (first_chunk + num_chunks) * per_chunk
    sample = layers[0][0]
    out = torch.empty((num_chunks, *chunk_shape(layout)), dtype=sample.dtype, device=sample.device)
    for index, kv in enumerate(layers):
        for side, tensor in enumerate(kv):
            span = _as_heads(tensor, layout)[:, start:stop]
            if span.shape[1] != stop - start:
                raise KVTierError(f"pack_chunks: KV holds {tensor.shape[-2]} tokens, needs {stop}")
            pages = span.reshape(heads, num_chunks, blocks, block_size, dim).permute(1, 2, 0, 3, 4)
            out[:, index, :, side].copy_(pages)
    return out


def unpack_chunks(chunks: torch.Tensor, layout: KVLayout) -> list[KV]:
    """Per-layer (K, V), each ``[1, H, N * tokens_per_chunk, D]``, from ``(N, *chunk_shape)``."""
    num_chunks = chunks.shape[0]
    tokens = num_chunks * layout.tokens_per_chunk
    shape = (1, layout.num_kv_heads, tokens, layout.head_dim)
    layers = []
    for index in range(layout.num_layers):
        per_side = chunks[:, index].permute(2, 3, 0, 1, 4, 5)  # K/V, H, N, B, bs, D
        k, v = (per_side[side].reshape(shape) for side in (0, 1))
        layers.append((k, v))
    return layers


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
    """Moves chunk tensors between ``device`` and the slots of ``region``.

    ``device`` defaults to CUDA when ``torch.cuda.is_available()``, else CPU.
    """

    def __init__(
        self, layout: KVLayout, region: HostRegion, device: str | torch.device | None = None
    ) -> None:
        check_canonical(layout)
        if region.slot_bytes != layout.chunk_bytes:
            raise KVTierError(f"region slots hold {region.slot_bytes} bytes, chunks need "
                              f"{layout.chunk_bytes}")  # fmt: skip
        default = "cuda" if torch.cuda.is_available() else "cpu"
        self.layout, self.region = layout, region
        self.device = torch.device(device if device is not None else default)
        self.dtype = TORCH_DTYPES[layout.dtype]
        cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if cuda else None  # type: ignore[no-untyped-call]
        self._ids = count()
        self._jobs: dict[int, _Job] = {}

    def submit_store(self, chunks: torch.Tensor, slots: Sequence[int]) -> int:
        """Copy ``chunks[i]`` into host slot ``slots[i]``; returns the job id."""
        self._check(chunks, slots)
        job = _Job(CopyResult(next(self._ids), "store", tuple(slots)))
        with self._on_stream():
            for chunk, slot in zip(chunks, slots, strict=True):
                slot_tensor(self.layout, self.region, slot).copy_(chunk, non_blocking=True)
            job.event, job.keep_alive = self._record(), chunks
        self._jobs[job.result.job_id] = job
        return job.result.job_id

    def submit_load(self, slots: Sequence[int]) -> int:
        """Copy host ``slots`` into a new device tensor (``CopyResult.chunks``); returns the id."""
        shape = (len(slots), *chunk_shape(self.layout))
        out = torch.empty(shape, dtype=self.dtype, device=self.device)
        job = _Job(CopyResult(next(self._ids), "load", tuple(slots), out))
        with self._on_stream():
            for index, slot in enumerate(slots):
                host = slot_tensor(self.layout, self.region, slot)
                out[index].copy_(host, non_blocking=True)
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

    @property
    def num_pending_jobs(self) -> int:
        return len(self._jobs)

    # -- helpers -----------------------------------------------------------------------------
    def _check(self, chunks: torch.Tensor, slots: Sequence[int]) -> None:
        expected = (len(slots), *chunk_shape(self.layout))
        if tuple(chunks.shape) != expected or chunks.dtype != self.dtype:
            raise KVTierError(f"chunks of shape {tuple(chunks.shape)} {chunks.dtype}, expected "
                              f"{expected} {self.dtype}")  # fmt: skip

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


class _NoStream:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
