"""GraphCast's training loss: weighted squared error on normalised residual targets.

The official code weights the squared error of each variable by latitude (the area of its
grid cell, mean 1 over latitudes) and, for atmospheric variables, by pressure level (level /
mean level); it then takes the mean over everything but the batch *per variable* (over nodes
and, for atmospheric variables, levels), sums the variables with per-variable weights (2m
temperature 1.0; 10m winds, mean sea-level pressure and precipitation 0.1; the rest 1.0), and
the training loop averages over the batch.

gclab's channels are flat (`TaskConfig.target_channel_names`: 5 surface channels, then 6
variables x levels), so that rule becomes one weight per channel (`channel_weights`):

    surface variable v:                w_v
    atmospheric variable v at level p: w_v * (p / mean level) / number of levels

and `weighted_mse` = mean over batch and nodes of the node-weighted error, summed over
channels. A 13-level atmospheric variable thus weighs as much in total as one surface
variable of the same weight, as in the official loss.

Shapes: Ng grid nodes, B batch, O output channels, n_lat latitudes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gclab.config import (
    ATMOSPHERIC_VARIABLES,
    SURFACE_VARIABLES,
    TaskConfig,
    require_kind,
)

VARIABLE_WEIGHTS = {
    "2m_temperature": 1.0,
    "10m_u_component_of_wind": 0.1,
    "10m_v_component_of_wind": 0.1,
    "mean_sea_level_pressure": 0.1,
    "total_precipitation_6hr": 0.1,
}  # every other variable: 1.0


def latitude_weights(grid_lat) -> np.ndarray:
    """Cell-area weights [n_lat] of an equally spaced latitude grid, normalised to mean 1.

    A row at latitude phi with spacing d covers the band phi +- d/2, whose area per unit of
    longitude is sin(phi + d/2) - sin(phi - d/2) = 2 cos(phi) sin(d/2). On a pole-inclusive
    grid a pole row covers only the half cell between the pole and 90 - d/2 degrees:
    1 - cos(d/2) = 2 sin(d/4)^2. (The official code uses the same ratio of pole to interior
    rows.) A grid without pole rows gets 2 cos(phi) sin(d/2) everywhere.

    Args:
      grid_lat: [n_lat] latitudes in degrees, equally spaced, increasing or decreasing.

    Returns:
      [n_lat] float32 weights with mean 1.
    """
    lat = np.asarray(grid_lat, np.float64)
    if lat.ndim != 1 or lat.size < 2:
        raise ValueError(f"grid_lat must be [n_lat] with n_lat >= 2, got shape {lat.shape}")
    spacing = np.diff(lat)
    if not np.allclose(spacing, spacing[0]) or spacing[0] == 0:
        raise ValueError("grid_lat must be equally spaced")
    if np.abs(lat).max() > 90 + 1e-9:
        raise ValueError(f"grid_lat must lie in [-90, 90], got {lat.min()}..{lat.max()}")
    d = np.deg2rad(abs(spacing[0]))
    w = 2.0 * np.cos(np.deg2rad(lat)) * np.sin(d / 2)  # [n_lat]
    pole = np.isclose(np.abs(lat), 90.0)
    w[pole] = 1.0 - np.cos(d / 2)  # the half cell around a pole
    return (w / w.mean()).astype(np.float32)


def level_weights(task: TaskConfig) -> np.ndarray:
    """Pressure-level weights [levels]: level / mean level (mean 1).

    Raises:
      TypeError: `task` is not a `TaskConfig`.
    """
    require_kind("task", task, TaskConfig)
    levels = np.asarray(task.pressure_levels, np.float64)
    return (levels / levels.mean()).astype(np.float32)


def variable_weight(name: str) -> float:
    """Per-variable weight of a variable name (a channel name without its `@level`)."""
    return VARIABLE_WEIGHTS.get(name.split("@")[0], 1.0)


def channel_weights(task: TaskConfig) -> np.ndarray:
    """Per-output-channel weights [O] in `task.target_channel_names` order.

    Surface channel: its variable weight. Atmospheric channel (v, p): variable weight x
    level weight / number of levels, so that summing channels is the official sum over
    variables of per-variable means over levels.

    Raises:
      TypeError: `task` is not a `TaskConfig`.
    """
    require_kind("task", task, TaskConfig)
    per_level = level_weights(task).astype(np.float64) / task.num_levels  # [levels]
    w = [variable_weight(v) for v in SURFACE_VARIABLES]
    for var in ATMOSPHERIC_VARIABLES:
        w += list(variable_weight(var) * per_level)
    return np.asarray(w, np.float32)  # [O]


def node_weights(grid_lat, n_lon: int) -> np.ndarray:
    """Per-grid-node weights [Ng] of a latitude-major grid (mean 1)."""
    return np.repeat(latitude_weights(grid_lat), n_lon)  # [Ng]


def loss_weights(task: TaskConfig, grid_lat, n_lon: int) -> tuple[np.ndarray, np.ndarray]:
    """`(node weights [Ng], channel weights [O])` for `weighted_mse`.

    Args:
      task: gives the channel layout and pressure levels.
      grid_lat: [n_lat] grid latitudes (degrees); grid nodes are latitude-major.
      n_lon: longitudes per latitude row.

    Raises:
      TypeError: `task` is not a `TaskConfig`.
    """
    channels = channel_weights(task)  # the first argument's refusal first
    return node_weights(grid_lat, n_lon), channels


def weighted_mse(prediction: jax.Array, target: jax.Array, weights: tuple) -> jax.Array:
    """GraphCast's weighted squared error, a float32 scalar.

    Mean over nodes (latitude-weighted) and batch, weighted sum over channels: the official
    per-variable mean over everything but the batch, summed over variables, then averaged
    over the batch. Computed in float32 whatever the input dtype.

    Args:
      prediction: [Ng, B, O] normalised prediction.
      target: [Ng, B, O] normalised target.
      weights: `(node weights [Ng], channel weights [O])` from `loss_weights`.
    """
    if jnp.ndim(prediction) != 3 or jnp.shape(target) != jnp.shape(prediction):
        raise ValueError(f"prediction {jnp.shape(prediction)} and target {jnp.shape(target)} "
                         "are invalid: both [Ng, B, O], of one shape")
    node_w, chan_w = weights
    n_nodes, _, n_channels = jnp.shape(prediction)
    if jnp.shape(node_w) != (n_nodes,) or jnp.shape(chan_w) != (n_channels,):
        raise ValueError(f"weights of shapes {jnp.shape(node_w)} and {jnp.shape(chan_w)} are "
                         f"invalid: node weights [{n_nodes}] and channel weights "
                         f"[{n_channels}] for a prediction of shape {jnp.shape(prediction)}")
    err = (prediction.astype(jnp.float32) - target.astype(jnp.float32)) ** 2  # [Ng, B, O]
    per_channel = jnp.mean(err * jnp.asarray(node_w, jnp.float32)[:, None, None],
                           axis=(0, 1))  # [O]
    return jnp.sum(per_channel * jnp.asarray(chan_w, jnp.float32))
