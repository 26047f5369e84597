"""Statistics gclab would refuse to read are refused where they are computed: a dataset in
which a variable never varies, or never changes between time steps, gets one line naming
the file, variable and level, and nothing is written (a good statistics folder stays)."""

import numpy as np
import pytest

from gclab import cli
from gclab.config import TaskConfig
from gclab.training.data import SyntheticWeather
from gclab.weather import dataset as wd

TASK = TaskConfig(pressure_levels=(500, 850))
RESOLUTION = 10.0
STD = "a standard deviation must be a finite number > 0"


@pytest.fixture(scope="module")
def official():
    return wd.synthetic_dataset(SyntheticWeather(TASK, RESOLUTION, seed=3), frames=4)


def _constant_temperature_at_500(ds):
    ds = ds.copy(deep=True)
    ds["temperature"].loc[{"level": 500}] = 250.0
    return ds


def _no_precipitation(ds):
    ds = ds.copy(deep=True)
    ds["total_precipitation_6hr"].values[...] = 0.0
    return ds


def _identical_frames(ds):
    """Every weather variable's frames all equal its first; the times still step 6 hours."""
    ds = ds.copy(deep=True)
    for name in wd.TARGET_VARIABLES:
        v = ds[name]
        ds[name] = v.copy(data=np.broadcast_to(v.isel(time=[0]).values, v.shape).copy())
    return ds


CASES = {
    "constant temperature at 500": (
        _constant_temperature_at_500,
        f"'temperature' at level 500 never varies in this data: its standard deviation is 0, "
        f"and {STD}"),
    "all-zero precipitation": (
        _no_precipitation,
        f"'total_precipitation_6hr' never varies in this data: its standard deviation is 0, "
        f"and {STD}"),
    "identical frames": (
        _identical_frames,
        f"'2m_temperature' never changes from one time step to the next in this data: the "
        f"standard deviation of its 6-hour change (diffs_stddev_by_level.nc) is 0, and {STD}"),
}


def _contents(folder):
    """Every file under `folder` (its relative path) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("case", CASES)
def test_compute_stats_refuses_what_load_stats_would_refuse(tmp_path, official, case):
    change, text = CASES[case]
    path = tmp_path / "bad.nc"
    wd.write_dataset(change(official), path)
    with pytest.raises(wd.DataError) as e:
        wd.compute_stats(wd.open_dataset(path))
    assert str(e.value) == f"{path}: {text}"
    # The same in memory (no file to name).
    with pytest.raises(wd.DataError, match="^dataset: '"):
        wd.compute_stats(change(official))


@pytest.mark.parametrize("case", CASES)
def test_stats_command_keeps_the_good_folder(tmp_path, official, capsys, case):
    change, text = CASES[case]
    good, bad, out = tmp_path / "good.nc", tmp_path / "bad.nc", tmp_path / "stats"
    # A variable gclab never reads may be constant (GenCast's files have more variables):
    # its statistics are written as computed, and the folder reads.
    extra = official.assign(sea_surface_temperature=official["2m_temperature"] * 0 + 271.0)
    wd.write_dataset(extra, good)
    wd.write_dataset(change(official), bad)
    assert cli.main(["stats", "--data", str(good), "--out", str(out)]) == 0
    capsys.readouterr()
    before = _contents(out)
    assert len(before) == 3
    assert float(wd.load_stats(out).stddev["sea_surface_temperature"]) == 0.0
    assert cli.main(["stats", "--data", str(bad), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"gclab stats: error: --data: {bad}: {text}\n"
    assert _contents(out) == before  # byte for byte: the old set stays usable
    wd.load_stats(out)
    # Nor is a folder made where there was none.
    fresh = tmp_path / "fresh"
    assert cli.main(["stats", "--data", str(bad), "--out", str(fresh)]) == 2
    assert not fresh.exists()
