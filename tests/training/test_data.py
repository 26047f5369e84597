"""Synthetic weather: determinism, layout, smoothness, forcings, statics, normalisation."""

import numpy as np
import pytest

from gclab.config import FORCING_VARIABLES, TaskConfig
from gclab.training import SyntheticWeather, input_variable_channels

TASK = TaskConfig(pressure_levels=(500, 850))
TASK13 = TaskConfig.from_levels(13)


def test_same_seed_same_arrays_different_seed_different():
    a = SyntheticWeather(TASK, 10.0, seed=3).make_batch(2, rollout=2)
    b = SyntheticWeather(TASK, 10.0, seed=3).make_batch(2, rollout=2)
    c = SyntheticWeather(TASK, 10.0, seed=4).make_batch(2, rollout=2)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert np.abs(a.inputs - c.inputs).mean() > 0.1
    assert np.abs(a.targets - c.targets).mean() > 0.1


def test_the_climate_does_not_depend_on_resolution_or_level_set():
    coarse = SyntheticWeather(TASK13, 10.0, seed=1).frames([4, 5])  # [2, 19 * 36, O]
    fine = SyntheticWeather(TASK13, 5.0, seed=1).frames([4, 5])  # [2, 37 * 72, O]
    fine = fine.reshape(2, 37, 72, -1)[:, ::2, ::2].reshape(coarse.shape)
    np.testing.assert_allclose(coarse, fine, rtol=1e-6)
    # 500 hPa temperature is the same variable in a 2-level and a 13-level task.
    two = SyntheticWeather(TASK, 10.0, seed=1).frames([4])
    col = TASK13.target_channel_names.index("temperature@500")
    np.testing.assert_allclose(two[..., TASK.target_channel_names.index("temperature@500")],
                               coarse[:1, :, col], rtol=1e-6)


@pytest.mark.parametrize("task,res,batch,rollout", [
    (TASK, 10.0, 3, 2), (TASK13, 6.0, 1, 1), (TaskConfig.from_levels(13, False), 12.0, 2, 3),
    (TaskConfig.from_levels(37), 20.0, 2, 1)])
def test_shapes_follow_the_task(task, res, batch, rollout):
    weather = SyntheticWeather(task, res)
    ng = (int(180 / res) + 1) * int(360 / res)
    ex = weather.make_batch(batch, rollout=rollout)
    assert ex.inputs.shape == (ng, batch, task.data_channels)
    assert ex.targets.shape == (rollout, ng, batch, task.output_channels)
    assert ex.forcings.shape == (rollout, ng, batch, len(FORCING_VARIABLES))
    assert all(a.dtype == np.float32 and np.isfinite(a).all() for a in ex)
    raw = weather.raw_batch(batch, rollout=rollout)
    assert raw.last_frame.shape == (ng, batch, task.output_channels)
    assert weather.trajectory(4).shape == (4, ng, task.output_channels)


def test_input_channel_layout():
    """Inputs are frame t-1 vars, frame t vars, forcings t-1, t, t+1, statics."""
    task = TaskConfig.from_levels(13, precipitation_input=False)
    weather = SyntheticWeather(task, 12.0, seed=2)
    raw = weather.raw_batch(1, rollout=2, start=5).inputs[:, 0]  # [Ng, C]
    v = input_variable_channels(task)
    V = len(v)
    assert V == task.output_channels - 1  # precipitation dropped
    assert "total_precipitation_6hr" not in [task.target_channel_names[i] for i in v]
    frames = weather.frames([4, 5])  # [2, Ng, O]
    forcings = weather.forcings([4, 5, 6])  # [3, Ng, 5]
    np.testing.assert_array_equal(raw[:, :V], frames[0][:, v])
    np.testing.assert_array_equal(raw[:, V:2 * V], frames[1][:, v])
    np.testing.assert_array_equal(raw[:, 2 * V:2 * V + 15],
                                  np.concatenate(list(forcings), -1))
    np.testing.assert_array_equal(raw[:, -2:], weather.statics)
    assert raw.shape[-1] == task.data_channels


def test_fields_are_smooth_continuous_at_the_poles_and_evolve_slowly():
    weather = SyntheticWeather(TASK13, 2.0, seed=1)
    field = weather.frames([3])[0].reshape(91, 180, -1)  # [lat, lon, O]
    std = field.std((0, 1))  # [O]
    along_lon = np.abs(np.diff(field, axis=1, append=field[:, :1])).mean((0, 1))
    along_lat = np.abs(np.diff(field, axis=0)).mean((0, 1))
    assert (along_lon / std).max() < 0.15 and (along_lat / std).max() < 0.15
    # Every longitude of a pole row is the same point: one value.
    np.testing.assert_allclose(field[0], field[0, :1].repeat(180, 0), rtol=1e-6)
    np.testing.assert_allclose(field[-1], field[-1, :1].repeat(180, 0), rtol=1e-6)
    # Consecutive 6 h frames are correlated: the change is a fraction of the field.
    frames = weather.frames([10, 11])
    ratio = (frames[1] - frames[0]).std((0,)) / frames[0].std((0,))
    assert 0.05 < np.median(ratio) < 0.5


