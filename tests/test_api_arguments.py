"""Bad arguments to public helper functions: one ValueError (TypeError for a wrong type)
whose message names the argument and what is allowed, never a KeyError, a
ZeroDivisionError, numpy's own complaint or a silently wrong result. (The refusals are cases
of the `API` list of tests/test_bad_inputs.py; here, what they still accept.)"""

import numpy as np
import pytest

from gclab.geometry.grid_mesh import grid_latitudes, grid_longitudes
from gclab.memory.blocks import balanced_block, split_blocks
from gclab.memory.precision import compute_dtype
from gclab.memory.remat import remat_policy
from gclab.parallel import processes
from gclab.parallel.pipeline import bubble_fraction
from gclab.sizing.speed import data_sheet

ROWS = np.zeros((10, 2), np.float32)


def test_good_arguments_still_work_numpy_scalars_included():
    assert balanced_block(np.int64(10), np.int32(4)) == 4  # 3 blocks of 4, 4, 2 -> 4
    assert balanced_block(0, 8) == 1  # no rows: one block of padding
    assert split_blocks(ROWS, np.int64(4), shards=np.int64(2)).shape == (3, 4, 2)
    assert bubble_fraction(np.int64(4), np.int32(13)) == 3 / 16
    assert compute_dtype("bf16") == np.dtype("bfloat16")
    assert callable(remat_policy("dots"))
    np.testing.assert_array_equal(grid_latitudes(np.float32(45)), [-90, -45, 0, 45, 90])
    assert grid_longitudes(90.0).tolist() == [0, 90, 180, 270]
    assert data_sheet("H100", "bf16").seconds_per_flop == pytest.approx(1 / 990e12)


