"""bfloat16 keeps only bfloat16 activations for the backward pass, and so lowers memory.

The published scheme: parameters stay float32 and are cast to bfloat16 where they are
read, inputs are cast to bfloat16, the encoder's grid2mesh edge sum runs in float32 and
the outputs are cast back to float32. What the backward pass keeps is bfloat16: LayerNorm
saves only its bfloat16 input (`gclab.model.layers.layer_norm`), and the processor's scans keep
their stacked residuals as uint16 bit patterns (`gclab.memory.precision.residuals_as_bits`), which
XLA:CPU does not copy to float32. Savings: XLA:CPU compiled temp bytes of one
loss-and-gradient computation, from shapes (deterministic, nothing is timed).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gclab.config import ModelConfig
from gclab.memory import RECIPES, get_recipe
from gclab.memory.precision import DTYPES, compute_dtype, residuals_as_bits
from gclab.model.layers import edge_messages, float32_layer_norm, layer_norm, mlp_concat

# 10 deg / 2 splits, 4 x 32; the recipes' edge blocks are scaled down to this graph.
CFG = ModelConfig(resolution=10.0, mesh_splits=2, latent_size=32, processor_steps=4)
BLOCK = 300
# bfloat16 compiled temp of every recipe <= this fraction of its float32 temp.
BF16_TEMP_FRACTION = 0.8
# Read, never run: LLVM optimisation off (the memory plan is the same).
READ_ONLY = {"xla_backend_optimization_level": 0}


# The "none" programs are compiled once for both tests that read them, in one worker.
@pytest.mark.xdist_group("bf16-none")
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_bfloat16_temp_is_at_most_a_fraction_of_float32(recipe, grad_temp):
    mems = {p: get_recipe(recipe, p) for p in ("f32", "bf16")}
    mems = {p: m.replace(edge_block_size=BLOCK) if m.edge_block_size else m
            for p, m in mems.items()}
    f32, bf16 = (grad_temp(CFG, mems[p], READ_ONLY) for p in ("f32", "bf16"))
    assert bf16 <= BF16_TEMP_FRACTION * f32


def _bf16_rows(key, shape=(64, 3, 32)):
    return (3.0 + 2.0 * jax.random.normal(key, shape)).astype(jnp.bfloat16)


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_activation_bytes_are_the_compute_dtypes(precision):
    """The sizing code's bytes per activation element are the dtype the network computes in."""
    assert set(DTYPES) == {"f32", "bf16"}
    memory = get_recipe("lean", precision)
    assert memory.activation_bytes == jnp.dtype(compute_dtype(precision)).itemsize


def test_bfloat16_layer_norm_saves_only_its_input():
    x = _bf16_rows(jax.random.PRNGKey(0))
    scale, offset = jnp.ones(32, jnp.bfloat16), jnp.zeros(32, jnp.bfloat16)
    residuals = jax.tree_util.tree_leaves(jax.vjp(layer_norm, x, scale, offset)[1])
    assert all(r.dtype == jnp.bfloat16 for r in residuals)
    assert sum(r.size for r in residuals) == x.size + 2 * 32


def test_bfloat16_layer_norm_is_the_float32_one_rounded_once():
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    x = _bf16_rows(keys[0])
    scale = (1 + 0.3 * jax.random.normal(keys[1], (32,))).astype(jnp.bfloat16)
    offset = (0.3 * jax.random.normal(keys[2], (32,))).astype(jnp.bfloat16)
    g = jax.random.normal(keys[3], x.shape).astype(jnp.bfloat16)
    y, pullback = jax.vjp(layer_norm, x, scale, offset)
    f32 = [a.astype(jnp.float32) for a in (x, scale, offset)]
    y32, pullback32 = jax.vjp(float32_layer_norm, *f32)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(y, y32.astype(jnp.bfloat16))
    for got, want in zip(pullback(g), pullback32(g.astype(jnp.float32))):
        assert got.dtype == jnp.bfloat16
        # Rounded once from float32 (the float32 reference sums in another order).
        np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=8e-3, atol=1e-4)


def test_residuals_as_bits_keeps_values_and_stores_uint16():
    def step(carry, w):
        h = jnp.tanh(carry @ w)  # [N, L]
        return h, None

    key = jax.random.PRNGKey(2)
    carry = jax.random.normal(key, (16, 8)).astype(jnp.bfloat16)
    ws = (0.5 * jax.random.normal(key, (5, 8, 8))).astype(jnp.bfloat16)

    def loss(body, carry, ws):
        out, _ = jax.lax.scan(body, carry, ws)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    plain = jax.grad(loss, argnums=(1, 2))(step, carry, ws)
    bits = jax.grad(loss, argnums=(1, 2))(residuals_as_bits(step), carry, ws)
    for a, b in zip(plain, bits):
        np.testing.assert_array_equal(a, b)
    _, pullback = jax.vjp(residuals_as_bits(step), carry, ws[0])
    residuals = jax.tree_util.tree_leaves(pullback)
    # Kept as their 16 bits (not widened to float32, which the bits are there to prevent).
    assert residuals and all(r.dtype == jnp.uint16 for r in residuals), [
        r.dtype for r in residuals]


