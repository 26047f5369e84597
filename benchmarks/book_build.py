"""Benchmark: the README's "build the book" command on a fresh clone, timed per chapter.

Clones the repository (committed state) into a temporary folder, runs the README's build
command there (``jupyter-book build . -W --keep-going``: every chapter executes, through
jupyter-cache), and reads each chapter's execution time from the cache that the build
writes (``_build/.jupyter_cache``). Writes ``benchmarks/results/book-build-<backend>.json``
with the hardware and date. Set ``--skip-install`` to leave out the README's
``pip install -r requirements.txt`` step (the packages must be installed already).

Usage:
  python benchmarks/book_build.py [--skip-install] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _hardware() -> dict:
    from gclab.notebook import hardware_report

    return dict(hardware_report())


def _chapter_seconds(build_dir: Path) -> dict[str, float]:
    from jupyter_cache import get_cache

    cache = get_cache(build_dir / ".jupyter_cache")
    out = {}
    for record in cache.list_cache_records():
        seconds = (record.data or {}).get("execution_seconds")
        if seconds is not None:
            out[Path(record.uri).name] = round(float(seconds), 1)
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-install", action="store_true",
                        help="do not run 'pip install -r requirements.txt' first")
    parser.add_argument("--keep", metavar="DIR",
                        help="clone into DIR and keep it (default: a temporary folder)")
    args = parser.parse_args(argv)

    work = Path(args.keep or tempfile.mkdtemp(prefix="gclab_book_"))
    clone = work / "gclab"
    if clone.exists():
        shutil.rmtree(clone)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, check=True,
                            capture_output=True, text=True).stdout.strip()
    steps = [] if args.skip_install else [
        [sys.executable, "-m", "pip", "install", "-q", "-r", "requirements.txt"]]
    steps.append(["jupyter-book", "build", ".", "-W", "--keep-going"])
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("MPLBACKEND", None)
    t0 = time.perf_counter()
    for command in steps:
        result = subprocess.run(command, cwd=clone, env=env)
        if result.returncode:
            print(f"failed ({result.returncode}): {' '.join(command)}", file=sys.stderr)
            return result.returncode
    seconds = time.perf_counter() - t0
    chapters = _chapter_seconds(clone / "_build")
    html = sorted(p.name for p in (clone / "_build" / "html" / "book").glob("*.html"))
    record = {
        "benchmark": "README build command on a fresh clone",
        "command": " && ".join(" ".join(c) for c in steps),
        "commit": commit,
        "hardware": _hardware(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "total_seconds": round(seconds, 1),
        "chapter_execution_seconds": chapters,
        "html_pages": html,
    }
    backend = record["hardware"].get("backend", "cpu")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"book-build-{backend}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
