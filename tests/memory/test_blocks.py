"""Edge blocks sum into nodes in float32: the blocked sum is the unblocked one.

`blocked_sum` (and `blocked_edge_update` with `float32_sum`) promise a float32 sum of every
block's messages: each block's per-node partial sum stays float32 until the total, which is
rounded to the messages' dtype once (not once per block).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gclab.memory.blocks import blocked_edge_update, blocked_sum, split_blocks

BF16 = jnp.bfloat16


def _blocked(messages, receivers, num_nodes, block, shards):
    """blocked_sum and blocked_edge_update(float32_sum=True) of `messages` [E, B, L]."""
    def blocks(a):
        return split_blocks(a, block, shards=shards)

    valid = blocks(jnp.ones(messages.shape[0], messages.dtype))
    total = blocked_sum(lambda ops, s, r, m: m, (), blocks(receivers), blocks(receivers),
                        (blocks(messages),), valid, num_nodes, messages.shape[1:], shards)
    _, summed = blocked_edge_update(lambda ops, e, s, r: e, (), blocks(messages),
                                    blocks(receivers), blocks(receivers), valid, num_nodes,
                                    True, shards)
    return total, summed


@pytest.mark.parametrize("shards", [1, 2])
def test_partial_sums_of_blocks_are_not_rounded_to_bfloat16(shards):
    # 256 + 1 - 256 into one node, two edges a block: a bfloat16 partial sum of the first
    # block (257) rounds to 256, and the float32 total would be 0.
    messages = jnp.array([256.0, 1.0, -256.0], BF16)[:, None, None]  # [E, 1, 1]
    receivers = jnp.zeros(3, jnp.int32)
    total, summed = _blocked(messages, receivers, 1, 2 * shards, shards)
    assert total.dtype == jnp.float32 and summed.dtype == BF16
    assert float(total.ravel()[0]) == 1.0
    assert float(summed.ravel()[0]) == 1.0


@pytest.mark.parametrize("shards", [1, 2])
def test_blocked_bfloat16_sum_is_the_float32_sum_rounded_once(shards):
    # bfloat16 messages k * 2^p (|k| < 256, p in [-4, 4]) of mixed scales: every partial and
    # total sum is a multiple of 2^-4 below 2^20, exact in float32 in any order, so the
    # blocked sum must equal the unblocked float32 sum exactly (bfloat16 partial sums
    # would not: they keep 8 significant bits).
    rng = np.random.default_rng(0)
    E, N, B, L = 240, 7, 2, 3
    values = rng.integers(-255, 256, (E, B, L)) * 2.0 ** rng.integers(-4, 5, (E, B, L))
    messages = jnp.asarray(values, BF16)
    assert np.array_equal(np.float32(messages), values)  # exact in bfloat16
    receivers = jnp.asarray(rng.integers(0, N, E), jnp.int32)
    exact = jax.ops.segment_sum(messages.astype(jnp.float32), receivers, N)  # [N, B, L]
    for block in (4 * shards, 10 * shards):
        total, summed = _blocked(messages, receivers, N, block, shards)
        np.testing.assert_array_equal(total, exact)
        np.testing.assert_array_equal(np.float32(summed), np.float32(exact.astype(BF16)))


def test_blocked_sum_of_random_bfloat16_matches_float32_to_its_rounding():
    rng = np.random.default_rng(1)
    E, N, B, L = 300, 5, 1, 4
    messages = jnp.asarray(1.0 + rng.standard_normal((E, B, L)), BF16)
    receivers = jnp.asarray(rng.integers(0, N, E), jnp.int32)
    exact = jax.ops.segment_sum(messages.astype(jnp.float32), receivers, N)
    total, _ = _blocked(messages, receivers, N, 8, 1)
    # Float32 rounding of ~60 additions; a bfloat16 partial sum per block is ~1e-3 off.
    np.testing.assert_allclose(total, exact, rtol=1e-5, atol=1e-5)
