"""The checks ``TieredModel`` runs on a caller's arguments before any work.

Each returns the argument in the one form the engine uses, or raises ``InvalidArgumentError``
(also a ``ValueError``) naming it: nothing reaches the model, the device cache or the manager
that would fail deep inside torch, run past the model's positions, or key a request wrongly.

Thread safety: pure functions; any thread.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
import torch

from kvtier.errors import InvalidArgumentError, shown


@dataclass(frozen=True)
class ModelLimits:
    """Token ids the model embeds (``0 .. vocab_size - 1``) and positions it has (``None``: no
    limit known, e.g. a state-space model)."""

    vocab_size: int
    max_positions: int | None

    @classmethod
    def of(cls, model: Any) -> ModelLimits:
        """The limits in ``model``'s (text) config; its input embeddings give the vocabulary
        when the config has no ``vocab_size``."""
        config = model.config.get_text_config(decoder=True)
        vocab = getattr(config, "vocab_size", None)
        if not _is_integer(vocab):
            vocab = model.get_input_embeddings().num_embeddings
        positions = getattr(config, "max_position_embeddings", None)
        return cls(int(vocab), int(positions) if _is_integer(positions) else None)

    def decode_steps(self, prompt_tokens: int, max_new_tokens: int) -> int:
        """Tokens to decode after the first: ``max_new_tokens - 1``, but none past the last
        position (the first generated token comes from the prompt's and needs none)."""
        wanted = max_new_tokens - 1
        if self.max_positions is None:
            return wanted
        return max(0, min(wanted, self.max_positions - prompt_tokens))


def prompt_ids(token_ids: object, limits: ModelLimits) -> list[int]:
    """``token_ids`` as a list of ints: a non-empty sequence of integers (never bools), or a 1-D
    integer numpy array or tensor, each in ``0 .. vocab_size - 1``, no longer than the model's
    positions. Text, sets, iterators and floats are refused."""
    tokens = _as_int_list(token_ids)
    if not tokens:
        raise InvalidArgumentError("token_ids: the prompt is empty")
    if limits.max_positions is not None and len(tokens) > limits.max_positions:
        raise InvalidArgumentError(
            f"token_ids: {len(tokens)} tokens, the model has {limits.max_positions} positions"
        )
    if min(tokens) < 0 or max(tokens) >= limits.vocab_size:  # at C speed: every request
        bad = next(t for t in tokens if not 0 <= t < limits.vocab_size)
        raise InvalidArgumentError(
            f"token_ids: {shown(bad)} is not a token id (0 to {limits.vocab_size - 1})"
        )
    return tokens


def _as_int_list(token_ids: object) -> list[int]:
    """The integers of a sequence, array or tensor, in order; ``InvalidArgumentError`` else."""
    if isinstance(token_ids, np.ndarray | torch.Tensor):
        return _array_ids(token_ids)
    if not isinstance(token_ids, Sequence) or isinstance(token_ids, str | bytes | bytearray):
        raise InvalidArgumentError(
            f"token_ids: expected a sequence of token ids, got {type(token_ids).__name__}"
        )
    return _integers("token_ids", token_ids)


def _array_ids(array: np.ndarray[Any, Any] | torch.Tensor) -> list[int]:
    """A 1-D numpy array or tensor of integers (not bools) as a list of ints."""
    if array.ndim != 1 or not _integral_dtype(array):
        raise InvalidArgumentError(
            f"token_ids: expected a 1-D array of integers, got {array.ndim}-D {array.dtype}"
        )
    return [int(t) for t in array.tolist()]


def _integral_dtype(array: np.ndarray[Any, Any] | torch.Tensor) -> bool:
    if isinstance(array, np.ndarray):
        return array.dtype.kind in "iu"
    dtype = array.dtype
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def new_token_count(max_new_tokens: object) -> int:
    """``max_new_tokens`` as an int >= 1 (an integer, never a bool or a float)."""
    if not _is_integer(max_new_tokens) or max_new_tokens < 1:
        raise InvalidArgumentError(
            f"max_new_tokens: expected an integer >= 1, got {shown(max_new_tokens)}"
        )
    return int(max_new_tokens)


def stop_set(stop_tokens: object) -> frozenset[int]:
    """``stop_tokens`` (any iterable of integers but text; an iterator is read once) as a set;
    ids no token has are allowed, and never match."""
    if not isinstance(stop_tokens, Iterable) or isinstance(stop_tokens, str | bytes | bytearray):
        raise InvalidArgumentError(
            f"stop_tokens: expected a collection of token ids, got {shown(stop_tokens)}"
        )
    return frozenset(_integers("stop_tokens", list(stop_tokens)))


def retry_timeout(value: object) -> float:
    """``retry_timeout_s`` as seconds: a finite real number >= 0 (``inf`` would wait for ever
    on a lookup that never settles; NaN on nothing)."""
    try:
        seconds = float(value) if isinstance(value, numbers.Real) else math.nan
    except OverflowError:  # an int past the floats
        seconds = math.inf
    if isinstance(value, bool) or not (math.isfinite(seconds) and seconds >= 0):
        raise InvalidArgumentError(
            f"retry_timeout_s: expected a finite number of seconds >= 0, got {shown(value)}"
        )
    return seconds


def key_salt(salt: object) -> str | bytes | None:
    """``salt`` if it is text, bytes or ``None``: anything else would be turned into bytes in a
    way that makes two different salts (``5``, five zero bytes) or none (``0``) share keys."""
    if salt is not None and not isinstance(salt, str | bytes):
        raise InvalidArgumentError(f"salt: expected text, bytes or None, got {shown(salt)}")
    return salt


def _integers(where: str, values: Sequence[object]) -> list[int]:
    """``values`` as ints; ``InvalidArgumentError`` naming ``where`` for one that is not."""
    if set(map(type, values)) <= {int}:  # plain ints (a bool's type is bool), at C speed
        return list(values)  # type: ignore[arg-type]
    integers = []
    for value in values:
        if not _is_integer(value):
            raise InvalidArgumentError(f"{where}: {shown(value)} is not an integer")
        integers.append(int(value))
    return integers


def _is_integer(value: object) -> TypeGuard[int]:
    """An int or other integral number (``numpy.int64``), never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)
