"""Bad arguments of the public weather API: one ValueError / TypeError naming the argument,
not an IndexError, KeyError or TypeError from deep inside (or, worse, a silent result)."""

import re

import numpy as np
import pytest

from gclab.config import PRESSURE_LEVELS_13, PRESSURE_LEVELS_37, ModelConfig, TaskConfig
from gclab.model.graphcast import param_shapes
from gclab.training.data import SyntheticWeather
from gclab.weather import CheckpointError, read_checkpoint
from gclab.weather import dataset as wd

CFG = ModelConfig(resolution=30.0, mesh_splits=1, latent_size=8, processor_steps=1)
TASK_13 = TaskConfig(PRESSURE_LEVELS_13)
TASK = TaskConfig(pressure_levels=(500, 850))
CONVERSIONS = (wd.params_to_gclab_channels, wd.params_to_official_channels)


def _params(task: TaskConfig, hidden_layers: int = 1) -> dict:
    """A parameter tree of `CFG`'s shapes (values do not matter to the checks)."""
    shapes = param_shapes(CFG.replace(hidden_layers=hidden_layers), task.data_channels,
                          task.output_channels)
    rng = np.random.default_rng(0)
    return {m: {n: rng.normal(size=v.shape).astype(np.float32) for n, v in leaves.items()}
            for m, leaves in shapes.items()}


@pytest.fixture(scope="module")
def params_13():
    return _params(TASK_13)


@pytest.fixture(scope="module")
def dataset():
    weather = SyntheticWeather(TASK, CFG.resolution, seed=0)
    return wd.check_dataset(wd.synthetic_dataset(weather, frames=4), TASK)


@pytest.mark.parametrize("convert", CONVERSIONS, ids=lambda f: f.__name__)
def test_params_of_another_task_name_the_task(params_13, convert):
    # Not numpy's IndexError from inside (index 238 is out of bounds for axis 0 ...).
    with pytest.raises(ValueError, match=r"^task is invalid for params: the task has 37 "
                       r"pressure level\(s\), with precipitation input \(471 input and 227 "
                       r"output channels\), the params are for a task of 13 pressure "
                       r"level\(s\), with precipitation input \(183 input and 83 output"):
        convert(params_13, TaskConfig(PRESSURE_LEVELS_37), 1)
    # Same outputs, one input variable fewer: was accepted (a permutation of the wrong
    # length indexing the embedder's first rows), now named.
    with pytest.raises(ValueError, match=r"^task is invalid for params: the task has 13 "
                       r"pressure level\(s\), without precipitation input"):
        convert(params_13, TaskConfig(PRESSURE_LEVELS_13, precipitation_input=False), 1)


@pytest.mark.parametrize("convert", CONVERSIONS, ids=lambda f: f.__name__)
def test_hidden_layers_must_be_the_params_count(params_13, convert):
    # Not a KeyError from inside ('mesh2grid_gnn/decoder_nodes_grid_nodes_mlp/~/linear_3').
    with pytest.raises(ValueError, match=r"^hidden_layers=3 is invalid for params: their "
                       r"grid decoder \(mesh2grid_gnn/decoder_nodes_grid_nodes_mlp\) has 1 "
                       r"hidden layer\(s\), linear_0..linear_1$"):
        convert(params_13, TASK_13, 3)
    # Not an IndexError (the decoder's hidden layer permuted as if it were the output).
    for bad in (0, -1, 1.0, True, "1"):
        with pytest.raises(ValueError, match=f"^hidden_layers={bad!r} is invalid: an "
                                             f"integer >= 1"):
            convert(params_13, TASK_13, bad)


def test_fewer_hidden_layers_than_the_params_have_are_named():
    # The last layer asked for would be a hidden [L, L] layer of 2-hidden-layer params.
    params = _params(TASK, hidden_layers=2)
    with pytest.raises(ValueError, match=r"^hidden_layers=1 is invalid for params: .* has 2 "
                                         r"hidden layer\(s\)"):
        wd.params_to_gclab_channels(params, TASK, 1)
    wd.params_to_gclab_channels(params, TASK, 2)


