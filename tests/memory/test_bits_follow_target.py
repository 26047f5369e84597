"""Bfloat16 scan residuals are kept as bits where the program compiles for XLA:CPU, whatever
the default backend: a machine with a GPU plans layouts on its simulated CPU devices, and
those plans are XLA:CPU's (as are the options of their compiles)."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gclab.config import ModelConfig, TaskConfig
from gclab.measure import agreement, timeline
from gclab.measure import compiled as mc
from gclab.memory import MemoryConfig, remat
from gclab.parallel.config import ParallelConfig
from gclab.parallel.sharding import make_mesh, use_layout
from gclab.sizing import StepSpec, compile_train_step

MODEL = ModelConfig(resolution=4.0, mesh_splits=3, latent_size=16, processor_steps=2)
TASK = TaskConfig.from_levels(13)
BF16 = MemoryConfig(precision="bf16")


@pytest.fixture
def gpu_default(monkeypatch):
    """JAX's default backend says 'gpu' (compiles still run on the CPU devices)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")


@pytest.fixture
def no_flags(monkeypatch):
    """``XLA_FLAGS`` set nothing, so a CPU compile's options are all returned (tests set
    some)."""
    monkeypatch.setenv("XLA_FLAGS", "")


@pytest.fixture
def bits(monkeypatch):
    """Records each scan body that `scan_steps` keeps as bits."""
    seen, real = [], remat.residuals_as_bits

    def spy(fn):
        seen.append(fn)
        return real(fn)

    monkeypatch.setattr(remat, "residuals_as_bits", spy)
    return seen


def _bf16_temp() -> int:
    spec = StepSpec(MODEL, TASK, BF16)
    return compile_train_step(spec, devices=jax.devices("cpu")).memory.temp_bytes


def test_a_bf16_step_on_cpu_devices_is_planned_as_on_a_cpu_machine(monkeypatch):
    on_cpu = _bf16_temp()
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert _bf16_temp() == on_cpu


def test_a_bf16_layout_on_cpu_devices_is_planned_as_on_a_cpu_machine():
    """A two-device layout (compiled over a mesh of CPU devices) in a process of its own,
    which has two CPU devices."""
    script = textwrap.dedent("""
        from gclab.parallel.processes import use_cpu_devices
        use_cpu_devices(2)
        import jax
        from gclab.config import ModelConfig, TaskConfig
        from gclab.memory import MemoryConfig
        from gclab.parallel.config import parse_parallel_spec
        from gclab.sizing import StepSpec, compile_train_step
        model = ModelConfig(resolution=4.0, mesh_splits=3, latent_size=16, processor_steps=2)
        spec = StepSpec(model, TaskConfig.from_levels(13), MemoryConfig(precision="bf16"),
                        batch=2, parallel=parse_parallel_spec("data:2"))
        def temp():
            return compile_train_step(spec, devices=jax.devices("cpu")).memory.temp_bytes
        on_cpu = temp()
        jax.default_backend = lambda: "gpu"
        print(on_cpu, temp())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    on_cpu, on_gpu_machine = proc.stdout.split()[-2:]
    assert int(on_cpu) > 0
    assert on_gpu_machine == on_cpu


def _loss(w, x):
    """A bfloat16 carry through two scanned steps."""
    def step(c, p):
        return jnp.tanh(c * p.astype(jnp.bfloat16)), None
    c, _ = remat.scan_steps(step, x, w, BF16)
    return c.astype(jnp.float32).sum()


def test_a_layout_check_compiles_for_its_devices(gpu_default, no_flags, bits, monkeypatch):
    options, real = [], agreement.plan_only_options

    def spy(*args, **kwargs):
        options.append(real(*args, **kwargs))
        return options[-1]

    monkeypatch.setattr(agreement, "plan_only_options", spy)
    cpu = jax.devices("cpu")[0]
    check = agreement.LayoutCheck.__new__(agreement.LayoutCheck)
    check.devices, check._fn = [cpu], jax.value_and_grad(_loss)
    args = jax.device_put((np.full((2, 4), 0.5, np.float32), np.ones(4, jnp.bfloat16)), cpu)
    loss, leaves = check._run(args)
    assert np.isfinite(loss) and len(leaves) == 1
    assert options == [dict(mc.PLAN_ONLY_CPU_OPTIONS)]
    assert bits  # traced for the CPU device: the residuals are kept as bits


def test_a_memory_timeline_of_cpu_arrays_has_cpu_options(gpu_default, no_flags, monkeypatch):
    seen = []

    def compile_with_timeline(fn, *args, compiler_options=None, **kwargs):
        seen.append(compiler_options)
        return None, 0.0, "timeline"

    monkeypatch.setattr(timeline, "compile_with_timeline", compile_with_timeline)
    on_cpu = jax.device_put(np.zeros(2, np.float32), jax.devices("cpu")[0])
    assert timeline.memory_timeline(jnp.sin, on_cpu) == "timeline"
    assert seen == [dict(mc.PLAN_ONLY_CPU_OPTIONS)]
    # Arrays placed nowhere compile for the default backend: a GPU's options (none).
    timeline.memory_timeline(jnp.sin, jax.ShapeDtypeStruct((2,), jnp.float32))
    assert seen[-1] is None


def test_the_default_backend_decides_where_no_device_is_given(gpu_default, bits):
    x = jax.ShapeDtypeStruct((4,), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((2, 4), jnp.float32)
    jax.jit(_loss).trace(w, x)
    assert not bits  # a GPU's program: bfloat16 is sliced natively
    with jax.default_device(jax.devices("cpu")[0]):
        jax.jit(_loss).trace(w, x)
    assert len(bits) == 1


def test_a_step_traced_on_a_layout_follows_its_mesh(gpu_default, bits):
    """As a step trained or checked on a layout of CPU devices is traced."""
    x = jax.ShapeDtypeStruct((4,), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((2, 4), jnp.float32)
    with use_layout(make_mesh(ParallelConfig(), jax.devices("cpu")), "replicated"):
        jax.jit(_loss).trace(w, x)
    assert len(bits) == 1


def test_a_timeline_of_cpu_arrays_is_traced_for_the_cpu(gpu_default, bits):
    """`memory_timeline` of arrays on a CPU device beside a GPU: the program is XLA:CPU's, so
    its bfloat16 residuals are kept as bits, as in a plan of the same step."""
    cpu = jax.devices("cpu")[0]
    w, x = jax.device_put((np.full((2, 4), 0.5, np.float32), np.ones(4, jnp.bfloat16)), cpu)
    assert timeline.memory_timeline(jax.grad(_loss), w, x).peak_bytes > 0
    assert bits
