"""A plan-only compile's options follow the platform it targets, and on a GPU leave XLA's
rematerialization pass out where a plan is for another card's memory."""

import contextlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gclab.config import ModelConfig, TaskConfig, WrongType
from gclab.measure import compiled as mc
from gclab.sizing import planner, speed

NO_REMAT = {"xla_disable_hlo_passes": "rematerialization"}
TASK = TaskConfig.from_levels(13)
PLAN_MODEL = ModelConfig(resolution=4.0, mesh_splits=3, latent_size=64, processor_steps=4)
#: A T4's allocator limit: 0.75 of what CUDA reports (15,835,660,288 bytes).
T4_LIMIT = int(0.75 * 15_835_660_288)


class FakeGPU:
    """What JAX says of a T4 (`device_kind`, `platform`, `memory_stats`)."""

    platform = "gpu"
    device_kind = "Tesla T4"
    id = 0

    def memory_stats(self):
        return {"bytes_limit": T4_LIMIT, "bytes_in_use": 0}


@pytest.fixture
def no_flags(monkeypatch):
    """``XLA_FLAGS`` set nothing, so the options are all returned (tests set some)."""
    monkeypatch.setenv("XLA_FLAGS", "")


@pytest.fixture
def on_a_gpu(monkeypatch):
    """JAX's default backend and first device say a T4 (compiles still run on the CPU)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "devices", lambda *a, **k: [FakeGPU()])


def test_the_options_follow_the_platform_given_not_the_default_backend(no_flags, on_a_gpu):
    cpu = dict(mc.PLAN_ONLY_CPU_OPTIONS)
    assert mc.plan_only_options(platform="cpu") == cpu
    assert mc.plan_only_options(True, "cpu") == {"xla_backend_optimization_level": 0}
    assert mc.plan_only_options() is None  # the default backend's: a GPU's
    assert mc.plan_only_options(platform="gpu") is None
    assert mc.plan_only_options(platform="tpu") is None
    with pytest.raises(WrongType, match="plan_only_options platform=0 is invalid: a platform "
                       "name such as 'cpu' or 'gpu', or None, not an int"):
        mc.plan_only_options(platform=0)


def test_the_platform_is_that_of_the_devices_compiled_for(on_a_gpu):
    shape = jax.ShapeDtypeStruct((2,), jnp.float32)
    assert mc.target_platform(shape) == "gpu"  # placed nowhere: the default backend
    cpu = jax.local_devices(backend="cpu")[0]
    on_cpu = jax.device_put(np.zeros(2, np.float32), cpu)
    sharded = jax.ShapeDtypeStruct((2,), jnp.float32,
                                   sharding=jax.sharding.SingleDeviceSharding(cpu))
    assert mc.target_platform((shape, {"x": on_cpu})) == "cpu"
    assert mc.target_platform(shape, sharded) == "cpu"
    with jax.default_device(cpu):
        assert mc.target_platform(shape) == "cpu"


def test_compiled_memory_compiles_cpu_arrays_with_cpu_options(no_flags, on_a_gpu, monkeypatch):
    """A machine with a GPU sizes a program on its CPU: the options are XLA:CPU's."""
    seen = []
    real = mc.compile_timed

    def compile_timed(*args):
        seen.append(args[-1])
        return real(*args)

    monkeypatch.setattr(mc, "compile_timed", compile_timed)
    x = jax.device_put(np.zeros(8, np.float32), jax.local_devices(backend="cpu")[0])
    assert mc.compiled_memory(lambda a: (a * 2).sum(), x).total_bytes > 0
    assert seen == [dict(mc.PLAN_ONLY_CPU_OPTIONS)]


def test_a_plan_for_another_card_leaves_xla_remat_out_on_a_gpu_only(no_flags, monkeypatch):
    with mc.plans_for_another_card():
        assert mc.plan_only_options(platform="gpu") == NO_REMAT
        assert mc.plan_only_options(platform="cuda") == NO_REMAT
        cpu = mc.plan_only_options(platform="cpu")
        assert cpu == dict(mc.PLAN_ONLY_CPU_OPTIONS) and "xla_disable_hlo_passes" not in cpu
        with mc.plans_for_another_card(False):
            assert mc.plan_only_options(platform="gpu") is None
        # A compile's option replaces the passes XLA_FLAGS disable: it keeps them.
        monkeypatch.setenv("XLA_FLAGS", "--xla_disable_hlo_passes=fusion")
        assert mc.plan_only_options(platform="gpu") == {
            "xla_disable_hlo_passes": "fusion,rematerialization"}
        monkeypatch.setenv("XLA_FLAGS", "--xla_disable_hlo_passes=rematerialization")
        assert mc.plan_only_options(platform="gpu") is None
    monkeypatch.setenv("XLA_FLAGS", "")
    assert mc.plan_only_options(platform="gpu") is None


