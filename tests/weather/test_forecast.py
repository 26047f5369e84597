"""Forecasts from a written checkpoint: gclab's network on the same arrays, official layout."""

import jax.numpy as jnp
import numpy as np
import pytest

from gclab.config import ModelConfig, TaskConfig
from gclab.geometry import build_graphs
from gclab.model import graph_inputs, make_network, param_shapes
from gclab.training import next_inputs
from gclab.training.data import SyntheticWeather
from gclab.weather import (
    Checkpoint,
    DataError,
    compute_stats,
    load_stats,
    normalization_from_stats,
    open_dataset,
    params_to_gclab_channels,
    raw_example,
    read_checkpoint,
    synthetic_dataset,
    write_checkpoint,
    write_dataset,
    write_stats,
)
from gclab.weather.dataset import check_dataset
from gclab.weather.forecast import forecast

TASK = TaskConfig(pressure_levels=(500, 850))
CFG = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=16, processor_steps=2)
STEPS = 3


# Without precipitation among the inputs (as the operational task): its target is then no
# residual, and the forecast is the statistics' mean plus the scaled output.
TASK_NO_PRECIPITATION_INPUT = TaskConfig(pressure_levels=(500, 850), precipitation_input=False)


def _write_files(root, task):
    weather = SyntheticWeather(task, CFG.resolution, seed=3)
    write_dataset(synthetic_dataset(weather, frames=STEPS + 2, batch_starts=(0, 7)),
                  root / "data.nc")
    stats_ds = synthetic_dataset(weather, frames=40, start=100)
    (root / "stats").mkdir()
    write_stats(compute_stats(stats_ds), root / "stats")
    rng = np.random.default_rng(0)
    shapes = param_shapes(CFG, task.data_channels, task.output_channels)
    params = {m: {n: (0.3 * rng.standard_normal(s.shape)).astype(np.float32)
                  for n, s in leaves.items()} for m, leaves in shapes.items()}
    write_checkpoint(root / "ckpt.npz", Checkpoint.from_gclab(params, CFG, task, "test"))
    return root


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return _write_files(tmp_path_factory.mktemp("forecast"), TASK)


@pytest.fixture(scope="module")
def files_no_precipitation_input(tmp_path_factory):
    return _write_files(tmp_path_factory.mktemp("forecast_ops"), TASK_NO_PRECIPITATION_INPUT)


@pytest.mark.parametrize("task,which", [(TASK, "files"), (TASK_NO_PRECIPITATION_INPUT,
                                                          "files_no_precipitation_input")],
                         ids=["precipitation input", "no precipitation input"])
def test_forecast_equals_gclab_network_on_the_same_arrays(task, which, request):
    files = request.getfixturevalue(which)
    ckpt = read_checkpoint(files / "ckpt.npz")
    ds, stats = open_dataset(files / "data.nc"), load_stats(files / "stats")
    pred = forecast(ckpt, ds, stats, STEPS)

    # The same forecast by hand: normalised inputs, the network, gclab's `next_inputs`. A
    # target whose variable is an input is a residual (every one but precipitation when it
    # is not an input): the last state plus the scaled output; else mean plus scaled output.
    graphs = build_graphs(CFG.resolution, CFG.mesh_splits)
    graph = graph_inputs(graphs)
    net = make_network(CFG, task.data_channels, task.output_channels)
    params = params_to_gclab_channels(ckpt.params, task, CFG.hidden_layers)
    norm = normalization_from_stats(stats, task)
    raw = raw_example(check_dataset(ds, task), task, rollout=STEPS)
    example = norm.normalise(raw)
    names = task.target_channel_names
    residual = np.array([task.precipitation_input or not n.startswith("total_precipitation")
                         for n in names])
    assert residual.all() == task.precipitation_input  # both branches covered by the cases
    inputs, state = jnp.asarray(example.inputs), raw.last_frame.astype(np.float64)
    want = []
    for k in range(STEPS):
        y = np.asarray(net.apply(params, graph, inputs), np.float64)  # [Ng, B, O]
        state = np.where(residual, state + y * norm.residual_std,
                         norm.target_mean + y * norm.target_std)
        want.append(state)
        inputs = next_inputs(task, inputs, jnp.asarray(y, jnp.float32), example.forcings[k],
                             norm.residual_scale)
    want = np.stack(want)  # [T, Ng, B, O]

    n_lat, n_lon = graphs.n_lat, graphs.n_lon
    for i, name in enumerate(names):
        var, _, level = name.partition("@")
        got = pred[var]
        if level:
            got = got.sel(level=int(level))
        got = got.transpose("time", "lat", "lon", "batch").values.reshape(STEPS, -1, 2)
        spread = max(float(np.std(want[..., i])), 1e-12)
        np.testing.assert_allclose(got, want[..., i], rtol=1e-5,
                                   atol=1e-4 * spread + 1e-6, err_msg=name)
    assert n_lat * n_lon == want.shape[1]


def test_forecast_has_the_official_rollout_layout(files):
    ckpt = read_checkpoint(files / "ckpt.npz")
    pred = forecast(ckpt, open_dataset(files / "data.nc"), load_stats(files / "stats"), 2)
    assert list(pred.data_vars) == sorted(pred.data_vars)
    assert len(pred.data_vars) == 11
    assert pred["2m_temperature"].dims == ("time", "batch", "lat", "lon")
    assert pred["temperature"].dims == ("time", "batch", "level", "lat", "lon")
    assert pred["temperature"].dtype == np.float32
    assert pred.time.dtype == np.dtype("timedelta64[ns]")
    assert [int(t / np.timedelta64(1, "h")) for t in pred.time.values] == [6, 12]
    assert pred.level.values.tolist() == [500, 850]
    assert set(pred.coords) == {"lat", "lon", "level", "time"}
    assert np.isfinite(pred["temperature"].values).all()