def _edge_mlp(key, L=32, hidden=1):
    """Random parameters of an edge MLP from 3L to L (bias, LayerNorm), float32."""
    k = jax.random.split(key, 4)
    layers = [(0.2 * jax.random.normal(k[0], (3 * L, L)), 0.1 * jax.random.normal(k[1], (L,)))]
    layers += [(0.2 * jax.random.normal(k[2], (L, L)), jnp.zeros(L))] * hidden
    return {"layers": layers, "norm": (jnp.ones(L), jnp.zeros(L))}


def test_bfloat16_edge_messages_equal_the_concatenated_matmul_rounded():
    """Below float32 the first layer's three parts are multiplied apart and summed in float32:
    the concatenated float32 matmul of the same bfloat16 values, to bfloat16 rounding."""
    keys = jax.random.split(jax.random.PRNGKey(3), 4)
    p = _edge_mlp(keys[0])
    rows = [_bf16_rows(k) for k in keys[1:]]
    p16 = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), p)
    got = edge_messages(p16, *rows)
    f32 = lambda t: jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), t)  # noqa: E731
    want = mlp_concat(f32(p16), f32(rows))  # the official form, in float32
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=3e-2, atol=3e-2)
    assert float(jnp.linalg.norm(got.astype(jnp.float32) - want) / jnp.linalg.norm(want)) < 1e-2


def _f32_concatenations(hlo: str, width: int) -> int:
    """Instructions of the optimised HLO with a float32 result `width` wide (last axis)."""
    return len(re.findall(rf"= f32\[[\d,]*,{width}\]", hlo))


@pytest.mark.xdist_group("bf16-none")
def test_bfloat16_steps_keep_no_float32_concatenation_of_edge_latents(grad_compiled):
    """XLA:CPU widens a bfloat16 matmul's operands to float32: a concatenated `[E, B, 3L]`
    operand would be a float32 copy. float32 steps read the concatenation (the official
    form), which shows the check finds one where there is one. (The gradients of a
    mean-square loss that the temp test above compiles for "none".)"""
    counts = {p: _f32_concatenations(
        grad_compiled(CFG, get_recipe("none", p), READ_ONLY).as_text(), 3 * CFG.latent_size)
        for p in ("f32", "bf16")}
    assert counts["f32"] > 0
    assert counts["bf16"] == 0


def _nested_loss(wrap):
    """A processor-like nest: a checkpointed scan over groups, each a scan of steps that
    close over a traced integer index array (as a step closes over the graph's receivers)."""

    @jax.jit
    def loss(carry, ws, receivers):
        def step(h, w):
            messages = jnp.tanh(h @ w)  # [N, L]
            return jax.ops.segment_sum(messages, receivers, h.shape[0]), None

        def group(h, w_group):
            return jax.lax.scan(wrap(jax.checkpoint(step)), h, w_group)[0], None

        out, _ = jax.lax.scan(wrap(jax.checkpoint(group)), carry, ws)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    return loss


@pytest.mark.parametrize("custom_vjp3", [False, True])
def test_residuals_as_bits_in_nested_scans_over_a_closed_over_traced_index(custom_vjp3):
    """A `custom_vjp` function must not close over traced values (JAX's `custom_vjp3` rules
    refuse it; under JAX 0.11 the nested scan failed to lower), so `residuals_as_bits`
    passes the step's closed-over values explicitly: same gradients as the plain nest."""
    key = jax.random.PRNGKey(4)
    carry = jax.random.normal(key, (16, 8)).astype(jnp.bfloat16)
    ws = (0.3 * jax.random.normal(key, (2, 3, 8, 8))).astype(jnp.bfloat16)
    receivers = jnp.array([(3 * i + 1) % 16 for i in range(16)], jnp.int32)
    before = jax.config.jax_custom_vjp3
    jax.config.update("jax_custom_vjp3", custom_vjp3)
    try:
        plain = jax.grad(_nested_loss(lambda f: f), argnums=(0, 1))(carry, ws, receivers)
        bits = jax.grad(_nested_loss(residuals_as_bits), argnums=(0, 1))(carry, ws, receivers)
    finally:
        jax.config.update("jax_custom_vjp3", before)
    for a, b in zip(plain, bits):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend, wrapped", [("cpu", True), ("gpu", False)])
def test_step_scans_keep_bits_on_xla_cpu_alone(monkeypatch, backend, wrapped):
    """XLA:GPU and XLA:TPU slice bfloat16 natively: there the processor's step scans are
    left as they are (on an H200 the bits cost 0.17 GiB at graphcast-small, `none`)."""
    from gclab.memory import MemoryConfig, remat

    monkeypatch.setattr(remat.jax, "default_backend", lambda: backend)

    def step(h, w):
        return jnp.tanh(h @ w), None

    carry = jnp.zeros((4, 8), jnp.bfloat16)
    ws = jnp.zeros((3, 8, 8), jnp.bfloat16)
    jaxpr = str(jax.make_jaxpr(lambda c, w: remat.scan_steps(step, c, w, MemoryConfig()))(
        carry, ws))
    assert ("custom_vjp_call" in jaxpr) == wrapped
