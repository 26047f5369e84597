"""Building blocks of GraphCast's GNNs: parameter modules with the official names, and the
pure functions that use them (MLP with swish and LayerNorm, edge messages).

Haiku owns the parameters only: every block's parameters are created by small modules
whose names follow the official tree (`{gnn}/{block}_mlp/~/linear_{k}` and
`{gnn}/{block}_layer_norm`), optionally stacked on a leading axis (the processor's S
steps). The computation is plain JAX on those arrays.

Shapes: E edges (or e, the edges of one block), N nodes, B batch, L latent.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Iterator, Optional, Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from gclab.config import ModelConfig

Array = jax.Array
Params = dict  # one block: {"layers": [(w, b), ...], "norm": (scale, offset) | None}

LAYER_NORM_EPS = 1e-5


class Linear(hk.Module):
    """`w` [.., in, out] and `b` [.., out], Haiku's default initialisation."""

    def __call__(self, in_dim: int, out_dim: int, stack: Optional[int]):
        lead = () if stack is None else (stack,)
        init = hk.initializers.TruncatedNormal(stddev=1.0 / math.sqrt(in_dim))
        w = hk.get_parameter("w", lead + (in_dim, out_dim), init=init)
        b = hk.get_parameter("b", lead + (out_dim,), init=jnp.zeros)
        return w, b


class MLPParams(hk.Module):
    def __init__(self, sizes: Sequence[int], stack: Optional[int], name: str):
        super().__init__(name=name)
        self._sizes = tuple(sizes)
        self._stack = stack
        self._layers = [Linear(name=f"linear_{k}") for k in range(len(sizes) - 1)]

    def __call__(self):
        pairs = zip(self._sizes[:-1], self._sizes[1:])
        return [lin(i, o, self._stack) for lin, (i, o) in zip(self._layers, pairs)]


class LayerNormParams(hk.Module):
    def __call__(self, size: int, stack: Optional[int]):
        lead = () if stack is None else (stack,)
        scale = hk.get_parameter("scale", lead + (size,), init=jnp.ones)
        offset = hk.get_parameter("offset", lead + (size,), init=jnp.zeros)
        return scale, offset


def block_params(block: str, in_dim: int, cfg: ModelConfig, out_dim: Optional[int] = None,
                  layer_norm: bool = True, stack: Optional[int] = None) -> Params:
    latent = cfg.latent_size
    sizes = [in_dim] + [latent] * cfg.hidden_layers + [out_dim or latent]
    layers = MLPParams(sizes, stack, name=f"{block}_mlp")()
    norm = LayerNormParams(name=f"{block}_layer_norm")(sizes[-1], stack) if layer_norm else None
    return {"layers": layers, "norm": norm}


class GNNParams(hk.Module):
    """Creates the parameters of one GNN from a list of block specs."""

    def __call__(self, specs):
        return {block: block_params(block, **kw) for block, kw in specs}


# ----------------------------------------------------------------------------------------
# Pure building blocks.


# Whether float32 LayerNorms keep only their input (`MemoryConfig.recompute_layer_norm`).
# A context variable rather than an argument: the LayerNorm sits at the end of every MLP,
# which the network's stages call in many places, and the choice is one per network (set
# by `gclab.model.graphcast` around each trace, as the pipeline layout is).
_RECOMPUTE_LAYER_NORM = contextvars.ContextVar("gclab_recompute_layer_norm", default=False)


@contextlib.contextmanager
def recomputed_layer_norms(on: bool = True) -> Iterator[None]:
    """Within: every float32 LayerNorm keeps only its input for the backward pass and
    recomputes its statistics there, as a bfloat16 one always does."""
    token = _RECOMPUTE_LAYER_NORM.set(bool(on))
    try:
        yield
    finally:
        _RECOMPUTE_LAYER_NORM.reset(token)


def layer_norm(x: Array, scale: Array, offset: Array) -> Array:
    """LayerNorm over the last axis (biased variance, eps 1e-5); statistics in float32.

    Below float32 (bfloat16), the output is computed in float32 and rounded once to the
    input's dtype, and the backward pass keeps only the input: it recomputes the float32
    statistics, so no float32 copy of a normalised activation is saved for it. In float32
    it is differentiated as written (as Haiku's LayerNorm is), unless
    `recomputed_layer_norms` is active: then it too keeps only its input.
    """
    if (jnp.promote_types(x.dtype, jnp.float32) == x.dtype
            and not _RECOMPUTE_LAYER_NORM.get()):
        return float32_layer_norm(x, scale, offset)
    return _recomputing_layer_norm(x, scale, offset)


def float32_layer_norm(x: Array, scale: Array, offset: Array) -> Array:
    """LayerNorm computed in float32 (or the input's wider dtype), cast back to the input's."""
    dtype = x.dtype
    x = x.astype(jnp.promote_types(dtype, jnp.float32))
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    y = (x - mean) * (scale.astype(x.dtype) * jax.lax.rsqrt(var + LAYER_NORM_EPS))
    return (y + offset.astype(x.dtype)).astype(dtype)