@pytest.fixture
def planner_compiles(monkeypatch):
    """The options each of the planner's compiles would get (`plan_only_options` at the
    moment it compiles), with a compiled total of one byte."""
    seen = []

    def train_step_memory(spec):
        seen.append(mc.plan_only_options())
        return types.SimpleNamespace(total_bytes=1)

    monkeypatch.setattr(planner, "train_step_memory", train_step_memory)
    planner._compiled_total.cache_clear()
    yield seen
    planner._compiled_total.cache_clear()


def _plan(budget):
    return planner.plan(budget, PLAN_MODEL, TASK, use_compiled=True,
                        speed=speed.data_sheet("H100"))


@pytest.mark.parametrize("budget, options", [
    ("H100", NO_REMAT),  # another card's budget: XLA:GPU would shrink it towards the T4's
    ("16GiB", NO_REMAT),
    ("T4", None),  # the present card: XLA's pass shrinks it as a run here would
    (T4_LIMIT, None),
])
def test_the_planner_on_a_gpu_leaves_xla_remat_out_for_another_card(
        budget, options, no_flags, on_a_gpu, planner_compiles):
    assert _plan(budget).source == "compiled"
    assert planner_compiles and all(o == options for o in planner_compiles), planner_compiles


def test_the_planner_on_a_cpu_keeps_its_options(no_flags, planner_compiles):
    assert _plan("H100").source == "compiled"
    assert planner_compiles == [dict(mc.PLAN_ONLY_CPU_OPTIONS)] * len(planner_compiles)
    assert planner_compiles


@pytest.fixture
def layout_compiles(monkeypatch):
    """The options each of `plan_layout`'s compiles would get, with one byte per device;
    its stage programs are left out (what they compile is `plan_layout`'s business)."""
    from gclab.sizing import layout_plan

    seen = []

    def compile_train_step(spec, graphs=None, **kwargs):
        seen.append(mc.plan_only_options(platform=kwargs["devices"][0].platform))
        return types.SimpleNamespace(
            memory=types.SimpleNamespace(total_bytes=1, collective_bytes=0), cannot_run=None)

    monkeypatch.setattr(layout_plan, "compile_train_step", compile_train_step)
    monkeypatch.setattr(layout_plan, "_pipeline_candidates", lambda *a, **k: iter(()))
    monkeypatch.setattr(jax, "default_device", lambda device: contextlib.nullcontext())
    yield seen


@pytest.mark.parametrize("budget, options", [("H100", NO_REMAT), ("T4", None)])
def test_a_layout_plan_on_a_host_of_gpus_leaves_xla_remat_out_for_another_card(
        budget, options, no_flags, on_a_gpu, layout_compiles):
    """A host whose default backend has the devices (here one T4) compiles the layouts on
    them: for another card's budget without XLA:GPU's remat pass, as `plan` does."""
    from gclab.sizing.layout_plan import plan_layout

    assert plan_layout(budget, PLAN_MODEL, TASK, 1, recipes=["none"]).per_device_bytes == 1
    assert layout_compiles and all(o == options for o in layout_compiles), layout_compiles


def test_a_timeline_of_a_layout_probes_its_options_outside_the_layout():
    """The probe of an XLA option compiles a one-device program; inside a layout's mesh
    (two devices here) JAX refuses one, so it runs outside the caller's mesh."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        from gclab.parallel.processes import use_cpu_devices
        use_cpu_devices(2)
        import jax
        from gclab.config import ModelConfig, TaskConfig
        from gclab.measure.compiled import compile_option_known
        from gclab.parallel.config import ParallelConfig, parse_parallel_spec
        from gclab.parallel.sharding import make_mesh, use_layout
        from gclab.sizing import StepSpec, train_step_timeline
        with use_layout(make_mesh(ParallelConfig(data=2), jax.devices()), "replicated"):
            print(compile_option_known("xla_backend_optimization_level", 1, "cpu"))
        model = ModelConfig(resolution=4.0, mesh_splits=3, latent_size=16, processor_steps=2)
        spec = StepSpec(model, TaskConfig.from_levels(13), batch=2,
                        parallel=parse_parallel_spec("data:2"))
        print(train_step_timeline(spec).peak_bytes > 0)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["True", "True"]


def test_compile_option_known_refuses_what_it_cannot_probe():
    with pytest.raises(WrongType, match=r"compile_option_known value=\[1\] is invalid: a bool, "
                       "number or str, not a list"):
        mc.compile_option_known("xla_backend_optimization_level", [1], "cpu")
    with pytest.raises(ValueError, match="compile_option_known platform='no-such' is invalid: "
                       "this process has no such backend"):
        mc.compile_option_known("xla_backend_optimization_level", 1, "no-such")
