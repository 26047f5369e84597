"""`benchmarks/record_gpu.py`: lists its parts anywhere, refuses to record without a GPU."""

import json
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


def test_a_configuration_that_fails_is_recorded_and_each_row_is_saved_as_it_ends(monkeypatch):
    """On a lent GPU a configuration that breaks must not cost the rows already measured:
    it is recorded as failed, the next one runs, and the recording is saved after each."""
    import gclab.notebook
    import gclab.sizing

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import record_gpu
    finally:
        sys.path.remove(str(SCRIPT.parent))

    class Run:
        fits, plan_bytes, temp_bytes = False, 3 * 2**30, 2 * 2**30

        def status(self):
            return "needs 3.00 GiB, does not fit this card"

    def run_if_fits(spec, **kwargs):
        if spec.memory.precision == "bf16":
            raise TypeError("No constant handler for type: <DynamicJaxprTracer>\nmore lines")
        return Run()

    monkeypatch.setattr(gclab.notebook, "run_if_fits", run_if_fits)
    saved = []
    scale = gclab.notebook.scale_named("80GB")
    recording = record_gpu.record_part(record_gpu.PARTS[1], scale, dry_run=False,
                                       save=lambda r: saved.append(len(r["rows"])),
                                       plan=record_gpu.plan_row)
    rows = recording["rows"]
    assert saved == list(range(1, len(rows) + 1))
    failed = [r for r in rows if r["status"].startswith("failed")]
    assert failed and len(failed) < len(rows)
    assert all(r["status"] == "failed: TypeError: No constant handler for type: "
               "<DynamicJaxprTracer>" and r["fits"] is None for r in failed)
    assert all(r["plan_bytes"] == Run.plan_bytes for r in rows if r not in failed)


def _record_gpu():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import record_gpu
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return record_gpu


def test_plans_are_compiled_in_a_fresh_process():
    """On an H100, compiling the 0.25 deg `none` plan in the recording process left JAX's
    pool holding 59 GiB there (XLA:GPU autotunes on real buffers), and the next two
    measurements were refused: the plans are made in a child process, whose answer and
    whose errors come back as one row or one line."""
    from gclab.config import get_preset
    from gclab.memory import MemoryConfig
    from gclab.sizing import StepSpec

    record_gpu = _record_gpu()
    preset = get_preset("cpu-4x32")
    spec = StepSpec(preset.model, preset.task, MemoryConfig()).to_json()
    row = record_gpu.plan_in_fresh_process(spec, 2**40)
    assert row["fits"] is True and row["status"].startswith("runs (plan ")
    assert 0 < row["temp_bytes"] < row["plan_bytes"] < 2**30
    bad = {**spec, "model": {**spec["model"], "latent_size": 0}}
    with pytest.raises(record_gpu.PlanFailed, match=r"^\w+Error: .*latent_size"):
        record_gpu.plan_in_fresh_process(bad, 2**40)


@pytest.mark.parametrize("code, stdout, stderr, words", [
    (-9, "", "W0000 autotuner: some warning\n", "was killed by signal 9 and printed no plan; "
     "its last line: W0000 autotuner: some warning"),
    (0, "PLAN {not json\n", "", "exited with status 0 and printed no plan; its last line: "
     "(nothing on stderr)"),
    (134, "", "", "exited with status 134 and printed no plan"),
])
def test_a_planning_process_that_dies_is_one_line_with_how(monkeypatch, code, stdout, stderr,
                                                           words):
    """Its exit status or signal is kept even where it wrote to stderr, and a line that is
    no plan is a PlanFailed like the rest (a JSONDecodeError escaped before)."""
    record_gpu = _record_gpu()
    monkeypatch.setattr(record_gpu.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a[0], code, stdout, stderr))
    with pytest.raises(record_gpu.PlanFailed) as e:
        record_gpu.plan_in_fresh_process({}, 2**30)
    assert str(e.value).startswith(f"the planning process {words}")


def test_a_plan_that_fails_is_one_row_and_the_next_configuration_runs():
    record_gpu = _record_gpu()
    from gclab.notebook import scale_named

    answers = iter([record_gpu.PlanFailed("ValueError: the planning process broke"),
                    {"plan_bytes": 5, "temp_bytes": 1, "fits": False, "status": "no fit"}])

    def plan(spec_json, usable):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    part = record_gpu.Part("p", "two", lambda scale: record_gpu.PARTS[1].configs(scale)[:2])
    rows = record_gpu.record_part(part, scale_named("80GB"), dry_run=False, plan=plan)["rows"]
    assert rows[0]["status"] == "failed: ValueError: the planning process broke"
    assert rows[0]["plan_bytes"] is None and rows[0]["fits"] is None
    assert rows[1]["status"] == "no fit" and rows[1]["plan_bytes"] == 5


def test_an_incomplete_recording_says_so(tmp_path):
    import json

    from gclab.notebook import gpu_recording, scale_named

    record = {"hardware": {"device": "NVIDIA H200", "backend": "gpu", "jax": "0.11.2",
                           "commit": "c5e4f345cc41"},
              "date": "2026-11-26T01:55:00+00:00", "complete": False,
              "rows": [{"chapter": "05", "label": "live model bf16", "plan_bytes": None,
                        "fits": None, "status": "failed: TypeError: no constant handler"}]}
    (tmp_path / "gpu-141GB-chapters-01-05-07.json").write_text(json.dumps(record))
    title, table = gpu_recording("05", scale_named("141GB"), tmp_path)
    assert title.endswith("(incomplete: the run stopped before its last configuration)")
    assert table["plan"][0] == "n/a" and table["on the card"][0].startswith("failed")


