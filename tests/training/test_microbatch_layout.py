"""Micro-batches over a data-parallel layout move no sample between devices.

With the batch split over `data` (each device a contiguous range of samples), micro-batches
of every k-th sample keep each device's share; contiguous micro-batches were resharded,
an all-to-all of the inputs and targets, every step. The step is compiled (never run) in a
fresh process with 2 simulated CPU devices (JAX fixes the device count when it starts).
Tiny model: 30 deg, 1 split, 1 x 8.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import json, re, sys
import jax
jax.config.update("jax_num_cpu_devices", 2)
from gclab.config import ModelConfig, TaskConfig
from gclab.geometry import build_graphs
from gclab.measure.compiled import plan_only_options
from gclab.memory import MemoryConfig
from gclab.model import graph_inputs, make_network
from gclab.parallel.config import ParallelConfig
from gclab.parallel.sharding import make_mesh
from gclab.training import (TrainConfig, example_shapes, init_state_from_params, loss_weights,
                            make_optimizer)
from gclab.training.layout import abstract_step_args, make_sharded_train_step

task = TaskConfig(pressure_levels=(500, 850))
cfg = ModelConfig(resolution=30.0, mesh_splits=1, latent_size=8, processor_steps=1)
graphs = build_graphs(cfg.resolution, cfg.mesh_splits)
graph = graph_inputs(graphs)
example = example_shapes(task, graphs.num_grid_nodes, 4, 1)  # B = 4
memory = MemoryConfig(microbatches=2)
net = make_network(cfg, task.data_channels, task.output_channels, memory)
opt = make_optimizer(TrainConfig())
params = jax.eval_shape(net.init, jax.random.PRNGKey(0), graph, example.inputs)
state = jax.eval_shape(lambda p: init_state_from_params(p, opt), params)
layout = ParallelConfig(data=2)
mesh = make_mesh(layout)
step = make_sharded_train_step(net, opt, task, memory, 1,
                               loss_weights(task, graphs.grid_lat, graphs.n_lon), mesh,
                               layout=layout)
hlo = step.lower(*abstract_step_args(mesh, state, graph, example)).compile(
    plan_only_options()).as_text()
print(json.dumps({op: len(re.findall(r"\\b" + op + r"(-start)?\\(", hlo))
                  for op in ("all-to-all", "all-reduce")}))
"""


def test_data_parallel_microbatches_compile_without_an_all_to_all():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True,
                          env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["all-reduce"] > 0, counts  # the gradients are summed over `data`
    assert counts["all-to-all"] == 0, counts
