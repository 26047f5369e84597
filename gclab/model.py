"""The GraphCast network: encoder (grid2mesh), processor (multimesh), decoder (mesh2grid).

Shapes (letters used in the comments below):
  B  batch (a feature axis: node arrays are `[N, B, C]`, edge arrays `[E, B, C]`)
  Ng grid nodes, Nm mesh nodes, E edges of the set at hand
  C  data channels of a grid node (without the 3 structural features), O outputs
  L  latent width, S processor steps, nb edge blocks, bs edges per block

Haiku owns the parameters only: every block's parameters are created by small modules
whose names follow the official tree (`{gnn}/{block}_mlp/~/linear_{k}` and
`{gnn}/{block}_layer_norm`), with the processor's S steps stacked on a leading axis
(`mesh_gnn/processor_edges_mesh_mlp/~/linear_0` has `w` of shape `[S, 3L, L]`). The
computation is plain JAX on those arrays, so that the processor is a `lax.scan` over its
steps and every memory technique of `gclab.techniques.MemoryConfig` (remat of steps or
groups of steps, whole-stage checkpoints, edge blocks, gather after matmul, bfloat16) is
a change of how the same function is evaluated, never of what it computes.
`gclab.params` converts the official flat parameter names to this tree and back.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple, Optional, Sequence

import haiku as hk
import jax
import jax.extend
import jax.numpy as jnp
import jraph
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from gclab.config import STRUCTURAL_EDGE_FEATURES, STRUCTURAL_NODE_FEATURES, ModelConfig
from gclab.techniques import MemoryConfig

Array = jax.Array
Params = dict  # one block: {"layers": [(w, b), ...], "norm": (scale, offset) | None}

LAYER_NORM_EPS = 1e-5


class GraphInputs(NamedTuple):
    """Static graph arrays the network consumes (a pytree; jit arguments or constants)."""

    grid_nodes: Array  # [Ng, 3] structural grid-node features
    mesh_nodes: Array  # [Nm, 3] structural mesh-node features
    g2m_senders: Array  # [E_g2m] int32 grid-node index
    g2m_receivers: Array  # [E_g2m] int32 mesh-node index
    g2m_edges: Array  # [E_g2m, 4]
    mesh_senders: Array  # [E_mesh] int32
    mesh_receivers: Array  # [E_mesh] int32
    mesh_edges: Array  # [E_mesh, 4]
    m2g_senders: Array  # [E_m2g = 3 Ng] int32 mesh-node index
    m2g_receivers: Array  # [E_m2g] int32 grid-node index, == repeat(arange(Ng), 3)
    m2g_edges: Array  # [E_m2g, 4]


def graph_inputs_from_arrays(
    grid_node_features, mesh_node_features,
    g2m_senders, g2m_receivers, g2m_features,
    mesh_senders, mesh_receivers, mesh_features,
    m2g_senders, m2g_receivers, m2g_features,
) -> GraphInputs:
    """Checks raw graph arrays and packs them as `GraphInputs` (float32 / int32).

    Raises:
      ValueError: shapes that do not fit together, indices out of range, or mesh2grid
        edges not grouped as three per grid node in grid-node order.
    """
    gn = np.asarray(grid_node_features, np.float32)
    mn = np.asarray(mesh_node_features, np.float32)
    ng, nm = gn.shape[0], mn.shape[0]
    for name, a in (("grid_node_features", gn), ("mesh_node_features", mn)):
        if a.ndim != 2 or a.shape[1] != STRUCTURAL_NODE_FEATURES:
            raise ValueError(f"{name} must have shape [N, {STRUCTURAL_NODE_FEATURES}], "
                             f"got {a.shape}")
    sets = []
    for name, s, r, f, n_send, n_recv in (
            ("grid2mesh", g2m_senders, g2m_receivers, g2m_features, ng, nm),
            ("mesh", mesh_senders, mesh_receivers, mesh_features, nm, nm),
            ("mesh2grid", m2g_senders, m2g_receivers, m2g_features, nm, ng)):
        s = np.asarray(s)
        r = np.asarray(r)
        f = np.asarray(f, np.float32)
        if s.ndim != 1 or s.shape != r.shape or f.shape != (s.shape[0], STRUCTURAL_EDGE_FEATURES):
            raise ValueError(
                f"{name} edges: senders {s.shape}, receivers {r.shape} and features {f.shape} "
                f"must be [E], [E] and [E, {STRUCTURAL_EDGE_FEATURES}]")
        if s.size and (s.min() < 0 or s.max() >= n_send or r.min() < 0 or r.max() >= n_recv):
            raise ValueError(f"{name} edges: indices out of range (senders < {n_send}, "
                             f"receivers < {n_recv})")
        sets += [s.astype(np.int32), r.astype(np.int32), f]
    if not np.array_equal(sets[7], np.repeat(np.arange(ng, dtype=np.int32), 3)):
        raise ValueError("mesh2grid edges must be three per grid node, grouped by grid node "
                         "in ascending order (receivers == repeat(arange(Ng), 3))")
    return GraphInputs(jnp.asarray(gn), jnp.asarray(mn), *map(jnp.asarray, sets))


def graph_inputs(graphs) -> GraphInputs:
    """`GraphInputs` from a `gclab.graphs.Graphs`."""
    return graph_inputs_from_arrays(
        graphs.grid_node_features, graphs.mesh_node_features,
        graphs.grid2mesh.senders, graphs.grid2mesh.receivers, graphs.grid2mesh.features,
        graphs.mesh.senders, graphs.mesh.receivers, graphs.mesh.features,
        graphs.mesh2grid.senders, graphs.mesh2grid.receivers, graphs.mesh2grid.features)


def graph_input_shapes(num_grid_nodes: int, num_mesh_nodes: int, num_g2m_edges: int,
                       num_mesh_edges: int) -> GraphInputs:
    """`GraphInputs` as `jax.ShapeDtypeStruct`s (for compiling from shapes alone)."""
    f32, i32 = jnp.float32, jnp.int32
    sds = jax.ShapeDtypeStruct
    e_m2g = 3 * num_grid_nodes
    return GraphInputs(
        sds((num_grid_nodes, 3), f32), sds((num_mesh_nodes, 3), f32),
        sds((num_g2m_edges,), i32), sds((num_g2m_edges,), i32), sds((num_g2m_edges, 4), f32),
        sds((num_mesh_edges,), i32), sds((num_mesh_edges,), i32), sds((num_mesh_edges, 4), f32),
        sds((e_m2g,), i32), sds((e_m2g,), i32), sds((e_m2g, 4), f32))


# ----------------------------------------------------------------------------------------
# Parameters (Haiku modules with the official names).


class _Linear(hk.Module):
    """`w` [.., in, out] and `b` [.., out], Haiku's default initialisation."""

    def __call__(self, in_dim: int, out_dim: int, stack: Optional[int]):
        lead = () if stack is None else (stack,)
        init = hk.initializers.TruncatedNormal(stddev=1.0 / math.sqrt(in_dim))
        w = hk.get_parameter("w", lead + (in_dim, out_dim), init=init)
        b = hk.get_parameter("b", lead + (out_dim,), init=jnp.zeros)
        return w, b