REMAT_LINE = ("W1128 01:54:59.535602    5344 hlo_rematerialization.cc:3363] Can't reduce memory "
              "use below 54.96GiB (59009983165 bytes) by rematerialization; only reduced to "
              "235.12GiB (252461825832 bytes), down from 256.33GiB (275232756140 bytes) "
              "originally")
SHRUNK = {"limit_bytes": 59009983165, "reduced_to_bytes": 252461825832,
          "from_bytes": 275232756140}


def test_a_plan_xla_shrank_on_the_card_is_marked(monkeypatch):
    """On the H100, XLA:GPU's own remat pass shrank the 0.25 deg `none` plan from 256 to
    235 GiB while compiling: that figure is the pass's, not the recipe's, and the row says
    so (from the planning process's output)."""
    record_gpu = _record_gpu()
    row = {"plan_bytes": 5, "temp_bytes": 1, "fits": False, "status": "no fit"}
    for stderr, shrunk in ((REMAT_LINE + "\n", SHRUNK), ("W0000 other warning\n", None)):
        monkeypatch.setattr(record_gpu.subprocess, "run",
                            lambda *a, err=stderr, **k: subprocess.CompletedProcess(
                                a[0], 0, "PLAN " + json.dumps(row) + "\n", err))
        assert record_gpu.plan_in_fresh_process({}, 2**30).get("xla_remat") == shrunk


def test_report_marks_the_rows_of_a_run_from_its_output(tmp_path):
    """`--report RECORDING --log LOG` marks each row whose printed line follows XLA's report
    (a recording made while plans were compiled in the recording process), and says how
    many; bad arguments are one line."""
    recording = {"rows": [{"label": "none"}, {"label": "step"}, {"label": "lean"}]}
    (tmp_path / "r.json").write_text(json.dumps(recording))
    (tmp_path / "run.log").write_text(
        f"{REMAT_LINE}\n  none: needs 236.70 GiB, does not fit this card\n"
        "  step: needs 105.06 GiB, does not fit this card\n  lean: runs (plan 11.77 GiB)\n")
    r = _run("--report", str(tmp_path / "r.json"), "--log", str(tmp_path / "run.log"))
    assert r.returncode == 0, r.stderr
    assert "1 row(s) marked" in r.stdout
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [row.get("xla_remat") for row in rows] == [SHRUNK, None, None]
    r = _run("--report", str(tmp_path / "r.json"))
    assert r.returncode == 2 and r.stderr.strip() == (
        "record_gpu.py: error: --report and --log go together: the recording and its run's "
        "output")
    r = _run("--report", str(tmp_path / "missing.json"), "--log", str(tmp_path / "run.log"))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"record_gpu.py: error: cannot read {tmp_path / 'missing.json'}: No such file or "
        "directory")


def test_a_run_cut_short_keeps_the_earlier_recording_beside_its_own(tmp_path, monkeypatch,
                                                                    capsys):
    """A lease that ends after the first configuration must not cost the complete recording
    of an earlier run at the same path: it is set aside once, byte for byte, under a name
    that replaces nothing, and the new file holds the rows this run measured."""
    import jax

    import gclab.notebook

    record_gpu = _record_gpu()
    scale = gclab.notebook.scale_named("80GB")
    path = tmp_path / f"gpu-{scale.name}-{record_gpu.PARTS[0].name}.json"
    earlier = json.dumps({"rows": [{"label": "a"}, {"label": "b"}], "complete": True})
    path.write_text(earlier)
    (tmp_path / f"{path.stem}.previous.json").write_text("older still")

    def record_part(part, scale, dry_run, save=None, **kwargs):
        save({"part": part.name, "scale": scale.name, "rows": [{"label": "a"}]})
        save({"part": part.name, "scale": scale.name, "rows": [{"label": "a"}, {"label": "c"}]})
        raise KeyboardInterrupt  # the lease ends

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(gclab.notebook, "choose_scale", lambda: scale)
    monkeypatch.setattr(record_gpu, "hardware", lambda: {"device": "stub"})
    monkeypatch.setattr(record_gpu, "record_part", record_part)
    with pytest.raises(KeyboardInterrupt):
        record_gpu.main(["--part", "1", "--out", str(tmp_path)])
    moved = tmp_path / f"{path.stem}.previous-2.json"
    assert moved.read_text() == earlier
    assert (tmp_path / f"{path.stem}.previous.json").read_text() == "older still"
    new = json.loads(path.read_text())
    assert new["complete"] is False and [r["label"] for r in new["rows"]] == ["a", "c"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [path.name, moved.name, f"{path.stem}.previous.json"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"record_gpu.py: moved the earlier {path} to {moved}, so that this run does "
                   "not replace it"]


@pytest.mark.parametrize("recording", [{"rows": [1]}, {"rows": [{"status": "no label"}]}])
def test_report_of_rows_of_another_shape_is_one_line(tmp_path, recording):
    (tmp_path / "r.json").write_text(json.dumps(recording))
    (tmp_path / "run.log").write_text(f"{REMAT_LINE}\n  none: needs 236.70 GiB\n")
    r = _run("--report", str(tmp_path / "r.json"), "--log", str(tmp_path / "run.log"))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"record_gpu.py: error: --report {tmp_path / 'r.json'}: not a recording of this script "
        "(a row is not an object with a label)")
    assert json.loads((tmp_path / "r.json").read_text()) == recording
