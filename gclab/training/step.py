"""Training: AdamW with warm-up and cosine decay, autoregressive rollouts, one jitted step.

A training example (`Example`, made by `gclab.training.data`) holds the normalised inputs
of the first step, the normalised targets of T steps and the forcings of the frames the
rollout reaches.
Step t+1's inputs are step t's with the frames shifted: the newest input frame becomes the
previous one, the predicted residual (scaled to input units) is added to it to make the new
newest frame, and the forcings move on by one frame; statics stay. Gradients flow through
the whole rollout. Step k's loss compares the *predicted state* with the truth: the sum of
the predicted residuals of steps 1..k against the summed true residuals (`Example.targets`
holds those sums), which is the official rollout loss (each step's target residual taken
against the model's own previous prediction). The loss is averaged over the T steps.

Memory techniques of `MemoryConfig` that act here: `rollout_remat` (each autoregressive
step under its own checkpoint, inside a `lax.scan` so that it is real on every backend),
`microbatches` (gradient accumulation over a scan of micro-batches) and `donate`
(parameters and optimizer state donated to the step). `precision` acts inside the network;
the loss is always computed in float32.

Everything in a step works from shapes alone: `jax.jit(train_step_fn(...)).lower(state,
graph, example)` accepts `jax.ShapeDtypeStruct`s (see `example_shapes`).

Shapes: Ng grid nodes, B batch, C data channels, O outputs, V input variables per frame,
T rollout steps.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gclab.config import (
    NUM_FORCINGS,
    TaskConfig,
    invalid,
    is_int,
    is_number,
    require_count,
    require_kind,
)
from gclab.memory.config import MemoryConfig
from gclab.training.examples import Example, input_variable_channels, residual_channels
from gclab.training.losses import weighted_mse

#: The largest learning rate or weight decay `TrainConfig` takes: float32's largest number
#: (the optimizer computes in float32, where a larger one is infinite).
FLOAT32_MAX = float(np.finfo(np.float32).max)


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

    The learning rates and the weight decay are numbers from 0 to `FLOAT32_MAX`.
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
        # At most float32's largest: a NaN or infinite rate or decay (float32 overflows past
        # it) turns every weight NaN in the first update (the step's loss and gradients,
        # computed before it, are still finite).
        for f in ("peak_learning_rate", "end_learning_rate", "weight_decay"):
            v = getattr(self, f)
            if not is_number(v) or not 0 <= v <= FLOAT32_MAX:
                invalid(self, f, f"a number >= 0 and <= {FLOAT32_MAX:g} (float32's largest)",
                        wrong_kind=not is_number(v))
        for f in ("warmup_steps", "total_steps"):
            v = getattr(self, f)
            if not is_int(v) or v < 0:
                invalid(self, f, "an integer >= 0", wrong_kind=not is_int(v))
        if self.total_steps <= self.warmup_steps:
            invalid(self, "total_steps", f"more than warmup_steps={self.warmup_steps}")
        for f in ("b1", "b2"):
            v = getattr(self, f)
            if not is_number(v) or not 0 <= v < 1:
                invalid(self, f, "a number in [0, 1)", wrong_kind=not is_number(v))
        g = self.grad_clip
        if g is not None and (not is_number(g) or not 0 < g < math.inf):
            invalid(self, "grad_clip", "None or a finite number > 0",
                    wrong_kind=not is_number(g))


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """AdamW with linear warm-up from 0 and cosine decay (and optional gradient clipping).

    The learning rate rises linearly to `peak_learning_rate` over `warmup_steps`, then
    follows a cosine down to `end_learning_rate` at `total_steps`.

    Raises:
      TypeError: `cfg` is not a `TrainConfig`.
    """
    require_kind("cfg", cfg, TrainConfig)
    return _optimizer(cfg)


# One optimizer object, and one jitted update, per configuration and process: a jitted
# function keeps the jaxpr it traced for given argument shapes, so every training step
# compiled in a process for one model's parameters (each memory recipe, precision, layout)
# traces the optimizer's per-leaf update once, not once per step (about a third of the
# tracing of a small model's step). XLA inlines the nested call: the compiled step, and
# every memory figure, is the same. Only the optimizers built here get a jitted update
# (`_update_of`): a caller's own optimizer is traced with each step, as it may read Python
# state, need not be hashable, and must not be kept alive by a process-wide cache. The
# cache is unbounded: a process builds few configurations, and an object it keeps is never
# freed, so its id is never another object's.
_JITTED_UPDATES: dict[int, tuple[optax.GradientTransformation, Callable]] = {}


@functools.lru_cache(maxsize=None)
def _optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.peak_learning_rate, cfg.warmup_steps, cfg.total_steps, cfg.end_learning_rate)
    adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
    optimizer = (adamw if cfg.grad_clip is None
                 else optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw))
    _JITTED_UPDATES[id(optimizer)] = (
        optimizer, jax.jit(functools.partial(_optimizer_update, optimizer)))
    return optimizer


def _optimizer_update(optimizer, grads, opt_state, params):
    """`optimizer`'s update applied: `(params, opt_state)` after one step."""
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _update_of(optimizer) -> Callable:
    """`(grads, opt_state, params) -> (params, opt_state)` of `optimizer`: the jitted one of
    an optimizer `make_optimizer` built, a plain call of any other's update."""
    built = _JITTED_UPDATES.get(id(optimizer))
    if built is not None and built[0] is optimizer:
        return built[1]
    return functools.partial(_optimizer_update, optimizer)