def test_params_that_are_no_parameter_tree_are_named(params_13):
    # Not a KeyError from inside ('grid2mesh_gnn/encoder_nodes_grid_nodes_mlp/~/linear_0').
    with pytest.raises(ValueError, match="^params is invalid: no w of module 'grid2mesh_gnn/"
                                         "encoder_nodes_grid_nodes_mlp/~/linear_0'"):
        wd.params_to_gclab_channels({}, TASK_13, 1)
    last = "mesh2grid_gnn/decoder_nodes_grid_nodes_mlp/~/linear_1"
    no_bias = {m: ({"w": v["w"]} if m == last else v) for m, v in params_13.items()}
    with pytest.raises(ValueError, match=f"^params is invalid: no w/b of module '{last}'"):
        wd.params_to_gclab_channels(no_bias, TASK_13, 1)
    with pytest.raises(TypeError, match=r"^params=\[\] is invalid: a {module: {name: array}} "
                                        "mapping, not a list"):
        wd.params_to_gclab_channels([], TASK_13, 1)
    with pytest.raises(TypeError, match="^task=13 is invalid: a TaskConfig"):
        wd.params_to_gclab_channels(params_13, 13, 1)


def test_numpy_hidden_layers_convert_as_python_ones(params_13):
    want = wd.params_to_gclab_channels(params_13, TASK_13, 1)
    got = wd.params_to_gclab_channels(params_13, TASK_13, np.int64(1))
    for m in want:
        for n in want[m]:
            np.testing.assert_array_equal(got[m][n], want[m][n])
    back = wd.params_to_official_channels(got, TASK_13, np.int32(1))
    for m in params_13:
        for n in params_13[m]:
            assert back[m][n].tobytes() == params_13[m][n].tobytes()


def test_raw_example_refuses_a_rollout_or_start_that_is_no_count(dataset):
    # rollout=0 was accepted (an example without targets); 1.5 a TypeError inside xarray.
    for bad in (0, -2, 1.5, True, "1"):
        with pytest.raises(ValueError, match=f"^rollout={bad!r} is invalid: an integer >= 1$"):
            wd.raw_example(dataset, TASK, rollout=bad)
    for bad in (-1, 0.5, None):
        with pytest.raises(ValueError, match=f"^start={bad!r} is invalid: an integer >= 0$"):
            wd.raw_example(dataset, TASK, start=bad)
    with pytest.raises(TypeError, match="^task=None is invalid: a TaskConfig"):
        wd.raw_example(dataset, None)
    want = wd.raw_example(dataset, TASK, start=1, rollout=1)
    got = wd.raw_example(dataset, TASK, start=np.int64(1), rollout=np.int32(1))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def re_list(levels) -> str:
    return r"\[" + ", ".join(str(p) for p in levels) + r"\]"


@pytest.mark.parametrize("levels", [(500, 700, 850), (850, 500), (500,)])
def test_raw_example_names_the_task_levels_against_the_dataset(dataset, levels):
    # (500, 700, 850) was IndexError: index 17 is out of bounds; (850, 500) and (500,)
    # returned channels in the wrong places without a word.
    with pytest.raises(wd.DataError, match=r"^dataset: level is \[500, 850\], the task's "
                       r"pressure levels are " + re_list(levels)):
        wd.raw_example(dataset, TaskConfig(pressure_levels=levels))


