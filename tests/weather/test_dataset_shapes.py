"""Datasets of other shapes than the official demo's: what is read as the official layout
would be, and what is refused in one line naming the file and the field."""

import numpy as np
import pytest
import xarray

from gclab.config import FORCING_VARIABLES, ModelConfig, TaskConfig
from gclab.training.data import SyntheticWeather
from gclab.weather import dataset as wd

TASK = TaskConfig(pressure_levels=(500, 850))
CFG = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=16, processor_steps=2)
PROGRESS = ["year_progress", "year_progress_sin", "year_progress_cos", "day_progress",
            "day_progress_sin", "day_progress_cos"]


@pytest.fixture(scope="module")
def weather():
    return SyntheticWeather(TASK, CFG.resolution, seed=0)


@pytest.fixture(scope="module")
def ds(weather):
    """Batch rows 0 and 1 (the same frames), 4 time steps, in memory."""
    return wd.synthetic_dataset(weather, frames=4, batch_starts=(0, 0))


@pytest.fixture(scope="module")
def written(tmp_path_factory, ds):
    path = tmp_path_factory.mktemp("shapes") / "data.nc"
    wd.write_dataset(ds, path)
    return path


def _same_examples(got, want):
    for name, a, b in zip(got._fields, got, want):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_statistics_of_one_time_step_are_refused_naming_the_file(tmp_path, ds):
    # Not an IndexError from inside (an empty 6-hour change: NaN standard deviations).
    path = tmp_path / "one.nc"
    wd.write_dataset(ds.isel(time=[0]), path)
    with pytest.raises(wd.DataError, match=f"^{path}: the dataset has 1 time step; the "
                       r"standard deviation of the 6-hour change \(diffs_stddev_by_level.nc\) "
                       "needs at least 2 time steps$"):
        wd.compute_stats(wd.open_dataset(path))
    with pytest.raises(wd.DataError, match="^dataset: the dataset has no 'time' dimension;"):
        wd.compute_stats(ds.isel(time=0, drop=True))
    wd.compute_stats(ds.isel(time=[0, 1]))  # two are enough


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_statistics_that_overflow_are_named_not_an_index_error(ds):
    # Finite values whose float64 sums are not: no value to point at (not an IndexError).
    big = ds.assign({"2m_temperature": ds["2m_temperature"].astype(np.float64) * 0 + 1e308})
    with pytest.raises(wd.DataError, match="^dataset: variable '2m_temperature' holds finite "
                                           r"values whose mean or standard deviation is not "
                                           r"finite \(they overflow float64\)$"):
        wd.compute_stats(big)


@pytest.mark.parametrize("kept", [["year_progress"], ["day_progress"],
                                  ["year_progress_sin", "day_progress_cos"], PROGRESS[:3]])
def test_progress_features_the_dataset_lacks_are_added(ds, kept):
    # A dataset with year_progress but not its sin/cos ended in a KeyError when read.
    full = wd.add_derived_vars(ds)
    part = full.drop_vars([k for k in PROGRESS if k not in kept])
    got = wd.check_dataset(part, TASK)
    for name in PROGRESS:
        np.testing.assert_allclose(got[name].transpose(*full[name].dims).values,
                                   full[name].values, atol=1e-6, err_msg=name)
    assert all(f in got.data_vars for f in FORCING_VARIABLES)
    _same_examples(wd.raw_example(got, TASK), wd.raw_example(wd.check_dataset(ds, TASK), TASK))


def test_the_datasets_own_progress_is_kept_and_datetime_then_not_needed(ds):
    full = wd.add_derived_vars(ds)
    own = full.assign(year_progress=full.year_progress * 0 + np.float32(0.25))
    got = wd.add_derived_vars(own.drop_vars(["year_progress_sin", "year_progress_cos"]))
    np.testing.assert_allclose(got.year_progress_sin.values, 1.0, atol=1e-6)
    np.testing.assert_allclose(got.year_progress_cos.values, 0.0, atol=1e-6)
    wd.check_dataset(full.drop_vars("datetime"), TASK)  # all six there: no datetime needed
    # The network reads only the sin and cos: without the progress itself, none needed.
    got = wd.check_dataset(full.drop_vars(["datetime", "year_progress", "day_progress"]), TASK)
    assert "year_progress" not in got.data_vars
    with pytest.raises(wd.DataError, match="^dataset: the dataset has no 'datetime' "
                                           "coordinate .needed to compute the day_progress_sin "
                                           "and day_progress_cos forcings, which it lacks.$"):
        wd.check_dataset(full.drop_vars(["datetime", "day_progress", "day_progress_sin"]),
                         TASK)


def test_one_datetime_for_all_batch_rows_is_broadcast(ds):
    # One `datetime` on `time` with 2 batch rows: progress forcings of one row against the
    # radiation's two ended in numpy's "all input arrays must have the same shape".
    shared = ds.assign_coords(datetime=("time", ds.datetime.values[0]))
    got = wd.raw_example(wd.check_dataset(shared, TASK), TASK, rollout=2)
    _same_examples(got, wd.raw_example(wd.check_dataset(ds, TASK), TASK, rollout=2))
    assert got.inputs.shape[1] == 2
    # A surface variable without `batch` is the same in every row too.
    one = ds.assign({"2m_temperature": ds["2m_temperature"].isel(batch=0)})
    _same_examples(wd.raw_example(wd.check_dataset(one, TASK), TASK),
                   wd.raw_example(wd.check_dataset(ds, TASK), TASK))


