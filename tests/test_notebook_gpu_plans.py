"""On a GPU, the plans `planned_and_measured` sets beside measured peaks are the steps' own,
compiled as a guarded run compiles them: without XLA:GPU's remat pass."""

import jax
import pytest

from gclab import notebook
from gclab.config import get_preset
from gclab.sizing import StepSpec
from gclab.sizing import step as step_module

NO_REMAT = {"xla_disable_hlo_passes": "rematerialization"}


class FakeGPU:
    """What JAX says of a T4 that reports no peak (so nothing is started)."""

    platform = "gpu"
    device_kind = "Tesla T4"
    id = 0

    def memory_stats(self):
        return {"bytes_limit": int(0.75 * 15_835_660_288), "bytes_in_use": 0}


@pytest.fixture
def spied_on_a_gpu(monkeypatch):
    """JAX's default backend says a T4 (compiles still run on the CPU); the options of
    every step compile are kept."""
    real_devices, real_compile = jax.devices, step_module.compile_timed
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "devices", lambda *a, **k: real_devices(*a, **k) if a or k
                        else [FakeGPU()])
    seen = []

    def spy(fn, args, kwargs, static_argnums=(), donate_argnums=(), compiler_options=None):
        seen.append(compiler_options)
        return real_compile(fn, args, kwargs, static_argnums, donate_argnums, compiler_options)

    monkeypatch.setattr(step_module, "compile_timed", spy)
    return seen


def test_planned_and_measured_plans_as_a_guarded_run_does(spied_on_a_gpu):
    preset = get_preset("cpu-4x32")
    spec = StepSpec(preset.model, preset.task)
    table = notebook.planned_and_measured({"tiny": spec}, usable=10**10)
    assert spied_on_a_gpu == [NO_REMAT]
    assert table.loc["tiny", "measured_peak_bytes"] is None  # the fake reports no peak
    step_module.compile_train_step(spec, live=True, run_if=lambda memory: False)
    assert spied_on_a_gpu[-1] == NO_REMAT  # the guarded compile it must agree with
