"""Bad options and failed runs of `official_side_by_side.py`, `graph_build.py` and
`pipeline_compile.py`: one line naming the option (argparse's, exit 2) before any work,
a failed child said in its own words (exit 1), and no recorded file replaced by a run
that measured nothing. No benchmark runs: options are refused at parse time, and the
measurements are stand-ins."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def _script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`benchmarks/<name>` run as a command, in `cwd`."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), str(ROOT)])}
    return subprocess.run([sys.executable, str(BENCHMARKS / name), *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def _one_line_error(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    """The last line of a refusal's stderr, after checking it is no traceback."""
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def _argparse_error(capsys) -> str:
    """What an in-process refusal said after argparse's `<prog>: error: `, one line."""
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in err[0]
    return err[-1].split(": error: ", 1)[1]


def _checkout(tmp_path: Path) -> Path:
    """A folder that passes for a checkout of the official code."""
    (tmp_path / "official" / "graphcast").mkdir(parents=True)
    (tmp_path / "official" / "graphcast" / "graphcast.py").touch()
    return tmp_path / "official"


# ----------------------------------------------------------------- official_side_by_side.py


@pytest.mark.parametrize("timeout", ["0", "-5"])
def test_official_side_by_side_timeout_must_be_positive(tmp_path, timeout):
    out = tmp_path / "out"
    out.mkdir()
    proc = _script("official_side_by_side.py", "--official", str(_checkout(tmp_path)),
                   "--output-dir", str(out), f"--timeout={timeout}", cwd=tmp_path)
    assert _one_line_error(proc).endswith(
        f"error: argument --timeout: '{timeout}' is invalid: a number of seconds > 0")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("where", ["missing", "a-file"])
@pytest.mark.parametrize("report_only", [False, True])
def test_official_side_by_side_output_dir_is_checked_before_measuring(tmp_path, where,
                                                                      report_only):
    (tmp_path / "a-file").write_text("kept\n")
    extra = ["--report-only"] if report_only else ["--timeout", "1"]
    proc = _script("official_side_by_side.py", "--official", str(_checkout(tmp_path)),
                   "--output-dir", str(tmp_path / where), *extra, cwd=tmp_path)
    why = "no such folder" if where == "missing" else "not a folder"
    assert _one_line_error(proc).endswith(
        f"error: --output-dir {tmp_path / where}: {why}; an existing folder that can be "
        "written is allowed")
    assert not (tmp_path / "missing").exists()
    assert (tmp_path / "a-file").read_text() == "kept\n"


def test_official_side_by_side_report_only_with_nothing_to_report_says_so(tmp_path):
    proc = _script("official_side_by_side.py", "--report-only", "--output-dir", str(tmp_path),
                   cwd=tmp_path)
    assert _one_line_error(proc).endswith(
        f"error: --report-only: no official-<backend>.json of this benchmark in {tmp_path}")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def side_by_side(benchmarks, monkeypatch, tmp_path):
    """The module, its provenance a stand-in, and a folder holding a recorded comparison."""
    import jax
    import official_side_by_side as sbs

    monkeypatch.setattr(sbs, "provenance", lambda path: {"official": str(path)})
    out = tmp_path / "out"
    out.mkdir()
    backend = jax.default_backend()
    for suffix in (".json", ".md"):
        (out / f"official-{backend}{suffix}").write_text("the recorded comparison\n")
    return sbs, out, backend


def test_official_side_by_side_that_measures_nothing_keeps_the_record(side_by_side,
                                                                      monkeypatch, tmp_path,
                                                                      capsys):
    sbs, out, backend = side_by_side
    monkeypatch.setattr(sbs, "run_child", lambda *a, **k: {
        "status": "not measured", "reason": "exit 1: ImportError: no haiku"})
    assert sbs.main(["--official", str(_checkout(tmp_path)), "--output-dir", str(out),
                     "--skip-full"]) == 1
    assert sorted(p.name for p in out.iterdir()) == [
        f"official-{backend}-failed.json", f"official-{backend}.json", f"official-{backend}.md"]
    for suffix in (".json", ".md"):
        assert (out / f"official-{backend}{suffix}").read_text() == "the recorded comparison\n"
    failed = json.loads((out / f"official-{backend}-failed.json").read_text())
    assert failed["benchmark"] == "official_side_by_side"
    assert {r["official"]["status"] for r in failed["memory"]} == {"not measured"}
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "official_side_by_side.py: nothing was measured (first: exit 1: ImportError: no haiku)")


def test_official_side_by_side_that_measures_something_replaces_the_record(side_by_side,
                                                                           monkeypatch,
                                                                           tmp_path):
    sbs, out, backend = side_by_side
    memory = {"status": "ok", "temp_bytes": 2**30, "argument_bytes": 1, "output_bytes": 1,
              "compile_seconds": 1.0}
    monkeypatch.setattr(sbs, "run_child", lambda official, kind, *a, **k: dict(memory)
                        if kind == "memory" else {"status": "not measured", "reason": "x"})
    monkeypatch.setattr(sbs, "markdown", lambda record: "the new report\n")
    assert sbs.main(["--official", str(_checkout(tmp_path)), "--output-dir", str(out),
                     "--skip-full"]) == 0
    assert not (out / f"official-{backend}-failed.json").exists()
    record = json.loads((out / f"official-{backend}.json").read_text())
    assert record["memory"][0]["ratio_temp"] == 1.0
    assert record["step_time"][0]["status"] == "not measured"
    assert (out / f"official-{backend}.md").read_text() == "the new report\n"


