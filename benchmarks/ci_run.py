"""Benchmark: CI (`bash .ci/run`) on a fresh clone, timed by phase.

Clones the repository (committed state) into a temporary folder and runs `.ci/run` there,
in a new virtual environment of its own (`fresh_clone.FreshClone`): installing from
``requirements.txt``, `lint-imports`, the README's test command (every test and every
chapter through nbmake, on two workers) and the strict book build. Writes
``benchmarks/results/ci-run-<backend>.json`` with the hardware, the load average before and
after (a busy machine inflates every time), the commit, each phase's seconds as `.ci/run`
prints them, pytest's summary line and its slowest items. Exits with CI's status; a failed
run is recorded as failed, never as a time, in ``ci-run-<backend>-failed.json``: the last
passing run's record is kept.

Usage:
  python benchmarks/ci_run.py [--system-packages] [--keep DIR]
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from fresh_clone import FreshClone, arguments, hardware, write_record

PHASE = re.compile(r"^ci: (.+) took (\d+) s$")
SUMMARY = re.compile(r"^=+ (.*\d+ passed.*) in [\d.]+s")
SLOWEST = re.compile(r"^([\d.]+)s (call|setup|teardown) +(\S+)")


def read_log(text: str) -> dict:
    """Phases, pytest's summary and its slowest items, from `.ci/run`'s output."""
    phases = {m.group(1): int(m.group(2))
              for m in (PHASE.match(line) for line in text.splitlines()) if m}
    summary = next((m.group(1) for m in (SUMMARY.match(line) for line in text.splitlines())
                    if m), None)
    slowest = [{"seconds": float(m.group(1)), "phase": m.group(2), "item": m.group(3)}
               for m in (SLOWEST.match(line) for line in text.splitlines()) if m]
    return {"phase_seconds": phases, "pytest_summary": summary, "slowest": slowest}


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, argv)

    fresh = FreshClone(args.keep, "gclab_ci_", args.system_packages)
    load_before = round(os.getloadavg()[0], 2)
    log = fresh.work / "ci.log"
    code, seconds = fresh.run(["bash", ".ci/run"], log=log, CI="true")
    record = {
        "benchmark": "CI (bash .ci/run) on a fresh clone",
        "environment": fresh.environment,
        "commit": fresh.commit,
        "hardware": hardware(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "passed": code == 0,
        "total_seconds": seconds,
        "load_average_1min": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
        **read_log(Path(log).read_text(errors="replace")),
    }
    # A failed run goes beside the last passing record, never over it: the README's CI
    # block reads ``ci-run-<backend>.json`` and shows a passing run's phase times.
    write_record("ci-run", record, suffix="" if code == 0 else "-failed")
    fresh.done()
    return code


if __name__ == "__main__":
    sys.exit(main())
