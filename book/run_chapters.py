"""Run the book's chapters into Jupyter Book's execution cache, several at a time.

    python book/run_chapters.py && jupyter-book build . -W --keep-going

`jupyter-book build` (``execute_notebooks: cache`` in ``_config.yml``) runs every chapter
its cache (jupyter-cache, in ``_build/.jupyter_cache``) holds no outputs for, one after
the other. This script fills that cache first, running chapters side by side, so that the
build which follows finds every chapter there and only renders. It uses jupyter-cache's
own execution worker (the one behind its ``local-parallel`` executor) and chooses only
the pool, which that executor does not let one choose (it starts one process per core):

- one chapter at a time where JAX has an accelerator plugin installed (CUDA, ROCm, TPU):
  chapters side by side would share one accelerator, and each sizes what it runs live by
  the memory the device has free;
- otherwise (XLA:CPU) as many at once as the machine has cores, no more than its memory
  holds (``GIB_PER_CHAPTER`` each), and at most ``--jobs``.

Where the chapters then take every core (XLA:CPU, as many at once as cores), their kernels
compile each program's machine code in one piece: ``--xla_cpu_parallel_codegen_split_count=1``
is added to the caller's ``XLA_FLAGS`` unless they set it (``kernel_xla_flags``). By default
XLA:CPU splits the LLVM module and compiles the parts on a thread pool, which only helps
where a core is idle, and splitting has a cost of its own. Measured on two cores, idle,
four training steps compiled at XLA's default level, three runs each way: processor time
67.7 -> 61.4 s, wall time 42.0 -> 37.2 s; the machine code runs as fast and the memory
plans are the same. The whole build on the same machine did not show it beyond its
run-to-run spread (880 s of the kernels' processor time, against 878 s before; the README's
record). Every chapter's hardware table prints the flags it ran with.

The longest chapters start first (the times of the last recorded book build,
``benchmarks/results/book-build-cpu.json``), so that no core is left alone on a long
chapter started last. A chapter the cache already holds (unchanged since it last ran) is
not run again. If a chapter fails, the script names it, shows the end of its traceback,
and exits with 1; the chapters that ran are kept in the cache.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import yaml
from jupyter_cache import get_cache

# The worker behind jupyter-cache's `local-parallel` executor: executes one project
# notebook in its own folder and caches its outputs (it must be picklable, and is).
from jupyter_cache.executors.basic import ExecutionWorkerLocalMProc, ProcessData

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path("_build", ".jupyter_cache")  # Jupyter Book's default execution cache
RECORDED = Path("benchmarks", "results", "book-build-cpu.json")
# Largest resident memory of one chapter's kernel on XLA:CPU, rounded up: 4.7 GiB, measured
# with this script on 2 cores (`max chapter memory` in its last line).
GIB_PER_CHAPTER = 5


# XLA:CPU's flag for the number of parts an LLVM module is split into for compiling.
SPLIT_FLAG = "--xla_cpu_parallel_codegen_split_count"


def kernel_xla_flags(flags: str, size: int, cores: int, accelerator: bool) -> str:
    """The kernels' ``XLA_FLAGS``: the caller's `flags`, plus ``SPLIT_FLAG=1`` where `size`
    chapters at once on XLA:CPU (no `accelerator`) take all `cores` and the caller did not
    set the flag."""
    named = {f.split("=", 1)[0] for f in flags.split()}
    if accelerator or size < cores or SPLIT_FLAG in named:
        return flags
    return " ".join([*flags.split(), f"{SPLIT_FLAG}=1"])


@contextlib.contextmanager
def kernel_xla_environment(flags: str):
    """Within the block, this process's ``XLA_FLAGS`` (which the kernels it starts inherit)
    are `flags`; afterwards, the caller's again, also if the block fails."""
    callers = os.environ.get("XLA_FLAGS")
    if flags:
        os.environ["XLA_FLAGS"] = flags
    try:
        yield
    finally:
        if callers is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = callers


def chapters(root: Path) -> list[Path]:
    """The notebooks of the book's table of contents (`_toc.yml`), in its order."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return [root / f"{f}.ipynb" for f in files if (root / f"{f}.ipynb").is_file()]


def recorded_seconds(root: Path) -> dict[str, float]:
    """Each chapter's execution time in the last recorded book build (empty if none)."""
    try:
        return json.loads((root / RECORDED).read_text())["chapter_execution_seconds"]
    except (OSError, ValueError, KeyError):
        return {}


