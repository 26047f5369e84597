"""Benchmark: where the README's test command spends its time (XLA compiles, tracing, per file).

Runs ``python -m pytest`` here as CI does on a fresh clone (pyproject.toml's options: the
chapters through nbmake and the tests, on two xdist workers), from an empty JAX compilation
cache, and lists every test file and chapter with the seconds pytest gave its items
(``--durations=0 --durations-min=0``) and what JAX reports of them in every process that
worked for them: the xdist workers, the chapters' kernels and the processes tests start.
Each such process counts JAX's own monitoring events (`jax.monitoring`: seconds of backend
compiles, of tracing and lowering, compile seconds the cache saved) under the test that was
running (``PYTEST_CURRENT_TEST``, which a test's child processes inherit).

pytest has no hook in processes it does not run (a kernel, ``python -m gclab``), so the
events are counted by a ``sitecustomize`` module that this script writes to a temporary
folder put first on ``PYTHONPATH``: Python imports it in every process it starts. It
registers the listener when JAX's monitoring module is first imported, so a process that
never imports JAX pays nothing; an environment's own ``sitecustomize``, if it has one,
still runs after it. Counting adds a little time to each compile; the record says which
run it is, not how fast CI is (`ci_run.py` records that).

Writes ``benchmarks/results/suite-profile-<backend>.json``:

    python benchmarks/suite_profile.py            # about as long as the tests themselves
    python benchmarks/suite_profile.py --top 60   # more files in the record
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fresh_clone import ROOT, commit, hardware, write_record  # noqa: E402

# Written as `sitecustomize.py` into the folder put first on PYTHONPATH. A finder on
# `sys.meta_path` waits for `jax._src.monitoring` (imported as JAX starts) and registers the
# listener right after that module runs: no import hook of the standard library does this
# for one module (`importlib` offers none after an import).
SITECUSTOMIZE = '''\
"""Written by benchmarks/suite_profile.py: counts JAX's monitoring events per process."""
import importlib.machinery
import importlib.util
import os
import sys

_FOLDER = os.environ.get("GCLAB_SUITE_PROFILE")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _listen(monitoring):
    out = open(os.path.join(_FOLDER, f"{os.getpid()}.tsv"), "a", buffering=1)
    command = " ".join(getattr(sys, "orig_argv", sys.argv)[1:4])[:100]
    out.write("P\\t" + " ".join(command.split()) + "\\n")

    def record(event, seconds, **_):
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        out.write(f"E\\t{test}\\t{event.rsplit('/', 1)[-1]}\\t{seconds:.5f}\\n")

    monitoring.register_event_duration_secs_listener(record)


class _AfterMonitoring:
    def find_spec(self, name, path, target=None):
        if name != "jax._src.monitoring":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _listen(module)

            spec.loader.exec_module = exec_module
        return spec


if _FOLDER:
    sys.meta_path.insert(0, _AfterMonitoring())
# The environment's own sitecustomize, which this module hides, runs too.
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
_theirs = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _theirs is not None and _theirs.loader is not None:
    _module = importlib.util.module_from_spec(_theirs)
    _theirs.loader.exec_module(_module)