class TrainState(NamedTuple):
    """Parameters, optimizer state and step count (a pytree)."""

    params: Any
    opt_state: Any
    step: jax.Array


def next_inputs(task: TaskConfig, inputs: jax.Array, prediction: jax.Array,
                next_forcings: jax.Array,
                residual_scale: jax.Array | np.ndarray | float = 1.0) -> jax.Array:
    """Step t+1's inputs from step t's inputs and prediction.

    Args:
      task: channel layout.
      inputs: [Ng, B, C] step t's normalised inputs.
      prediction: [Ng, B, O] step t's normalised residual prediction.
      next_forcings: [Ng, B, 5] normalised forcings of the frame after the new target.
      residual_scale: [O] or scalar: residual std / variable std
        (`Normalization.residual_scale`), turning a normalised residual into normalised
        input units. 1.0 only fits data normalised that way (or shapes-only compiles).

    Returns:
      [Ng, B, C] step t+1's inputs: (frame t, frame t + residual, forcings of frames t,
      t+1, t+2, statics).
    """
    v_idx = input_variable_channels(task)
    V = len(v_idx)
    newest = inputs[..., V:2 * V]  # [Ng, B, V]
    scale = jnp.asarray(residual_scale, jnp.float32)
    step = (prediction * scale)[..., v_idx].astype(inputs.dtype)  # [Ng, B, V]
    forcings = inputs[..., 2 * V:2 * V + 3 * NUM_FORCINGS]  # [Ng, B, 15]
    statics = inputs[..., 2 * V + 3 * NUM_FORCINGS:]  # [Ng, B, 2]
    return jnp.concatenate([newest, newest + step, forcings[..., NUM_FORCINGS:],
                            next_forcings.astype(inputs.dtype), statics], axis=-1)


