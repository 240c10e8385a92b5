"""An admission policy of a user's own, loaded by ``module_path`` in the admission tests."""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.control.admission import Offer


class EvenFirstByte:
    """Keeps chunks whose key starts with an even byte (``parity`` flips it)."""

    def __init__(self, parity: int = 0) -> None:
        self.parity = parity

    def admit(self, offer: Offer) -> Sequence[str | None]:
        return [None if key[0] % 2 == self.parity else "odd_byte" for key in offer.keys]


class Broken:
    """A policy with a bug: ``mode`` "raise" raises, "short" answers for one key fewer,
    "bad" answers a number where a reason belongs."""

    def __init__(self, mode: str = "raise") -> None:
        self.mode = mode

    def admit(self, offer: Offer) -> Sequence[str | None]:
        if self.mode == "raise":
            raise ZeroDivisionError("a bug in the policy")
        if self.mode == "short":
            return [None] * (len(offer.keys) - 1)
        return [7] * len(offer.keys)  # type: ignore[list-item]