'''

DURATION = re.compile(r"^([0-9.]+)s (setup|call|teardown)\s+(\S+)")
SUMMARY = re.compile(r"^=* ?(\d+ (passed|failed).*) in ([0-9.]+)s")
EVENTS = {"backend_compile_duration": "compile_seconds",
          "jaxpr_trace_duration": "trace_and_lower_seconds",
          "jaxpr_to_mlir_module_duration": "trace_and_lower_seconds",
          "compile_time_saved_sec": "cache_saved_seconds"}
OUTSIDE = "(outside a test)"


def file_of(test_id: str) -> str:
    """The test file or chapter of a pytest node id (its part before ``::``)."""
    return test_id.split("::", 1)[0] if test_id else OUTSIDE


def durations(output: str) -> tuple[dict, dict]:
    """Per file, the seconds of its items' phases and how many items it has, from the
    ``--durations`` lines of pytest's output."""
    seconds, items = collections.Counter(), collections.defaultdict(set)
    for line in output.splitlines():
        m = DURATION.match(line.strip())
        if m:
            node = m.group(3)
            seconds[file_of(node)] += float(m.group(1))
            items[file_of(node)].add(node)
    return seconds, {k: len(v) for k, v in items.items()}


def events(folder: Path) -> tuple[dict, dict, list]:
    """Per file, the event sums (`EVENTS`) and the processes that reported its events;
    and every process that imported JAX (its first arguments)."""
    sums = collections.defaultdict(collections.Counter)
    processes = collections.defaultdict(set)
    started = []
    for path in sorted(folder.glob("*.tsv")):
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if parts[0] == "P" and len(parts) == 2:
                started.append(parts[1])
            elif parts[0] == "E" and len(parts) == 4 and parts[2] in EVENTS:
                where = file_of(parts[1])
                sums[where][EVENTS[parts[2]]] += float(parts[3])
                processes[where].add(path.stem)
    return sums, {k: len(v) for k, v in processes.items()}, started


def kind(command: str) -> str:
    """A process's kind, from the start of its command line (after the interpreter)."""
    if "ipykernel" in command:
        return "chapter kernel"
    if "exec(eval(sys.stdin" in command:  # execnet's bootstrap: an xdist worker
        return "xdist worker"
    if command.startswith(("-m pytest", "-m gclab")):
        return command.split()[1] + " (python -m)"
    if command.startswith("-c"):
        return "python -c (a test's script)"
    return "a script (" + Path(command.split()[0]).name + ")" if command else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="suite_profile.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--top", default="40",
                        help="files kept in the record, most seconds first (default 40)")
    args = parser.parse_args(argv)
    if not args.top.isdigit() or int(args.top) < 1:
        parser.exit(2, f"{parser.prog}: error: --top {args.top}: an integer >= 1\n")
    with tempfile.TemporaryDirectory(prefix="gclab-suite-profile-") as work:
        site, counted = Path(work, "site"), Path(work, "events")
        site.mkdir()
        counted.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = dict(os.environ, GCLAB_SUITE_PROFILE=str(counted),
                   JAX_COMPILATION_CACHE_DIR=str(Path(work, "jax-cache")),
                   PYTHONPATH=os.pathsep.join(
                       p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
        # Every item's phases, however short (pytest hides those under 5 ms by default).
        command = [sys.executable, "-m", "pytest", "--durations=0", "--durations-min=0"]
        start = time.perf_counter()
        run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        sums, procs, started = events(counted)
    output = run.stdout + run.stderr
    seconds, items = durations(output)
    summary = next((m.group(1) for m in map(SUMMARY.match, reversed(output.splitlines()))
                    if m), None)
    if summary is None:
        print(output[-3000:], file=sys.stderr)
        parser.exit(1, f"{parser.prog}: error: pytest printed no summary (exit status "
                       f"{run.returncode}); nothing written\n")
    files = sorted(set(seconds) | set(sums), key=lambda f: -seconds.get(f, 0.0))
    rows = [{"file": f, "items": items.get(f, 0), "seconds": round(seconds.get(f, 0.0), 1),
             **{k: round(sums[f][k], 1) for k in sorted(set(EVENTS.values()))},
             "processes": procs.get(f, 0)} for f in files]
    totals = {k: round(sum(s[k] for s in sums.values()), 1) for k in sorted(set(EVENTS.values()))}
    hw = hardware()
    record = {
        "benchmark": "the README's test command, JAX events counted per test file and chapter",
        "command": "python -m pytest --durations=0 --durations-min=0 (pyproject.toml's options)",
        "commit": commit(), "hardware": hw, "date": hw.get("date"),
        "cache": "JAX compilation cache empty at the start, shared by every process",
        "xla_flags": "the tests' (tests/conftest.py), inherited by every process",
        "passed": run.returncode == 0, "pytest_summary": summary,
        "wall_seconds": round(wall, 1),
        "item_seconds": round(sum(seconds.values()), 1),
        **totals,
        "processes_with_jax": dict(collections.Counter(map(kind, started)).most_common()),
        "files": rows[:int(args.top)],
    }
    failed = [line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    if failed:  # pytest's short summary: which items failed (the record says how many)
        print("\n".join(failed), file=sys.stderr)
    path = write_record("suite-profile", record)
    print(f"wrote {path.relative_to(ROOT)}: {summary}; items {record['item_seconds']} s, "
          f"compiles {totals['compile_seconds']} s, tracing and lowering "
          f"{totals['trace_and_lower_seconds']} s")
    return 0 if run.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