def rollout_loss(params, graph, example: Example, *, net: hk.Transformed, task: TaskConfig,
                 memory: MemoryConfig, rollout: int, weights: tuple,
                 residual_scale: jax.Array | np.ndarray | float = 1.0) -> jax.Array:
    """Mean over T autoregressive steps of the weighted loss of the predicted state.

    Steps 1..T-1 run in a `lax.scan` (each step under `jax.checkpoint` when
    `memory.rollout_remat`: only the scan carry, the inputs and the summed residuals
    `[Ng, B, C + O]`, is kept per step, and the step's internals are recomputed in the
    backward pass, about one extra forward per step); the last step computes no next
    inputs. With T = 1 there is no scan.

    Args:
      params: network parameters.
      graph: `gclab.model.graphcast.GraphInputs` (or their shapes).
      example: `Example` with `rollout` target steps.
      net: the network (`gclab.model.graphcast.make_network`).
      task: channel layout.
      memory: memory techniques (`rollout_remat` acts here).
      rollout: T, the number of autoregressive steps.
      weights: `(node weights [Ng], channel weights [O])` from `gclab.training.losses.loss_weights`.
      residual_scale: [O] `Normalization.residual_scale` (see `next_inputs`).

    Returns:
      float32 scalar loss.

    Raises:
      ValueError: `example` has other than `rollout` steps, or `memory` differs from the
        memory `net` was built with (`check_memory`).
    """
    check_memory("rollout_loss", net, memory)
    rollout = require_count("rollout", rollout, 1, "rollout_loss")
    if example.targets.shape[0] != rollout:
        raise ValueError(f"example has {example.targets.shape[0]} target steps, "
                         f"rollout is {rollout}")
    is_residual = jnp.asarray(residual_channels(task))  # [O]

    def predict(inputs):
        with jax.named_scope("network"):
            return net.apply(params, graph, inputs)  # [Ng, B, O]

    def state_loss(state, target):
        with jax.named_scope("loss"):
            return weighted_mse(state, target, weights)

    def one_step(carry, xs):
        inputs, summed = carry  # [Ng, B, C], [Ng, B, O] predicted residuals so far
        target, forcing = xs  # [Ng, B, O], [Ng, B, 5]
        prediction = predict(inputs)  # [Ng, B, O]
        summed = jnp.where(is_residual, summed + prediction, prediction)  # [Ng, B, O]
        new_inputs = next_inputs(task, inputs, prediction, forcing, residual_scale)
        return (new_inputs, summed), state_loss(summed, target)

    def last_step(inputs, summed, target):  # the last step needs no next inputs
        prediction = predict(inputs)  # [Ng, B, O]
        if summed is not None:
            prediction = jnp.where(is_residual, summed + prediction, prediction)
        return state_loss(prediction, target)

    if memory.rollout_remat:
        one_step, last_step = jax.checkpoint(one_step), jax.checkpoint(last_step)
    if rollout == 1:
        return last_step(example.inputs, None, example.targets[0])
    summed = jnp.zeros(example.targets.shape[1:], jnp.float32)  # [Ng, B, O]
    (inputs, summed), losses = jax.lax.scan(
        one_step, (example.inputs, summed),
        (example.targets[:-1], example.forcings[:-1]))  # losses [T-1]
    return (jnp.sum(losses) + last_step(inputs, summed, example.targets[-1])) / rollout


#: The `MemoryConfig` fields the training step applies itself; the network reads every
#: other field (`check_memory`).
STEP_MEMORY_FIELDS = ("rollout_remat", "microbatches", "donate")


def check_memory(caller: str, net: Any, memory: MemoryConfig) -> MemoryConfig:
    """`memory`, if it is a `MemoryConfig` that `net` computes under.

    A network from `gclab.model.make_network` carries the `MemoryConfig` it was built with
    (`net.memory`), and applies every field but `STEP_MEMORY_FIELDS` itself: a step given
    other values of those would claim techniques (precision, remat, edge blocks) that
    never run. A network without `memory` (one built otherwise) is not checked.

    Raises:
      WrongType: `memory` is no `MemoryConfig`.
      ValueError: `memory` differs from `net.memory` in a field the network reads.
    """
    require_kind("memory", memory, MemoryConfig, caller=caller)
    built = getattr(net, "memory", None)
    if not isinstance(built, MemoryConfig):
        return memory
    differ = [f.name for f in dataclasses.fields(MemoryConfig)
              if f.name not in STEP_MEMORY_FIELDS
              and getattr(memory, f.name) != getattr(built, f.name)]
    if differ:
        def shown(config):
            return ", ".join(f"{name}={getattr(config, name)!r}" for name in differ)

        raise ValueError(
            f"{caller} memory is invalid: it has {shown(memory)}, the network was built "
            f"with {shown(built)}; build the network with the step's MemoryConfig "
            f"(make_network(..., memory)): only {', '.join(STEP_MEMORY_FIELDS)} may differ")
    return memory


