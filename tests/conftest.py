"""Shared test fixtures: the official reference fixtures and small presets.

Every process the tests start (workers of `pytest -n`, subprocesses, notebook kernels)
shares JAX's persistent compilation cache, so a step compiled once is not compiled again:
`JAX_COMPILATION_CACHE_DIR` is set here, before JAX starts, unless the caller set it.

The longest items run first (`pytest_collection_modifyitems`), so that the two xdist workers
do not end with one of them alone on a chapter started last.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax"))

import pytest  # noqa: E402

from gclab.config import get_preset  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


# Items that take minutes on two cores, longest first (pytest --durations of a full run):
# chapters, the compiled-figures budget check, the multi-device subprocess tests, and the
# device classes of chapter 3. Every other item keeps its collection order after them.
LONG_FIRST = (
    "book/03_remat.ipynb",
    "tests/sizing/test_memory_model.py::test_planner_never_exceeds_budget_with_compiled_figures",
    "book/05_mixed_precision.ipynb",
    "tests/parallel/test_layouts.py",
    "book/06_scaling.ipynb",
    "book/08_beyond_one_device.ipynb",
    "tests/parallel/test_train_cli.py::test_two_processes_train_like_one_process",
    "tests/parallel/test_train_cli.py::test_resumed_run_has_the_losses",
    "book/04_xla_fusion.ipynb",
    "book/07_full_resolution.ipynb",
    "tests/test_device_classes.py::test_what_a_chapter_runs_fits_every_device_class[03-",
)


def _rank(item: pytest.Item) -> int:
    """Position of `item` in `LONG_FIRST` (by node id prefix); after them if absent."""
    for rank, prefix in enumerate(LONG_FIRST):
        if item.nodeid.startswith(prefix):
            return rank
    return len(LONG_FIRST)


def pytest_collection_modifyitems(items: list) -> None:
    """Long items first (a stable sort: the rest keep their order)."""
    items.sort(key=_rank)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """`tests/data`: fixtures written by the official GraphCast code."""
    return DATA


@pytest.fixture(scope="session")
def tiny_preset():
    """The smallest CPU preset (4 deg, 3 splits, 4 x 32)."""
    return get_preset("cpu-4x32")
