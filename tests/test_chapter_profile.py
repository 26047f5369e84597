"""`benchmarks/chapter_profile.py`: counts compiles per cell; a bad option is one line."""

import os
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture
def chapter_profile(benchmarks):
    """The script as a module, imported as the other benchmark tests import theirs (the
    `benchmarks` fixture): importing it starts neither JAX nor a kernel."""
    import chapter_profile

    return chapter_profile


def test_a_compiling_cell_is_counted_and_the_chapter_is_left_as_it_was(chapter_profile,
                                                                        tmp_path):
    path = tmp_path / "07_tiny.ipynb"
    cells = ["import jax", "x = 1 + 1", "jax.jit(lambda v: (v * 3.0).sum())(jax.numpy.ones(5))"]
    nbformat.write(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# tiny")]
        + [nbformat.v4.new_code_cell(c) for c in cells]), path)
    before = path.read_bytes()
    result = chapter_profile.profile(path, timeout=300, slowest=3)
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
def test_bad_options_get_one_line_and_write_nothing(chapter_profile, monkeypatch, capsys,
                                                   args, message):
    """Refused in this process: a refused run that went on would stop at its first chapter
    (no kernel starts here), and every record in the results folder is as it was."""
    def profile(*args, **kwargs):
        raise AssertionError("a refused run went on to profile a chapter")

    monkeypatch.setattr(chapter_profile, "profile", profile)
    # A run that went on would point this process's cache elsewhere: restored after the test.
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR",
                       os.environ.get("JAX_COMPILATION_CACHE_DIR", ""))
    before = _stamps(RESULTS)
    with pytest.raises(SystemExit) as exit_:
        chapter_profile.main(list(args))
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"chapter_profile.py: error: {message}"
    assert _stamps(RESULTS) == before


def _stamps(folder: Path) -> dict:
    """Each file of `folder`: its modification time and size (a rewritten record changes
    them, a file's name does not)."""
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.iterdir()}
