"""The data extra's packages imported in one way, and latitude sorted south to north by one
rule, whichever entry point reads the dataset."""

import sys

import numpy as np
import pytest
import xarray

from gclab.config import TaskConfig
from gclab.training.data import SyntheticWeather
from gclab.weather import DataError, dataset, era5, open_dataset, synthetic_dataset
from gclab.weather.dataset import lat_south_to_north, official_layout
from gclab.weather.era5 import open_era5, to_official_layout, weatherbench_dataset

EXTRA = ("is not installed: reading and writing weather files needs the data extra "
         "(pip install 'gclab[data]')")


@pytest.fixture(scope="module")
def unsorted(tmp_path_factory):
    """The official dataset, and it and its WeatherBench2 twin (also as a zarr store) with
    latitudes in no order."""
    official = synthetic_dataset(SyntheticWeather(TaskConfig(pressure_levels=(500, 850)), 10.0),
                                 frames=3)
    perm = np.random.default_rng(0).permutation(official.sizes["lat"])
    lat = official["lat"].values[perm]
    assert np.any(np.diff(lat) < 0) and np.any(np.diff(lat) > 0)  # neither S->N nor N->S
    wb2 = weatherbench_dataset(official).isel(latitude=perm)
    path = tmp_path_factory.mktemp("extras") / "unsorted.zarr"
    wb2.chunk({"time": 1}).to_zarr(path, zarr_format=2)
    return official, official.isel(lat=perm), wb2, path


@pytest.mark.parametrize("module", ["xarray", "dask", "zarr"])
def test_open_era5_without_the_data_extra_is_one_line_naming_it(unsorted, monkeypatch, module):
    path = unsorted[3]
    monkeypatch.setitem(sys.modules, module, None)  # as where it is not installed
    with pytest.raises(DataError) as e:
        open_era5(path)
    assert str(e.value) == f"{module} {EXTRA}"


@pytest.mark.parametrize("entry", ["official_layout", "to_official_layout", "open_era5",
                                   "open_dataset"])
def test_latitude_is_sorted_once_by_one_rule(unsorted, monkeypatch, entry):
    official, shuffled, wb2, path = unsorted
    rules, sorts = [], []

    def rule(ds):
        rules.append(entry)
        return lat_south_to_north(ds)

    sortby = xarray.Dataset.sortby

    def counted_sortby(self, variables, *args, **kwargs):
        sorts.append(variables)
        return sortby(self, variables, *args, **kwargs)

    monkeypatch.setattr(dataset, "lat_south_to_north", rule)
    monkeypatch.setattr(era5, "lat_south_to_north", rule)
    monkeypatch.setattr(xarray.Dataset, "sortby", counted_sortby)
    out = {"official_layout": lambda: official_layout(shuffled),
           "to_official_layout": lambda: to_official_layout(wb2),
           "open_era5": lambda: open_era5(path),
           "open_dataset": lambda: open_dataset(path)}[entry]()
    assert rules  # the shared rule did it, not a sort of the entry point's own
    assert sorts == ["lat"]  # one sort, however many steps the dataset went through
    np.testing.assert_array_equal(out["lat"].values, official["lat"].values)  # S->N
    for name in ("temperature", "2m_temperature", "land_sea_mask"):
        np.testing.assert_array_equal(out[name].values, official[name].values)


def test_a_dataset_already_south_to_north_is_not_sorted_again(unsorted, monkeypatch):
    official = unsorted[0]
    monkeypatch.setattr(xarray.Dataset, "sortby", lambda *a, **k: pytest.fail("sorted"))
    assert lat_south_to_north(official) is official


def test_forecast_without_xarray_is_one_line_naming_the_extra(monkeypatch):
    from gclab.weather.forecast import forecast

    monkeypatch.setitem(sys.modules, "xarray", None)  # as where it is not installed
    with pytest.raises(DataError) as e:
        forecast(None, None, None, 1)
    assert str(e.value) == f"xarray {EXTRA}"
