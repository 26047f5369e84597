"""Mixed precision: the compute dtype, parameter casts and float32 aggregation.

The published scheme: parameters, gradients and optimizer state stay float32; the network
computes in bfloat16 on bfloat16 copies of the parameters and inputs; sums of many
messages into one node can accumulate in float32 (always in the encoder, optionally in the
processor and decoder); outputs come back as float32.

Shapes: E edges, N nodes, B batch, L latent.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jraph

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def compute_dtype(precision: str):
    """The dtype the network computes in for a `MemoryConfig.precision`."""
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
