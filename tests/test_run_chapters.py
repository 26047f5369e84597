"""`book/run_chapters.py`: chapters run side by side into the cache Jupyter Book reads.

On a small book of its own (two one-cell notebooks, one of which fails): the chapter that
runs is cached where myst-nb's cache mode finds it (matched by its content, as
`jupyter-book build` matches it), the failing one is named with its traceback and the
script exits with 1, and a second run runs only what the cache lacks.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import nbformat
import pytest
from jupyter_cache import get_cache

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("run_chapters", ROOT / "book" / "run_chapters.py")
run_chapters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_chapters)


def _notebook(path: Path, source: str) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture
def small_book(tmp_path: Path) -> Path:
    (tmp_path / "book").mkdir()
    _notebook(tmp_path / "book" / "good.ipynb", "print(6 * 7)")
    _notebook(tmp_path / "book" / "bad.ipynb", "raise ValueError('broken chapter')")
    (tmp_path / "book" / "intro.md").write_text("# A book\n")
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nparts:\n  - caption: Chapters\n    chapters:\n"
        "      - file: book/good\n      - file: book/bad\n")
    (tmp_path / "_config.yml").write_text("execute:\n  execute_notebooks: cache\n"
                                          "  timeout: 120\n")
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "book-build-cpu.json").write_text(json.dumps(
        {"chapter_execution_seconds": {"good.ipynb": 1.0, "bad.ipynb": 9.0}}))
    return tmp_path


def test_runs_chapters_into_the_build_cache_and_names_the_one_that_fails(small_book, capsys):
    assert run_chapters.main(["--jobs", "2"], root=small_book) == 1
    out, err = capsys.readouterr()
    assert "2 chapters, 2 at a time" in out and "max chapter memory" in out
    assert int(re.search(r"; (\d+) s of processor time", out).group(1)) > 0  # two kernels ran
    assert "bad.ipynb FAILED" in out and "good.ipynb done" in out
    assert "bad.ipynb failed:" in err and "broken chapter" in err

    cache = get_cache(small_book / "_build" / ".jupyter_cache")
    good = nbformat.read(small_book / "book" / "good.ipynb", nbformat.NO_CONVERT)
    record = cache.match_cache_notebook(good)  # what myst-nb's cache mode looks up
    _, merged = cache.merge_match_into_notebook(good)
    assert merged.cells[0].outputs[0]["text"] == "42\n"
    assert record.data["execution_seconds"] > 0
    with pytest.raises(KeyError):
        cache.match_cache_notebook(nbformat.read(small_book / "book" / "bad.ipynb",
                                                 nbformat.NO_CONVERT))

    # Fixed, the failing chapter runs again; the cached one does not.
    _notebook(small_book / "book" / "bad.ipynb", "print('fixed')")
    assert run_chapters.main([], root=small_book) == 0
    out, _ = capsys.readouterr()
    assert "1 chapters, 1 at a time" in out and "bad.ipynb done" in out
    assert "good.ipynb" not in out
    assert run_chapters.main([], root=small_book) == 0
    assert "every chapter is in the cache already" in capsys.readouterr().out


def test_a_run_of_the_table_of_contents_longest_first_with_the_kernels_flags(small_book, capsys,
                                                                             monkeypatch):
    """One run of the book, both chapters passing, one at a time (one core): a notebook the
    cache's project still lists from an earlier build but the table of contents no longer
    does is not run; the chapter recorded as the longest starts first; the kernels get the
    caller's XLA flags and the split flag (the one chapter at a time takes every core),
    while the caller keeps its own; the kernels' peak memory is read back."""
    assert [p.name for p in run_chapters.chapters(small_book)] == ["good.ipynb", "bad.ipynb"]
    _notebook(small_book / "book" / "good.ipynb",
              "import os\nprint(os.environ.get('XLA_FLAGS'))")
    _notebook(small_book / "book" / "bad.ipynb", "print('fixed')")
    _notebook(small_book / "book" / "dropped.ipynb", "print('not a chapter now')")
    cache = get_cache(small_book / "_build" / ".jupyter_cache")
    cache.add_nb_to_project(str(small_book / "book" / "dropped.ipynb"))
    monkeypatch.setattr(run_chapters.os, "cpu_count", lambda: 1)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=false")
    assert run_chapters.main([], root=small_book) == 0
    out = capsys.readouterr().out
    assert "2 chapters" in out and "dropped.ipynb" not in out
    assert out.index("bad.ipynb done") < out.index("good.ipynb done")  # 9 s before 1 s
    expected = f"--xla_cpu_use_fusion_emitters=false {run_chapters.SPLIT_FLAG}=1"
    assert f"1 at a time; XLA_FLAGS={expected}" in out
    good = nbformat.read(small_book / "book" / "good.ipynb", nbformat.NO_CONVERT)
    _, merged = cache.merge_match_into_notebook(good)
    assert merged.cells[0].outputs[0]["text"] == expected + "\n"
    assert run_chapters.os.environ["XLA_FLAGS"] == "--xla_cpu_use_fusion_emitters=false"
    # A kernel (Python, IPython, zmq) holds tens of MiB; read in KiB as GiB it would not.
    assert 0.02 < run_chapters.children_peak_gib() < run_chapters.host_memory_gib()


