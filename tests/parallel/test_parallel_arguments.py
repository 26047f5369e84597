"""Bad arguments to `gpipe`: refused while tracing, from static shapes, with a ValueError
(TypeError for a wrong type) naming the argument, never a silently wrong schedule.

Traced under an abstract mesh (no devices needed) and inside `jax.jit`, as the network
traces it: the checks read shapes only, never an array's values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

from gclab.cli import main
from gclab.parallel import PIPELINE_AXIS, gpipe


def _first(p, state, x):
    return x + p, jnp.zeros_like(x)


def _last(p, state, x):
    return state, 10 * state


def _trace(xs, microbatches, stages=(_first, _last)):
    """The jaxpr of `gpipe` over `xs` (ShapeDtypeStructs), jitted, on a 2-stage mesh."""
    mesh = AbstractMesh((2,), (PIPELINE_AXIS,), axis_types=(AxisType.Auto,))
    state = jnp.zeros(1)

    @jax.jit
    def run(p, xs):
        return gpipe(list(stages), p, xs, state, microbatches)

    with jax.sharding.use_abstract_mesh(mesh):
        return jax.make_jaxpr(run)(jax.ShapeDtypeStruct((), jnp.float32), xs)


def _rows(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def test_gpipe_takes_micro_batches_that_match_numpy_counts_included():
    for m in (4, np.int64(4), np.int32(4)):
        jaxpr = _trace(_rows(4, 1), m)
        assert jaxpr.out_avals[0].shape == (4, 1)


@pytest.mark.parametrize("m", [2, 6], ids=repr)
def test_gpipe_refuses_micro_batches_other_than_the_leading_dimension_of_xs(m):
    # Stage 0 reads micro-batch min(t, M - 1): 2 of 4 would drop two, 6 of 4 repeat one.
    with pytest.raises(ValueError) as e:
        _trace(_rows(4, 1), m)
    assert str(e.value) == (f"gpipe xs of shape (4, 1) is invalid: every leaf of xs is "
                            f"[microbatches, ...] = [{m}, ...]")


def test_gpipe_names_the_leaf_of_xs_that_does_not_match():
    def first(p, state, x):
        return x["a"] + x["b"] + p, jnp.zeros(1)

    xs = {"a": _rows(3, 1), "b": _rows(2, 1)}
    with pytest.raises(ValueError, match=r"^gpipe xs\['b'\] of shape \(2, 1\) is invalid"):
        _trace(xs, 3, (first, _last))
    with pytest.raises(ValueError, match=r"^gpipe xs of shape \(\) is invalid"):
        _trace(_rows(), 1)


@pytest.mark.parametrize("m,error,words", [
    (0, ValueError, "gpipe microbatches=0 is invalid: an integer >= 1"),
    (-1, ValueError, "gpipe microbatches=-1 is invalid: an integer >= 1"),
    (np.int64(0), ValueError, f"gpipe microbatches={np.int64(0)!r} is invalid: an integer >= 1"),
    (4.0, TypeError, "gpipe microbatches=4.0 is invalid: an integer >= 1"),
    ("4", TypeError, "gpipe microbatches='4' is invalid: an integer >= 1"),
], ids=repr)
def test_gpipe_refuses_a_micro_batch_count_that_is_not_a_positive_integer(m, error, words):
    with pytest.raises(error) as e:
        _trace(_rows(4, 1), m)
    assert str(e.value) == words


def test_gpipe_refuses_no_stages():
    with pytest.raises(ValueError) as e:
        _trace(_rows(4, 1), 4, stages=())
    assert str(e.value) == "gpipe stages=[] is invalid: at least one stage function"


@pytest.mark.parametrize("kwargs,error,words", [
    ({"batch": 1.5}, TypeError, "plan_layout: batch=1.5 is invalid: an integer >= 1"),
    ({"batch": "2"}, TypeError, "plan_layout: batch='2' is invalid"),
    ({"rollout": 0}, ValueError, "plan_layout: rollout=0 is invalid"),
    ({"precision": "f16"}, ValueError, "plan_layout: precision='f16' is invalid: one of f32"),
    ({"recipes": "lean"}, TypeError, "plan_layout: recipes='lean' is invalid: a list of "
                                     "recipe names"),
    ({"recipes": []}, ValueError, "plan_layout: recipes=[] is invalid: at least one"),
    ({"recipes": ["nope"]}, ValueError, "'nope'"),
    ({"model": "cpu-4x32"}, TypeError, "plan_layout: model='cpu-4x32' is invalid: a "
                                       "ModelConfig, not a str"),
], ids=repr)
def test_plan_layout_names_a_bad_argument_before_compiling(kwargs, error, words, monkeypatch):
    # Guards against a batch of 1.5 reported as "no layout divides batch 1.5", a recipe
    # name read letter by letter, and an empty list taken for every recipe.
    from gclab.config import get_preset
    from gclab.sizing import layout_plan

    def no_compile(*args, **kwargs):
        raise AssertionError("plan_layout compiled before refusing its arguments")

    monkeypatch.setattr(layout_plan, "compile_train_step", no_compile)
    preset = get_preset("cpu-4x32")
    args = {"model": preset.model, "task": preset.task, "devices": 2, **kwargs}
    with pytest.raises(error) as e:
        layout_plan.plan_layout("1GiB", **args)
    assert words in str(e.value), str(e.value)


def test_layouts_compile_on_cpu_devices_where_the_default_backend_has_too_few(monkeypatch):
    """A machine with one GPU plans an eight-device layout on its simulated CPU devices."""
    import types

    import jax

    from gclab.sizing.layout_plan import compile_devices

    cpu = [types.SimpleNamespace(platform="cpu", id=i) for i in range(8)]
    gpu = types.SimpleNamespace(platform="gpu", id=0)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "devices", lambda backend=None: cpu if backend == "cpu"
                        else [gpu])
    assert compile_devices(1) == [gpu]
    assert compile_devices(8) == cpu
    with pytest.raises(ValueError, match=r"^plan_layout: devices=9 is more than this process "
                       r"has \(1 gpu, 8 cpu\): ask for 9 simulated CPU devices"):
        compile_devices(9)
    # plan_layout compiles every candidate on them.
    from gclab.config import PRESETS
    from gclab.sizing import layout_plan

    class Compiled(Exception):
        pass

    def compile_train_step(spec, graphs, devices=None):
        raise Compiled(devices)

    monkeypatch.setattr(layout_plan, "compile_train_step", compile_train_step)
    tiny = PRESETS["cpu-4x32"]
    with pytest.raises(Compiled) as e:
        layout_plan.plan_layout("1GiB", tiny.model, tiny.task, 8, batch=8)
    assert e.value.args[0] == cpu


def test_a_layout_whose_stages_would_hang_is_never_chosen(monkeypatch):
    import types

    import jax

    from gclab.config import PRESETS
    from gclab.sizing import NothingFits, layout_plan

    cpu = jax.devices("cpu")[:1] * 2  # stands for two (only their count and platform matter)
    monkeypatch.setattr(jax, "devices", lambda backend=None: cpu)

    def compile_train_step(spec, graphs, devices=None):
        hangs = "spatial:2" in spec.parallel.spec
        return types.SimpleNamespace(
            memory=types.SimpleNamespace(total_bytes=1, collective_bytes=0),
            cannot_run="the stages would wait on each other" if hangs else None)

    monkeypatch.setattr(layout_plan, "compile_train_step", compile_train_step)
    tiny = PRESETS["cpu-4x32"]
    plan = layout_plan.plan_layout("1GiB", tiny.model, tiny.task, 2, batch=2,
                                   recipes=["none"])
    assert plan.spec.parallel.spec == "data:2,spatial:1"
    hung = [c for c in plan.candidates if "cannot_run" in c]
    assert hung and all(not c["fits"] and "spatial:2" in c["parallel"] for c in hung)
    monkeypatch.setattr(layout_plan, "compile_train_step", lambda spec, graphs, devices=None:
                        types.SimpleNamespace(memory=types.SimpleNamespace(
                            total_bytes=1, collective_bytes=0), cannot_run="hangs"))
    with pytest.raises(NothingFits):
        layout_plan.plan_layout("1GiB", tiny.model, tiny.task, 2, batch=2, recipes=["none"])


@pytest.mark.parametrize("command", [["memory"], ["train", "--train-steps", "1"]],
                         ids=lambda c: c[0])
def test_gclab_refuses_a_layout_with_all_three_axes_in_one_line(command, capsys, monkeypatch):
    """data:2,spatial:2,pipeline:2 used to abort the process in XLA's SPMD partitioner
    (rc 134, a failed check and a stack trace); now it is refused before anything is
    compiled. Run in this process, a jitted function fails the test rather than abort it."""
    def jit_nothing(*args, **kwargs):
        pytest.fail("a function was jitted: the layout was not refused first")

    monkeypatch.setattr(jax, "jit", jit_nothing)
    tiny = ["--resolution", "6", "--mesh-splits", "2", "--latent", "16", "--steps", "4",
            "--batch", "2"]
    spec = "data:2,spatial:2,pipeline:2"
    assert main([*command, *tiny, "--parallel", spec]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"gclab {command[0]}: error: --parallel {spec}: pipeline:2 is invalid with data:2 and "
        "spatial:2: pipeline combines with data or with spatial, not with both (XLA's SPMD "
        f"partitioner aborts the process on the three axes) (see gclab {command[0]} --help)\n")
