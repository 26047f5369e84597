"""XLA:CPU's scheduler as a memory switch: chosen before JAX starts, same gradients, less temp.

The order is set in ``XLA_FLAGS``, which XLA reads when JAX starts its CPU backend: so the
depth-first step runs in a fresh process (which inherits the tests' other flags) and is
compared with the same step compiled here, breadth-first (XLA's default).
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gclab.config import ModelConfig
from gclab.geometry import build_graphs
from gclab.measure.agreement import FLOAT32_TOLERANCE, compare_leaves
from gclab.memory import CPU_SCHEDULERS, cpu_scheduler, get_recipe, use_cpu_scheduler
from gclab.memory.schedule import CPU_SCHEDULER_FLAG
from gclab.model import graph_inputs, make_network

# A step whose temp the order changes: at this size `lean` needs 20% less depth-first
# (11.5 -> 9.2 MiB under XLA's default flags).
CFG = ModelConfig(resolution=10.0, mesh_splits=2, latent_size=16, processor_steps=5)
C, O, B = 5, 4, 2


def step(recipe: str):
    """Loss, gradients (flat, as numpy) and compiled temp bytes of one step of `recipe`."""
    graph = graph_inputs(build_graphs(CFG.resolution, CFG.mesh_splits))
    n = graph.grid_nodes.shape[0]
    x = jax.random.normal(jax.random.PRNGKey(1), (n, B, C))
    y = jax.random.normal(jax.random.PRNGKey(2), (n, B, O))
    net = make_network(CFG, C, O, get_recipe(recipe))
    params = net.init(jax.random.PRNGKey(0), graph, x)

    def loss(p, g, x, y):
        return jnp.mean((net.apply(p, g, x) - y) ** 2)

    compiled = jax.jit(jax.value_and_grad(loss)).lower(params, graph, x, y).compile()
    value, grads = compiled(params, graph, x, y)
    return (float(value), [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)],
            compiled.memory_analysis().temp_size_in_bytes)


_CHILD = """
import json, sys
import numpy as np
from gclab.memory import cpu_scheduler, use_cpu_scheduler
use_cpu_scheduler("depth-first")  # after importing gclab and JAX, before any JAX operation
sys.path.insert(0, sys.argv[1])
from test_schedule import step
value, grads, temp = step("lean")
np.savez(sys.argv[2], *grads)
print(json.dumps({"scheduler": cpu_scheduler(), "loss": value, "temp": temp}))
"""


def test_depth_first_order_keeps_the_gradients_and_lowers_temp(tmp_path):
    out = subprocess.run([sys.executable, "-c", _CHILD, os.path.dirname(__file__),
                          str(tmp_path / "grads.npz")],
                         capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    child = json.loads(out.stdout.strip().splitlines()[-1])
    assert child["scheduler"] == "depth-first"
    value, grads, temp = step("lean")  # here: XLA's default order
    assert cpu_scheduler() == "breadth-first"
    with np.load(tmp_path / "grads.npz") as f:
        theirs = [f[f"arr_{i}"] for i in range(len(f.files))]
    worst, _ = compare_leaves(theirs, grads)
    assert worst <= FLOAT32_TOLERANCE, worst
    assert child["loss"] == pytest.approx(value, rel=FLOAT32_TOLERANCE)
    assert child["temp"] < 0.9 * temp, (child["temp"], temp)


def test_the_flag_s_last_setting_names_the_scheduler(monkeypatch):
    for flags, name in (("", "breadth-first"), (f"{CPU_SCHEDULER_FLAG}=false", "depth-first"),
                        (f"{CPU_SCHEDULER_FLAG}=false --a {CPU_SCHEDULER_FLAG}=true",
                         "breadth-first"),
                        (f"--xla_backend_optimization_level=0 {CPU_SCHEDULER_FLAG}=0",
                         "depth-first")):
        monkeypatch.setenv("XLA_FLAGS", flags)
        assert cpu_scheduler() == name, flags


def test_a_started_process_keeps_its_order_and_says_so():
    jax.devices()  # JAX has started here (the tests compile), breadth-first
    flags = os.environ.get("XLA_FLAGS", "")
    use_cpu_scheduler("breadth-first")  # what it runs: nothing to change
    assert os.environ.get("XLA_FLAGS", "") == flags
    with pytest.raises(ValueError, match="already started with the breadth-first scheduler"):
        use_cpu_scheduler("depth-first")
    assert os.environ.get("XLA_FLAGS", "") == flags  # nothing half-done
    for bad in ("memory", "", None, 1):
        with pytest.raises(ValueError, match="is invalid: one of " + ", ".join(CPU_SCHEDULERS)):
            use_cpu_scheduler(bad)


def test_a_sweep_row_is_cached_apart_for_each_order(monkeypatch):
    """`gclab sweep`'s row cache keys on XLA_FLAGS: a row compiled in one order is not read
    back for the other."""
    from gclab.config import get_preset
    from gclab.sizing import StepSpec
    from gclab.sizing.sweep import cache_key

    preset = get_preset("cpu-4x32")
    spec = StepSpec(preset.model, preset.task, get_recipe("lean"))
    keys = {}
    for name, value in CPU_SCHEDULERS.items():
        monkeypatch.setenv("XLA_FLAGS", f"--xla_backend_optimization_level=0 "
                                        f"{CPU_SCHEDULER_FLAG}={value}")
        keys[name] = cache_key(spec, "compiled")
    assert keys["breadth-first"] != keys["depth-first"]
    monkeypatch.setenv("XLA_FLAGS", f"{CPU_SCHEDULER_FLAG}=false "
                                    "--xla_backend_optimization_level=0")
    assert cache_key(spec, "compiled") == keys["depth-first"]  # in any order of the flags