class _Untouchable:
    """Stands in for `jax` in `gclab.parallel.processes`: a refusal must come before JAX's
    config is touched (a count JAX accepts but cannot start leaves the process without a
    CPU backend), so any use of it fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"use_cpu_devices touched jax.{name} before refusing")


@pytest.mark.parametrize("n,error,words", [
    (0, ValueError, "use_cpu_devices n=0 is invalid: an integer in 1..2048"),
    (-1, ValueError, "use_cpu_devices n=-1 is invalid: an integer in 1..2048"),
    (np.int64(0), ValueError, "use_cpu_devices n=0 is invalid"),
    ("4", TypeError, "use_cpu_devices n='4' is invalid: an integer in 1..2048"),
    (4.0, TypeError, "use_cpu_devices n=4.0 is invalid"),
    (True, TypeError, "use_cpu_devices n=True is invalid"),
    (processes.MAX_CPU_DEVICES + 1, ValueError, "(at most 2048)"),
], ids=repr)
def test_use_cpu_devices_refuses_before_touching_jax(n, error, words, monkeypatch):
    # Only refusals: a successful call would change this pytest process's JAX backends.
    monkeypatch.setattr(processes, "jax", _Untouchable())
    with pytest.raises(error) as e:
        processes.use_cpu_devices(n)
    assert words in str(e.value), str(e.value)


@pytest.mark.parametrize("timeout", [0, True, 30.0, np.int64(0)], ids=repr)
def test_initialize_processes_timeout_is_an_integer_of_seconds(timeout, monkeypatch):
    monkeypatch.setattr(processes, "jax", _Untouchable())
    with pytest.raises(ValueError) as e:
        processes.initialize_processes("127.0.0.1:1", 2, 0, timeout=timeout)
    assert str(e.value) == f"timeout={timeout!r} is invalid: an integer >= 1 (seconds)"


def _recorded_initialize(monkeypatch) -> list:
    """Stands in for `jax` in `gclab.parallel.processes`: each call of
    `jax.distributed.initialize` is recorded (its keyword arguments) instead of joining a run."""
    calls = []

    class _Jax:
        class distributed:
            initialize = staticmethod(lambda **kwargs: calls.append(kwargs))

    monkeypatch.setattr(processes, "jax", _Jax)
    return calls


def test_initialize_processes_takes_a_numpy_timeout_as_an_int(monkeypatch):
    calls = _recorded_initialize(monkeypatch)
    assert processes.initialize_processes("127.0.0.1:1", 2, 0, timeout=np.int64(30))
    assert calls[0]["initialization_timeout"] == 30
    assert type(calls[0]["initialization_timeout"]) is int


def test_sizes_of_the_shapes_compiled_from_are_counts_and_configs_of_their_kind():
    from gclab.config import ModelConfig, TaskConfig
    from gclab.sizing.analytical import param_count
    from gclab.training.examples import example_shapes

    task = TaskConfig()
    # A negative grid must not become a shape of -5 nodes, left to the compiler to find.
    for args, words in (((task, -5, 1, 1), "example_shapes num_grid_nodes=-5 is invalid"),
                        ((task, 10, 0, 1), "example_shapes batch=0 is invalid"),
                        ((task, 10, 1, 2.0), "example_shapes rollout=2.0 is invalid")):
        with pytest.raises(ValueError, match=words):
            example_shapes(*args)
    assert example_shapes(task, np.int64(10), 1, 2).targets.shape[:3] == (2, 10, 1)
    # A str model or task: not an AttributeError from inside ('str' object has no ...).
    with pytest.raises(TypeError,
                       match="^example_shapes task='13' is invalid: a TaskConfig, not a str$"):
        example_shapes("13", 10, 1, 1)
    for args, words in (((ModelConfig(), "13"), "param_count task='13' is invalid"),
                        (("graphcast", task), "param_count model='graphcast' is invalid")):
        with pytest.raises(TypeError, match=words):
            param_count(*args)


def test_a_kind_names_the_type_with_its_article():
    from gclab.config import a_kind
    from gclab.geometry.graphs import graphs_for

    assert [a_kind(v) for v in (3, "3", None, np.zeros(2), [3])] == [
        "an int", "a str", "None", "an ndarray", "a list"]
    assert (a_kind(np.int64(3)), a_kind(np.uint8(3))) == ("an int64", "a uint8")
    # Messages that name what was given say "not an int", never "not a int".
    for value, kind in ((3, "an int"), (None, "None")):
        with pytest.raises(ValueError, match=f"^graphs_for needs a ModelConfig, not {kind}$"):
            graphs_for(value)


def test_a_wrong_kind_is_a_type_error_and_a_value_error():
    """The one rule of `gclab.config`: a value of a kind that is not allowed raises an error
    that is a TypeError (as Python's own functions raise) and a ValueError (as every other bad
    argument raises, and as the command line catches to report in one line)."""
    from gclab.config import ModelConfig, TaskConfig, require_count
    from gclab.memory import MemoryConfig
    from gclab.notebook import live_configs
    from gclab.parallel import ParallelConfig
    from gclab.sizing import StepSpec
    from gclab.training.data import SyntheticWeather
    from gclab.training.losses import level_weights
    from gclab.training.step import TrainConfig, make_optimizer
    from gclab.weather.checkpoint import read_checkpoint

    task = TaskConfig()
    for call in (lambda: level_weights("13"), lambda: make_optimizer(None),
                 lambda: StepSpec("graphcast", task), lambda: SyntheticWeather(13, 10.0),
                 lambda: read_checkpoint(3), lambda: live_configs("03", "cpu-4x32"),
                 lambda: require_count("steps", "3", 1), lambda: require_count("steps", 2.0, 1),
                 lambda: StepSpec(ModelConfig(), task, memory="lean"),
                 lambda: StepSpec(ModelConfig(), task, batch="2"),
                 lambda: StepSpec(ModelConfig(), task, parallel="data:2"),
                 # Config fields: a ConfigError naming the field, and a TypeError.
                 lambda: ModelConfig(latent_size="16"), lambda: ModelConfig(resolution="1"),
                 lambda: TaskConfig(pressure_levels="500"),
                 lambda: TaskConfig(pressure_levels=(500, "850")),
                 lambda: MemoryConfig(microbatches=2.0), lambda: MemoryConfig(donate=1),
                 lambda: MemoryConfig(precision=16), lambda: ParallelConfig(data="2"),
                 lambda: ParallelConfig(pipeline=2, stage_steps=(1, "1")),
                 lambda: TrainConfig(b1="0.9"), lambda: TrainConfig(warmup_steps=1.5)):
        with pytest.raises(TypeError) as e:
            call()
        assert isinstance(e.value, ValueError), repr(e.value)
    # A bad value of an allowed kind is no TypeError.
    for call in (lambda: require_count("steps", 0, 1), lambda: ModelConfig(latent_size=0),
                 lambda: MemoryConfig(precision="f16"), lambda: TaskConfig(pressure_levels=()),
                 lambda: StepSpec(ModelConfig(), task, batch=0),
                 lambda: TrainConfig(b1=1.5), lambda: ParallelConfig(data=0)):
        with pytest.raises(ValueError) as e:
            call()
        assert not isinstance(e.value, TypeError), repr(e.value)


def test_require_kind_names_what_is_allowed_and_what_was_given():
    from gclab.config import ModelConfig, TaskConfig, WrongType, require_kind

    task = TaskConfig()
    assert require_kind("task", task, TaskConfig) is task
    assert require_kind("memory", None, ModelConfig, optional=True) is None
    with pytest.raises(WrongType, match="^f task=3 is invalid: a TaskConfig, not an int$"):
        require_kind("task", 3, TaskConfig, caller="f")
    with pytest.raises(WrongType, match="^m=3 is invalid: a ModelConfig, a TaskConfig or None, "
                                        "not an int$"):
        require_kind("m", 3, (ModelConfig, TaskConfig), optional=True)
    with pytest.raises(WrongType, match="^x=3 is invalid: a mapping, not an int$"):
        require_kind("x", 3, dict, "a mapping")
    # A long repr (an array, a parameter tree) is left out: the message stays one line.
    with pytest.raises(WrongType, match="^x is invalid: a TaskConfig, not an ndarray$"):
        require_kind("x", np.zeros((100, 100)), TaskConfig)


@pytest.fixture
def _no_process_env(monkeypatch):
    """No JAX_* process variables from the caller's shell, and `jax` untouchable."""
    for name in (processes.COORDINATOR_ENV, processes.NUM_PROCESSES_ENV,
                 processes.PROCESS_ID_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(processes, "jax", _Untouchable())
    return monkeypatch


@pytest.mark.parametrize("name,text,words", [
    ("JAX_NUM_PROCESSES", "two", "JAX_NUM_PROCESSES='two' is invalid: an integer >= 1"),
    ("JAX_NUM_PROCESSES", "0", "JAX_NUM_PROCESSES='0' is invalid: an integer >= 1"),
    ("JAX_NUM_PROCESSES", "2.5", "JAX_NUM_PROCESSES='2.5' is invalid: an integer >= 1"),
    ("JAX_PROCESS_ID", "-1", "JAX_PROCESS_ID='-1' is invalid: an integer >= 0"),
    ("JAX_PROCESS_ID", "first", "JAX_PROCESS_ID='first' is invalid: an integer >= 0"),
], ids=repr)
def test_initialize_processes_names_a_bad_environment_variable(name, text, words,
                                                               _no_process_env):
    _no_process_env.setenv(processes.COORDINATOR_ENV, "127.0.0.1:1")
    _no_process_env.setenv(processes.NUM_PROCESSES_ENV, "2")
    _no_process_env.setenv(processes.PROCESS_ID_ENV, "0")
    _no_process_env.setenv(name, text)
    with pytest.raises(ValueError) as e:
        processes.initialize_processes()
    assert str(e.value) == words


@pytest.mark.parametrize("kwargs,error,words", [
    (dict(num_processes="2"), TypeError,
     "initialize_processes num_processes='2' is invalid: an integer >= 1"),
    (dict(num_processes=2.5), TypeError,
     "initialize_processes num_processes=2.5 is invalid: an integer >= 1"),
    (dict(num_processes=0), ValueError,
     "initialize_processes num_processes=0 is invalid: an integer >= 1"),
    (dict(process_id=0.5), TypeError,
     "initialize_processes process_id=0.5 is invalid: an integer >= 0"),
    (dict(process_id=True), TypeError,
     "initialize_processes process_id=True is invalid: an integer >= 0"),
    (dict(process_id=-1), ValueError,
     "initialize_processes process_id=-1 is invalid: an integer >= 0"),
    (dict(process_id=2), ValueError,
     "process_id=2 is invalid: an integer in 0..1 (num_processes=2)"),
    (dict(process_id=np.int64(3)), ValueError,
     "process_id=3 is invalid: an integer in 0..1 (num_processes=2)"),
    (dict(coordinator=1234), TypeError,
     "initialize_processes coordinator=1234 is invalid: a str HOST:PORT, not an int"),
], ids=repr)
def test_initialize_processes_refuses_bad_arguments_before_touching_jax(kwargs, error, words,
                                                                        _no_process_env):
    args = dict(coordinator="127.0.0.1:1", num_processes=2, process_id=0)
    args.update(kwargs)
    with pytest.raises(error) as e:
        processes.initialize_processes(**args)
    assert str(e.value) == words


def test_initialize_processes_names_the_variable_an_id_out_of_range_came_from(_no_process_env):
    _no_process_env.setenv(processes.PROCESS_ID_ENV, "2")
    with pytest.raises(ValueError) as e:
        processes.initialize_processes("127.0.0.1:1", num_processes=2)
    assert str(e.value) == "JAX_PROCESS_ID=2 is invalid: an integer in 0..1 (num_processes=2)"
    # A count of the wrong kind is refused even where there is no coordinator to join.
    with pytest.raises(TypeError, match="num_processes='2' is invalid"):
        processes.initialize_processes(None, num_processes="2")


def test_initialize_processes_passes_numpy_counts_and_variables_as_ints(monkeypatch):
    calls = _recorded_initialize(monkeypatch)
    monkeypatch.delenv(processes.COORDINATOR_ENV, raising=False)
    monkeypatch.delenv(processes.NUM_PROCESSES_ENV, raising=False)
    monkeypatch.delenv(processes.PROCESS_ID_ENV, raising=False)
    assert processes.initialize_processes("127.0.0.1:1", np.int64(2), np.int32(1))
    monkeypatch.setenv(processes.NUM_PROCESSES_ENV, " 4 ")
    monkeypatch.setenv(processes.PROCESS_ID_ENV, "3")
    assert processes.initialize_processes("127.0.0.1:1")
    assert [(c["num_processes"], c["process_id"]) for c in calls] == [(2, 1), (4, 3)]
    assert all(type(c["num_processes"]) is int and type(c["process_id"]) is int
               for c in calls)
