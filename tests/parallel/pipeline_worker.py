"""Loss and gradients of a tiny model under pipeline layouts, against one device (a worker).

Run as `python pipeline_worker.py N LAYOUT@MEMORY[;LAYOUT@MEMORY...]` in a fresh process:
it asks for N simulated CPU devices before JAX starts, and for each layout (e.g.
`pipeline:2,microbatches:2,stage-steps:1/4,stage-remat:1/0`) and memory setting (`none`,
`remat`, `lean`, `deepmind-bf16`) computes the loss and gradients under the layout
(batch 4, rollout 1) and prints one JSON line with the largest relative differences from
one device's float32 baseline: the plain model, no memory technique, computed once for all
cases. A bfloat16 setting is compared with the same setting on one device, and with the
float32 baseline by the norm and direction of the whole gradient. Compiles skip LLVM
optimisation (`plan_only_options`), which keeps them fast.
"""

from __future__ import annotations

import functools
import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", int(sys.argv[1]))

from gclab import training  # noqa: E402
from gclab.config import ModelConfig, TaskConfig  # noqa: E402
from gclab.geometry.graphs import graphs_for  # noqa: E402
from gclab.measure.agreement import compare_leaves, gradient_cosine  # noqa: E402
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
    # The authors' recipe, bfloat16 stages (each casts the float32 parameters itself).
    "deepmind-bf16": get_recipe("deepmind", "bf16").replace(edge_block_size=EDGE_BLOCK),
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
    references = {}

    def reference(memory: MemoryConfig):
        """One device's loss and gradient leaves, computed once per setting."""
        if memory not in references:
            loss, grads = loss_and_grad((params, graph, example), memory, weights)
            references[memory] = loss, jax.tree_util.tree_leaves(grads)
        return references[memory]

    for item in sys.argv[2].split(";"):
        if item.startswith("plan "):
            print(json.dumps(planned_step(parse_parallel_spec(item[5:]), graphs)), flush=True)
            continue
        spec, memory_name = item.split("@")
        layout, memory = parse_parallel_spec(spec), MEMORY[memory_name]
        # float32: one device's baseline (no technique); bfloat16: the same setting there.
        ref_loss, ref_leaves = reference(
            memory if memory.precision != "f32" else MEMORY["none"])
        mesh = make_mesh(layout)
        with use_layout(mesh, layout):
            loss, grads = loss_and_grad(place_step_args(mesh, params, graph, example), memory,
                                        weights)
        leaves = jax.tree_util.tree_leaves(grads)
        rel, norm_rel = compare_leaves(leaves, ref_leaves)
        record = {"case": item, "layout": layout.spec, "memory": memory_name,
                  "loss": float(loss), "ref_loss": float(ref_loss),
                  "loss_rel": abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
                  "grad_rel": rel, "grad_norm_rel": norm_rel}
        if memory.precision != "f32":  # also against one device's float32 baseline
            f32_loss, f32_leaves = reference(MEMORY["none"])
            record.update(
                loss_rel_f32=abs(float(loss) - float(f32_loss)) / abs(float(f32_loss)),
                grad_norm_rel_f32=compare_leaves(leaves, f32_leaves)[1],
                grad_cosine_f32=gradient_cosine(leaves, f32_leaves))
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
