"""A training step laid out over a device mesh (`gclab.parallel`): shardings and placement.

Where each argument of `train_step_fn` lives:

| argument | sharding |
|---|---|
| `TrainState` (parameters, optimizer state, step) | whole on every device |
| `GraphInputs`: grid nodes and the three edge sets | rows over `spatial` (where they divide) |
| `GraphInputs`: mesh nodes | whole on every device |
| `Example` fields (`[Ng, B, ...]`, `[T, Ng, B, ...]`) | grid nodes over `spatial`, batch over `data` |

With a `pipeline` axis the network runs its stages on it (`gclab.parallel.pipeline`):
every argument above is whole over `pipeline`, and each stage's device reads what its
stage needs.

The step is jitted with the state and metrics whole on every device, so the compiler
reduces the gradients over `data` and `spatial` where the shardings call for it; inside,
the network marks its node and edge arrays (`gclab.parallel.split_rows`, `full_rows`).
The mesh is set (`jax.set_mesh`) while the step is traced and run.

Shapes: Ng grid nodes, B batch, C data channels, O outputs, T rollout steps, E edges.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import haiku as hk
import jax
import numpy as np
import optax
from jax.sharding import Mesh

from gclab.config import TaskConfig
from gclab.memory.config import MemoryConfig
from gclab.model.graphcast import GraphInputs
from gclab.parallel.config import DATA_AXIS, ParallelConfig
from gclab.parallel.pipeline import check_stage_collectives
from gclab.parallel.sharding import global_array, replicated, rows_sharding, use_layout
from gclab.training.examples import Example
from gclab.training.step import TrainState, train_step_fn


def mesh_axis_size(mesh: Mesh, name: str) -> int:
    """The size of one axis of `mesh`."""
    return dict(zip(mesh.axis_names, mesh.devices.shape))[name]


def check_batch(mesh: Mesh, batch: int, memory: MemoryConfig,
                layout: Optional[ParallelConfig] = None) -> None:
    """Raises ValueError unless `batch` splits over `data` and then into micro-batches
    (gradient accumulation's, then the pipeline's of `layout`)."""
    if layout is not None:
        layout.check_batch(batch, memory.microbatches)
        return
    data = mesh_axis_size(mesh, DATA_AXIS)
    if batch % data or (batch // data) % memory.microbatches:
        raise ValueError(f"batch {batch} is invalid for data:{data} and microbatches="
                         f"{memory.microbatches}: a multiple of {data * memory.microbatches}")


def example_shardings(mesh: Mesh, example: Example) -> Example:
    """`NamedSharding`s of an example: grid nodes over `spatial`, batch over `data`."""
    inputs, targets, forcings = (np.shape(a) for a in example)
    return Example(rows_sharding(mesh, inputs, 0, 1), rows_sharding(mesh, targets, 1, 2),
                   rows_sharding(mesh, forcings, 1, 2))


def graph_shardings(mesh: Mesh, graph: GraphInputs) -> GraphInputs:
    """`NamedSharding`s of the graph: every edge set and the grid nodes split, mesh nodes whole."""
    out = {name: rows_sharding(mesh, np.shape(a), 0) for name, a in graph._asdict().items()}
    out["mesh_nodes"] = replicated(mesh)
    return GraphInputs(**out)


def step_shardings(mesh: Mesh, state: Any, graph: GraphInputs, example: Example) -> tuple:
    """`(state, graph, example)` shardings of a training step's arguments."""
    state_sh = jax.tree_util.tree_map(lambda _: replicated(mesh), state)
    return state_sh, graph_shardings(mesh, graph), example_shardings(mesh, example)


def abstract_step_args(mesh: Mesh, state: Any, graph: GraphInputs, example: Example) -> tuple:
    """The step's arguments as `jax.ShapeDtypeStruct`s carrying their shardings."""
    shardings = step_shardings(mesh, state, graph, example)
    return tuple(
        jax.tree_util.tree_map(
            lambda a, s: jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=s), tree, sh)
        for tree, sh in zip((state, graph, example), shardings))


def place_step_args(mesh: Mesh, state: Any, graph: GraphInputs, example: Example) -> tuple:
    """The step's arguments as global arrays on the mesh.

    Every process passes the same whole (host or single-device) values and places the
    shards of its own devices (`gclab.parallel.global_array`).
    """
    shardings = step_shardings(mesh, state, graph, example)
    return tuple(
        jax.tree_util.tree_map(lambda a, s: global_array(np.asarray(a), s), tree, sh)
        for tree, sh in zip((state, graph, example), shardings))


def place_example(mesh: Mesh, example: Example) -> Example:
    """One example as global arrays on the mesh (see `place_step_args`)."""
    return Example(*(global_array(np.asarray(a), s)
                     for a, s in zip(example, example_shardings(mesh, example))))


def make_sharded_train_step(net: hk.Transformed, optimizer: optax.GradientTransformation,
                            task: TaskConfig, memory: MemoryConfig, rollout: int,
                            weights: tuple, mesh: Mesh,
                            residual_scale: jax.Array | float = 1.0,
                            layout: Union[str, ParallelConfig] = "split") -> Callable:
    """`make_train_step` over the devices of `mesh`.

    Arguments as in `gclab.training.make_train_step`, with the mesh and the layout
    (`ParallelConfig`: its mesh-node rule and pipeline; or only its `mesh_nodes`). The
    returned step
    takes arguments placed by `place_step_args` (or shapes from `abstract_step_args`:
    `step.lower(*args)`), and returns the new state and metrics whole on every device.

    With a pipeline, the step's first call for arguments of new shapes or shardings
    compiles it (JAX keeps that compile for the call) and reads its optimised HLO before
    it runs: a step whose stages would wait on each other forever is refused
    (`gclab.parallel.pipeline.check_stage_collectives`).

    Raises (when called):
      gclab.parallel.pipeline.StagesWouldHang: with a pipeline, before the step runs, a
        compiled step with a collective inside a stage (a ValueError).
    """
    fn = train_step_fn(net, optimizer, task, memory, rollout, weights, residual_scale)
    jitted = jax.jit(fn, out_shardings=(replicated(mesh), replicated(mesh)),
                     donate_argnums=(0,) if memory.donate else ())
    pipelined = isinstance(layout, ParallelConfig) and layout.pipeline > 1
    checked: set = set()  # signatures of arguments whose compiled step was read

    def step(state: TrainState, graph: GraphInputs, example: Example):
        with use_layout(mesh, layout):
            if pipelined:
                key = _signature((state, graph, example))
                if key not in checked:
                    compiled = jitted.lower(state, graph, example).compile()
                    check_stage_collectives(compiled.as_text(), layout)
                    checked.add(key)
            return jitted(state, graph, example)

    def lower(state, graph, example):
        with use_layout(mesh, layout):
            return jitted.lower(state, graph, example)

    step.lower = lower
    return step


def _signature(args: Any) -> tuple:
    """What a jitted function compiles for: the tree of `args`, and each leaf's shape,
    dtype and sharding."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    return tree, tuple((np.shape(a), getattr(a, "dtype", None), getattr(a, "sharding", None))
                       for a in leaves)
