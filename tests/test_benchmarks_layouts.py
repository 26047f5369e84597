"""The layout benchmarks' options and records: a bad option is refused in one line before any
compile, and a run adds to a record instead of replacing it.

Every script runs in a fresh process (each sets JAX's simulated device count when imported)
with its slow work replaced by stubs that say when they are reached; every file is written
under `tmp_path`.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"


def _stub(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    """Runs `code` (a script importing a benchmark and stubbing its slow parts) in a fresh
    process in `tmp_path`, with `args` as its arguments."""
    path = tmp_path / "stub.py"
    path.write_text(textwrap.dedent(code))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCHMARKS), str(ROOT)]),
           "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def _refused(r: subprocess.CompletedProcess, option: str) -> str:
    """The error line of a run refused at parse time; asserts nothing ran."""
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"stub.py: error: {option}"), line
    return line


# pipeline_memory.py: the planner's work replaced by a choice where nothing fits.
PIPELINE_STUB = """
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
pm.main(sys.argv[1:])
"""


@pytest.mark.parametrize("fraction", ["0", "-0.5", "1.5", "nan"])
def test_pipeline_memory_fraction_out_of_range_is_refused_before_any_work(tmp_path, fraction):
    r = _stub(tmp_path, PIPELINE_STUB, "--fraction", fraction)
    line = _refused(r, f"--fraction {fraction}")
    assert "> 0 and <= 1" in line
    assert list(tmp_path.iterdir()) == [tmp_path / "stub.py"]


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


# parallel_memory.py: a compile says so on stdout, then gives fixed figures.
PARALLEL_STUB = """
import sys, types
from pathlib import Path
import parallel_memory as pm

def compile_train_step(spec):
    print("compiled", spec.parallel.spec, flush=True)
    memory = {"temp_bytes": 2**20, "argument_bytes": 2**10, "output_bytes": 2**10,
              "collective_bytes": 0}
    return types.SimpleNamespace(memory=types.SimpleNamespace(to_dict=lambda: memory),
                                 collectives={})

pm.compile_train_step = compile_train_step
pm.predicted = lambda row: 0.5
pm.RESULTS = Path("results")
pm.SHIPPED = Path("shipped")
sys.exit(pm.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("args, option", [
    (["--presets", "graphcst"], "--presets"),
    (["--presets", "graphcast-small,typo"], "--presets"),
    (["--recipes", "leen"], "--recipes"),
    (["--devices", "x"], "--devices x"),
    (["--devices", "0"], "--devices 0"),
    (["--devices", "1,16"], "--devices 1,16"),
    (["--annotate", "/nope.json"], "--annotate /nope.json"),
    (["--out", "/proc/x"], "--out"),
])
def test_parallel_memory_bad_options_are_refused_before_any_compile(tmp_path, args, option):
    r = _stub(tmp_path, PARALLEL_STUB, "--out", str(tmp_path / "results"), *args)
    line = _refused(r, option)
    if option == "--presets":
        assert "typo" in line or "graphcst" in line
    assert list(tmp_path.iterdir()) == [tmp_path / "stub.py"]


@pytest.mark.parametrize("text, said", [
    ("{not json", "JSONDecodeError"),
    ("[1, 2]", "TypeError"),
    ('{"rows": [1]}', "TypeError"),
    ('{"rows": {}}', "its rows are not a list"),
    ('{"rows": [{"preset": "graphcast-small"}]}', "KeyError('hardware')"),
])
def test_parallel_memory_annotate_of_a_wrong_file_is_one_line(tmp_path, text, said):
    """A file that is not a record of this script is refused in one line naming the option,
    and is left as it was (it gave a traceback)."""
    bad = tmp_path / "parallel-memory-cpu-1deg.json"
    bad.write_text(text)
    r = _stub(tmp_path, PARALLEL_STUB, "--annotate", str(bad))
    line = _refused(r, f"--annotate {bad}: not a parallel-memory record")
    assert said in line
    assert bad.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == [bad.name, "stub.py"]


# cluster_plans.py: a planner run says so on stdout.
CLUSTER_STUB = """
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
sys.exit(cp.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("args, option, said", [
    (["--batches", "x"], "--batches", "'x'"),
    (["--batches", "0"], "--batches", "'0'"),
    (["--precisions", "f64"], "--precisions", "'f64'"),
    (["--precisions", "f32,f64"], "--precisions", "'f64'"),
    (["--recipes", "leen"], "--recipes", "'leen'"),
    (["--out", "/proc/x/y.json"], "--out", "/proc/x"),
    (["--out", "{rows}"], "--out", "no list of rows"),
])
def test_cluster_plans_bad_options_are_refused_before_any_plan(tmp_path, args, option, said):
    out = tmp_path / "plans.json"
    out.write_text('{"hardware": {}}')
    args = [str(out) if a == "{rows}" else a for a in args]
    if "--out" not in args:
        args += ["--out", str(out)]
    r = _stub(tmp_path, CLUSTER_STUB, "--clusters", "8xA100-40GB", *args)
    assert said in _refused(r, option)
    assert out.read_text() == '{"hardware": {}}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plans.json", "stub.py"]


def test_cluster_plans_unknown_preset_is_named_as_such(tmp_path):
    """With the default record (which holds another preset's rows), the unknown preset is
    what the line names; nothing is written."""
    record = RESULTS / "cluster-plans-cpu.json"
    before = record.stat().st_mtime_ns
    r = _stub(tmp_path, CLUSTER_STUB, "--preset", "graphcst")
    line = _refused(r, "--preset")
    assert "unknown preset 'graphcst'" in line and "write another preset" not in line
    assert record.stat().st_mtime_ns == before
