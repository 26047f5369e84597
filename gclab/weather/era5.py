"""WeatherBench2-style ERA5 zarr stores, opened lazily in the official layout.

WeatherBench2's ERA5 stores (e.g. `gs://weatherbench2/datasets/era5/...zarr`) hold the
same variable names as the official datasets, but with dims `time` (`datetime64`),
`latitude` (north to south), `longitude` and `level`, no `batch`, and one chunk per time
step. `open_era5` opens such a store with xarray and dask without reading any array,
renames the dims, sorts latitude south to north, selects times and levels, and adds the
official `batch` dim and `datetime` coordinate, so that `gclab.weather.DatasetWeather`,
`forecast` and `compute_stats` use it unchanged. Arrays are read only when an example
asks for them, one time step's chunks at a time: host memory stays about one example
(a 0.25 deg, 37-level time step is about 1 GB in float32), however long the store is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from gclab.config import WrongType, a_kind, is_number, require_kind
from gclab.weather.dataset import (
    DataError,
    dataset_levels,
    import_data_extra,
    lat_south_to_north,
)

PathLike = Union[str, os.PathLike]
RENAMES = {"latitude": "lat", "longitude": "lon"}


def is_weatherbench(ds) -> bool:
    """Whether a dataset has WeatherBench2's names (`latitude`, `longitude`)."""
    return "latitude" in ds.dims or "longitude" in ds.dims


#: What `levels` of `open_era5` and `to_official_layout` must be, in a message's words.
LEVELS = "a non-empty sequence of distinct pressure levels (numbers, such as (500, 850))"


def _require_levels(levels) -> None:
    """Refuses `levels` (not None) that is no sequence of distinct numbers, naming it: a
    number alone would end in a TypeError from inside, a str be read a character at a time,
    a level given twice be selected twice, and none select no atmospheric level at all."""
    if isinstance(levels, (str, bytes)) or not isinstance(levels, (Sequence, np.ndarray)):
        raise WrongType(f"levels={levels!r} is invalid: {LEVELS}, not {a_kind(levels)}")
    values = list(levels)
    if not values:
        raise ValueError(f"levels={levels!r} is invalid: {LEVELS}")
    seen = set()
    for value in values:
        if not is_number(value):
            raise WrongType(f"levels={levels!r} is invalid: {LEVELS}; {value!r} is not a "
                            f"number")
        if value in seen:
            raise ValueError(f"levels={levels!r} is invalid: {LEVELS}; {value} repeats")
        seen.add(value)


def to_official_layout(ds, times: Optional[slice] = None,
                       levels: Optional[Sequence[int]] = None):
    """A WeatherBench2-style dataset (lazy) -> the official layout (still lazy).

    Args:
      ds: dims time (datetime64), latitude, longitude[, level].
      times: a `slice` of datetimes (strings such as "2020-01-01T00" work), or None.
      levels: pressure levels to keep, or None for all.

    Raises:
      TypeError, ValueError: `times` not a slice of datetimes, or `levels` not a non-empty
        sequence of distinct numbers (named).
      DataError: a dimension missing, both a WeatherBench2 name and the official one
        (`latitude` and `lat`, say), `time` not datetimes, no time step in `times`, or,
        with `levels`, no `level` dimension or a level of `levels` missing.
    """
    if levels is not None:
        _require_levels(levels)
    for dim in ("time", "latitude", "longitude"):
        if dim not in ds.dims:
            raise DataError(f"WeatherBench2 dataset: no {dim!r} dimension (dims are "
                            f"{sorted(ds.dims)})")
    for old, new in RENAMES.items():  # else xarray's rename fails inside
        if new in ds.variables or new in ds.dims:
            raise DataError(f"WeatherBench2 dataset: it has both {old!r} and {new!r}; "
                            f"{old!r} is read as {new!r}, so only one of them may be there")
    if not np.issubdtype(ds["time"].dtype, np.datetime64):
        raise DataError("WeatherBench2 dataset: 'time' must hold datetimes, it holds "
                        f"{ds['time'].dtype}")
    ds = lat_south_to_north(ds.rename(RENAMES))
    if times is not None:
        require_kind("times", times, slice, "a slice of datetimes (strings such as "
                     "\"2020-01-01T00\" work)")
        try:
            ds = ds.sel(time=times)
        except (TypeError, KeyError, ValueError):  # pandas' words for a bound of no date
            raise ValueError(f"times={times!r} is invalid: a slice of datetimes (strings "
                             f"such as \"2020-01-01T00\" work)") from None
        if ds.sizes["time"] == 0:
            raise DataError(f"WeatherBench2 dataset: no time step in {times}")
    if levels is not None:
        have = dataset_levels(ds, "WeatherBench2 dataset")  # a scalar one is refused
        if have is None:
            raise DataError(f"WeatherBench2 dataset: no 'level' coordinate (levels "
                            f"{list(levels)} were asked for)")
        missing = sorted(set(levels) - set(have))
        if missing:
            raise DataError(f"WeatherBench2 dataset: level has no pressure levels {missing}")
        ds = ds.sel(level=list(levels))
    dt = ds["time"].values.astype("datetime64[ns]")  # [T]
    ds = ds.assign_coords(time=("time", (dt - dt[0]).astype("timedelta64[ns]")))
    timed = {k: v.expand_dims("batch") for k, v in ds.data_vars.items() if "time" in v.dims}
    ds = ds.assign(timed)
    return ds.assign_coords(datetime=(("batch", "time"), dt[None]))


def open_era5(path: PathLike, times: Optional[slice] = None,
              levels: Optional[Sequence[int]] = None):
    """Opens a WeatherBench2-style zarr store lazily, in the official layout.

    Raises:
      TypeError, ValueError: `times` or `levels` that `to_official_layout` refuses (named;
        `levels` before the store is opened).
      DataError: no such store, not a readable zarr store, or what `to_official_layout`
        refuses (the message names the store); or a module of the `data` extra that
        reading it needs (xarray, dask, zarr) not installed.
    """
    if levels is not None:
        _require_levels(levels)
    xarray = import_data_extra("xarray")
    import_data_extra("dask")  # the store is opened lazily, one chunk per time step
    import_data_extra("zarr")
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such zarr store")
    try:
        ds = xarray.open_zarr(path, chunks={})
    except Exception as e:  # noqa: BLE001 - zarr raises many error types
        first = str(e).splitlines()[0] if str(e) else ""
        raise DataError(f"{path}: not a readable zarr store ({type(e).__name__}: "
                        f"{first})") from None
    try:
        ds = to_official_layout(ds, times, levels)
    except DataError as e:
        raise DataError(f"{path}: {e}") from None
    ds.encoding["source"] = str(path)  # messages of later reads name the store
    return ds


def weatherbench_dataset(official):
    """An official-layout dataset (batch 1) in WeatherBench2's layout (for tests and demos):
    `latitude` north to south, `longitude`, `time` as datetimes, no `batch`."""
    ds = official.isel(batch=0) if "batch" in official.dims else official
    dt = ds["datetime"].values
    ds = ds.drop_vars("datetime").assign_coords(time=("time", dt))
    return ds.rename({"lat": "latitude", "lon": "longitude"}).sortby("latitude",
                                                                     ascending=False)
