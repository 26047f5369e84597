"""`gclab.training.train`'s arguments of the wrong kind or for another model: each named
in one error before any work (inside, each failed as an attribute error of a later line,
or as Haiku's shape error deep in the first step)."""

import os
import shutil

import numpy as np
import optax
import pytest

from gclab.config import ModelConfig, TaskConfig
from gclab.model import param_shapes
from gclab.training import loop, losses
from gclab.training.loop import check_init_params, train
from gclab.training.step import TrainConfig, make_optimizer

TASK = TaskConfig(pressure_levels=(500, 850))
CFG = ModelConfig(resolution=30.0, mesh_splits=1, latent_size=8, processor_steps=1)


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if `train` gets as far as building graphs."""
    monkeypatch.setattr(loop, "graphs_for",
                        lambda *a: pytest.fail("work started before the arguments were checked"))


def _params(model, task):
    return {m: {n: np.zeros(s.shape, np.float32) for n, s in leaves.items()}
            for m, leaves in param_shapes(model, task.data_channels,
                                          task.output_channels).items()}


@pytest.mark.parametrize("kwargs,error,words", [
    ({"task": "13"}, TypeError, "task='13' is invalid: a TaskConfig"),
    ({"model": "cpu-4x32"}, TypeError, "model='cpu-4x32' is invalid: a ModelConfig"),
    ({"memory": "lean"}, TypeError, "memory='lean' is invalid: a MemoryConfig or None"),
    ({"parallel": "data:2"}, TypeError, "parallel='data:2' is invalid: a ParallelConfig"),
    ({"weather": object()}, TypeError, "normalization() and make_batch"),
    ({"steps": 0}, ValueError, "steps=0 is invalid: an integer >= 1"),
    ({"schedule_steps": -5}, ValueError, "schedule_steps=-5 is invalid: an integer >= 1"),
    ({"schedule_steps": 2.5}, ValueError, "schedule_steps=2.5 is invalid"),
    ({"steps": 5, "schedule_steps": 4}, ValueError, "steps=5 is invalid: at most "
                                                    "schedule_steps=4 (after the schedule"),
    ({"batch": 0}, ValueError, "batch=0 is invalid: an integer >= 1"),
    ({"rollout": 0}, ValueError, "rollout=0 is invalid: an integer >= 1"),
    ({"seed": -1}, ValueError, "seed=-1 is invalid: an integer >= 0"),
    # A ConfigError of the schedule after the graphs were built, or a raw TypeError, before.
    ({"learning_rate": -1.0}, ValueError, "learning_rate=-1.0 is invalid: a number >= 0 and "
                                          "<= 3.40282e+38 (float32's largest)"),
    ({"learning_rate": float("nan")}, ValueError, "learning_rate=nan is invalid: a number"),
    ({"learning_rate": 1e39}, ValueError, "learning_rate=1e+39 is invalid: a number"),
    ({"learning_rate": "fast"}, TypeError, "learning_rate='fast' is invalid: a number"),
    ({"learning_rate": None}, TypeError, "learning_rate=None is invalid: a number"),
])
def test_an_argument_of_the_wrong_kind_is_named(kwargs, error, words, no_work):
    args = {"model": CFG, "task": TASK, "steps": 1, **kwargs}
    with pytest.raises(error) as e:
        train(args.pop("model"), args.pop("task"), args.pop("steps"), **args)
    assert words in str(e.value)


def test_a_numpy_step_count_is_a_step_count(monkeypatch):
    """Accepted as every other gclab count is (refused as not an int before)."""
    reached = []
    monkeypatch.setattr(loop, "graphs_for", lambda *a: reached.append(a) or pytest.skip())
    with pytest.raises(pytest.skip.Exception):
        train(CFG, TASK, np.int64(1))
    assert reached


@pytest.mark.parametrize("other,words", [
    (CFG.replace(latent_size=16), "of shape"),  # another latent size
    # Another step count: the processor's parameters are stacked over its steps.
    (CFG.replace(processor_steps=2), "of shape (2, 8), the model's is (1, 8)"),
])
def test_parameters_of_another_model_are_named(other, words):
    with pytest.raises(ValueError) as e:
        check_init_params(_params(other, TASK), CFG, TASK)
    assert str(e.value).startswith("init_params is invalid for 8 x 1") and words in str(e.value)


def test_parameters_for_other_channels_are_named():
    other = TaskConfig(pressure_levels=(500, 700, 850))
    with pytest.raises(ValueError, match="init_params is invalid .* of shape"):
        check_init_params(_params(CFG, other), CFG, TASK)
    with pytest.raises(ValueError, match="module 'grid2mesh_gnn"):
        check_init_params({}, CFG, TASK)
    check_init_params(_params(CFG, TASK), CFG, TASK)  # the model's own pass


def test_train_checks_init_params_before_the_first_step(monkeypatch):
    monkeypatch.setattr(loop, "graphs_for",
                        lambda *a: pytest.fail("work went on with another model's parameters"))
    with pytest.raises(ValueError, match="init_params is invalid"):
        train(CFG, TASK, 1, init_params=_params(CFG.replace(latent_size=16), TASK))


def test_a_parameter_the_model_lacks_is_named():
    """A name the model has no such parameter of, in a module it has (a KeyError before)."""
    params = _params(CFG, TASK)
    module = sorted(params)[0]
    params[module]["extra"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=f"{module}/extra is of shape \\(3,\\), not a parameter"):
        check_init_params(params, CFG, TASK)


def test_the_loss_weights_name_a_task_of_the_wrong_kind():
    # Not an AttributeError from inside ('str' object has no attribute 'pressure_levels').
    grid_lat = np.linspace(-90.0, 90.0, 7)
    for weights in (losses.level_weights, losses.channel_weights):
        with pytest.raises(TypeError, match="^task='13' is invalid: a TaskConfig, not a str$"):
            weights("13")
    with pytest.raises(TypeError, match="^task=None is invalid: a TaskConfig, not None$"):
        losses.loss_weights(None, grid_lat, 4)
    node_w, chan_w = losses.loss_weights(TASK, grid_lat, 4)
    assert node_w.shape == (28,) and chan_w.shape == (TASK.output_channels,)


def test_make_optimizer_names_a_config_of_the_wrong_kind():
    # Not an AttributeError from inside ('str' object has no attribute 'peak_learning_rate').
    for bad, kind in (("adamw", "a str"), (None, "None")):
        with pytest.raises(TypeError, match=f"^cfg={bad!r} is invalid: a TrainConfig, not {kind}$"):
            make_optimizer(bad)
    assert isinstance(make_optimizer(TrainConfig()), optax.GradientTransformation)


def test_a_parameter_the_model_lacks_is_named_as_such_whatever_it_holds():
    params = _params(CFG, TASK)
    module = sorted(params)[0]
    for extra, words in ((np.zeros(3, np.float32), "/zz is of shape (3,), not a parameter"),
                         ("text", "/zz is not a parameter")):
        params[module]["zz"] = extra
        with pytest.raises(ValueError) as e:
            check_init_params(params, CFG, TASK)
        assert str(e.value).endswith(f"{module}{words} of this model"), str(e.value)
        assert "missing" not in str(e.value)


TINY = ModelConfig(resolution=6.0, mesh_splits=2, latent_size=16, processor_steps=2)
# The first run's settings, each case below resumes it with one of them changed.
SETTINGS = {"seed": 0, "batch": 1, "rollout": 1}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The folder of a run of one step with SETTINGS, trained once for the cases below."""
    folder = tmp_path_factory.mktemp("first-run")
    train(TINY, TASK, 1, schedule_steps=4, checkpoint_dir=str(folder), **SETTINGS)
    return folder


@pytest.mark.parametrize("changed", [{"seed": 1}, {"batch": 2}, {"rollout": 2}])
def test_resuming_with_other_examples_is_refused(first_run, tmp_path, changed):
    """The seed, batch and rollout set every later step's examples: a run resumed with
    another continues like no uninterrupted run, and is refused before any work."""
    folder = tmp_path / "run"
    shutil.copytree(first_run, folder)  # each case resumes a folder of its own
    ((name, given),) = changed.items()
    with pytest.raises(loop.ScheduleMismatch) as e:
        train(TINY, TASK, 2, schedule_steps=4, checkpoint_dir=str(folder),
              **{**SETTINGS, **changed})
    assert (e.value.name, e.value.stored, e.value.given) == (name, SETTINGS[name], given)
    assert os.listdir(folder) == ["1"]