# ------------------------------------------------------------------------- graph_build.py


@pytest.mark.parametrize("args, line", [
    (["--resolution", "0"], "--resolution 0.0 is invalid: a positive number of degrees, "
                            "at most 180, that divides 180"),
    (["--resolution", "7"], "--resolution 7.0 is invalid: 180 / resolution must be a whole "
                            "number (e.g. 0.25, 1, 4, 10)"),
    (["--splits", "-1"], "--splits -1 is invalid: an integer in 0..7"),
])
def test_graph_build_bad_geometry_is_refused_in_one_line(tmp_path, args, line):
    proc = _script("graph_build.py", "--output", str(tmp_path / "x.json"), *args, cwd=tmp_path)
    assert _one_line_error(proc) == f"graph_build.py: error: {line}"
    assert not (tmp_path / "x.json").exists()


def _forbidding(monkeypatch, module: str, function: str, what: str):
    """The benchmark `module`, its `function` failing the test if `what` starts."""
    loaded = importlib.import_module(module)

    def never(*args):
        raise AssertionError(f"{what} started")

    monkeypatch.setattr(loaded, function, never)
    return loaded


@pytest.fixture
def graph_build(benchmarks, monkeypatch):
    """The module, with no build allowed to start."""
    return _forbidding(monkeypatch, "graph_build", "_run_child", "a build")


def test_graph_build_other_geometry_needs_its_own_output(graph_build, capsys):
    with pytest.raises(SystemExit) as exit_:
        graph_build.main(["--resolution", "1", "--splits", "5"])
    assert exit_.value.code == 2
    assert _argparse_error(capsys) == (
        "--output is required for a geometry other than 0.25 deg / "
        "6 splits (the recorded file's)")


def test_graph_build_output_folder_is_checked_before_building(graph_build, tmp_path, capsys):
    (tmp_path / "a-file").write_text("kept\n")
    output = tmp_path / "a-file" / "x.json"
    with pytest.raises(SystemExit) as exit_:
        graph_build.main(["--output", str(output)])
    assert exit_.value.code == 2
    assert _argparse_error(capsys).startswith(
        f"--output {output}: its folder cannot be written (")
    assert (tmp_path / "a-file").read_text() == "kept\n"


def _failing_child(monkeypatch, module) -> None:
    """`module`'s children fail as a Python error does: a traceback, its error last."""
    stderr = 'Traceback (most recent call last):\n  File "<string>", line 3\nValueError: boom\n'
    monkeypatch.setattr(module, "subprocess", types.SimpleNamespace(
        run=lambda cmd, **k: subprocess.CompletedProcess(cmd, 1, "", stderr)))


def test_graph_build_failed_child_is_said_in_its_own_words(benchmarks, monkeypatch, tmp_path,
                                                           capsys):
    import graph_build as gb

    _failing_child(monkeypatch, gb)
    with pytest.raises(SystemExit) as exit_:
        gb._run_child(0.25, 6, str(tmp_path))
    assert exit_.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "graph_build.py: the build at 0.25 deg / 6 splits failed: ValueError: boom"]


# -------------------------------------------------------------------- pipeline_compile.py


@pytest.fixture
def pipeline_compile(benchmarks, monkeypatch):
    """The module, with no compile allowed to start."""
    return _forbidding(monkeypatch, "pipeline_compile", "run", "a compile")


@pytest.mark.parametrize("args, line", [
    (["--preset", "typo", "--stages", "2", "--repeats", "1"],
     "--preset: unknown preset 'typo'; known presets: "),
    (["--repeats", "0", "--stages", "2"], "--repeats 0 is invalid: an integer >= 1"),
    (["--microbatches", "0"], "--microbatches 0 is invalid: an integer >= 1"),
    (["--stages", "2,x"], "--stages '2,x' is invalid: comma-separated integers >= 1"),
    (["--stages", "0"], "--stages '0' is invalid: comma-separated integers >= 1"),
])
def test_pipeline_compile_bad_options_are_refused_in_one_line(pipeline_compile, capsys, args,
                                                              line):
    with pytest.raises(SystemExit) as exit_:
        pipeline_compile.main(args)
    assert exit_.value.code == 2
    assert _argparse_error(capsys).startswith(line)


def test_pipeline_compile_failed_child_is_said_in_its_own_words(benchmarks, monkeypatch,
                                                                capsys):
    import pipeline_compile as pc

    _failing_child(monkeypatch, pc)
    with pytest.raises(SystemExit) as exit_:
        pc.run(2, "cpu-8x128", 4, True)
    assert exit_.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "pipeline_compile.py: P=2 shared failed: ValueError: boom"]