class _MLPParams(hk.Module):
    def __init__(self, sizes: Sequence[int], stack: Optional[int], name: str):
        super().__init__(name=name)
        self._sizes = tuple(sizes)
        self._stack = stack
        self._layers = [_Linear(name=f"linear_{k}") for k in range(len(sizes) - 1)]

    def __call__(self):
        pairs = zip(self._sizes[:-1], self._sizes[1:])
        return [lin(i, o, self._stack) for lin, (i, o) in zip(self._layers, pairs)]


class _LayerNormParams(hk.Module):
    def __call__(self, size: int, stack: Optional[int]):
        lead = () if stack is None else (stack,)
        scale = hk.get_parameter("scale", lead + (size,), init=jnp.ones)
        offset = hk.get_parameter("offset", lead + (size,), init=jnp.zeros)
        return scale, offset


def _block_params(block: str, in_dim: int, cfg: ModelConfig, out_dim: Optional[int] = None,
                  layer_norm: bool = True, stack: Optional[int] = None) -> Params:
    latent = cfg.latent_size
    sizes = [in_dim] + [latent] * cfg.hidden_layers + [out_dim or latent]
    layers = _MLPParams(sizes, stack, name=f"{block}_mlp")()
    norm = _LayerNormParams(name=f"{block}_layer_norm")(sizes[-1], stack) if layer_norm else None
    return {"layers": layers, "norm": norm}


class _GNNParams(hk.Module):
    """Creates the parameters of one GNN from a list of block specs."""

    def __call__(self, specs):
        return {block: _block_params(block, **kw) for block, kw in specs}


