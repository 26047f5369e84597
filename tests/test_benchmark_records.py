"""The benchmark scripts' records: what a run writes, where, and what it leaves as it was.

The slow work (compiles, kernels, fresh clones, the official model) is replaced by stubs;
every file is written under `tmp_path`. Scripts that set JAX's simulated device count when
imported (`cluster_plans.py`, `parallel_memory.py`, `pipeline_memory.py`) run in a fresh
process, whose stubs say on stdout when slow work is reached: a bad option is refused in one
line before any of it. The refusals of one script share one such process (`_refusals`): each
is its `main` run in a folder of its own, as a process of its own would run it, and starting
one process per refusal took about 2 s each (importing JAX and gclab).
"""

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"
RECORDINGS = ROOT / "gclab" / "recordings"


def _stub(tmp_path: Path, code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Runs `code` (a script importing a benchmark and stubbing its slow parts) in a fresh
    process in `tmp_path`; its arguments are `args`, `env` added to its environment."""
    path = tmp_path / "stub.py"
    path.write_text(textwrap.dedent(code))
    env = {**os.environ, **env,
           "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), str(ROOT)])}
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def _stamps(folder: Path) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


# The end of a stub script run as the benchmark is: its `main` on the command line's
# arguments.
RUN_MAIN = "sys.exit(main(sys.argv[1:]))\n"

# The end of a stub script that runs `main` once per case: the cases are a JSON file
# {key: [folder, argv]}, each run in its folder with what it prints caught, as a process of
# its own would run (its exit status, stdout, stderr, and the files left in its folder).
RUN_CASES = """
import contextlib, io, json, os, traceback

ran = {}
for key, (folder, argv) in json.loads(open(sys.argv[1]).read()).items():
    os.chdir(folder)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        except Exception:
            traceback.print_exc()
            code = 1
    ran[key] = {"returncode": 0 if code is None else code, "stdout": out.getvalue(),
                "stderr": err.getvalue(), "files": sorted(os.listdir())}
with open(sys.argv[2], "w") as f:
    json.dump(ran, f)
"""


def _refusals(root: Path, stubs: str, cases: dict) -> dict:
    """Every case of `cases` ({key: setup}) run through the script of `stubs` in one fresh
    process: `setup(folder)` writes what the case needs into a fresh folder and returns its
    arguments. Per key: the folder, and the run's `returncode`, `stdout`, `stderr` and `files`
    (the names left in its folder)."""
    folders, todo = {}, {}
    for n, (key, setup) in enumerate(cases.items()):
        folders[key] = root / f"case{n}"
        folders[key].mkdir()
        todo[key] = [str(folders[key]), setup(folders[key])]
    (root / "cases.json").write_text(json.dumps(todo))
    r = _stub(root, stubs + RUN_CASES, str(root / "cases.json"), str(root / "ran.json"))
    assert r.returncode == 0, r.stderr
    ran = json.loads((root / "ran.json").read_text())
    return {key: types.SimpleNamespace(folder=folders[key], **ran[key]) for key in cases}


def _refused(r: subprocess.CompletedProcess | types.SimpleNamespace, option: str) -> str:
    """The error line of a run (a process, or a case of `_refusals`) refused at parse time;
    asserts nothing ran."""
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"stub.py: error: {option}"), line
    return line


# cluster_plans.py: one planner run replaced by a row that names the run (and says so on
# stdout).
CLUSTER_STUBS = """
import sys
import cluster_plans as cp

def plan_row(cluster, preset, batch, precision, recipes):
    print("planned", cluster, batch, precision, flush=True)
    devices, card = cp.CLUSTERS[cluster]
    return {"cluster": cluster, "devices": devices, "card": card, "preset": preset,
            "batch": batch, "precision": precision, "recipes": recipes, "fits": False,
            "explanation": "stub: nothing fits", "candidates": [], "seconds": 0.0,
            "date": "2030-01-01T00:00:00+00:00", "commit": "stub"}

cp.plan_row = plan_row
main = cp.main
"""
CLUSTER_STUB = CLUSTER_STUBS + RUN_MAIN


def test_cluster_plans_of_one_cluster_keep_the_other_clusters_rows(tmp_path):
    out = tmp_path / "plans.json"
    shutil.copy(RESULTS / "cluster-plans-cpu.json", out)
    before = json.loads(out.read_text())["rows"]
    shipped = _stamps(RECORDINGS)
    r = _stub(tmp_path, CLUSTER_STUB, "--clusters", "8xA100-40GB", "--precisions", "f32",
              "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    asked = [r for r in rows if r["cluster"] == "8xA100-40GB" and r["precision"] == "f32"]
    assert asked and all(r["commit"] == "stub" for r in asked)
    kept = [r for r in rows if r not in asked]
    assert kept == [{"date": r.get("date"), **r} for r in before
                    if not (r["cluster"] == "8xA100-40GB" and r["precision"] == "f32")]
    assert {r["cluster"] for r in rows} == {"8xV100-16GB", "8xA100-40GB", "32xTPU-v4"}
    assert _stamps(RECORDINGS) == shipped  # --out elsewhere: the shipped copy is left alone


def test_cluster_plans_of_another_preset_are_refused_in_one_line(tmp_path):
    out = tmp_path / "plans.json"
    shutil.copy(RESULTS / "cluster-plans-cpu.json", out)
    before = out.read_bytes()
    r = _stub(tmp_path, CLUSTER_STUB, "--preset", "graphcast-small", "--clusters",
              "8xA100-40GB", "--out", str(out))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (
        f"stub.py: error: --preset graphcast-small: {out} records graphcast; write another "
        "preset's plans elsewhere with --out FILE.json")
    assert out.read_bytes() == before
    # A file of its own takes that preset's rows only.
    other = tmp_path / "small.json"
    r = _stub(tmp_path, CLUSTER_STUB, "--preset", "graphcast-small", "--clusters",
              "8xA100-40GB", "--out", str(other))
    assert r.returncode == 0, r.stderr
    assert {r["preset"] for r in json.loads(other.read_text())["rows"]} == {"graphcast-small"}


def test_memory_recipes_quick_run_writes_its_own_file(benchmarks, monkeypatch, tmp_path):
    import memory_recipes as mr

    rec = json.loads((RESULTS / "memory-cpu.json").read_text())
    monkeypatch.setattr(mr, "recipe_table", lambda presets, precisions: [
        r for r in rec["recipes"] if r["preset"] in presets and r["precision"] in precisions])
    monkeypatch.setattr(mr, "rollout_rows", lambda preset: rec["rollout"])
    monkeypatch.setattr(mr, "step_times", lambda preset: rec["step_time"])
    monkeypatch.setattr(mr, "layer_norm_errors", lambda: rec["layer_norm_bf16_error"])
    monkeypatch.setattr(mr, "RESULTS", tmp_path / "results")
    (tmp_path / "shipped").mkdir()
    monkeypatch.setattr(mr, "SHIPPED", tmp_path / "shipped" / "memory-cpu.json")
    assert mr.main(["--quick"]) == 0
    backend = mr.hardware()["backend"]
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        f"memory-{backend}-quick.json", f"memory-{backend}-quick.md"]
    assert list((tmp_path / "shipped").iterdir()) == []
    written = json.loads((tmp_path / "results" / f"memory-{backend}-quick.json").read_text())
    assert {r["preset"] for r in written["recipes"]} == {"cpu-16x512"}


@pytest.fixture
def chapter_profile(benchmarks, monkeypatch, tmp_path):
    """`chapter_profile.py` with its kernel run stubbed, writing under tmp_path/results."""
    import chapter_profile as cp
    import fresh_clone

    monkeypatch.setattr(cp, "profile", lambda path, timeout, slowest: {
        "chapter": path.stem, "seconds": 14.0, "compile_seconds": 5.0,
        "trace_and_lower_seconds": 1.0, "cache_saved_seconds": 0.0, "slowest_cells": []})
    monkeypatch.setattr(fresh_clone, "RESULTS", tmp_path / "results")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    monkeypatch.setattr(cp.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "jax"))
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    return cp


@pytest.mark.parametrize("args, flags, message", [
    (["--chapters", "01"], "", "--chapters 01: some chapters only; name the record with "
     "--name NAME (writes chapter-profile-<backend>-NAME.json)"),
    ([], "--xla_cpu_use_fusion_emitters=false", "XLA_FLAGS=--xla_cpu_use_fusion_emitters="
     "false: not the book's settings; name the record with --name NAME (writes "
     "chapter-profile-<backend>-NAME.json)"),
    (["--name", "Test flags"], "", "--name Test flags: lower-case letters and digits joined "
     "by '-', e.g. elemental-emitter"),
])
def test_chapter_profile_other_runs_need_a_name(chapter_profile, monkeypatch, tmp_path,
                                                capsys, args, flags, message):
    if flags:
        monkeypatch.setenv("XLA_FLAGS", flags)
    with pytest.raises(SystemExit) as e:
        chapter_profile.main(args)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == f"chapter_profile.py: error: {message}"
    assert not (tmp_path / "results").exists()


def test_chapter_profile_named_run_writes_beside_the_books(chapter_profile, monkeypatch,
                                                           tmp_path):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=false")
    assert chapter_profile.main(["--chapters", "01", "--name", "elemental-emitter"]) == 0
    backend = json.loads(next((tmp_path / "results").iterdir()).read_text())["hardware"][
        "backend"]
    out = tmp_path / "results" / f"chapter-profile-{backend}-elemental-emitter.json"
    assert [p.name for p in (tmp_path / "results").iterdir()] == [out.name]
    record = json.loads(out.read_text())
    assert [c["chapter"][:2] for c in record["chapters"]] == ["01"]
    assert record["xla_flags"] == "--xla_cpu_use_fusion_emitters=false"


CLUSTER_BAD_OPTIONS = [
    (["--batches", "x"], "--batches", "'x'"),
    (["--batches", "0"], "--batches", "'0'"),
    (["--precisions", "f64"], "--precisions", "'f64'"),
    (["--precisions", "f32,f64"], "--precisions", "'f64'"),
    (["--recipes", "leen"], "--recipes", "'leen'"),
    (["--out", "/proc/x/y.json"], "--out", "/proc/x"),
    (["--out", "{rows}"], "--out", "no list of rows"),
]


@pytest.fixture(scope="module")
def cluster_refusals(tmp_path_factory):
    """The runs of `CLUSTER_BAD_OPTIONS` (by `json.dumps(args)`), each beside a plans.json
    of no rows that it names with --out, and of an unknown preset with the default record
    ("unknown preset", with the mtime of that record before it as `record_before`)."""
    def bad_option(args):
        def setup(folder):
            out = folder / "plans.json"
            out.write_text('{"hardware": {}}')
            args_ = [str(out) if a == "{rows}" else a for a in args]
            if "--out" not in args_:
                args_ += ["--out", str(out)]
            return ["--clusters", "8xA100-40GB", *args_]
        return setup

    cases = {json.dumps(args): bad_option(args) for args, _, _ in CLUSTER_BAD_OPTIONS}
    cases["unknown preset"] = lambda folder: ["--preset", "graphcst"]
    before = (RESULTS / "cluster-plans-cpu.json").stat().st_mtime_ns
    ran = _refusals(tmp_path_factory.mktemp("cluster-plans"), CLUSTER_STUBS, cases)
    ran["unknown preset"].record_before = before
    return ran


@pytest.mark.xdist_group("cluster-plans-refusals")
@pytest.mark.parametrize("args, option, said", CLUSTER_BAD_OPTIONS)
def test_cluster_plans_bad_options_are_refused_before_any_plan(cluster_refusals, args, option,
                                                               said):
    r = cluster_refusals[json.dumps(args)]
    assert said in _refused(r, option)
    assert (r.folder / "plans.json").read_text() == '{"hardware": {}}'
    assert r.files == ["plans.json"]


@pytest.mark.xdist_group("cluster-plans-refusals")
def test_cluster_plans_unknown_preset_is_named_as_such(cluster_refusals):
    """With the default record (which holds another preset's rows), the unknown preset is
    what the line names; nothing is written."""
    r = cluster_refusals["unknown preset"]
    line = _refused(r, "--preset")
    assert "unknown preset 'graphcst'" in line and "write another preset" not in line
    assert (RESULTS / "cluster-plans-cpu.json").stat().st_mtime_ns == r.record_before
    assert r.files == []


# parallel_memory.py: each compile replaced by fixed figures (and said on stdout); FAIL_AT
# makes one raise.
PARALLEL_STUBS = """
import os, sys, types
from pathlib import Path
import parallel_memory as pm

calls = []

def compile_train_step(spec):
    print("compiled", spec.parallel.spec, flush=True)
    calls.append(spec)
    if len(calls) == int(os.environ.get("FAIL_AT", "0")):
        raise RuntimeError("stub: compile failed")
    n = spec.parallel.devices
    memory = {"temp_bytes": 2**30 // n, "argument_bytes": 2**20, "output_bytes": 2**20,
              "collective_bytes": 2**10 * (n - 1)}
    return types.SimpleNamespace(memory=types.SimpleNamespace(to_dict=lambda: memory),
                                 collectives={})

pm.compile_train_step = compile_train_step
pm.predicted = lambda row: 0.5
pm.RESULTS = Path("results")
pm.SHIPPED = Path("shipped")
main = pm.main
"""
PARALLEL_STUB = PARALLEL_STUBS + RUN_MAIN


def test_parallel_memory_run_cut_short_leaves_the_old_record(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "shipped").mkdir()
    old = tmp_path / "results" / "parallel-memory-cpu-1deg.json"
    old.write_text('{"rows": "old"}')
    r = _stub(tmp_path, PARALLEL_STUB, "--presets", "graphcast-small", "--devices", "1,2",
              FAIL_AT="3")
    assert r.returncode == 1 and "stub: compile failed" in r.stderr
    assert old.read_text() == '{"rows": "old"}'
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [old.name]


def test_parallel_memory_run_of_some_layouts_keeps_the_other_rows(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "shipped").mkdir()
    shipped = tmp_path / "shipped" / "parallel-memory-cpu-1deg.json"
    shipped.write_text("{}")
    path = tmp_path / "results" / "parallel-memory-cpu-1deg.json"
    r = _stub(tmp_path, PARALLEL_STUB, "--presets", "graphcast-small", "--devices", "1,2")
    assert r.returncode == 0, r.stderr
    # The files the README reads, and the shipped copy where the package ships one.
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "parallel-memory-cpu-1deg.json", "parallel-memory-cpu-1deg.md"]
    first = json.loads(path.read_text())
    assert [row["devices"] for row in first["rows"]] == [1, 2, 2, 2]
    assert json.loads(shipped.read_text()) == first
    # A row recorded before rows carried a date takes its file's.
    del first["rows"][1]["date"]
    first["hardware"]["date"] = "2026-01-02T03:04:05+00:00"
    path.write_text(json.dumps(first))
    r = _stub(tmp_path, PARALLEL_STUB, "--presets", "graphcast-small", "--devices", "2,4",
              "--layouts", "data")
    assert r.returncode == 0, r.stderr
    rows = json.loads(path.read_text())["rows"]
    assert [(row["devices"], row["parallel"]) for row in rows] == [
        (1, "data:1,spatial:1"), (2, "data:1,spatial:2"),
        (2, "data:1,spatial:2,mesh-nodes:replicated"), (2, "data:2,spatial:1"),
        (4, "data:4,spatial:1")]
    assert rows[1]["date"] == "2026-01-02T03:04:05+00:00"
    assert rows[3]["date"] == rows[4]["date"] != rows[1]["date"]
    assert "| 4 |" in path.with_suffix(".md").read_text()


PARALLEL_BAD_OPTIONS = [
    (["--presets", "graphcst"], "--presets"),
    (["--presets", "graphcast-small,typo"], "--presets"),
    (["--recipes", "leen"], "--recipes"),
    (["--devices", "x"], "--devices x"),
    (["--devices", "0"], "--devices 0"),
    (["--devices", "1,16"], "--devices 1,16"),
    (["--annotate", "/nope.json"], "--annotate /nope.json"),
    (["--out", "/proc/x"], "--out"),
]
WRONG_RECORDS = [
    ("{not json", "JSONDecodeError"),
    ("[1, 2]", "TypeError"),
    ('{"rows": [1]}', "TypeError"),
    ('{"rows": {}}', "its rows are not a list"),
    ('{"rows": [{"preset": "graphcast-small"}]}', "KeyError('hardware')"),
]


@pytest.fixture(scope="module")
def parallel_refusals(tmp_path_factory):
    """The runs of `PARALLEL_BAD_OPTIONS` (by `json.dumps(args)`, each with --out a results
    folder in its own), and of --annotate of each of `WRONG_RECORDS` (by its text, as
    parallel-memory-cpu-1deg.json in its folder)."""
    def bad_option(args):
        return lambda folder: ["--out", str(folder / "results"), *args]

    def wrong_record(text):
        def setup(folder):
            bad = folder / "parallel-memory-cpu-1deg.json"
            bad.write_text(text)
            return ["--annotate", str(bad)]
        return setup

    cases = {json.dumps(args): bad_option(args) for args, _ in PARALLEL_BAD_OPTIONS}
    cases.update({text: wrong_record(text) for text, _ in WRONG_RECORDS})
    return _refusals(tmp_path_factory.mktemp("parallel-memory"), PARALLEL_STUBS, cases)


@pytest.mark.xdist_group("parallel-memory-refusals")
@pytest.mark.parametrize("args, option", PARALLEL_BAD_OPTIONS)
def test_parallel_memory_bad_options_are_refused_before_any_compile(parallel_refusals, args,
                                                                    option):
    r = parallel_refusals[json.dumps(args)]
    line = _refused(r, option)
    if option == "--presets":
        assert "typo" in line or "graphcst" in line
    assert r.files == []


@pytest.mark.xdist_group("parallel-memory-refusals")
@pytest.mark.parametrize("text, said", WRONG_RECORDS)
def test_parallel_memory_annotate_of_a_wrong_file_is_one_line(parallel_refusals, text, said):
    """A file that is not a record of this script is refused in one line naming the option,
    and is left as it was (it gave a traceback)."""
    r = parallel_refusals[text]
    bad = r.folder / "parallel-memory-cpu-1deg.json"
    line = _refused(r, f"--annotate {bad}: not a parallel-memory record")
    assert said in line
    assert bad.read_text() == text
    assert r.files == [bad.name]


# pipeline_memory.py: the planner's work replaced by a choice where nothing fits.
PIPELINE_STUBS = """
import sys, types
from pathlib import Path
import pipeline_memory as pm

hw = {"backend": "cpu", "date": "2030-01-01T00:00:00+00:00", "cpu_count": 2,
      "simulated_devices": 4, "jax": "stub", "load_average_1min": 0.0}
pm.RESULTS = Path("results")
pm.hardware = lambda: dict(hw)
pm.load_calibration = lambda backend: types.SimpleNamespace(
    seconds_per_flop=1e-9, seconds_per_held_byte=0.0, overhead_seconds=0.0,
    to_dict=lambda: {"name": "stub", "source": "stub"})
pm.graphs_for = lambda model: types.SimpleNamespace(
    grid2mesh=types.SimpleNamespace(num_edges=1))
pm.GraphCounts = types.SimpleNamespace(for_model=lambda *a: None)
pm.stage_flops = lambda *a: {}
pm.fit_stage_costs = lambda *a: types.SimpleNamespace()
pm.cpu_costs = lambda *a: None
pm.evaluate = lambda *a: types.SimpleNamespace(memory_bytes=[2**20])
pm.plan_pipeline = lambda *a, **k: types.SimpleNamespace(
    uniform=None, milp=None, compiled_uniform=None, compiled_milp=None,
    costs=types.SimpleNamespace(), extra_bytes=0)
main = pm.main
"""
PIPELINE_STUB = PIPELINE_STUBS + RUN_MAIN


FRACTIONS = ["0", "-0.5", "1.5", "nan"]


@pytest.fixture(scope="module")
def pipeline_refusals(tmp_path_factory):
    """The runs of each --fraction of `FRACTIONS`, each in a folder of its own."""
    cases = {f: (lambda folder, f=f: ["--fraction", f]) for f in FRACTIONS}
    return _refusals(tmp_path_factory.mktemp("pipeline-memory"), PIPELINE_STUBS, cases)


@pytest.mark.xdist_group("pipeline-memory-refusals")
@pytest.mark.parametrize("fraction", FRACTIONS)
def test_pipeline_memory_fraction_out_of_range_is_refused_before_any_work(pipeline_refusals,
                                                                          fraction):
    r = pipeline_refusals[fraction]
    line = _refused(r, f"--fraction {fraction}")
    assert "> 0 and <= 1" in line
    assert r.files == []


def test_pipeline_memory_run_of_some_stages_keeps_the_other_rows(tmp_path):
    out = tmp_path / "pipeline.json"
    shutil.copy(RESULTS / "pipeline-cpu.json", out)
    before = json.loads(out.read_text())
    r = _stub(tmp_path, PIPELINE_STUB, "--stages", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(row["preset"], row["stages"]) for row in rows] == [("cpu-8x128", 2),
                                                                ("cpu-8x128", 4)]
    assert rows[0]["uniform"] is None and rows[0]["date"] == "2030-01-01T00:00:00+00:00"
    old4 = next(row for row in before["rows"] if row["stages"] == 4)
    assert rows[1] == {"preset": "cpu-8x128", "date": before["hardware"]["date"], **old4}
    assert "| cpu-8x128 | 4 |" in out.with_suffix(".md").read_text()
    assert not (tmp_path / "results").exists()  # --out: the default record is left alone


def test_pipeline_memory_marks_a_choice_over_its_budget(tmp_path):
    code = """
    import json
    import pipeline_memory as pm

    record = json.load(open(pm.RESULTS / "pipeline-cpu.json"))
    record["rows"][0]["milp"]["fits"] = False
    lines = [line for line in pm.markdown(record).splitlines() if line.startswith("| cpu")]
    print(json.dumps(lines))
    """
    r = _stub(tmp_path, code)
    assert r.returncode == 0, r.stderr
    lines = json.loads(r.stdout)
    over = [line for line in lines if "over budget" in line]
    assert len(over) == 1 and "per stage (MILP)" in over[0] and "| 2 |" in over[0]


@pytest.fixture
def gpu_stand_in(benchmarks, monkeypatch):
    """An H200 stand-in whose fresh-process measurement runs out of memory."""
    import jax
    import memory_recipes as mr

    import gclab.measure
    import gclab.sizing

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "devices", lambda *a: [types.SimpleNamespace(
        device_kind="NVIDIA H200")])
    monkeypatch.setattr(gclab.measure, "measure_peak", lambda *a, **k: types.SimpleNamespace(
        status="oom", message="RESOURCE_EXHAUSTED: out of memory", peak_bytes=None,
        result=None))
    monkeypatch.setattr(gclab.sizing, "train_step_memory", lambda spec: types.SimpleNamespace(
        total_bytes=25199706448, temp_bytes=21306622888))
    hw = {**mr.hardware(), "backend": "gpu"}
    monkeypatch.setattr(mr, "hardware", lambda: dict(hw))


def test_memory_device_claim_live_that_runs_out_of_memory_raises(gpu_stand_in):
    import memory_device as md

    with pytest.raises(RuntimeError, match="status 'oom': RESOURCE_EXHAUSTED: out of memory"):
        md.claim_live()


def test_memory_device_failed_claim_live_keeps_the_merged_measurement(gpu_stand_in,
                                                                      tmp_path):
    import memory_device as md

    earlier = json.loads((RESULTS / "memory-gpu.json").read_text())
    earlier["claim_live"] = {**earlier["claim_live"], "measure_status": "ok",
                             "measure_message": "", "peak_bytes": 24_000_000_000,
                             "measured_over_plan": 0.95, "step_seconds": 1.5}
    merge = tmp_path / "earlier.json"
    merge.write_text(json.dumps(earlier))
    out = tmp_path / "out"
    assert md.main(["--stages", "claim-live", "--merge", str(merge), "--out", str(out)]) == 0
    record = json.loads((out / "memory-gpu.json").read_text())
    assert record["claim_live"] == earlier["claim_live"]
    assert record["stages"]["claim-live"]["status"].startswith("failed: ")


@pytest.fixture
def official(benchmarks):
    import official_forecast

    return official_forecast


def test_official_forecast_a_nan_in_any_variable_does_not_agree(official):
    good = official.variable_row(np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    bad = official.variable_row(np.array([1.0, np.nan]), np.array([1.0, 2.0]))
    assert math.isnan(bad["max_abs_diff_over_std"])
    for rows in ({"a": good, "b": bad}, {"a": bad, "b": good}):
        verdict = official.agreement(rows, True, True)
        assert math.isnan(verdict["worst_max_abs_diff_over_std"])
        assert verdict["agrees"] is False
    assert official.agreement({"a": good}, True, True)["agrees"] is True


def test_official_forecast_a_constant_field_is_compared_by_its_difference(official):
    row = official.variable_row(np.array([3.0, 3.5]), np.array([3.0, 3.0]))
    assert row["std"] == 0.0 and row["max_abs_diff_over_std"] == 0.5
    verdict = official.agreement({"constant": row}, True, True)
    assert verdict["worst_max_abs_diff_over_std"] == 0.5 and verdict["agrees"] is False
    assert verdict["tolerance"]["max_abs_diff_over_std"] == official.TOLERANCE
    # Within the tolerance, but another layout or checkpoint does not agree either.
    same = official.variable_row(np.array([3.0, 3.0]), np.array([3.0, 3.0]))
    assert official.agreement({"constant": same}, True, True)["agrees"] is True
    assert official.agreement({"constant": same}, False, True)["agrees"] is False
    assert official.agreement({"constant": same}, True, False)["agrees"] is False


def test_official_forecast_that_does_not_agree_exits_1_and_keeps_the_recording(
        official, monkeypatch, tmp_path):
    import jax

    rows = {"t": official.variable_row(np.array([1.0, np.nan]), np.array([1.0, 2.0]))}
    monkeypatch.setattr(official, "provenance", lambda path: {"official": str(path)})
    monkeypatch.setattr(official, "run", lambda path, steps: {
        "variables": ["t"], "comparison": rows, **official.agreement(rows, True, True)})
    for name in ("RESULTS", "SHIPPED"):
        (tmp_path / name).mkdir()
        monkeypatch.setattr(official, name, tmp_path / name)
    (tmp_path / "graphcast").mkdir()  # what a checkout of the official code has
    (tmp_path / "graphcast" / "graphcast.py").touch()
    assert official.main(["--official", str(tmp_path)]) == 1
    backend = jax.default_backend()
    assert [p.name for p in (tmp_path / "RESULTS").iterdir()] == [
        f"official-forecast-{backend}-failed.json"]
    assert list((tmp_path / "SHIPPED").iterdir()) == []


@pytest.mark.parametrize("path", ["nonexistent", "empty"])
def test_official_forecast_that_is_not_given_a_checkout_says_so_in_one_line(
        official, monkeypatch, tmp_path, capsys, path):
    """Checked before any work starts, as `official_side_by_side.py` does: no traceback
    from importing ``graphcast``, nothing measured, nothing written."""
    def never(*args):
        raise AssertionError("ran without a checkout of the official code")

    monkeypatch.setattr(official, "provenance", never)
    monkeypatch.setattr(official, "run", never)
    monkeypatch.setattr(official, "write_text_atomic", never)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_:
        official.main(["--official", str(tmp_path / path)])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"error: --official must name a checkout of "
                     f"google-deepmind/graphcast ({tmp_path / path} has no "
                     f"graphcast/graphcast.py)")


@pytest.fixture
def nothing_written(benchmarks, monkeypatch, tmp_path):
    """`plan_example.py` and `update_readme.py` with their work stubbed and every file they
    write under `tmp_path`: the modules and the list of what they would have written."""
    import plan_example
    import update_readme

    written = []
    monkeypatch.setattr(plan_example, "subprocess", types.SimpleNamespace(
        run=lambda *a, **k: subprocess.CompletedProcess(a, 0, "the plan\n", "")))
    monkeypatch.setattr(plan_example, "commit", lambda: "abc1234")
    monkeypatch.setattr(plan_example, "hardware", lambda: {"backend": "cpu"})
    monkeypatch.setattr(plan_example, "write_record",
                        lambda name, record: written.append((name, record)))
    (tmp_path / "README.md").write_text("<!-- x:start -->\nold\n<!-- x:end -->\n")
    monkeypatch.setattr(update_readme, "ROOT", tmp_path)
    monkeypatch.setattr(update_readme, "BLOCKS", {"x": lambda: "new"})
    return plan_example, update_readme, written


@pytest.mark.parametrize("script", ["plan_example", "update_readme"])
def test_help_and_unknown_arguments_write_nothing(nothing_written, tmp_path, capsys, script):
    """``--help`` prints the usage and exits 0, an unknown argument exits 2 with argparse's
    line, neither runs nor writes (a rewritten record or README would no longer match)."""
    plan_example, update_readme, written = nothing_written
    module = {"plan_example": plan_example, "update_readme": update_readme}[script]
    readme = (tmp_path / "README.md").read_text()
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ")  # and the docstring's first line, wrapped
    assert " ".join(module.__doc__.splitlines()[0].split()) in " ".join(out.split())
    with pytest.raises(SystemExit) as exit_:
        module.main(["--bogus"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "error: unrecognized arguments: --bogus")
    assert written == [] and (tmp_path / "README.md").read_text() == readme
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]
    # Without arguments each still does its work.
    assert module.main([]) == 0
    if script == "plan_example":
        assert [(name, record["output"]) for name, record in written] == [
            ("plan-example", "the plan")]
    else:
        assert (tmp_path / "README.md").read_text() == (
            "<!-- x:start -->\nnew\n<!-- x:end -->\n")


class _FailingCI:
    """A fresh clone whose `.ci/run` fails."""

    def __init__(self, keep, prefix, system_packages=False):
        self.work = Path(keep)
        self.commit, self.environment = "abc1234", "stub environment"

    def run(self, command, log=None, **env):
        Path(log).write_text("ci: install took 3 s\n=== 1 failed, 9 passed in 2.0s ===\n")
        return 1, 3.0

    def done(self):
        pass


def test_ci_run_that_fails_keeps_the_last_passing_record(benchmarks, monkeypatch, tmp_path):
    import ci_run
    import fresh_clone

    results = tmp_path / "results"
    results.mkdir()
    passing = results / "ci-run-cpu.json"
    passing.write_text('{"passed": true}')
    monkeypatch.setattr(fresh_clone, "RESULTS", results)
    monkeypatch.setattr(ci_run, "FreshClone", _FailingCI)
    monkeypatch.setattr(ci_run, "hardware", lambda: {"backend": "cpu"})
    assert ci_run.main(["--keep", str(tmp_path)]) == 1
    assert passing.read_text() == '{"passed": true}'
    failed = json.loads((results / "ci-run-cpu-failed.json").read_text())
    assert failed["passed"] is False and failed["phase_seconds"] == {"install": 3}


def test_graph_build_records_library_versions_and_commit(benchmarks, monkeypatch, tmp_path):
    import graph_build

    child = {"seconds": 1.0, "import_seconds": 0.1, "peak_rss_bytes": 2**20,
             "counts": {"grid": 1}, "query_radius": 0.1, "normalization": {}}
    monkeypatch.setattr(graph_build, "_run_child", lambda *a: dict(child))
    out = tmp_path / "graph.json"
    graph_build.main(["--output", str(out)])
    record = json.loads(out.read_text())
    versions = record["hardware"]["versions"]
    assert set(versions) >= {"jax", "numpy", "scipy", "trimesh", "gclab"}
    assert versions["numpy"] == np.__version__
    assert record["commit"] and record["commit"] == graph_build.commit()


class _FakeCard:
    """A GPU that JAX would report: its kind and its allocator's limit (75% of the card)."""

    platform, id = "gpu", 0

    def __init__(self, kind: str, total: int):
        self.device_kind, self._limit = kind, int(0.75 * total)

    def memory_stats(self):
        return {"bytes_limit": self._limit, "bytes_in_use": 0, "peak_bytes_in_use": 0}


@pytest.fixture
def t4(monkeypatch):
    """A 16 GB Tesla T4 (about 10.9 GiB usable) as JAX's only device."""
    import jax

    card = _FakeCard("Tesla T4", 15_637_086_208)
    monkeypatch.setattr(jax, "devices", lambda *a, **k: [card])
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "device_count", lambda *a, **k: 1)
    return card


def _fake_compile(sizes: dict, ran: list):
    """`compile_train_step` with `sizes[processor_remat]` (default 2 GiB) as each compiled
    plan, refusing, as the real one does, a live step beyond the device's memory."""
    from gclab.limits import require_fits
    from gclab.sizing.step import device_memory_bytes

    def compile_train_step(spec, graphs=None, *, live=False, run_if=None, **kwargs):
        memory = types.SimpleNamespace(total_bytes=sizes.get(spec.memory.processor_remat,
                                                             2 * 2**30), temp_bytes=0)
        if run_if is not None and not run_if(memory):
            return types.SimpleNamespace(spec=spec, memory=memory, run=None)
        require_fits(f"running one training step of {spec.title()}", memory.total_bytes,
                     device_memory_bytes(), "this gpu device's memory")
        return types.SimpleNamespace(spec=spec, memory=memory,
                                     run=lambda: ran.append(spec.memory.processor_remat))

    return compile_train_step


@pytest.fixture
def calibration(benchmarks, monkeypatch, tmp_path):
    """`planner_calibration.py` writing under `tmp_path`, its steps compiled by `compile`."""
    import planner_calibration as pc

    import gclab.sizing.step

    for name in ("RESULTS", "SHIPPED"):
        (tmp_path / name.lower()).mkdir()
        monkeypatch.setattr(pc, name, tmp_path / name.lower())

    def use(compile_train_step):
        monkeypatch.setattr(gclab.sizing.step, "compile_train_step", compile_train_step)
        monkeypatch.setattr(pc, "compile_train_step", compile_train_step, raising=False)
        return pc

    return use


def test_planner_calibration_skips_candidates_that_do_not_fit_the_card(t4, calibration,
                                                                       capsys, tmp_path):
    """On a 16 GB card ``none`` and ``gam`` of graphcast-small (no remat, about 40 GiB) are
    not run: one line each says so, the recording lists them as skipped, and the candidates
    that fit are timed and fit."""
    ran = []
    pc = calibration(_fake_compile({"none": 40 * 2**30}, ran))
    assert pc.main(["--presets", "graphcast-small", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "results" / "planner-calibration-t4.json").read_text())
    skipped = {r["label"]: r["skipped"] for r in record["skipped"]}
    assert set(skipped) == {"none", "gam"}
    assert skipped["none"] == ("plan 40.00 GiB does not fit this device's "
                               "10.92 GiB usable (plans up to 90% of it)")
    assert "graphcast-small none: skipped, plan 40.00 GiB does not fit" in out
    timed = [r["label"] for r in record["measurements"]]
    assert len(timed) == 14 and not set(timed) & set(skipped)
    assert "none" not in ran and len(ran) == 2 * 14  # warmed once, timed once
    assert record["fit"]["measurements"] == 14
    shipped = tmp_path / "shipped" / "planner-calibration-t4.json"
    assert json.loads(shipped.read_text())["skipped"] == record["skipped"]


def test_planner_calibration_counts_what_the_warmed_candidates_hold(t4, calibration, capsys,
                                                                    tmp_path, monkeypatch):
    """Each warmed candidate keeps its state on the card: the next one is sized against the
    usable memory less what the card's allocator says is in use."""
    ran, held = [], []
    fake = _fake_compile({}, ran)  # every plan 2 GiB

    def compile_train_step(spec, graphs=None, **kwargs):
        step = fake(spec, graphs, **kwargs)
        if step.run is not None:
            held.append(step.memory.total_bytes)  # its arrays stay on the card
        return step

    monkeypatch.setattr(t4, "memory_stats", lambda: {
        "bytes_limit": t4._limit, "bytes_in_use": sum(held), "peak_bytes_in_use": sum(held)})
    pc = calibration(compile_train_step)
    assert pc.main(["--presets", "graphcast-small", "--repeats", "1"]) == 0
    record = json.loads((tmp_path / "results" / "planner-calibration-t4.json").read_text())
    # 10.92 GiB usable: 2 GiB plans fit 90% of what is left while 8 GiB or less is held.
    assert len(record["measurements"]) == 5 and sum(held) == 10 * 2**30
    first = record["skipped"][0]["skipped"]
    assert first == ("plan 2.00 GiB does not fit this device's 10.92 GiB usable less "
                     "10.00 GiB the candidates warmed before it hold (plans up to 90% of it)")


def test_planner_calibration_with_too_few_candidates_that_fit_says_so_in_one_line(
        t4, calibration, capsys, tmp_path):
    ran = []
    sizes = {remat: 40 * 2**30 for remat in ("none", "step", "every", "nested")}
    pc = calibration(_fake_compile(sizes, ran))
    assert pc.main(["--presets", "graphcast-small", "--repeats", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("planner_calibration.py: error: --presets graphcast-small: 0 "
                          "candidate(s) fit this device's memory") and "\n" not in err
    record = json.loads((tmp_path / "results" / "planner-calibration-t4.json").read_text())
    assert record["measurements"] == [] and len(record["skipped"]) == 16
    assert list((tmp_path / "shipped").iterdir()) == []  # no fit: nothing for the planner


def test_record_gpu_run_that_fails_on_the_card_is_not_recorded_as_running(benchmarks,
                                                                          monkeypatch):
    """A plan that fits yet whose measured run runs out of memory (or breaks) is recorded,
    and shown in the chapters, as failed on the card with the first line of its error."""
    import record_gpu

    import gclab.measure
    import gclab.notebook
    import gclab.sizing
    from gclab.measure.peak import PeakResult

    class Run:
        fits, plan_bytes, temp_bytes = True, 3 * 2**30, 2**30

        def status(self):
            return "runs (plan 3.00 GiB)"

    outcomes = iter([PeakResult("oom", "RESOURCE_EXHAUSTED: Out of memory while trying to "
                                "allocate 40.1GiB\nmore lines", backend="gpu"),
                     PeakResult("error", "child exited with status -9", backend="gpu"),
                     PeakResult("ok", backend="gpu", peak_bytes=3 * 2**30,
                                result={"step_seconds": 0.5}),
                     PeakResult("not measured", "not measured: this process holds 47.52 GiB",
                                backend="gpu")])
    monkeypatch.setattr(gclab.notebook, "run_if_fits", lambda *a, **k: Run())
    monkeypatch.setattr(gclab.notebook, "usable_here", lambda: 60 * 2**30)
    monkeypatch.setattr(gclab.measure, "measure_peak", lambda *a, **k: next(outcomes))
    part = record_gpu.Part("p", "three", lambda scale: gclab.notebook.live_configs(
        "05", scale)[:1] * 4)
    rows = record_gpu.record_part(part, gclab.notebook.scale_named("80GB"), dry_run=False,
                                  plan=record_gpu.plan_row)["rows"]
    assert [r["measure_status"] for r in rows] == ["oom", "error", "ok", "not measured"]
    assert rows[0]["status"] == ("failed on the card (oom, plan 3.00 GiB): RESOURCE_EXHAUSTED: "
                                 "Out of memory while trying to allocate 40.1GiB")
    assert rows[1]["status"] == ("failed on the card (error, plan 3.00 GiB): child exited "
                                 "with status -9")
    assert rows[2]["status"] == "runs (plan 3.00 GiB)" and rows[2]["step_seconds"] == 0.5
    # Never started (or no peak reported): the plan's verdict stays, the reason is kept.
    assert rows[3]["status"] == "runs (plan 3.00 GiB)" and rows[3]["peak_bytes"] is None
    assert rows[3]["measure_message"] == "not measured: this process holds 47.52 GiB"


def test_the_readme_gpu_table_says_how_each_row_ended(monkeypatch, tmp_path):
    """A step that failed on the card is not 'not measured' (with a footnote about another
    row); one not measured names why below the table."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import update_readme
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    folder = tmp_path / "gclab" / "recordings"
    folder.mkdir(parents=True)
    rows = [{"chapter": "05", "label": "oom", "plan_bytes": 2**30, "fits": True,
             "measure_status": "oom", "status": "failed on the card (oom, plan 1.00 GiB): x"},
            {"chapter": "05", "label": "held", "plan_bytes": 2**30, "fits": True,
             "measure_status": "not measured", "measure_message": "not measured: this "
             "process holds 9 GiB; measure from a fresh process"},
            {"chapter": "05", "label": "big", "plan_bytes": 2**40, "fits": False,
             "xla_remat": {"from_bytes": 2**41, "limit_bytes": 2**30,
                           "reduced_to_bytes": 2**40}}]
    (folder / "gpu-80GB-p.json").write_text(json.dumps({
        "hardware": {"device": "card", "jax": "0.11.2", "commit": "abc"},
        "date": "2026-11-28T00:00:00+00:00", "scale": "80GB", "rows": rows}))
    monkeypatch.setattr(update_readme, "ROOT", tmp_path)
    block = update_readme.gpu_chapters_block()
    assert "| 05 | oom | 1.00 GiB | failed on the card (oom) |  |  |" in block
    assert "| 05 | held | 1.00 GiB | not measured \\* |  |  |" in block
    assert "| 05 | big | 1024.00 GiB † | does not fit the card |  |  |" in block
    assert ("† XLA:GPU's own rematerialization pass shrank this plan while compiling, towards "
            "its limit on the card, which it could not reach: big from 2048.00 GiB.") in block
    assert block.endswith("\\* not measured: this process holds 9 GiB.")
