"""Weather in the official layout: synthetic weather round trip, statistics, channel order."""

import jax
import numpy as np
import pytest

from gclab.config import ModelConfig, TaskConfig
from gclab.training.data import SAMPLE_SPACING, SyntheticWeather
from gclab.weather import dataset as wd

TASK = TaskConfig(pressure_levels=(500, 850))
CFG = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=16, processor_steps=2)


@pytest.fixture(scope="module")
def weather():
    return SyntheticWeather(TASK, CFG.resolution, seed=0)


@pytest.fixture(scope="module")
def written(tmp_path_factory, weather):
    path = tmp_path_factory.mktemp("data") / "synthetic.nc"
    ds = wd.synthetic_dataset(weather, frames=5, start=0, batch_starts=(0, SAMPLE_SPACING))
    wd.write_dataset(ds, path)
    return path


def test_written_file_has_the_official_layout(written):
    ds = wd.open_dataset(written)
    assert set(ds.dims) == {"batch", "time", "lat", "lon", "level"}
    assert ds["datetime"].dims == ("batch", "time")
    assert ds["datetime"].dtype == np.dtype("datetime64[ns]")
    assert ds["time"].dtype == np.dtype("timedelta64[ns]")
    assert ds["temperature"].dims == ("batch", "time", "level", "lat", "lon")
    assert ds["land_sea_mask"].dims == ("lat", "lon")
    assert float(ds.lat[0]) == -90.0 and float(ds.lat[-1]) == 90.0
    assert "year_progress_sin" not in ds  # recomputed on reading, as the official code does


@pytest.mark.parametrize("rollout", [1, 2])
def test_synthetic_weather_read_back_gives_the_same_examples(written, weather, rollout):
    ds = wd.check_dataset(wd.open_dataset(written), TASK, weather.grid_lat, weather.grid_lon)
    got = wd.raw_example(ds, TASK, start=0, rollout=rollout)
    want = weather.raw_batch(2, rollout=rollout, start=1)
    for name, a, b in zip(got._fields, got, want):
        assert a.shape == b.shape, name
        assert a.dtype == np.float32, name
        # Weather variables are written as float32 and read back exactly; the progress
        # forcings are recomputed from `datetime` (float32 rounding).
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=2e-6, err_msg=name)
    C = TASK.data_channels
    V = (C - 17) // 2
    np.testing.assert_array_equal(got.inputs[..., :2 * V + 1], want.inputs[..., :2 * V + 1])
    np.testing.assert_array_equal(got.targets, want.targets)
    norm = weather.normalization()
    ex_a, ex_b = norm.normalise(got), norm.normalise(want)
    for a, b in zip(ex_a, ex_b):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_progress_forcings_follow_the_official_definition(written):
    ds = wd.add_derived_vars(wd.open_dataset(written))
    seconds = ds.datetime.values.astype("datetime64[s]").astype(np.int64)  # [B, T]
    year = np.mod(seconds / 86400 / 365.24219, 1.0)
    np.testing.assert_allclose(ds.year_progress.values, year, atol=1e-7)
    assert ds.day_progress.dims == ("batch", "time", "lon")
    day = np.mod(np.mod(seconds, 86400)[..., None] / 86400 + ds.lon.values / 360.0, 1.0)
    np.testing.assert_allclose(ds.day_progress.values, day, atol=1e-6)
    np.testing.assert_allclose(ds.day_progress_cos.values,
                               np.cos(2 * np.pi * ds.day_progress.values), atol=1e-6)


def test_statistics_equal_numpy(tmp_path, written):
    ds = wd.open_dataset(written).load()
    stats = wd.compute_stats(ds)
    t = ds["temperature"].values.astype(np.float64)  # [B, T, level, lat, lon]
    np.testing.assert_allclose(stats.mean["temperature"].values, t.mean((0, 1, 3, 4)))
    np.testing.assert_allclose(stats.stddev["temperature"].values, t.std((0, 1, 3, 4)))
    np.testing.assert_allclose(stats.diffs_stddev["temperature"].values,
                               np.diff(t, axis=1).std((0, 1, 3, 4)))
    z = ds["land_sea_mask"].values.astype(np.float64)
    assert float(stats.mean["land_sea_mask"]) == pytest.approx(z.mean())
    assert "land_sea_mask" not in stats.diffs_stddev
    assert stats.mean["temperature"].dims == ("level",)
    assert "year_progress_sin" in stats.mean
    wd.write_stats(stats, tmp_path)
    back = wd.load_stats(tmp_path)
    np.testing.assert_array_equal(back.mean["temperature"].values,
                                  stats.mean["temperature"].values)
    norm = wd.normalization_from_stats(back, TASK)
    assert norm.input_mean.shape == (TASK.data_channels,)
    names = TASK.target_channel_names
    i = names.index("temperature@850")
    assert norm.target_mean[i] == pytest.approx(t[:, :, 1].mean())
    assert norm.residual_std[i] == pytest.approx(np.diff(t, axis=1)[:, :, 1].std())
    assert norm.residual_scale[i] == pytest.approx(norm.residual_std[i] / norm.target_std[i])


