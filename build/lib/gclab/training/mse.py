"""The network's plain mean-square loss, for experiments on memory and precision.

`network_mse` is the mean over every output of the squared difference between the network
and a target: no loss weights, no rollout, no normalisation. It isolates what the network
itself costs (its compiled memory, its rounding) from the training loss of `step`.
`network_mse_shapes` gives its arguments as `jax.ShapeDtypeStruct`s, so that it can be
compiled or traced without allocating anything, and `relative_error` compares two results.

Shapes: Ng grid nodes, B batch, C data channels, O outputs.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from gclab.config import ModelConfig, TaskConfig
from gclab.memory.config import MemoryConfig
from gclab.model.graphcast import GraphInputs, make_network

__all__ = ["network_mse", "network_mse_shapes", "relative_error"]


def network_mse(model: ModelConfig, task: TaskConfig, graph: GraphInputs,
                memory: Optional[MemoryConfig] = None) -> Callable[..., jax.Array]:
    """`loss(params, inputs [Ng, B, C], targets [Ng, B, O])`: the mean squared error.

    Args:
      model: the network.
      task: its input and output channels.
      graph: the graphs as arrays (`gclab.model.graph_inputs`), closed over.
      memory: the memory techniques of the network (default: none).
    """
    net = make_network(model, task.data_channels, task.output_channels, memory)

    def loss(params: Any, inputs: jax.Array, targets: jax.Array) -> jax.Array:
        return jnp.mean((net.apply(params, graph, inputs) - targets) ** 2)

    return loss


def network_mse_shapes(model: ModelConfig, task: TaskConfig, graph: GraphInputs,
                       batch: int = 1) -> tuple[Any, jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """`(params, inputs, targets)` of `network_mse` as shapes: nothing is allocated.

    Args:
      model: the network.
      task: its input and output channels.
      graph: the graphs as arrays or shapes.
      batch: B.

    Returns:
      The parameter tree of `jax.ShapeDtypeStruct`s, inputs [Ng, B, C] and targets
      [Ng, B, O], all float32.
    """
    ng = int(graph.grid_nodes.shape[0])
    x = jax.ShapeDtypeStruct((ng, batch, task.data_channels), jnp.float32)  # [Ng, B, C]
    y = jax.ShapeDtypeStruct((ng, batch, task.output_channels), jnp.float32)  # [Ng, B, O]
    init = make_network(model, task.data_channels, task.output_channels).init
    return jax.eval_shape(init, jax.random.PRNGKey(0), graph, x), x, y


def relative_error(a: jax.Array, b: jax.Array) -> float:
    """`|a - b| / |b|` in the Frobenius norm: how far `a` is from the reference `b`."""
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
