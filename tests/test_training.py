"""Training: loss weights, synthetic data, rollouts, micro-batches, donation, overfitting."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gclab.config import ModelConfig, TaskConfig
from gclab.data import SyntheticWeather
from gclab.graphs import build_graphs
from gclab.losses import channel_weights, latitude_weights, weighted_mse
from gclab.model import graph_inputs, make_network
from gclab.techniques import MemoryConfig
from gclab.training import (
    TrainConfig,
    example_shapes,
    init_state_from_params,
    loss_and_grad,
    loss_weights_for,
    make_optimizer,
    make_train_step,
    next_inputs,
    rollout_loss,
    train_step_fn,
)

TASK = TaskConfig(pressure_levels=(500, 850))
CFG = ModelConfig(resolution=10.0, mesh_splits=2, latent_size=32, processor_steps=2)


@pytest.fixture(scope="module")
def world():
    graphs = build_graphs(CFG.resolution, CFG.mesh_splits)
    weather = SyntheticWeather(TASK, CFG.resolution, seed=0)
    net = make_network(CFG, TASK.data_channels, TASK.output_channels)
    graph = graph_inputs(graphs)
    example = weather.make_batch(4, rollout=3)
    params = net.init(jax.random.PRNGKey(0), graph, jnp.asarray(example.inputs))
    weights = loss_weights_for(TASK, graphs.grid_lat, graphs.n_lon)
    return graphs, graph, weather, net, params, weights, example


# ----------------------------------------------------------------------------------------
# Loss weights.


def test_latitude_weights_are_cell_areas_with_mean_one():
    lat = np.linspace(-90, 90, 19)
    w = latitude_weights(lat)
    assert w.mean() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(w, w[::-1], rtol=1e-6)  # symmetric
    # Interior rows follow cos(lat); a pole row is the cap of half a cell.
    d = np.deg2rad(10.0)
    ratio = (1 - np.cos(d / 2)) / (2 * np.cos(np.deg2rad(80.0)) * np.sin(d / 2))
    assert w[0] / w[1] == pytest.approx(ratio, rel=1e-5)
    assert w[9] / w[5] == pytest.approx(1 / np.cos(np.deg2rad(40.0)), rel=1e-5)
    # The weights are the exact areas: they sum (times d lon) to the sphere.
    assert float(np.sum(w / w.mean() * (2 * np.cos(0) * np.sin(d / 2)) / w[9]) * 2 * np.pi
                 ) == pytest.approx(4 * np.pi, rel=1e-5)


def test_channel_weights_by_variable_and_level():
    w = channel_weights(TASK)
    names = TASK.target_channel_names
    assert w.shape == (TASK.output_channels,)
    assert w[names.index("2m_temperature")] == 1.0
    for v in ("mean_sea_level_pressure", "10m_u_component_of_wind", "total_precipitation_6hr"):
        assert w[names.index(v)] == pytest.approx(0.1)
    mean_level = (500 + 850) / 2
    assert w[names.index("temperature@500")] == pytest.approx(500 / mean_level)
    assert w[names.index("geopotential@850")] == pytest.approx(850 / mean_level)


def test_weighted_mse_equals_a_hand_computation():
    rng = np.random.default_rng(0)
    pred, target = rng.normal(size=(2, 6, 2, 3))
    node_w, chan_w = rng.uniform(size=6), rng.uniform(size=3)
    expected = np.mean((pred - target) ** 2 * node_w[:, None, None] * chan_w)
    got = weighted_mse(jnp.asarray(pred, jnp.bfloat16), jnp.asarray(target), (node_w, chan_w))
    assert got.dtype == jnp.float32
    assert float(weighted_mse(pred, target, (node_w, chan_w))) == pytest.approx(expected,
                                                                                 rel=1e-5)
    assert float(got) == pytest.approx(expected, rel=3e-2)


# ----------------------------------------------------------------------------------------
# Synthetic data.


def test_synthetic_data_is_deterministic_and_seeded():
    a = SyntheticWeather(TASK, 10.0, seed=3).make_batch(2, rollout=2)
    b = SyntheticWeather(TASK, 10.0, seed=3).make_batch(2, rollout=2)
    c = SyntheticWeather(TASK, 10.0, seed=4).make_batch(2, rollout=2)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.allclose(a.inputs, c.inputs)


@pytest.mark.parametrize("task,res", [(TASK, 10.0), (TaskConfig.from_levels(13), 6.0),
                                      (TaskConfig.from_levels(13, False), 12.0),
                                      (TaskConfig.from_levels(37), 20.0)])
def test_shapes_follow_the_task(task, res):
    ex = SyntheticWeather(task, res).make_batch(3, rollout=2)
    ng = (int(180 / res) + 1) * int(360 / res)
    assert ex.inputs.shape == (ng, 3, task.data_channels)
    assert ex.targets.shape == (2, ng, 3, task.output_channels)
    assert ex.forcings.shape == (2, ng, 3, 5)
    assert all(np.isfinite(a).all() for a in ex)


def test_fields_are_smooth_and_normalised():
    weather = SyntheticWeather(TASK, 5.0, seed=1)
    ex = weather.make_batch(1)
    field = ex.inputs[:, 0, 0].reshape(37, 72)  # one variable on the grid
    step = np.abs(np.diff(field, axis=1)).mean()
    assert step < 0.2 * field.std()
    # Normalised weather variables: about zero mean and unit spread over samples.
    many = weather.make_batch(8).inputs[..., :2 * TASK.output_channels]  # [Ng, 8, 2V]
    assert np.abs(many.mean((0, 1))).max() < 1.0
    assert 0.5 < float(many.std()) < 1.5
    # Consecutive frames are correlated: the residual is small next to the field.
    frames = weather.frames([10, 11])
    assert np.abs(frames[1] - frames[0]).std() < 0.5 * frames[0].std()


def test_toa_radiation_is_zero_at_night_and_bounded():
    f = SyntheticWeather(TASK, 10.0).forcings([5])[0, :, 0]
    assert f.min() == 0.0 and 0 < f.max() <= 1361.0
    assert 0.3 < (f > 0).mean() < 0.7  # about half the globe is lit


def test_bad_data_arguments():
    with pytest.raises(ValueError, match="resolution"):
        SyntheticWeather(TASK, 7.0)
    with pytest.raises(ValueError, match="batch"):
        SyntheticWeather(TASK, 10.0).make_batch(0)


# ----------------------------------------------------------------------------------------
# Rollouts, micro-batches, donation, shapes.


def test_next_inputs_shift_frames_and_forcings():
    V = TASK.output_channels
    inputs = jnp.arange(TASK.data_channels, dtype=jnp.float32)[None, None] * jnp.ones((2, 1, 1))
    pred = jnp.ones((2, 1, V))
    nxt = next_inputs(TASK, inputs, pred, jnp.full((2, 1, 5), -1.0))
    np.testing.assert_array_equal(nxt[0, 0, :V], inputs[0, 0, V:2 * V])  # newest -> previous
    np.testing.assert_array_equal(nxt[0, 0, V:2 * V], inputs[0, 0, V:2 * V] + 1)
    np.testing.assert_array_equal(nxt[0, 0, 2 * V:2 * V + 10], inputs[0, 0, 2 * V + 5:2 * V + 15])
    np.testing.assert_array_equal(nxt[0, 0, 2 * V + 10:2 * V + 15], -1.0)
    np.testing.assert_array_equal(nxt[0, 0, -2:], inputs[0, 0, -2:])  # statics


def _loss_grads(world, memory, example=None):
    _, graph, _, net, params, weights, ex = world
    ex = example if example is not None else ex
    return jax.jit(lambda p: loss_and_grad(
        p, graph, ex, memory=memory, net=net, task=TASK, rollout=ex.targets.shape[0],
        weights=weights))(params)


def _max_rel(a, b):
    return max(float(jnp.abs(x - y).max() / (jnp.abs(y).max() + 1e-30))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def test_rollout_remat_keeps_loss_and_gradients(world):
    loss0, g0 = _loss_grads(world, MemoryConfig())
    loss1, g1 = _loss_grads(world, MemoryConfig(rollout_remat=True))
    assert float(loss1) == pytest.approx(float(loss0), rel=1e-5)
    assert _max_rel(g1, g0) <= 1e-5


def test_rollout_loss_is_the_mean_over_steps(world):
    _, graph, _, net, params, weights, ex = world
    kw = dict(net=net, task=TASK, memory=MemoryConfig(), weights=weights)
    three = float(rollout_loss(params, graph, ex, rollout=3, **kw))
    one = float(rollout_loss(params, graph, ex._replace(targets=ex.targets[:1],
                                                        forcings=ex.forcings[:1]),
                             rollout=1, **kw))
    assert three != pytest.approx(one)
    with pytest.raises(ValueError, match="rollout"):
        rollout_loss(params, graph, ex, rollout=2, **kw)


@pytest.mark.parametrize("k", [2, 4])
def test_microbatches_equal_the_full_batch_gradient(world, k):
    loss0, g0 = _loss_grads(world, MemoryConfig())
    loss1, g1 = _loss_grads(world, MemoryConfig(microbatches=k))
    assert float(loss1) == pytest.approx(float(loss0), rel=1e-5)
    assert _max_rel(g1, g0) <= 1e-5


def test_microbatches_must_divide_the_batch(world):
    with pytest.raises(ValueError, match="divisible by microbatches=3"):
        _loss_grads(world, MemoryConfig(microbatches=3))


def test_donation_reuses_the_state_buffers(world):
    graphs, graph, weather, net, params, weights, _ = world
    opt = make_optimizer(TrainConfig())
    ex = weather.make_batch(1)
    for donate in (False, True):
        state = init_state_from_params(jax.tree_util.tree_map(jnp.array, params), opt)
        step = make_train_step(net, opt, TASK, MemoryConfig(donate=donate), 1, weights)
        new_state, metrics = step(state, graph, ex)
        leaf = jax.tree_util.tree_leaves(state.params)[0]
        assert leaf.is_deleted() == donate
        assert np.isfinite(float(metrics["loss"]))


def test_train_step_compiles_from_shapes_alone(world):
    graphs, graph, _, net, params, weights, _ = world
    opt = make_optimizer(TrainConfig())
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                    (params, graph))
    state = jax.eval_shape(lambda p: init_state_from_params(p, opt), shapes[0])
    ex = example_shapes(TASK, graphs.num_grid_nodes, 2, 2)
    step = train_step_fn(net, opt, TASK, MemoryConfig(rollout_remat=True), 2, weights)
    analysis = jax.jit(step).lower(state, shapes[1], ex).compile().memory_analysis()
    assert analysis is not None and analysis.temp_size_in_bytes > 0


@pytest.mark.parametrize("field,value", [
    ("peak_learning_rate", -1.0), ("warmup_steps", -1), ("total_steps", 10), ("b1", 1.0),
    ("b2", -0.1), ("weight_decay", -0.5), ("grad_clip", 0.0),
])
def test_bad_train_config_names_the_field(field, value):
    kw = {"warmup_steps": 10, "total_steps": 100, field: value}
    with pytest.raises(ValueError, match=f"TrainConfig.{field}="):
        TrainConfig(**kw)


# ----------------------------------------------------------------------------------------
# The model can learn: a fixed batch is overfitted.


def test_overfits_a_fixed_batch(world):
    graphs, graph, weather, net, params, weights, _ = world
    opt = make_optimizer(TrainConfig(peak_learning_rate=3e-3, warmup_steps=20,
                                     total_steps=300, weight_decay=0.0, grad_clip=None))
    ex = weather.make_batch(1)
    step = make_train_step(net, opt, TASK, MemoryConfig(donate=True), 1, weights,
                           weather.normalization().residual_scale)
    state = init_state_from_params(params, opt)
    losses = []
    for _ in range(300):
        state, metrics = step(state, graph, ex)
        losses.append(float(metrics["loss"]))
    assert losses[-1] <= losses[0] / 10
    assert int(state.step) == 300
