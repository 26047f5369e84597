"""Loss and gradients of a tiny model under several layouts, against one device (a worker).

Run as `python layout_worker.py N LAYOUT@MEMORY@ROLLOUT[;LAYOUT@MEMORY@ROLLOUT...]` in a
fresh process: it asks for N simulated CPU devices before JAX starts, and for each case (a
layout `data:A,spatial:B` on the first A * B devices, a memory setting, see `memory_of`, and
a rollout length) computes the loss and gradients under the layout, and prints one JSON
line with the largest relative differences from one device's float32 baseline (the plain
model, no memory technique, same rollout). A bfloat16 case is also compared with its own
setting on one device, whose roundings are closest to its own. One process runs every case,
so JAX starts, the graphs are built and the model initialised once, and each one-device
reference is compiled once. Compiles skip LLVM optimisation (`plan_only_options`), which
keeps them fast.
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
from gclab.sizing.step import plan_only_options  # noqa: E402
from gclab.training.layout import place_step_args  # noqa: E402

TINY = ModelConfig(resolution=6.0, mesh_splits=2, latent_size=16, processor_steps=2)
TASK = TaskConfig.from_levels(13)
EDGE_BLOCK = 700  # several blocks of every edge set at 6 deg


def memory_of(name: str) -> MemoryConfig:
    if name == "blocks-remat":
        return MemoryConfig(processor_remat="step", edge_block_size=EDGE_BLOCK,
                            processor_edge_blocks=True, checkpoint_encoder=True,
                            checkpoint_decoder=True)
    if name == "remat":
        return MemoryConfig(processor_remat="step")
    if name == "blocks":
        return MemoryConfig(edge_block_size=EDGE_BLOCK)
    if name == "processor-blocks":
        return MemoryConfig(edge_block_size=EDGE_BLOCK, processor_edge_blocks=True)
    if name == "stages":
        return MemoryConfig(checkpoint_encoder=True, checkpoint_decoder=True)
    if name == "lean":
        return get_recipe("lean").replace(edge_block_size=EDGE_BLOCK)
    if name == "bf16":
        return MemoryConfig(precision="bf16")
    if name == "lean-bf16":
        return get_recipe("lean", "bf16").replace(edge_block_size=EDGE_BLOCK)
    return MemoryConfig()


def loss_and_grad(args, memory: MemoryConfig, rollout: int, weights: tuple):
    net = make_network(TINY, TASK.data_channels, TASK.output_channels, memory)
    fn = functools.partial(training.loss_and_grad, memory=memory, net=net, task=TASK,
                           rollout=rollout, weights=weights)
    compiled = jax.jit(fn).lower(*args).compile(plan_only_options())
    return jax.device_get(compiled(*args))


def main() -> None:
    batch = 4
    graphs = graphs_for(TINY)
    graph = graph_inputs(graphs)
    net = make_network(TINY, TASK.data_channels, TASK.output_channels)
    weights = training.loss_weights(TASK, graphs.grid_lat, graphs.n_lon)
    examples, references = {}, {}

    def example_of(rollout: int):
        if rollout not in examples:  # the same batch as a process of its own would draw
            weather = training.SyntheticWeather(TASK, TINY.resolution, seed=3)
            examples[rollout] = weather.make_batch(batch, rollout)
        return examples[rollout]

    params = net.init(jax.random.PRNGKey(0), graph, example_of(1).inputs)

    def reference(memory: MemoryConfig, rollout: int):
        """One device's loss and gradient leaves, computed once per setting and rollout."""
        if (memory, rollout) not in references:
            loss, grads = loss_and_grad((params, graph, example_of(rollout)), memory, rollout,
                                        weights)
            references[memory, rollout] = loss, jax.tree_util.tree_leaves(grads)
        return references[memory, rollout]

    for item in sys.argv[2].split(";"):
        spec, memory_name, rollout_text = item.split("@")
        rollout = int(rollout_text)
        layout, memory = parse_parallel_spec(spec), memory_of(memory_name)
        # float32: one device's baseline; bfloat16: the same setting on one device.
        ref_loss, ref_leaves = reference(
            memory if memory.precision != "f32" else MemoryConfig(), rollout)
        mesh = make_mesh(layout)
        with use_layout(mesh, layout.mesh_nodes):
            loss, grads = loss_and_grad(place_step_args(mesh, params, graph, example_of(rollout)),
                                        memory, rollout, weights)
        leaves = jax.tree_util.tree_leaves(grads)
        rel, norm_rel = compare_leaves(leaves, ref_leaves)
        record = {"case": item, "layout": layout.spec, "memory": memory_name,
                  "rollout": rollout, "loss": float(loss), "ref_loss": float(ref_loss),
                  "loss_rel": abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
                  "grad_rel": rel, "grad_norm_rel": norm_rel}
        if memory.precision != "f32":  # also against one device's float32 baseline
            f32_loss, f32_leaves = reference(MemoryConfig(), rollout)
            record.update(
                loss_rel_f32=abs(float(loss) - float(f32_loss)) / abs(float(f32_loss)),
                grad_norm_rel_f32=compare_leaves(leaves, f32_leaves)[1],
                grad_cosine_f32=gradient_cosine(leaves, f32_leaves))
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
