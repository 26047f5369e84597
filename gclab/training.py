"""Training: AdamW with warm-up and cosine decay, autoregressive rollouts, one jitted step.

A training example holds normalised inputs for the first step, the normalised residual
targets of T steps and the forcings of the frames the rollout reaches. Step t+1's inputs
are step t's with the frames shifted: the newest input frame becomes the previous one, the
prediction (a residual) is added to it to make the new newest frame, and the forcings move
on by one frame. The loss is averaged over the T steps.

Memory techniques of `MemoryConfig` that act here: `rollout_remat` (each autoregressive
step under its own checkpoint, inside a scan so that it is real on every backend),
`microbatches` (gradient accumulation over a scan of micro-batches) and `donate`
(parameters and optimizer state donated to the step).

Shapes: Ng grid nodes, B batch, C data channels, O outputs, V input variables per frame,
T rollout steps.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gclab.config import FORCING_VARIABLES, TaskConfig
from gclab.losses import loss_weights, weighted_mse
from gclab.techniques import MemoryConfig

NUM_FORCINGS = len(FORCING_VARIABLES)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimiser settings (AdamW, linear warm-up then cosine decay).

    Attributes:
      peak_learning_rate: learning rate at the end of the warm-up.
      warmup_steps: linear warm-up from 0.
      total_steps: warm-up plus cosine decay to `end_learning_rate`.
      end_learning_rate: final learning rate.
      weight_decay: AdamW's decoupled weight decay (0.1 as published).
      b1, b2: Adam's moment decays (0.9, 0.95 as published).
      grad_clip: global-norm gradient clipping (None: off).
    """

    peak_learning_rate: float = 1e-3
    warmup_steps: int = 100
    total_steps: int = 1000
    end_learning_rate: float = 0.0
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    grad_clip: float | None = 32.0

    def __post_init__(self) -> None:
        def fail(field, allowed):
            raise ValueError(f"TrainConfig.{field}={getattr(self, field)!r} is invalid: "
                             f"{allowed}.")

        for f in ("peak_learning_rate", "end_learning_rate", "weight_decay"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                fail(f, "a number >= 0")
        for f in ("warmup_steps", "total_steps"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                fail(f, "an integer >= 0")
        if self.total_steps <= self.warmup_steps:
            fail("total_steps", f"more than warmup_steps={self.warmup_steps}")
        for f in ("b1", "b2"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                fail(f, "a number in [0, 1)")
        if self.grad_clip is not None and not self.grad_clip > 0:
            fail("grad_clip", "None or a number > 0")


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """AdamW with linear warm-up and cosine decay (and optional gradient clipping)."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.peak_learning_rate, cfg.warmup_steps, cfg.total_steps, cfg.end_learning_rate)
    adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
    if cfg.grad_clip is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw)


class TrainState(NamedTuple):
    """Parameters, optimizer state and step count (a pytree)."""

    params: Any
    opt_state: Any
    step: jax.Array


class Example(NamedTuple):
    """One training example (normalised units).

    Attributes:
      inputs: [Ng, B, C] inputs of the first step, in `TaskConfig` channel order: frame
        t-1 variables (V), frame t variables (V), forcings of frames t-1, t, t+1, statics.
      targets: [T, Ng, B, O] normalised residual targets of steps 1..T.
      forcings: [T, Ng, B, 5] forcings of frames t+2 .. t+T+1 (step k+1 needs frame
        t+k+2; the last row is unused).
    """

    inputs: jax.Array
    targets: jax.Array
    forcings: jax.Array


def input_variable_channels(task: TaskConfig) -> np.ndarray:
    """Indices into the O output channels of the V variables that are also inputs."""
    names = task.target_channel_names
    if task.precipitation_input:
        return np.arange(len(names))
    return np.asarray([i for i, n in enumerate(names) if n != "total_precipitation_6hr"])


def example_shapes(task: TaskConfig, num_grid_nodes: int, batch: int,
                   rollout: int) -> Example:
    """An `Example` of `jax.ShapeDtypeStruct`s (for compiling from shapes alone)."""
    sds, f32 = jax.ShapeDtypeStruct, jnp.float32
    return Example(sds((num_grid_nodes, batch, task.data_channels), f32),
                   sds((rollout, num_grid_nodes, batch, task.output_channels), f32),
                   sds((rollout, num_grid_nodes, batch, NUM_FORCINGS), f32))


def next_inputs(task: TaskConfig, inputs: jax.Array, prediction: jax.Array,
                next_forcings: jax.Array, residual_scale: jax.Array | float = 1.0):
    """Step t+1's inputs from step t's inputs and prediction.

    Args:
      inputs: [Ng, B, C]; prediction: [Ng, B, O] normalised residual.
      next_forcings: [Ng, B, 5] forcings of the frame after the new target frame.
      residual_scale: [O] or scalar: residual std / input std, to turn a normalised
        residual into normalised input units.
    """
    v_idx = input_variable_channels(task)
    V = len(v_idx)
    newest = inputs[..., V:2 * V]  # [Ng, B, V]
    step = (prediction * residual_scale).astype(inputs.dtype)[..., v_idx]  # [Ng, B, V]
    forcings = inputs[..., 2 * V:2 * V + 3 * NUM_FORCINGS]  # [Ng, B, 15]
    statics = inputs[..., 2 * V + 3 * NUM_FORCINGS:]  # [Ng, B, 2]
    return jnp.concatenate([newest, newest + step, forcings[..., NUM_FORCINGS:],
                            next_forcings.astype(inputs.dtype), statics], axis=-1)


def rollout_loss(params, graph, example: Example, *, net: hk.Transformed, task: TaskConfig,
                 memory: MemoryConfig, rollout: int, weights: tuple,
                 residual_scale: jax.Array | float = 1.0) -> jax.Array:
    """Mean over T autoregressive steps of the weighted loss (a scan over steps)."""
    if example.targets.shape[0] != rollout:
        raise ValueError(f"example has {example.targets.shape[0]} target steps, "
                         f"rollout is {rollout}")

    def predict_and_loss(inputs, target):
        with jax.named_scope("network"):
            prediction = net.apply(params, graph, inputs)  # [Ng, B, O]
        with jax.named_scope("loss"):
            return prediction, weighted_mse(prediction, target, weights)

    def one_step(inputs, xs):
        target, forcing = xs
        prediction, loss = predict_and_loss(inputs, target)
        return next_inputs(task, inputs, prediction, forcing, residual_scale), loss

    def last_step(inputs, target):  # the last step needs no next inputs
        return predict_and_loss(inputs, target)[1]

    if memory.rollout_remat:
        one_step, last_step = jax.checkpoint(one_step), jax.checkpoint(last_step)
    inputs, losses = example.inputs, []
    if rollout > 1:
        inputs, losses = jax.lax.scan(one_step, inputs, (example.targets[:-1],
                                                         example.forcings[:-1]))  # [T-1]
        losses = [jnp.sum(losses)]
    return (sum(losses) + last_step(inputs, example.targets[-1])) / rollout


def _split_batch(example: Example, k: int) -> Example:
    """[..., B, ...] -> [k, ..., B/k, ...] along each field's batch axis."""
    def split(a, axis):
        b = a.shape[axis]
        if b % k:
            raise ValueError(f"batch {b} is not divisible by microbatches={k}")
        a = a.reshape(a.shape[:axis] + (k, b // k) + a.shape[axis + 1:])
        return jnp.moveaxis(a, axis, 0)

    return Example(split(example.inputs, 1), split(example.targets, 2),
                   split(example.forcings, 2))


def loss_and_grad(params, graph, example: Example, *, memory: MemoryConfig,
                  **loss_kw) -> tuple:
    """Loss and gradients, accumulated over `memory.microbatches` micro-batches.

    The loss is a mean over the batch, so the mean of the micro-batch gradients equals
    the full-batch gradient.
    """
    grad_fn = jax.value_and_grad(functools.partial(rollout_loss, memory=memory, **loss_kw))
    k = memory.microbatches
    if k == 1:
        return grad_fn(params, graph, example)
    micro = _split_batch(example, k)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)

    def accumulate(carry, ex):
        loss, grads = grad_fn(params, graph, Example(*ex))
        return jax.tree_util.tree_map(jnp.add, carry, (loss, grads)), None

    (loss, grads), _ = jax.lax.scan(accumulate, (jnp.zeros((), jnp.float32), zeros),
                                    tuple(micro))
    return jax.tree_util.tree_map(lambda a: a / k, (loss, grads))


def init_state_from_params(params, optimizer: optax.GradientTransformation) -> TrainState:
    """A fresh `TrainState` around `params`."""
    return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))


def loss_weights_for(task: TaskConfig, grid_lat, n_lon: int) -> tuple:
    """Loss weights for a grid (see `gclab.losses.loss_weights`)."""
    return loss_weights(task, grid_lat, n_lon)


def train_step_fn(net: hk.Transformed, optimizer: optax.GradientTransformation,
                  task: TaskConfig, memory: MemoryConfig, rollout: int, weights: tuple,
                  residual_scale: jax.Array | float = 1.0) -> Callable:
    """The pure (un-jitted) training step `(state, graph, example) -> (state, metrics)`."""

    def step(state: TrainState, graph, example: Example):
        loss, grads = loss_and_grad(state.params, graph, example, memory=memory, net=net,
                                    task=task, rollout=rollout, weights=weights,
                                    residual_scale=residual_scale)
        with jax.named_scope("optimizer"):
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
        return TrainState(params, opt_state, state.step + 1), metrics

    return step


def make_train_step(net: hk.Transformed, optimizer: optax.GradientTransformation,
                    task: TaskConfig, memory: MemoryConfig, rollout: int, weights: tuple,
                    residual_scale: jax.Array | float = 1.0) -> Callable:
    """`train_step_fn`, jitted; donates `state` when `memory.donate`."""
    fn = train_step_fn(net, optimizer, task, memory, rollout, weights, residual_scale)
    return jax.jit(fn, donate_argnums=(0,) if memory.donate else ())
