"""Shared test fixtures: the official reference fixtures and small presets.

Every process the tests start (workers of `pytest -n`, subprocesses, notebook kernels)
shares JAX's persistent compilation cache, so a step compiled once is not compiled again:
`JAX_COMPILATION_CACHE_DIR` is set here, before JAX starts, unless the caller set it.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax"))

import pytest  # noqa: E402

from gclab.config import get_preset  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """`tests/data`: fixtures written by the official GraphCast code."""
    return DATA


@pytest.fixture(scope="session")
def tiny_preset():
    """The smallest CPU preset (4 deg, 3 splits, 4 x 32)."""
    return get_preset("cpu-4x32")
