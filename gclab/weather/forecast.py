"""Autoregressive forecasts from a checkpoint and an official-layout dataset.

`forecast` runs gclab's network with a checkpoint's weights on the first two frames of a
dataset, feeding each prediction back as the newest input frame, and returns the
prediction in the layout of the official rollout: one variable per target, sorted by name,
dims `(time, batch, lat, lon)` or `(time, batch, level, lat, lon)`, coordinates `lat`,
`lon`, `level` and `time` (lead times after the last input frame, `timedelta64[ns]`).

Each step works as the official predictor does: normalise the physical inputs with the
statistics, run the network, turn its output into a physical frame (last input frame plus
the output times the standard deviation of the 6-hour change, or mean plus output times
standard deviation for a target that is not an input), and build the next inputs from the
physical frames. The dataset must hold the forcings (top-of-atmosphere solar radiation) of
every target frame: two input frames and `steps` more.

Shapes: Ng grid nodes, B batch, C input channels, O target channels, T steps.
"""

from __future__ import annotations

from typing import Optional

import jax
import numpy as np

from gclab.config import ATMOSPHERIC_VARIABLES, NUM_FORCINGS, require_count, require_kind
from gclab.geometry import build_graphs
from gclab.memory import MemoryConfig
from gclab.model import graph_inputs, make_network
from gclab.training.examples import input_variable_channels, residual_channels
from gclab.weather.checkpoint import Checkpoint
from gclab.weather.dataset import (
    DATASET,
    FRAME_STEP,
    Stats,
    check_dataset,
    import_data_extra,
    normalization_from_stats,
    params_to_gclab_channels,
    raw_example,
    target_channels,
)


def rollout_physical(apply, raw, norm, task, steps: int) -> np.ndarray:
    """Physical predictions [T, Ng, B, O] of `steps` autoregressive steps.

    Args:
      apply: `inputs [Ng, B, C] (normalised) -> outputs [Ng, B, O]` (the network).
      raw: `RawExample` with at least `steps` forcing rows.
      norm: the `Normalization`.
      task: channel layout.
      steps: T.
    """
    v_idx = input_variable_channels(task)
    V = len(v_idx)
    is_residual = residual_channels(task)  # [O]
    inputs = raw.inputs  # [Ng, B, C] physical
    last = raw.last_frame  # [Ng, B, O]
    out = []
    for k in range(steps):
        y = np.asarray(apply(norm.normalise_inputs(inputs)), np.float64)  # [Ng, B, O]
        frame = np.where(is_residual, last + y * norm.residual_std,
                         norm.target_mean + y * norm.target_std).astype(np.float32)
        out.append(frame)
        forcings = inputs[..., 2 * V:2 * V + 3 * NUM_FORCINGS]  # [Ng, B, 15]
        inputs = np.concatenate([inputs[..., V:2 * V], frame[..., v_idx],
                                 forcings[..., NUM_FORCINGS:], raw.forcings[k],
                                 inputs[..., 2 * V + 3 * NUM_FORCINGS:]], -1)
        last = frame
    return np.stack(out)  # [T, Ng, B, O]


def forecast(ckpt: Checkpoint, ds, stats: Stats, steps: int,
             memory: Optional[MemoryConfig] = None):
    """The checkpoint's `steps`-step forecast from frames 0 and 1 of `ds` (xarray Dataset).

    The output's lead times are GraphCast's 6-hour steps (6 h, 12 h, ...), whatever the
    dataset's `time` coordinate holds (`check_dataset` refuses one that is not 6-hourly, or
    holds plain numbers; a dataset may have none).

    Args:
      ckpt: the checkpoint (`read_checkpoint`).
      ds: the dataset (`open_dataset`): two input frames and `steps` more for the forcings.
      stats: the statistics (`load_stats`).
      steps: how many 6-hour steps to forecast, >= 1.
      memory: the memory recipe of the network, or None for the default.

    Raises:
      TypeError: an argument of the wrong kind (a path for `ds`, say).
      ValueError: `steps` not an integer >= 1.
      gclab.weather.DataError: the dataset or statistics lack something, or a value the
        forecast uses (inputs, forcings, statics) is not finite (named).
    """
    xarray = import_data_extra("xarray")  # one line naming gclab[data] where it is missing

    # Every argument before any graph is built: a bad one fails in a moment, named.
    require_kind("ckpt", ckpt, Checkpoint, "a Checkpoint (read_checkpoint(path))")
    require_kind("ds", ds, xarray.Dataset, DATASET)
    require_kind("stats", stats, Stats, "a Stats (load_stats(folder))")
    steps = require_count("steps", steps, 1, "forecast")
    require_kind("memory", memory, MemoryConfig, optional=True)
    model, task = ckpt.model, ckpt.task
    graphs = build_graphs(model.resolution, model.mesh_splits,
                          model.radius_query_fraction_edge_length,
                          model.mesh2grid_edge_normalization_factor)
    ds = check_dataset(ds, task, graphs.grid_lat, graphs.grid_lon)
    # Only the target frames' forcings are used: their weather, not yet observed (NaN in
    # the official rollout's `targets_template`), is not read, nor held.
    raw = raw_example(ds, task, start=0, rollout=steps, read_targets=False)
    norm = normalization_from_stats(stats, task)
    params = params_to_gclab_channels(ckpt.params, task, model.hidden_layers)
    net = make_network(model, task.data_channels, task.output_channels, memory)
    graph = graph_inputs(graphs)
    apply = jax.jit(lambda x: net.apply(params, graph, x))
    frames = rollout_physical(apply, raw, norm, task, steps)  # [T, Ng, B, O]
    T, _, B, _ = frames.shape
    n_lat, n_lon = ds.sizes["lat"], ds.sizes["lon"]
    frames = frames.reshape(T, n_lat, n_lon, B, -1)
    names = target_channels(task)
    data = {}
    for name in sorted(dict.fromkeys(n for n, _ in names)):
        cols = [i for i, (n, _) in enumerate(names) if n == name]
        a = frames[..., cols]  # [T, lat, lon, B, levels]
        if name in ATMOSPHERIC_VARIABLES:
            data[name] = (("time", "batch", "level", "lat", "lon"), a.transpose(0, 3, 4, 1, 2))
        else:
            data[name] = (("time", "batch", "lat", "lon"), a[..., 0].transpose(0, 3, 1, 2))
    coords = {"lon": ds.coords["lon"], "lat": ds.coords["lat"],
              "level": ds.coords["level"],
              "time": ("time", (np.arange(1, T + 1) * FRAME_STEP).astype("timedelta64[ns]"))}
    return xarray.Dataset(data, coords=coords)
