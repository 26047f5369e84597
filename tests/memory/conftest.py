"""What the technique tests share: the compiled gradient of one step, from shapes alone,
compiled once per configuration in a process."""

import functools

import jax
import jax.numpy as jnp
import pytest

from gclab.config import ModelConfig
from gclab.geometry import build_graphs
from gclab.memory import MemoryConfig
from gclab.model import graph_inputs, make_network

# Input and output channels of the small networks these tests compile.
CHANNELS, OUTPUTS = 5, 4


@functools.lru_cache(maxsize=None)
def abstract_inputs(cfg: ModelConfig):
    """(graph inputs, [Ng, 1, C] float32 inputs) of `cfg`'s grid and mesh, as shapes."""
    graph = graph_inputs(build_graphs(cfg.resolution, cfg.mesh_splits))
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), graph)
    inputs = jax.ShapeDtypeStruct((graph.grid_nodes.shape[0], 1, CHANNELS), jnp.float32)
    return shapes, inputs


def compiled_grad(cfg: ModelConfig, mem: MemoryConfig, compiler_options=None):
    """The compiled gradient of a mean-square loss of `cfg`'s network under `mem`.

    Compiled once per (config, memory, options) in a process: several tests read the same
    program (its temp bytes, its optimised HLO)."""
    options = tuple(sorted((compiler_options or {}).items()))
    return _compiled_grad(cfg, mem, options)


@functools.lru_cache(maxsize=None)
def _compiled_grad(cfg: ModelConfig, mem: MemoryConfig, options: tuple):
    graph, inputs = abstract_inputs(cfg)
    net = make_network(cfg, CHANNELS, OUTPUTS, mem)
    params = jax.eval_shape(net.init, jax.random.PRNGKey(0), graph, inputs)

    def loss(p, g, x):
        return jnp.mean(net.apply(p, g, x) ** 2)

    lowered = jax.jit(jax.grad(loss)).lower(params, graph, inputs)
    return lowered.compile(compiler_options=dict(options) or None)


def compiled_grad_temp(cfg: ModelConfig, mem: MemoryConfig, compiler_options=None) -> int:
    """XLA's temp bytes of the gradient of a mean-square loss of `cfg`'s network under `mem`."""
    return compiled_grad(cfg, mem, compiler_options).memory_analysis().temp_size_in_bytes


@pytest.fixture(scope="session")
def grad_temp():
    """`compiled_grad_temp(cfg, mem, compiler_options=None)`, for the tests of this folder."""
    return compiled_grad_temp


@pytest.fixture(scope="session")
def grad_compiled():
    """`compiled_grad(cfg, mem, compiler_options=None)`: the compiled program itself."""
    return compiled_grad


@pytest.fixture(scope="session")
def shapes_of():
    """`abstract_inputs(cfg)`: (graph inputs, float32 inputs) of `cfg` as shapes."""
    return abstract_inputs
