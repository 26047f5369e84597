"""Weather in the official GraphCast layout: datasets, normalisation statistics, examples.

The official demo's datasets are netCDF files with dims `batch`, `time`, `lat`, `lon`,
`level`: a `datetime` coordinate (`datetime64[ns]` on `(batch, time)`), `time` as lead
times (`timedelta64[ns]`), latitudes south to north, surface variables on `(batch, time,
lat, lon)`, atmospheric ones on `(batch, time, level, lat, lon)`, statics on `(lat, lon)`.
The normalisation statistics are three files in one folder: `mean_by_level.nc`,
`stddev_by_level.nc` and `diffs_stddev_by_level.nc` (the standard deviation of the 6-hour
change), one variable per weather variable, atmospheric ones on `level`.

This module turns such a dataset into gclab's `RawExample` (channel layout of
`gclab.training.data`), the statistics into gclab's `Normalization`, and back: synthetic
weather can be written in the official layout (`synthetic_dataset`), and statistics
computed from any dataset (`compute_stats`). Year and day progress are derived from
`datetime` exactly as the official input extraction does (when `year_progress` /
`day_progress` are absent); top-of-atmosphere solar radiation must be in the dataset.

`channel_permutations` gives the order of the official network's input and output
channels (variables sorted by name; time, then level, inside a variable; forcings of the
target frame last) in terms of gclab's, so that published weights run on gclab's layout.

Shapes: T frames, Ng grid nodes (latitude-major, south to north), B batch, O target
channels, C input channels.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Mapping, NamedTuple, Optional, Union

import numpy as np

from gclab.config import (
    ATMOSPHERIC_VARIABLES,
    FORCING_VARIABLES,
    STATIC_VARIABLES,
    SURFACE_VARIABLES,
    TaskConfig,
)
from gclab.training.data import (
    DAYS_PER_YEAR,
    EPOCH_HOURS,
    HOURS_PER_FRAME,
    Normalization,
    RawExample,
    SyntheticWeather,
)
from gclab.training.examples import input_variable_channels, residual_channels

PathLike = Union[str, os.PathLike]
STATS_FILES = {"mean": "mean_by_level.nc", "stddev": "stddev_by_level.nc",
               "diffs_stddev": "diffs_stddev_by_level.nc"}
SECONDS_PER_DAY = 86400
PROGRESS = ("year_progress", "day_progress")


class DataError(ValueError):
    """A dataset or statistics file gclab cannot use: one line naming the file and field."""


def _xarray():
    # xarray is part of the optional `data` extra: imported where it is used.
    import xarray
    return xarray


# ----------------------------------------------------------------------------------------
# Channel identities: (variable, frame, level); frame 0, 1 are inputs t-1, t, 2 is t+1.


def target_channels(task: TaskConfig) -> list:
    """[(variable, level or None)] of the O target channels, in gclab's order."""
    out = [(v, None) for v in SURFACE_VARIABLES]
    out += [(v, p) for v in ATMOSPHERIC_VARIABLES for p in task.pressure_levels]
    return out


def input_channels(task: TaskConfig) -> list:
    """[(variable, frame, level or None)] of the C input channels, in gclab's order."""
    targets = target_channels(task)
    v = [targets[i] for i in input_variable_channels(task)]
    out = [(name, frame, level) for frame in (0, 1) for name, level in v]
    out += [(f, frame, None) for frame in (0, 1, 2) for f in FORCING_VARIABLES]
    out += [(s, None, None) for s in STATIC_VARIABLES]
    return out


