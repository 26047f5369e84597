"""`gclab forecast` and `gclab stats`: files in, files out, and one line for each bad input."""

import shutil
import sys

import numpy as np
import pytest

from gclab import cli
from gclab.config import ModelConfig, TaskConfig
from gclab.model import param_shapes
from gclab.training.data import SyntheticWeather
from gclab.weather import (
    Checkpoint,
    load_stats,
    open_dataset,
    read_checkpoint,
    synthetic_dataset,
    write_checkpoint,
    write_dataset,
    write_stats,
)
from gclab.weather.era5 import weatherbench_dataset
from gclab.weather.forecast import forecast

TASK = TaskConfig(pressure_levels=(500, 850))
CFG = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=16, processor_steps=2)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    weather = SyntheticWeather(TASK, CFG.resolution, seed=1)
    write_dataset(synthetic_dataset(weather, frames=4), root / "data.nc")
    write_dataset(synthetic_dataset(weather, frames=24, start=40), root / "long.nc")
    rng = np.random.default_rng(0)
    shapes = param_shapes(CFG, TASK.data_channels, TASK.output_channels)
    params = {m: {n: (0.3 * rng.standard_normal(s.shape)).astype(np.float32)
                  for n, s in leaves.items()} for m, leaves in shapes.items()}
    write_checkpoint(root / "ckpt.npz", Checkpoint.from_gclab(params, CFG, TASK))
    return root


@pytest.fixture(scope="module")
def stats(files):
    """`gclab stats` of long.nc, in `files / "stats"`: the statistics every test here reads,
    computed once."""
    assert cli.main(["stats", "--data", str(files / "long.nc"),
                     "--out", str(files / "stats")]) == 0
    return files / "stats"


def test_stats_then_forecast(files, stats, capsys):
    loaded = load_stats(stats)
    assert "temperature" in loaded.diffs_stddev and "land_sea_mask" in loaded.mean
    out = files / "pred.nc"
    assert cli.main(["forecast", "--checkpoint", str(files / "ckpt.npz"), "--data",
                     str(files / "data.nc"), "--stats", str(stats),
                     "--forecast-steps", "2", "--out", str(out)]) == 0
    assert "wrote 2 step(s) of 11 variables" in capsys.readouterr().out
    got = open_dataset(out).load()
    want = forecast(read_checkpoint(files / "ckpt.npz"), open_dataset(files / "data.nc"),
                    loaded, 2)
    assert list(got.data_vars) == list(want.data_vars)
    for name in want.data_vars:
        assert got[name].dims == want[name].dims
        np.testing.assert_array_equal(got[name].values, want[name].values)


def _one_line(capsys, argv, text):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and text in err and "Traceback" not in err, err


@pytest.fixture(scope="module")
def forecast_inputs(files, stats, tmp_path_factory):
    """Good and bad inputs of `gclab forecast`, written once; each case of
    `test_bad_forecast_inputs_get_one_line` refuses a copy of its own, so that a case that
    wrote where it must not cannot change what another reads."""
    root = tmp_path_factory.mktemp("forecast_inputs")
    for name in ("ckpt.npz", "data.nc"):
        shutil.copy(files / name, root / name)
    flat = dict(np.load(root / "ckpt.npz"))
    flat.pop("model_config:latent_size")
    np.savez(root / "incomplete.npz", **flat)
    ds = open_dataset(root / "data.nc").load()
    write_dataset(ds.drop_vars("geopotential"), root / "nolevel.nc")
    write_dataset(ds.isel(time=slice(0, 1)), root / "one.nc")
    shutil.copytree(stats, root / "good")
    (root / "badstats").mkdir()
    for name in ("mean_by_level.nc", "stddev_by_level.nc"):
        shutil.copy(stats / name, root / "badstats" / name)
    d = open_dataset(stats / "diffs_stddev_by_level.nc").load()
    write_dataset(d.drop_vars("temperature"), root / "badstats" / "diffs_stddev_by_level.nc")
    (root / "link.nc").symlink_to("data.nc")  # relative: a copy links to its own data.nc
    return root


