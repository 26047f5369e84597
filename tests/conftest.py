"""Shared test fixtures: the official reference fixtures and small presets.

Every process the tests start (workers of `pytest -n`, subprocesses, notebook kernels)
shares JAX's persistent compilation cache, so a step compiled once is not compiled again:
`JAX_COMPILATION_CACHE_DIR` is set here, before JAX starts, unless the caller set it. The
cache keeps every compile, not only those over JAX's default second
(`JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0`): many tests compile the same small
programs in different processes, and reading one back takes milliseconds. Measured on
two cores, `tests/` alone from an empty cache, one run each: 970 -> 870 s of wall time,
and JAX reports 86 s of compiles saved in the test processes; the whole CI (with the
chapters) took 1190 and 1195 s of pytest before and after, within its run-to-run spread.

Tests compile far more than they run, so every test process skips LLVM's optimisation of
the generated machine code (`--xla_backend_optimization_level=0` in `XLA_FLAGS`): an
XLA:CPU compile then takes about half the time, buffer assignment (and so every memory
figure) is the same, and the tiny steps the tests run take a little longer. The chapters
that nbmake runs here start with the same flags: here they are checked, not read (the
book's build, `book/run_chapters.py`, runs them with the caller's flags and times their
steps for the reader). So a step compiled by a test and by a chapter is one compile in
JAX's cache: under these flags `gclab.measure.plan_only_options` sets nothing, and a step
compiled only to be read and one compiled to run share a key. Measured on two cores, one
run each, chapter 3 alone from an empty cache: 189 s with the caller's flags, 176 s with
these, 164 s after the device-class test of chapter 3 had filled the cache; the whole CI on
a fresh clone, same machine and day: pytest 1877 -> 1762 s.

Every test process also compiles its fusions with XLA:CPU's older elemental emitter
(`--xla_cpu_use_fusion_emitters=false`) instead of the MLIR fusion emitters, as
`plan_only_options` has a compile that is only read do (`PLAN_ONLY_CPU_OPTIONS`): the
tests' flags are those options, for every compile. The two emitters form some fusions
differently (reductions, in-place updates), so the optimised HLO differs a little and so
does buffer assignment: measured on two cores, one training step at 4 deg / 3 splits,
8 x 128, compiled from shapes, compile 5.2 -> 3.0 s (`none`), 8.8 -> 4.9 s (`lean`),
compiled temp +768 bytes of 474 MiB (`none`), -0.7% (`lean`). What the tests check
(techniques lower temp by stated factors, layouts keep the gradients) holds under either;
`test_plan_only_compile_keeps_the_memory_plan` compiles with the default emitters, the
reader's compiler for a step that runs, and bounds the difference.

Every test process also compiles each program's machine code in one piece
(`--xla_cpu_parallel_codegen_split_count=1`) instead of XLA:CPU's default of splitting the
LLVM module and compiling the parts on a thread pool: the two xdist workers already keep
both cores busy, so the parts only wait for each other, and splitting has a cost of its own.
Measured on two cores, idle, four training steps at 4 deg / 3 splits, 8 x 128 compiled from
shapes under the other two flags, six runs each way, every run faster: processor time
20.0 -> 16.9 s, wall time 16.9 -> 14.9 s; two such processes at once, three runs each way:
their compiles 23.3 -> 17.7 s of wall time each. The machine code and memory plans are the
same. Chapter 3 alone under the tests' flags: 138 -> 129 s (compiles 72 -> 67 s); the whole
CI on a fresh clone, same day: pytest 1117 -> 1120 s, within its run-to-run spread.

The longest items run first (`pytest_collection_modifyitems`), so that the two xdist workers
do not end with one of them alone on a chapter started last. An `xdist_group` is handed out
where its first item stands in that order (`--no-loadscope-reorder` in pyproject.toml).
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def _jaxlib_before(major: int, minor: int) -> bool:
    """Whether the installed jaxlib is older than `major.minor` (read from its metadata:
    JAX must not start before the flags below are set)."""
    from importlib.metadata import version

    return tuple(int(p) for p in version("jaxlib").split(".")[:2]) < (major, minor)


# XLA refuses to start on a flag it does not know: jaxlib 0.11's XLA has no choice of
# XLA:CPU fusion emitter (`gclab.measure.compiled.known_options` drops it there too).
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0",
                  *(("--xla_cpu_use_fusion_emitters=false",) if _jaxlib_before(0, 11) else ()),
                  "--xla_cpu_parallel_codegen_split_count=1")
# The caller's flags, then the tests' own (inherited by xdist workers, subprocesses and the
# chapters' kernels, which then add nothing twice).
_missing = [f for f in TEST_XLA_FLAGS if f not in os.environ.get("XLA_FLAGS", "").split()]
if _missing:
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *_missing]).strip()

import pytest  # noqa: E402

from gclab.config import get_preset  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


# Items that take minutes on two cores, longest first (pytest --durations of a full run):
# the pipeline worker, chapters, the compiled-figures budget check, the multi-device
# subprocess tests, and the device classes of chapter 3. Every other item keeps its
# collection order after them. (Every item of ten seconds or more, longest first, gave no
# gain: on two idle cores, the same day, pytest took 760 s in that order and 716 and 769 s
# in this one, a spread as wide as the difference.)
LONG_FIRST = (
    "tests/parallel/test_pipeline.py",
    "book/03_remat.ipynb",
    "tests/parallel/test_layouts.py",
    "book/06_scaling.ipynb",
    "book/05_mixed_precision.ipynb",
    "book/08_beyond_one_device.ipynb",
    "tests/parallel/test_train_cli.py::test_pipeline_trains_like_one_device",
    "tests/parallel/test_train_cli.py::test_plan_over_devices",
    "book/07_full_resolution.ipynb",
    "tests/sizing/test_memory_model.py::test_sweep_timed_and_measured_on_cpu",
    "tests/test_device_classes.py::test_what_a_chapter_runs_fits_every_device_class[03-",
    "tests/parallel/test_train_cli.py::test_two_processes_train_like_one_device",
    "tests/parallel/test_train_cli.py::test_resumed_run_has_the_losses",
    "tests/sizing/test_memory_model.py::test_planner_never_exceeds_budget_with_compiled_figures",
    "book/04_xla_fusion.ipynb",
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


@pytest.fixture
def benchmarks(monkeypatch):
    """The benchmarks folder on `sys.path`, as the scripts put it there themselves (the
    tests of the benchmark scripts import them)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """`tests/data`: fixtures written by the official GraphCast code."""
    return DATA


@pytest.fixture(scope="session")
def tiny_preset():
    """The smallest CPU preset (4 deg, 3 splits, 4 x 32)."""
    return get_preset("cpu-4x32")


@pytest.fixture
def lock_file(monkeypatch):
    """`lock_file(path)` makes `open` refuse `path` with the operating system's "Permission
    denied", as a file without read permission is refused (except to root, who runs some
    test machines and reads any file)."""
    import builtins

    locked, real_open = set(), builtins.open

    def guarded_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.fspath(file) in locked:
            raise PermissionError(13, "Permission denied", os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    return lambda path: locked.add(os.fspath(path))
