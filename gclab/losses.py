"""GraphCast's training loss: weighted squared error on normalised residual targets.

Weights (GRAPHCAST.md, "Loss"): by latitude (cell area of a pole-inclusive grid, mean 1),
by pressure level (level / mean level) and by variable (2m temperature 1.0; 10m winds,
mean sea-level pressure and precipitation 0.1; the rest 1.0). The loss is the weighted mean
over everything but the batch, then the mean over the batch.

Shapes: Ng grid nodes, B batch, O output channels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from gclab.config import ATMOSPHERIC_VARIABLES, SURFACE_VARIABLES, TaskConfig

VARIABLE_WEIGHTS = {
    "2m_temperature": 1.0,
    "10m_u_component_of_wind": 0.1,
    "10m_v_component_of_wind": 0.1,
    "mean_sea_level_pressure": 0.1,
    "total_precipitation_6hr": 0.1,
}


def latitude_weights(grid_lat) -> np.ndarray:
    """Cell-area weights [n_lat] of a pole-inclusive grid, normalised to mean 1.

    An interior row at latitude phi spans phi +- d/2: area proportional to
    sin(phi + d/2) - sin(phi - d/2) = 2 cos(phi) sin(d/2). A pole row spans only the half
    cell towards the equator: 1 - sin(90 - d/2) = 1 - cos(d/2).
    """
    lat = np.asarray(grid_lat, np.float64)
    if lat.ndim != 1 or lat.size < 3:
        raise ValueError(f"grid_lat must be [n_lat] with n_lat >= 3, got shape {lat.shape}")
    d = np.deg2rad(lat[1] - lat[0])
    w = 2.0 * np.cos(np.deg2rad(lat)) * np.sin(d / 2)  # [n_lat]
    w[0] = w[-1] = 1.0 - np.cos(d / 2)
    return (w / w.mean()).astype(np.float32)


def channel_weights(task: TaskConfig) -> np.ndarray:
    """Per-output-channel weights [O]: variable weight x level weight."""
    levels = np.asarray(task.pressure_levels, np.float64)
    level_w = levels / levels.mean()
    w = [VARIABLE_WEIGHTS.get(v, 1.0) for v in SURFACE_VARIABLES]
    for var in ATMOSPHERIC_VARIABLES:
        w += list(VARIABLE_WEIGHTS.get(var, 1.0) * level_w)
    return np.asarray(w, np.float32)  # [O]


def loss_weights(task: TaskConfig, grid_lat, n_lon: int) -> tuple:
    """(node weights [Ng], channel weights [O]) for a latitude-major grid."""
    node = np.repeat(latitude_weights(grid_lat), n_lon)  # [Ng]
    return node, channel_weights(task)


def weighted_mse(prediction: jax.Array, target: jax.Array, weights: tuple) -> jax.Array:
    """Weighted squared error: mean over nodes and channels, then over the batch.

    Args:
      prediction, target: [Ng, B, O] (computed in float32 whatever their dtype).
      weights: (node weights [Ng], channel weights [O]).
    """
    node_w, chan_w = weights
    err = (prediction.astype(jnp.float32) - target.astype(jnp.float32)) ** 2  # [Ng, B, O]
    err = err * jnp.asarray(node_w)[:, None, None] * jnp.asarray(chan_w)[None, None, :]
    return jnp.mean(err)
