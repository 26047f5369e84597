"""What the benchmark scripts share in refusing: a bad option in one line (argparse's
``parser.error``: the script's name, the option, what is allowed; exit 2) before any
compile or child process, so that a typo in the last value costs nothing; an ``--out``
that holds a file of another kind; and a child process that failed, in its own words.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from gclab.files import OutputPathError, check_output_path


def named(parser: argparse.ArgumentParser, option: str, text: str,
          lookup: Callable[[str], object]) -> list[str]:
    """The comma-separated names of `text`, each one `lookup` accepts (gclab's own
    `get_preset` or `get_recipe`, whose ValueError names the allowed ones)."""
    names = text.split(",")
    try:
        for name in names:
            lookup(name)
    except ValueError as e:
        parser.error(f"{option}: {e}")
    return names


def integers(parser: argparse.ArgumentParser, option: str, text: str, low: int, high: int,
             what: str, why: str = "") -> list[int]:
    """The comma-separated integers of `text`, each from `low` to `high`; the refusal
    says they are `what`, and `why` (in brackets) where given."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not low <= v <= high for v in values):
        parser.error(f"{option} {text}: comma-separated {what} from {low} to {high}"
                     + (f" ({why})" if why else ""))
    return values


def child_output(proc: subprocess.CompletedProcess, prog: str, what: str) -> str:
    """The standard output of a benchmark's child process that succeeded. Where it failed,
    its own error (the last line of its stderr), not the script it ran, is said in one line,
    ``<prog>: <what> failed: <line>``, and the benchmark exits with status 1."""
    if proc.returncode == 0:
        return proc.stdout
    last = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit {proc.returncode}"]
    print(f"{prog}: {what} failed: {last[-1]}", file=sys.stderr)
    raise SystemExit(1)


def record_to_extend(parser: argparse.ArgumentParser, out: Path, outputs: Sequence[Path],
                     what: str) -> dict:
    """The record at `out` that a run adds its rows to (one without rows where there is
    none), once every one of `outputs` is known to be writable (a ``.json`` among them by
    that name): a run never ends by failing to write, nor replaces a file of another kind.
    `what` names the record in the refusal."""
    try:
        for path in outputs:
            check_output_path(path, (".json",) if path.suffix == ".json" else None)
        old = json.loads(out.read_text()) if out.is_file() else {"rows": []}
        if not isinstance(old, dict) or not isinstance(old.get("rows"), list):
            raise ValueError("it has no list of rows")
    except OutputPathError as e:
        parser.error(f"--out: {e}")
    except ValueError as e:
        parser.error(f"--out {out}: not {what} ({e}); name another file")
    return old
