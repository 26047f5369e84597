"""Training: loss weights, rollouts, micro-batches, remat, donation, shapes, overfitting."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gclab.config import ModelConfig, TaskConfig, WrongType
from gclab.geometry import build_graphs
from gclab.memory import MemoryConfig, get_recipe
from gclab.model import graph_inputs, make_network
from gclab.training import (
    SyntheticWeather,
    TrainConfig,
    channel_weights,
    example_shapes,
    init_state_from_params,
    latitude_weights,
    level_weights,
    loss_and_grad,
    loss_weights,
    make_optimizer,
    make_train_step,
    next_inputs,
    rollout_loss,
    train_step_fn,
    weighted_mse,
)
from gclab.training.examples import Example
from gclab.training.step import _split_batch

TASK = TaskConfig(pressure_levels=(500, 850))
CFG = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=16, processor_steps=2)


@pytest.fixture(scope="module")
def world():
    graphs = build_graphs(CFG.resolution, CFG.mesh_splits)
    weather = SyntheticWeather(TASK, CFG.resolution, seed=0)
    net = make_network(CFG, TASK.data_channels, TASK.output_channels)
    graph = graph_inputs(graphs)
    example = jax.tree_util.tree_map(jnp.asarray, weather.make_batch(4, rollout=2))
    params = jax.jit(net.init)(jax.random.PRNGKey(0), graph, example.inputs)
    weights = loss_weights(TASK, graphs.grid_lat, graphs.n_lon)
    scale = weather.normalization().residual_scale
    kw = dict(net=net, task=TASK, weights=weights, residual_scale=scale)
    return dict(graphs=graphs, graph=graph, weather=weather, net=net, params=params,
                example=example, kw=kw)


# ----------------------------------------------------------------------------------------
# Loss weights and the loss.


def test_latitude_weights_are_cell_areas_with_mean_one():
    lat = np.linspace(-90, 90, 19)  # 10 degree pole-inclusive grid
    w = latitude_weights(lat)
    assert w.mean() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(w, w[::-1], rtol=1e-6)  # symmetric
    np.testing.assert_allclose(latitude_weights(lat[::-1]), w[::-1], rtol=1e-6)
    # Interior rows follow cos(lat); a pole row is the cap of half a cell,
    # (1 - cos(d/2)) / (2 sin(d/2)) of an equator row: 0.0218 at 10 degrees.
    d = np.deg2rad(10.0)
    assert w[0] / w[9] == pytest.approx((1 - np.cos(d / 2)) / (2 * np.sin(d / 2)), rel=1e-5)
    assert w[0] / w[9] == pytest.approx(0.02182, rel=1e-3)
    assert w[0] < 0.5 * w[1]
    assert w[9] / w[5] == pytest.approx(1 / np.cos(np.deg2rad(40.0)), rel=1e-5)
    # Unnormalised, the rows' areas add up to the sphere: sum_i area_i x 2 pi = 4 pi.
    area_equator = 2 * np.sin(d / 2)
    assert float(np.sum(w / w[9] * area_equator) * 2 * np.pi) == pytest.approx(4 * np.pi,
                                                                              rel=1e-6)
    # A grid without pole rows is plain cos(lat).
    mid = np.arange(-85.0, 90.0, 10.0)
    np.testing.assert_allclose(latitude_weights(mid), np.cos(np.deg2rad(mid))
                               / np.cos(np.deg2rad(mid)).mean(), rtol=1e-5)


def test_level_and_variable_weights():
    task = TaskConfig.from_levels(13)
    lw = level_weights(task)
    assert lw.mean() == pytest.approx(1.0)
    assert lw[-1] / lw[0] == pytest.approx(1000 / 50)
    w = channel_weights(task)
    names = task.target_channel_names
    assert w.shape == (task.output_channels,)
    assert w[names.index("2m_temperature")] == 1.0
    for v in ("mean_sea_level_pressure", "10m_u_component_of_wind", "10m_v_component_of_wind",
              "total_precipitation_6hr"):
        assert w[names.index(v)] == pytest.approx(0.1)
    mean_level = np.mean(task.pressure_levels)
    for var in ("temperature", "geopotential", "specific_humidity"):
        for p in (50, 500, 1000):
            assert w[names.index(f"{var}@{p}")] == pytest.approx(p / mean_level / 13, rel=1e-6)
        # An atmospheric variable weighs 1 in total, like 2m temperature.
        assert sum(w[names.index(f"{var}@{p}")] for p in task.pressure_levels) == \
            pytest.approx(1.0, rel=1e-6)
    assert w.sum() == pytest.approx(1.0 + 4 * 0.1 + 6 * 1.0, rel=1e-6)


def test_weighted_mse_equals_a_hand_computation():
    rng = np.random.default_rng(0)
    pred, target = rng.normal(size=(2, 6, 2, 3))  # [Ng=6, B=2, O=3]
    node_w, chan_w = rng.uniform(size=6), rng.uniform(size=3)
    # Per sample b: sum_c chan_w[c] * mean_n node_w[n] (pred - target)^2; then mean over b.
    per_sample = [sum(chan_w[c] * np.mean([node_w[n] * (pred[n, b, c] - target[n, b, c]) ** 2
                                           for n in range(6)]) for c in range(3))
                  for b in range(2)]
    expected = np.mean(per_sample)
    got = weighted_mse(jnp.asarray(pred), jnp.asarray(target), (node_w, chan_w))
    assert float(got) == pytest.approx(expected, rel=1e-6)
    # bfloat16 predictions: the loss is still computed (and returned) in float32.
    bf = weighted_mse(jnp.asarray(pred, jnp.bfloat16), jnp.asarray(target), (node_w, chan_w))
    assert bf.dtype == jnp.float32
    assert float(bf) == pytest.approx(expected, rel=2e-2)


@pytest.mark.parametrize("pred,target,weights,words", [
    ((6, 1, 3), (6, 2, 3), (6, 3), "prediction (6, 1, 3) and target (6, 2, 3)"),  # broadcast
    ((6, 3), (6, 3), (6, 3), "prediction (6, 3)"),
    ((6, 1, 3), (6, 1, 3), (6, 2), "weights of shapes (6,) and (2,)"),
    ((6, 1, 3), (6, 1, 3), (5, 3), "weights of shapes (5,) and (3,)"),
])
def test_weighted_mse_refuses_shapes_it_would_broadcast(pred, target, weights, words):
    """A batch of one against a batch of two broadcast to a loss with no error before."""
    with pytest.raises(ValueError, match=re.escape(words)):
        weighted_mse(jnp.zeros(pred), jnp.zeros(target), tuple(np.ones(n) for n in weights))


def test_loss_weights_match_the_grid(world):
    graphs = world["graphs"]
    node_w, chan_w = loss_weights(TASK, graphs.grid_lat, graphs.n_lon)
    assert node_w.shape == (graphs.num_grid_nodes,) and chan_w.shape == (TASK.output_channels,)
    assert node_w.mean() == pytest.approx(1.0, rel=1e-6)
    assert node_w[0] == node_w[graphs.n_lon - 1] < node_w[graphs.num_grid_nodes // 2]


# ----------------------------------------------------------------------------------------
# Rollouts.


def test_next_inputs_shift_frames_and_forcings():
    V = TASK.output_channels
    inputs = jnp.arange(TASK.data_channels, dtype=jnp.float32)[None, None] * jnp.ones((2, 1, 1))
    pred = jnp.ones((2, 1, V))
    scale = np.linspace(0.1, 0.5, V)
    nxt = next_inputs(TASK, inputs, pred, jnp.full((2, 1, 5), -1.0), scale)
    np.testing.assert_array_equal(nxt[0, 0, :V], inputs[0, 0, V:2 * V])  # newest -> previous
    np.testing.assert_allclose(nxt[0, 0, V:2 * V], inputs[0, 0, V:2 * V] + scale, rtol=1e-6)
    np.testing.assert_array_equal(nxt[0, 0, 2 * V:2 * V + 10], inputs[0, 0, 2 * V + 5:2 * V + 15])
    np.testing.assert_array_equal(nxt[0, 0, 2 * V + 10:2 * V + 15], -1.0)
    np.testing.assert_array_equal(nxt[0, 0, -2:], inputs[0, 0, -2:])  # statics


@pytest.mark.parametrize("precipitation_input", [True, False])
def test_true_residuals_roll_the_data_forward(precipitation_input):
    """Feeding the true residuals through `next_inputs` gives the data's next inputs."""
    task = TaskConfig((500, 850), precipitation_input)
    weather = SyntheticWeather(task, 20.0, seed=1)
    norm = weather.normalization()
    ex = weather.make_batch(1, rollout=3, start=5)
    inputs, previous = ex.inputs, 0.0
    for k in range(2):
        residual = np.where(norm.is_residual, ex.targets[k] - previous, 0.0)  # [Ng, B, O]
        previous = ex.targets[k]
        inputs = next_inputs(task, inputs, residual, ex.forcings[k], norm.residual_scale)
        expected = weather.make_batch(1, rollout=1, start=6 + k).inputs
        np.testing.assert_allclose(inputs, expected, atol=2e-4)


