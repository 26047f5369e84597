"""The network's plain mean-square loss and its shapes."""

import jax
import jax.numpy as jnp
import numpy as np

from gclab.config import get_preset
from gclab.geometry import graphs_for
from gclab.memory import MemoryConfig
from gclab.model import graph_inputs, make_network
from gclab.training import network_mse, network_mse_shapes, relative_error


def test_shapes_and_loss_match_the_network():
    preset = get_preset("cpu-4x32")
    graph = graph_inputs(graphs_for(preset.model))
    params_s, x_s, y_s = network_mse_shapes(preset.model, preset.task, graph, batch=2)
    ng = graph.grid_nodes.shape[0]
    assert x_s.shape == (ng, 2, preset.task.data_channels)
    assert y_s.shape == (ng, 2, preset.task.output_channels)
    params = make_network(preset.model, x_s.shape[-1], y_s.shape[-1]).init(
        jax.random.PRNGKey(0), graph, jnp.zeros(x_s.shape))
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(params_s)
    x = jax.random.normal(jax.random.PRNGKey(1), x_s.shape)
    y = jax.random.normal(jax.random.PRNGKey(2), y_s.shape)
    net = make_network(preset.model, x_s.shape[-1], y_s.shape[-1])
    expected = jnp.mean((net.apply(params, graph, x) - y) ** 2)
    loss = network_mse(preset.model, preset.task, graph, MemoryConfig())
    np.testing.assert_allclose(float(loss(params, x, y)), float(expected), rtol=1e-6)


def test_relative_error():
    b = jnp.array([3.0, 4.0])
    assert relative_error(b, b) == 0.0
    np.testing.assert_allclose(relative_error(b + jnp.array([0.0, 0.5]), b), 0.1, rtol=1e-6)