def _split_batch(example: Example, k: int) -> Example:
    """[..., B, ...] -> [k, ..., B/k, ...] along each field's batch axis, by stride.

    Micro-batch m holds the samples m, m + k, m + 2k, ... (sample i goes to micro-batch
    i % k, as the pipeline's micro-batches do, `gclab.model.graphcast.pipelined_forward`):
    with the batch split over the `data` axis (each device a contiguous range of samples),
    every micro-batch keeps each device's share, so the split moves no sample between
    devices (contiguous micro-batches would be resharded, an all-to-all, every step).
    """
    def split(a, axis):
        b = a.shape[axis]
        if b % k:
            raise ValueError(f"batch {b} is not divisible by microbatches={k}")
        a = a.reshape(a.shape[:axis] + (b // k, k) + a.shape[axis + 1:])
        return jnp.moveaxis(a, axis + 1, 0)

    return Example(split(example.inputs, 1), split(example.targets, 2),
                   split(example.forcings, 2))


def loss_and_grad(params, graph, example: Example, *, memory: MemoryConfig,
                  **loss_kw) -> tuple:
    """Loss and gradients, accumulated over `memory.microbatches` micro-batches.

    With k = `memory.microbatches` > 1 the batch axis (axis 1 of node arrays) is split into
    k micro-batches of B / k samples (every k-th sample: micro-batch m holds the samples
    i with i % k = m, see `_split_batch`), run one after another in a `lax.scan` (activations
    of B / k samples live at a time; gradients accumulate in one float32 copy of the
    parameters). The loss is a mean over the batch, so the mean of the micro-batch losses
    and gradients equals the full-batch loss and gradient.

    Args:
      params: network parameters.
      graph: `GraphInputs` (or their shapes).
      example: `Example` with B samples.
      memory: memory techniques (`microbatches` acts here, `rollout_remat` in the loss).
      **loss_kw: the keyword arguments of `rollout_loss` (net, task, rollout, weights,
        residual_scale).

    Returns:
      `(loss, grads)`: float32 scalar and a gradient tree like `params`.

    Raises:
      ValueError: if B is not divisible by `memory.microbatches`, or `memory` differs from
        the memory the network was built with (`check_memory`); `WrongType` for a
        `memory` that is no `MemoryConfig`.
    """
    check_memory("loss_and_grad", loss_kw.get("net"), memory)
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
    """A fresh `TrainState` around `params` (step 0); works under `jax.eval_shape`."""
    return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))


def train_step_fn(net: hk.Transformed, optimizer: optax.GradientTransformation,
                  task: TaskConfig, memory: MemoryConfig, rollout: int, weights: tuple,
                  residual_scale: jax.Array | float = 1.0) -> Callable:
    """The pure (un-jitted) training step `(state, graph, example) -> (state, metrics)`.

    Nothing in it needs concrete values, so `jax.jit(step).lower(state, graph, example)`
    works on `jax.ShapeDtypeStruct`s (`example_shapes`, `jax.eval_shape` of
    `init_state_from_params`).

    Args:
      net: the network (`gclab.model.graphcast.make_network`, built with the same `memory`).
      optimizer: from `make_optimizer`.
      task: channel layout.
      memory: memory techniques (`rollout_remat`, `microbatches` act here; `donate` in
        `make_train_step`); every other field must be the network's (`check_memory`).
      rollout: T, autoregressive steps per example.
      weights: `(node weights [Ng], channel weights [O])` from `gclab.training.losses.loss_weights`.
      residual_scale: [O] `Normalization.residual_scale` (see `next_inputs`).

    Returns:
      `step(state, graph, example) -> (state, {"loss", "grad_norm"})`.

    Raises:
      WrongType: `memory` is no `MemoryConfig`.
      ValueError: `memory` differs from the network's in a field the network reads.
    """
    check_memory("train_step_fn", net, memory)
    rollout = require_count("rollout", rollout, 1, "train_step_fn")

    def step(state: TrainState, graph, example: Example):
        loss, grads = loss_and_grad(state.params, graph, example, memory=memory, net=net,
                                    task=task, rollout=rollout, weights=weights,
                                    residual_scale=residual_scale)
        with jax.named_scope("optimizer"):
            params, opt_state = _update_of(optimizer)(grads, state.opt_state, state.params)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
        return TrainState(params, opt_state, state.step + 1), metrics

    return step


def make_train_step(net: hk.Transformed, optimizer: optax.GradientTransformation,
                    task: TaskConfig, memory: MemoryConfig, rollout: int, weights: tuple,
                    residual_scale: jax.Array | float = 1.0) -> Callable:
    """`train_step_fn`, jitted; donates `state` when `memory.donate`.

    Donation lets the updated parameters and optimizer state reuse the old buffers (about
    3 x 4 bytes per parameter saved at the peak, no compute cost); the `state` passed in is
    deleted and must not be used again. Arguments (and errors) as in `train_step_fn`.
    """
    check_memory("make_train_step", net, memory)
    require_count("rollout", rollout, 1, "make_train_step")
    fn = train_step_fn(net, optimizer, task, memory, rollout, weights, residual_scale)
    return jax.jit(fn, donate_argnums=(0,) if memory.donate else ())