def test_the_weather_of_target_frames_may_be_nan_but_not_the_inputs(files, tmp_path):
    ckpt, stats = read_checkpoint(files / "ckpt.npz"), load_stats(files / "stats")
    ds = open_dataset(files / "data.nc").load()
    want = forecast(ckpt, ds, stats, 2)
    future = ds.copy(deep=True)
    for name in ("2m_temperature", "temperature", "total_precipitation_6hr"):
        future[name][:, 2:] = np.nan  # not observed yet: only the forcings are known
    write_dataset(future, tmp_path / "future.nc")
    got = forecast(ckpt, open_dataset(tmp_path / "future.nc"), stats, 2)
    for name in want.data_vars:
        np.testing.assert_array_equal(got[name].values, want[name].values)
    future["temperature"][1, 1, 0, 0, 0] = np.nan  # the newest input frame
    write_dataset(future, tmp_path / "nan.nc")
    with pytest.raises(DataError, match=f"^{tmp_path / 'nan.nc'}: variable 'temperature' holds "
                                        r"a non-finite value \(nan\) at time step 1 \(.*\) of "
                                        "batch row 1$"):
        forecast(ckpt, open_dataset(tmp_path / "nan.nc"), stats, 2)


def test_lead_times_are_6_hour_steps_whatever_time_holds(files):
    # Guards against lead times taken as time[1] - time[0] in nanoseconds: 1 ns, 2 ns
    # without a `time` coordinate, 6 ns, 12 ns for a `time` of plain hours.
    ckpt, stats = read_checkpoint(files / "ckpt.npz"), load_stats(files / "stats")
    ds = open_dataset(files / "data.nc")
    pred = forecast(ckpt, ds.drop_vars("time"), stats, np.int64(2))
    assert pred.time.values.tolist() == np.asarray([6, 12], "timedelta64[h]").astype(
        "timedelta64[ns]").tolist()
    hours = ds.assign_coords(time=("time", np.arange(ds.sizes["time"]) * 6))
    with pytest.raises(DataError, match=f"^{files / 'data.nc'}: time holds int64 values, it "
                                        r"must hold lead times \(timedelta64"):
        forecast(ckpt, hours, stats, 2)


def test_the_forecast_reads_no_target_frame_of_weather(files, tmp_path):
    # The forecast read (and kept) every weather variable's 2 + steps frames, of which it
    # uses two: a store whose target frames are damaged now forecasts as the intact file.
    ckpt, stats = read_checkpoint(files / "ckpt.npz"), load_stats(files / "stats")
    ds = open_dataset(files / "data.nc").load()
    want = forecast(ckpt, ds, stats, STEPS)
    path = tmp_path / "damaged.zarr"
    ds.chunk({"time": 1}).to_zarr(path, zarr_format=2)
    for name, key in (("temperature", "0.{t}.0.0.0"), ("2m_temperature", "0.{t}.0.0")):
        for t in range(2, STEPS + 2):  # every target frame, none of the forcings
            chunk = path / name / key.format(t=t)
            assert chunk.is_file()
            chunk.write_bytes(np.random.default_rng(t).bytes(100))
    damaged = open_dataset(path)
    with pytest.raises(DataError, match="'2m_temperature' could not be read, a chunk of it "
                                        "is damaged"):
        raw_example(check_dataset(damaged, TASK), TASK, rollout=STEPS, check_targets=False)
    got = forecast(ckpt, damaged, stats, STEPS)
    for name in want.data_vars:
        np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=name)
    # The mode the forecast reads with: inputs and forcings as before, no targets.
    full = raw_example(check_dataset(ds, TASK), TASK, rollout=STEPS, check_targets=False)
    part = raw_example(check_dataset(damaged, TASK), TASK, rollout=STEPS, read_targets=False)
    for name in ("inputs", "last_frame", "forcings"):
        np.testing.assert_array_equal(getattr(part, name), getattr(full, name), err_msg=name)
    assert part.targets.shape == (0,) + full.targets.shape[1:]
    with pytest.raises(TypeError, match="^read_targets='no' is invalid: True or False, not "):
        raw_example(check_dataset(ds, TASK), TASK, read_targets="no")


def test_other_layouts_of_one_file_forecast_the_same(files, tmp_path):
    # `time` of datetimes without `datetime` (CDO-style), and lat north to south: refused
    # by the forecast ("no 'datetime' coordinate", "lat runs north to south"), though
    # `gclab stats` read both.
    ckpt, stats = read_checkpoint(files / "ckpt.npz"), load_stats(files / "stats")
    row = open_dataset(files / "data.nc").load().isel(batch=[0])
    want = forecast(ckpt, row, stats, 2)
    one = row.isel(batch=0)
    cdo = one.drop_vars("datetime").assign_coords(time=("time", one.datetime.values))
    write_dataset(cdo, tmp_path / "cdo.nc")
    write_dataset(row.isel(lat=slice(None, None, -1)), tmp_path / "n2s.nc")
    for name in ("cdo.nc", "n2s.nc"):
        got = forecast(ckpt, open_dataset(tmp_path / name), stats, 2)
        np.testing.assert_array_equal(got.lat.values, want.lat.values)
        for var in want.data_vars:
            np.testing.assert_array_equal(got[var].values, want[var].values,
                                          err_msg=f"{name} {var}")
