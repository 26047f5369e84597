"""The training example: normalised inputs, targets and forcings, and their channel layout.

Shapes: Ng grid nodes, B batch, C input channels, O output channels, T rollout steps.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gclab.config import NUM_FORCINGS, TaskConfig, require_count, require_kind


class Example(NamedTuple):
    """One training example, normalised (`gclab.training.data.Normalization.normalise`).

    Attributes:
      inputs: [Ng, B, C] inputs of the first step, in `TaskConfig` channel order: frame
        t-1 variables (V), frame t variables (V), forcings of frames t-1, t, t+1 (3 x 5),
        statics (2).
      targets: [T, Ng, B, O] targets of steps 1..T. Channels whose variable is an input:
        (frame t+k - frame t) / residual std, the sum of the true normalised residuals of
        steps 1..k (at T = 1, the usual normalised residual). Other channels
        (precipitation when it is not an input): the normalised frame t+k itself.
      forcings: [T, Ng, B, 5] forcings of frames t+2 .. t+T+1 (step k+1's inputs need
        frame t+k+1's; the last row is never used).
    """

    inputs: jax.Array
    targets: jax.Array
    forcings: jax.Array


def input_variable_channels(task: TaskConfig) -> np.ndarray:
    """Indices into the O output channels of the V variables that are also inputs."""
    names = task.target_channel_names
    if task.precipitation_input:
        return np.arange(len(names))
    return np.asarray([i for i, n in enumerate(names) if n != "total_precipitation_6hr"])


def example_shapes(task: TaskConfig, num_grid_nodes: int, batch: int,
                   rollout: int) -> Example:
    """An `Example` of `jax.ShapeDtypeStruct`s (for compiling from shapes alone).

    Raises:
      TypeError: `task` is not a `TaskConfig`.
      ValueError: a size that is not an integer >= 1.
    """
    require_kind("task", task, TaskConfig, caller="example_shapes")
    num_grid_nodes, batch, rollout = (
        require_count(name, value, 1, "example_shapes") for name, value in
        (("num_grid_nodes", num_grid_nodes), ("batch", batch), ("rollout", rollout)))
    sds, f32 = jax.ShapeDtypeStruct, jnp.float32
    return Example(sds((num_grid_nodes, batch, task.data_channels), f32),
                   sds((rollout, num_grid_nodes, batch, task.output_channels), f32),
                   sds((rollout, num_grid_nodes, batch, NUM_FORCINGS), f32))


def residual_channels(task: TaskConfig) -> np.ndarray:
    """[O] bool: True where the target is a residual (its variable is also an input)."""
    mask = np.zeros(task.output_channels, bool)
    mask[input_variable_channels(task)] = True
    return mask
