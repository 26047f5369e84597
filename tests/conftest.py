"""Shared test fixtures: the official reference fixtures and small presets."""

from pathlib import Path

import pytest

from gclab.config import get_preset

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """`tests/data`: fixtures written by the official GraphCast code."""
    return DATA


@pytest.fixture(scope="session")
def tiny_preset():
    """The smallest CPU preset (4 deg, 3 splits, 4 x 32)."""
    return get_preset("cpu-4x32")