def channel_permutations(task: TaskConfig) -> tuple[np.ndarray, np.ndarray]:
    """(inputs [C], outputs [O]): official channel j is gclab channel `perm[j]`.

    The official network stacks the input variables sorted by name (each as its frames,
    then its levels), then the forcings of the target frame sorted by name; its outputs
    are the target variables sorted by name, each as its levels.
    """
    atmos = set(ATMOSPHERIC_VARIABLES)
    inputs = list(dict.fromkeys(name for name, frame, _ in input_channels(task)
                                if frame in (None, 0)))
    official = []
    for name in sorted(inputs):
        if name in STATIC_VARIABLES:
            official.append((name, None, None))
        elif name in atmos:
            official += [(name, f, p) for f in (0, 1) for p in task.pressure_levels]
        else:
            official += [(name, f, None) for f in (0, 1)]
    official += [(f, 2, None) for f in sorted(FORCING_VARIABLES)]
    gclab_in = {c: i for i, c in enumerate(input_channels(task))}
    official_out = [(v, p) for v in sorted(SURFACE_VARIABLES + ATMOSPHERIC_VARIABLES)
                    for p in (task.pressure_levels if v in atmos else (None,))]
    gclab_out = {c: i for i, c in enumerate(target_channels(task))}
    return (np.asarray([gclab_in[c] for c in official]),
            np.asarray([gclab_out[c] for c in official_out]))


def _permute(params: Mapping, task: TaskConfig, hidden_layers: int, inverse: bool) -> dict:
    perm_in, perm_out = channel_permutations(task)
    if not inverse:  # official -> gclab: gclab channel i is official channel inv[i]
        perm_in, perm_out = np.argsort(perm_in), np.argsort(perm_out)
    C = perm_in.size
    out = {m: dict(v) for m, v in params.items()}
    for module in ("grid2mesh_gnn/encoder_nodes_grid_nodes_mlp/~/linear_0",
                   "grid2mesh_gnn/encoder_nodes_mesh_nodes_mlp/~/linear_0"):
        w = np.asarray(out[module]["w"])  # [C + 3, L]: data channels, then structural
        out[module]["w"] = np.concatenate([w[:C][perm_in], w[C:]])
    last = f"mesh2grid_gnn/decoder_nodes_grid_nodes_mlp/~/linear_{hidden_layers}"
    out[last]["w"] = np.asarray(out[last]["w"])[:, perm_out]  # [L, O]
    out[last]["b"] = np.asarray(out[last]["b"])[perm_out]  # [O]
    return out


def params_to_gclab_channels(params: Mapping, task: TaskConfig, hidden_layers: int) -> dict:
    """Official-order weights (a checkpoint's) -> weights for gclab's channel layout.

    Only the grid and mesh embedders' first layer (rows) and the decoder's last layer
    (columns) change, by a permutation: no arithmetic, so nothing is rounded.
    """
    return _permute(params, task, hidden_layers, inverse=False)


def params_to_official_channels(params: Mapping, task: TaskConfig,
                                hidden_layers: int) -> dict:
    """The inverse of `params_to_gclab_channels` (for writing a checkpoint)."""
    return _permute(params, task, hidden_layers, inverse=True)


# ----------------------------------------------------------------------------------------
# Files.


def open_dataset(path: PathLike):
    """Opens a netCDF file or zarr folder lazily; `DataError` names what is wrong.

    A WeatherBench2-style store (`latitude`/`longitude`, north to south, datetimes in
    `time`) is turned into the official layout (`gclab.weather.era5`).
    """
    xarray = _xarray()
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    try:
        if path.is_dir():
            ds = xarray.open_zarr(path, chunks={})
        else:
            ds = xarray.open_dataset(path, engine="h5netcdf" if _is_hdf5(path) else None)
    except Exception as e:  # noqa: BLE001 - every backend raises its own error types
        first = str(e).split(". ")[0].splitlines()[0] if str(e) else ""
        raise DataError(f"{path}: not a readable netCDF or zarr dataset "
                        f"({type(e).__name__}: {first})") from None
    if "latitude" in ds.dims or "longitude" in ds.dims:  # WeatherBench2's names
        from gclab.weather.era5 import to_official_layout
        try:
            return to_official_layout(ds)
        except DataError as e:
            raise DataError(f"{path}: {e}") from None
    return ds


