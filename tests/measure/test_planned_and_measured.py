"""Measured beside planned: XLA's plan always, the device's peak only where it is measured."""

from __future__ import annotations

import jax
import pandas as pd
import pytest

from gclab import measure
from gclab.config import ModelConfig, TaskConfig
from gclab.measure.peak import PeakResult
from gclab.memory import MemoryConfig
from gclab.notebook import planned_and_measured
from gclab.sizing import StepSpec, train_step_memory

TINY = ModelConfig(resolution=6.0, mesh_splits=2, latent_size=16, processor_steps=2)
TASK = TaskConfig.from_levels(13)
SPECS = {p: StepSpec(TINY, TASK, MemoryConfig(precision=p)) for p in ("f32", "bf16")}


def test_on_cpu_the_plan_is_real_and_the_measured_column_says_why_it_is_empty(monkeypatch):
    compiled = {}

    def recording(spec):  # XLA's figures, as the helper compiles them
        compiled[spec] = train_step_memory(spec)
        return compiled[spec]

    monkeypatch.setattr("gclab.sizing.train_step_memory", recording)
    df = planned_and_measured(SPECS)
    assert list(df.index) == ["f32", "bf16"]
    assert list(compiled) == list(SPECS.values())
    for label, spec in SPECS.items():
        m = compiled[spec]
        assert df.loc[label, "plan_bytes"] == m.total_bytes
        assert df.loc[label, "temp_bytes"] == m.temp_bytes
    assert df.loc["bf16", "temp_bytes"] < df.loc["f32", "temp_bytes"]
    assert df["measured_peak_bytes"].isna().all() and df["measured_over_plan"].isna().all()
    assert all(text.startswith("not measured on cpu") for text in df["measured"])


def test_plans_compiled_already_are_not_compiled_again():
    df = planned_and_measured({"given": SPECS["f32"]}, plans={"given": (123, 45)})
    assert (df.loc["given", "plan_bytes"], df.loc["given", "temp_bytes"]) == (123, 45)


def test_on_a_gpu_each_config_that_fits_is_measured_in_a_fresh_process(monkeypatch):
    # No GPU here: the backend and the fresh-process measurement are stood in for, to
    # check what the helper does with what a GPU would report.
    plans = {"fits": (1000, 600), "fails": (2000, 1500), "too big": (10**12, 10**11)}
    reports = {"fits": PeakResult("ok", backend="gpu", peak_bytes=1250),
               "fails": PeakResult("oom", message="RESOURCE_EXHAUSTED: Out of memory\nmore")}
    calls = []

    def fake_measure_peak(target, kwargs, *, device, plan_bytes):
        label = next(k for k, s in configs.items() if s.to_json() == kwargs["spec_json"])
        calls.append((target, label, kwargs["steps"]))
        # What it needs to refuse a card this process holds too much of.
        assert device is jax.devices()[0] and plan_bytes == plans[label][0]
        return reports[label]

    configs = {"fits": SPECS["f32"], "fails": SPECS["bf16"],
               "too big": StepSpec(TINY.replace(latent_size=32), TASK)}
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(measure, "measure_peak", fake_measure_peak)
    df = planned_and_measured(configs, plans=plans, usable=10**6, repeats=3)
    assert calls == [("gclab.sizing.sweep:timed_steps", "fits", 3),
                     ("gclab.sizing.sweep:timed_steps", "fails", 3)]  # not the one too big
    assert df.loc["fits", "measured_peak_bytes"] == 1250
    assert df.loc["fits", "measured_over_plan"] == pytest.approx(1.25)
    assert df.loc["fits", "measured"] == "1.22 KiB"
    assert pd.isna(df.loc["fails", "measured_peak_bytes"])
    assert pd.isna(df.loc["fails", "measured_over_plan"])
    assert df.loc["fails", "measured"] == "run failed (oom): RESOURCE_EXHAUSTED: Out of memory"
    assert pd.isna(df.loc["too big", "measured_peak_bytes"])
    assert df.loc["too big", "measured"].startswith("not run: needs")
    assert "does not fit this card" in df.loc["too big", "measured"]


@pytest.mark.parametrize("configs,kwargs,error,words", [
    ([], {}, TypeError, "planned_and_measured configs is a list: it must be a {label: StepSpec}"
     " mapping"),
    (list(SPECS.values()), {}, TypeError, "configs is a list"),
    ({}, {}, ValueError, "planned_and_measured configs is empty: nothing to plan"),
    ({"f32": "f32"}, {}, TypeError, "configs['f32'] is a str: each value must be a StepSpec"),
    (SPECS, {"repeats": 0}, ValueError, "planned_and_measured repeats=0 is invalid: an integer "
     ">= 1"),
], ids=["empty list", "list", "empty dict", "not a StepSpec", "repeats 0"])
def test_bad_configs_are_named_before_any_compile(configs, kwargs, error, words, monkeypatch):
    monkeypatch.setattr("gclab.sizing.train_step_memory", lambda spec: pytest.fail("compiled"))
    with pytest.raises(error) as e:
        planned_and_measured(configs, **kwargs)
    assert words in str(e.value), str(e.value)
