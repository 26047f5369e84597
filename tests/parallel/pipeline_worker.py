"""Loss and gradients of a tiny model under pipeline layouts, against one device (a worker).

Run as `python pipeline_worker.py N LAYOUT@MEMORY[;LAYOUT@MEMORY...]` in a fresh process:
it asks for N simulated CPU devices before JAX starts, and for each layout (e.g.
`pipeline:2,microbatches:2,stage-steps:1/4,stage-remat:1/0`) and memory setting (`none`,
`remat`, `lean`) computes the loss and gradients under the layout (batch 4,
rollout 1) and prints one JSON line with the largest relative differences from one
device's float32 baseline: the plain model, no memory technique, computed once for all
cases. Compiles skip LLVM optimisation (`plan_only_options`), which keeps them fast.
"""

from __future__ import annotations

import functools
import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", int(sys.argv[1]))

import numpy as np  # noqa: E402

from gclab import training  # noqa: E402
from gclab.config import ModelConfig, TaskConfig  # noqa: E402
from gclab.geometry.graphs import graphs_for  # noqa: E402
from gclab.memory.config import MemoryConfig, get_recipe  # noqa: E402
from gclab.model.graphcast import graph_inputs, make_network  # noqa: E402
from gclab.parallel import make_mesh, parse_parallel_spec, use_layout  # noqa: E402
from gclab.sizing.pipeline_plan import (  # noqa: E402
    evaluate,
    even_split,
    fit_stage_costs,
    plan_pipeline,
)
from gclab.sizing.step import StepSpec, compile_train_step, plan_only_options  # noqa: E402
from gclab.training.layout import place_step_args  # noqa: E402

# 5 processor steps: uneven splits over 2 and 4 stages.
TINY = ModelConfig(resolution=6.0, mesh_splits=2, latent_size=16, processor_steps=5)
TASK = TaskConfig.from_levels(13)
EDGE_BLOCK = 700  # several blocks of every edge set at 6 deg
MEMORY = {
    "none": MemoryConfig(),
    "remat": MemoryConfig(processor_remat="step"),
    # Streamed grid nodes: the inputs, not grid latents, travel from the first stage to
    # the last.
    "lean": get_recipe("lean").replace(edge_block_size=EDGE_BLOCK),
}


def loss_and_grad(args, memory: MemoryConfig, weights: tuple):
    net = make_network(TINY, TASK.data_channels, TASK.output_channels, memory)
    fn = functools.partial(training.loss_and_grad, memory=memory, net=net, task=TASK,
                           rollout=1, weights=weights)
    compiled = jax.jit(fn).lower(*args).compile(plan_only_options())
    return jax.device_get(compiled(*args))


def planned_step(layout, graphs) -> dict:
    """The pipeline planner's choices for `layout` (one sample per micro-batch) at a budget
    both fit, their predicted bytes per device and their whole steps' compiled bytes."""
    memory, batch = MemoryConfig(), layout.data * layout.microbatches
    costs = fit_stage_costs(TINY, TASK, memory, layout.microbatches, 1, 1e12, 1e10, graphs,
                            layout.pipeline)
    split = even_split(TINY.processor_steps, layout.pipeline)
    plain = evaluate(costs, split, (0,) * layout.pipeline, layout.microbatches, float("inf"))
    choice = plan_pipeline(TINY, TASK, memory, layout, batch, 0.95 * max(plain.memory_bytes),
                           1e12, 1e10, graphs, compile_choices=False, costs=costs)
    out = {"plan": layout.spec}
    for name, c in (("milp", choice.milp), ("uniform", choice.uniform)):
        lay = layout.replace(stage_steps=c.stage_steps, stage_remat=c.stage_remat)
        step = compile_train_step(StepSpec(TINY, TASK, memory, batch=batch, parallel=lay),
                                  graphs)
        out[name] = {"parallel": lay.spec, "fits": c.fits,
                     "predicted": choice.predicted_step_bytes(c),
                     "compiled": step.memory.total_bytes,
                     "collective_permute_bytes": step.collectives.get("collective-permute", 0)}
    return out


def main() -> None:
    batch = 4
    graphs = graphs_for(TINY)
    graph = graph_inputs(graphs)
    weather = training.SyntheticWeather(TASK, TINY.resolution, seed=3)
    example = weather.make_batch(batch, 1)
    net = make_network(TINY, TASK.data_channels, TASK.output_channels)
    params = net.init(jax.random.PRNGKey(0), graph, example.inputs)
    weights = training.loss_weights(TASK, graphs.grid_lat, graphs.n_lon)
    baseline = None  # one device, float32, no memory technique: what every case must give
    for item in sys.argv[2].split(";"):
        if item.startswith("plan "):
            print(json.dumps(planned_step(parse_parallel_spec(item[5:]), graphs)), flush=True)
            continue
        spec, memory_name = item.split("@")
        layout, memory = parse_parallel_spec(spec), MEMORY[memory_name]
        if baseline is None:
            baseline = loss_and_grad((params, graph, example), MEMORY["none"], weights)
        ref_loss, ref_grads = baseline
        ref_leaves = jax.tree_util.tree_leaves(ref_grads)
        mesh = make_mesh(layout)
        with use_layout(mesh, layout):
            loss, grads = loss_and_grad(place_step_args(mesh, params, graph, example), memory,
                                        weights)
        leaves = jax.tree_util.tree_leaves(grads)
        rel = max(float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-30))
                  for a, b in zip(leaves, ref_leaves))
        print(json.dumps({
            "layout": layout.spec, "memory": memory_name, "loss": float(loss),
            "ref_loss": float(ref_loss),
            "loss_rel": abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
            "grad_rel": rel}), flush=True)


if __name__ == "__main__":
    main()
