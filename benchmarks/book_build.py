"""Benchmark: the README's "build the book" command on a fresh clone, timed per chapter.

Clones the repository (committed state) into a temporary folder and runs the README's
build command there, in a new virtual environment of its own (as on a fresh machine:
``pip install -r requirements.txt`` downloads and installs everything, then
``jupyter-book build . -W --keep-going`` executes every chapter through jupyter-cache).
Reads each chapter's execution time from the cache the build writes
(``_build/.jupyter_cache``) and writes ``benchmarks/results/book-build-<backend>.json``
with the hardware and date. The environment this script runs in is left untouched.
``--system-packages`` lets the new environment see this Python's installed packages
(pip then installs only what is missing).

Usage:
  python benchmarks/book_build.py [--system-packages] [--keep DIR]
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
    parser.add_argument("--system-packages", action="store_true",
                        help="let the new environment see this Python's packages")
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
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)]
                   + (["--system-site-packages"] if args.system_packages else []), check=True)
    steps = [["pip", "install", "-q", "-r", "requirements.txt"],
             ["jupyter-book", "build", ".", "-W", "--keep-going"]]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "VIRTUAL_ENV": str(venv),
           "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name in ("MPLBACKEND", "PYTHONPATH", "PYTHONHOME", "XLA_FLAGS"):
        env.pop(name, None)
    # A fresh machine has nothing in JAX's compilation cache (the chapters' default,
    # ~/.cache/gclab/jax, holds this machine's earlier builds).
    env["JAX_COMPILATION_CACHE_DIR"] = str(work / "jax-cache")
    step_seconds = {}
    for command in steps:
        t0 = time.perf_counter()
        result = subprocess.run([str(venv / "bin" / command[0]), *command[1:]], cwd=clone,
                                env=env)
        if result.returncode:
            print(f"failed ({result.returncode}): {' '.join(command)}", file=sys.stderr)
            return result.returncode
        name = "pip install" if command[0] == "pip" else "jupyter-book build"
        step_seconds[name] = round(time.perf_counter() - t0, 1)
    seconds = sum(step_seconds.values())
    chapters = _chapter_seconds(clone / "_build")
    html = sorted(p.name for p in (clone / "_build" / "html" / "book").glob("*.html"))
    record = {
        "benchmark": "README build command on a fresh clone",
        "command": " && ".join(" ".join(c) for c in steps),
        "environment": "new virtual environment"
                       + (" seeing the system packages" if args.system_packages else ""),
        "commit": commit,
        "hardware": _hardware(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "total_seconds": round(seconds, 1),
        "step_seconds": step_seconds,
        "chapter_execution_seconds": chapters,
        "html_pages": html,
    }
    backend = record["hardware"].get("backend", "cpu")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"book-build-{backend}.json"
    tmp = out.with_name(f".{out.name}.tmp")  # written whole, then renamed into place
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, out)
    print(json.dumps(record, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
