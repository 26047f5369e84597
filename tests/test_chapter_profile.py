"""`benchmarks/chapter_profile.py`: counts compiles per cell; a bad option is one line."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "chapter_profile.py"


def _module():
    spec = importlib.util.spec_from_file_location("chapter_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_compiling_cell_is_counted_and_the_chapter_is_left_as_it_was(tmp_path):
    path = tmp_path / "07_tiny.ipynb"
    cells = ["import jax", "x = 1 + 1", "jax.jit(lambda v: (v * 3.0).sum())(jax.numpy.ones(5))"]
    nbformat.write(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# tiny")]
        + [nbformat.v4.new_code_cell(c) for c in cells]), path)
    before = path.read_bytes()
    result = _module().profile(path, timeout=300, slowest=3)
    assert path.read_bytes() == before
    by_cell = {c["cell"]: c for c in result["slowest_cells"]}
    assert set(by_cell) == {1, 2, 3}  # the notebook's own indices (cell 0 is markdown)
    assert by_cell[3]["compile_seconds"] > 0 and by_cell[3]["trace_and_lower_seconds"] > 0
    assert by_cell[2]["compile_seconds"] == 0
    assert result["compile_seconds"] == pytest.approx(
        sum(c["compile_seconds"] for c in result["slowest_cells"]), abs=0.2)
    assert result["chapter"] == "07_tiny" and result["seconds"] > 0


@pytest.mark.parametrize("args, message", [
    (("--chapters", "99"), "--chapters 99: no chapter of _toc.yml starts with these "
                           "(e.g. 03,06 or appendix)"),
    (("--timeout", "0"), "--timeout 0: an integer >= 1"),
    (("--slowest", "many"), "--slowest many: an integer >= 1"),
])
def test_bad_options_get_one_line_and_write_nothing(args, message):
    results = sorted((ROOT / "benchmarks" / "results").iterdir())
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"chapter_profile.py: error: {message}"
    assert sorted((ROOT / "benchmarks" / "results").iterdir()) == results