def test_pool_size_one_with_an_accelerator_else_cores_and_memory(monkeypatch):
    monkeypatch.setattr(run_chapters.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(run_chapters, "host_memory_gib", lambda: 16.0)
    monkeypatch.setattr(run_chapters, "has_accelerator_plugin", lambda: False)
    assert run_chapters.pool_size(None, 9) == 3  # 16 GiB hold 3 chapters of 5 GiB
    assert run_chapters.pool_size(2, 9) == 2
    assert run_chapters.pool_size(None, 1) == 1
    monkeypatch.setattr(run_chapters, "host_memory_gib", lambda: 3.0)
    assert run_chapters.pool_size(None, 9) == 1
    monkeypatch.setattr(run_chapters, "host_memory_gib", lambda: 64.0)
    assert run_chapters.pool_size(None, 9) == 8
    monkeypatch.setattr(run_chapters, "host_memory_gib", lambda: None)  # the system won't say
    assert run_chapters.pool_size(None, 9) == 1
    assert run_chapters.pool_size(2, 9) == 2
    monkeypatch.setattr(run_chapters, "has_accelerator_plugin", lambda: True)
    assert run_chapters.pool_size(4, 9) == 1


def test_kernels_compile_in_one_piece_only_where_the_chapters_take_every_core():
    split = f"{run_chapters.SPLIT_FLAG}=1"
    flags = run_chapters.kernel_xla_flags
    assert flags("", 2, 2, False) == split
    assert flags(" --xla_cpu_use_fusion_emitters=false ", 4, 2, False) == (
        f"--xla_cpu_use_fusion_emitters=false {split}")
    assert flags("--xla_cpu_use_fusion_emitters=false", 1, 2, False) == (  # a core is idle
        "--xla_cpu_use_fusion_emitters=false")
    assert flags("", 1, 1, True) == ""  # an accelerator: XLA:CPU compiles little
    assert flags(f"{run_chapters.SPLIT_FLAG}=4", 2, 2, False) == (  # the caller's own
        f"{run_chapters.SPLIT_FLAG}=4")


def test_memory_of_this_machine():
    # os.sysconf's figures in GiB: not 0, nor bytes, nor pages.
    assert 0.5 < run_chapters.host_memory_gib() < 2**20


def test_accelerator_plugin_is_looked_up_without_starting_jax(monkeypatch):
    """Where JAX looks for plugins: its namespace package, its entry-point group; libtpu."""
    modules, entry_points = set(), []
    monkeypatch.setattr(run_chapters.importlib.util, "find_spec",
                        lambda name: object() if name in modules else None)
    monkeypatch.setattr(run_chapters.importlib.metadata, "entry_points",
                        lambda group: entry_points if group == "jax_plugins" else [])
    monkeypatch.setenv("JAX_PLATFORMS", "")
    assert not run_chapters.has_accelerator_plugin()
    for found in ({"jax_plugins"}, {"libtpu"}):
        modules |= found
        assert run_chapters.has_accelerator_plugin()
        modules.clear()
    entry_points.append("xla_cuda12 = jax_cuda12_plugin")
    assert run_chapters.has_accelerator_plugin()
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # the caller asked for XLA:CPU
    assert not run_chapters.has_accelerator_plugin()
    assert "jax" not in run_chapters.__dict__


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_bad_jobs_is_one_line_naming_the_option(value, capsys):
    with pytest.raises(SystemExit) as stop:
        run_chapters.parse_args(["--jobs", value])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--jobs" in err and "at least 1" in err
