"""`benchmarks/record_gpu.py`: lists its parts anywhere, refuses to record without a GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "record_gpu.py"


def _run(*args, scale=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GCLAB_SCALE", None)
    if scale:
        env["GCLAB_SCALE"] = scale
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_it_refuses_to_record_without_a_gpu(tmp_path):
    r = _run("--part", "1", "--out", str(tmp_path))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("record_gpu.py: error: no GPU found (JAX backend 'cpu'): GPU "
                                "recordings need one; use --list or --dry-run here")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (("--part", "0"), "--part 0: an integer from 1 to 4"),
    (("--part", "two"), "--part two: an integer from 1 to 4"),
    ((), "give --list or --part N (N from 1 to 4)"),
])
def test_bad_arguments_get_one_line(args, message):
    r = _run(*args)
    assert r.returncode == 2 and r.stderr.strip() == f"record_gpu.py: error: {message}"


def test_it_lists_the_parts_of_a_scale():
    r = _run("--list", scale="80GB")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "Parts at scale 80GB (set GCLAB_SCALE to list another):"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "1. chapter-03", "2. chapters-01-05-07", "3. chapter-06", "4. recipes"]
    assert "(5 configurations)" in lines[1] and "(8 configurations)" in lines[4]


def test_a_dry_run_names_what_a_part_would_run():
    r = _run("--part", "2", "--dry-run", scale="80GB")
    assert r.returncode == 0, r.stderr
    assert "graphcast lean bf16: 0.25 deg / 6 splits, 16 x 512, 37 levels" in r.stdout
    assert r.stdout.count("\n  0") == 4  # chapters 01, 05 (two) and 07
