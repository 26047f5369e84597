"""Benchmark: the README's planner example, ``gclab plan --budget T4 --preset graphcast-small``.

Runs the command in a fresh process and writes ``benchmarks/results/plan-example-<backend>.json``
with its printed explanation, the command, this machine's hardware report (versions and
date) and the commit; `update_readme.py` shows the text with that provenance. A command
that fails writes nothing and exits with its status.

Usage:
  python benchmarks/plan_example.py
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from fresh_clone import ROOT, commit, hardware, write_record

COMMAND = ["plan", "--budget", "T4", "--preset", "graphcast-small"]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    proc = subprocess.run([sys.executable, "-m", "gclab", *COMMAND], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr)
        return proc.returncode
    write_record("plan-example", {
        "benchmark": "the planner's answer for GraphCast_small on a T4",
        "command": "gclab " + " ".join(COMMAND), "commit": commit(),
        "hardware": hardware(), "output": proc.stdout.strip()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
