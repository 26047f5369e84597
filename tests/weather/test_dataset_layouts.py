"""Datasets laid out otherwise than the official demo's, read the same by every command:
a scalar `level`, a `time` of datetimes without `datetime` (as CDO writes), latitudes north
to south; and progress features computed per window, not for the whole store."""

import tracemalloc

import numpy as np
import pytest
import xarray

from gclab import cli
from gclab.config import TaskConfig
from gclab.training.data import SyntheticWeather
from gclab.weather import dataset as wd

TASK = TaskConfig(pressure_levels=(500, 850))
RESOLUTION = 10.0
PROGRESS = ("year_progress_sin", "year_progress_cos", "day_progress_sin", "day_progress_cos")


@pytest.fixture(scope="module")
def weather():
    return SyntheticWeather(TASK, RESOLUTION, seed=2)


@pytest.fixture(scope="module")
def official(weather):
    """One batch row, 6 time steps, in memory."""
    return wd.synthetic_dataset(weather, frames=6)


def _written(path, ds):
    wd.write_dataset(ds, path)
    return path


def _same(got, want):
    for name, a, b in zip(got._fields, got, want):
        assert a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def _same_stats(got, want):
    for kind, a, b in zip(wd.STATS_FILES, got, want):
        assert sorted(a.data_vars) == sorted(b.data_vars), kind
        for name in b.data_vars:
            np.testing.assert_array_equal(a[name].values, b[name].values,
                                          err_msg=f"{kind} {name}")


def _example(ds, weather, **kw):
    return wd.raw_example(wd.check_dataset(ds, TASK, weather.grid_lat, weather.grid_lon),
                          TASK, **kw)


# ----------------------------------------------------------------------------------------
# A scalar `level` (a dataset saved after `ds.sel(level=500)`).


