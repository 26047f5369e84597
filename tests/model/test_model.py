"""The network: parameter counts, the official tree, jit vs no-jit, configs and errors."""

import os

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from gclab.config import PRESETS, ModelConfig, TaskConfig, get_preset
from gclab.geometry import build_graphs
from gclab.model import (
    ParamMismatch,
    count_params,
    graph_inputs,
    make_network,
    param_mismatches,
    param_shapes,
)
from gclab.model import official as params_lib

# Official parameter counts (GRAPHCAST.md, "Parameter tree and counts").
OFFICIAL_COUNTS = {
    "graphcast": 36_348_131,
    "graphcast-small": 35_979_347,
    "graphcast-operational": 35_977_299,
    "cpu-4x32": 70_739,
}


@pytest.mark.parametrize("name,count", sorted(OFFICIAL_COUNTS.items()))
def test_parameter_counts_equal_official(name, count):
    p = get_preset(name)
    shapes = param_shapes(p.model, p.task.data_channels, p.task.output_channels)
    assert count_params(shapes) == count


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_has_a_parameter_tree_convertible_to_official(name):
    p = get_preset(name)
    shapes = param_shapes(p.model, p.task.data_channels, p.task.output_channels)
    tree = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes)
    official = params_lib.to_official(tree)
    steps = p.model.processor_steps
    # Official blocks: 6 (encoder) + 1 + 2 S (processor) + 5 (decoder), MLP and norm.
    mlps = {k.split("_mlp/")[0] for k in official if "_mlp/" in k}
    assert len(mlps) == 6 + 1 + 2 * steps + 5
    last = f"mesh_gnn/~_networks_builder/processor_edges_{steps - 1}_mesh_mlp/~/linear_0"
    assert last in official
    back = params_lib.from_official(official)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(tree)


def test_task_channel_widths():
    assert TaskConfig.from_levels(37).input_channels == 474
    assert TaskConfig.from_levels(37).output_channels == 227
    assert TaskConfig.from_levels(13).input_channels == 186
    assert TaskConfig.from_levels(13).output_channels == 83
    assert TaskConfig.from_levels(13, precipitation_input=False).input_channels == 184


@pytest.fixture(scope="module")
def tiny():
    cfg = ModelConfig(resolution=10.0, mesh_splits=2, latent_size=16, processor_steps=3)
    graph = graph_inputs(build_graphs(cfg.resolution, cfg.mesh_splits))
    inputs = jax.random.normal(jax.random.PRNGKey(1), (graph.grid_nodes.shape[0], 2, 5))
    net = make_network(cfg, 5, 4)
    params = net.init(jax.random.PRNGKey(0), graph, inputs)
    return cfg, graph, inputs, net, params