def test_channel_permutations_sort_variables_like_the_official_stacking():
    perm_in, perm_out = wd.channel_permutations(TASK)
    assert sorted(perm_in) == list(range(TASK.data_channels))
    assert sorted(perm_out) == list(range(TASK.output_channels))
    names_in = wd.input_channels(TASK)
    official = [names_in[i] for i in perm_in]
    assert official[:2] == [("10m_u_component_of_wind", 0, None),
                            ("10m_u_component_of_wind", 1, None)]
    assert official[-5:] == [(f, 2, None) for f in sorted(
        ["toa_incident_solar_radiation", "year_progress_sin", "year_progress_cos",
         "day_progress_sin", "day_progress_cos"])]
    i = official.index(("geopotential", 0, 500))
    assert official[i:i + 4] == [("geopotential", 0, 500), ("geopotential", 0, 850),
                                 ("geopotential", 1, 500), ("geopotential", 1, 850)]
    names_out = wd.target_channels(TASK)
    assert [names_out[i] for i in perm_out][:3] == [
        ("10m_u_component_of_wind", None), ("10m_v_component_of_wind", None),
        ("2m_temperature", None)]


def test_permuted_weights_give_the_same_outputs_in_the_other_order():
    from gclab.geometry import build_graphs
    from gclab.model import graph_inputs, make_network
    graphs = build_graphs(CFG.resolution, CFG.mesh_splits)
    graph = graph_inputs(graphs)
    net = make_network(CFG, TASK.data_channels, TASK.output_channels)
    x = np.random.default_rng(0).normal(size=(CFG.num_grid_nodes, 1, TASK.data_channels))
    x = x.astype(np.float32)
    official = jax.tree_util.tree_map(np.asarray, net.init(jax.random.PRNGKey(1), graph, x))
    perm_in, perm_out = wd.channel_permutations(TASK)
    ours = wd.params_to_gclab_channels(official, TASK, CFG.hidden_layers)
    x_gclab = np.empty_like(x)
    x_gclab[..., perm_in] = x  # official channel j is gclab channel perm_in[j]
    y_official = np.asarray(net.apply(official, graph, x))
    y_gclab = np.asarray(net.apply(ours, graph, x_gclab))
    np.testing.assert_allclose(y_gclab[..., perm_out], y_official, rtol=1e-5, atol=1e-5)
    back = wd.params_to_official_channels(ours, TASK, CFG.hidden_layers)
    for m in official:
        for n in official[m]:
            assert back[m][n].tobytes() == official[m][n].tobytes()


def test_bad_datasets_name_the_field(tmp_path, written):
    ds = wd.open_dataset(written).load()
    with pytest.raises(wd.DataError, match="missing variable 'geopotential'"):
        wd.check_dataset(ds.drop_vars("geopotential"), TASK)
    with pytest.raises(wd.DataError, match=r"level has no pressure levels \[700\]"):
        wd.check_dataset(ds, TaskConfig(pressure_levels=(500, 700)))
    # North to south is read south to north (test_dataset_layouts), not refused.
    flipped = wd.check_dataset(ds.isel(lat=slice(None, None, -1)), TASK)
    np.testing.assert_array_equal(flipped.lat.values, ds.lat.values)
    with pytest.raises(wd.DataError, match="lon does not match the model's grid"):
        wd.check_dataset(ds, TASK, np.linspace(-90, 90, 19), np.arange(72) * 5.0)
    with pytest.raises(wd.DataError, match="no 'datetime' coordinate"):
        wd.check_dataset(ds.drop_vars("datetime"), TASK)
    with pytest.raises(wd.DataError, match="has 5 time steps"):
        wd.raw_example(wd.check_dataset(ds, TASK), TASK, start=0, rollout=4)
    (tmp_path / "junk.nc").write_bytes(b"\x89HDF\r\n\x1a\nbroken")
    with pytest.raises(wd.DataError, match="not a readable netCDF"):
        wd.open_dataset(tmp_path / "junk.nc")
    with pytest.raises(wd.DataError, match="no such file"):
        wd.open_dataset(tmp_path / "none.nc")
    with pytest.raises(wd.DataError, match="not a folder"):
        wd.load_stats(tmp_path / "none")
    stats = wd.compute_stats(ds)
    with pytest.raises(wd.DataError, match="diffs_stddev_by_level.nc: no variable "
                                           "'2m_temperature'"):
        wd.normalization_from_stats(stats._replace(
            diffs_stddev=stats.diffs_stddev.drop_vars("2m_temperature")), TASK)



