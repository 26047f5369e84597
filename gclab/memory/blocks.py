"""Edge blocks: message passing over blocks of edges, each block checkpointed.

With edge blocks, no array of shape `[E, B, L]` is saved for the backward pass: the
edges are processed `bs` at a time inside a `lax.scan` whose body is checkpointed, so
the backward pass recomputes one block's messages at a time. Sums into nodes accumulate
across blocks. The cost is one more forward pass of each blocked MLP.

Nothing here knows GraphCast: a message function of one block is passed in.

Shards: when the rows are split over D devices (`gclab.parallel`, `shards=D`), the rows
are first cut into D contiguous equal parts and block j holds the j-th sub-block of every
part, so that splitting a block's rows D ways gives each device a block of its own part.
Sums into nodes then accumulate in D partial sums, one per part (`[D, N, B, L]`, a device
holding its own), added up once after the last block, instead of combining every
block's sum across devices. With D = 1 this is the plain layout and the plain sum.

Shapes: E edges, nb blocks of bs edges (E padded to nb * bs), N nodes, B batch, L latent,
D shards.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from gclab.config import require_count
from gclab.memory.precision import aggregate


def balanced_block(n: int, block: int) -> int:
    """The block size that splits `n` rows into ceil(n / block) near-equal blocks.

    At least 1: no rows (a graph without edges) make one block of padding.

    Raises:
      ValueError: `n` not an integer >= 0, or `block` not an integer >= 1.
    """
    # A zero block would divide by zero; a fractional one would give fractional rows.
    n = require_count("n", n, 0, "balanced_block")
    block = require_count("block", block, 1, "balanced_block")
    nb = max(1, -(-n // block))
    return max(1, -(-n // nb))


def shard_block(block: int, shards: int) -> int:
    """The smallest multiple of `shards` that is >= `block` (a block splits evenly).

    Raises:
      ValueError: `block` or `shards` not an integer >= 1.
    """
    block = require_count("block", block, 1, "shard_block")
    shards = require_count("shards", shards, 1, "shard_block")
    return -(-block // shards) * shards


def split_blocks(x: jax.Array, block: int, fill=0, shards: int = 1) -> jax.Array:
    """Pads axis 0 and reshapes to [nb, block, ...], shard-major within each block.

    Args:
      x: rows on axis 0.
      block: rows per block (a multiple of `shards`).
      fill: value of the padding rows (at the end of the last part).
      shards: D; block j is `[part 0's j-th sub-block, ..., part D-1's]`, each part a
        contiguous range of `nb * block / D` rows (see the module docstring).

    Returns:
      [nb, block, ...].

    Raises:
      ValueError: `block` or `shards` not an integer >= 1, or `block` not a multiple of
        `shards`.
    """
    block = require_count("block", block, 1, "split_blocks")
    shards = require_count("shards", shards, 1, "split_blocks")
    if block % shards:
        raise ValueError(f"block {block} is not a multiple of shards={shards}")
    n, sub = x.shape[0], block // shards
    part = -(-n // shards)  # rows per part, before padding
    nb = -(-part // sub)
    pad = [(0, nb * block - n)] + [(0, 0)] * (x.ndim - 1)
    x = jnp.pad(x, pad, constant_values=fill).reshape((shards, nb, sub) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1).reshape((nb, block) + x.shape[3:])


def merge_blocks(x: jax.Array, n: int, shards: int = 1) -> jax.Array:
    """The inverse of `split_blocks`: [nb, block, ...] -> the first `n` rows [n, ...]."""
    nb, block = x.shape[:2]
    x = x.reshape((nb, shards, block // shards) + x.shape[2:])
    return jnp.swapaxes(x, 0, 1).reshape((nb * block,) + x.shape[3:])[:n]


def _partial_sums(messages: jax.Array, receivers: jax.Array, num_nodes: int, shards: int,
                  float32: bool) -> jax.Array:
    """Sums of one block's messages into nodes, one per shard: [D, N, B, L].

    With `float32`, the sums are float32 (never rounded back to the messages' dtype: a
    bfloat16 partial sum would round every block's share of a node's sum, and the total
    would no longer be the float32 sum rounded once); otherwise in the messages' dtype.
    """
    if float32:
        messages = messages.astype(jnp.float32)
    sub = messages.shape[0] // shards
    parts = messages.reshape((shards, sub) + messages.shape[1:])  # [D, bs / D, B, L]
    return jax.vmap(lambda m, r: aggregate(m, r, num_nodes, False))(
        parts, receivers.reshape((shards, sub)))  # [D, N, B, L]


def _zeros(shape: tuple, dtype, like: Any) -> jax.Array:
    """Zeros that vary over the manual mesh axes any leaf of `like` varies over.

    Inside `jax.shard_map` (a pipeline stage) a scan's carry must keep its type, and sums
    of messages computed from per-device values vary from device to device.
    """
    axes: set = set()
    for leaf in jax.tree_util.tree_leaves(like):
        axes |= set(jax.typeof(leaf).mat.varying)
    zeros = jnp.zeros(shape, dtype)
    return jax.lax.pcast(zeros, tuple(sorted(axes)), to="varying") if axes else zeros


def blocked_sum(message_fn: Callable, operands: Any, senders: jax.Array, receivers: jax.Array,
                extra: tuple, valid: jax.Array, num_nodes: int, latent_shape: tuple,
                shards: int = 1, mark_shards: Callable = lambda x: x) -> jax.Array:
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
      shards: D, partial sums kept apart until the last block (blocks from
        `split_blocks(..., shards=D)`).
      mark_shards: applied to the `[D, N, B, L]` partial sums (e.g. to place shard d on
        device d).

    Returns:
      [N, B, L] float32.
    """

    @jax.checkpoint
    def block_messages(operands, senders, receivers, extra, valid):
        messages = message_fn(operands, senders, receivers, *extra)
        return messages * valid[:, None, None]  # [bs, B, L]

    def body(total, x):
        messages = block_messages(operands, *x)
        partial = _partial_sums(messages, x[1], num_nodes, shards, True)  # float32
        return mark_shards(total + partial), None

    init = mark_shards(_zeros((shards, num_nodes) + tuple(latent_shape), jnp.float32,
                              (operands, extra)))
    total, _ = jax.lax.scan(body, init, (senders, receivers, extra, valid))
    return jnp.sum(total, axis=0)  # [N, B, L]


