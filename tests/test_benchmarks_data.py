"""The benchmark scripts' options: a bad one is refused in one line, before any work, and a
failed run leaves the recorded results as they were; a child process a script starts
imports this checkout first.

Every script runs in this process with its slow work stubbed (a stub that is called fails
the test) and every file it would write under `tmp_path`.
"""

import json
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"


def never(*args, **kwargs):
    raise AssertionError("work started (or a file was written) for a refused option")


def refused(capsys, main, argv) -> str:
    """The one line `main(argv)` exits 2 with (argparse's ``parser.error``)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err)
    return err[-1]


def test_the_claim_s_memory_first_schedule_row_lowers_compiled_temp(benchmarks):
    """The authors'-claim row compiled with XLA:CPU ordering the program for memory (a flag
    read when JAX starts, so in a fresh process) plans less temp than XLA's default order,
    for the same arguments: `lean` at 4 deg / 3 splits, 4 x 32 (55 -> 31 MB measured)."""
    import memory_recipes as mr

    from gclab.config import get_preset
    from gclab.memory import get_recipe
    from gclab.sizing import StepSpec, train_step_memory

    if mr.MEMORY_FIRST_OPTION in os.environ.get("XLA_FLAGS", ""):
        pytest.skip("XLA_FLAGS set the scheduler already: no default order to compare with")
    preset = get_preset("cpu-4x32")
    spec = StepSpec(preset.model, preset.task, get_recipe("lean"))
    ordered, default = mr.memory_with_flags(spec, mr.MEMORY_FIRST_FLAG), train_step_memory(spec)
    assert ordered.temp_bytes < 0.8 * default.temp_bytes
    assert (ordered.argument_bytes, ordered.output_bytes) == (default.argument_bytes,
                                                             default.output_bytes)
    with pytest.raises(RuntimeError, match="--xla_no_such_flag"):
        mr.memory_with_flags(spec, "--xla_no_such_flag=1")


@pytest.mark.parametrize("value", ["false", "true"])
def test_memory_recipes_refuse_xla_flags_that_set_the_scheduler(benchmarks, monkeypatch,
                                                                tmp_path, capsys, value):
    """Every recorded row is XLA's default order: a run under XLA_FLAGS that set the
    scheduler is refused in one line, before anything compiles or is written."""
    import memory_recipes as mr

    monkeypatch.setattr(mr, "RESULTS", tmp_path)
    monkeypatch.setattr(mr, "recipe_table", lambda *a, **k: pytest.fail("compiled"))
    monkeypatch.setenv("XLA_FLAGS", f"--xla_cpu_enable_concurrency_optimized_scheduler={value}")
    line = refused(capsys, mr.main, ["--quick"])
    assert line.endswith("error: XLA_FLAGS sets --xla_cpu_enable_concurrency_optimized_"
                         "scheduler: the recorded figures are XLA's default order (the "
                         "authors'-claim row sets it in a process of its own); run without it")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, option", [
    (["--quick", "--report-only"], "--report-only"),
    (["--quick", "--only", "f32"], "--only f32"),
    (["--quick", "--only", "claim"], "--only claim"),
])
def test_memory_recipes_quick_with_no_quick_record_says_so(benchmarks, monkeypatch, tmp_path,
                                                           capsys, argv, option):
    import memory_recipes as mr

    monkeypatch.setattr(mr, "RESULTS", tmp_path)
    monkeypatch.setattr(mr, "hardware", lambda: {"backend": "cpu"})
    for name in ("recipe_table", "rollout_rows", "step_times", "layer_norm_errors",
                 "authors_claim", "write_text_atomic"):
        monkeypatch.setattr(mr, name, never)
    assert refused(capsys, mr.main, argv).endswith(
        f"error: {option}: no recorded memory-cpu-quick.json; run --quick first")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def era5(benchmarks, monkeypatch, tmp_path):
    import era5_streaming

    monkeypatch.setattr(era5_streaming, "ROOT", tmp_path)
    monkeypatch.setattr(era5_streaming, "provenance", never)
    monkeypatch.setattr(era5_streaming, "write_text_atomic", never)
    return era5_streaming


@pytest.mark.parametrize("argv, line", [
    (["--resolution", "0"], "--resolution 0: a positive number of degrees, at most 180, "
                            "that divides 180"),
    (["--resolution", "7"], "--resolution 7: 180 / resolution must be a whole number "
                            "(e.g. 0.25, 1, 4, 10)"),
    (["--steps", "0"], "--steps 0: an integer >= 6 (two input frames and the 4 target(s) "
                       "of the longest --rollouts)"),
    (["--steps", "3"], "--steps 3: an integer >= 6 (two input frames and the 4 target(s) "
                       "of the longest --rollouts)"),
    (["--steps", "4", "--rollouts", "1,3"], "--steps 4: an integer >= 5 (two input frames "
                                            "and the 3 target(s) of the longest --rollouts)"),
    (["--rollouts", "x"], "argument --rollouts: 'x': comma-separated integers >= 1"),
    (["--rollouts", "0"], "argument --rollouts: '0': comma-separated integers >= 1"),
    (["--rollouts", "1,,4"], "argument --rollouts: '1,,4': comma-separated integers >= 1"),
])
def test_era5_streaming_refuses_a_bad_option_in_one_line(era5, capsys, tmp_path, argv, line):
    assert refused(capsys, era5.main, argv).endswith(f"error: {line}")
    assert list(tmp_path.iterdir()) == []


def test_official_forecast_refuses_steps_below_one(benchmarks, monkeypatch, tmp_path, capsys):
    import official_forecast as official

    for name in ("provenance", "run", "write_text_atomic"):
        monkeypatch.setattr(official, name, never)
    (tmp_path / "graphcast").mkdir()  # what a checkout of the official code has
    (tmp_path / "graphcast" / "graphcast.py").touch()
    for steps in ("0", "-1"):
        assert refused(capsys, official.main, ["--official", str(tmp_path), "--steps", steps]
                       ).endswith(f"error: --steps {steps}: an integer >= 1")


@pytest.fixture
def calibration(benchmarks, monkeypatch, tmp_path):
    """`planner_calibration.py` on this CPU, writing under `tmp_path`, measuring nothing;
    `results/` holds a copy of the recorded fit."""
    import planner_calibration as pc

    for name in ("RESULTS", "SHIPPED"):
        (tmp_path / name.lower()).mkdir()
        monkeypatch.setattr(pc, name, tmp_path / name.lower())
    monkeypatch.setattr(pc, "calibration_name", lambda device: "planner-calibration-cpu")
    monkeypatch.setattr(pc, "hardware", lambda: {"device": "stub"})
    monkeypatch.setattr(pc, "measure", never)
    return pc


def test_planner_calibration_refit_with_no_record_says_so(calibration, monkeypatch, capsys,
                                                          tmp_path):
    monkeypatch.setattr(calibration, "finish", never)
    assert refused(capsys, calibration.main, ["--refit"]).endswith(
        "error: --refit: no recorded planner-calibration-cpu.json for this device; run "
        "without --refit first")
    assert list((tmp_path / "shipped").iterdir()) == []


def _recorded(tmp_path: Path) -> tuple[Path, bytes, list]:
    out = tmp_path / "results" / "planner-calibration-cpu.json"
    shutil.copy(RESULTS / "planner-calibration-cpu.json", out)
    rows = [{k: r[k] for k in ("preset", "label", "batch", "rollout", "memory",
                               "median_seconds", "all_seconds")}
            for r in json.loads(out.read_text())["measurements"]]
    return out, out.read_bytes(), rows


def test_planner_calibration_with_too_few_rows_keeps_the_fitted_record(
        calibration, monkeypatch, capsys, tmp_path):
    out, before, rows = _recorded(tmp_path)
    monkeypatch.setattr(calibration, "measure", lambda name, labels, repeats: (rows[:2], []))
    assert calibration.main(["--presets", "cpu-8x128", "--repeats", "1"]) == 2
    failed = tmp_path / "results" / "planner-calibration-cpu-failed.json"
    assert capsys.readouterr().err.strip().endswith(f"measurements kept in {failed}")
    assert out.read_bytes() == before and "fit" in json.loads(before)
    assert json.loads(failed.read_text())["measurements"] == rows[:2]
    assert list((tmp_path / "shipped").iterdir()) == []


def test_planner_calibration_whose_fit_fails_keeps_the_fitted_record(calibration, monkeypatch,
                                                                     tmp_path):
    out, before, rows = _recorded(tmp_path)

    def finish(record):
        raise RuntimeError("stub: the fit failed")

    monkeypatch.setattr(calibration, "measure", lambda name, labels, repeats: (rows, []))
    monkeypatch.setattr(calibration, "finish", finish)
    with pytest.raises(RuntimeError, match="stub: the fit failed"):
        calibration.main(["--presets", "cpu-8x128", "--repeats", "1"])
    assert out.read_bytes() == before
    failed = tmp_path / "results" / "planner-calibration-cpu-failed.json"
    assert json.loads(failed.read_text())["measurements"] == rows
    assert list((tmp_path / "shipped").iterdir()) == []


def test_a_benchmark_child_imports_this_checkout_first_with_no_empty_path_entry(benchmarks):
    from children import ROOT, child_env

    here = str(ROOT)
    assert child_env({})["PYTHONPATH"] == here
    assert child_env({"PYTHONPATH": ""})["PYTHONPATH"] == here  # not "ROOT:" (the cwd)
    joined = child_env({"PYTHONPATH": os.pathsep.join(["/a", "", here, "/b"])})["PYTHONPATH"]
    assert joined.split(os.pathsep) == [here, "/a", "/b"]
    env = child_env({"XLA_FLAGS": "--x", "HOME": "/h"}, XLA_FLAGS="--y")
    assert (env["XLA_FLAGS"], env["HOME"]) == ("--y", "/h")
    assert child_env(PYTHONPATH_EXTRA="1")["PATH"] == os.environ["PATH"]  # os.environ's