MEAN = "a mean must be finite"
STD = "a standard deviation must be a finite number > 0"


@pytest.mark.parametrize("file, name, value, text", [
    ("mean_by_level.nc", "temperature", np.nan, f"'temperature' at level 500 is nan ({MEAN})"),
    ("stddev_by_level.nc", "2m_temperature", 0.0, f"'2m_temperature' is 0 ({STD})"),
    ("stddev_by_level.nc", "land_sea_mask", np.nan, f"'land_sea_mask' is nan ({STD})"),
    ("diffs_stddev_by_level.nc", "geopotential", -1.0,
     f"'geopotential' at level 500 is -1 ({STD})"),
])
def test_statistics_that_would_make_nan_are_refused(tmp_path, written, file, name, value,
                                                    text):
    stats = wd.compute_stats(wd.open_dataset(written))
    kind = {v: k for k, v in wd.STATS_FILES.items()}[file]
    bad = getattr(stats, kind).copy(deep=True)
    bad[name].values[...] = value
    # A variable gclab does not read may hold anything (GenCast's files have more).
    bad["sea_surface_temperature"] = bad["2m_temperature"] * np.nan
    bad_stats = stats._replace(**{kind: bad})
    wd.write_stats(bad_stats, tmp_path)
    with pytest.raises(wd.DataError) as e:
        wd.load_stats(tmp_path)
    assert str(e.value) == f"{tmp_path / file}: {text}"
    # Statistics made in memory are checked as they are used.
    with pytest.raises(wd.DataError, match=f"^{file}: '{name}'"):
        wd.normalization_from_stats(bad_stats, TASK)


def _rewritten(path, ds):
    wd.write_dataset(ds, path)
    return wd.open_dataset(path)


def test_non_finite_weather_is_refused_where_it_is_read(tmp_path, written, weather):
    clean = wd.open_dataset(written).load()  # batch rows 0 and 1, time steps 0..4
    ds = clean.copy(deep=True)
    ds["temperature"][1, 3, 0, 2, 5] = np.nan
    path = tmp_path / "nan.nc"
    nan = _rewritten(path, ds)
    when = str(ds.datetime.values[1, 3].astype("datetime64[m]"))
    text = (f"{path}: variable 'temperature' holds a non-finite value (nan) at time step 3 "
            f"({when}) of batch row 1")
    checked = wd.check_dataset(nan, TASK)
    wd.raw_example(checked, TASK, start=0, rollout=1)  # frames 0..2: nothing is wrong there
    with pytest.raises(wd.DataError) as e:
        wd.raw_example(checked, TASK, start=1, rollout=1)  # frames 1..3
    assert str(e.value) == text
    # A forecast reads the target frames for their forcings only: their weather may be NaN.
    wd.raw_example(checked, TASK, start=1, rollout=1, check_targets=False)
    with pytest.raises(wd.DataError) as e:
        wd.raw_example(checked, TASK, start=2, rollout=1, check_targets=False)  # an input
    assert str(e.value) == text
    with pytest.raises(wd.DataError) as e:  # the statistics' pass over the data finds it too
        wd.compute_stats(nan)
    assert str(e.value) == text
    # Training reads one window at a time: the window with the bad frame stops the run.
    stats = wd.compute_stats(ds.isel(time=slice(0, 3)))
    source = wd.DatasetWeather(nan, TASK, stats, weather.grid_lat, weather.grid_lon)
    source.make_batch(2, rollout=1, start=1)  # windows of row 0
    with pytest.raises(wd.DataError) as e:  # the row is named, as where the file is read
        source.make_batch(1, rollout=1, start=1 + 4 * SAMPLE_SPACING)  # row 1, frames 1..3
    assert str(e.value) == text
    # Infinity in a forcing; NaN in a static field, which has no time step.
    inf = clean.copy(deep=True)
    inf["toa_incident_solar_radiation"][0, 2, 0, 0] = np.inf
    with pytest.raises(wd.DataError, match="variable 'toa_incident_solar_radiation' holds a "
                                           "non-finite value \\(inf\\) at time step 2"):
        wd.raw_example(wd.check_dataset(_rewritten(tmp_path / "inf.nc", inf), TASK), TASK)
    static = clean.copy(deep=True)
    static["land_sea_mask"][4, 4] = np.nan
    with pytest.raises(wd.DataError) as e:
        wd.compute_stats(_rewritten(tmp_path / "static.nc", static))
    assert str(e.value) == (f"{tmp_path / 'static.nc'}: variable 'land_sea_mask' holds a "
                            f"non-finite value (nan)")
    # Text where numbers belong is not read as numbers (nor taken for a damaged chunk).
    text = clean.assign(land_sea_mask=clean.land_sea_mask.astype(str))
    for read in (lambda: wd.raw_example(wd.check_dataset(text, TASK), TASK),
                 lambda: wd.compute_stats(text)):
        with pytest.raises(wd.DataError, match=f"^{written}: variable 'land_sea_mask' must hold "
                                               "numbers, it holds <U"):
            read()
    # A variable gclab does not read keeps xarray's NaN-skipping statistics.
    clean["sea_surface_temperature"] = clean["2m_temperature"].where(clean.lat > 0)
    got = wd.compute_stats(clean)
    assert np.isfinite(got.mean["sea_surface_temperature"].values)