def blocked_edge_update(message_fn: Callable, operands: Any, edges: jax.Array,
                        senders: jax.Array, receivers: jax.Array, valid: jax.Array,
                        num_nodes: int, float32_sum: bool, shards: int = 1,
                        mark_shards: Callable = lambda x: x) -> tuple[jax.Array, jax.Array]:
    """One residual edge update over edge blocks: new edges and the sum into receivers.

    Args:
      message_fn: `(operands, edges, senders, receivers) -> messages [bs, B, L]`.
      operands: arrays every block reads (node latents, parameters).
      edges: [nb, bs, B, L] edge latents.
      senders, receivers, valid: [nb, bs].
      num_nodes: N.
      float32_sum: accumulate the sum in float32.
      shards, mark_shards: partial sums per shard, as in `blocked_sum`.

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
        partial = _partial_sums(messages, receivers, num_nodes, shards, float32_sum)
        return mark_shards(total + partial.astype(total.dtype)), edges + messages

    batch, latent = edges.shape[2:]
    acc_dtype = jnp.float32 if float32_sum else edges.dtype
    init = mark_shards(_zeros((shards, num_nodes, batch, latent), acc_dtype, (operands, edges)))
    total, edges = jax.lax.scan(body, init, (edges, senders, receivers, valid))
    return edges, jnp.sum(total, axis=0).astype(edges.dtype)  # [nb, bs, B, L], [N, B, L]