@pytest.mark.parametrize("change, text", [
    ({"--checkpoint": "data.nc"}, "--checkpoint {root}/data.nc: not a checkpoint"),
    ({"--checkpoint": "none.npz"}, "--checkpoint {root}/none.npz: no such file"),
    ({"--checkpoint": "incomplete.npz"}, "missing key 'model_config:latent_size'"),
    ({"--data": "ckpt.npz"}, "--data {root}/ckpt.npz: not a readable netCDF"),
    ({"--data": "nolevel.nc"},
     "--data/--stats: {root}/nolevel.nc: missing variable 'geopotential'"),
    ({"--stats": "."}, "mean_by_level.nc: no such file"),
    ({"--stats": "badstats"}, "diffs_stddev_by_level.nc: no variable 'temperature'"),
    ({"--forecast-steps": "3"}, "--forecast-steps 3: at most 2"),
    # Too short for any step: the file is named, not --forecast-steps ('at most -1' before).
    ({"--data": "one.nc"}, "--data {root}/one.nc: 1 time step; a forecast needs at least 3"),
    ({"--forecast-steps": "0"}, "--forecast-steps 0:"),
    ({"--out": "pred.txt"}, "--out {root}/pred.txt: the name must end in .nc"),
    ({"--out": "data.nc"}, "--out {root}/data.nc: the same file as --data {root}/data.nc"),
    ({"--out": "link.nc"}, "--out {root}/link.nc: the same file as --data {root}/data.nc"),
    ({"--out": "good/mean_by_level.nc"},
     "--out {root}/good/mean_by_level.nc: the same file as mean_by_level.nc of --stats "
     "{root}/good"),
])
def test_bad_forecast_inputs_get_one_line(forecast_inputs, tmp_path, capsys, change, text):
    root = tmp_path / "inputs"
    shutil.copytree(forecast_inputs, root, symlinks=True)
    args = {"--checkpoint": "ckpt.npz", "--data": "data.nc", "--stats": "good",
            "--forecast-steps": "1", "--out": "pred2.nc"}
    args.update(change)
    argv = ["forecast"]
    for k, v in args.items():
        argv += [k, v if k == "--forecast-steps" else str(root / v)]
    before = _contents(root)
    _one_line(capsys, argv, text.format(root=root))
    assert _contents(root) == before  # nothing written


