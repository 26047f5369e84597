"""`benchmarks/cpu_scheduler.py`: its options, the record it writes, and the recording the
appendix reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "gclab" / "recordings" / "cpu-scheduler-cpu.json"


@pytest.fixture
def scheduler(benchmarks):
    import cpu_scheduler

    return cpu_scheduler


@pytest.mark.parametrize("args, said", [
    (["--recipes", "bogus"], "--recipes 'bogus' is invalid: comma-separated names of none, "
                             "per-step, deepmind, lean"),
    (["--recipes", "none", "--timed", "lean"], "--timed 'lean' is invalid: comma-separated "
                                                "names of none"),
    (["--precisions", "f16"], "--precisions 'f16' is invalid"),
    (["--repeats", "0"], "--repeats 0 is invalid: an integer >= 1"),
    (["--rounds", "0"], "--rounds 0 is invalid: an integer >= 1"),
    (["--preset", "nope"], "--preset: unknown preset 'nope'"),
])
def test_bad_options_are_one_line_before_any_child(scheduler, monkeypatch, capsys, tmp_path,
                                                   args, said):
    monkeypatch.setattr(scheduler, "run", lambda *a: pytest.fail("a child was started"))
    with pytest.raises(SystemExit) as exit_:
        scheduler.main([*args, "--out", str(tmp_path / "r.json")])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("name, why", [("folder", "is a directory, not a file"),
                                       ("record.txt", "the name must end in .json")])
def test_an_out_that_cannot_take_the_record_is_one_line_before_any_child(
        scheduler, monkeypatch, capsys, tmp_path, name, why):
    (tmp_path / "folder").mkdir()
    monkeypatch.setattr(scheduler, "run", lambda *a: pytest.fail("a child was started"))
    with pytest.raises(SystemExit) as exit_:
        scheduler.main(["--out", str(tmp_path / name)])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"error: --out: {tmp_path / name}: {why}"), error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


def test_each_setting_runs_in_a_process_whose_flags_name_it(scheduler, monkeypatch, tmp_path):
    """A tiny step under both settings, for real: the flag reaches each child (the plans
    differ), the caller's other XLA flags stay, and the record names both settings."""
    others = os.environ.get("XLA_FLAGS", "")  # the tests' own (tests/conftest.py)
    monkeypatch.setenv("XLA_FLAGS", f"{others} {scheduler.FLAG}=true")  # replaced, not doubled
    seen, real_run = [], subprocess.run

    def run(cmd, **kwargs):
        if cmd[:2] == [sys.executable, "-c"]:  # a child (git, for the commit, is not)
            seen.append(kwargs["env"]["XLA_FLAGS"])
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(scheduler.subprocess, "run", run)
    out = tmp_path / "record.json"
    assert scheduler.main(["--preset", "cpu-4x32", "--recipes", "lean", "--precisions", "f32",
                           "--timed", "", "--out", str(out)]) == 0
    assert seen == [f"{others} {scheduler.FLAG}={v}".strip() for v in ("true", "false")]
    record = json.loads(out.read_text())
    assert record["flag"] == scheduler.FLAG and record["preset"] == "cpu-4x32"
    temps = {r["scheduler"]: r["temp_bytes"] for r in record["rows"]}
    assert set(temps) == set(scheduler.SETTINGS)
    # The default scheduler keeps more alive at once than the memory-first order.
    assert temps["off"] < temps["concurrency-optimized"]


def test_the_recording_holds_every_recipe_and_precision_under_both_settings(benchmarks):
    from gclab.memory.config import PRECISIONS, RECIPES

    record = json.loads(SHIPPED.read_text())
    assert record == json.loads((ROOT / "benchmarks" / "results" / SHIPPED.name).read_text())
    assert record["hardware"]["backend"] == "cpu" and record["date"]
    keys = {(r["scheduler"], r["precision"], r["recipe"]) for r in record["rows"]}
    assert keys == {(s, p, r) for s in ("concurrency-optimized", "off") for p in PRECISIONS
                    for r in RECIPES}
    timed = [r for r in record["rows"] if "step_seconds" in r]
    assert timed and all(r["step_seconds"] > 0 for r in timed)
    # Every timed row holds each round's median, and the median of those.
    for r in timed:
        assert len(r["step_seconds_rounds"]) == record["rounds"]
        assert min(r["step_seconds_rounds"]) <= r["step_seconds"] <= max(r["step_seconds_rounds"])