def _primitives(jaxpr) -> set:
    """Names of every primitive in `jaxpr`, inner jaxprs (scan bodies, ...) included."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            names |= _primitives(sub)
    return names


def test_init_makes_the_parameters_without_running_the_network(tiny):
    """`init` draws the parameters and nothing else: no matrix product, no scan."""
    _, graph, inputs, net, params = tiny
    used = _primitives(jax.make_jaxpr(net.init)(jax.random.PRNGKey(0), graph, inputs).jaxpr)
    assert "erf_inv" in used  # the truncated-normal weights are drawn
    assert not used & {"dot_general", "scan", "scatter-add"}
    applied = _primitives(jax.make_jaxpr(net.apply)(params, graph, inputs).jaxpr)
    assert {"dot_general", "scan"} <= applied  # the names are right: apply has them
    jitted = jax.jit(net.init)(jax.random.PRNGKey(0), graph, inputs)  # the same draws
    assert jax.tree_util.tree_structure(jitted) == jax.tree_util.tree_structure(params)
    for a, b in zip(jax.tree_util.tree_leaves(jitted), jax.tree_util.tree_leaves(params)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # fused: a last bit may move


def test_jit_and_no_jit_agree(tiny):
    _, graph, inputs, net, params = tiny
    jitted = jax.jit(net.apply)(params, graph, inputs)
    with jax.disable_jit():
        eager = net.apply(params, graph, inputs)
    assert jitted.shape == (graph.grid_nodes.shape[0], 2, 4)
    np.testing.assert_allclose(jitted, eager, atol=1e-5, rtol=1e-5)


def test_batch_is_a_feature_axis(tiny):
    """Each batch element is computed independently of the others."""
    _, graph, inputs, net, params = tiny
    apply = jax.jit(net.apply)  # one compile per batch size, not one per operation
    both = apply(params, graph, inputs)
    first = apply(params, graph, inputs[:, :1])
    np.testing.assert_allclose(both[:, :1], first, atol=1e-5)


def test_decoder_mesh_block_gets_zero_gradient_but_exists(tiny):
    _, graph, inputs, net, params = tiny
    grads = jax.jit(jax.grad(lambda p: jnp.sum(net.apply(p, graph, inputs) ** 2)))(params)
    dead = "mesh2grid_gnn/processor_nodes_0_mesh_nodes_mlp/~/linear_0"
    assert dead in params
    assert float(jnp.abs(grads[dead]["w"]).max()) == 0.0
    live = "mesh2grid_gnn/processor_nodes_0_grid_nodes_mlp/~/linear_0"
    assert float(jnp.abs(grads[live]["w"]).max()) > 0.0


def test_bad_inputs_give_clear_errors(tiny):
    _, graph, inputs, net, params = tiny
    with pytest.raises(ValueError, match="inputs must have shape"):
        net.apply(params, graph, inputs[..., :3])
    with pytest.raises(ValueError, match="grid nodes"):
        net.apply(params, graph, inputs[:10])
    with pytest.raises(ValueError, match="data_channels"):
        make_network(ModelConfig(), 0, 3)
    # Named when the network is made or applied, not as an attribute error inside.
    with pytest.raises(TypeError, match="model='cpu-4x32' is invalid: a ModelConfig"):
        make_network("cpu-4x32", 3, 3)
    with pytest.raises(TypeError, match="memory='lean' is invalid: a MemoryConfig or None"):
        make_network(ModelConfig(), 3, 3, memory="lean")
    with pytest.raises(TypeError, match="graph=None is invalid: a GraphInputs"):
        net.apply(params, None, inputs)


@pytest.mark.parametrize("field,value,message", [
    ("resolution", 7.0, "180 / resolution"),
    ("resolution", -1.0, "positive"),
    ("resolution", "1", "positive"),
    ("mesh_splits", 8, "0..7"),
    ("mesh_splits", -1, "0..7"),
    ("latent_size", 0, ">= 1"),
    ("processor_steps", 0, ">= 1"),
    ("hidden_layers", 0, ">= 1"),
    ("radius_query_fraction_edge_length", 0.0, "> 0"),
    ("radius_query_fraction_edge_length", -0.6, "> 0"),
    ("mesh2grid_edge_normalization_factor", 0.0, "None or"),
])
def test_config_errors_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=f"ModelConfig.{field}=.*{message}"):
        ModelConfig(**{field: value})


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ValueError, match="known presets: .*graphcast-small"):
        get_preset("graphcast-huge")


def test_task_config_errors():
    with pytest.raises(ValueError, match="13 or 37"):
        TaskConfig.from_levels(12)
    with pytest.raises(ValueError, match="pressure_levels"):
        TaskConfig(pressure_levels=())


def test_param_mismatches_lists_unknown_then_missing_or_misshapen():
    expected = {"a": {"w": np.zeros((2, 3)), "b": np.zeros(3)}, "c": {"w": np.zeros(1)}}
    assert param_mismatches({"a": {"b": np.ones(3), "w": np.ones((2, 3))},
                             "c": {"w": np.ones(1)}}, expected) == []
    given = {"z": {}, "a": {"w": np.zeros((3, 3)), "x": np.zeros(1), "b": [0.0]}}
    assert param_mismatches(given, expected) == [
        ParamMismatch("z", None, None, None, True),  # a module the model lacks
        ParamMismatch("a", "x", (1,), None, True),
        ParamMismatch("a", "w", (3, 3), (2, 3), False),
        ParamMismatch("a", "b", None, (3,), False),  # a leaf without a shape is missing
        ParamMismatch("c", None, None, None, False),  # a module the tree lacks
    ]
    # A module that is not a mapping has no parameters.
    assert param_mismatches({"a": 3, "c": expected["c"]}, expected) == [
        ParamMismatch("a", "w", None, (2, 3), False), ParamMismatch("a", "b", None, (3,), False)]


def test_count_params_names_a_tree_of_the_wrong_kind():
    # Not an AttributeError from inside ('str' object has no attribute 'shape').
    for bad, kind in (("params", "str"), ({"a": {"w": [1.0, 2.0]}}, "float")):
        with pytest.raises(TypeError, match=fr"^params is invalid: a tree of arrays \(it has "
                                            fr"a leaf of type {kind}\)$"):
            count_params(bad)
    assert count_params({"a": {"w": np.zeros((2, 3)), "b": np.zeros(3)}}) == 9


def test_param_mismatches_names_a_tree_that_is_no_mapping():
    for args, name in ((("abc", {}), "params='abc'"), (({}, None), "expected=None")):
        with pytest.raises(TypeError, match=f"^param_mismatches {name} is invalid: a "):
            param_mismatches(*args)


def test_to_official_names_a_tree_that_is_not_gclabs():
    # Guards against numpy's and Python's own complaints from inside ("not enough values to
    # unpack", StopIteration, IndexError, AttributeError) and against an official path
    # converted a second time (its '~_networks_builder/' doubled).
    official = "mesh_gnn/~_networks_builder/processor_edges_0_mesh_mlp/~/linear_0"
    for module in ("a", official):
        with pytest.raises(ValueError, match=f"^params is invalid: '{module}' is not a module "
                                             "path of gclab's GraphCast tree"):
            params_lib.to_official({module: {"w": np.zeros(2)}})
    stacked = "mesh_gnn/processor_edges_mesh_mlp/~/linear_0"
    for leaves, shapes in (({}, r"\[\]"), ({"w": np.zeros(())}, r"\[\(\)\]"),
                           ({"w": np.zeros((2, 3)), "b": np.zeros(1)}, r"\[\(2, 3\), \(1,\)\]")):
        with pytest.raises(ValueError, match=f"^params is invalid: {stacked} is stacked over "
                                             f"the processor steps: .* got shapes {shapes}$"):
            params_lib.to_official({stacked: leaves})
    with pytest.raises(TypeError, match="^params='params' is invalid: a {module: {name: "
                                        "array}} mapping, not a str$"):
        params_lib.to_official("params")
    with pytest.raises(TypeError, match="^params is invalid: grid2mesh_gnn/x is an int, not a "
                                        r"{name: array} mapping$"):
        params_lib.to_official({"grid2mesh_gnn/x": 3})
    both = params_lib.to_official({stacked: {"w": np.zeros((2, 3)), "b": np.zeros((2, 1))}})
    assert sorted(both) == [official, official.replace("_0_", "_1_")]


@pytest.mark.parametrize("channels, named", [(("3", 3), "data_channels='3'"),
                                             ((3, 2.0), "output_channels=2.0")])
def test_make_network_names_a_channel_count_of_the_wrong_kind(channels, named):
    from gclab.config import WrongType

    with pytest.raises(WrongType, match=f"^{named} is invalid: an integer >= 1$"):
        make_network(ModelConfig(), *channels)
    with pytest.raises(ValueError, match="^data_channels=0 is invalid: an integer >= 1$"):
        make_network(ModelConfig(), 0, 3)
    make_network(ModelConfig(), np.int64(3), np.int32(2))  # numpy counts are counts


@pytest.mark.parametrize("official, message", [
    (["a"], r"^official=\['a'\] is invalid: a \{module: \{name: array\}\} mapping, not a list$"),
    ({"grid2mesh_gnn/~_networks_builder/x": 3},
     r"^official is invalid: grid2mesh_gnn/~_networks_builder/x is an int, not a "
     r"\{name: array\} mapping$"),
])
def test_from_official_names_an_argument_of_the_wrong_kind(official, message):
    from gclab.config import WrongType

    with pytest.raises(WrongType, match=message):
        params_lib.from_official(official)
    with pytest.raises(ValueError, match="^not an official GraphCast parameter path: 3$"):
        params_lib.from_official({3: {}})  # a key that is no path at all


def test_param_shapes_start_no_backend():
    # The command line checks a checkpoint's parameters before it sets the device count or
    # joins a multi-process run, both of which must come before JAX's backend starts.
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import jax
        from gclab.config import ModelConfig
        from gclab.model.graphcast import param_shapes
        shapes = param_shapes(ModelConfig(resolution=10.0, mesh_splits=1, latent_size=8,
                                          processor_steps=1), 5, 4)
        assert shapes, shapes
        jax.config.update("jax_num_cpu_devices", 2)  # refused once a backend has started
        assert len(jax.devices("cpu")) == 2, jax.devices()
    """)
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "JAX_PLATFORMS": "cpu"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_param_shapes_are_traced_once_and_each_call_has_its_own_tree(monkeypatch):
    from gclab.model import graphcast

    cfg = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=8, processor_steps=2)
    traced = []
    real = graphcast.make_network
    monkeypatch.setattr(graphcast, "make_network", lambda *a: traced.append(a) or real(*a))
    graphcast._traced_param_shapes.cache_clear()
    first = param_shapes(cfg, 5, 4)
    second = param_shapes(cfg, np.int64(5), 4)  # channel counts as numpy gives them
    assert len(traced) == 1
    assert jax.tree_util.tree_structure(first) == jax.tree_util.tree_structure(second)
    assert jax.tree_util.tree_leaves(first) == jax.tree_util.tree_leaves(second)
    module = next(iter(first))
    first[module].pop(next(iter(first[module])))  # a caller's edit reaches no other call
    assert param_shapes(cfg, 5, 4) == second and len(traced) == 1
    param_shapes(cfg, 5, 3)  # other channels: another trace
    assert len(traced) == 2


