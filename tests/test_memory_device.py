"""`benchmarks/memory_device.py`: refuses without an accelerator, and its report of a
recorded run (XLA's own rematerialization marked) is the one shipped."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "memory_device.py"
RESULTS = ROOT / "benchmarks" / "results"


def _run(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_it_refuses_without_an_accelerator(tmp_path):
    r = _run("--out", str(tmp_path))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("memory_device.py: error: no accelerator found (JAX backend "
                                "'cpu'): memory_recipes.py records the CPU")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (("--stages", "claim,fast"), "--stages 'claim,fast': a comma-separated list of claim, "
     "claim-live, recipes-f32, recipes-bf16, layer-norm, step-time"),
    (("--budget", "soon"), "--budget soon: a positive number of seconds"),
    (("--budget", "0"), "--budget 0: a positive number of seconds"),
    (("--log", "run.log"), "--log: only with --report"),
])
def test_bad_arguments_get_one_line(args, message):
    r = _run(*args)
    assert r.returncode == 2 and r.stderr.strip() == f"memory_device.py: error: {message}"


def test_a_report_of_something_else_gets_one_line(tmp_path):
    bad = tmp_path / "memory-gpu.json"
    bad.write_text(json.dumps({"rows": []}))
    r = _run("--report", str(bad))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith(f"memory_device.py: error: --report {bad}: not a record")
    assert json.loads(bad.read_text()) == {"rows": []}  # left as it was


def test_the_shipped_report_is_what_the_record_and_its_log_give(tmp_path):
    """Re-running the report on the recorded GPU run writes the shipped .md byte for byte,
    and marks the rows whose compile XLA's rematerialization pass reported in the log."""
    for name in ("memory-gpu.json", "memory-gpu.log"):
        shutil.copy(RESULTS / name, tmp_path / name)
    r = _run("--report", str(tmp_path / "memory-gpu.json"), "--log",
             str(tmp_path / "memory-gpu.log"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "memory-gpu.md").read_text() == (RESULTS / "memory-gpu.md").read_text()
    assert ((tmp_path / "memory-gpu.json").read_text()
            == (RESULTS / "memory-gpu.json").read_text())
    record = json.loads((tmp_path / "memory-gpu.json").read_text())
    marked = {(r["preset"], r["precision"], r["recipe"]): r["xla_remat"]
              for r in record["recipes"] if "xla_remat" in r}
    log = (tmp_path / "memory-gpu.log").read_text()
    assert len(marked) == log.count("hlo_rematerialization.cc") > 0
    for (preset, precision, recipe), x in marked.items():
        row = next(r for r in record["recipes"]
                   if (r["preset"], r["precision"], r["recipe"]) == (preset, precision, recipe))
        # What the pass reached is the compiled temp, to the bytes of its arguments.
        assert x["reduced_to_bytes"] < x["from_bytes"] and x["limit_bytes"] < x["from_bytes"]
        assert abs(x["reduced_to_bytes"] - row["temp_bytes"]) < 0.01 * row["temp_bytes"]


def test_xla_remat_warnings_belong_to_the_next_row():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import memory_device
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    log = "\n".join([
        "graphcast        bf16  lean      temp     4.45 GiB  compile   2.8 s",
        "W1126 hlo_rematerialization.cc:3363] Can't reduce memory use below 96.56GiB "
        "(103680246851 bytes) by rematerialization; only reduced to 235.70GiB (253084522848 "
        "bytes), down from 258.62GiB (277697300132 bytes) originally",
        "graphcast        f32   none      temp   235.30 GiB  compile  34.8 s",
        "graphcast        f32   deepmind  temp    37.06 GiB  compile  21.9 s"])
    assert memory_device.xla_remat_reports(log) == {
        ("graphcast", "f32", "none"): {"limit_bytes": 103680246851,
                                        "reduced_to_bytes": 253084522848,
                                        "from_bytes": 277697300132}}


def _memory_device():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import memory_device
        import memory_recipes
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return memory_device, memory_recipes


def test_a_run_cut_short_keeps_the_earlier_record_beside_its_own(tmp_path, monkeypatch,
                                                                 capsys):
    """Without --merge a run starts from an empty record and saves after every stage: one
    cut short after its first stage must not cost the complete record of an earlier run at
    the same path. That record and its .md are set aside once, byte for byte; the new files
    hold what this run finished."""
    import jax

    memory_device, mr = _memory_device()
    path = tmp_path / "memory-gpu.json"
    path.write_text('{"complete": "earlier record"}')
    path.with_suffix(".md").write_text("earlier table\n")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(mr, "hardware", lambda: {
        "backend": "gpu", "device": "Stub GPU", "platform": "stub", "cpu_count": 2,
        "jax": "0.0", "gclab": "0.0", "date": "2030-01-01T00:00"})
    monkeypatch.setattr(mr, "layer_norm_errors", lambda: [])

    def step_times(preset):
        raise KeyboardInterrupt  # the lease ends

    monkeypatch.setattr(mr, "step_times", step_times)
    with pytest.raises(KeyboardInterrupt):
        memory_device.main(["--stages", "layer-norm,step-time", "--out", str(tmp_path)])
    assert (tmp_path / "memory-gpu.previous.json").read_text() == '{"complete": "earlier record"}'
    assert (tmp_path / "memory-gpu.previous.md").read_text() == "earlier table\n"
    record = json.loads(path.read_text())
    assert list(record["stages"]) == ["layer-norm"]
    assert record["stages"]["layer-norm"]["status"] == "done"
    assert "Stub GPU" in path.with_suffix(".md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "memory-gpu.json", "memory-gpu.md", "memory-gpu.previous.json", "memory-gpu.previous.md"]
    assert capsys.readouterr().err.strip().splitlines() == [
        f"memory_device.py: moved the earlier {path} to {tmp_path / 'memory-gpu.previous.json'}"
        ", so that this run does not replace it"]


def test_a_report_of_a_record_without_its_rollout_gets_one_line(tmp_path):
    bad = tmp_path / "memory-gpu.json"
    text = json.dumps({"hardware": {"device": "GPU", "jax": "0"}, "recipes": []})
    bad.write_text(text)
    r = _run("--report", str(bad))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"memory_device.py: error: --report {bad}: not a record of this script "
        "(KeyError('rollout'))")
    assert bad.read_text() == text and not bad.with_suffix(".md").exists()
