"""`benchmarks/memory_device.py`: refuses without an accelerator, and its report of a
recorded run (XLA's own rematerialization marked) is the one shipped."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "memory_device.py"
RESULTS = ROOT / "benchmarks" / "results"


def _run(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_it_refuses_without_an_accelerator(tmp_path):
    r = _run("--out", str(tmp_path))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("memory_device.py: error: no accelerator found (JAX backend "
                                "'cpu'): memory_recipes.py records the CPU")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (("--stages", "claim,fast"), "--stages 'claim,fast': a comma-separated list of claim, "
     "claim-live, recipes-f32, recipes-bf16, layer-norm, step-time"),
    (("--budget", "soon"), "--budget soon: a positive number of seconds"),
    (("--budget", "0"), "--budget 0: a positive number of seconds"),
    (("--log", "run.log"), "--log: only with --report"),
])
def test_bad_arguments_get_one_line(args, message):
    r = _run(*args)
    assert r.returncode == 2 and r.stderr.strip() == f"memory_device.py: error: {message}"


def test_a_report_of_something_else_gets_one_line(tmp_path):
    bad = tmp_path / "memory-gpu.json"
    bad.write_text(json.dumps({"rows": []}))
    r = _run("--report", str(bad))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith(f"memory_device.py: error: --report {bad}: not a record")
    assert json.loads(bad.read_text()) == {"rows": []}  # left as it was


def test_the_shipped_report_is_what_the_record_and_its_log_give(tmp_path):
    """Re-running the report on the recorded GPU run writes the shipped .md byte for byte,
    and marks the rows whose compile XLA's rematerialization pass reported in the log."""
    for name in ("memory-gpu.json", "memory-gpu.log"):
        shutil.copy(RESULTS / name, tmp_path / name)
    r = _run("--report", str(tmp_path / "memory-gpu.json"), "--log",
             str(tmp_path / "memory-gpu.log"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "memory-gpu.md").read_text() == (RESULTS / "memory-gpu.md").read_text()
    assert ((tmp_path / "memory-gpu.json").read_text()
            == (RESULTS / "memory-gpu.json").read_text())
    record = json.loads((tmp_path / "memory-gpu.json").read_text())
    marked = {(r["preset"], r["precision"], r["recipe"]): r["xla_remat"]
              for r in record["recipes"] if "xla_remat" in r}
    log = (tmp_path / "memory-gpu.log").read_text()
    assert len(marked) == log.count("hlo_rematerialization.cc") > 0
    for (preset, precision, recipe), x in marked.items():
        row = next(r for r in record["recipes"]
                   if (r["preset"], r["precision"], r["recipe"]) == (preset, precision, recipe))
        # What the pass reached is the compiled temp, to the bytes of its arguments.
        assert x["reduced_to_bytes"] < x["from_bytes"] and x["limit_bytes"] < x["from_bytes"]
        assert abs(x["reduced_to_bytes"] - row["temp_bytes"]) < 0.01 * row["temp_bytes"]


def test_xla_remat_warnings_belong_to_the_next_row():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import memory_device
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    log = "\n".join([
        "graphcast        bf16  lean      temp     4.45 GiB  compile   2.8 s",
        "W1126 hlo_rematerialization.cc:3363] Can't reduce memory use below 96.56GiB "
        "(103680246851 bytes) by rematerialization; only reduced to 235.70GiB (253084522848 "
        "bytes), down from 258.62GiB (277697300132 bytes) originally",
        "graphcast        f32   none      temp   235.30 GiB  compile  34.8 s",
        "graphcast        f32   deepmind  temp    37.06 GiB  compile  21.9 s"])
    assert memory_device.xla_remat_reports(log) == {
        ("graphcast", "f32", "none"): {"limit_bytes": 103680246851,
                                        "reduced_to_bytes": 253084522848,
                                        "from_bytes": 277697300132}}