def test_a_scalar_level_is_refused_by_every_command(tmp_path, official, capsys):
    path = _written(tmp_path / "scalar.nc", official.sel(level=500))
    ds = wd.open_dataset(path)
    assert ds.coords["level"].ndim == 0
    want = (f"{path}: level is a scalar coordinate (500): atmospheric variables need a level "
            f"dimension")
    one_level = TaskConfig(pressure_levels=(500,))
    # Was a TypeError ('int' object is not iterable) in check_dataset and raw_example, and
    # statistics of no level (0-d) that no task can read by level.
    for call in (lambda: wd.check_dataset(ds, TASK), lambda: wd.check_dataset(ds, one_level),
                 lambda: wd.raw_example(ds, one_level), lambda: wd.compute_stats(ds)):
        with pytest.raises(wd.DataError) as e:
            call()
        assert str(e.value) == want
    out = tmp_path / "stats"
    assert cli.main(["stats", "--data", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and want in err and "Traceback" not in err, err
    assert not out.exists()
    # One level kept as a dimension is a dataset of one level, as before.
    kept = official.sel(level=[500])
    assert wd.raw_example(wd.check_dataset(kept, one_level), one_level).inputs.shape[-1] == (
        one_level.data_channels)


# ----------------------------------------------------------------------------------------
# `time` of datetimes and no `datetime` (CDO-style): taken for `datetime` everywhere.


def _cdo_like(official):
    one = official.isel(batch=0)
    return one.drop_vars("datetime").assign_coords(time=("time", one.datetime.values))


def test_a_time_of_datetimes_stands_for_datetime_in_every_command(tmp_path, official,
                                                                   weather):
    path = _written(tmp_path / "cdo.nc", _cdo_like(official))
    opened = wd.open_dataset(path)
    assert opened.time.dtype.kind == "m" and opened.time.values[0] == np.timedelta64(0)
    np.testing.assert_array_equal(opened.datetime.values, official.datetime.values[0])
    want = _example(official, weather, rollout=2)
    # From the file and in memory alike (check_dataset refused it: no 'datetime').
    for ds in (opened, _cdo_like(official)):
        _same(_example(ds, weather, rollout=2), want)
        stats = wd.compute_stats(ds)  # skipped the progress features, without a word
        assert set(PROGRESS) <= set(stats.mean.data_vars)
        _same_stats(stats, wd.compute_stats(official))
    # Training reads it as the official file.
    stats = wd.compute_stats(official)
    a = wd.DatasetWeather(opened, TASK, stats, weather.grid_lat, weather.grid_lon)
    b = wd.DatasetWeather(official, TASK, stats, weather.grid_lat, weather.grid_lon)
    _same(a.raw_batch(2, rollout=1, start=1), b.raw_batch(2, rollout=1, start=1))
    # gclab stats writes the same statistics as from the official file.
    assert cli.main(["stats", "--data", str(path), "--out", str(tmp_path / "s")]) == 0
    _same_stats(wd.load_stats(tmp_path / "s"), wd.compute_stats(official))


def test_without_datetimes_stats_refuse_as_check_dataset_does(official):
    # Lead times only: no dates to compute the progress features from.
    ds = official.drop_vars("datetime")
    ds.encoding = {}
    want = ("dataset: the dataset has no 'datetime' coordinate (needed to compute the "
            "year_progress_sin and year_progress_cos forcings, which it lacks)")
    for call in (lambda: wd.check_dataset(ds, TASK), lambda: wd.compute_stats(ds)):
        with pytest.raises(wd.DataError) as e:
            call()
        assert str(e.value) == want
    # With the features in the dataset, no datetime is needed by either.
    full = wd.add_derived_vars(official).drop_vars("datetime")
    wd.check_dataset(full, TASK)
    assert set(PROGRESS) <= set(wd.compute_stats(full).mean.data_vars)


# ----------------------------------------------------------------------------------------
# Latitudes north to south: sorted when read, by every command.


def test_north_to_south_latitudes_read_as_south_to_north(tmp_path, official, weather,
                                                          capsys):
    s2n = _written(tmp_path / "s2n.nc", official)
    n2s = _written(tmp_path / "n2s.nc", official.isel(lat=slice(None, None, -1)))
    opened = wd.open_dataset(n2s)
    np.testing.assert_array_equal(opened.lat.values, official.lat.values)
    want = _example(wd.open_dataset(s2n), weather, rollout=3)
    # check_dataset refused it (with a hint at gclab.weather.era5, which does not apply).
    for ds in (opened, official.isel(lat=slice(None, None, -1))):
        _same(_example(ds, weather, rollout=3), want)
    _same_stats(wd.compute_stats(opened), wd.compute_stats(wd.open_dataset(s2n)))
    for name in ("s2n", "n2s"):
        assert cli.main(["stats", "--data", str(tmp_path / f"{name}.nc"),
                         "--out", str(tmp_path / f"stats-{name}")]) == 0
    _same_stats(wd.load_stats(tmp_path / "stats-n2s"), wd.load_stats(tmp_path / "stats-s2n"))


# ----------------------------------------------------------------------------------------
# Progress features: computed per window, not held for the whole store.


def _whole_store_progress(ds) -> dict:
    """{feature: [B, T, lon] float32} for the whole store, as numpy arrays, by the official
    definition (as gclab computed them before they were lazy)."""
    seconds = ds.datetime.values.astype("datetime64[s]").astype(np.int64)  # [B, T]
    year = np.mod(seconds / 86400 / np.float64(365.24219), 1.0).astype(np.float32)
    day = np.mod(np.mod(seconds, 86400)[..., None] / 86400
                 + np.deg2rad(ds.lon.values) / (2 * np.pi), 1.0).astype(np.float32)
    n_lon = ds.sizes["lon"]
    out = {}
    for name, p in (("year_progress", year[..., None].repeat(n_lon, -1)),
                    ("day_progress", day)):
        out[f"{name}_sin"] = np.sin(p * (2 * np.pi))
        out[f"{name}_cos"] = np.cos(p * (2 * np.pi))
    return out


@pytest.fixture(scope="module")
def long_store(tmp_path_factory, weather):
    """Two batch rows of 150 time steps (3 progress chunks) in a netCDF file."""
    assert wd.PROGRESS_CHUNK < 75
    path = tmp_path_factory.mktemp("long") / "long.nc"
    return _written(path, wd.synthetic_dataset(weather, frames=150, batch_starts=(0, 3)))


def test_per_window_progress_features_equal_the_whole_store_ones(long_store, weather):
    ds = wd.open_dataset(long_store)
    whole = _whole_store_progress(ds)
    stats = wd.compute_stats(ds.isel(time=slice(0, 8)))
    source = wd.DatasetWeather(ds, TASK, stats, weather.grid_lat, weather.grid_lon)
    n_lat, n_lon = weather.grid_lat.size, weather.grid_lon.size
    channels = wd.input_channels(TASK)
    rollout = 3
    # Windows at the start, across a chunk boundary and at the end of each batch row.
    for start in (0, wd.PROGRESS_CHUNK - 2, 150 - rollout - 2):
        raw = wd.raw_example(source.ds, TASK, start=start, rollout=rollout)
        for j, name in enumerate(PROGRESS, 1):  # FORCING_VARIABLES[1:]
            for frame in range(3):  # inputs' forcings: frames start .. start + 2
                got = raw.inputs[..., channels.index((name, frame, None))]  # [Ng, B]
                want = whole[name][:, start + frame]  # [B, lon]
                np.testing.assert_array_equal(
                    got.reshape(n_lat, n_lon, 2), np.broadcast_to(
                        want.T[None], (n_lat, n_lon, 2)), err_msg=f"{name} {start}")
            for k in range(rollout - 1):  # the targets': frames start + 3 ..
                got = raw.forcings[k, :, :, j].reshape(n_lat, n_lon, 2)
                want = whole[name][:, start + 3 + k].T[None]
                np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))
    # The statistics are the whole store's numbers (to float64 rounding: summed by chunk).
    got = wd.compute_stats(ds)
    for name in PROGRESS:
        a = whole[name].astype(np.float64)
        np.testing.assert_allclose(got.mean[name].values, a.mean(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(got.stddev[name].values, a.std(), rtol=1e-12)
        np.testing.assert_allclose(got.diffs_stddev[name].values,
                                   np.diff(a, axis=1).std(), rtol=1e-12)


@pytest.mark.parametrize("own", [False, True], ids=["from datetime", "the dataset's own"])
def test_dataset_weather_holds_no_whole_store_progress_arrays(long_store, weather, own):
    path, computed = long_store, PROGRESS
    if own:  # year_progress in the file, its sin and cos computed by gclab
        full = wd.add_derived_vars(wd.open_dataset(long_store).load())
        path = _written(long_store.with_name("own.nc"), full.drop_vars(
            ["year_progress_sin", "year_progress_cos"]).compute())
        computed = PROGRESS[:2]
    ds = wd.open_dataset(path)
    assert own == ("year_progress" in ds.data_vars)
    stats = wd.compute_stats(ds.isel(time=slice(0, 8)))
    source = wd.DatasetWeather(ds, TASK, stats, weather.grid_lat, weather.grid_lon)
    for name in computed:  # lazy: nothing computed yet (were numpy arrays of every frame)
        assert source.ds[name].chunks is not None, name
    want = wd.raw_example(wd.check_dataset(wd.open_dataset(path).load().isel(batch=[0]),
                                           TASK), TASK)
    _same(source.raw_batch(1, rollout=1, start=1), want)


def test_progress_features_of_a_long_store_cost_no_whole_store_memory():
    # 4000 six-hourly steps at 1 deg: the day progress alone was 3 arrays of 5.8 MB.
    T, n_lon = 4000, 360
    dt = np.datetime64("2010-01-01T00", "ns") + np.arange(T) * np.timedelta64(6, "h")
    ds = xarray.Dataset(coords={"lon": np.arange(n_lon, dtype=np.float32),
                                "datetime": (("batch", "time"), dt[None])})
    tracemalloc.start()
    try:
        out = wd.add_derived_vars(ds)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one_array = T * n_lon * 4
    assert held < one_array / 2, (held, one_array)  # (dask's graph: 0.5 MB)
    window = out["day_progress_sin"].isel(time=slice(2000, 2004)).values
    np.testing.assert_array_equal(window, _whole_store_progress(ds)["day_progress_sin"][
        :, 2000:2004])
