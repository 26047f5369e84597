"""The planner picks the fastest setting that fits: predicted step time from FLOPs and bytes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from gclab.config import PRESETS, ModelConfig, TaskConfig
from gclab.memory import RECIPES
from gclab.recordings import recorded
from gclab.sizing import StepSpec, analytical, planner, speed

ROOT = Path(__file__).resolve().parents[2]
TASK = TaskConfig.from_levels(13)
PLAN_MODEL = ModelConfig(resolution=4.0, mesh_splits=3, latent_size=64, processor_steps=4)
SMALL = PRESETS["graphcast-small"]


def _brute_force(p: planner.Plan, model: ModelConfig, task: TaskConfig,
                 model_speed: speed.SpeedModel) -> tuple[str, float]:
    """The fastest candidate whose modelled peak fits, recomputed from the public parts."""
    best = None
    for label, mem in planner.ladder(model.processor_steps):
        need = analytical.estimate(model, task, mem).total_bytes
        seconds = model_speed.seconds(StepSpec(model, task, mem))
        if need <= p.plan_limit_bytes and (best is None or seconds < best[1]):
            best = (label, seconds)
    return best


@pytest.mark.parametrize("card", ["T4", "L4", "A100-40GB", "H100"])
def test_choice_is_the_least_predicted_time_that_fits(card):
    sheet = speed.data_sheet(card)
    p = planner.plan(card, SMALL.model, SMALL.task, use_compiled=False, speed=sheet)
    label, seconds = _brute_force(p, SMALL.model, SMALL.task, sheet)
    # The MILP's mix is one more candidate: the plan is at least as fast as the ladder's best.
    assert p.predicted_seconds <= seconds * (1 + 1e-12)
    if not p.label.startswith("milp"):
        assert p.label == label and p.predicted_seconds == pytest.approx(seconds, rel=1e-12)
    fitting = p.candidates[p.candidates["fits"]]
    assert p.predicted_seconds == fitting["predicted_seconds"].min()
    assert p.speed == sheet and f"{card} data sheet" in p.explain()


def test_when_only_one_candidate_fits_it_is_chosen():
    sheet = speed.data_sheet("T4")
    needs = {label: analytical.estimate(PLAN_MODEL, TASK, mem).total_bytes
             for label, mem in planner.ladder(PLAN_MODEL.processor_steps)}
    smallest = min(needs, key=needs.get)
    assert sorted(needs.values())[1] > needs[smallest]  # a unique smallest
    p = planner.plan(needs[smallest], PLAN_MODEL, TASK, use_compiled=False, headroom=1.0,
                     speed=sheet)
    assert p.label == smallest == "lean"
    assert list(p.candidates.loc[p.candidates["fits"], "label"]) == ["lean"]
    assert p.predicted_seconds > p.candidates["predicted_seconds"].min()  # lean is not fastest


def test_saving_memory_and_time_wins_over_saving_memory_only():
    sheet = speed.data_sheet("T4")
    none = analytical.estimate(SMALL.model, SMALL.task, RECIPES["none"]).total_bytes
    # Just under what `none` needs: gather after matmul (less memory, less time) and
    # per-step remat (less memory, more time) both fit; the first is chosen.
    p = planner.plan(none - 1, SMALL.model, SMALL.task, use_compiled=False, headroom=1.0,
                     speed=sheet)
    rows = p.candidates.set_index("label")
    assert rows.loc["per-step", "fits"] and rows.loc["gam", "fits"]
    assert rows.loc["per-step", "predicted_seconds"] > rows.loc["none", "predicted_seconds"]
    assert p.label == "gam" and p.recompute_fraction == 0
    # A T4's pool: lean (nested remat, but gather after matmul) fits and beats deepmind,
    # which also fits but only trades time for memory.
    t4 = planner.plan("T4", SMALL.model, SMALL.task, use_compiled=False, speed=sheet)
    rows = t4.candidates.set_index("label")
    assert rows.loc["deepmind", "fits"] and t4.memory.gather_after_matmul
    assert t4.predicted_seconds < rows.loc["deepmind", "predicted_seconds"]


def test_gather_after_matmul_removes_flops_and_remat_adds_them():
    counts = analytical.GraphCounts.for_model(SMALL.model)
    base = RECIPES["none"]

    def work(mem):
        return analytical.step_work(SMALL.model, SMALL.task, mem, counts)

    gam = base.replace(gather_after_matmul=True)
    assert work(gam)[0] < 0.75 * work(base)[0] and work(gam)[1] < work(base)[1]
    step = base.replace(processor_remat="step")
    f = analytical.stage_flops(SMALL.model, SMALL.task, counts, 1, base)
    S = SMALL.model.processor_steps
    # Per-step remat runs each processor step once more.
    assert work(step)[0] - work(base)[0] == pytest.approx(S * f["processor_step"])
    assert analytical.recompute_runs(RECIPES["lean"], S)["processor_step"] == 2 * S
    # lean's nested remat costs about what its gather after matmul saves.
    assert 0.9 < work(RECIPES["lean"])[0] / work(base)[0] < 1.2
    # bfloat16 halves the activation bytes, not the FLOPs.
    half = work(base.replace(precision="bf16"))
    assert half[0] == work(base)[0] and half[1] < 0.55 * work(base)[1]


def test_fit_recovers_the_coefficients_it_was_given():
    specs = [StepSpec(PLAN_MODEL, TASK, mem) for _, mem in planner.ladder(4)]
    truth = speed.SpeedModel(2e-11, 3e-10, 1e-10, 0.05, "truth", "test")
    seconds = [truth.seconds(s) for s in specs]
    fit = speed.fit_calibration(specs, seconds, "test")
    assert fit.median_relative_error < 1e-6 and fit.measurements == len(specs)
    for s, t in zip(specs, seconds):
        assert fit.seconds(s) == pytest.approx(t, rel=1e-6)
    for field in ("seconds_per_flop", "seconds_per_byte", "seconds_per_held_byte",
                  "overhead_seconds"):
        assert getattr(fit, field) == pytest.approx(getattr(truth, field), rel=1e-6), field
    with pytest.raises(ValueError, match="three"):
        speed.fit_calibration(specs[:2], seconds[:2])


def test_shipped_cpu_calibration_is_the_fit_of_its_measurements():
    record = recorded(speed.calibration_name("cpu"))
    assert record is not None and record["hardware"]["backend"] == "cpu"
    # The package's copy is the one the benchmark wrote beside its results.
    name = speed.calibration_name("cpu") + ".json"
    assert (ROOT / "gclab" / "recordings" / name).read_text() == (
        ROOT / "benchmarks" / "results" / name).read_text()
    rows = record["measurements"]
    assert {r["preset"] for r in rows} == {"cpu-8x128", "cpu-16x512"}
    specs = [StepSpec(PRESETS[r["preset"]].model, PRESETS[r["preset"]].task,
                      RECIPES["none"].replace(**r["memory"])) for r in rows]
    fit = speed.fit_calibration(specs, [r["median_seconds"] for r in rows])
    loaded = speed.load_calibration("cpu")
    for field in ("seconds_per_flop", "seconds_per_byte", "seconds_per_held_byte",
                  "overhead_seconds", "median_relative_error"):
        assert getattr(loaded, field) == pytest.approx(getattr(fit, field), rel=1e-6)
    assert "cpu calibration" in loaded.name and loaded.measurements == len(rows)
    predicted = np.array([loaded.seconds(s) for s in specs])
    measured = np.array([r["median_seconds"] for r in rows])
    assert np.median(np.abs(predicted / measured - 1)) == pytest.approx(
        loaded.median_relative_error, rel=1e-6)
    # At each preset the calibrated model names the candidate that was measured fastest.
    for preset in ("cpu-8x128", "cpu-16x512"):
        at = [i for i, r in enumerate(rows) if r["preset"] == preset]
        assert rows[min(at, key=lambda i: predicted[i])]["label"] == \
            rows[min(at, key=lambda i: measured[i])]["label"]


def test_speed_for_a_card_or_the_device_found():
    assert speed.speed_for("T4") == speed.data_sheet("T4")
    assert speed.speed_for("H200", "bf16").seconds_per_flop == pytest.approx(1 / 990e12)
    tpu = speed.speed_for("TPU-v4")
    assert "H100" in tpu.name and "TPU-v4" in tpu.name
    here = speed.speed_for(None)  # this machine is a CPU
    assert here == speed.load_calibration("cpu")
    assert planner.plan("1TiB", PLAN_MODEL, TASK, use_compiled=False).speed == here
    for kind, card in [("Tesla T4", "T4"), ("NVIDIA H100 80GB HBM3", "H100"),
                       ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100-SXM4-80GB",
                                                                "A100-80GB"),
                       ("NVIDIA L4", "L4"), ("NVIDIA A10G", "A10G"),
                       ("Tesla V100-SXM2-16GB", "V100-16GB"), ("NVIDIA H200", "H200"),
                       ("TPU v4", None)]:
        assert speed.card_of_device_kind(kind) == card, kind
    with pytest.raises(ValueError, match="no speeds"):
        speed.data_sheet("TPU-v4")


def test_plan_reports_its_time_and_speed():
    sheet = speed.data_sheet("T4")
    p = planner.plan("T4", SMALL.model, SMALL.task, use_compiled=False, speed=sheet)
    d = p.to_dict()
    assert d["predicted_seconds"] == p.predicted_seconds > 0
    assert d["speed"]["name"] == "T4 data sheet"
    text = p.explain()
    assert "Predicted step" in text and "Faster settings did not fit" in text
    with pytest.raises(ValueError, match="speed must be a SpeedModel"):
        planner.plan("T4", SMALL.model, SMALL.task, use_compiled=False,
                     speed=dataclasses.asdict(sheet))
