"""Rematerialisation (gradient checkpointing): of processor steps, and of whole stages.

Nothing here knows GraphCast: `scan_steps` runs any stack of S alike steps (a step
function and its parameters stacked on a leading axis) as `lax.scan`s under the processor
remat of a `MemoryConfig`, and `stage_checkpoint` wraps any stage of a network.

Remat inside `lax.scan` is what XLA keeps on every backend: XLA:CPU merges the
recomputation of an unrolled Python loop back into the forward pass, so it saves nothing
there; a checkpointed scan body or a one-iteration scan keeps it in the backward pass.

Shapes: S steps; the carry and the stacked parameters are whatever the step takes.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from gclab.devices import default_platform
from gclab.memory.config import REMAT_POLICIES, MemoryConfig
from gclab.memory.precision import residuals_as_bits

# Names that `jax.ad_checkpoint.checkpoint_name` gives values a step may keep under the
# `aggregated` and `node-latents` remat policies.
AGGREGATED_MESSAGES = "aggregated_messages"
NODE_LATENTS = "node_latents"

# Prefix of the named scope around every scan over processor steps; `gclab.measure.timeline`
# reads it back from XLA's op names to label each iteration "processor step i".
STEP_SCOPE_PREFIX = "stepscan_"


def remat_policy(name: str) -> Callable:
    """The `jax.checkpoint` policy of a `MemoryConfig.remat_policy` name.

    Raises:
      ValueError: a name not in `gclab.memory.config.REMAT_POLICIES`.
    """
    if not isinstance(name, str) or name not in REMAT_POLICIES:
        raise ValueError(f"remat_policy name={name!r} is invalid: one of "
                         + ", ".join(REMAT_POLICIES))
    cp = jax.checkpoint_policies
    return {
        "nothing": cp.nothing_saveable,
        "dots": cp.dots_with_no_batch_dims_saveable,
        "aggregated": cp.save_only_these_names(AGGREGATED_MESSAGES),
        "node-latents": cp.save_only_these_names(NODE_LATENTS),
    }[name]


def step_scope(offset: int, stride: int = 1) -> str:
    """Named scope of a scan over processor steps: iteration k runs step offset + k * stride.

    Offsets of nested step scans add up (a scan over groups of k steps has stride k; the
    scan inside each group has offset 0 and stride 1).
    """
    return f"{STEP_SCOPE_PREFIX}{offset}_{stride}"


def scan_steps(step: Callable, carry: Any, stacked: Any, mem: MemoryConfig):
    """Runs S stacked steps as scans, with the processor remat of `mem`.

    A group size above S (`every:K`, `nested:K`) is one group of all S steps: a recipe's
    group on a short model, or a pipeline stage shorter than a group (the command line
    refuses such a `--remat` typed for a whole processor).

    Args:
      step: `(carry, params_of_one_step) -> (carry, None)`.
      carry: the state the steps update (e.g. mesh-node and edge latents).
      stacked: a pytree of step parameters, each leaf with S on its leading axis.
      mem: `processor_remat` (none, step, every:k, nested:k, ratio:r) and `remat_policy`.

    Returns:
      `(carry, None)` after the S steps.
    """
    S = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    ckpt = functools.partial(jax.checkpoint, policy=remat_policy(mem.remat_policy))
    kind = mem.processor_remat

    def take(lo, hi):
        return jax.tree_util.tree_map(lambda a: a[lo:hi], stacked)

    def scan(body, carry, xs, offset, stride=1):
        # The scope names which steps the loop's iterations are (offset + k * stride,
        # relative to an enclosing step loop), for the timeline's step labels.
        # XLA:CPU alone widens a bfloat16 slice's whole operand (see `residuals_as_bits`);
        # XLA:GPU and XLA:TPU slice bfloat16 natively, so there the body is left as it is.
        # The platform compiled for, not the machine's default backend: a machine with a GPU
        # plans layouts on its simulated CPU devices. (The carry's leaves are tracers, placed
        # on no device, so JAX's default device is what names the target.)
        if (default_platform().lower() == "cpu"
                and any(a.dtype == jnp.bfloat16 for a in jax.tree_util.tree_leaves(carry))):
            body = residuals_as_bits(body)
        with jax.named_scope(step_scope(offset, stride)):
            return jax.lax.scan(body, carry, xs)

    if kind == "none":
        return scan(step, carry, stacked, 0)
    if kind == "step":
        return scan(ckpt(step), carry, stacked, 0)
    if kind == "ratio":
        n = mem.checkpointed_steps(S)
        if n:
            carry, _ = scan(ckpt(step), carry, take(0, n), 0)
        if n < S:
            carry, _ = scan(step, carry, take(n, S), n)
        return carry, None
    # every:k / nested:k: groups of k scanned steps, each group under one checkpoint.
    k = min(mem.remat_group_size, S)
    inner = ckpt(step) if kind == "nested" else step

    def group(carry, p, offset=0):
        return scan(inner, carry, p, offset)[0], None

    full = (S // k) * k
    if full:
        grouped = jax.tree_util.tree_map(lambda a: a[:full].reshape((S // k, k) + a.shape[1:]),
                                         stacked)
        carry, _ = scan(ckpt(group), carry, grouped, 0, k)
    if full < S:
        carry, _ = ckpt(functools.partial(group, offset=full))(carry, take(full, S))
    return carry, None


def stage_checkpoint(fn: Callable) -> Callable:
    """`jax.checkpoint(fn)`, run as a one-iteration `lax.scan`.

    Outside a loop, XLA is free to merge a checkpoint's recomputation with the forward pass
    it repeats (XLA:CPU does, and then the checkpoint saves nothing). Inside a loop body
    the recomputation stays in the backward pass on every backend, so whole-stage
    checkpoints are placed in a scan of length one.
    """
    checkpointed = jax.checkpoint(fn)

    def wrapped(*args):
        def body(carry, _):
            return carry, checkpointed(*args)

        _, out = jax.lax.scan(body, None, None, length=1)
        return jax.tree_util.tree_map(lambda a: a[0], out)

    return wrapped