def test_values_are_physically_plausible():
    weather = SyntheticWeather(TASK13, 10.0, seed=0)
    f = weather.frames(np.arange(0, 400, 37))  # [T, Ng, O]
    names = TASK13.target_channel_names
    t2m = f[..., names.index("2m_temperature")]
    assert 200 < t2m.min() and t2m.max() < 340 and 280 < t2m.mean() < 296
    msl = f[..., names.index("mean_sea_level_pressure")]
    assert 9.5e4 < msl.min() and msl.max() < 1.08e5
    assert f[..., names.index("total_precipitation_6hr")].min() >= 0
    assert f[..., names.index("specific_humidity@1000")].min() >= 0
    z500 = f[..., names.index("geopotential@500")].mean() / 9.80665
    assert 4500 < z500 < 5500  # metres
    statics = weather.statics
    land = statics[:, 1]
    assert set(np.unique(land)) == {0.0, 1.0} and 0.15 < land.mean() < 0.45
    assert (statics[land == 0, 0] == 0).all() and statics[:, 0].max() > 0


def test_forcings_follow_the_sun():
    weather = SyntheticWeather(TASK, 5.0)
    f = weather.forcings([0, 1, 2, 3])  # [4, Ng, 5], frames 6 h apart
    toa = f[..., 0]
    assert toa.min() == 0.0  # night
    assert toa.max() <= 1.04 * 1361.0 * 3600  # J m-2 over one hour
    lit = (toa > 0).mean(1)
    assert (0.4 < lit).all() and (lit < 0.65).all()  # about half the globe is lit
    # Local noon moves west by 90 degrees of longitude every 6 hours.
    equator = toa.reshape(4, 37, 72)[:, 18]  # [4, lon]
    noon = np.argmax(equator, 1) * 5.0
    np.testing.assert_allclose((noon[:-1] - noon[1:]) % 360, 90.0, atol=5.0)
    # Year progress is global, day progress is local solar time.
    assert np.ptp(f[0, :, 1]) == 0 and np.ptp(f[0, :, 3]) > 1.5
    np.testing.assert_allclose(f[..., 1] ** 2 + f[..., 2] ** 2, 1.0, rtol=1e-5)
    np.testing.assert_allclose(f[..., 3] ** 2 + f[..., 4] ** 2, 1.0, rtol=1e-5)


def test_normalisation_statistics_and_round_trip():
    task = TaskConfig.from_levels(13, precipitation_input=False)
    weather = SyntheticWeather(task, 10.0, seed=5)
    norm = weather.normalization()
    assert norm.input_mean.shape == norm.input_std.shape == (task.data_channels,)
    assert norm.residual_std.shape == (task.output_channels,)
    assert (norm.input_std > 0).all() and (norm.residual_std > 0).all()
    precip = task.target_channel_names.index("total_precipitation_6hr")
    assert not norm.is_residual[precip] and norm.is_residual.sum() == task.output_channels - 1
    # Normalised inputs over many samples: about zero mean and unit spread per channel.
    ex = weather.make_batch(16, rollout=1, start=40)
    frames = ex.inputs[..., :2 * (task.output_channels - 1)]  # [Ng, B, 2V]
    assert np.abs(frames.mean((0, 1))).max() < 0.5
    assert 0.7 < float(frames.std()) < 1.3
    # One-step residual targets have about unit spread; round trip back to frames.
    res = ex.targets[0][..., norm.is_residual]
    assert 0.7 < float(res.std()) < 1.3
    raw = weather.raw_batch(2, rollout=3, start=7)
    targets = norm.normalise_targets(raw.targets, raw.last_frame)
    back = norm.denormalise_targets(targets, raw.last_frame)
    assert (np.abs(back - raw.targets) / norm.residual_std).max() < 1e-3  # float32 rounding
    # Rollout targets are sums of the residuals of the steps so far.
    step2 = (raw.targets[1] - raw.targets[0]) / norm.residual_std
    np.testing.assert_allclose((targets[1] - targets[0])[..., norm.is_residual],
                               step2[..., norm.is_residual], atol=1e-4)


def test_bad_data_arguments():
    with pytest.raises(ValueError, match="resolution"):
        SyntheticWeather(TASK, 7.0)
    with pytest.raises(ValueError, match="seed"):
        SyntheticWeather(TASK, 10.0, seed=-1)
    for kw, field in (({"batch": 0}, "batch"), ({"batch": 1, "rollout": 0}, "rollout"),
                      ({"batch": 1, "start": 0}, "start")):
        with pytest.raises(ValueError, match=field):
            SyntheticWeather(TASK, 10.0).make_batch(**kw)