def _contents(folder):
    """Every file under `folder` (its relative path) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_bad_stats_inputs_get_one_line(files, capsys):
    _one_line(capsys, ["stats", "--data", str(files / "none.nc"), "--out", str(files / "s")],
              "--data")
    _one_line(capsys, ["stats", "--data", str(files / "data.nc"), "--out",
                       str(files / "ckpt.npz")], "a folder (this is a file)")
    _one_line(capsys, ["stats", "--data", str(files / "data.nc"), "--out",
                       str(files / "no" / "where")], "a folder whose parent exists")


def test_stats_checks_its_three_files_before_any_work(files, stats, capsys):
    out = files / "in_the_way"
    shutil.copytree(stats, out)
    (out / "stddev_by_level.nc").unlink()
    (out / "stddev_by_level.nc").mkdir()
    before = _contents(out)
    _one_line(capsys, ["stats", "--data", str(files / "data.nc"), "--out", str(out)],
              f"--out {out}: {out}/stddev_by_level.nc: is a directory, not a file")
    assert _contents(out) == before


def test_a_failed_stats_write_leaves_the_old_set(files, stats, capsys, monkeypatch):
    import xarray

    out = files / "old_set"
    shutil.copytree(stats, out)
    before = _contents(out)
    written = []

    def third_fails(ds, path, *args, **kwargs):  # the last of the three writes fails
        written.append(path)
        if len(written) == 3:
            raise OSError(28, "No space left on device", str(path))
        real(ds, path, *args, **kwargs)

    real = xarray.Dataset.to_netcdf
    monkeypatch.setattr(xarray.Dataset, "to_netcdf", third_fails)
    assert cli.main(["stats", "--data", str(files / "data.nc"), "--out", str(out)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert _contents(out) == before  # the old set, whole, and no temporary file


@pytest.fixture(scope="module")
def bad(files, stats):
    """Inputs that used to be accepted silently or end in a traceback, in `files / "bad"`."""
    root = files / "bad"
    root.mkdir()
    good = load_stats(stats)
    for name, s in (("good", good),
                    ("nanmean", good._replace(mean=good.mean.copy(deep=True))),
                    ("zerostd", good._replace(stddev=good.stddev.copy(deep=True)))):
        (root / name).mkdir()
        if name == "nanmean":
            s.mean["temperature"].values[1] = np.nan
        if name == "zerostd":
            s.stddev["2m_temperature"].values[...] = 0.0
        write_stats(s, root / name)
    ds = open_dataset(files / "data.nc").load()  # 4 time steps, batch 1
    nan = ds.copy(deep=True)
    nan["2m_temperature"][0, 1, 3, 4] = np.nan  # an input frame
    write_dataset(nan, root / "nan.nc")
    write_dataset(ds.isel(time=[0]), root / "one.nc")
    write_dataset(ds.assign_coords(time=("time", np.arange(4) * 6)), root / "hours_int.nc")
    write_dataset(ds.assign({"2m_temperature": ds["2m_temperature"].expand_dims(member=2)}),
                  root / "member.nc")
    for name, hours in (("hours.nc", [0, 3, 6, 9]), ("repeat.nc", [0, 6, 6, 12]),
                        ("unsorted.nc", [0, 12, 6, 18])):
        dt = ds.datetime.values[:, :1] + np.asarray(hours, "timedelta64[h]")[None]
        write_dataset(ds.assign_coords(datetime=(("batch", "time"),
                                                 dt.astype("datetime64[ns]"))), root / name)
    weatherbench_dataset(ds).chunk({"time": 1}).to_zarr(root / "damaged.zarr", zarr_format=2)
    (root / "damaged.zarr" / "temperature" / "1.0.0.0").write_bytes(b"garbage" * 30)
    flat = dict(np.load(files / "ckpt.npz"))
    key = "params:mesh2grid_gnn/~_networks_builder/decoder_nodes_grid_nodes_mlp/~/linear_1:b"
    np.savez(root / "int.npz", **{**flat, key: flat[key].astype(np.int64)})
    flat[key] = flat[key].copy()
    flat[key][2] = np.nan
    np.savez(root / "nan.npz", **flat)
    (root / "old.nc").write_bytes(b"an earlier forecast")
    return root


STEPS = "; GraphCast's time steps are 6 hours apart, in increasing order"


@pytest.mark.parametrize("change, text", [
    ({"--stats": "nanmean"}, "--stats {root}/nanmean: mean_by_level.nc: 'temperature' at "
                             "level 850 is nan (a mean must be finite)"),
    ({"--stats": "zerostd"}, "--stats {root}/zerostd: stddev_by_level.nc: '2m_temperature' is "
                             "0 (a standard deviation must be a finite number > 0)"),
    ({"--data": "nan.nc"}, "{root}/nan.nc: variable '2m_temperature' holds a non-finite value "
                           "(nan) at time step 1 (2016-01-01T06:00)"),
    ({"--data": "hours.nc"}, "--data/--stats: {root}/hours.nc: datetime has time steps 3 hours "
                             "apart (time steps 0 and 1)" + STEPS),
    ({"--data": "repeat.nc"}, "--data/--stats: {root}/repeat.nc: datetime repeats "
                              "2016-01-01T06:00 at time steps 1 and 2" + STEPS),
    ({"--data": "unsorted.nc"}, "--data/--stats: {root}/unsorted.nc: datetime has time steps "
                                "12 hours apart (time steps 0 and 1)" + STEPS),
    ({"--data": "damaged.zarr"}, "{root}/damaged.zarr: variable 'temperature' could not be "
                                 "read, a chunk of it is damaged ("),
    ({"--data": "hours_int.nc"}, "--data/--stats: {root}/hours_int.nc: time holds int64 "
                                 "values, it must hold lead times (timedelta64"),
    ({"--data": "member.nc"}, "--data/--stats: {root}/member.nc: variable '2m_temperature' has "
                              "dims ('member', 'batch', 'time', 'lat', 'lon'); a surface "
                              "variable's dims are time, lat, lon and, optionally, batch"),
    ({"--checkpoint": "nan.npz"}, "--checkpoint {root}/nan.npz: params:mesh2grid_gnn/~_networks"
     "_builder/decoder_nodes_grid_nodes_mlp/~/linear_1:b holds a non-finite value (nan) at "
     "index (2,); parameters must be finite"),
    ({"--checkpoint": "int.npz"}, "--checkpoint {root}/int.npz: params:mesh2grid_gnn/~_networks"
     "_builder/decoder_nodes_grid_nodes_mlp/~/linear_1:b has dtype int64; parameters must be "
     "floating point"),
])
def test_bad_values_in_forecast_inputs_get_one_line(files, bad, capsys, change, text):
    args = {"--checkpoint": str(files / "ckpt.npz"), "--data": str(files / "data.nc"),
            "--stats": str(bad / "good"), "--forecast-steps": "1", "--out": str(bad / "old.nc")}
    args.update({k: str(bad / v) for k, v in change.items()})
    before = _contents(files)
    capsys.readouterr()
    _one_line(capsys, ["forecast", *(x for kv in args.items() for x in kv)],
              text.format(root=bad))
    assert _contents(files) == before  # the earlier forecast in --out is whole


@pytest.mark.parametrize("data, text", [
    ("nan.nc", "--data: {root}/nan.nc: variable '2m_temperature' holds a non-finite value "
               "(nan) at time step 1 (2016-01-01T06:00)"),
    ("hours.nc", "--data: {root}/hours.nc: datetime has time steps 3 hours apart"),
    ("damaged.zarr", "--data: {root}/damaged.zarr: variable 'temperature' could not be read, "
                     "a chunk of it is damaged ("),
    ("one.nc", "--data: {root}/one.nc: the dataset has 1 time step; the standard deviation of "
               "the 6-hour change (diffs_stddev_by_level.nc) needs at least 2 time steps"),
])
def test_bad_values_in_stats_data_get_one_line(files, bad, capsys, data, text):
    before = _contents(files)  # --out holds an earlier set of statistics
    _one_line(capsys, ["stats", "--data", str(bad / data), "--out", str(bad / "good")],
              text.format(root=bad))
    assert _contents(files) == before


@pytest.mark.parametrize("change, text", [
    ({"--data": "nan.nc"}, "{root}/nan.nc: variable '2m_temperature' holds a non-finite value "
                           "(nan) at time step 1"),
    ({"--stats": "zerostd"}, "--stats {root}/zerostd: stddev_by_level.nc: '2m_temperature' "
                             "is 0"),
    ({"--data": "member.nc"}, "--data/--stats: {root}/member.nc: variable '2m_temperature' has "
                              "dims ('member', 'batch', 'time', 'lat', 'lon')"),
])
def test_bad_values_in_training_data_get_one_line(files, bad, capsys, change, text):
    args = {"--init-checkpoint": str(files / "ckpt.npz"), "--data": str(files / "data.nc"),
            "--stats": str(bad / "good"), "--save-checkpoint": str(bad / "tuned.npz")}
    args.update({k: str(bad / v) for k, v in change.items()})
    before = _contents(files)
    _one_line(capsys, ["train", "--train-steps", "1", *(x for kv in args.items() for x in kv)],
              text.format(root=bad))
    assert _contents(files) == before  # no checkpoint written


EXTRA = ("is not installed: reading and writing weather files needs the data extra "
         "(pip install 'gclab[data]')")


@pytest.mark.parametrize("module", ["xarray", "h5netcdf", "dask"])
@pytest.mark.parametrize("command", ["stats", "forecast", "train"])
def test_without_the_data_extra_one_line_names_what_to_install(files, bad, capsys, monkeypatch,
                                                                command, module):
    data, stats = str(files / "data.nc"), str(bad / "good")
    argv = {"stats": ["stats", "--data", data, "--out", str(bad / "s_extra")],
            "forecast": ["forecast", "--checkpoint", str(files / "ckpt.npz"), "--data", data,
                         "--stats", stats, "--forecast-steps", "1",
                         "--out", str(bad / "p_extra.nc")],
            "train": ["train", "--train-steps", "1", "--init-checkpoint",
                      str(files / "ckpt.npz"), "--data", data, "--stats", stats,
                      "--save-checkpoint", str(bad / "t_extra.npz")]}[command]
    monkeypatch.setitem(sys.modules, module, None)  # as where it is not installed
    before = _contents(files)
    _one_line(capsys, argv, f"--data {data}: {module} {EXTRA}")
    assert _contents(files) == before  # nothing written


def test_without_zarr_or_h5netcdf_a_zarr_store_gets_one_line(files, bad, capsys, monkeypatch):
    store = bad / "extra.zarr"
    if not store.exists():
        open_dataset(files / "long.nc").to_zarr(store, zarr_format=2)
    out = bad / "zarr_stats"
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "zarr", None)
        _one_line(capsys, ["stats", "--data", str(store), "--out", str(out)],
                  f"--data {store}: zarr {EXTRA}")
    # The store read, the statistics (netCDF, h5netcdf) cannot be written.
    monkeypatch.setitem(sys.modules, "h5netcdf", None)
    _one_line(capsys, ["stats", "--data", str(store), "--out", str(out)], f"h5netcdf {EXTRA}")
    assert not any(out.glob("*.nc"))