def _all_params(cfg: ModelConfig, data_channels: int, output_channels: int) -> dict:
    """Every parameter of the network, grouped by GNN and block."""
    L, S, F = cfg.latent_size, cfg.processor_steps, data_channels + STRUCTURAL_NODE_FEATURES
    e = STRUCTURAL_EDGE_FEATURES
    enc = _GNNParams(name="grid2mesh_gnn")([
        ("encoder_nodes_grid_nodes", dict(in_dim=F, cfg=cfg)),
        ("encoder_nodes_mesh_nodes", dict(in_dim=F, cfg=cfg)),
        ("encoder_edges_grid2mesh", dict(in_dim=e, cfg=cfg)),
        ("processor_edges_0_grid2mesh", dict(in_dim=3 * L, cfg=cfg)),
        ("processor_nodes_0_mesh_nodes", dict(in_dim=2 * L, cfg=cfg)),
        ("processor_nodes_0_grid_nodes", dict(in_dim=L, cfg=cfg)),
    ])
    proc = _GNNParams(name="mesh_gnn")([
        ("encoder_edges_mesh", dict(in_dim=e, cfg=cfg)),
        ("processor_edges_mesh", dict(in_dim=3 * L, cfg=cfg, stack=S)),
        ("processor_nodes_mesh_nodes", dict(in_dim=2 * L, cfg=cfg, stack=S)),
    ])
    dec = _GNNParams(name="mesh2grid_gnn")([
        ("encoder_edges_mesh2grid", dict(in_dim=e, cfg=cfg)),
        ("processor_edges_0_mesh2grid", dict(in_dim=3 * L, cfg=cfg)),
        ("processor_nodes_0_grid_nodes", dict(in_dim=2 * L, cfg=cfg)),
        ("processor_nodes_0_mesh_nodes", dict(in_dim=L, cfg=cfg)),
        ("decoder_nodes_grid_nodes", dict(in_dim=L, cfg=cfg, out_dim=output_channels,
                                          layer_norm=False)),
    ])
    return {"encoder": enc, "processor": proc, "decoder": dec}


# ----------------------------------------------------------------------------------------
# Pure building blocks.


def layer_norm(x: Array, scale: Array, offset: Array) -> Array:
    """LayerNorm over the last axis (biased variance, eps 1e-5); statistics in float32.

    Below float32 (bfloat16), the output is computed in float32 and rounded once to the
    input's dtype, and the backward pass keeps only the input: it recomputes the float32
    statistics, so no float32 copy of a normalised activation is saved for it.
    """
    if jnp.promote_types(x.dtype, jnp.float32) == x.dtype:
        return _layer_norm(x, scale, offset)
    return _low_precision_layer_norm(x, scale, offset)


def _layer_norm(x: Array, scale: Array, offset: Array) -> Array:
    dtype = x.dtype
    x = x.astype(jnp.promote_types(dtype, jnp.float32))
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    y = (x - mean) * (scale.astype(x.dtype) * jax.lax.rsqrt(var + LAYER_NORM_EPS))
    return (y + offset.astype(x.dtype)).astype(dtype)


@jax.custom_vjp
def _low_precision_layer_norm(x: Array, scale: Array, offset: Array) -> Array:
    return _layer_norm(x, scale, offset)


def _low_precision_layer_norm_fwd(x, scale, offset):
    return _layer_norm(x, scale, offset), (x, scale, offset)


def _low_precision_layer_norm_bwd(res, g):
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


_low_precision_layer_norm.defvjp(_low_precision_layer_norm_fwd, _low_precision_layer_norm_bwd)


def _hidden(p: Params, h: Array) -> Array:
    """Finishes an MLP whose first layer's pre-activation is `h`: swish, more layers, norm."""
    for w, b in p["layers"][1:]:
        h = jax.nn.swish(h) @ w + b
    if p["norm"] is not None:
        h = layer_norm(h, *p["norm"])
    return h


def mlp(p: Params, x: Array) -> Array:
    """MLP (+ LayerNorm) on the last axis."""
    w, b = p["layers"][0]
    return _hidden(p, x @ w + b)


def mlp_concat(p: Params, parts: Sequence[Array]) -> Array:
    """MLP on the concatenation of `parts` along the last axis."""
    return mlp(p, jnp.concatenate(parts, axis=-1))


def _sum_incoming(messages: Array, receivers: Array, num_nodes: int, float32: bool) -> Array:
    """Sum of incoming messages per receiver node, optionally accumulated in float32."""
    dtype = messages.dtype
    if float32:
        messages = messages.astype(jnp.float32)
    return jraph.segment_sum(messages, receivers, num_nodes).astype(dtype)  # [N, B, L]