@jax.custom_vjp
def _recomputing_layer_norm(x: Array, scale: Array, offset: Array) -> Array:
    return float32_layer_norm(x, scale, offset)


def _recomputing_layer_norm_fwd(x, scale, offset):
    return float32_layer_norm(x, scale, offset), (x, scale, offset)


def _recomputing_layer_norm_bwd(res, g):
    x, scale, offset = res
    f32 = jnp.float32
    xf = x.astype(f32)  # [..., L]
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.var(xf, axis=-1, keepdims=True) + LAYER_NORM_EPS)  # [..., 1]
    xhat = (xf - mean) * rstd  # [..., L]
    g = g.astype(f32)
    rows = tuple(range(x.ndim - 1))
    d_offset = jnp.sum(g, axis=rows)  # [L]
    d_scale = jnp.sum(g * xhat, axis=rows)  # [L]
    d_xhat = g * scale.astype(f32)
    dx = rstd * (d_xhat - jnp.mean(d_xhat, axis=-1, keepdims=True)
                 - xhat * jnp.mean(d_xhat * xhat, axis=-1, keepdims=True))
    return dx.astype(x.dtype), d_scale.astype(scale.dtype), d_offset.astype(offset.dtype)


_recomputing_layer_norm.defvjp(_recomputing_layer_norm_fwd, _recomputing_layer_norm_bwd)


def mlp_hidden(p: Params, h: Array) -> Array:
    """Finishes an MLP whose first layer's pre-activation is `h`: swish, more layers, norm."""
    for w, b in p["layers"][1:]:
        h = jax.nn.swish(h) @ w + b
    if p["norm"] is not None:
        h = layer_norm(h, *p["norm"])
    return h


def mlp(p: Params, x: Array) -> Array:
    """MLP (+ LayerNorm) on the last axis."""
    w, b = p["layers"][0]
    return mlp_hidden(p, x @ w + b)


def mlp_concat(p: Params, parts: Sequence[Array]) -> Array:
    """MLP on the concatenation of `parts` along the last axis."""
    return mlp(p, jnp.concatenate(parts, axis=-1))


def edge_messages(p: Params, edges: Array, sender_rows: Array, receiver_rows: Array,
                  projected: tuple = (False, False)) -> Array:
    """Edge MLP on `[edges, sender, receiver]` for rows already gathered per edge.

    `sender_rows` / `receiver_rows` [e, B, L] are node latents gathered per edge, or, where
    `projected` says so, node latents already multiplied by their part of the first layer
    (gather after matmul: `W [e, v_s, v_r] = W_e e + (W_s v_s) + (W_r v_r)`, same numbers
    up to float rounding, no `[e, B, 3L]` concatenation).

    In float32 without projections the MLP reads the concatenation, as the official code
    does. Below float32 (bfloat16) it never concatenates: the three parts of the first
    layer are multiplied separately and summed in float32, the accumulator one matmul over
    the concatenation has, then rounded once. A backend without bfloat16 matmuls (XLA:CPU,
    a T4) widens a matmul's operands to float32, and a concatenated operand would become a
    float32 `[e, B, 3L]` copy, twice the bytes of the bfloat16 one.
    """
    if not any(projected) and jnp.promote_types(edges.dtype, jnp.float32) == edges.dtype:
        return mlp_concat(p, [edges, sender_rows, receiver_rows])  # [e, B, L]
    w, b = p["layers"][0]  # w [3L, L] rows: edge, sender, receiver
    L = edges.shape[-1]
    acc = jnp.promote_types(edges.dtype, jnp.float32)

    def part(rows: Array, w_part: Array, done: bool) -> Array:  # [e, B, L] in `acc`
        if done:
            return rows.astype(acc)
        return jnp.matmul(rows, w_part, preferred_element_type=acc)

    h = (part(edges, w[:L], False) + b.astype(acc) + part(sender_rows, w[L:2 * L], projected[0])
         + part(receiver_rows, w[2 * L:], projected[1]))
    return mlp_hidden(p, h.astype(edges.dtype))  # [e, B, L]


def project(p: Params, latent: Array, part: str) -> Array:
    """`latent @ W_part` for the sender or receiver part of an edge MLP's first layer."""
    w = p["layers"][0][0]
    L = latent.shape[-1]
    return latent @ (w[L:2 * L] if part == "sender" else w[2 * L:])  # [N, B, L]


def node_side(p: Params, latent: Array, part: str, gather_after_matmul: bool) -> Array:
    """What edges gather from a node set: its latents, or their projection."""
    return project(p, latent, part) if gather_after_matmul else latent


def embed_edges(p: Params, features: Array, batch: int, dtype) -> Array:
    """Edge embedding [E, B, L]; the features are batch-independent, so embed once."""
    e = mlp(p, features.astype(dtype))  # [E, L]
    return jnp.broadcast_to(e[:, None, :], (e.shape[0], batch, e.shape[1]))


# ----------------------------------------------------------------------------------------
# The three GNNs as pure functions of their parameters.
