"""WeatherBench2-style ERA5 zarr: lazy opening, renaming and sorting, bounded host memory."""

import re

import dask.array
import numpy as np
import pytest

from gclab.config import ModelConfig, TaskConfig
from gclab.measure.hostmem import track_host_memory
from gclab.training.data import SyntheticWeather
from gclab.weather import (
    DataError,
    DatasetWeather,
    check_dataset,
    compute_stats,
    open_dataset,
    raw_example,
    synthetic_dataset,
)
from gclab.weather.era5 import open_era5, to_official_layout, weatherbench_dataset

TASK = TaskConfig(pressure_levels=(500, 850))
CFG = ModelConfig(resolution=10.0, mesh_splits=1)
FRAMES = 12


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    weather = SyntheticWeather(TaskConfig(pressure_levels=(300, 500, 850)), CFG.resolution)
    official = synthetic_dataset(weather, frames=FRAMES)
    wb2 = weatherbench_dataset(official).chunk({"time": 1})
    path = tmp_path_factory.mktemp("era5") / "era5.zarr"
    wb2.to_zarr(path, zarr_format=2)  # WeatherBench2 stores are zarr v2
    return path, official, wb2


def test_store_has_the_weatherbench_layout(store):
    _, _, wb2 = store
    assert "latitude" in wb2.dims and "batch" not in wb2.dims
    assert float(wb2.latitude[0]) == 90.0  # north to south
    assert np.issubdtype(wb2.time.dtype, np.datetime64)
    assert wb2["temperature"].chunks[0] == (1,) * FRAMES  # one chunk per time step


def test_open_era5_is_lazy_and_gives_the_official_layout(store):
    path, official, _ = store
    ds = open_era5(path, levels=(500, 850))
    assert isinstance(ds["temperature"].data, dask.array.Array)  # nothing read yet
    assert ds["temperature"].dims == ("batch", "time", "level", "lat", "lon")
    assert ds["land_sea_mask"].dims == ("lat", "lon")
    assert ds["datetime"].dims == ("batch", "time")
    assert ds.level.values.tolist() == [500, 850]
    assert float(ds.lat[0]) == -90.0
    assert ds.time.dtype == np.dtype("timedelta64[ns]")
    np.testing.assert_array_equal(ds["datetime"].values, official["datetime"].values)
    a = raw_example(check_dataset(ds, TASK), TASK, start=3, rollout=2)
    b = raw_example(check_dataset(official, TASK), TASK, start=3, rollout=2)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    # open_dataset recognises the store too; times select by date.
    same = open_dataset(path)
    assert same.sizes["time"] == FRAMES and "lat" in same.dims
    start = str(official["datetime"].values[0, 2])
    part = open_era5(path, times=slice(start, None))
    assert part.sizes["time"] == FRAMES - 2
    assert part.time.values[0] == np.timedelta64(0, "ns")


def _example_peak(tmp_path, frames: int) -> tuple[int, int]:
    """(peak host bytes of one example from a `frames`-step store, the store's bytes)."""
    model = ModelConfig(resolution=4.0)
    official = synthetic_dataset(SyntheticWeather(TASK, model.resolution), frames=frames)
    path = tmp_path / f"store-{frames}.zarr"
    weatherbench_dataset(official).chunk({"time": 1}).to_zarr(path, zarr_format=2)
    stats = compute_stats(official.isel(time=slice(0, 8)))
    lat = np.linspace(-90, 90, model.n_lat)
    lon = np.arange(model.n_lon) * model.resolution
    source = DatasetWeather(open_era5(path), TASK, stats, lat, lon)
    source.make_batch(1, rollout=1, start=1)  # warm caches and imports
    with track_host_memory() as host:
        ex = source.make_batch(1, rollout=1, start=1 + 5 * 13)
    assert ex.inputs.shape == (model.num_grid_nodes, 1, TASK.data_channels)
    return host.peak_bytes, sum(v.nbytes for v in official.data_vars.values())


def test_streaming_memory_does_not_grow_with_the_store(tmp_path):
    # 4 deg grid, about 0.3 MB of float32 per time step; stores of 16 and 96 steps.
    short, short_bytes = _example_peak(tmp_path, 16)
    long, long_bytes = _example_peak(tmp_path, 96)
    assert long_bytes > 5.9 * short_bytes  # (statics do not grow with time)
    # One example reads 4 time steps whatever the store's length.
    assert long < 1.5 * short, (short, long)
    assert long < 0.25 * long_bytes, (long, long_bytes)


