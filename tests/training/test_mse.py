"""The network's plain mean-square loss and its shapes."""

import jax
import jax.numpy as jnp
import numpy as np

from gclab.config import ModelConfig, TaskConfig
from gclab.geometry import graphs_for
from gclab.memory import MemoryConfig
from gclab.model import graph_inputs, make_network
from gclab.training import network_mse, network_mse_shapes, relative_error
from gclab.training.loop import check_init_params

TASK = TaskConfig(pressure_levels=(500, 850))
TINY = ModelConfig(resolution=10.0, mesh_splits=2, latent_size=16, processor_steps=2)


def test_shapes_and_loss_match_the_network():
    """The loss is that of the network built with its memory techniques: in bfloat16, whose
    loss differs from float32's (by 1e-3 of it here) far more than the tolerance below."""
    graph = graph_inputs(graphs_for(TINY))
    params_s, x_s, y_s = network_mse_shapes(TINY, TASK, graph, batch=2)
    ng = graph.grid_nodes.shape[0]
    assert x_s.shape == (ng, 2, TASK.data_channels)
    assert y_s.shape == (ng, 2, TASK.output_channels)
    check_init_params(params_s, TINY, TASK)  # the model's parameters, no more, no fewer
    # NumPy's generator: JAX's, run op by op, compiles once per parameter shape.
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(
        lambda s: (0.3 * rng.standard_normal(s.shape)).astype(s.dtype), params_s)
    x, y = (rng.standard_normal(s.shape).astype(np.float32) for s in (x_s, y_s))
    memory = MemoryConfig(precision="bf16")
    net = make_network(TINY, x_s.shape[-1], y_s.shape[-1], memory)
    loss = network_mse(TINY, TASK, graph, memory)
    # One program for both (compiled, not run op by op), the graph closed over in each.
    got, expected = jax.jit(lambda p, x, y: (
        loss(p, x, y), jnp.mean((net.apply(p, graph, x) - y) ** 2)))(params, x, y)
    np.testing.assert_allclose(float(got), float(expected), rtol=1e-6)


def test_relative_error():
    b = jnp.array([3.0, 4.0])
    assert relative_error(b, b) == 0.0
    np.testing.assert_allclose(relative_error(b + jnp.array([0.0, 0.5]), b), 0.1, rtol=1e-6)
