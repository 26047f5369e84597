"""Datasets and arguments gclab cannot read correctly get one line naming what is wrong, not
a traceback from inside xarray, pandas or numpy, nor statistics or examples that are wrong
without a word: repeated pressure levels, a `datetime` not on `time`, statistics no task
could read, latitudes north to south, both `latitude` and `lat`, an empty grid, `levels`
of `open_era5`, and the batch row of a value that is not finite."""

import warnings

import numpy as np
import pytest

from gclab import cli
from gclab.config import TaskConfig
from gclab.training.data import SAMPLE_SPACING, SyntheticWeather
from gclab.weather import dataset as wd
from gclab.weather.era5 import LEVELS, open_era5, to_official_layout, weatherbench_dataset

TASK = TaskConfig(pressure_levels=(500, 850))
RESOLUTION = 10.0
ON_TIME = "it must be on time (or batch and time), the datetime of each time step"


@pytest.fixture(scope="module")
def weather():
    return SyntheticWeather(TASK, RESOLUTION, seed=4)


@pytest.fixture(scope="module")
def official(weather):
    """One batch row, 4 time steps, in memory."""
    return wd.synthetic_dataset(weather, frames=4)


@pytest.fixture(scope="module")
def store(tmp_path_factory, official):
    """`official` as a WeatherBench2-style zarr store."""
    path = tmp_path_factory.mktemp("refusals") / "era5.zarr"
    weatherbench_dataset(official).to_zarr(path, zarr_format=2)
    return path