def edge_messages(p: Params, edges: Array, sender_rows: Array, receiver_rows: Array,
                  projected: tuple = (False, False)) -> Array:
    """Edge MLP on `[edges, sender, receiver]` for rows already gathered per edge.

    `sender_rows` / `receiver_rows` [e, B, L] are node latents gathered per edge, or, where
    `projected` says so, node latents already multiplied by their part of the first layer
    (gather after matmul: `W [e, v_s, v_r] = W_e e + (W_s v_s) + (W_r v_r)`, same numbers
    up to float rounding, no `[e, B, 3L]` concatenation).
    """
    if not any(projected):
        return mlp_concat(p, [edges, sender_rows, receiver_rows])  # [e, B, L]
    w, b = p["layers"][0]  # w [3L, L] rows: edge, sender, receiver
    L = edges.shape[-1]
    h = edges @ w[:L] + b
    h = h + (sender_rows if projected[0] else sender_rows @ w[L:2 * L])
    h = h + (receiver_rows if projected[1] else receiver_rows @ w[2 * L:])
    return _hidden(p, h)  # [e, B, L]


def project(p: Params, latent: Array, part: str) -> Array:
    """`latent @ W_part` for the sender or receiver part of an edge MLP's first layer."""
    w = p["layers"][0][0]
    L = latent.shape[-1]
    return latent @ (w[L:2 * L] if part == "sender" else w[2 * L:])  # [N, B, L]


def _node_side(p: Params, latent: Array, part: str, gather_after_matmul: bool) -> Array:
    """What edges gather from a node set: its latents, or their projection."""
    return project(p, latent, part) if gather_after_matmul else latent


def _embed_edges(p: Params, features: Array, batch: int, dtype) -> Array:
    """Edge embedding [E, B, L]; the features are batch-independent, so embed once."""
    e = mlp(p, features.astype(dtype))  # [E, L]
    return jnp.broadcast_to(e[:, None, :], (e.shape[0], batch, e.shape[1]))


