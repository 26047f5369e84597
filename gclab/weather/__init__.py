"""Real GraphCast files: published checkpoints and weather in the official layout.

| module | what it is for |
|---|---|
| `checkpoint` | published `.npz` checkpoints <-> `ModelConfig`, `TaskConfig`, parameters |
| `dataset` | official-layout netCDF datasets and statistics <-> `RawExample`, `Normalization` |
| `era5` | WeatherBench2-style ERA5 zarr stores, opened lazily in the official layout |
| `forecast` | autoregressive forecasts in the official rollout's layout |

xarray, h5netcdf, zarr and dask are the optional `data` extra (`pip install gclab[data]`);
`dataset` imports xarray only where it reads or writes a dataset (`import_data_extra`, which
names the ``gclab[data]`` extra where a package of it is missing).
"""

from gclab.weather.checkpoint import (
    Checkpoint,
    CheckpointError,
    OfficialTask,
    from_flat,
    read_checkpoint,
    read_flat,
    to_flat,
    write_checkpoint,
)
from gclab.weather.dataset import (
    STATS_FILES,
    DataError,
    DatasetWeather,
    Stats,
    add_derived_vars,
    channel_permutations,
    check_dataset,
    check_times,
    compute_stats,
    load_stats,
    normalization_from_stats,
    open_dataset,
    params_to_gclab_channels,
    params_to_official_channels,
    raw_example,
    synthetic_dataset,
    write_dataset,
    write_stats,
)

__all__ = [
    "Checkpoint", "CheckpointError", "OfficialTask", "from_flat", "read_checkpoint",
    "read_flat", "to_flat", "write_checkpoint", "STATS_FILES", "DataError", "DatasetWeather",
    "Stats",
    "add_derived_vars",
    "channel_permutations", "check_dataset", "check_times", "compute_stats", "load_stats",
    "normalization_from_stats", "open_dataset", "params_to_gclab_channels",
    "params_to_official_channels", "raw_example", "synthetic_dataset", "write_dataset",
    "write_stats",
]
