"""Fixtures of the obj tier's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvtier.tiers.s3.tier import ObjectStoreTier


@pytest.fixture
def tiers() -> Iterator[list[ObjectStoreTier]]:
    """Tiers a test makes (it appends them); closed after the test."""
    made: list[ObjectStoreTier] = []
    yield made
    for tier in made:
        tier.close()
