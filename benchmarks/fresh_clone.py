"""A fresh clone in a new virtual environment: what the README's commands meet on a new machine.

Shared by the benchmarks that time those commands (`book_build.py`, `ci_run.py`): the
repository's committed state is cloned into a work folder, a new virtual environment is made
beside it, and commands run in the clone with that environment first on the PATH and none
of this process's Python, XLA or JAX cache settings (a fresh machine has none; the clone's
own JAX compilation cache starts empty). The environment this runs in is left untouched:
``pip install -r requirements.txt`` installs gclab (editable) into the new environment only.
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


def arguments(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The options every fresh-clone benchmark takes: `--system-packages`, `--keep DIR`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--system-packages", action="store_true",
                        help="let the new environment see this Python's packages")
    parser.add_argument("--keep", metavar="DIR",
                        help="clone into DIR and keep it (default: a temporary folder)")
    return parser.parse_args(argv)


def commit(repo: Path = ROOT) -> str:
    """The short hash of `repo`'s checked-out commit."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


class FreshClone:
    """`ROOT` cloned into `work/gclab` with a new virtual environment `work/venv`."""

    def __init__(self, keep: str | None, prefix: str, system_packages: bool = False):
        self.keep = keep
        self.work = Path(keep or tempfile.mkdtemp(prefix=prefix))
        self.clone = self.work / "gclab"
        if self.clone.exists():
            shutil.rmtree(self.clone)
        subprocess.run(["git", "clone", "-q", str(ROOT), str(self.clone)], check=True)
        self.commit = commit(self.clone)
        self.venv = self.work / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)]
                       + (["--system-site-packages"] if system_packages else []), check=True)
        self.environment = ("new virtual environment"
                            + (" seeing the system packages" if system_packages else ""))
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "VIRTUAL_ENV": str(self.venv),
               "PATH": f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        for name in ("MPLBACKEND", "PYTHONPATH", "PYTHONHOME", "XLA_FLAGS",
                     "JAX_COMPILATION_CACHE_DIR"):
            env.pop(name, None)
        # The chapters' default cache (~/.cache/gclab/jax) holds this machine's earlier
        # builds: a fresh machine's is empty.
        env["JAX_COMPILATION_CACHE_DIR"] = str(self.work / "jax-cache")
        self.env = env

    def run(self, command: list[str], log: Path | None = None, **env: str) -> tuple[int, float]:
        """Runs `command` in the clone (its program from the new environment's bin if there);
        returns its exit status and wall seconds. With `log`, its output goes there too."""
        program = self.venv / "bin" / command[0]
        argv = [str(program) if program.exists() else command[0], *command[1:]]
        start = time.perf_counter()
        if log is None:
            code = subprocess.run(argv, cwd=self.clone, env={**self.env, **env}).returncode
        else:
            with open(log, "w") as out:
                proc = subprocess.Popen(argv, cwd=self.clone, env={**self.env, **env},
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
                for line in proc.stdout:  # shown as it comes, and kept
                    sys.stdout.write(line)
                    out.write(line)
                code = proc.wait()
        return code, round(time.perf_counter() - start, 1)

    def done(self) -> None:
        """Removes the work folder unless it was asked to be kept."""
        if not self.keep:
            shutil.rmtree(self.work, ignore_errors=True)


def hardware() -> dict:
    """This machine's hardware report (`gclab.notebook.hardware_report`)."""
    from gclab.notebook import hardware_report

    return dict(hardware_report())


def kept_rows(rows: list, old: dict, key, keep=lambda row: True) -> list:
    """The rows of the record `old` (``{"rows": [...]}``, with ``hardware.date`` where it has
    rows) that `keep` accepts and whose `key` no row of `rows` has: what a benchmark that
    adds a run of some questions to a record keeps of the runs before. Rows recorded before
    rows carried their own date get the date of their file."""
    mine = {key(r) for r in rows}
    return [{"date": old["hardware"]["date"], **r} for r in old["rows"]
            if keep(r) and key(r) not in mine]


def write_record(name: str, record: dict, suffix: str = "") -> Path:
    """Writes `record` to ``benchmarks/results/<name>-<backend><suffix>.json`` whole, then
    renamed (`gclab.files.write_text_atomic`): a run stopped halfway leaves the earlier
    record as it was.

    Args:
      name: the benchmark's name, e.g. ``ci-run``.
      record: the record; its ``hardware`` names the backend.
      suffix: appended to the file's name, e.g. ``-failed`` or ``-test-flags``.

    Returns:
      The path written.
    """
    from gclab.files import write_text_atomic

    backend = record["hardware"].get("backend", "cpu")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = write_text_atomic(RESULTS / f"{name}-{backend}{suffix}.json",
                            json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return out