def test_synthetic_dataset_needs_the_frames_of_one_example():
    weather = SyntheticWeather(TASK, CFG.resolution, seed=0)
    # 0 and -3 returned a dataset without time steps; 2 one without a target frame.
    for bad in (0, -3, 2, 3.0, True):
        with pytest.raises(ValueError, match=f"^frames={bad!r} is invalid: an integer >= 3 "
                                             r"\(two input frames and one target frame"):
            wd.synthetic_dataset(weather, bad)
    ds = wd.synthetic_dataset(weather, np.int64(3))
    assert ds.sizes["time"] == 3
    raw = wd.raw_example(wd.check_dataset(ds, TASK), TASK)  # the one example it holds
    assert raw.targets.shape[0] == 1


def test_read_checkpoint_names_a_path_of_the_wrong_kind(tmp_path):
    # Not os.stat's TypeError for None or a list; an integer must not be taken for an open
    # file descriptor ("3: cannot read it (Bad file descriptor)", or that file's bytes).
    for bad, kind in ((None, "None"), (3, "an int"), (["a.npz"], "a list")):
        with pytest.raises(TypeError, match=rf"^path={re.escape(repr(bad))} is invalid: a str, "
                                            r"bytes or os\.PathLike \(an \.npz file\), "
                                            rf"not {kind}$"):
            read_checkpoint(bad)
    with pytest.raises(CheckpointError, match="no such file"):
        read_checkpoint(tmp_path / "absent.npz")


def test_a_checkpoint_whose_paths_are_no_graphcast_modules_is_a_checkpoint_error():
    # A key whose module path keeps a second '~_networks_builder/': the file's fault, named
    # with the file (a CheckpointError, as every other malformed key), not a bare ValueError.
    from gclab.weather.checkpoint import check_params

    model, task = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=8,
                              processor_steps=1), TaskConfig()
    params = {"grid2mesh_gnn/~_networks_builder/foo": {"w": np.zeros(2, np.float32)}}
    with pytest.raises(CheckpointError, match=r"^ckpt\.npz: params: params is invalid: "):
        check_params(params, model, task, "ckpt.npz")


