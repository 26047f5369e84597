"""The pipeline schedule traces one program per distinct stage function.

Traced under an abstract mesh (no devices needed): `gpipe` makes one branch of its switch
per distinct stage function, and GraphCast's middle stages of equal steps and remat are one
function (`pipeline_stages`), so a pipeline of P stages costs three branches to trace,
differentiate and compile, not P. That the shared stages give one device's loss and
gradients is `test_pipeline.py`'s case `stage-steps:2/1/1/1` (stages 1 and 2 share).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, AxisType

from gclab.memory import MemoryConfig
from gclab.model.graphcast import pipeline_stages
from gclab.parallel import PIPELINE_AXIS, gpipe, parse_parallel_spec, switch_branches


def test_gpipe_traces_one_branch_per_distinct_stage_function():
    def first(p, state, x):
        return x * p, x

    def middle(p, state, x):
        return state + p, jnp.zeros_like(x)

    def last(p, state, x):
        return state, 2 * state

    def run(stages):
        mesh = AbstractMesh((len(stages),), (PIPELINE_AXIS,), axis_types=(AxisType.Auto,))
        args = (jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((2, 3), jnp.float32))
        with jax.sharding.use_abstract_mesh(mesh):
            jaxpr = jax.make_jaxpr(lambda p, xs: gpipe(stages, p, xs, jnp.zeros(3), 2))(*args)
        return switch_branches(jaxpr.jaxpr)

    assert run([first, middle, middle, middle, last]) == [3]
    assert run([first, middle, lambda p, s, x: middle(p, s, x), last]) == [4]


def test_middle_stages_of_equal_steps_and_remat_are_one_function():
    def stages(spec, **kw):
        return pipeline_stages(9, MemoryConfig(), parse_parallel_spec(spec), None, None, **kw)

    even = stages("pipeline:5,microbatches:5,stage-steps:1/2/2/2/2")
    assert even[1] is even[2] is even[3] and len(set(even)) == 3
    # Stage 2 checkpoints a step the others do not: a program of its own.
    remat = stages("pipeline:5,microbatches:5,stage-steps:1/2/2/2/2,stage-remat:0/0/1/0/0")
    assert remat[1] is remat[3] and len(set(remat)) == 4
    # Other step counts in the middle, and every stage on its own without `shared`.
    assert len(set(stages("pipeline:4,microbatches:4,stage-steps:3/2/3/1"))) == 4
    assert len(set(stages("pipeline:5,microbatches:5,stage-steps:1/2/2/2/2",
                          shared=False))) == 5