def _surface_with_level(ds):
    t = ds["2m_temperature"].expand_dims(level=ds.level)
    return ds.assign({"2m_temperature": t.transpose("batch", "time", "level", "lat", "lon")})


SURFACE = "a surface variable's dims are time, lat, lon and, optionally, batch"


@pytest.mark.parametrize("change, name, dims, allowed", [
    (_surface_with_level, "2m_temperature", "('batch', 'time', 'level', 'lat', 'lon')",
     SURFACE),
    (lambda ds: ds.assign({"2m_temperature": ds["2m_temperature"].expand_dims(member=2)}),
     "2m_temperature", "('member', 'batch', 'time', 'lat', 'lon')", SURFACE),
    (lambda ds: ds.assign({"temperature": ds["temperature"].isel(level=0)}), "temperature",
     "('batch', 'time', 'lat', 'lon')",
     "an atmospheric variable's dims are time, level, lat, lon and, optionally, batch"),
    (lambda ds: ds.assign({"land_sea_mask": ds["land_sea_mask"].expand_dims(member=2)}),
     "land_sea_mask", "('member', 'lat', 'lon')",
     "a static variable's dims are lat, lon and, optionally, batch, time"),
    (lambda ds: ds.assign({"toa_incident_solar_radiation":
                           ds["toa_incident_solar_radiation"].isel(time=0, drop=True)}),
     "toa_incident_solar_radiation", "('batch', 'lat', 'lon')", SURFACE),
    (lambda ds: ds.assign(year_progress=ds["land_sea_mask"]), "year_progress",
     "('lat', 'lon')", "a forcing variable's dims are time and, optionally, batch, lat, lon"),
])
def test_variables_with_dims_their_kind_does_not_allow_are_named(tmp_path, ds, change, name,
                                                                  dims, allowed):
    # Not numpy's or xarray's messages from inside (or, for `member`, a reshape's).
    path = tmp_path / "dims.nc"
    wd.write_dataset(change(ds), path)
    with pytest.raises(wd.DataError) as e:
        wd.check_dataset(wd.open_dataset(path), TASK)
    assert str(e.value) == f"{path}: variable {name!r} has dims {dims}; {allowed}"


def test_a_static_variable_with_time_and_batch_is_taken_at_the_first(ds):
    # As some ERA5 downloads hold the land-sea mask: not a shape error inside numpy. Each
    # (batch, time) entry differs, so that the first is told from any other.
    lsm = ds["land_sea_mask"].expand_dims(batch=2, time=ds.sizes["time"])
    lsm = lsm + xarray.DataArray(0.01 * np.arange(lsm.sizes["batch"] * lsm.sizes["time"])
                                 .reshape(lsm.sizes["batch"], -1), dims=("batch", "time"))
    first = ds["land_sea_mask"].copy(data=lsm.transpose("batch", "time", ...).values[0, 0])
    got = wd.check_dataset(ds.assign(land_sea_mask=lsm), TASK)
    assert got["land_sea_mask"].dims == ("lat", "lon")
    np.testing.assert_array_equal(got["land_sea_mask"].values, first.values)
    _same_examples(wd.raw_example(got, TASK),
                   wd.raw_example(wd.check_dataset(ds.assign(land_sea_mask=first), TASK), TASK))


@pytest.mark.parametrize("coord, values, held", [
    ("time", np.arange(4) * 6, "int64"),
    ("time", np.arange(4) * 6.0, "float64"),
    ("datetime", np.arange(8).reshape(2, 4) * 6, "int64"),
])
def test_times_that_are_plain_numbers_are_refused(written, coord, values, held):
    # A `time` of hours gave a forecast's lead times in nanoseconds (6 ns, 12 ns, ...).
    ds = wd.open_dataset(written)
    dims = ds.coords[coord].dims
    bad = ds.assign_coords({coord: (dims, values)})
    allowed = ("datetimes (datetime64; in netCDF, units such as 'hours since 1970-01-01' in "
               "the standard calendar)" if coord == "datetime" else
               "lead times (timedelta64; in netCDF, units such as 'hours') or datetimes "
               "(datetime64)")
    want = f"{written}: {coord} holds {held} values, it must hold {allowed}"
    for check in (lambda: wd.check_times(bad), lambda: wd.check_dataset(bad, TASK),
                  lambda: wd.compute_stats(bad)):
        with pytest.raises(wd.DataError) as e:
            check()
        assert str(e.value) == want
    wd.check_dataset(ds.drop_vars("time"), TASK)  # no lead times at all is fine


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_lead_times_stored_as_hours_are_read_as_lead_times(tmp_path, ds, suffix):
    # The official demo datasets store `time` as numbers with units "hours"; recent xarray
    # reads those as plain numbers unless asked to decode them, and plain numbers are
    # refused (test_times_that_are_plain_numbers_are_refused).
    hours = (ds.time.values / np.timedelta64(1, "h")).astype(np.int64)
    stored = ds.assign_coords(time=("time", hours, {"units": "hours"}))
    path = tmp_path / f"hours{suffix}"
    if suffix == ".zarr":
        stored.to_zarr(path)
    else:
        stored.to_netcdf(path)
    opened = wd.open_dataset(path)
    assert opened.time.dtype.kind == "m"
    np.testing.assert_array_equal(opened.time.values, ds.time.values)
    _same_examples(wd.raw_example(wd.check_dataset(opened, TASK), TASK),
                   wd.raw_example(wd.check_dataset(ds, TASK), TASK))
