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
computed from any dataset that holds the variables a task reads (`compute_stats`). Year and
day progress are derived from `datetime` exactly as the official input extraction does
(each of them, and of their sin and cos, that the dataset lacks), lazily: a window's frames
are computed as they are read, so that a long dataset costs no whole-dataset arrays.
Top-of-atmosphere solar radiation must be in the dataset. Every dataset is read in the
official layout whatever its latitude order (it is sorted south to north) and, without a
`datetime` coordinate, with the datetimes of a `time` that holds them (as CDO writes files)
taken for `datetime` (`official_layout`).

`channel_permutations` gives the order of the official network's input and output
channels (variables sorted by name; time, then level, inside a variable; forcings of the
target frame last) in terms of gclab's, so that published weights run on gclab's layout.

Shapes: T frames, Ng grid nodes (latitude-major, south to north), B batch, O target
channels, C input channels.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import lzma
import os
import zlib
from pathlib import Path
from typing import Iterator, Mapping, NamedTuple, Optional, Union

import numpy as np

from gclab.config import (
    ATMOSPHERIC_VARIABLES,
    FORCING_VARIABLES,
    INPUT_FRAMES,
    STATIC_VARIABLES,
    STRUCTURAL_NODE_FEATURES,
    SURFACE_VARIABLES,
    TaskConfig,
    is_int,
    require_count,
    require_kind,
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
#: Time steps per chunk of the progress features `add_derived_vars` adds: they are lazy
#: (dask), and a window's frames compute only the chunks that hold them (a 0.25 deg day
#: progress chunk is 64 x 1440 float32, 0.4 MB), however long the dataset is.
PROGRESS_CHUNK = 64
#: The variables gclab reads from a dataset and from the mean and standard deviation files;
#: the 6-hour-change file is read for the targets only.
INPUT_VARIABLES = (SURFACE_VARIABLES + ATMOSPHERIC_VARIABLES + FORCING_VARIABLES
                   + STATIC_VARIABLES)
TARGET_VARIABLES = SURFACE_VARIABLES + ATMOSPHERIC_VARIABLES
# The variables of each statistics file that gclab reads, and so the ones whose values are
# checked where statistics are read (`load_stats`) and where they are computed
# (`compute_stats`).
_STATS_VARIABLES = {"mean": INPUT_VARIABLES, "stddev": INPUT_VARIABLES,
                    "diffs_stddev": TARGET_VARIABLES}
# What each statistic must be (`_check_stat`, `_check_computed_stat`).
_STATS_RULES = {"mean": "a mean must be finite",
                "stddev": "a standard deviation must be a finite number > 0",
                "diffs_stddev": "a standard deviation must be a finite number > 0"}
#: GraphCast's step between frames, which the time axis of a dataset must have.
FRAME_STEP = np.timedelta64(int(HOURS_PER_FRAME * 3600), "s")
# What a damaged chunk of a zarr store raises while it is decoded (zarr 3, numcodecs 0.16):
# the Blosc, Zstd and LZ4 decoders RuntimeError; zlib `zlib.error`; gzip `BadGzipFile` or,
# cut short, EOFError; LZMA `LZMAError`; a chunk that decodes to the wrong number of bytes
# (uncompressed, or a codec that does not check) ValueError from zarr's reshape. Only the
# read is guarded by these, so no other error is renamed; an unreadable file (OSError) keeps
# the command line's report of the file.
CHUNK_ERRORS = (RuntimeError, ValueError, EOFError, zlib.error, gzip.BadGzipFile,
                lzma.LZMAError)


class DataError(ValueError):
    """A dataset or statistics file gclab cannot use: one line naming the file and field."""


def _source(ds) -> str:
    """The file or store a dataset was opened from (`open_dataset`), for messages; "dataset"
    for one made in memory. xarray keeps `encoding` through selections and assignments."""
    return str(ds.encoding.get("source", "dataset"))


@contextlib.contextmanager
def _reading(where: str, name) -> Iterator[None]:
    """Turns a damaged chunk met while reading variable `name` into a `DataError`."""
    try:
        yield
    except DataError:
        raise
    except CHUNK_ERRORS as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise DataError(f"{where}: variable {name!r} could not be read, a chunk of it is "
                        f"damaged ({type(e).__name__}: {first})") from None


#: How to install what reading and writing weather files needs (the optional `data` extra).
DATA_EXTRA = "pip install 'gclab[data]'"


def import_data_extra(module: str):
    """`module` (of the optional `data` extra: xarray, h5netcdf, zarr, dask), imported where
    it is used; one not installed is a `DataError` naming it and the install command.

    Public so that `gclab.weather.era5` imports them the same way: a missing one is the
    same line wherever it is first needed."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = (e.name or module).split(".")[0]
        raise DataError(f"{missing} is not installed: reading and writing weather files "
                        f"needs the data extra ({DATA_EXTRA})") from None


def _xarray():
    return import_data_extra("xarray")


#: What a dataset argument must be, in the words of a wrong-kind message.
DATASET = "an xarray.Dataset (open_dataset(path))"
PATH_KINDS = (str, os.PathLike)


def _require_dataset(name: str, ds) -> None:
    """Refuses a dataset argument of another kind (a path, say) with a `WrongType` naming
    `name`, before an attribute of it is looked up."""
    require_kind(name, ds, _xarray().Dataset, DATASET)


def _require_stats(stats) -> None:
    """Refuses statistics that are no `Stats` of three datasets (a folder's path, say)."""
    require_kind("stats", stats, Stats, "a Stats (load_stats(folder))")
    for kind, ds in zip(STATS_FILES, stats):
        require_kind(f"stats.{kind}", ds, _xarray().Dataset,
                     "an xarray.Dataset (load_stats(folder))")


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


# The layers the channel permutation changes: the grid and mesh node embedders' first layer
# (rows: data channels, then structural features), the grid decoder's last (columns).
EMBEDDERS = ("grid2mesh_gnn/encoder_nodes_grid_nodes_mlp/~/linear_0",
             "grid2mesh_gnn/encoder_nodes_mesh_nodes_mlp/~/linear_0")
DECODER = "mesh2grid_gnn/decoder_nodes_grid_nodes_mlp/~/linear_"


def _task_words(levels: int, precipitation_input: bool, c: int, o: int) -> str:
    """'13 pressure level(s), with precipitation input (183 input and 83 output channels)'."""
    return (f"{levels} pressure level(s), {'with' if precipitation_input else 'without'} "
            f"precipitation input ({c} input and {o} output channels)")


def _params_task(c: int, o: int) -> str:
    """The task that weights of `c` data input and `o` output channels were made for."""
    levels, left = divmod(o - len(SURFACE_VARIABLES), len(ATMOSPHERIC_VARIABLES))
    forcings = (INPUT_FRAMES + 1) * len(FORCING_VARIABLES)  # both inputs' and the target's
    per_frame = (c - forcings - len(STATIC_VARIABLES)) / INPUT_FRAMES
    if levels >= 1 and not left and per_frame in (o, o - 1):
        return "a task of " + _task_words(levels, per_frame == o, c, o)
    return f"{c} input and {o} output channels, which no task has"


def _check_channel_params(params, task, hidden_layers) -> None:
    """Refuses arguments of `params_to_gclab_channels` / `params_to_official_channels`
    that do not fit together, before anything is indexed: else an IndexError or KeyError
    from inside the permutation names no argument, and a permutation shorter than the
    weights (a task without precipitation input) or a hidden decoder layer taken for the
    last would be permuted without a word.

    Only the layers the permutation touches are checked: the grid and mesh embedders'
    first layer (rows: data channels + 3 structural features), the grid decoder's last
    (columns: output channels) and its layer count. The rest of the tree is the model's
    business (`gclab.weather.checkpoint.check_params` checks a whole checkpoint against a
    `ModelConfig`, which these functions are not given).

    Raises:
      TypeError: `params` not a mapping, `task` not a `TaskConfig`.
      ValueError: `hidden_layers` not an integer >= 1 or not the params' count, `params`
        lacking a layer, or `task` with other channels than `params`.
    """
    require_kind("task", task, TaskConfig)
    if not is_int(hidden_layers) or hidden_layers < 1:
        raise ValueError(f"hidden_layers={hidden_layers!r} is invalid: an integer >= 1 "
                         f"(1 in every published model)")
    require_kind("params", params, Mapping, "a {module: {name: array}} mapping")
    layers = sorted(int(m[len(DECODER):]) for m in params
                    if isinstance(m, str) and m.startswith(DECODER)
                    and m[len(DECODER):].isdigit())
    last = f"{DECODER}{hidden_layers}"
    for module in EMBEDDERS + (last,):
        if module == last and layers and layers[-1] != hidden_layers:
            raise ValueError(
                f"hidden_layers={hidden_layers} is invalid for params: their grid decoder "
                f"({DECODER[:-len('/~/linear_')]}) has {layers[-1]} hidden layer(s), "
                f"linear_0..linear_{layers[-1]}")
        leaves = params.get(module)
        names = ("w", "b") if module == last else ("w",)
        if not isinstance(leaves, Mapping) or not all(n in leaves for n in names):
            raise ValueError(f"params is invalid: no {'/'.join(names)} of module "
                             f"{module!r} (not a GraphCast parameter tree)")
    c_in, o = task.data_channels, task.output_channels
    shapes = [tuple(np.shape(params[m]["w"])) for m in EMBEDDERS]
    w, b = tuple(np.shape(params[last]["w"])), tuple(np.shape(params[last]["b"]))
    for module, shape in zip(EMBEDDERS, shapes):
        if len(shape) != 2 or shape[0] <= STRUCTURAL_NODE_FEATURES:
            raise ValueError(f"params is invalid: {module}/w has shape {shape}, not "
                             f"[data channels + {STRUCTURAL_NODE_FEATURES}, latent]")
    if len(w) != 2 or len(b) != 1 or w[1] != b[0]:
        raise ValueError(f"params is invalid: {last} has w of shape {w} and b of shape "
                         f"{b}, not [latent, outputs] and [outputs]")
    c_params = shapes[0][0] - STRUCTURAL_NODE_FEATURES
    if shapes[1][0] != shapes[0][0]:
        raise ValueError(f"params is invalid: {EMBEDDERS[1]}/w has {shapes[1][0]} rows and "
                         f"{EMBEDDERS[0]}/w {shapes[0][0]}; both are data channels + "
                         f"{STRUCTURAL_NODE_FEATURES}")
    if (c_params, w[1]) != (c_in, o):
        raise ValueError(
            f"task is invalid for params: the task has "
            f"{_task_words(task.num_levels, task.precipitation_input, c_in, o)}, the params "
            f"are for {_params_task(c_params, w[1])}")


def _permute(params: Mapping, task: TaskConfig, hidden_layers: int, inverse: bool) -> dict:
    _check_channel_params(params, task, hidden_layers)
    perm_in, perm_out = channel_permutations(task)
    if not inverse:  # official -> gclab: gclab channel i is official channel inv[i]
        perm_in, perm_out = np.argsort(perm_in), np.argsort(perm_out)
    C = perm_in.size
    out = {m: dict(v) for m, v in params.items()}
    for module in EMBEDDERS:
        w = np.asarray(out[module]["w"])  # [C + 3, L]: data channels, then structural
        out[module]["w"] = np.concatenate([w[:C][perm_in], w[C:]])
    last = f"{DECODER}{hidden_layers}"
    out[last]["w"] = np.asarray(out[last]["w"])[:, perm_out]  # [L, O]
    out[last]["b"] = np.asarray(out[last]["b"])[perm_out]  # [O]
    return out


def params_to_gclab_channels(params: Mapping, task: TaskConfig, hidden_layers: int) -> dict:
    """Official-order weights (a checkpoint's) -> weights for gclab's channel layout.

    Only the grid and mesh embedders' first layer (rows) and the decoder's last layer
    (columns) change, by a permutation: no arithmetic, so nothing is rounded.

    Raises:
      TypeError, ValueError: arguments that do not fit together (`_check_channel_params`):
        the message names `params`, `task` or `hidden_layers` and what differs.
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
    `time`) is turned into the official layout (`gclab.weather.era5`); any other dataset
    is read with lat south to north and its `datetime` (`official_layout`).

    Raises:
      TypeError: `path` not a str or `os.PathLike`.
      DataError: no such file or folder, or not a readable dataset; or a module of the
        `data` extra that reading it needs not installed (`DATA_EXTRA`).
    """
    require_kind("path", path, PATH_KINDS, "a str or os.PathLike (a netCDF file or zarr "
                 "folder)")
    xarray = _xarray()
    import_data_extra("dask")  # every read is lazy (`add_derived_vars`, `compute_stats`)
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    # Lead times stored as numbers with a unit (`time` in hours, as the official demo
    # datasets hold it) are decoded to timedelta64: recent xarray leaves them numbers
    # unless asked.
    try:
        if path.is_dir():
            import_data_extra("zarr")
            ds = xarray.open_zarr(path, chunks={}, decode_timedelta=True)
        else:
            hdf5 = _is_hdf5(path)
            if hdf5:
                import_data_extra("h5netcdf")
            ds = xarray.open_dataset(path, engine="h5netcdf" if hdf5 else None,
                                     decode_timedelta=True)
    except DataError:  # a module of the data extra not installed
        raise
    except Exception as e:  # noqa: BLE001 - every backend raises its own error types
        first = str(e).split(". ")[0].splitlines()[0] if str(e) else ""
        raise DataError(f"{path}: not a readable netCDF or zarr dataset "
                        f"({type(e).__name__}: {first})") from None
    if "latitude" in ds.dims or "longitude" in ds.dims:  # WeatherBench2's names
        from gclab.weather.era5 import to_official_layout
        try:
            ds = to_official_layout(ds)
        except DataError as e:
            raise DataError(f"{path}: {e}") from None
    ds = official_layout(ds)
    ds.encoding["source"] = str(path)  # as the user gave it: messages name it (`_source`)
    return ds


def official_layout(ds):
    """`ds` with lat south to north and, where it has no `datetime` coordinate but a `time`
    that holds datetimes (as CDO writes files), `time` as lead times from its first and
    its datetimes as `datetime` (on `time`, for every batch row), as the official layout
    has them. Nothing is read but the coordinates: a lazy dataset stays lazy.

    Every command reads a dataset through this (`open_dataset`, `check_dataset`,
    `compute_stats`), so that statistics, forecasts and training read one file the same.
    """
    ds = lat_south_to_north(ds)
    time = ds.coords.get("time")
    if ("datetime" not in ds.coords and time is not None and time.dims == ("time",)
            and time.dtype.kind == "M"):
        dt = time.values.astype("datetime64[ns]")  # [T]
        ds = ds.assign_coords(time=("time", dt - dt[0]), datetime=("time", dt))
    return ds


def lat_south_to_north(ds):
    """`ds` with `lat` sorted south to north, as the official layout has it. The one place
    this rule lives: `official_layout` and `gclab.weather.era5.to_official_layout` both
    call it. A dataset already in that order, or without a `lat` coordinate, is returned as
    it is (a sort would reindex every variable for nothing); only `lat` is read."""
    if "lat" in ds.dims and "lat" in ds.coords and ds.sizes["lat"] > 1 and bool(
            np.any(np.diff(np.asarray(ds["lat"].values, np.float64)) < 0)):
        ds = ds.sortby("lat")
    return ds


def dataset_levels(ds, where: str) -> Optional[list]:
    """The dataset's pressure levels (a list, in its order), None where it has no `level`
    coordinate.

    Raises:
      DataError: a `level` that is no dimension (a scalar one, as `ds.sel(level=500)`
        leaves): the atmospheric variables then have no level to select or read; or a
        level repeated (selecting it would fail inside pandas, and statistics of it would
        hold it twice).
    """
    if "level" not in ds.coords:
        return None
    level = ds.coords["level"]
    values = np.atleast_1d(level.values).tolist()
    if level.dims != ("level",):
        held = (f"a scalar coordinate ({values[0]})" if level.ndim == 0 else
                f"a coordinate on {level.dims}, not a dimension")
        raise DataError(f"{where}: level is {held}: atmospheric variables need a level "
                        f"dimension")
    seen = set()
    for value in values:
        if value in seen:
            raise DataError(f"{where}: level repeats {value}; each pressure level may be "
                            f"there once")
        seen.add(value)
    return values


def _is_hdf5(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89HDF\r\n\x1a\n"


def write_dataset(ds, path: PathLike) -> None:
    """Writes a dataset as netCDF (HDF5, h5netcdf) atomically (temporary file, rename).

    Raises:
      TypeError: `ds` not an xarray Dataset, `path` not a str or `os.PathLike`.
      DataError: xarray or h5netcdf (the `data` extra) not installed.
    """
    from gclab.files import atomic_path
    _require_dataset("ds", ds)
    require_kind("path", path, PATH_KINDS, "a str or os.PathLike (a netCDF file)")
    import_data_extra("h5netcdf")
    with atomic_path(path) as tmp:
        ds.to_netcdf(tmp, engine="h5netcdf")


class Stats(NamedTuple):
    """The three official statistics datasets."""

    mean: object
    stddev: object
    diffs_stddev: object


def load_stats(folder: PathLike) -> Stats:
    """Reads `mean_by_level.nc`, `stddev_by_level.nc`, `diffs_stddev_by_level.nc`.

    Raises:
      TypeError: `folder` not a str or `os.PathLike`.
      DataError: a file is missing or unreadable, or a value gclab would use is not a finite
        mean or a finite standard deviation > 0 (the message names the file and variable).
    """
    require_kind("folder", folder, PATH_KINDS, "a str or os.PathLike (the statistics "
                 "folder)")
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a folder (the statistics folder holds "
                        f"{', '.join(STATS_FILES.values())})")
    stats = Stats(*(open_dataset(folder / name).load() for name in STATS_FILES.values()))
    for kind, ds in zip(STATS_FILES, stats):
        # An absent variable is named with the task (`normalization_from_stats`).
        for name in _STATS_VARIABLES[kind]:
            if name in ds.data_vars:
                _check_stat(ds[name], kind, f"{folder / STATS_FILES[kind]}: {name!r}")
    return stats


def _check_stat(v, kind: str, what: str) -> None:
    """Refuses a statistic that would make normalised values infinite or NaN: a mean that is
    not finite, a standard deviation that is not finite and > 0. `what` names file and
    variable."""
    if v.dtype.kind not in "iuf":
        raise DataError(f"{what} must hold numbers, it holds {v.dtype}")
    bad = _bad_stat(v, kind)
    if bad is not None:
        at, value = bad
        raise DataError(f"{what}{at} is {value:g} ({_STATS_RULES[kind]})")


def _bad_stat(v, kind: str) -> Optional[tuple]:
    """The rule `_STATS_RULES[kind]` on the numbers of statistic `v`: (where, value) of its
    first value that breaks it (where: " at level 500", "" for a 0-d one), None if none
    does. The one place the rule lives: the statistics read (`_check_stat`) and those
    computed (`compute_stats`) are held to it alike, so that gclab never writes statistics
    it would refuse to read."""
    values = np.asarray(v.values, np.float64)
    bad = ~np.isfinite(values) if kind == "mean" else ~(np.isfinite(values) & (values > 0))
    if not bad.any():
        return None
    i = np.unravel_index(np.argmax(bad), values.shape)
    at = "".join(f" at {d} {v.coords[d].values[j]}" if d in v.coords else f" at {d} {j}"
                 for d, j in zip(v.dims, i))
    return at, float(values[i])


def write_stats(stats: Stats, folder: PathLike) -> None:
    """Writes the three statistics files into `folder` as one set: all three to temporary
    files first (`gclab.files.atomic_path`), renamed into place only once all are written,
    so that a failed write leaves the old set whole, not a mix of old and new files.

    Raises:
      TypeError: `stats` not a `Stats` of three datasets, `folder` not a str or
        `os.PathLike`.
      DataError: xarray or h5netcdf (the `data` extra) not installed.
    """
    from gclab.files import atomic_path
    _require_stats(stats)
    require_kind("folder", folder, PATH_KINDS, "a str or os.PathLike (the statistics "
                 "folder)")
    import_data_extra("h5netcdf")
    with contextlib.ExitStack() as files:
        for name, ds in zip(STATS_FILES.values(), stats):
            ds.to_netcdf(files.enter_context(atomic_path(Path(folder) / name)),
                         engine="h5netcdf")


# ----------------------------------------------------------------------------------------
# Derived forcings and statistics.


def add_derived_vars(ds):
    """Adds year/day progress and their sin/cos, as the official extraction does.

    The network reads `NAME_sin` and `NAME_cos` (NAME: `year_progress`, `day_progress`):
    where the dataset lacks either, both and `NAME` are added where missing, float32 like
    the official values: from the dataset's `NAME` where it has one, else from `NAME`
    recomputed from `datetime` (seconds since 1970) and `lon`. Features the dataset holds
    are kept; a dataset holding the four sin/cos features needs no `datetime`.

    The features added are lazy (dask arrays of `PROGRESS_CHUNK` time steps a chunk): the
    frames an example reads are computed as they are read, so that a long dataset costs
    no whole-dataset arrays in memory (`compute_stats` reduces them a chunk at a time).

    Raises:
      TypeError: `ds` not an xarray Dataset.
      DataError: a feature to recompute and no `datetime` or `lon` coordinate, or a
        `datetime` that holds no datetimes or is not on `time` (the message names the file
        and the feature or coordinate).
    """
    _require_dataset("ds", ds)
    xarray = _xarray()
    where = _source(ds)
    new = {}
    for name in PROGRESS:
        lacking = [k for k in (f"{name}_sin", f"{name}_cos") if k not in ds.data_vars]
        if not lacking:  # what the network reads is there (NAME itself it never reads)
            continue
        lacking += [name] if name not in ds.data_vars else []
        if name in ds.data_vars:  # the dataset's progress: its sin/cos, lazily
            progress = ds[name]
            if progress.chunks is None:  # not dask: np.sin would read all of it now
                progress = progress.chunk({d: PROGRESS_CHUNK if d == "time" else -1
                                           for d in progress.dims})
            progress = progress.astype(np.float32)
            phase = progress * (2 * np.pi)
            got = {name: progress, f"{name}_sin": np.sin(phase),
                   f"{name}_cos": np.cos(phase)}
        else:
            got = {k: xarray.Variable(d, v)
                   for k, (d, v) in _progress_from_datetime(ds, name, where).items()}
        new.update({k: got[k] for k in lacking})
    return ds.assign(new) if new else ds


def _progress_from_datetime(ds, name: str, where: str) -> dict:
    """{feature: (dims, float32 values)} of progress `name` and its sin/cos, from
    `datetime` (and, for the day's, `lon`), as the official extraction computes them.

    The values are dask arrays of `PROGRESS_CHUNK` time steps a chunk, computed where they
    are read (the same numbers as numpy's, element by element); only the coordinates are
    read now."""
    dask_array = import_data_extra("dask.array")

    for coord in ("datetime",) + (("lon",) if name == "day_progress" else ()):
        if coord not in ds.coords:
            raise DataError(f"{where}: the dataset has no {coord!r} coordinate (needed to "
                            f"compute the {name}_sin and {name}_cos forcings, which it lacks)")
    _check_time_kind(ds.coords["datetime"], "datetime", where)
    _check_datetime_dims(ds.coords["datetime"], where)
    seconds = np.asarray(ds.coords["datetime"].values).astype("datetime64[s]").astype(
        np.int64)  # [B, T] or [T]: 8 bytes a time step, as the coordinate itself
    dims = tuple(ds.coords["datetime"].dims)  # (batch, time) or (time,)
    seconds = dask_array.from_array(
        seconds, chunks=tuple(PROGRESS_CHUNK if d == "time" else -1 for d in dims))
    if name == "year_progress":
        years = seconds / SECONDS_PER_DAY / np.float64(DAYS_PER_YEAR)
        return _featurize(name, dims, np.mod(years, 1.0).astype(np.float32))
    lon = np.asarray(ds.coords["lon"].values)
    day = np.mod(seconds, SECONDS_PER_DAY) / SECONDS_PER_DAY
    progress = np.mod(day[..., None] + np.deg2rad(lon) / (2 * np.pi), 1.0)
    return _featurize(name, dims + ds.coords["lon"].dims, progress.astype(np.float32))


def _featurize(name, dims, progress):
    phase = progress * (2 * np.pi)
    return {name: (dims, progress), f"{name}_sin": (dims, np.sin(phase)),
            f"{name}_cos": (dims, np.cos(phase))}


def compute_stats(ds) -> Stats:
    """Mean, standard deviation and standard deviation of the 6-hour change by level.

    Every data variable is reduced over all its dims but `level` (plain means, each grid
    point counting once); the differences are taken along `time` (consecutive frames, which
    `check_times` makes sure are 6 hours apart) for variables that have it. A lazy dataset
    is read one variable at a time, its three statistics in one pass. The dataset is read
    as `check_dataset` reads it (`official_layout`), with the progress features it lacks
    added (`add_derived_vars`).

    Raises:
      TypeError: `ds` not an xarray Dataset.
      DataError: fewer than 2 time steps (the 6-hour change needs two), a lat, lon or
        level with no values, a time axis that is not 6-hourly, no `level` or one that is
        no dimension or repeats a level (`dataset_levels`), a variable a task reads
        missing or with dims its kind does not allow (`_check_variables`), progress
        features to compute and no `datetime` (nor a `time` of datetimes), a damaged chunk,
        a variable gclab uses holding a value that is not finite (other variables skip
        NaN, as xarray does), or a statistic gclab reads that `load_stats` would refuse: a
        variable that never varies (standard deviation 0) or, for a target, never changes
        between time steps; the message names the file, the variable and, for a value,
        the first time step or, for a statistic, the level. Nothing is returned, so
        nothing is written, for a dataset whose statistics gclab could not use.
    """
    _require_dataset("ds", ds)
    xarray = _xarray()
    where = _source(ds)
    n = ds.sizes.get("time", 0)
    if n < 2:
        has = (f"{n} time step{'' if n == 1 else 's'}" if "time" in ds.dims
               else "no 'time' dimension")
        raise DataError(f"{where}: the dataset has {has}; the standard deviation of the "
                        f"6-hour change ({STATS_FILES['diffs_stddev']}) needs at least 2 "
                        f"time steps")
    ds = official_layout(ds)
    for dim in ("lat", "lon", "level"):  # an empty time is refused above
        if ds.sizes.get(dim) == 0:  # else NaN statistics, or none by level
            raise DataError(f"{where}: {dim} has no values")
    check_times(ds, where)
    # Else 0-d statistics, or none of a variable: written, no task could read them.
    if dataset_levels(ds, where) is None:
        raise DataError(f"{where}: no 'level' coordinate (the atmospheric variables' "
                        f"statistics are by level)")
    _check_variables(ds, where)
    ds = add_derived_vars(ds)
    out: tuple = ({}, {}, {})  # mean, stddev, diffs_stddev: {variable: statistic}
    for name, v in ds.data_vars.items():
        if v.dtype.kind not in "biuf" and name not in INPUT_VARIABLES:
            continue  # not weather (labels, times): no statistics, as no channel reads it
        _check_numbers(v, where)
        dims = [x for x in v.dims if x != "level"]
        # gclab's variables propagate a NaN (found below); others skip it, as before.
        skipna = False if name in INPUT_VARIABLES else None
        # In C order: sums of the same values in the same order, however they were stored
        # (a north-to-south file is sorted by a view), so one field gives one statistic.
        v64 = v.astype(np.float64, order="C")
        parts = {"mean": v64.mean(dims, skipna=skipna), "std": v64.std(dims, skipna=skipna)}
        if "time" in v.dims:
            parts["diffs"] = v64.diff("time").std(dims, skipna=skipna)
        parts = {k: x.drop_vars([c for c in x.coords if c != "level"])
                 for k, x in parts.items()}
        with _reading(where, name):
            got = xarray.Dataset(parts).compute()  # one read of the variable for all three
        if skipna is False and not all(np.isfinite(x.values).all()
                                       for x in got.data_vars.values()):
            raise DataError(_first_not_finite(ds, name, where))
        for stats, key, kind in zip(out, ("mean", "std", "diffs"), STATS_FILES):
            if key in got:
                if name in _STATS_VARIABLES[kind]:  # as `load_stats` will read it
                    _check_computed_stat(got[key], kind, name, where)
                stats[name] = got[key]
    return Stats(*(xarray.Dataset(s) for s in out))


def _check_computed_stat(v, kind: str, name: str, where: str) -> None:
    """Refuses statistic `kind` of variable `name` computed from dataset `where` if it
    breaks the rule the statistics reader holds it to (`_bad_stat`): written, it would
    replace a usable statistics folder with one every `train` and `forecast` refuses.
    Values that are not finite are refused before (`_first_not_finite`, which names the
    time step), so what is left is a standard deviation of 0, said as the data's own
    fault: a variable that never varies, or never changes from one frame to the next."""
    bad = _bad_stat(v, kind)
    if bad is None:
        return
    at, value = bad
    if value == 0 and kind == "stddev":
        why = "never varies in this data: its standard deviation is 0"
    elif value == 0 and kind == "diffs_stddev":
        why = (f"never changes from one time step to the next in this data: the standard "
               f"deviation of its 6-hour change ({STATS_FILES[kind]}) is 0")
    else:
        why = f"would be {value:g} in {STATS_FILES[kind]}"
    raise DataError(f"{where}: {name!r}{at} {why}, and {_STATS_RULES[kind]}")


def _check_numbers(var, where: str) -> None:
    """Refuses a variable of strings, dates or objects before it is read as numbers (the
    conversion would fail inside the read, where it would pass for a damaged chunk)."""
    if var.dtype.kind not in "biuf":
        raise DataError(f"{where}: variable {var.name!r} must hold numbers, it holds "
                        f"{var.dtype}")


def _first_not_finite(ds, name: str, where: str) -> str:
    """The message for variable `name` of a dataset whose statistics are not finite: its
    first time step with a value that is not finite (a second read, on this error only)."""
    v = ds[name]
    keep = [d for d in ("time", "batch") if d in v.dims]
    with _reading(where, name):
        bad = ~np.isfinite(v)
        others = [d for d in v.dims if d not in keep]
        bad = (bad.any(others) if others else bad).transpose(*keep).values  # [T, B]
        hits = np.argwhere(bad)
        if not len(hits):  # finite values whose sums overflow float64
            return (f"{where}: variable {name!r} holds finite values whose mean or standard "
                    f"deviation is not finite (they overflow float64)")
        i = dict(zip(keep, (int(j) for j in hits[0])))
        values = np.asarray(v.isel(i).values)
    value = values[~np.isfinite(values)][0]
    if "time" not in i:
        return _non_finite(where, name, value)
    row = i["batch"] if v.sizes.get("batch", 1) > 1 else None
    return _non_finite(where, name, value, i["time"],
                       _datetime(ds.coords, i["time"], i.get("batch", 0)), row)


def _value(stats_ds, name: str, level, what: str, kind: str) -> float:
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
    _check_stat(v, kind, f"{what}: {name!r}" + ("" if level is None else f" at level {level}"))
    return float(v.values)


def normalization_from_stats(stats: Stats, task: TaskConfig) -> Normalization:
    """gclab's `Normalization` from the three official statistics datasets.

    Raises:
      TypeError: `stats` not a `Stats` of three datasets, `task` not a `TaskConfig`.
      DataError: a statistic the task needs is missing, or not a finite mean or a finite
        standard deviation > 0 (the message names the file, variable and level).
    """
    _require_stats(stats)
    require_kind("task", task, TaskConfig)

    def values(kind: str, channels) -> list:
        ds = getattr(stats, kind)
        return [_value(ds, n, p, STATS_FILES[kind], kind) for n, p in channels]

    inputs = [(n, p) for n, _, p in input_channels(task)]
    targets = target_channels(task)
    mean_in, std_in = values("mean", inputs), values("stddev", inputs)
    mean_t, std_t = values("mean", targets), values("stddev", targets)
    diff_t = values("diffs_stddev", targets)
    f = np.asarray
    return Normalization(f(mean_in), f(std_in), f(mean_t), f(std_t), f(diff_t),
                         f(diff_t) / f(std_t), residual_channels(task))


# ----------------------------------------------------------------------------------------
# Examples.


def _check_time_kind(coord, name: str, where: str) -> None:
    """Refuses a `datetime` coordinate that holds no datetimes, or a `time` coordinate that
    holds neither lead times nor datetimes: numbers have no unit to step by (6 of them may
    be hours or nanoseconds), and the progress forcings need dates."""
    if name == "datetime":
        kinds, allowed = "M", ("datetimes (datetime64; in netCDF, units such as 'hours since "
                               "1970-01-01' in the standard calendar)")
    else:
        kinds, allowed = "mM", ("lead times (timedelta64; in netCDF, units such as 'hours') "
                                "or datetimes (datetime64)")
    if coord.dtype.kind not in kinds:
        raise DataError(f"{where}: {name} holds {coord.dtype} values, it must hold {allowed}")


def _check_datetime_dims(coord, where: str) -> None:
    """Refuses a `datetime` coordinate that is not on `time` (a scalar reference time, or
    one per batch row): the progress forcings computed from it would have no time to step
    along, and a message would name the wrong time step's datetime."""
    if set(coord.dims) in ({"time"}, {"batch", "time"}):
        return
    held = (f"a scalar coordinate ({_when(coord.values)})" if coord.ndim == 0 else
            f"a coordinate on {coord.dims}")
    raise DataError(f"{where}: datetime is {held}; it must be on time (or batch and time), "
                    f"the datetime of each time step")


def check_times(ds, what: Optional[str] = None) -> None:
    """Refuses a time axis GraphCast cannot step along: times that are not 6 hours apart,
    out of order or repeated, in `datetime` (per batch row) or in `time` (lead times), and
    a `datetime` that is not on `time` (`_check_datetime_dims`).

    `datetime` must hold datetimes (`datetime64`) and `time` lead times (`timedelta64`)
    or datetimes: a `time` of plain numbers (hours, say) is refused rather than guessed at,
    as their unit is unknown. Either may be absent (a forecast's lead times are always
    GraphCast's 6-hour steps). Only the coordinates are read (they are in memory once a
    dataset is open).

    Raises:
      TypeError: `ds` not an xarray Dataset.
      DataError: naming the file (`what`, by default the file the dataset was opened from),
        the coordinate and what it holds, or the first pair of time steps that are not 6
        hours apart.
    """
    _require_dataset("ds", ds)
    require_kind("what", what, str, optional=True)
    what = what or _source(ds)
    for name in ("datetime", "time"):
        if name not in ds.coords:
            continue
        coord = ds.coords[name]
        _check_time_kind(coord, name, what)
        if name == "datetime":
            _check_datetime_dims(coord, what)
        if "time" not in coord.dims or coord.sizes["time"] < 2:
            continue  # no times to step along
        values = coord.transpose(..., "time").values  # [..., T]
        gaps = np.diff(values, axis=-1)  # [..., T - 1]
        bad = np.isnat(gaps) | (gaps != FRAME_STEP)
        if not bad.any():
            continue
        *row, t = np.argwhere(bad)[0]  # the first (batch row,) time step
        where = f" of batch row {row[0]}" if row and values.shape[0] > 1 else ""
        a, b = values[tuple(row)][t], values[tuple(row)][t + 1]
        gap = gaps[tuple(row)][t]
        if np.isnat(gap):
            problem = f"has no value (NaT) at time step {t + 1 if np.isnat(b) else t}"
        elif gap == np.timedelta64(0):
            problem = f"repeats {_when(a)} at time steps {t} and {t + 1}"
        elif gap < np.timedelta64(0):
            problem = (f"is out of order: time step {t + 1} ({_when(b)}) comes before time "
                       f"step {t} ({_when(a)})")
        else:
            problem = (f"has time steps {gap / np.timedelta64(1, 'h'):g} hours apart (time "
                       f"steps {t} and {t + 1})")
        raise DataError(f"{what}: {name}{where} {problem}; GraphCast's time steps are "
                        f"{HOURS_PER_FRAME:g} hours apart, in increasing order")


def _when(value) -> str:
    """A datetime to the minute, or a lead time in hours."""
    if np.issubdtype(value.dtype, np.datetime64):
        return str(value.astype("datetime64[m]"))
    return f"{value / np.timedelta64(1, 'h'):g} h"


#: (dims a variable must have, dims it may have too) by kind; `batch` is optional
#: throughout (one row, as a dataset without `batch` is), a forcing without `lat` / `lon`
#: is the same everywhere there.
VARIABLE_DIMS = {
    "surface": (("time", "lat", "lon"), ("batch",)),
    "atmospheric": (("time", "level", "lat", "lon"), ("batch",)),
    "forcing": (("time",), ("batch", "lat", "lon")),
    "static": (("lat", "lon"), ("batch", "time")),
}


def _variable_kind(name: str) -> str:
    if name in ATMOSPHERIC_VARIABLES:
        return "atmospheric"
    if name in STATIC_VARIABLES:
        return "static"
    if name in SURFACE_VARIABLES or name == "toa_incident_solar_radiation":
        return "surface"
    return "forcing"  # the progress features


def _check_dims(var, name: str, what: str) -> None:
    """Refuses a variable whose dims its kind does not allow (a surface variable with
    `level`, an ensemble's `member`), which would end in a shape error inside numpy."""
    kind = _variable_kind(name)
    must, may = VARIABLE_DIMS[kind]
    if set(must) <= set(var.dims) <= set(must + may):
        return
    article = "an" if kind[0] in "aeiou" else "a"
    raise DataError(f"{what}: variable {name!r} has dims {var.dims}; {article} {kind} "
                    f"variable's dims are {', '.join(must)} and, optionally, {', '.join(may)}")


#: The variables a task reads from a dataset; the progress features may be derived instead.
DATASET_VARIABLES = frozenset(SURFACE_VARIABLES + ATMOSPHERIC_VARIABLES + STATIC_VARIABLES
                              + ("toa_incident_solar_radiation",))


def _check_variables(ds, what: str) -> None:
    """Refuses a dataset that lacks a variable a task reads, or has one (or a progress
    feature) with dims its kind does not allow (`_check_dims`): the one rule of both the
    examples (`check_dataset`) and the statistics (`compute_stats`), so that statistics
    are computed only where every task's variables are there, atmospheric ones by level."""
    absent = sorted(DATASET_VARIABLES - set(ds.data_vars))
    if absent:
        raise DataError(f"{what}: missing variable {absent[0]!r} (needed: "
                        f"{', '.join(sorted(DATASET_VARIABLES))})")
    given = [f for f in FORCING_VARIABLES + PROGRESS  # progress features of the dataset
             if f in ds.data_vars and f not in DATASET_VARIABLES]
    for name in sorted(DATASET_VARIABLES) + given:
        _check_dims(ds[name], name, what)


def check_dataset(ds, task: TaskConfig, grid_lat: Optional[np.ndarray] = None,
                  grid_lon: Optional[np.ndarray] = None, what: Optional[str] = None):
    """Selects the task's levels and adds derived forcings; names a missing part.

    Returns the dataset with `level` in `task.pressure_levels` order and the progress
    forcings added (`add_derived_vars`). Each variable gclab reads must have the dims of
    its kind (`VARIABLE_DIMS`): a static one carrying `time` or `batch` (as some ERA5
    downloads' land-sea mask does) is taken at its first time step and batch row. Messages
    start with `what`, by default the file the dataset was opened from (`open_dataset`).
    The dataset is read in the official layout (`official_layout`): lat sorted south to
    north, and a `time` of datetimes taken for a missing `datetime`.

    Raises:
      TypeError: `ds` not an xarray Dataset, `task` not a `TaskConfig`.
      DataError: a dimension, coordinate, level or variable missing; a `level` that is no
        dimension (`dataset_levels`); a time axis that is not 6-hourly (`check_times`); a
        variable with dims its kind does not allow; a grid other than `grid_lat` x
        `grid_lon`.
    """
    _require_dataset("ds", ds)
    require_kind("task", task, TaskConfig)
    require_kind("what", what, str, optional=True)
    what = what or _source(ds)
    for dim in ("time", "lat", "lon"):
        if dim not in ds.dims:
            raise DataError(f"{what}: no {dim!r} dimension (dims are {sorted(ds.dims)}; "
                            f"the official layout has batch, time, lat, lon, level)")
    ds = official_layout(ds)
    check_times(ds, what)
    levels = dataset_levels(ds, what)
    if levels is None:
        raise DataError(f"{what}: no 'level' coordinate")
    missing = sorted(set(task.pressure_levels) - set(levels))
    if missing:
        raise DataError(f"{what}: level has no pressure levels {missing} (it has "
                        f"{levels})")
    ds = ds.sel(level=list(task.pressure_levels))
    _check_variables(ds, what)
    for name in STATIC_VARIABLES:  # constant in time: the first time step and batch row
        first = {d: 0 for d in ("batch", "time") if d in ds[name].dims}
        if first:
            ds = ds.assign({name: ds[name].variable.isel(first)})
    for name, grid in (("lat", grid_lat), ("lon", grid_lon)):
        if grid is not None and (ds.sizes[name] != len(grid) or not np.allclose(
                ds[name].values, grid, atol=1e-6)):
            raise DataError(f"{what}: {name} does not match the model's grid ({len(grid)} "
                            f"values from {grid[0]:g} to {grid[-1]:g})")
    return add_derived_vars(ds)


def _grid(var, frames: slice, where: str, used: slice = slice(None),
          batch: int = 1, rows: Optional[list] = None) -> np.ndarray:
    """A variable's frames as [T, Ng, B] or [T, Ng, B, levels] (float32, as stored).

    The frames are checked as they are read (a dataset may be streamed, larger than
    memory): a damaged chunk, or a value that is not finite in the frames `used` (rows of
    the T read) is a `DataError` naming `where` (the file), the variable and the first time
    step that has one. A variable without `batch` (or one `datetime` for all rows, whose
    progress forcings have none) is broadcast to `batch` rows. `rows` are the dataset's
    batch rows that `var`'s are (one window's row, `DatasetWeather.raw_batch`), for the
    message; None where they are the dataset's own.
    """
    dims = [d for d in ("time", "lat", "lon", "batch", "level") if d in var.dims]
    if "batch" not in var.dims:
        rows = None  # the same values for every row: the message names none
        var = var.expand_dims("batch")
        dims.insert(3, "batch")
    if "time" in var.dims:
        var = var.isel(time=frames)
    var = var.transpose(*dims)
    _check_numbers(var, where)
    with _reading(where, var.name):
        a = np.asarray(var.values, np.float32)
    if "time" not in dims:
        a = a[None]
    finite = np.isfinite(a[used])
    if not finite.all():
        raise DataError(_not_finite(var, a[used], finite, used.start or 0,
                                    frames.start or 0, where, rows))
    T, n_lat, n_lon = a.shape[:3]
    a = a.reshape((T, n_lat * n_lon) + a.shape[3:])
    return np.broadcast_to(a, a.shape[:2] + (batch,) + a.shape[3:]) if a.shape[2] == 1 else a


def _not_finite(var, a: np.ndarray, finite: np.ndarray, row: int, start: int,
                where: str, rows: Optional[list] = None) -> str:
    """The message for the first value that is not finite in frames `a` of `var` (dims
    `var.dims`, time first; `a` starts at row `row` of `var`, which starts at time step
    `start` of the file): the file, the variable, the time step, its datetime, the value,
    and the batch row (of the dataset: `rows[b]` for `var`'s row b where `rows` is given,
    else b where `var` has more than one)."""
    i = np.unravel_index(np.argmin(finite), a.shape)
    if "time" not in var.dims:
        return _non_finite(where, var.name, a[i])
    pos = dict(zip(var.dims, (int(j) for j in i)))
    t = row + pos["time"]  # in `var`, whose `datetime` holds the frames read
    if rows is not None:
        batch_row = rows[pos["batch"]]
    else:
        batch_row = pos["batch"] if var.sizes["batch"] > 1 else None
    return _non_finite(where, var.name, a[i], start + t, _datetime(var.coords, t, pos["batch"]),
                       batch_row)


def _datetime(coords, t: int, b: int) -> Optional[str]:
    """The `datetime` of time step `t` of batch row `b`, to the minute, or None."""
    if "datetime" not in coords:
        return None
    dt = coords["datetime"]
    dt = dt.isel({d: i for d, i in (("time", t), ("batch", b)) if d in dt.dims})
    return str(dt.values.astype("datetime64[m]")) if dt.ndim == 0 else None


def _non_finite(where: str, name, value, step: Optional[int] = None,
                when: Optional[str] = None, row: Optional[int] = None) -> str:
    """'FILE: variable NAME holds a non-finite value (nan) at time step T (WHEN) of batch
    row B', the time step left out for a variable without time."""
    text = f"{where}: variable {name!r} holds a non-finite value ({value:g})"
    if step is not None:
        text += f" at time step {step}" + (f" ({when})" if when else "")
    return text + (f" of batch row {row}" if row is not None else "")


def _targets(ds, task: TaskConfig, frames: slice, where: str,
             check_targets: bool, rows: Optional[list] = None) -> np.ndarray:
    """Target variables [2 + T, Ng, B, O] in gclab order (two input frames, then the T
    target frames that `frames` holds, none for a forecast).

    The values used must be finite: an input variable's input frames, and every variable's
    target frames where `check_targets`.
    """
    targets = target_channels(task)
    inputs = {targets[i][0] for i in input_variable_channels(task)}
    parts = []
    for v in SURFACE_VARIABLES + ATMOSPHERIC_VARIABLES:
        used = slice(0 if v in inputs else 2, None if check_targets else 2)
        a = _grid(ds[v], frames, where, used, ds.sizes.get("batch", 1), rows)
        parts.append(a[..., None] if v in SURFACE_VARIABLES else a)
    return np.concatenate(parts, -1)


def _forcings(ds, frames: slice, n_nodes: int, n_lon: int, where: str,
              rows: Optional[list] = None) -> np.ndarray:
    """Forcings [T, Ng, B, 5] in `FORCING_VARIABLES` order."""
    out = []
    for name in FORCING_VARIABLES:
        var = ds[name]
        if "lat" not in var.dims:  # year progress: (batch, time); day progress: no lat
            var = var.expand_dims(lat=ds.sizes["lat"])
        if "lon" not in var.dims:
            var = var.expand_dims(lon=n_lon)
        out.append(_grid(var, frames, where, batch=ds.sizes.get("batch", 1), rows=rows))
    return np.stack(out, -1)


def raw_example(ds, task: TaskConfig, start: int = 0, rollout: int = 1,
                check_targets: bool = True, read_targets: bool = True) -> RawExample:
    """The `RawExample` whose input frames are `start`, `start + 1` of a checked dataset.

    Targets are frames `start + 2 .. start + rollout + 1`; a forcing row past the end of
    the dataset (the last row, which no step uses) repeats the last frame's. Only these
    frames are read, and checked as they are: a damaged chunk, or a value that is not
    finite in the inputs, forcings, statics or (`check_targets`, for training) the target
    frames, is a `DataError` naming the file, the variable, the time step and, where the
    dataset has more than one, the batch row. Latitudes are read south to north, as
    everywhere in this module (`lat_south_to_north`), whatever the dataset's order. A
    forecast uses only the target frames' forcings: the weather of frames not yet observed
    may be NaN (as in the official rollout's `targets_template`), and with
    `read_targets=False` (`gclab.weather.forecast`) it is not read at all: the weather
    variables' two input frames are, the forcings of every frame, and `targets` is empty
    ([0, Ng, B, O]).

    Raises:
      TypeError: `ds` not an xarray Dataset, `task` not a `TaskConfig`.
      ValueError: `start` not an integer >= 0 or `rollout` not an integer >= 1.
      DataError: too few time steps for `start` and `rollout`; a `level` coordinate that
        is not the task's pressure levels, in its order (`check_dataset` selects them), or
        no dimension; a damaged chunk or a value that is not finite.
    """
    return _raw_example(ds, task, start, rollout, check_targets, read_targets)


def _raw_example(ds, task: TaskConfig, start: int, rollout: int, check_targets: bool = True,
                 read_targets: bool = True, rows: Optional[list] = None) -> RawExample:
    """`raw_example`; `rows` are the batch rows of the dataset `ds` was selected from
    (`DatasetWeather.raw_batch`'s one window), which a message names (`_grid`)."""
    _require_dataset("ds", ds)
    require_kind("task", task, TaskConfig)
    start, rollout = require_count("start", start, 0), require_count("rollout", rollout, 1)
    require_kind("read_targets", read_targets, (bool, np.bool_), "True or False")
    where = _source(ds)
    # A north-to-south dataset read as it is stored would put every row of the grid where
    # the network expects its mirror image (only `lat` is read for this).
    ds = lat_south_to_north(ds)
    # Levels are read in the dataset's order: any other set or order than the task's
    # would put channels where the network expects others (or index past them).
    levels = dataset_levels(ds, where)
    if levels != list(task.pressure_levels):
        raise DataError(f"{where}: level is {levels}, the task's pressure levels are "
                        f"{list(task.pressure_levels)} (check_dataset(ds, task) selects "
                        f"them, in the task's order)")
    n = ds.sizes["time"]
    if start + rollout + 2 > n:
        raise DataError(f"the dataset has {n} time steps; inputs at {start}, {start + 1} "
                        f"and {rollout} target step(s) need {start + rollout + 2}")
    t = start + 1
    n_lon = ds.sizes["lon"]
    n_nodes = ds.sizes["lat"] * n_lon
    read = rollout if read_targets else 0  # target frames of weather read
    frames = _targets(ds, task, slice(t - 1, t + read + 1), where,
                      check_targets, rows)  # [2 + T (or 0), Ng, B, O]
    stop = min(n, t + rollout + 2)
    forc = _forcings(ds, slice(t - 1, stop), n_nodes, n_lon, where,
                     rows)  # [<= T + 3, Ng, B, 5]
    if forc.shape[0] < rollout + 3:
        forc = np.concatenate([forc, forc[-1:]], 0)
    statics = np.concatenate([_grid(ds[s], slice(None), where) [..., None]
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

    Raises:
      ValueError: `frames` not an integer >= 3 (two input frames and one target frame, the
        least that holds one example).
    """
    # Fewer frames would make a dataset with no example in it (0 or less: no time steps at
    # all), which fails only later, where it is read.
    least = INPUT_FRAMES + 1
    if not is_int(frames) or frames < least:
        raise ValueError(f"frames={frames!r} is invalid: an integer >= {least} (two input "
                         f"frames and one target frame make the smallest example)")
    frames = int(frames)
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

    Raises:
      TypeError: `ds` not an xarray Dataset, `task` not a `TaskConfig`, `stats` not a
        `Stats` of three datasets.
      DataError: what `check_dataset` and `normalization_from_stats` refuse.
    """

    def __init__(self, ds, task: TaskConfig, stats: Stats, grid_lat: np.ndarray,
                 grid_lon: np.ndarray) -> None:
        # Every argument's kind before the dataset is checked (which reads coordinates).
        _require_dataset("ds", ds)
        require_kind("task", task, TaskConfig)
        _require_stats(stats)
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
            # The row is named in a message of a dataset of more than one (`_grid`).
            rows = [row] if self.batch_rows > 1 else None
            parts.append(_raw_example(ds, self.task, t, rollout, rows=rows))
        return RawExample(*(np.concatenate(x, axis=-2) for x in zip(*parts)))

    def make_batch(self, batch: int, rollout: int = 1, start: int = 1):
        """A normalised `Example` of `batch` windows (see the class docstring)."""
        return self._norm.normalise(self.raw_batch(batch, rollout, start))
