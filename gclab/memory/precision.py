"""Mixed precision: the compute dtype, parameter casts and float32 aggregation.

The published scheme: parameters, gradients and optimizer state stay float32; the network
computes in bfloat16 on bfloat16 copies of the parameters and inputs; sums of many
messages into one node can accumulate in float32 (always in the encoder, optionally in the
processor and decoder); outputs come back as float32.

Shapes: E edges, N nodes, B batch, L latent.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.extend
import jax.numpy as jnp
import jraph
import numpy as np

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def compute_dtype(precision: str):
    """The dtype the network computes in for a `MemoryConfig.precision`.

    Raises:
      ValueError: a precision not in `DTYPES`.
    """
    if not isinstance(precision, str) or precision not in DTYPES:
        raise ValueError(f"compute_dtype precision={precision!r} is invalid: one of "
                         + ", ".join(DTYPES))
    return DTYPES[precision]


def cast_tree(tree: Any, dtype) -> Any:
    """Every leaf of `tree` as `dtype` (gradients flow back in each leaf's own dtype)."""
    return jax.tree_util.tree_map(lambda a: a.astype(dtype), tree)


def aggregate(messages: jax.Array, receivers: jax.Array, num_nodes: int,
              float32: bool) -> jax.Array:
    """Sum of incoming messages per receiver node, optionally accumulated in float32.

    Args:
      messages: [E, B, L].
      receivers: [E] int32 node indices.
      num_nodes: N.
      float32: accumulate in float32 (then cast back to the messages' dtype).

    Returns:
      [N, B, L] in the messages' dtype.
    """
    dtype = messages.dtype
    if float32:
        messages = messages.astype(jnp.float32)
    return jraph.segment_sum(messages, receivers, num_nodes).astype(dtype)  # [N, B, L]


def residuals_as_bits(fn: Callable) -> Callable:
    """`fn` whose bfloat16 residuals for the backward pass are kept as uint16 bit patterns.

    Same values, same gradients. It matters for the body of a `lax.scan`: the scan stacks
    the residuals of its iterations `[S, ...]`, and the backward loop reads one slice per
    iteration. XLA:CPU runs no bfloat16 op natively, not even a dynamic slice: its float
    normalization converts the slice's whole operand to float32, and as that operand is
    the same in every iteration, loop-invariant code motion hoists the conversion out of
    the loop: a float32 copy of all stacked residuals, alive for the whole backward pass.
    Integers are never converted, so residuals stored as uint16 stay 2 bytes an element;
    each iteration turns its own slice back into bfloat16. Used by the processor's step
    scans under bfloat16 (float32 runs are unchanged).

    `fn` may close over traced values (a processor step closes over the graph's index
    arrays). A `custom_vjp` function must not (JAX's `custom_vjp3` rules refuse it, and
    under JAX 0.11 a nested scan then fails to lower), so each call first turns `fn` into
    a closure-free function of its closed-over values and its arguments, by tracing it to
    a jaxpr. `jax.closure_convert` is not used: it hoists only values that can carry a
    tangent and leaves integer index arrays in the closure.
    """

    def call(*args):
        flat_args, in_tree = jax.tree_util.tree_flatten(args)

        def flat_fn(*flat):
            return fn(*jax.tree_util.tree_unflatten(in_tree, flat))

        closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*flat_args)
        jaxpr, consts = closed.jaxpr, list(closed.consts)
        out_tree = jax.tree_util.tree_structure(out_shape)

        n = len(consts)

        def pure(*leaves):  # the closed-over values, then the arguments, each one array
            return jax.extend.core.jaxpr_as_fun(
                jax.extend.core.ClosedJaxpr(jaxpr, list(leaves[:n])))(*leaves[n:])

        saved = {}

        @jax.custom_vjp
        def wrapped(*leaves):
            return pure(*leaves)

        def fwd(*leaves):
            out, pullback = jax.vjp(pure, *leaves)
            # The pullback as a jaxpr: its constants are the residuals (no tracer stays
            # behind in a Python closure, so the backward pass may be traced anywhere).
            pb, saved["grads"] = jax.make_jaxpr(pullback, return_shape=True)(out)
            saved["jaxpr"] = pb.jaxpr
            saved["bits"] = [np.dtype(c.dtype) == jnp.bfloat16 for c in pb.consts]
            return out, [jax.lax.bitcast_convert_type(c, jnp.uint16) if bits else c
                         for c, bits in zip(pb.consts, saved["bits"])]

        def bwd(res, ct):
            consts = [jax.lax.bitcast_convert_type(c, jnp.bfloat16) if bits else c
                      for c, bits in zip(res, saved["bits"])]
            pullback = jax.extend.core.jaxpr_as_fun(
                jax.extend.core.ClosedJaxpr(saved["jaxpr"], consts))
            grads = pullback(*jax.tree_util.tree_leaves(ct))
            return tuple(jax.tree_util.tree_unflatten(
                jax.tree_util.tree_structure(saved["grads"]), grads))

        wrapped.defvjp(fwd, bwd)
        return jax.tree_util.tree_unflatten(out_tree, wrapped(*consts, *flat_args))

    return call