def _wrong_kind_calls():
    """(id, call(context), argument named, what is allowed) of the weather API's entry
    points; `context` holds good arguments (`ds`, `stats`, `ckpt`, `tmp`)."""
    from gclab.weather import Checkpoint, from_flat, to_flat, write_checkpoint
    from gclab.weather.forecast import forecast

    ds_words = "an xarray.Dataset (open_dataset(path))"
    stats_words = "a Stats (load_stats(folder))"
    lat, lon = np.linspace(-90, 90, 7), np.arange(12) * 30.0
    return [
        ("check_dataset(path)", lambda c: wd.check_dataset("d.nc", TASK), "ds", ds_words),
        ("check_dataset(task=None)", lambda c: wd.check_dataset(c["ds"], None), "task",
         "a TaskConfig"),
        ("compute_stats(path)", lambda c: wd.compute_stats("d.nc"), "ds", ds_words),
        ("raw_example(path)", lambda c: wd.raw_example("d.nc", TASK), "ds", ds_words),
        ("check_times(path)", lambda c: wd.check_times("d.nc"), "ds", ds_words),
        ("add_derived_vars(path)", lambda c: wd.add_derived_vars("d.nc"), "ds", ds_words),
        ("normalization_from_stats(path)",
         lambda c: wd.normalization_from_stats("stats", TASK), "stats", stats_words),
        ("normalization_from_stats(task=None)",
         lambda c: wd.normalization_from_stats(c["stats"], None), "task", "a TaskConfig"),
        ("normalization_from_stats(mean=path)",
         lambda c: wd.normalization_from_stats(c["stats"]._replace(mean="m.nc"), TASK),
         "stats.mean", "an xarray.Dataset (load_stats(folder))"),
        ("DatasetWeather(path)",
         lambda c: wd.DatasetWeather("d.nc", TASK, c["stats"], lat, lon), "ds", ds_words),
        ("DatasetWeather(stats=path)",
         lambda c: wd.DatasetWeather(c["ds"], TASK, "stats", lat, lon), "stats", stats_words),
        ("write_stats(tuple)", lambda c: wd.write_stats((1, 2, 3), c["tmp"]), "stats",
         stats_words),
        ("write_stats(folder=None)", lambda c: wd.write_stats(c["stats"], None), "folder",
         "a str or os.PathLike (the statistics folder)"),
        ("load_stats(None)", lambda c: wd.load_stats(None), "folder",
         "a str or os.PathLike (the statistics folder)"),
        ("open_dataset(None)", lambda c: wd.open_dataset(None), "path",
         "a str or os.PathLike (a netCDF file or zarr folder)"),
        ("write_dataset(path)", lambda c: wd.write_dataset("d.nc", c["tmp"] / "x.nc"), "ds",
         ds_words),
        ("forecast(ds=path)", lambda c: forecast(c["ckpt"], "d.nc", c["stats"], 1), "ds",
         ds_words),
        ("forecast(ckpt=path)", lambda c: forecast("c.npz", c["ds"], c["stats"], 1), "ckpt",
         "a Checkpoint (read_checkpoint(path))"),
        ("forecast(stats=path)", lambda c: forecast(c["ckpt"], c["ds"], "stats", 1), "stats",
         stats_words),
        ("forecast(memory=str)",
         lambda c: forecast(c["ckpt"], c["ds"], c["stats"], 1, memory="lean"), "memory",
         "a MemoryConfig or None"),
        ("from_flat(list)", lambda c: from_flat([1, 2]), "flat",
         "a {key: array} mapping (read_flat(path))"),
        ("to_flat(str)", lambda c: to_flat("x"), "ckpt",
         "a Checkpoint (read_checkpoint(path) or Checkpoint.from_gclab)"),
        ("write_checkpoint(dict)", lambda c: write_checkpoint(c["tmp"] / "c.npz", {}), "ckpt",
         "a Checkpoint (read_checkpoint(path) or Checkpoint.from_gclab)"),
        ("Checkpoint.from_gclab(params=None)",
         lambda c: Checkpoint.from_gclab(None, CFG, TASK), "params",
         "a {module: {name: array}} mapping"),
        ("Checkpoint.from_gclab(task=None)",
         lambda c: Checkpoint.from_gclab(c["ckpt"].params, CFG, None), "task", "a TaskConfig"),
    ]


@pytest.mark.parametrize("call, name, allowed", [c[1:] for c in _wrong_kind_calls()],
                         ids=[c[0] for c in _wrong_kind_calls()])
def test_arguments_of_the_wrong_kind_are_named(dataset, tmp_path, call, name, allowed):
    # Not an AttributeError from inside ('str' object has no attribute 'encoding',
    # 'NoneType' object has no attribute 'pressure_levels', ...) nor os's TypeError.
    from gclab.weather import Checkpoint

    context = {"ds": dataset, "stats": wd.compute_stats(dataset), "tmp": tmp_path,
               "ckpt": Checkpoint.from_gclab(_params(TASK), CFG, TASK)}
    with pytest.raises(TypeError) as e:
        call(context)
    assert isinstance(e.value, ValueError)  # WrongType: the command line's one line
    assert re.match(rf"^{re.escape(name)}(=.*)? is invalid: {re.escape(allowed)}, not ",
                    str(e.value)), str(e.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_forecast_checks_steps_first(dataset):
    # Named as `steps` (not as raw_example's "rollout"), before any graph is built.
    from gclab.weather import Checkpoint
    from gclab.weather.forecast import forecast

    ckpt = Checkpoint.from_gclab(_params(TASK), CFG, TASK)
    stats = wd.compute_stats(dataset)
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"^forecast steps={bad} is invalid: an integer "
                                             ">= 1$"):
            forecast(ckpt, dataset, stats, bad)
    for bad in ("2", 2.0, None):
        with pytest.raises(TypeError, match=f"^forecast steps={bad!r} is invalid: an integer "
                                            ">= 1$"):
            forecast(ckpt, dataset, stats, bad)