def test_bad_stores_name_the_problem(tmp_path, store):
    _, _, wb2 = store
    with pytest.raises(DataError, match="no such zarr store"):
        open_era5(tmp_path / "none.zarr")
    (tmp_path / "empty.zarr").mkdir()
    with pytest.raises(DataError, match="not a readable zarr store"):
        open_era5(tmp_path / "empty.zarr")
    path, _, _ = store
    with pytest.raises(DataError, match=r"level has no pressure levels \[700\]"):
        open_era5(path, levels=(500, 700))
    with pytest.raises(DataError, match="no time step in"):
        open_era5(path, times=slice("1990-01-01", "1990-01-02"))
    # Integer bounds: not pandas' TypeError ("cannot do slice indexing on DatetimeIndex").
    for bad in (slice(0, 3), 3):
        with pytest.raises(ValueError, match=rf"^times={re.escape(repr(bad))} is invalid: "
                                             "a slice of datetimes"):
            open_era5(path, times=bad)


def test_gclab_stats_reads_a_weatherbench_store(tmp_path, store, capsys):
    from gclab import cli
    from gclab.weather import load_stats
    path, official, _ = store
    assert cli.main(["stats", "--data", str(path), "--out", str(tmp_path / "s")]) == 0
    got, want = load_stats(tmp_path / "s"), compute_stats(official)
    for name in ("temperature", "2m_temperature", "land_sea_mask", "day_progress_sin"):
        np.testing.assert_allclose(got.mean[name].values, want.mean[name].values, rtol=1e-6)
        np.testing.assert_allclose(got.stddev[name].values, want.stddev[name].values,
                                   rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(got.diffs_stddev["temperature"].values,
                               want.diffs_stddev["temperature"].values, rtol=1e-6)


@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")  # zarr 3 on v3
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_damaged_chunk_names_the_store_and_variable(tmp_path, store, zarr_format):
    _, _, wb2 = store
    path = tmp_path / f"damaged-v{zarr_format}.zarr"
    wb2.isel(time=slice(0, 4)).to_zarr(path, zarr_format=zarr_format)
    # Time step 2's chunk of temperature (one chunk per time step) overwritten with garbage.
    chunk = path / "temperature" / ("2.0.0.0" if zarr_format == 2 else "c/2/0/0/0")
    assert chunk.is_file()
    chunk.write_bytes(np.random.default_rng(0).bytes(200))
    ds = open_era5(path, levels=(500, 850))
    text = f"{path}: variable 'temperature' could not be read, a chunk of it is damaged ("
    with pytest.raises(DataError) as e:
        compute_stats(ds)
    assert str(e.value).startswith(text) and "\n" not in str(e.value)
    with pytest.raises(DataError) as e:
        raw_example(check_dataset(ds, TASK), TASK, start=0, rollout=1)  # frames 0..2
    assert str(e.value).startswith(text)
    # A chunk that decodes to the wrong size (an uncompressed store) is the same error.
    raw = tmp_path / "raw.zarr"
    wb2.isel(time=slice(0, 4)).to_zarr(raw, zarr_format=2, encoding={
        "temperature": {"compressors": None}})
    (raw / "temperature" / "2.0.0.0").write_bytes(b"\0" * 12)
    with pytest.raises(DataError, match="could not be read, a chunk of it is damaged "
                                        r"\(ValueError: cannot reshape"):
        compute_stats(open_era5(raw))


def test_a_store_without_a_level_dimension_is_refused_with_levels(tmp_path, store):
    # Was a TypeError ('int' object is not iterable) for a scalar level, a KeyError for none.
    _, _, wb2 = store
    scalar = tmp_path / "scalar.zarr"
    wb2.sel(level=500).to_zarr(scalar, zarr_format=2)
    surface = tmp_path / "surface.zarr"
    wb2.drop_dims("level").to_zarr(surface, zarr_format=2)
    for path, problem in ((scalar, "level is a scalar coordinate (500): atmospheric "
                                   "variables need a level dimension"),
                          (surface, "no 'level' coordinate (levels [500] were asked for)")):
        with pytest.raises(DataError) as e:
            open_era5(path, levels=(500,))
        assert str(e.value) == f"{path}: WeatherBench2 dataset: {problem}"
        with pytest.raises(DataError, match=f"^WeatherBench2 dataset: {re.escape(problem)}$"):
            to_official_layout(wb2.sel(level=500) if path == scalar else
                               wb2.drop_dims("level"), levels=(500,))
    # Without levels asked for, the store opens; what reads it names the scalar level.
    ds = open_era5(scalar)
    with pytest.raises(DataError, match=f"^{scalar}: level is a scalar coordinate"):
        check_dataset(ds, TASK)
    with pytest.raises(DataError, match=f"^{scalar}: level is a scalar coordinate"):
        compute_stats(ds)
