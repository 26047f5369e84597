"""Arguments the sizing, measuring and memory helpers once took without a word (and sized,
compared or formatted something else), or failed on deep inside NumPy, JAX or Python: each
is now one ValueError (TypeError too for a wrong kind) naming the function, the argument
and what is allowed; and what they accept still works."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gclab.config import ModelConfig, TaskConfig
from gclab.geometry.graphs import graphs_for
from gclab.measure.agreement import compare_leaves, gradient_cosine
from gclab.measure.compiled import compiled_memory
from gclab.measure.timeline import memory_timeline
from gclab.memory import MemoryConfig, parse_remat_spec, scaled_edge_block
from gclab.sizing.step import (
    StepSpec,
    compile_train_step,
    recipe_memory,
    train_step_memory,
)

MODEL = ModelConfig(resolution=10.0, mesh_splits=2, latent_size=16, processor_steps=2)
TASK = TaskConfig(pressure_levels=(500, 850))
SPEC = StepSpec(MODEL, TASK)
S = jax.ShapeDtypeStruct


def _refused(call, error, words):
    with pytest.raises(error) as e:
        call()
    message = str(e.value)
    assert words in message and "\n" not in message, message


# ----------------------------------------------------------------- sizing.step

def _stable_id(value):
    """A test id that is the same in every xdist worker (a function's repr holds its
    address): a dict's items, a function by its name; pytest's own id for the rest."""
    if isinstance(value, dict):
        return ",".join(f"{k}={v.__name__ if callable(v) else repr(v)}"
                        for k, v in value.items())
    return None


@pytest.mark.parametrize("other", [dict(mesh_splits=1), dict(resolution=20.0),
                                   dict(radius_query_fraction_edge_length=0.8)], ids=_stable_id)
def test_graphs_of_another_geometry_are_refused(other):
    graphs = graphs_for(MODEL.replace(**other))
    field = next(iter(other))
    _refused(lambda: train_step_memory(SPEC, graphs), ValueError,
             "train_step_memory graphs is invalid: graphs of spec.model's geometry")
    _refused(lambda: compile_train_step(SPEC, graphs), ValueError, f"have {field} ")


@pytest.mark.parametrize("kwargs,error,words", [
    (dict(run_if=lambda memory: False), ValueError,
     "compile_train_step run_if is invalid without live=True"),
    (dict(seed=3), ValueError, "compile_train_step seed=3 is invalid without live=True"),
    (dict(live=True, seed=-1), ValueError,
     "compile_train_step seed=-1 is invalid: an integer >= 0"),
    (dict(live=True, seed=1.5), TypeError, "compile_train_step seed=1.5 is invalid"),
    (dict(live=True, seed="abc"), TypeError, "compile_train_step seed='abc' is invalid"),
    (dict(devices=[]), ValueError, "compile_train_step devices=[] is invalid: a non-empty"),
    (dict(devices="cpu"), TypeError, "compile_train_step devices is invalid: a non-empty "
     "sequence of JAX devices (jax.devices()), not a str"),
    (dict(devices=["cpu"]), TypeError, "compile_train_step devices[0] is invalid"),
    (dict(graphs="x"), TypeError, "compile_train_step graphs='x' is invalid"),
    (dict(timeline="no"), TypeError, "compile_train_step timeline='no' is invalid"),
], ids=_stable_id)
def test_compile_train_step_refuses_before_compiling(kwargs, error, words):
    _refused(lambda: compile_train_step(SPEC, **kwargs), error, words)


def test_the_model_s_own_graphs_and_devices_still_size_the_step():
    memory = compile_train_step(SPEC, graphs_for(MODEL), devices=jax.devices()).memory
    assert memory.total_bytes == train_step_memory(SPEC).total_bytes > 0


@pytest.mark.parametrize("kwargs,error,words", [
    (dict(remat=3), TypeError, "recipe_memory: remat=3 is invalid: a remat spec (str) or a "
     "dict of processor_remat, remat_group_size, remat_ratio, remat_policy, not an int"),
    (dict(remat={"bogus": 1}), ValueError, "recipe_memory: remat={'bogus': 1} is invalid"),
    (dict(remat={"edge_block_size": 8}), ValueError, "not 'edge_block_size'"),
    (dict(edge_block=False), TypeError, "recipe_memory: edge_block=False is invalid"),
    (dict(edge_block=0.0), TypeError, "recipe_memory: edge_block=0.0 is invalid"),
    (dict(edge_block=-1), ValueError, "recipe_memory: edge_block=-1 is invalid: an integer >= 0"),
], ids=_stable_id)
def test_recipe_memory_refuses(kwargs, error, words):
    _refused(lambda: recipe_memory("lean", **kwargs), error, words)


def test_recipe_memory_still_takes_a_spec_a_dict_and_edge_block_0():
    assert recipe_memory("lean", remat="every:2").remat_spec == "every:2"
    dots = recipe_memory("none", remat={"processor_remat": "step", "remat_policy": "dots"})
    assert dots.remat_spec == "step,policy=dots"
    off = recipe_memory("lean", edge_block=np.int64(0))
    assert off.edge_block_size is None and not off.stream_grid_nodes


# ------------------------------------------------------------- measure


@pytest.mark.parametrize("plan", [compiled_memory, memory_timeline], ids=lambda f: f.__name__)
@pytest.mark.parametrize("args,kwargs,error,words", [
    ((S((4,), jnp.float64),), {}, ValueError, "args[0] dtype=float64 is invalid: a dtype of "
     "at most 32 bits while JAX's 64-bit mode is off"),
    (({"w": [S((2,), jnp.float32), S((2,), jnp.int64)]},), {}, ValueError,
     "args[0]['w'][1] dtype=int64 is invalid"),
    ((S((4,), jnp.float32),), {"y": S((4,), jnp.complex128)}, ValueError,
     "kwargs['y'] dtype=complex128 is invalid"),
    ((S((-4,), jnp.float32),), {}, ValueError, "args[0] shape=(-4,) is invalid: dimensions >= 0"),
], ids=_stable_id)
def test_plans_refuse_64_bit_and_negative_shapes(plan, args, kwargs, error, words):
    assert not jax.config.jax_enable_x64

    def fn(x, y=None):
        return x

    _refused(lambda: plan(fn, *args, **kwargs), error, f"{plan.__name__} {words}")


@pytest.mark.parametrize("plan", [compiled_memory, memory_timeline], ids=lambda f: f.__name__)
def test_plans_refuse_what_is_not_callable(plan):
    _refused(lambda: plan(3, S((4,), jnp.float32)), TypeError,
             f"{plan.__name__} fn is invalid: a function to compile, not an int")


@pytest.mark.parametrize("rules,words", [
    ("abc", "memory_timeline stage_rules is invalid: None or a sequence of (pattern, label) "
     "pairs"),
    ([("mul", "product"), ("a",)], "memory_timeline stage_rules[1]=('a',) is invalid"),
    ([("mul", 3)], "memory_timeline stage_rules[0]=('mul', 3) is invalid"),
], ids=_stable_id)
def test_memory_timeline_refuses_malformed_stage_rules(rules, words):
    _refused(lambda: memory_timeline(lambda x: x * 2, S((4,), jnp.float32), stage_rules=rules),
             TypeError, words)


def test_32_bit_plans_and_stage_rules_still_work():
    assert compiled_memory(lambda x: x * 2, S((4,), jnp.float32)).argument_bytes == 16
    timeline = memory_timeline(lambda x: jnp.sin(x) @ x.T, S((8, 8), jnp.float32),
                               stage_rules=[("sin", "sine")])
    assert timeline.argument_bytes == 256


@pytest.mark.parametrize("compare", [compare_leaves, gradient_cosine], ids=lambda f: f.__name__)
@pytest.mark.parametrize("leaves,reference,words", [
    ([np.ones(5)], [np.ones(1)], "leaves[0] is invalid: the shape of reference[0], (1,), not "
     "(5,)"),
    ([np.ones(2), np.ones((3, 1))], [np.ones(2), np.ones((1, 3))], "leaves[1] is invalid"),
    ([np.ones(2), np.ones(3)], [np.ones(3), np.ones(2)], "leaves[0] is invalid"),
    ([], [], "leaves is invalid: at least one gradient array"),
    ([np.ones(2)], [np.ones(2), np.ones(2)], "leaves is invalid: as many gradient arrays as "
     "reference, and it has 1 against 2"),
], ids=_stable_id)
def test_agreement_needs_leaves_of_one_shape_each(compare, leaves, reference, words):
    _refused(lambda: compare(leaves, reference), ValueError, f"{compare.__name__} {words}")


def test_agreement_of_matching_leaves():
    assert compare_leaves([np.ones(3)], [np.ones(3)]) == (0.0, 0.0)
    assert gradient_cosine([np.ones(2), 2 * np.ones(3)], [np.ones(2), 2 * np.ones(3)]) == \
        pytest.approx(1.0)


# ------------------------------------------------------------- memory.config


@pytest.mark.parametrize("args,kwargs,error,words", [
    ((0,), {}, ValueError, "scaled_edge_block num_mesh2grid_edges=0 is invalid: an integer >= 1"),
    ((-100,), {}, ValueError, "scaled_edge_block num_mesh2grid_edges=-100 is invalid"),
    (("abc",), {}, TypeError, "scaled_edge_block num_mesh2grid_edges='abc' is invalid"),
    ((1.5e6,), {}, TypeError, "scaled_edge_block num_mesh2grid_edges=1500000.0 is invalid"),
    ((1000000, 1.9), {}, TypeError, "scaled_edge_block block=1.9 is invalid"),
    ((1000000, 0), {}, ValueError, "scaled_edge_block block=0 is invalid"),
    ((10,), {"minimum": 0}, ValueError, "scaled_edge_block minimum=0 is invalid"),
], ids=_stable_id)
def test_scaled_edge_block_refuses(args, kwargs, error, words):
    _refused(lambda: scaled_edge_block(*args, **kwargs), error, words)


def test_replace_names_an_unknown_field_and_lists_the_fields():
    _refused(lambda: MemoryConfig().replace(bogus=1), ValueError,
             "MemoryConfig.replace bogus=1 is invalid: no such field; the fields are "
             "processor_remat, remat_group_size")
    _refused(lambda: MemoryConfig().replace(bogus=1), TypeError, "donate")


@pytest.mark.parametrize("spec", ["every:3_0", "every:\u0663", "every: 3", "every:+3",
                                  "ratio:-0", "ratio:1e-3", "ratio:inf", "ratio:nan",
                                  "nested:", "ratio:0x1"])
def test_remat_spec_numbers_are_ascii_integers_and_plain_decimals(spec):
    _refused(lambda: parse_remat_spec(spec), ValueError, f"malformed remat spec {spec!r}")


@pytest.mark.parametrize("ratio,text", [(0.123456789, "ratio:0.123456789"),
                                        (1e-7, "ratio:0.0000001"), (1 / 3, None),
                                        (0.5, "ratio:0.5"), (0.0, "ratio:0"), (1.0, "ratio:1")])
def test_ratio_spec_reads_back_as_the_same_ratio(ratio, text):
    memory = MemoryConfig(processor_remat="ratio", remat_ratio=ratio)
    assert text is None or memory.remat_spec == text
    assert MemoryConfig(**parse_remat_spec(memory.remat_spec)) == memory
