"""Benchmark: where each chapter's time goes, cell by cell (wall time, XLA compiles, tracing).

Runs the chapters one after another, as the book build does: one kernel per chapter
(nbclient, the same client myst-nb's execution uses), this process's environment (its
``XLA_FLAGS`` are recorded), and one JAX compilation cache that starts empty and is shared
by the chapters. Every kernel also counts JAX's own monitoring events (`jax.monitoring`):
the seconds of backend compiles, of tracing and lowering, and the compile seconds that the
cache saved. Each code cell is followed by a hidden cell that prints those counts and
resets them. The chapters on disk are not changed.

Writes ``benchmarks/results/chapter-profile-<backend>.json``: per chapter, its wall time
and the three sums, and its slowest cells with their share of compiles. That file is the
book's profile (every chapter, no ``XLA_FLAGS``); a run of some chapters, or under other
``XLA_FLAGS``, needs ``--name NAME`` and writes ``chapter-profile-<backend>-NAME.json``
beside it (the README's other rows: ``elemental-emitter``, ``test-flags``, ...).

    python benchmarks/chapter_profile.py                # every chapter of _toc.yml
    python benchmarks/chapter_profile.py --chapters 03,06 --name 03-06
    XLA_FLAGS=--xla_cpu_use_fusion_emitters=false \
        python benchmarks/chapter_profile.py --name elemental-emitter
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fresh_clone import ROOT, commit, hardware, write_record  # noqa: E402

sys.path.insert(0, str(ROOT / "book"))
from run_chapters import chapters as chapters_of_toc  # noqa: E402

MARK = "GCLAB-PROFILE "
# Registered in the kernel after the chapter's first cell (which starts JAX).
LISTEN = """\
import collections as _gclab_c
import jax.monitoring as _gclab_m
_GCLAB_PROFILE = _gclab_c.Counter()
_gclab_m.register_event_duration_secs_listener(
    lambda name, secs, **kw: _GCLAB_PROFILE.update({name.rsplit("/", 1)[-1]: secs}))
"""
REPORT = f"""\
import json as _gclab_j
print({MARK!r} + _gclab_j.dumps(dict(_GCLAB_PROFILE)))
_GCLAB_PROFILE.clear()
"""
EVENTS = {"compile_seconds": ("backend_compile_duration",),
          "trace_and_lower_seconds": ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration"),
          "cache_saved_seconds": ("compile_time_saved_sec",)}


def _seconds(metadata: dict) -> float | None:
    """A cell's wall time from nbclient's timing metadata."""
    times = metadata.get("execution", {})
    try:
        start, end = (dt.datetime.fromisoformat(times[k].replace("Z", "+00:00"))
                      for k in ("iopub.execute_input", "shell.execute_reply"))
    except KeyError:
        return None
    return (end - start).total_seconds()


def _counts(outputs: list) -> dict:
    for out in outputs:
        text = out.get("text", "")
        if out.get("name") == "stdout" and MARK in text:
            return json.loads(text.split(MARK, 1)[1].splitlines()[0])
    return {}


def _sums(counts: dict) -> dict:
    return {key: sum(counts.get(e, 0.0) for e in events) for key, events in EVENTS.items()}


def profile(path: Path, timeout: int, slowest: int) -> dict:
    """Executes the chapter at `path` in a new kernel; its time, sums and slowest cells."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    reports = [nbformat.v4.new_code_cell(REPORT) for _ in code]
    nb.cells = [c for (_, cell), report in zip(code, reports) for c in (cell, report)]
    nb.cells.insert(1, nbformat.v4.new_code_cell(LISTEN))  # once the first cell started JAX
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=True,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    rows = [{"cell": index, "seconds": _seconds(cell.metadata), **_sums(_counts(report.outputs)),
             "first_line": cell.source.splitlines()[0][:80] if cell.source else ""}
            for (index, cell), report in zip(code, reports)]
    totals = {key: round(sum(r[key] for r in rows), 1) for key in EVENTS}
    top = sorted(rows, key=lambda r: -(r["seconds"] or 0.0))[:slowest]
    return {"chapter": path.stem, "seconds": round(seconds, 1), **totals,
            "slowest_cells": [{k: round(v, 2) if isinstance(v, float) else v
                               for k, v in r.items()} for r in top]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chapter_profile.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", default="",
                        help="comma-separated chapter prefixes, e.g. 03,06 (default: all)")
    parser.add_argument("--timeout", default="1800",
                        help="seconds one cell may take (default 1800)")
    parser.add_argument("--slowest", default="5", help="slowest cells kept per chapter (default 5)")
    parser.add_argument("--name", default="",
                        help="write chapter-profile-<backend>-NAME.json (lower-case letters, "
                             "digits, '-'); needed with --chapters or XLA_FLAGS")
    args = parser.parse_args(argv)

    def fail(message: str):
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    for name in ("timeout", "slowest"):
        value = getattr(args, name)
        if not value.isdigit() or int(value) < 1:
            fail(f"--{name} {value}: an integer >= 1")
    wanted = [c.strip() for c in args.chapters.split(",") if c.strip()]
    paths = [p for p in chapters_of_toc(ROOT)
             if not wanted or any(p.stem.startswith(w) for w in wanted)]
    if not paths:
        fail(f"--chapters {args.chapters}: no chapter of _toc.yml starts with these "
             "(e.g. 03,06 or appendix)")
    if args.name and not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", args.name):
        fail(f"--name {args.name}: lower-case letters and digits joined by '-', "
             "e.g. elemental-emitter")
    # chapter-profile-<backend>.json is the book's row of the README: every chapter, with
    # the compiler's defaults. Any other run is kept under a name of its own.
    flags = os.environ.get("XLA_FLAGS", "").strip()
    if not args.name and len(paths) < len(chapters_of_toc(ROOT)):
        fail(f"--chapters {args.chapters}: some chapters only; name the record with "
             "--name NAME (writes chapter-profile-<backend>-NAME.json)")
    if not args.name and flags:
        fail(f"XLA_FLAGS={flags}: not the book's settings; name the record with "
             "--name NAME (writes chapter-profile-<backend>-NAME.json)")
    # An empty cache, shared by the chapters, as on a fresh machine's first build.
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="gclab-profile-jax-")
    chapters = []
    for path in paths:
        chapters.append(profile(path, int(args.timeout), int(args.slowest)))
        print(f"{path.stem}: {chapters[-1]['seconds']} s, compiles "
              f"{chapters[-1]['compile_seconds']} s", flush=True)
    hw = hardware()
    record = {"benchmark": "chapters executed one after another, JAX events counted per cell",
              "commit": commit(), "hardware": hw, "date": hw.get("date"),
              "cache": "JAX compilation cache empty at the start, shared by the chapters",
              "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "seconds": round(sum(c["seconds"] for c in chapters), 1),
              **{key: round(sum(c[key] for c in chapters), 1) for key in EVENTS},
              "chapters": chapters}
    write_record("chapter-profile", record, suffix=f"-{args.name}" if args.name else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
