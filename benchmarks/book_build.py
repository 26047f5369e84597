"""Benchmark: the README's "build the book" command on a fresh clone, timed per chapter.

Clones the repository (committed state) into a temporary folder and runs the README's
build command there, in a new virtual environment of its own (as on a fresh machine:
``pip install -r requirements.txt`` downloads and installs everything, then
``python book/run_chapters.py`` executes the chapters side by side into jupyter-cache, and
``jupyter-book build . -W --keep-going`` renders them from there).
Reads each chapter's execution time from the cache the build writes
(``_build/.jupyter_cache``) and writes ``benchmarks/results/book-build-<backend>.json``
with the hardware, date, commit and the load average before and after (a busy machine
inflates every time). The environment this script runs in is left untouched.
``--system-packages`` lets the new environment see this Python's installed packages
(pip then installs only what is missing).

Usage:
  python benchmarks/book_build.py [--system-packages] [--keep DIR]
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from fresh_clone import FreshClone, arguments, hardware, write_record

STEP_NAMES = {"pip": "pip install", "python": "run chapters", "jupyter-book": "jupyter-book build"}


def _chapter_seconds(build_dir: Path) -> dict[str, float]:
    from jupyter_cache import get_cache

    cache = get_cache(build_dir / ".jupyter_cache")
    out = {}
    for record in cache.list_cache_records():
        seconds = (record.data or {}).get("execution_seconds")
        if seconds is not None:
            out[Path(record.uri).name] = round(float(seconds), 1)
    return dict(sorted(out.items()))


def _chapters_at_once(log: Path) -> int:
    """How many chapters `book/run_chapters.py` ran at once (from its first line)."""
    found = re.search(r"chapters, (\d+) at a time", log.read_text())
    if found is None:
        raise ValueError(f"{log} does not say how many chapters ran at once")
    return int(found.group(1))


def _chapter_cpu_seconds(log: Path) -> float | None:
    """Processor time of the chapters' kernels (`book/run_chapters.py`'s last line), if the
    system reported it."""
    found = re.search(r"; (\d+) s of processor time", log.read_text())
    return float(found.group(1)) if found else None


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, argv)

    fresh = FreshClone(args.keep, "gclab_book_", args.system_packages)
    steps = [["pip", "install", "-q", "-r", "requirements.txt"],
             ["python", "book/run_chapters.py"],
             ["jupyter-book", "build", ".", "-W", "--keep-going"]]
    step_seconds, run_log = {}, fresh.work / "run_chapters.log"
    load_before = round(os.getloadavg()[0], 2)
    for command in steps:
        code, seconds = fresh.run(command, log=run_log if command[0] == "python" else None)
        if code:
            print(f"failed ({code}): {' '.join(command)}", file=sys.stderr)
            return code
        step_seconds[STEP_NAMES[command[0]]] = seconds
    build = fresh.clone / "_build"
    record = {
        "benchmark": "README build command on a fresh clone",
        "command": " && ".join(" ".join(c) for c in steps),
        "environment": fresh.environment,
        "commit": fresh.commit,
        "hardware": hardware(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "load_average_1min": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
        "total_seconds": round(sum(step_seconds.values()), 1),
        "step_seconds": step_seconds,
        # Each chapter's time while it shared the machine with the others running beside it.
        "chapter_execution_seconds": _chapter_seconds(build),
        "chapters_at_once": _chapters_at_once(run_log),
        # User + system time of all the chapters' kernels: divided by the cores, the least
        # time any schedule of them can take on this machine.
        "chapter_cpu_seconds": _chapter_cpu_seconds(run_log),
        "html_pages": sorted(p.name for p in (build / "html" / "book").glob("*.html")),
    }
    write_record("book-build", record)
    fresh.done()
    return 0


if __name__ == "__main__":
    sys.exit(main())