def has_accelerator_plugin() -> bool:
    """Whether JAX could find an accelerator here, looked up without starting JAX (which
    would take the accelerator's memory in this process): a PJRT plugin where JAX looks
    for one (the `jax_plugins` namespace package and entry-point group: CUDA, ROCm, Metal)
    or TPU's `libtpu`, unless the caller asked for the CPU (`JAX_PLATFORMS=cpu`)."""
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return False
    if importlib.metadata.entry_points(group="jax_plugins"):
        return True
    return any(importlib.util.find_spec(name) is not None for name in ("jax_plugins", "libtpu"))


def host_memory_gib() -> float | None:
    """This machine's memory, or None where the system does not say (no `sysconf`)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (AttributeError, ValueError, OSError):
        return None


def pool_size(jobs: int | None, pending: int) -> int:
    """How many chapters run at once (see the module's docstring); where the memory is
    unknown, `jobs` (or 1)."""
    if has_accelerator_plugin():
        return 1
    memory = host_memory_gib()
    fits = max(1, int(memory // GIB_PER_CHAPTER)) if memory is not None else (jobs or 1)
    return max(1, min(os.cpu_count() or 1, fits, jobs or pending, pending))


def children_peak_gib() -> float | None:
    """Largest resident memory of a finished child process (a chapter's kernel), if the
    system reports it (`resource`: not on Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20  # bytes there, else KiB


def children_cpu_seconds() -> float | None:
    """Processor time (user + system) of the finished child processes and theirs: the
    chapters' kernels, each waited for by its worker. None where the system does not report
    it (`resource`: not on Windows)."""
    try:
        import resource
    except ImportError:
        return None
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def execution_options(root: Path) -> tuple[int, bool]:
    """`execute.timeout` and `execute.allow_errors` of `_config.yml`, as the build uses."""
    execute = yaml.safe_load((root / "_config.yml").read_text()).get("execute", {})
    return int(execute.get("timeout", 30)), bool(execute.get("allow_errors", False))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        self.exit(2, f"run_chapters: {message}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(description=__doc__.split("\n\n")[1].strip())

    def jobs(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(
                f"a whole number of chapters at once, at least 1 (got {text!r})")
        return int(text)

    parser.add_argument("--jobs", type=jobs, default=None,
                        help="most chapters at once (default: as many as cores and memory "
                             "allow on XLA:CPU, 1 with an accelerator)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    """Runs the chapters of the book in `root` that its cache lacks; 1 if any failed."""
    args = parse_args(argv)
    cache = get_cache(root / CACHE)
    uris = {cache.add_nb_to_project(str(path)).uri for path in chapters(root)}
    seconds = recorded_seconds(root)
    pending = sorted((r for r in cache.list_unexecuted() if r.uri in uris),
                     key=lambda r: -seconds.get(Path(r.uri).name, 1e9))
    if not pending:
        print("run_chapters: every chapter is in the cache already")
        return 0
    timeout, allow_errors = execution_options(root)
    size = pool_size(args.jobs, len(pending))
    flags = kernel_xla_flags(os.environ.get("XLA_FLAGS", ""), size, os.cpu_count() or 1,
                             has_accelerator_plugin())
    print(f"run_chapters: {len(pending)} chapters, {size} at a time"
          + (f"; XLA_FLAGS={flags}" if flags else ""), flush=True)
    work = [ProcessData(r.pk, r.uri, cache, timeout, allow_errors) for r in pending]
    started, failed, cpu_before = time.monotonic(), [], children_cpu_seconds()
    with kernel_xla_environment(flags):
        # Spawned, not forked: a forked copy of a process that has started JAX's threads (a
        # test, a notebook) can deadlock on a lock one of them held.
        pool = multiprocessing.get_context("spawn").Pool(size)
        for code, uri in pool.imap_unordered(ExecutionWorkerLocalMProc(), work, chunksize=1):
            took = time.monotonic() - started
            state = "FAILED" if code else "done"
            print(f"run_chapters: {Path(uri).name} {state} ({took:.0f} s since start)",
                  flush=True)
            if code:
                failed.append(uri)
        pool.close()
        pool.join()  # the workers end (and wait for their kernels): their memory is counted
    peak, cpu = children_peak_gib(), children_cpu_seconds()
    # Processor time bounds what running side by side can give: on N cores the chapters
    # take at least cpu / N seconds however they are scheduled.
    used = f"; {cpu - cpu_before:.0f} s of processor time" if cpu is not None else ""
    memory = f"; max chapter memory {peak:.1f} GiB" if peak is not None else ""
    print(f"run_chapters: {len(pending) - len(failed)} of {len(pending)} chapters in "
          f"{time.monotonic() - started:.0f} s, {size} at a time{used}{memory}", flush=True)
    for uri in failed:
        record = cache.get_project_record(uri)
        tail = "\n".join((record.traceback or "no traceback recorded").splitlines()[-15:])
        print(f"\n{Path(uri).name} failed:\n{tail}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