def _max_rel(a, b):
    """Largest |a - b| over a leaf, relative to the largest |b| of that leaf."""
    return max(float(jnp.abs(x - y).max() / (jnp.abs(y).max() + 1e-30))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def _loss_grads(world, memory):
    """Jitted loss and gradients of the world's example (B = 4, T = 2)."""
    fn = jax.jit(lambda p, e: loss_and_grad(p, world["graph"], e, memory=memory,
                                            rollout=2, **world["kw"]))
    return fn(world["params"], world["example"])


@pytest.fixture(scope="module")
def baseline(world):
    return _loss_grads(world, MemoryConfig())


def test_rollout_loss_is_the_error_of_the_predicted_state(world, baseline):
    """T = 2 by hand: step 2 is scored on prediction 1 + prediction 2 (the state error)."""
    net, params, graph, kw = world["net"], world["params"], world["graph"], world["kw"]
    ex = world["example"]

    @jax.jit
    def by_hand(params):
        p1 = net.apply(params, graph, ex.inputs)  # [Ng, B, O]
        p2 = net.apply(params, graph, next_inputs(TASK, ex.inputs, p1, ex.forcings[0],
                                                  kw["residual_scale"]))
        return (weighted_mse(p1, ex.targets[0], kw["weights"])
                + weighted_mse(p1 + p2, ex.targets[1], kw["weights"])) / 2

    assert float(baseline[0]) == pytest.approx(float(by_hand(params)), rel=1e-5)
    with pytest.raises(ValueError, match="rollout"):
        rollout_loss(params, graph, ex, memory=MemoryConfig(), rollout=3, **kw)


# ----------------------------------------------------------------------------------------
# Memory techniques keep the loss and gradients.


def test_rollout_remat_keeps_loss_and_gradients(world, baseline):
    loss0, g0 = baseline
    loss1, g1 = _loss_grads(world, MemoryConfig(rollout_remat=True))
    assert float(loss1) == pytest.approx(float(loss0), rel=1e-5)
    assert _max_rel(g1, g0) <= 1e-5
    assert _max_rel(g0, jax.tree_util.tree_map(jnp.zeros_like, g0)) > 0  # gradients exist


def test_microbatches_take_every_kth_sample():
    """Micro-batch m holds the samples i with i % k = m: with the batch split over `data`
    (each device a contiguous range), every micro-batch keeps each device's share."""
    B, k = 8, 4
    ex = Example(jnp.arange(B)[None, :, None] * jnp.ones((3, 1, 2)),  # [Ng, B, C]
                 jnp.arange(B)[None, None, :, None] * jnp.ones((2, 3, 1, 1)),  # [T, Ng, B, O]
                 jnp.arange(B)[None, None, :, None] * jnp.ones((2, 3, 1, 5)))  # [T, Ng, B, 5]
    micro = _split_batch(ex, k)
    assert micro.inputs.shape == (k, 3, B // k, 2)
    assert micro.targets.shape == (k, 2, 3, B // k, 1)
    assert micro.forcings.shape == (k, 2, 3, B // k, 5)
    for m in range(k):
        samples = np.arange(m, B, k)  # [B / k]
        np.testing.assert_array_equal(micro.inputs[m, 0, :, 0], samples)
        np.testing.assert_array_equal(micro.targets[m, 1, 2, :, 0], samples)
        np.testing.assert_array_equal(micro.forcings[m, 0, 1, :, 4], samples)


@pytest.mark.parametrize("k", [2, 4])
def test_microbatches_keep_the_full_batch_loss_to_float32_rounding(world, baseline, k):
    loss0, g0 = baseline
    loss1, g1 = _loss_grads(world, MemoryConfig(microbatches=k))
    assert float(loss1) == pytest.approx(float(loss0), rel=1e-6)
    assert _max_rel(g1, g0) <= 1e-6


def test_microbatches_must_divide_the_batch(world):
    with pytest.raises(ValueError, match="divisible by microbatches=3"):
        _loss_grads(world, MemoryConfig(microbatches=3))


def test_no_donation_unless_asked(world):
    opt = make_optimizer(TrainConfig())
    state = init_state_from_params(world["params"], opt)
    args = (state, world["graph"], world["example"])
    texts = [make_train_step(world["net"], opt, TASK, MemoryConfig(donate=d), 2,
                             world["kw"]["weights"]).lower(*args).as_text()
             for d in (False, True)]
    assert "tf.aliasing_output" not in texts[0] and "jax.buffer_donor" not in texts[0]
    assert "tf.aliasing_output" in texts[1] or "jax.buffer_donor" in texts[1]


def _trace_two_steps(world, opt) -> None:
    """Traces a training step with `opt` for two memory techniques of the world's model."""
    args = jax.eval_shape(lambda: (init_state_from_params(world["params"], opt),
                                   world["graph"], world["example"]))
    remat = MemoryConfig(processor_remat="step")
    nets = {MemoryConfig(): world["net"],
            remat: make_network(CFG, TASK.data_channels, TASK.output_channels, remat)}
    for memory, net in nets.items():
        jax.jit(train_step_fn(net, opt, TASK, memory, 2, world["kw"]["weights"])).trace(*args)


def test_steps_with_one_built_optimizer_trace_its_update_once(world, monkeypatch):
    """Steps compiled in one process with an optimizer `make_optimizer` built, for one
    model's parameters, trace its update once between them, whatever their memory
    techniques (its jitted update keeps its trace); one optimizer per configuration."""
    calls, adamw = [], optax.adamw

    def counted(*args, **kwargs):
        inner = adamw(*args, **kwargs)

        def update(grads, state, params=None):
            calls.append(1)
            return inner.update(grads, state, params)

        return optax.GradientTransformation(inner.init, update)

    monkeypatch.setattr(optax, "adamw", counted)
    config = TrainConfig(warmup_steps=123)  # built by no other test: counted from its first
    _trace_two_steps(world, make_optimizer(config))
    assert len(calls) == 1
    assert make_optimizer(config) is make_optimizer(TrainConfig(warmup_steps=123))
    assert make_optimizer(config) is not make_optimizer(TrainConfig())


def test_a_callers_own_optimizer_is_traced_with_each_step(world):
    """An optimizer built elsewhere is traced anew by each step (it may read Python state
    that changed in between) and need not be hashable."""
    import types

    calls, sgd = [], optax.sgd(0.1)

    def update(grads, state, params=None):
        calls.append(1)
        return sgd.update(grads, state, params)

    _trace_two_steps(world, optax.GradientTransformation(sgd.init, update))
    assert len(calls) == 2
    _trace_two_steps(world, types.SimpleNamespace(init=sgd.init, update=update))
    assert len(calls) == 4


# ----------------------------------------------------------------------------------------
# The step's memory techniques are the network's.


def _step_callers(world, memory):
    """Each function that takes the step's memory, called with the world's network."""
    opt, graph, ex = make_optimizer(TrainConfig()), world["graph"], world["example"]
    kw, params = world["kw"], world["params"]
    return {
        "make_train_step": lambda: make_train_step(world["net"], opt, TASK, memory, 2,
                                                   kw["weights"]),
        "train_step_fn": lambda: train_step_fn(world["net"], opt, TASK, memory, 2,
                                               kw["weights"]),
        "loss_and_grad": lambda: loss_and_grad(params, graph, ex, memory=memory, rollout=2,
                                               **kw),
        "rollout_loss": lambda: rollout_loss(params, graph, ex, memory=memory, rollout=2, **kw),
    }


def test_the_network_carries_the_memory_it_was_built_with(world):
    lean = get_recipe("lean", "bf16")
    assert make_network(CFG, TASK.data_channels, TASK.output_channels, lean).memory == lean
    assert world["net"].memory == MemoryConfig()  # built without one: the baseline


@pytest.mark.parametrize("caller", ["make_train_step", "train_step_fn", "loss_and_grad",
                                    "rollout_loss"])
@pytest.mark.parametrize("memory,words", [
    # The world's network is float32 without techniques: a bfloat16 or remat step on it
    # ran float32 without them, and reported what it had been given.
    (MemoryConfig(precision="bf16"), "it has precision='bf16', the network was built with "
                                     "precision='f32';"),
    (MemoryConfig(processor_remat="step", microbatches=2),
     "it has processor_remat='step', the network was built with processor_remat='none';"),
    (MemoryConfig(edge_block_size=64), "edge_block_size=64, the network was built with "
                                       "edge_block_size=None"),
])
def test_a_memory_the_network_does_not_apply_is_refused(world, caller, memory, words):
    with pytest.raises(ValueError) as e:
        _step_callers(world, memory)[caller]()
    text = str(e.value)
    assert text.startswith(f"{caller} memory is invalid: ") and words in text, text
    assert "\n" not in text and "only rollout_remat, microbatches, donate may differ" in text


@pytest.mark.parametrize("caller", ["make_train_step", "train_step_fn", "loss_and_grad",
                                    "rollout_loss"])
@pytest.mark.parametrize("memory,kind", [("lean", "a str"), (None, "None")])
def test_a_memory_of_the_wrong_kind_is_named(world, caller, memory, kind):
    with pytest.raises(WrongType, match=re.escape(
            f"{caller} memory={memory!r} is invalid: a MemoryConfig, not {kind}")):
        _step_callers(world, memory)[caller]()


def test_the_fields_the_step_applies_may_differ_from_the_network(world):
    memory = MemoryConfig(rollout_remat=True, microbatches=2, donate=True)
    for caller in ("make_train_step", "train_step_fn"):
        assert callable(_step_callers(world, memory)[caller]())
    # A network built with bfloat16 takes a bfloat16 step, whatever its step-only fields.
    net = make_network(CFG, TASK.data_channels, TASK.output_channels,
                       MemoryConfig(precision="bf16", microbatches=4))
    opt = make_optimizer(TrainConfig())
    assert callable(make_train_step(net, opt, TASK, MemoryConfig(precision="bf16"), 1,
                                    world["kw"]["weights"]))
    with pytest.raises(ValueError, match="it has precision='f32', the network was built "
                                         "with precision='bf16'"):
        make_train_step(net, opt, TASK, MemoryConfig(), 1, world["kw"]["weights"])


@pytest.mark.parametrize("rollout", [0, -1, 1.5])
def test_a_rollout_below_one_step_is_refused(world, rollout):
    opt, kw = make_optimizer(TrainConfig()), world["kw"]
    for caller, make in (("make_train_step", make_train_step), ("train_step_fn", train_step_fn)):
        with pytest.raises(ValueError, match=re.escape(
                f"{caller} rollout={rollout!r} is invalid: an integer >= 1")):
            make(world["net"], opt, TASK, MemoryConfig(), rollout, kw["weights"])
    with pytest.raises(ValueError, match="rollout_loss rollout="):
        rollout_loss(world["params"], world["graph"], world["example"], memory=MemoryConfig(),
                     rollout=rollout, **kw)


# ----------------------------------------------------------------------------------------
# Optimiser and config.


def test_optimizer_schedule_warms_up_then_decays():
    cfg = TrainConfig(peak_learning_rate=1e-3, warmup_steps=10, total_steps=110,
                      weight_decay=0.0, grad_clip=None)
    opt = make_optimizer(cfg)
    params = {"w": jnp.ones(3)}
    state = opt.init(params)
    sizes = []
    for _ in range(110):
        updates, state = opt.update({"w": jnp.ones(3)}, state, params)
        sizes.append(float(jnp.abs(updates["w"][0])))
    # Adam with a constant gradient steps by about the learning rate.
    assert sizes[0] == pytest.approx(0.0, abs=1e-9)
    assert sizes[10] == pytest.approx(1e-3, rel=1e-3)
    assert sizes[60] == pytest.approx(0.5e-3, rel=2e-2)  # half way down the cosine
    assert sizes[-1] < 1e-5
    assert isinstance(make_optimizer(TrainConfig()), optax.GradientTransformation)


@pytest.mark.parametrize("field,value", [
    ("peak_learning_rate", -1.0), ("warmup_steps", -1), ("warmup_steps", 2.5),
    ("total_steps", 10), ("b1", 1.0), ("b2", -0.1), ("weight_decay", -0.5),
    ("grad_clip", 0.0), ("grad_clip", True),
    # Not finite: the first update would turn every weight NaN.
    ("peak_learning_rate", float("nan")), ("peak_learning_rate", float("inf")),
    ("weight_decay", float("inf")), ("grad_clip", float("inf")),
    # Beyond float32's largest: infinite where the optimizer computes.
    ("peak_learning_rate", 1e300), ("end_learning_rate", 1e39), ("weight_decay", 1e300),
])
def test_bad_train_config_names_the_field(field, value):
    kw = {"warmup_steps": 10, "total_steps": 100, field: value}
    with pytest.raises(ValueError, match=f"TrainConfig.{field}="):
        TrainConfig(**kw)


# ----------------------------------------------------------------------------------------
# The model can learn: a fixed batch is overfitted.


def test_train_step_from_shapes_compiles_donates_and_overfits(world):
    """One executable, compiled from `ShapeDtypeStruct`s alone, trains a fixed batch.

    Its memory analysis exists, it deletes the state it is given (donation), and the loss
    on one fixed sample falls at least tenfold in 200 AdamW steps.
    """
    steps = 200
    opt = make_optimizer(TrainConfig(peak_learning_rate=3e-3, warmup_steps=10,
                                     total_steps=steps, weight_decay=0.0, grad_clip=None))
    ex = jax.tree_util.tree_map(jnp.asarray,
                                world["weather"].make_batch(1, rollout=1, start=3))
    step = train_step_fn(world["net"], opt, TASK, MemoryConfig(donate=True), 1,
                         world["kw"]["weights"], world["kw"]["residual_scale"])
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                    (world["params"], world["graph"]))
    state_shapes = jax.eval_shape(lambda p: init_state_from_params(p, opt), shapes[0])
    example = example_shapes(TASK, world["graphs"].num_grid_nodes, 1, 1)
    compiled = jax.jit(step, donate_argnums=(0,)).lower(state_shapes, shapes[1],
                                                        example).compile()
    analysis = compiled.memory_analysis()
    assert analysis is not None and analysis.temp_size_in_bytes > 0

    state = init_state_from_params(jax.tree_util.tree_map(jnp.array, world["params"]), opt)
    first = state
    losses = []
    for _ in range(steps):
        state, metrics = compiled(state, world["graph"], ex)
        losses.append(float(metrics["loss"]))
    leaves = jax.tree_util.tree_leaves((first.params, first.opt_state))
    assert all(leaf.is_deleted() for leaf in leaves)  # donated
    assert int(state.step) == steps
    print(f"overfit: loss {losses[0]:.4g} -> {losses[-1]:.4g}")
    assert losses[-1] <= losses[0] / 10, (losses[0], losses[-1])