def _contents(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _stats_refused(tmp_path, capsys, official, bad, text):
    """`gclab stats` of `bad` is one line ending in `text`, and a good folder stays whole."""
    good, path, out = tmp_path / "good.nc", tmp_path / "bad.nc", tmp_path / "stats"
    wd.write_dataset(official, good)
    wd.write_dataset(bad, path)
    assert cli.main(["stats", "--data", str(good), "--out", str(out)]) == 0
    capsys.readouterr()
    before = _contents(out)
    assert cli.main(["stats", "--data", str(path), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"gclab stats: error: --data: {path}: {text}\n"
    assert _contents(out) == before


def _repeated_levels(official):
    three = SyntheticWeather(TaskConfig(pressure_levels=(500, 700, 850)), RESOLUTION, seed=4)
    return wd.synthetic_dataset(three, frames=4).assign_coords(level=[500, 500, 850])


def test_repeated_levels_are_refused_by_every_reader(tmp_path, official, capsys):
    # check_dataset (forecast, train) ended in pandas' InvalidIndexError; stats took them.
    ds = _repeated_levels(official)
    text = "level repeats 500; each pressure level may be there once"
    for call in (lambda: wd.check_dataset(ds, TASK), lambda: wd.compute_stats(ds)):
        with pytest.raises(wd.DataError) as e:
            call()
        assert str(e.value) == f"dataset: {text}"
    _stats_refused(tmp_path, capsys, official, ds, text)


@pytest.mark.parametrize("kind", ["scalar", "per batch row"])
def test_a_datetime_not_on_time_is_refused_naming_it(official, kind):
    # Else progress forcings without time: a shape error inside numpy, or statistics of a
    # constant 'year_progress_sin' blamed on the file.
    first = official.datetime.values[:, 0]  # [B]
    if kind == "scalar":
        ds = official.drop_vars("datetime").assign_coords(datetime=((), first[0]))
        held = f"a scalar coordinate ({first[0].astype('datetime64[m]')})"
    else:
        ds = official.drop_vars("datetime").assign_coords(datetime=("batch", first))
        held = "a coordinate on ('batch',)"
    want = f"dataset: datetime is {held}; {ON_TIME}"
    for call in (lambda: wd.check_dataset(ds, TASK), lambda: wd.compute_stats(ds),
                 lambda: wd.add_derived_vars(ds), lambda: wd.check_times(ds)):
        with pytest.raises(wd.DataError) as e:
            call()
        assert str(e.value) == want


@pytest.mark.parametrize("missing", ["land_sea_mask", "toa_incident_solar_radiation"])
def test_stats_without_a_variable_a_task_reads_are_not_written(tmp_path, official, capsys,
                                                               missing):
    bad = official.drop_vars(missing)
    text = f"missing variable {missing!r} (needed: {', '.join(sorted(wd.DATASET_VARIABLES))})"
    with pytest.raises(wd.DataError) as e:
        wd.compute_stats(bad)
    assert str(e.value) == f"dataset: {text}"
    _stats_refused(tmp_path, capsys, official, bad, text)


def test_stats_of_atmospheric_variables_without_level_are_not_written(official):
    # One variable at one level, its level dropped: a 0-d statistic no task reads by level.
    flat = official.assign(temperature=official.temperature.isel(level=0, drop=True))
    with pytest.raises(wd.DataError, match="^dataset: variable 'temperature' has dims "
                                           r"\('batch', 'time', 'lat', 'lon'\); an "
                                           "atmospheric variable's dims are time, level"):
        wd.compute_stats(flat)
    # No level coordinate at all (the dim kept).
    with pytest.raises(wd.DataError) as e:
        wd.compute_stats(official.drop_vars("level"))
    assert str(e.value) == ("dataset: no 'level' coordinate (the atmospheric variables' "
                            "statistics are by level)")


@pytest.mark.parametrize("dim", ["lat", "lon", "level"])
def test_stats_of_an_empty_dim_are_refused_in_one_line(official, dim):
    # An empty lat was reported as an overflow, with numpy's RuntimeWarning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(wd.DataError) as e:
            wd.compute_stats(official.isel({dim: slice(0, 0)}))
    assert str(e.value) == f"dataset: {dim} has no values"


def test_raw_example_reads_north_to_south_latitudes_south_to_north(official):
    s2n = wd.add_derived_vars(official)
    n2s = s2n.isel(lat=slice(None, None, -1))
    assert float(n2s.lat[0]) == 90.0
    for name, a, b in zip(wd.RawExample._fields, wd.raw_example(n2s, TASK, rollout=2),
                          wd.raw_example(s2n, TASK, rollout=2)):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("both", [("latitude", "lat"), ("longitude", "lon")])
def test_a_store_with_both_names_is_refused_naming_both(tmp_path, official, capsys, both):
    old, new = both
    wb2 = weatherbench_dataset(official)
    wb2 = wb2.assign_coords({new: (old, np.arange(wb2.sizes[old], dtype=np.float32))})
    path = tmp_path / "both.zarr"
    wb2.to_zarr(path, zarr_format=2)
    text = (f"WeatherBench2 dataset: it has both {old!r} and {new!r}; {old!r} is read as "
            f"{new!r}, so only one of them may be there")
    for call in (lambda: wd.open_dataset(path), lambda: open_era5(path)):
        with pytest.raises(wd.DataError) as e:
            call()
        assert str(e.value) == f"{path}: {text}"
    assert cli.main(["stats", "--data", str(path), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert err == f"gclab stats: error: --data {path}: {text} (see gclab stats --help)\n"


@pytest.mark.parametrize("levels, error, why", [
    (500, TypeError, ", not an int"),
    ("500", TypeError, ", not a str"),
    ([500, 500], ValueError, "; 500 repeats"),
    ([], ValueError, ""),
    ([500, None], TypeError, "; None is not a number"),
    ([True], TypeError, "; True is not a number"),
])
def test_open_era5_levels_must_be_distinct_numbers(tmp_path, store, levels, error, why):
    want = f"levels={levels!r} is invalid: {LEVELS}{why}"
    with pytest.raises(error) as e:
        open_era5(store, levels=levels)
    assert str(e.value) == want
    # Before the store is looked at, and the same where the dataset is given.
    with pytest.raises(error, match="^levels="):
        open_era5(tmp_path / "none.zarr", levels=levels)
    with pytest.raises(error) as e:
        to_official_layout(weatherbench_dataset(wd.synthetic_dataset(
            SyntheticWeather(TASK, RESOLUTION, seed=4), frames=3)), levels=levels)
    assert str(e.value) == want
    # Numbers of either kind, in any order, select those levels.
    assert open_era5(store, levels=[850.0, 500]).level.values.tolist() == [850, 500]


def test_training_names_the_batch_row_of_a_value_that_is_not_finite(weather):
    ds = wd.synthetic_dataset(weather, frames=4, batch_starts=(0, 4)).copy(deep=True)
    ds["2m_temperature"][1, 2, 0, 0] = np.nan
    when = str(ds.datetime.values[1, 2].astype("datetime64[m]"))
    stats = wd.compute_stats(wd.synthetic_dataset(weather, frames=6))
    source = wd.DatasetWeather(ds, TASK, stats, weather.grid_lat, weather.grid_lon)
    per_row = source.windows(1) // 2  # windows 0, 1 are row 0's, 2, 3 row 1's
    source.raw_batch(per_row, rollout=1, start=1)  # row 0: nothing wrong there
    with pytest.raises(wd.DataError) as e:
        source.raw_batch(1, rollout=1, start=1 + per_row * SAMPLE_SPACING)  # row 1, frames 0..2
    assert str(e.value) == ("dataset: variable '2m_temperature' holds a non-finite value "
                            f"(nan) at time step 2 ({when}) of batch row 1")