@pytest.mark.parametrize("model, channels, message", [
    ("cfg", 5.5, "data_channels=5.5 is invalid: an integer >= 1"),
    ("cfg", True, "data_channels=True is invalid: an integer >= 1"),
    ("cfg", None, "data_channels=None is invalid: an integer >= 1"),
    ({"resolution": 10.0}, 5, "model=.* is invalid: a ModelConfig"),
])
def test_param_shapes_refuse_what_make_network_refuses(model, channels, message):
    """The per-process cache of shapes takes only a ModelConfig and integer channel counts;
    anything else is refused in make_network's words (not int()'s or hash()'s)."""
    from gclab.config import WrongType

    cfg = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=8, processor_steps=2)
    with pytest.raises(WrongType, match=message):
        param_shapes(cfg if model == "cfg" else model, channels, 4)


def test_param_shapes_hold_no_sharding_of_the_first_callers_mesh():
    from jax.sharding import AxisType

    from gclab.model import graphcast

    cfg = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=8, processor_steps=1)
    graphcast._traced_param_shapes.cache_clear()
    mesh = jax.make_mesh((1,), ("data",), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
        inside = param_shapes(cfg, 5, 4)
    outside = param_shapes(cfg, 5, 4)
    assert all(leaf.sharding is None for leaf in jax.tree_util.tree_leaves(outside))
    assert jax.tree_util.tree_leaves(inside) == jax.tree_util.tree_leaves(outside)
