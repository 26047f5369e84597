"""Edge blocks: message passing over blocks of edges, each block checkpointed.

With edge blocks, no array of shape `[E, B, L]` is saved for the backward pass: the
edges are processed `bs` at a time inside a `lax.scan` whose body is checkpointed, so
the backward pass recomputes one block's messages at a time. Sums into nodes accumulate
across blocks. The cost is one more forward pass of each blocked MLP.

Nothing here knows GraphCast: a message function of one block is passed in.

Shapes: E edges, nb blocks of bs edges (E padded to nb * bs), N nodes, B batch, L latent.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from gclab.memory.precision import aggregate


def balanced_block(n: int, block: int) -> int:
    """The block size that splits `n` rows into ceil(n / block) near-equal blocks.

    At least 1: no rows (a graph without edges) make one block of padding.
    """
    nb = max(1, -(-n // block))
    return max(1, -(-n // nb))


def split_blocks(x: jax.Array, block: int, fill=0) -> jax.Array:
    """Pads axis 0 to a multiple of `block` and reshapes to [nb, block, ...]."""
    n = x.shape[0]
    nb = -(-n // block)
    pad = [(0, nb * block - n)] + [(0, 0)] * (x.ndim - 1)
    return jnp.pad(x, pad, constant_values=fill).reshape((nb, block) + x.shape[1:])


def blocked_sum(message_fn: Callable, operands: Any, senders: jax.Array, receivers: jax.Array,
                extra: tuple, valid: jax.Array, num_nodes: int, latent_shape: tuple) -> jax.Array:
    """Float32 sum into nodes of the messages of every edge block, each block checkpointed.

    Args:
      message_fn: `(operands, senders, receivers, *extra) -> messages [bs, B, L]` for one
        block.
      operands: arrays every block reads (node latents, parameters), passed to the
        checkpointed block function as arguments.
      senders, receivers: [nb, bs] node indices of each edge.
      extra: more per-block arrays, each `[nb, bs, ...]` (e.g. edge features).
      valid: [nb, bs], 1 for a real edge, 0 for padding.
      num_nodes: N, the receiving nodes.
      latent_shape: `(B, L)`.

    Returns:
      [N, B, L] float32.
    """

    @jax.checkpoint
    def block_messages(operands, senders, receivers, extra, valid):
        messages = message_fn(operands, senders, receivers, *extra)
        return messages * valid[:, None, None]  # [bs, B, L]

    def body(total, x):
        messages = block_messages(operands, *x)
        return total + aggregate(messages, x[1], num_nodes, True).astype(jnp.float32), None

    init = jnp.zeros((num_nodes,) + tuple(latent_shape), jnp.float32)
    total, _ = jax.lax.scan(body, init, (senders, receivers, extra, valid))
    return total  # [N, B, L]


def blocked_edge_update(message_fn: Callable, operands: Any, edges: jax.Array,
                        senders: jax.Array, receivers: jax.Array, valid: jax.Array,
                        num_nodes: int, float32_sum: bool) -> tuple[jax.Array, jax.Array]:
    """One residual edge update over edge blocks: new edges and the sum into receivers.

    Args:
      message_fn: `(operands, edges, senders, receivers) -> messages [bs, B, L]`.
      operands: arrays every block reads (node latents, parameters).
      edges: [nb, bs, B, L] edge latents.
      senders, receivers, valid: [nb, bs].
      num_nodes: N.
      float32_sum: accumulate the sum in float32.

    Returns:
      `edges + messages` [nb, bs, B, L] and the sum of messages per receiver [N, B, L]
      in the edges' dtype.
    """

    @jax.checkpoint
    def block_messages(operands, edges, senders, receivers, valid):
        return message_fn(operands, edges, senders, receivers) * valid[:, None, None]

    def body(total, x):
        edges, senders, receivers, valid = x
        messages = block_messages(operands, edges, senders, receivers, valid)
        total = total + aggregate(messages, receivers, num_nodes, float32_sum).astype(
            total.dtype)
        return total, edges + messages

    batch, latent = edges.shape[2:]
    acc_dtype = jnp.float32 if float32_sum else edges.dtype
    total, edges = jax.lax.scan(body, jnp.zeros((num_nodes, batch, latent), acc_dtype),
                                (edges, senders, receivers, valid))
    return edges, total.astype(edges.dtype)  # [nb, bs, B, L], [N, B, L]
