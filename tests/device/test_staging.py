"""StackBuffer: ``torch.stack`` into a buffer kept across calls, within its bound."""

from __future__ import annotations

import torch

from kvtier.device.staging import StackBuffer


def chunks(
    count: int, shape: tuple[int, ...] = (2, 4), dtype: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    return [torch.full(shape, float(i), dtype=dtype) for i in range(count)]


def test_it_stacks_like_torch_stack_and_reuses_its_buffer() -> None:
    buffer = StackBuffer()
    first = buffer.stack(chunks(3))
    assert first is not None and torch.equal(first, torch.stack(chunks(3)))
    second = buffer.stack(chunks(2)[::-1])
    assert second is not None and torch.equal(second, torch.stack(chunks(2)[::-1]))
    assert second.data_ptr() == first.data_ptr()


def test_a_larger_batch_grows_the_buffer_and_a_smaller_one_fits_in_it() -> None:
    buffer = StackBuffer()
    small = buffer.stack(chunks(2))
    large = buffer.stack(chunks(5))
    assert large is not None and small is not None and torch.equal(large, torch.stack(chunks(5)))
    again = buffer.stack(chunks(3))
    assert again is not None and again.data_ptr() == large.data_ptr()


def test_another_format_gets_a_new_buffer() -> None:
    buffer = StackBuffer()
    buffer.stack(chunks(2))
    other = buffer.stack(chunks(2, shape=(3,), dtype=torch.float64))
    assert other is not None and other.dtype == torch.float64 and other.shape == (2, 3)
    assert torch.equal(other, torch.stack(chunks(2, shape=(3,), dtype=torch.float64)))


def test_a_batch_over_the_bound_gets_a_tensor_of_its_own() -> None:
    """Bound 64 bytes, chunks of 32: two are kept in the buffer, three are not."""
    buffer = StackBuffer(max_bytes=64)
    kept = buffer.stack(chunks(2))
    alone = buffer.stack(chunks(3))
    assert kept is not None and alone is not None and torch.equal(alone, torch.stack(chunks(3)))
    assert alone.data_ptr() != kept.data_ptr()
    assert torch.equal(kept, torch.stack(chunks(2)))  # left as it was
    assert buffer.stack([]) is None