def balanced_block(n: int, block: int) -> int:
    """The block size that splits `n` rows into ceil(n / block) near-equal blocks."""
    nb = max(1, -(-n // block))
    return -(-n // nb)


def _blocks(x: Array, block: int, fill=0) -> Array:
    """Pads axis 0 to a multiple of `block` and reshapes to [nb, block, ...]."""
    n = x.shape[0]
    nb = -(-n // block)
    pad = [(0, nb * block - n)] + [(0, 0)] * (x.ndim - 1)
    return jnp.pad(x, pad, constant_values=fill).reshape((nb, block) + x.shape[1:])


def _remat_policy(name: str):
    cp = jax.checkpoint_policies
    return {
        "nothing": cp.nothing_saveable,
        "dots": cp.dots_with_no_batch_dims_saveable,
        "aggregated": cp.save_only_these_names("aggregated_messages"),
        "node-latents": cp.save_only_these_names("node_latents"),
    }[name]


# ----------------------------------------------------------------------------------------
# The three GNNs as pure functions of their parameters.


def grid_latents(P: dict, grid_features: Array, inputs: Array) -> Array:
    """Embedded grid nodes [n, B, L] from their inputs [n, B, C] and features [n, 3]."""
    n, batch, _ = inputs.shape
    inputs = inputs.astype(P["encoder_nodes_grid_nodes"]["layers"][0][0].dtype)
    feat = jnp.broadcast_to(grid_features.astype(inputs.dtype)[:, None], (n, batch, 3))
    return mlp_concat(P["encoder_nodes_grid_nodes"], [inputs, feat])  # [n, B, L]


def encoder(P: dict, graph: GraphInputs, inputs: Array, mem: MemoryConfig):
    """grid2mesh GNN: embeds grid/mesh nodes and g2m edges, one interaction step.

    Returns grid latents [Ng, B, L] (they skip the processor) and mesh latents [Nm, B, L].
    With `stream_grid_nodes`, grid latents are never formed for all nodes at once: the
    edge blocks embed the grid nodes they need, and the returned grid latents are None
    (the decoder recomputes them block by block).
    """
    dtype = P["encoder_nodes_mesh_nodes"]["layers"][0][0].dtype  # inputs may be float32
    ng, batch, channels = inputs.shape
    nm = graph.mesh_nodes.shape[0]
    mesh_in = jnp.concatenate([jnp.zeros((nm, channels), dtype),
                               graph.mesh_nodes.astype(dtype)], axis=-1)  # [Nm, C+3]
    mesh = mlp(P["encoder_nodes_mesh_nodes"], mesh_in)  # [Nm, L], batch-independent
    mesh = jnp.broadcast_to(mesh[:, None], (nm, batch, mesh.shape[-1]))  # [Nm, B, L]
    edge_p = P["processor_edges_0_grid2mesh"]
    gam = mem.gather_after_matmul
    mesh_side = _node_side(edge_p, mesh, "receiver", gam)  # [Nm, B, L]
    if mem.stream_grid_nodes:
        grid = None
    else:
        grid = grid_latents(P, graph.grid_nodes, inputs)  # [Ng, B, L]
    if mem.edge_block_size is None:
        edges = _embed_edges(P["encoder_edges_grid2mesh"], graph.g2m_edges, batch, dtype)
        grid_side = _node_side(edge_p, grid, "sender", gam)  # [Ng, B, L]
        messages = edge_messages(edge_p, edges, grid_side[graph.g2m_senders],
                                 mesh_side[graph.g2m_receivers], (gam, gam))  # [E, B, L]
        # The encoder always sums in float32 (many grid nodes per mesh node near the poles).
        incoming = _sum_incoming(messages, graph.g2m_receivers, nm, True)  # [Nm, B, L]
    else:
        grid_side = None if grid is None else _node_side(edge_p, grid, "sender", gam)
        incoming = _blocked_encoder_sum(P, graph, inputs, grid_side, mesh_side, mem)
    mesh = mesh + mlp_concat(P["processor_nodes_0_mesh_nodes"], [mesh, incoming])
    if grid is not None:
        grid = grid + mlp(P["processor_nodes_0_grid_nodes"], grid)
    return grid, mesh


def _blocked_encoder_sum(P, graph, inputs, grid_side, mesh_side, mem) -> Array:
    """Sum of incoming g2m messages over blocks of edges, each block checkpointed.

    With `grid_side` None (streamed grid nodes), each block embeds its senders' grid
    latents from their inputs, so no `[Ng, B, L]` array exists.
    """
    nm, batch, latent = mesh_side.shape
    dtype = mesh_side.dtype
    n_edges = graph.g2m_senders.shape[0]
    bs = balanced_block(n_edges, mem.edge_block_size)
    edge_p = P["processor_edges_0_grid2mesh"]
    gam = mem.gather_after_matmul
    valid = _blocks(jnp.ones((n_edges,), dtype), bs)  # [nb, bs]
    xs = (_blocks(graph.g2m_senders, bs), _blocks(graph.g2m_receivers, bs),
          _blocks(graph.g2m_edges, bs), valid)

    @jax.checkpoint
    def block_messages(grid_side, mesh_side, inputs, senders, receivers, features, valid):
        edges = _embed_edges(P["encoder_edges_grid2mesh"], features, batch, dtype)
        if grid_side is None:  # embed the senders here: [bs, B, L]
            sender_rows = grid_latents(P, graph.grid_nodes[senders], inputs[senders])
            sender_projected = False
        else:
            sender_rows, sender_projected = grid_side[senders], gam
        messages = edge_messages(edge_p, edges, sender_rows, mesh_side[receivers],
                                 (sender_projected, gam))
        return messages * valid[:, None, None]  # [bs, B, L]

    def body(total, x):
        messages = block_messages(grid_side, mesh_side, inputs, *x)
        return total + _sum_incoming(messages, x[1], nm, True).astype(jnp.float32), None

    total, _ = jax.lax.scan(body, jnp.zeros((nm, batch, latent), jnp.float32), xs)
    return total.astype(dtype)  # [Nm, B, L]


def processor(P: dict, graph: GraphInputs, mesh: Array, mem: MemoryConfig) -> Array:
    """Mesh GNN: embeds multimesh edges, then S unshared interaction steps (a scan)."""
    nm, batch, _ = mesh.shape
    dtype = mesh.dtype
    senders, receivers = graph.mesh_senders, graph.mesh_receivers
    stacked = {"edges": P["processor_edges_mesh"], "nodes": P["processor_nodes_mesh_nodes"]}
    f32_sum = mem.float32_aggregation
    blocked = mem.processor_edge_blocks
    if not blocked:
        edges = _embed_edges(P["encoder_edges_mesh"], graph.mesh_edges, batch, dtype)  # [E,B,L]
    else:
        bs = balanced_block(senders.shape[0], mem.edge_block_size)
        valid = _blocks(jnp.ones(senders.shape, dtype), bs)  # [nb, bs]
        senders, receivers = _blocks(senders, bs), _blocks(receivers, bs)  # [nb, bs]
        # Embedded block by block, so that the embedding's backward is blockwise too.
        embed = jax.checkpoint(
            lambda f: _embed_edges(P["encoder_edges_mesh"], f, batch, dtype))  # [bs, B, L]
        _, edges = jax.lax.scan(lambda c, f: (c, embed(f)), None,
                                _blocks(graph.mesh_edges, bs))  # [nb, bs, B, L]

    def step(carry, p):
        mesh, edges = carry
        gam = mem.gather_after_matmul
        sides = (_node_side(p["edges"], mesh, "sender", gam),
                 _node_side(p["edges"], mesh, "receiver", gam))  # [Nm, B, L] each
        if not blocked:
            messages = edge_messages(p["edges"], edges, sides[0][senders],
                                     sides[1][receivers], (gam, gam))  # [E, B, L]
            incoming = _sum_incoming(messages, receivers, nm, f32_sum)  # [Nm, B, L]
            edges = edges + messages
        else:
            edges, incoming = _blocked_edge_update(p["edges"], sides, gam, edges, senders,
                                                   receivers, valid, nm, f32_sum)
        incoming = checkpoint_name(incoming, "aggregated_messages")
        mesh = mesh + mlp_concat(p["nodes"], [mesh, incoming])  # [Nm, B, L]
        mesh = checkpoint_name(mesh, "node_latents")
        return (mesh, edges), None

    (mesh, _), _ = _scan_steps(step, (mesh, edges), stacked, mem)
    return mesh


def _blocked_edge_update(p, sides, gam, edges, senders, receivers, valid, nm, f32_sum):
    """One processor edge update over blocks of edges: new edges, sum of incoming messages."""

    @jax.checkpoint
    def block_messages(p, sides, edges, senders, receivers, valid):
        messages = edge_messages(p, edges, sides[0][senders], sides[1][receivers], (gam, gam))
        return messages * valid[:, None, None]  # [bs, B, L]

    def body(total, x):
        edges, senders, receivers, valid = x
        messages = block_messages(p, sides, edges, senders, receivers, valid)
        total = total + _sum_incoming(messages, receivers, nm, f32_sum).astype(total.dtype)
        return total, edges + messages

    batch, latent = edges.shape[2:]
    acc_dtype = jnp.float32 if f32_sum else edges.dtype
    total, edges = jax.lax.scan(body, jnp.zeros((nm, batch, latent), acc_dtype),
                                (edges, senders, receivers, valid))
    return edges, total.astype(edges.dtype)  # [nb, bs, B, L], [Nm, B, L]


def _scan_steps(step: Callable, carry, stacked: dict, mem: MemoryConfig):
    """Runs S stacked steps as scans, with the processor remat of `mem`."""
    S = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    policy = _remat_policy(mem.remat_policy)
    ckpt = functools.partial(jax.checkpoint, policy=policy)
    kind = mem.processor_remat

    def take(lo, hi):
        return jax.tree_util.tree_map(lambda a: a[lo:hi], stacked)

    def scan(body, carry, xs, offset, stride=1):
        # The scope names which steps the loop's iterations are (offset + k * stride,
        # relative to an enclosing step loop), for `gclab.timeline`'s step labels.
        if any(a.dtype == jnp.bfloat16 for a in jax.tree_util.tree_leaves(carry)):
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


def step_scope(offset: int, stride: int = 1) -> str:
    """Named scope of a scan over processor steps: iteration k runs step offset + k * stride.

    Offsets of nested step scans add up (a scan over groups of k steps has stride k; the
    scan inside each group has offset 0 and stride 1).
    """
    return f"stepscan_{offset}_{stride}"


def decoder(P: dict, graph: GraphInputs, grid: Optional[Array], mesh: Array,
            mem: MemoryConfig, P_enc: Optional[dict] = None,
            inputs: Optional[Array] = None) -> Array:
    """mesh2grid GNN: embeds m2g edges, one interaction step, then the output MLP.

    Returns [Ng, B, O]. The mesh-node update of this GNN is computed (its parameters
    exist, as in the official model) and discarded: it has no effect on the outputs.
    With streamed grid nodes (`grid` None), each block of grid nodes is embedded and
    updated from `inputs` with the encoder's parameters `P_enc` first.
    """
    f32_sum = mem.float32_aggregation
    _ = mesh + mlp(P["processor_nodes_0_mesh_nodes"], mesh)  # unused, as in the official code
    if mem.edge_block_size is None:
        ng, batch, _ = grid.shape
        edge_p = P["processor_edges_0_mesh2grid"]
        gam = mem.gather_after_matmul
        edges = _embed_edges(P["encoder_edges_mesh2grid"], graph.m2g_edges, batch, grid.dtype)
        messages = edge_messages(
            edge_p, edges, _node_side(edge_p, mesh, "sender", gam)[graph.m2g_senders],
            _node_side(edge_p, grid, "receiver", gam)[graph.m2g_receivers],
            (gam, gam))  # [3Ng, B, L]
        incoming = _sum_incoming(messages, graph.m2g_receivers, ng, f32_sum)  # [Ng, B, L]
        grid = grid + mlp_concat(P["processor_nodes_0_grid_nodes"], [grid, incoming])
        return mlp(P["decoder_nodes_grid_nodes"], grid)  # [Ng, B, O]
    return _blocked_decoder(P, graph, grid, mesh, mem, P_enc, inputs)


def _blocked_decoder(P, graph, grid, mesh, mem, P_enc, inputs) -> Array:
    """The decoder over blocks of grid nodes, end to end, each block checkpointed.

    mesh2grid edges come three per grid node in grid-node order, so a block of `bn` grid
    nodes owns exactly the edges `[3 g0, 3 (g0 + bn))`.
    """
    streamed = grid is None
    ng, batch, _ = (inputs if streamed else grid).shape
    dtype = mesh.dtype
    bn = balanced_block(ng, max(1, mem.edge_block_size // 3))  # grid nodes per block
    f32_sum = mem.float32_aggregation
    gam = mem.gather_after_matmul
    edge_p = P["processor_edges_0_mesh2grid"]
    mesh_side = _node_side(edge_p, mesh, "sender", gam)  # [Nm, B, L]
    node_xs = ((_blocks(inputs, bn), _blocks(graph.grid_nodes, bn)) if streamed
               else (_blocks(grid, bn),))
    xs = node_xs + (_blocks(graph.m2g_senders, 3 * bn), _blocks(graph.m2g_edges, 3 * bn))
    local_receivers = jnp.repeat(jnp.arange(bn, dtype=jnp.int32), 3)  # [3 bn]

    @jax.checkpoint
    def block(mesh_side, *x):
        if streamed:
            block_inputs, block_features, senders, features = x
            grid = grid_latents(P_enc, block_features, block_inputs)  # [bn, B, L]
            grid = grid + mlp(P_enc["processor_nodes_0_grid_nodes"], grid)
        else:
            grid, senders, features = x
        edges = _embed_edges(P["encoder_edges_mesh2grid"], features, batch, dtype)
        receiver_rows = _node_side(edge_p, grid, "receiver", gam)[local_receivers]
        messages = edge_messages(edge_p, edges, mesh_side[senders], receiver_rows,
                                 (gam, gam))  # [3 bn, B, L]
        incoming = _sum_incoming(messages, local_receivers, bn, f32_sum)  # [bn, B, L]
        grid = grid + mlp_concat(P["processor_nodes_0_grid_nodes"], [grid, incoming])
        return mlp(P["decoder_nodes_grid_nodes"], grid)  # [bn, B, O]

    _, out = jax.lax.scan(lambda c, x: (c, block(mesh_side, *x)), None, xs)
    return out.reshape((-1,) + out.shape[2:])[:ng]  # [Ng, B, O]


def _cast_params(tree: Any, dtype) -> Any:
    return jax.tree_util.tree_map(lambda a: a.astype(dtype), tree)


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
    """

    saved = {}

    @jax.custom_vjp
    def wrapped(*args):
        return fn(*args)

    def fwd(*args):
        out, pullback = jax.vjp(fn, *args)
        # The pullback as a jaxpr: its constants are the residuals (no tracer stays behind
        # in a Python closure, so the backward pass may be traced anywhere).
        closed, saved["grads"] = jax.make_jaxpr(pullback, return_shape=True)(out)
        saved["jaxpr"] = closed.jaxpr
        saved["bits"] = [np.dtype(c.dtype) == jnp.bfloat16 for c in closed.consts]
        return out, [jax.lax.bitcast_convert_type(c, jnp.uint16) if bits else c
                     for c, bits in zip(closed.consts, saved["bits"])]

    def bwd(res, ct):
        consts = [jax.lax.bitcast_convert_type(c, jnp.bfloat16) if bits else c
                  for c, bits in zip(res, saved["bits"])]
        pullback = jax.extend.core.jaxpr_as_fun(
            jax.extend.core.ClosedJaxpr(saved["jaxpr"], consts))
        grads = pullback(*jax.tree_util.tree_leaves(ct))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(saved["grads"]),
                                            grads)

    wrapped.defvjp(fwd, bwd)
    return wrapped


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


def graphcast_forward(P: dict, graph: GraphInputs, inputs: Array, mem: MemoryConfig) -> Array:
    """The whole network on grouped parameters `P` (see `_all_params`). [Ng,B,C] -> [Ng,B,O]."""
    dtype = jnp.bfloat16 if mem.precision == "bf16" else jnp.float32
    P = _cast_params(P, dtype)  # parameters stay float32; gradients come back float32
    if not mem.stream_grid_nodes:
        inputs = inputs.astype(dtype)
    # Streamed grid nodes gather their inputs block by block and cast each block: a
    # bfloat16 copy of all inputs would be sliced in float32 on XLA:CPU (see
    # `residuals_as_bits`), a copy twice its size.

    def run_encoder(P_enc, graph, inputs):
        with jax.named_scope("encoder"):
            return encoder(P_enc, graph, inputs, mem)

    def run_decoder(P_dec, graph, grid, mesh, P_enc, inputs):
        with jax.named_scope("decoder"):
            return decoder(P_dec, graph, grid, mesh, mem, P_enc, inputs)

    if mem.checkpoint_encoder:
        run_encoder = stage_checkpoint(run_encoder)
    if mem.checkpoint_decoder:
        run_decoder = stage_checkpoint(run_decoder)
    grid, mesh = run_encoder(P["encoder"], graph, inputs)
    with jax.named_scope("processor"):
        mesh = processor(P["processor"], graph, mesh, mem)
    if mem.stream_grid_nodes:
        out = run_decoder(P["decoder"], graph, None, mesh, P["encoder"], inputs)
    else:
        out = run_decoder(P["decoder"], graph, grid, mesh, None, None)
    return out.astype(jnp.float32)


def make_network(model: ModelConfig, data_channels: int, output_channels: int,
                 memory: Optional[MemoryConfig] = None) -> hk.Transformed:
    """The GraphCast network as a Haiku transform without apply RNG.

    Args:
      model: geometry and network config (only the network fields are used here; the
        graphs come in as `GraphInputs`).
      data_channels: C, data channels per grid node (the 3 structural features are
        appended by the network).
      output_channels: O.
      memory: memory techniques (default: none).

    Returns:
      `net` with `net.init(rng, graph, inputs)` and `net.apply(params, graph, inputs)`,
      `inputs` [Ng, B, C] -> outputs [Ng, B, O] float32.
    """
    for name, v in (("data_channels", data_channels), ("output_channels", output_channels)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}={v!r} is invalid: an integer >= 1.")
    mem = memory or MemoryConfig()

    def forward(graph: GraphInputs, inputs: Array) -> Array:
        if inputs.ndim != 3 or inputs.shape[-1] != data_channels:
            raise ValueError(f"inputs must have shape [Ng, B, {data_channels}], "
                             f"got {tuple(inputs.shape)}")
        if inputs.shape[0] != graph.grid_nodes.shape[0]:
            raise ValueError(f"inputs have {inputs.shape[0]} grid nodes, the graph has "
                             f"{graph.grid_nodes.shape[0]}")
        P = _all_params(model, data_channels, output_channels)
        return graphcast_forward(P, graph, inputs, mem)

    return hk.without_apply_rng(hk.transform(forward))


def count_params(params) -> int:
    """Number of scalars in a parameter tree."""
    return int(sum(np.prod(a.shape) for a in jax.tree_util.tree_leaves(params)))


def param_shapes(model: ModelConfig, data_channels: int, output_channels: int):
    """Parameter shapes (`jax.ShapeDtypeStruct`) without allocating anything."""
    net = make_network(model, data_channels, output_channels)
    ng, nm = 2, 2  # parameter shapes do not depend on the graph
    graph = graph_input_shapes(ng, nm, 1, 1)
    inputs = jax.ShapeDtypeStruct((ng, 1, data_channels), jnp.float32)
    return jax.eval_shape(net.init, jax.random.PRNGKey(0), graph, inputs)
