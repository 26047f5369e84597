"""`benchmarks/suite_profile.py`: every process counts JAX's events under the running test."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture
def suite_profile(benchmarks):
    """The script as a module (importing it starts neither JAX nor pytest)."""
    import suite_profile

    return suite_profile


def _child(site: Path, folder: Path, code: str, test: str, theirs: Path | None = None):
    path = [str(site)] + ([str(theirs)] if theirs else []) + [str(ROOT)]
    env = dict(os.environ, GCLAB_SUITE_PROFILE=str(folder), PYTEST_CURRENT_TEST=test,
               PYTHONPATH=os.pathsep.join(path))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # a compile, not a cache hit
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)


def test_a_child_process_counts_its_compiles_under_the_test_that_started_it(
        suite_profile, tmp_path):
    site, folder, theirs = tmp_path / "site", tmp_path / "events", tmp_path / "theirs"
    for d in (site, folder, theirs):
        d.mkdir()
    (site / "sitecustomize.py").write_text(suite_profile.SITECUSTOMIZE)
    # The environment's own sitecustomize, hidden by ours, still runs.
    (theirs / "sitecustomize.py").write_text(
        f"open({str(tmp_path / 'theirs-ran')!r}, 'w').close()\n")
    _child(site, folder, "import jax; jax.jit(lambda x: x * 3.0 + 1.0)(2.0)",
           "tests/a/test_x.py::test_one (call)", theirs)
    assert (tmp_path / "theirs-ran").exists()
    _child(site, folder, "print(1 + 1)", "tests/b/test_y.py::test_two (call)")  # no JAX
    sums, processes, started = suite_profile.events(folder)
    assert set(sums) == {"tests/a/test_x.py"} and processes == {"tests/a/test_x.py": 1}
    assert sums["tests/a/test_x.py"]["compile_seconds"] > 0
    assert sums["tests/a/test_x.py"]["trace_and_lower_seconds"] > 0
    assert len(started) == 1 and suite_profile.kind(started[0]) == "python -c (a test's script)"


def test_durations_are_summed_per_file_and_chapter(suite_profile):
    output = "\n".join([
        "============ slowest durations ============",
        "12.50s call     book/03_remat.ipynb::03_remat.ipynb",
        "2.00s setup    tests/x/test_a.py::test_one[1]",
        "1.25s call     tests/x/test_a.py::test_one[1]",
        "0.75s call     tests/x/test_a.py::test_two",
        "====== 3 passed in 20.00s ======",
    ])
    seconds, items = suite_profile.durations(output)
    assert seconds == {"book/03_remat.ipynb": 12.5, "tests/x/test_a.py": 4.0}
    assert items == {"book/03_remat.ipynb": 1, "tests/x/test_a.py": 2}


@pytest.mark.parametrize("command, kind", [
    ("-m ipykernel_launcher -f /tmp/k.json", "chapter kernel"),
    ("-u -c import sys;exec(eval(sys.stdin.readline()))", "xdist worker"),
    ("-m gclab train", "gclab (python -m)"),
    ("/repo/tests/parallel/layout_worker.py 8 data:2", "a script (layout_worker.py)"),
])
def test_processes_are_named_by_their_command(suite_profile, command, kind):
    assert suite_profile.kind(command) == kind


def test_a_bad_top_is_one_line_and_writes_nothing(suite_profile, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in RESULTS.iterdir()}
    with pytest.raises(SystemExit) as exit_:
        suite_profile.main(["--top", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == "suite_profile.py: error: --top 0: an integer >= 1"
    assert {p.name: p.stat().st_mtime_ns for p in RESULTS.iterdir()} == before