def _is_hdf5(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89HDF\r\n\x1a\n"


def write_dataset(ds, path: PathLike) -> None:
    """Writes a dataset as netCDF (HDF5, h5netcdf) atomically (temporary file, rename)."""
    from gclab.files import atomic_path
    with atomic_path(path) as tmp:
        ds.to_netcdf(tmp, engine="h5netcdf")


class Stats(NamedTuple):
    """The three official statistics datasets."""

    mean: object
    stddev: object
    diffs_stddev: object


def load_stats(folder: PathLike) -> Stats:
    """Reads `mean_by_level.nc`, `stddev_by_level.nc`, `diffs_stddev_by_level.nc`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a folder (the statistics folder holds "
                        f"{', '.join(STATS_FILES.values())})")
    return Stats(*(open_dataset(folder / name).load() for name in STATS_FILES.values()))


def write_stats(stats: Stats, folder: PathLike) -> None:
    """Writes the three statistics files into `folder` as one set: all three to temporary
    files first (`gclab.files.atomic_path`), renamed into place only once all are written,
    so that a failed write leaves the old set whole, not a mix of old and new files."""
    from gclab.files import atomic_path
    with contextlib.ExitStack() as files:
        for name, ds in zip(STATS_FILES.values(), stats):
            ds.to_netcdf(files.enter_context(atomic_path(Path(folder) / name)),
                         engine="h5netcdf")


# ----------------------------------------------------------------------------------------
# Derived forcings and statistics.


def add_derived_vars(ds):
    """Adds year/day progress and their sin/cos, as the official extraction does.

    Recomputed from `datetime` (seconds since 1970) and `lon` when `year_progress` /
    `day_progress` are absent; float32 like the official values.
    """
    xarray = _xarray()
    for coord in ("datetime", "lon"):
        if coord not in ds.coords:
            raise DataError(f"the dataset has no {coord!r} coordinate (needed for the "
                            f"year and day progress forcings)")
    seconds = ds.coords["datetime"].data.astype("datetime64[s]").astype(np.int64)
    dims = tuple(ds.coords["datetime"].dims)  # (batch, time) or (time,)
    new = {}
    if "year_progress" not in ds.data_vars:
        years = seconds / SECONDS_PER_DAY / np.float64(DAYS_PER_YEAR)
        progress = np.mod(years, 1.0).astype(np.float32)
        new.update(_featurize("year_progress", dims, progress))
    if "day_progress" not in ds.data_vars:
        lon = ds.coords["lon"].data
        day = np.mod(seconds, SECONDS_PER_DAY) / SECONDS_PER_DAY
        progress = np.mod(day[..., None] + np.deg2rad(lon) / (2 * np.pi), 1.0)
        new.update(_featurize("day_progress", dims + ds.coords["lon"].dims,
                              progress.astype(np.float32)))
    return ds.assign({k: xarray.Variable(d, v) for k, (d, v) in new.items()})


def _featurize(name, dims, progress):
    phase = progress * (2 * np.pi)
    return {name: (dims, progress), f"{name}_sin": (dims, np.sin(phase)),
            f"{name}_cos": (dims, np.cos(phase))}


def compute_stats(ds) -> Stats:
    """Mean, standard deviation and standard deviation of the 6-hour change by level.

    Every data variable is reduced over all its dims but `level` (plain means, each grid
    point counting once); the differences are taken along `time` (consecutive frames,
    assumed 6 hours apart) for variables that have it.
    """
    ds = add_derived_vars(ds) if "datetime" in ds.coords else ds
    ds = ds.drop_vars([c for c in ("datetime",) if c in ds.coords])

    def reduce(d, fn):
        return d.map(lambda v: fn(v, dim=[x for x in v.dims if x != "level"]))

    mean = reduce(ds, lambda v, dim: v.astype(np.float64).mean(dim))
    std = reduce(ds, lambda v, dim: v.astype(np.float64).std(dim))
    timed = ds[[k for k, v in ds.data_vars.items() if "time" in v.dims]]
    diffs = timed.astype(np.float64).diff("time")
    diffs_std = reduce(diffs, lambda v, dim: v.std(dim))
    return Stats(*(s.drop_vars([c for c in s.coords if c != "level"]).compute()
                   for s in (mean, std, diffs_std)))


def _value(stats_ds, name: str, level, what: str) -> float:
    if name not in stats_ds.data_vars:
        raise DataError(f"{what}: no variable {name!r} (it needs every input, target and "
                        f"forcing variable)")
    v = stats_ds[name]
    if level is not None:
        if "level" not in v.dims or level not in v.coords["level"].values:
            raise DataError(f"{what}: {name!r} has no level {level}")
        v = v.sel(level=level)
    if v.ndim:
        raise DataError(f"{what}: {name!r} must be a number per level, it has dims "
                        f"{v.dims}")
    return float(v.values)


def normalization_from_stats(stats: Stats, task: TaskConfig) -> Normalization:
    """gclab's `Normalization` from the three official statistics datasets."""
    names = list(STATS_FILES.values())
    mean_in = [_value(stats.mean, n, p, names[0]) for n, _, p in input_channels(task)]
    std_in = [_value(stats.stddev, n, p, names[1]) for n, _, p in input_channels(task)]
    mean_t = [_value(stats.mean, n, p, names[0]) for n, p in target_channels(task)]
    std_t = [_value(stats.stddev, n, p, names[1]) for n, p in target_channels(task)]
    diff_t = [_value(stats.diffs_stddev, n, p, names[2]) for n, p in target_channels(task)]
    f = np.asarray
    return Normalization(f(mean_in), f(std_in), f(mean_t), f(std_t), f(diff_t),
                         f(diff_t) / f(std_t), residual_channels(task))


# ----------------------------------------------------------------------------------------
# Examples.


def check_dataset(ds, task: TaskConfig, grid_lat: Optional[np.ndarray] = None,
                  grid_lon: Optional[np.ndarray] = None, what: str = "dataset"):
    """Selects the task's levels and adds derived forcings; names a missing part.

    Returns the dataset with `level` in `task.pressure_levels` order and the progress
    forcings added.
    """
    for dim in ("time", "lat", "lon"):
        if dim not in ds.dims:
            raise DataError(f"{what}: no {dim!r} dimension (dims are {sorted(ds.dims)}; "
                            f"the official layout has batch, time, lat, lon, level)")
    if "level" not in ds.coords:
        raise DataError(f"{what}: no 'level' coordinate")
    missing = sorted(set(task.pressure_levels) - set(ds.coords["level"].values.tolist()))
    if missing:
        raise DataError(f"{what}: level has no pressure levels {missing} (it has "
                        f"{ds.coords['level'].values.tolist()})")
    ds = ds.sel(level=list(task.pressure_levels))
    needed = set(SURFACE_VARIABLES + ATMOSPHERIC_VARIABLES + STATIC_VARIABLES) | {
        "toa_incident_solar_radiation"}
    absent = sorted(needed - set(ds.data_vars))
    if absent:
        raise DataError(f"{what}: missing variable {absent[0]!r} (needed: "
                        f"{', '.join(sorted(needed))})")
    for name in ATMOSPHERIC_VARIABLES:
        if "level" not in ds[name].dims:
            raise DataError(f"{what}: variable {name!r} has dims {ds[name].dims}, it needs "
                            f"'level'")
    if ds.sizes["lat"] > 1 and float(ds["lat"][0]) > float(ds["lat"][-1]):
        raise DataError(f"{what}: lat runs north to south; the official layout runs "
                        f"south to north (use `gclab.weather.era5` for WeatherBench2 zarr)")
    for name, grid in (("lat", grid_lat), ("lon", grid_lon)):
        if grid is not None and (ds.sizes[name] != len(grid) or not np.allclose(
                ds[name].values, grid, atol=1e-6)):
            raise DataError(f"{what}: {name} does not match the model's grid ({len(grid)} "
                            f"values from {grid[0]:g} to {grid[-1]:g})")
    return add_derived_vars(ds)


def _grid(var, frames: slice) -> np.ndarray:
    """A variable's frames as [T, Ng, B] or [T, Ng, B, levels] (float32, as stored)."""
    dims = [d for d in ("time", "lat", "lon", "batch", "level") if d in var.dims]
    if "batch" not in var.dims:
        var = var.expand_dims("batch")
        dims.insert(3, "batch")
    if "time" in var.dims:
        var = var.isel(time=frames)
    a = np.asarray(var.transpose(*dims).values, np.float32)
    if "time" not in dims:
        a = a[None]
    T, n_lat, n_lon = a.shape[:3]
    return a.reshape((T, n_lat * n_lon) + a.shape[3:])


def _targets(ds, task: TaskConfig, frames: slice) -> np.ndarray:
    """Target variables [T, Ng, B, O] in gclab order."""
    parts = [_grid(ds[v], frames)[..., None] for v in SURFACE_VARIABLES]
    parts += [_grid(ds[v], frames) for v in ATMOSPHERIC_VARIABLES]
    return np.concatenate(parts, -1)


def _forcings(ds, frames: slice, n_nodes: int, n_lon: int) -> np.ndarray:
    """Forcings [T, Ng, B, 5] in `FORCING_VARIABLES` order."""
    out = []
    for name in FORCING_VARIABLES:
        var = ds[name]
        if "lat" not in var.dims:  # year progress: (batch, time); day progress: no lat
            var = var.expand_dims(lat=ds.sizes["lat"])
        if "lon" not in var.dims:
            var = var.expand_dims(lon=n_lon)
        out.append(_grid(var, frames))
    return np.stack(out, -1)


def raw_example(ds, task: TaskConfig, start: int = 0, rollout: int = 1) -> RawExample:
    """The `RawExample` whose input frames are `start`, `start + 1` of a checked dataset.

    Targets are frames `start + 2 .. start + rollout + 1`; a forcing row past the end of
    the dataset (the last row, which no step uses) repeats the last frame's.
    """
    n = ds.sizes["time"]
    if start < 0 or start + rollout + 2 > n:
        raise DataError(f"the dataset has {n} time steps; inputs at {start}, {start + 1} "
                        f"and {rollout} target step(s) need {start + rollout + 2}")
    t = start + 1
    n_lon = ds.sizes["lon"]
    n_nodes = ds.sizes["lat"] * n_lon
    frames = _targets(ds, task, slice(t - 1, t + rollout + 1))  # [T + 2, Ng, B, O]
    stop = min(n, t + rollout + 2)
    forc = _forcings(ds, slice(t - 1, stop), n_nodes, n_lon)  # [<= T + 3, Ng, B, 5]
    if forc.shape[0] < rollout + 3:
        forc = np.concatenate([forc, forc[-1:]], 0)
    statics = np.concatenate([_grid(ds[s], slice(None)) [..., None]
                              for s in STATIC_VARIABLES], -1)[0]  # [Ng, 1, 2]
    B = frames.shape[2]
    statics = np.broadcast_to(statics, (n_nodes, B, statics.shape[-1]))
    forc = np.broadcast_to(forc, forc.shape[:2] + (B, forc.shape[-1]))
    v_idx = input_variable_channels(task)
    inputs = np.concatenate([frames[0][..., v_idx], frames[1][..., v_idx],
                             forc[0], forc[1], forc[2], statics], -1)  # [Ng, B, C]
    f32 = np.float32
    return RawExample(inputs.astype(f32), frames[1].astype(f32), frames[2:].astype(f32),
                      forc[3:3 + rollout].astype(f32))


# ----------------------------------------------------------------------------------------
# Synthetic weather in the official layout.


def synthetic_dataset(weather: SyntheticWeather, frames: int, start: int = 0,
                      batch_starts: tuple = (0,)):
    """Synthetic weather as an official-layout dataset (frames `start ..` per batch row).

    Batch row b holds frames `start + batch_starts[b] ..` (`frames` of them). Forcings
    written are the synthetic ones; the progress features are left out, so that reading
    back recomputes them from `datetime` as the official code does.
    """
    xarray = _xarray()
    task = weather.task
    lat, lon = weather.grid_lat, weather.grid_lon
    n_lat, n_lon = lat.size, lon.size
    B, T = len(batch_starts), frames
    data = np.stack([weather.frames(np.arange(start + s, start + s + T))
                     for s in batch_starts])  # [B, T, Ng, O]
    forc = np.stack([weather.forcings(np.arange(start + s, start + s + T))
                     for s in batch_starts])  # [B, T, Ng, 5]
    grid = (n_lat, n_lon)
    out = {}
    for i, name in enumerate(SURFACE_VARIABLES):
        out[name] = (("batch", "time", "lat", "lon"), data[..., i].reshape((B, T) + grid))
    L = task.num_levels
    for j, name in enumerate(ATMOSPHERIC_VARIABLES):
        col = len(SURFACE_VARIABLES) + j * L
        a = data[..., col:col + L].reshape((B, T) + grid + (L,))
        out[name] = (("batch", "time", "level", "lat", "lon"), a.transpose(0, 1, 4, 2, 3))
    out["toa_incident_solar_radiation"] = (("batch", "time", "lat", "lon"),
                                           forc[..., 0].reshape((B, T) + grid))
    for k, name in enumerate(STATIC_VARIABLES):
        out[name] = (("lat", "lon"), weather.statics[:, k].reshape(grid))
    hours = EPOCH_HOURS + HOURS_PER_FRAME * (
        start + np.asarray(batch_starts)[:, None] + np.arange(T)[None])  # [B, T]
    datetime = (np.datetime64("1970-01-01T00", "ns")
                + (hours * 3600).astype(np.int64) * np.timedelta64(1, "s"))
    coords = {"lat": ("lat", lat.astype(np.float32)), "lon": ("lon", lon.astype(np.float32)),
              "level": ("level", np.asarray(task.pressure_levels, np.int32)),
              "time": ("time", (np.arange(T) * int(HOURS_PER_FRAME)).astype(
                  "timedelta64[h]").astype("timedelta64[ns]")),
              "datetime": (("batch", "time"), datetime.astype("datetime64[ns]"))}
    return xarray.Dataset(out, coords=coords)


# ----------------------------------------------------------------------------------------
# Training examples from a dataset.


class DatasetWeather:
    """Training examples drawn from an official-layout dataset, one window at a time.

    The same interface as `gclab.training.data.SyntheticWeather` for `gclab.training.train`
    (`normalization()`, `make_batch(batch, rollout, start)`), so any memory recipe trains
    on real data unchanged. A window is (batch row, first input frame); windows are
    numbered batch row by batch row, and `make_batch` takes windows
    `(start - 1) // SAMPLE_SPACING + j` (modulo their count), which is how the training
    loop's `batch_start` numbers samples: consecutive steps take consecutive windows.
    Only the frames of the windows asked for are read (the dataset stays lazy).

    Args:
      ds: a dataset (lazy is best), checked with `check_dataset` against the grid.
      task: the channel layout.
      stats: the three statistics datasets.
      grid_lat, grid_lon: the model's grid (degrees).
    """

    def __init__(self, ds, task: TaskConfig, stats: Stats, grid_lat: np.ndarray,
                 grid_lon: np.ndarray) -> None:
        self.task = task
        self.ds = check_dataset(ds, task, grid_lat, grid_lon)
        self._norm = normalization_from_stats(stats, task)
        self.batch_rows = self.ds.sizes.get("batch", 1)

    def windows(self, rollout: int) -> int:
        """How many (batch row, first frame) windows a rollout of T steps has."""
        return self.batch_rows * max(0, self.ds.sizes["time"] - rollout - 1)

    def normalization(self) -> Normalization:
        return self._norm

    def raw_batch(self, batch: int, rollout: int = 1, start: int = 1) -> RawExample:
        from gclab.training.data import SAMPLE_SPACING
        per_row = self.ds.sizes["time"] - rollout - 1
        if per_row < 1:
            raise DataError(f"the dataset has {self.ds.sizes['time']} time steps; a rollout "
                            f"of {rollout} needs at least {rollout + 2}")
        first = (start - 1) // SAMPLE_SPACING
        parts = []
        for j in range(batch):
            w = (first + j) % self.windows(rollout)
            row, t = divmod(w, per_row)
            ds = self.ds.isel(batch=[row]) if "batch" in self.ds.dims else self.ds
            parts.append(raw_example(ds, self.task, t, rollout))
        return RawExample(*(np.concatenate(x, axis=-2) for x in zip(*parts)))

    def make_batch(self, batch: int, rollout: int = 1, start: int = 1):
        """A normalised `Example` of `batch` windows (see the class docstring)."""
        return self._norm.normalise(self.raw_batch(batch, rollout, start))