def _with_datetimes(ds, hours):
    dt = ds.datetime.values[:, :1] + np.asarray(hours, "timedelta64[h]")[None]
    return ds.assign_coords(datetime=(("batch", "time"), dt.astype("datetime64[ns]")))


@pytest.mark.parametrize("hours, text", [
    ([0, 6, 12, 15, 21], "has time steps 3 hours apart (time steps 2 and 3)"),
    ([0, 6, 6, 12, 18], "repeats {t1} at time steps 1 and 2"),
    ([0, 12, 6, 18, 24], "has time steps 12 hours apart (time steps 0 and 1)"),
    ([6, 0, 12, 18, 24], "is out of order: time step 1 ({t0}) comes before time step 0 "
                         "({t1})"),
])
def test_time_axis_must_step_6_hours_forward(tmp_path, written, hours, text):
    ds = _rewritten(tmp_path / "times.nc", _with_datetimes(wd.open_dataset(written).load(),
                                                           hours))
    t0 = str(wd.open_dataset(written).datetime.values[0, 0].astype("datetime64[m]"))
    t1 = str((np.datetime64(t0) + np.timedelta64(6, "h")).astype("datetime64[m]"))
    want = (f"{tmp_path / 'times.nc'}: datetime of batch row 0 {text.format(t0=t0, t1=t1)}; "
            f"GraphCast's time steps are 6 hours apart, in increasing order")
    for check in (lambda: wd.check_dataset(ds, TASK), lambda: wd.compute_stats(ds)):
        with pytest.raises(wd.DataError) as e:
            check()
        assert str(e.value) == want


def test_lead_times_and_batch_rows_are_checked_too(written):
    ds = wd.open_dataset(written).load()
    lead = ds.assign_coords(time=ds.time.values * 2)
    with pytest.raises(wd.DataError, match=f"^{written}: time has time steps 12 hours apart"):
        wd.check_dataset(lead, TASK)
    dt = ds.datetime.values.copy()
    dt[1, 4] = dt[1, 3]
    row = ds.assign_coords(datetime=(("batch", "time"), dt))
    row.encoding = {}  # made in memory: no file to name
    with pytest.raises(wd.DataError, match="^dataset: datetime of batch row 1 repeats .* at "
                                           "time steps 3 and 4"):
        wd.check_dataset(row, TASK)


def test_precipitation_input_frames_may_be_nan_when_it_is_not_an_input(tmp_path, written):
    # The operational model's inputs (HRES) have no 6-hour precipitation; it is a target.
    task = TaskConfig(pressure_levels=TASK.pressure_levels, precipitation_input=False)
    ds = wd.open_dataset(written).load()
    ds["total_precipitation_6hr"][:, [0, 1, 3]] = np.nan
    checked = wd.check_dataset(_rewritten(tmp_path / "hres.nc", ds), task)
    raw = wd.raw_example(checked, task, start=0, rollout=1)  # inputs 0, 1; target 2
    assert np.isfinite(raw.inputs).all() and np.isfinite(raw.targets).all()
    with pytest.raises(wd.DataError, match="'total_precipitation_6hr' holds a non-finite "
                                           r"value \(nan\) at time step 3 "):
        wd.raw_example(checked, task, start=1, rollout=1)  # frame 3 is a target
    with pytest.raises(wd.DataError, match="'total_precipitation_6hr' holds a non-finite "
                                           r"value \(nan\) at time step 0 "):
        wd.raw_example(wd.check_dataset(checked, TASK), TASK)  # an input of this task
