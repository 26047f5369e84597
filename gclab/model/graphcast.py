"""The GraphCast network: encoder (grid2mesh), processor (multimesh), decoder (mesh2grid).

Shapes (letters used in the comments below):
  B  batch (a feature axis: node arrays are `[N, B, C]`, edge arrays `[E, B, C]`)
  Ng grid nodes, Nm mesh nodes, E edges of the set at hand
  C  data channels of a grid node (without the 3 structural features), O outputs
  L  latent width, S processor steps, nb edge blocks, bs edges per block

Parameters follow the official tree (see `gclab.model.layers`), with the processor's S
steps stacked on a leading axis (`mesh_gnn/processor_edges_mesh_mlp/~/linear_0` has `w` of
shape `[S, 3L, L]`). The computation is plain JAX on those arrays, so that the processor
is a `lax.scan` over its steps and every memory technique of `gclab.memory.MemoryConfig`
(remat of steps or groups of steps, whole-stage checkpoints, edge blocks, gather after
matmul, bfloat16) is a change of how the same function is evaluated, never of what it
computes. The techniques themselves live in `gclab.memory`; this module applies them.
Under a layout with a `pipeline` axis (`gclab.parallel.use_layout`) the same stages run as
a GPipe pipeline (`pipelined_forward`): the processor's steps split into stages, the
encoder with the first, the decoder with the last, each stage with its own remat.
`gclab.model.official` converts the official flat parameter names to this tree and back.
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping, NamedTuple, Optional

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from gclab.config import (
    STRUCTURAL_EDGE_FEATURES,
    STRUCTURAL_NODE_FEATURES,
    ModelConfig,
    WrongType,
    is_int,
    require_count,
    require_kind,
)
from gclab.memory.blocks import (
    balanced_block,
    blocked_edge_update,
    blocked_sum,
    merge_blocks,
    shard_block,
    split_blocks,
)
from gclab.memory.config import MemoryConfig
from gclab.memory.precision import aggregate, cast_tree, compute_dtype
from gclab.memory.remat import (
    AGGREGATED_MESSAGES,
    NODE_LATENTS,
    scan_steps,
    stage_checkpoint,
)
from gclab.model.layers import (
    GNNParams,
    edge_messages,
    embed_edges,
    mlp,
    mlp_concat,
    node_side,
    recomputed_layer_norms,
)
from gclab.parallel.config import PIPELINE_AXIS, ParallelConfig
from gclab.parallel.pipeline import active_pipeline, gpipe
from gclab.parallel.sharding import (
    full_rows,
    mesh_rows,
    spatial_shards,
    split_rows,
    split_shards,
)

Array = jax.Array


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
    """`GraphInputs` from a `gclab.geometry.graphs.Graphs`."""
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


def _all_params(cfg: ModelConfig, data_channels: int, output_channels: int) -> dict:
    """Every parameter of the network, grouped by GNN and block."""
    L, S, F = cfg.latent_size, cfg.processor_steps, data_channels + STRUCTURAL_NODE_FEATURES
    e = STRUCTURAL_EDGE_FEATURES
    enc = GNNParams(name="grid2mesh_gnn")([
        ("encoder_nodes_grid_nodes", dict(in_dim=F, cfg=cfg)),
        ("encoder_nodes_mesh_nodes", dict(in_dim=F, cfg=cfg)),
        ("encoder_edges_grid2mesh", dict(in_dim=e, cfg=cfg)),
        ("processor_edges_0_grid2mesh", dict(in_dim=3 * L, cfg=cfg)),
        ("processor_nodes_0_mesh_nodes", dict(in_dim=2 * L, cfg=cfg)),
        ("processor_nodes_0_grid_nodes", dict(in_dim=L, cfg=cfg)),
    ])
    proc = GNNParams(name="mesh_gnn")([
        ("encoder_edges_mesh", dict(in_dim=e, cfg=cfg)),
        ("processor_edges_mesh", dict(in_dim=3 * L, cfg=cfg, stack=S)),
        ("processor_nodes_mesh_nodes", dict(in_dim=2 * L, cfg=cfg, stack=S)),
    ])
    dec = GNNParams(name="mesh2grid_gnn")([
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
    mesh = mesh_rows(jnp.broadcast_to(mesh[:, None], (nm, batch, mesh.shape[-1])))  # [Nm,B,L]
    edge_p = P["processor_edges_0_grid2mesh"]
    gam = mem.gather_after_matmul
    mesh_side = full_rows(node_side(edge_p, mesh, "receiver", gam))  # [Nm, B, L]
    if mem.stream_grid_nodes:
        grid = None
    else:
        grid = split_rows(grid_latents(P, graph.grid_nodes, inputs))  # [Ng, B, L]
    if mem.edge_block_size is None:
        edges = embed_edges(P["encoder_edges_grid2mesh"], graph.g2m_edges, batch, dtype)
        grid_side = node_side(edge_p, grid, "sender", gam)  # [Ng, B, L]
        messages = split_rows(edge_messages(
            edge_p, edges, grid_side[graph.g2m_senders], mesh_side[graph.g2m_receivers],
            (gam, gam)))  # [E, B, L]
        # The encoder always sums in float32 (many grid nodes per mesh node near the poles).
        incoming = aggregate(messages, graph.g2m_receivers, nm, True)  # [Nm, B, L]
    else:
        grid_side = None if grid is None else node_side(edge_p, grid, "sender", gam)
        incoming = _blocked_encoder_sum(P, graph, inputs, grid_side, mesh_side, mem)
    mesh = mesh_rows(mesh + mlp_concat(P["processor_nodes_0_mesh_nodes"], [mesh, incoming]))
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
    shards = spatial_shards()  # devices splitting the edges: blocks of their own edges
    bs = shard_block(balanced_block(n_edges, mem.edge_block_size), shards)
    edge_p = P["processor_edges_0_grid2mesh"]
    gam = mem.gather_after_matmul
    valid = split_blocks(jnp.ones((n_edges,), dtype), bs, shards=shards)  # [nb, bs]
    senders = split_blocks(graph.g2m_senders, bs, shards=shards)  # [nb, bs]
    receivers = split_blocks(graph.g2m_receivers, bs, shards=shards)  # [nb, bs]
    features = split_blocks(graph.g2m_edges, bs, shards=shards)  # [nb, bs, 4]
    valid, senders, receivers, features = (split_rows(a, axis=1, batch_axis=None)
                                           for a in (valid, senders, receivers, features))

    def block_messages(operands, senders, receivers, features):
        grid_side, mesh_side, inputs = operands
        edges = embed_edges(P["encoder_edges_grid2mesh"], features, batch, dtype)
        if grid_side is None:  # embed the senders here: [bs, B, L]
            sender_rows = grid_latents(P, graph.grid_nodes[senders], inputs[senders])
            sender_projected = False
        else:
            sender_rows, sender_projected = grid_side[senders], gam
        return split_rows(edge_messages(edge_p, edges, sender_rows, mesh_side[receivers],
                                        (sender_projected, gam)))  # [bs, B, L]

    total = blocked_sum(block_messages, (grid_side, mesh_side, inputs), senders, receivers,
                        (features,), valid, nm, (batch, latent), shards, split_shards)
    return total.astype(dtype)  # [Nm, B, L]


def _block_messages(gam: bool, operands, edges, senders, receivers) -> Array:
    """Messages of one block of processor edges: [bs, B, L]."""
    p, sides = operands
    return split_rows(edge_messages(p, edges, sides[0][senders], sides[1][receivers],
                                    (gam, gam)))  # [bs, B, L]


def processor_edges(P: dict, graph: GraphInputs, batch: int, dtype, mem: MemoryConfig) -> Array:
    """Embedded multimesh edges, the processor's edge latents before its first step.

    Returns `[E, B, L]`, or `[nb, bs, B, L]` blocks with `processor_edge_blocks`.
    """
    if not mem.processor_edge_blocks:
        return split_rows(embed_edges(P["encoder_edges_mesh"], graph.mesh_edges, batch,
                                      dtype))  # [E, B, L]
    shards = spatial_shards()
    bs = shard_block(balanced_block(graph.mesh_senders.shape[0], mem.edge_block_size), shards)
    # Embedded block by block, so that the embedding's backward is blockwise too.
    embed = jax.checkpoint(
        lambda f: embed_edges(P["encoder_edges_mesh"], f, batch, dtype))  # [bs, B, L]
    _, edges = jax.lax.scan(lambda c, f: (c, embed(f)), None,
                            split_blocks(graph.mesh_edges, bs, shards=shards))
    return split_rows(edges, axis=1, batch_axis=2)  # [nb, bs, B, L]


def processor_steps(P: dict, graph: GraphInputs, mesh: Array, edges: Array,
                    mem: MemoryConfig) -> tuple:
    """The processor steps stacked in `P`, from mesh-node and edge latents.

    Args:
      P: the processor's parameters, steps stacked on a leading axis: all S, or a pipeline
        stage's slice of them (`pipeline_stages`).
      graph: the graphs.
      mesh: [Nm, B, L] mesh-node latents.
      edges: edge latents from `processor_edges` (or from the steps before these).
      mem: memory techniques (its processor remat applies to these steps).

    Returns:
      `(mesh, edges)` after the last of these steps.
    """
    nm = mesh.shape[0]
    dtype = mesh.dtype
    senders, receivers = graph.mesh_senders, graph.mesh_receivers
    stacked = {"edges": P["processor_edges_mesh"], "nodes": P["processor_nodes_mesh_nodes"]}
    f32_sum = mem.float32_aggregation
    blocked = mem.processor_edge_blocks
    if blocked:
        shards = spatial_shards()
        bs = shard_block(balanced_block(senders.shape[0], mem.edge_block_size), shards)
        valid = split_blocks(jnp.ones(senders.shape, dtype), bs, shards=shards)  # [nb, bs]
        senders = split_blocks(senders, bs, shards=shards)  # [nb, bs]
        receivers = split_blocks(receivers, bs, shards=shards)  # [nb, bs]
        valid, senders, receivers = (split_rows(a, axis=1, batch_axis=None)
                                     for a in (valid, senders, receivers))

    def step(carry, p):
        mesh, edges = carry
        gam = mem.gather_after_matmul
        # Gathered whole once per step (split mesh nodes: one all-gather each), so that
        # the edge gathers, block by block, read local rows.
        sides = (full_rows(node_side(p["edges"], mesh, "sender", gam)),
                 full_rows(node_side(p["edges"], mesh, "receiver", gam)))  # [Nm, B, L] each
        if not blocked:
            messages = split_rows(edge_messages(p["edges"], edges, sides[0][senders],
                                                sides[1][receivers], (gam, gam)))  # [E, B, L]
            incoming = aggregate(messages, receivers, nm, f32_sum)  # [Nm, B, L]
            edges = edges + messages
        else:
            edges, incoming = blocked_edge_update(
                functools.partial(_block_messages, gam), (p["edges"], sides), edges, senders,
                receivers, valid, nm, f32_sum, shards, split_shards)
        incoming = checkpoint_name(mesh_rows(incoming), AGGREGATED_MESSAGES)
        mesh = mesh_rows(mesh + mlp_concat(p["nodes"], [mesh, incoming]))  # [Nm, B, L]
        mesh = checkpoint_name(mesh, NODE_LATENTS)
        return (mesh, edges), None

    (mesh, edges), _ = scan_steps(step, (mesh, edges), stacked, mem)
    return mesh, edges


def processor(P: dict, graph: GraphInputs, mesh: Array, mem: MemoryConfig) -> Array:
    """Mesh GNN: embeds multimesh edges, then S unshared interaction steps (a scan)."""
    edges = processor_edges(P, graph, mesh.shape[1], mesh.dtype, mem)
    return processor_steps(P, graph, mesh, edges, mem)[0]


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
        edges = embed_edges(P["encoder_edges_mesh2grid"], graph.m2g_edges, batch, grid.dtype)
        messages = split_rows(edge_messages(
            edge_p, edges, node_side(edge_p, mesh, "sender", gam)[graph.m2g_senders],
            node_side(edge_p, grid, "receiver", gam)[graph.m2g_receivers],
            (gam, gam)))  # [3Ng, B, L]
        incoming = aggregate(messages, graph.m2g_receivers, ng, f32_sum)  # [Ng, B, L]
        grid = split_rows(grid + mlp_concat(P["processor_nodes_0_grid_nodes"], [grid, incoming]))
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
    shards = spatial_shards()  # devices splitting the grid: blocks of their own nodes
    bn = shard_block(balanced_block(ng, max(1, mem.edge_block_size // 3)), shards)
    f32_sum = mem.float32_aggregation
    gam = mem.gather_after_matmul
    edge_p = P["processor_edges_0_mesh2grid"]
    # Gathered whole once, so that no block gathers across devices.
    mesh_side = full_rows(node_side(edge_p, mesh, "sender", gam))  # [Nm, B, L]
    split = functools.partial(split_blocks, shards=shards)
    if shards == 1:
        # Each block gathers its node rows. Scanned over as blocks, the node arrays would
        # be copied whole, padded, into the loop (1.8 GiB of float32 inputs at 0.25 deg).
        # Across devices the shard-major blocks below keep every block's rows on their
        # own device instead.
        node_xs = (split(jnp.arange(ng, dtype=jnp.int32), bn),)  # [nb, bn]
        whole = (inputs, graph.grid_nodes) if streamed else (grid,)
    else:
        node_xs = ((split(inputs, bn), split(graph.grid_nodes, bn)) if streamed
                   else (split(grid, bn),))
        whole = None
    xs = node_xs + (split(graph.m2g_senders, 3 * bn), split(graph.m2g_edges, 3 * bn))
    xs = tuple(split_rows(x, axis=1, batch_axis=2 if x.ndim == 4 else None)
               for x in xs)  # [nb, bn, B, C] node blocks, [nb, 3 bn, ...] edge blocks
    local_receivers = jnp.repeat(jnp.arange(bn, dtype=jnp.int32), 3)  # [3 bn]

    @jax.checkpoint
    def block(mesh_side, whole, *x):
        if whole is not None:  # node rows gathered: [bn, ...] each
            rows, senders, features = x
            x = tuple(a[rows] for a in whole) + (senders, features)
        if streamed:
            block_inputs, block_features, senders, features = x
            grid = grid_latents(P_enc, block_features, block_inputs)  # [bn, B, L]
            grid = grid + mlp(P_enc["processor_nodes_0_grid_nodes"], grid)
        else:
            grid, senders, features = x
        grid = split_rows(grid)  # [bn, B, L]
        edges = embed_edges(P["encoder_edges_mesh2grid"], features, batch, dtype)
        receiver_rows = node_side(edge_p, grid, "receiver", gam)[local_receivers]
        messages = split_rows(edge_messages(edge_p, edges, mesh_side[senders], receiver_rows,
                                            (gam, gam)))  # [3 bn, B, L]
        incoming = aggregate(messages, local_receivers, bn, f32_sum)  # [bn, B, L]
        grid = grid + mlp_concat(P["processor_nodes_0_grid_nodes"], [grid, incoming])
        return mlp(P["decoder_nodes_grid_nodes"], grid)  # [bn, B, O]

    _, out = jax.lax.scan(lambda c, x: (c, block(mesh_side, whole, *x)), None, xs)
    return merge_blocks(out, ng, shards)  # [Ng, B, O]


def stage_runners(mem: MemoryConfig) -> tuple:
    """`(run_encoder, run_decoder)`: the encoder and decoder under `mem`'s whole-stage
    checkpoints (`checkpoint_encoder`, `checkpoint_decoder`), in named scopes."""

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
    return run_encoder, run_decoder


def graphcast_forward(P: dict, graph: GraphInputs, inputs: Array, mem: MemoryConfig) -> Array:
    """The whole network on grouped parameters `P` (see `_all_params`). [Ng,B,C] -> [Ng,B,O]."""
    dtype = compute_dtype(mem.precision)
    # Streamed grid nodes gather their inputs block by block and cast each block: a
    # bfloat16 copy of all inputs would be sliced through float32 copies on XLA:CPU (see
    # `residuals_as_bits`), a copy twice its size.
    inputs = split_rows(inputs if mem.stream_grid_nodes else inputs.astype(dtype))  # [Ng,B,C]
    run_encoder, run_decoder = stage_runners(mem)
    layout = active_pipeline()
    if layout is not None:
        return pipelined_forward(P, graph, inputs, mem, layout, run_encoder,
                                 run_decoder).astype(jnp.float32)
    P = cast_tree(P, dtype)  # parameters stay float32; gradients come back float32
    grid, mesh = run_encoder(P["encoder"], graph, inputs)
    with jax.named_scope("processor"):
        mesh = processor(P["processor"], graph, mesh, mem)
    if mem.stream_grid_nodes:
        out = run_decoder(P["decoder"], graph, None, mesh, P["encoder"], inputs)
    else:
        out = run_decoder(P["decoder"], graph, grid, mesh, None, None)
    return out.astype(jnp.float32)


def stage_memory(mem: MemoryConfig, steps: int, checkpointed: Optional[int]) -> MemoryConfig:
    """The memory techniques of a pipeline stage of `steps` processor steps.

    Args:
      mem: the step's memory techniques.
      steps: the stage's processor steps.
      checkpointed: how many of them (the first ones) run under their own checkpoint;
        None keeps `mem`'s processor remat.
    """
    if checkpointed is None:
        return mem
    if checkpointed == 0:
        return mem.replace(processor_remat="none")
    stage = mem.replace(processor_remat="ratio", remat_ratio=checkpointed / steps)
    assert stage.checkpointed_steps(steps) == checkpointed
    return stage


def pipeline_stages(steps: int, mem: MemoryConfig, layout: ParallelConfig, run_encoder: Callable,
                    run_decoder: Callable, shared: bool = True) -> list:
    """The stage functions `stage((P, graph), state, x) -> (state, out)` of a pipeline
    (`gclab.parallel.pipeline.gpipe`), for a processor of `steps` steps.

    Stage s runs the processor steps `layout.stage_bounds(S)[s]` with its own remat
    (`stage_memory`); the first stage embeds the micro-batch first (encoder and multimesh
    edges), the last decodes after its steps. The state passed between stages is
    `(skip, mesh, edges)`: what the decoder needs from the encoder (grid latents
    `[Ng, b, L]`, or with streamed grid nodes the inputs `[Ng, b, C]`), mesh-node
    latents `[Nm, b, L]` and edge latents.

    With `shared`, the stages between the first and the last that run as many steps with
    the same remat are one function, at each of their places in the list: it reads its
    steps' parameters at the offset of the stage it runs as
    (`jax.lax.axis_index(PIPELINE_AXIS)`, so only inside `gpipe`), and `gpipe` traces,
    differentiates and compiles it once: P stages of even steps cost three programs, not P,
    and the compiled memory is the same (`benchmarks/pipeline_compile.py` measures both
    ways). Without `shared`, every stage reads fixed steps and can run alone
    (`make_stage_network`).

    Raises:
      StageRematConflict: `mem` has a processor remat other than `none` and `layout` its
        own per-stage remat (`ParallelConfig.check_memory`): the stages would ignore it.
    """
    # Every pipelined network comes here (a training step, `gclab memory`'s compile, a
    # stage sized alone), so none of them runs with a processor remat it would not apply.
    layout.check_memory(mem)
    bounds = layout.stage_bounds(steps)
    last = len(bounds) - 1
    remat = [None if layout.stage_remat is None else layout.stage_remat[s]
             for s in range(len(bounds))]
    # Stages of one key are one function: a middle stage's key is its (steps, checkpointed
    # steps) when `shared`, any other stage's its own index.
    groups: dict = {}
    for s, (first, end) in enumerate(bounds):
        key = (end - first, remat[s]) if shared and 0 < s < last else s
        groups.setdefault(key, []).append(s)

    def make(members: list):
        s = members[0]
        first, end = bounds[s]
        smem = stage_memory(mem, end - first, remat[s])
        name = f"pipeline_stage_{'_'.join(map(str, members))}"
        if len(members) == 1:
            def take(a):  # this stage's steps of a stacked parameter, [n, ...]
                return a[first:end]
        else:
            offsets = np.zeros(len(bounds), np.int32)  # [P] first step of each member stage
            offsets[members] = [bounds[m][0] for m in members]

            def take(a):  # the running stage's steps of a stacked parameter, [n, ...]
                start = jnp.asarray(offsets)[jax.lax.axis_index(PIPELINE_AXIS)]
                return jax.lax.dynamic_slice_in_dim(a, start, end - first)

        def stage(operands, state, x):  # x: [Ng, b, C], state: (skip, mesh, edges)
            # The graph comes in as an argument: inside `shard_map` every array must.
            P, graph = operands
            proc = dict(P["processor"])
            for key in ("processor_edges_mesh", "processor_nodes_mesh_nodes"):
                proc[key] = jax.tree_util.tree_map(take, proc[key])
            if s == 0:
                grid, mesh = run_encoder(P["encoder"], graph, x)
                skip = x if mem.stream_grid_nodes else grid
                edges = processor_edges(proc, graph, mesh.shape[1], mesh.dtype, mem)
            else:
                skip, mesh, edges = state
            with jax.named_scope(name):
                mesh, edges = processor_steps(proc, graph, mesh, edges, smem)
            state = (skip, mesh, edges)
            if s != last:
                return state, None
            if mem.stream_grid_nodes:
                return state, run_decoder(P["decoder"], graph, None, mesh, P["encoder"], skip)
            return state, run_decoder(P["decoder"], graph, skip, mesh, None, None)

        return stage

    stages: list = [None] * len(bounds)
    for members in groups.values():
        fn = make(members)
        for s in members:
            stages[s] = fn
    return stages


def pipelined_forward(P: dict, graph: GraphInputs, inputs: Array, mem: MemoryConfig,
                      layout: ParallelConfig, run_encoder: Callable,
                      run_decoder: Callable) -> Array:
    """The network as a GPipe pipeline over the `pipeline` axis (`layout.pipeline` stages).

    The batch is split into `layout.microbatches` micro-batches by taking every M-th
    sample (sample j M + m is in micro-batch m), so that with the batch split over `data`
    every micro-batch stays spread over the data slices. [Ng, B, C] -> [Ng, B, O].

    `P` is float32: each stage casts it to `mem.precision` itself, so that the sum of the
    parameters' gradients over the stages (the transpose of their entry into every stage)
    is a float32 all-reduce, as in a float32 step. (A bfloat16 one there also fails to
    compile on XLA:CPU, jax 0.10.2: its promotion of bfloat16 all-reduces to float32
    rejects the reducer JAX builds inside `shard_map`.)
    """
    ng, batch, channels = inputs.shape
    M = layout.microbatches
    if batch % M:
        raise ValueError(f"batch {batch} is not divisible by the pipeline's microbatches:{M}")
    b = batch // M
    xs = jnp.moveaxis(inputs.reshape(ng, b, M, channels), 2, 0)  # [M, Ng, b, C]
    steps = P["processor"]["processor_edges_mesh"]["layers"][0][0].shape[0]
    stages = pipeline_stages(steps, mem, layout, run_encoder, run_decoder)
    dtype = compute_dtype(mem.precision)
    operands = (P, graph)
    cast = (cast_tree(P, dtype), graph)
    state_shape, _ = jax.eval_shape(stages[0], cast, None, xs[0])
    _, out_shape = jax.eval_shape(stages[-1], cast, state_shape, xs[0])  # [Ng, b, O]

    def with_output(stage):  # casts the parameters; returns the last stage's output type
        def run(operands, state, x):
            params, graph = operands
            state, out = stage((cast_tree(params, dtype), graph), state, x)
            return state, jnp.zeros(out_shape.shape, out_shape.dtype) if out is None else out
        return run

    zeros = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), state_shape)
    wrapped: dict = {}  # one wrapper per distinct stage function: `gpipe` compiles each once
    runs = [wrapped.setdefault(f, with_output(f)) for f in stages]
    outs = gpipe(runs, operands, xs, zeros, M)  # [M, Ng, b, O]
    return jnp.moveaxis(outs, 0, 2).reshape(ng, batch, -1)  # [Ng, B, O]


class Network(hk.Transformed):
    """`make_network`'s transform: an `hk.Transformed` that also carries, as `memory`, the
    `MemoryConfig` its `apply` computes under (the training step checks that its own
    memory techniques are these, `gclab.training.step.check_memory`)."""

    memory: MemoryConfig


def make_network(model: ModelConfig, data_channels: int, output_channels: int,
                 memory: Optional[MemoryConfig] = None) -> Network:
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
      `inputs` [Ng, B, C] -> outputs [Ng, B, O] float32; `net.memory` is the
      `MemoryConfig` it was built with (`MemoryConfig()` for None).

    Raises:
      ValueError: a channel count below 1; `WrongType` (a TypeError too) for a channel
        count that is no integer, or `model` or `memory` of the wrong kind.
    """
    data_channels = require_count("data_channels", data_channels, 1)
    output_channels = require_count("output_channels", output_channels, 1)
    # Checked here: the transform reads them only in `init` or `apply`, where a wrong kind
    # is an attribute error of some inner line.
    require_kind("model", model, ModelConfig)
    require_kind("memory", memory, MemoryConfig, optional=True)
    mem = memory or MemoryConfig()

    def forward(graph: GraphInputs, inputs: Array) -> Array:
        require_kind("graph", graph, GraphInputs, "a GraphInputs (`gclab.model.graph_inputs`)")
        if inputs.ndim != 3 or inputs.shape[-1] != data_channels:
            raise ValueError(f"inputs must have shape [Ng, B, {data_channels}], "
                             f"got {tuple(inputs.shape)}")
        if inputs.shape[0] != graph.grid_nodes.shape[0]:
            raise ValueError(f"inputs have {inputs.shape[0]} grid nodes, the graph has "
                             f"{graph.grid_nodes.shape[0]}")
        P = _all_params(model, data_channels, output_channels)
        if hk.running_init():
            # Every parameter is made above, and `init` returns only parameters: running the
            # network here would be thrown away (op by op when `init` is not jitted, 10 s
            # for cpu-4x32 on 2 cores, against under 1 s for the parameters alone).
            return jnp.zeros((inputs.shape[0], inputs.shape[1], output_channels), jnp.float32)
        with recomputed_layer_norms(mem.recompute_layer_norm):
            return graphcast_forward(P, graph, inputs, mem)

    net = Network(*hk.without_apply_rng(hk.transform(forward)))
    net.memory = mem
    return net


def make_stage_network(model: ModelConfig, data_channels: int, output_channels: int,
                       memory: MemoryConfig, layout: ParallelConfig,
                       stage: int) -> hk.Transformed:
    """One pipeline stage of the network alone, as a Haiku transform (for sizing a stage).

    Args:
      model, data_channels, output_channels, memory: as in `make_network`.
      layout: a `gclab.parallel.ParallelConfig` with `pipeline` > 1 (its stage steps and
        per-stage remat).
      stage: which stage.

    Returns:
      `net` with `net.apply(params, graph, state, inputs) -> (state, out)` on the whole
      network's parameters (`make_network`'s): the first stage reads `inputs` [Ng, b, C],
      the others `state`, as `pipeline_stages` describes; `out` [Ng, b, O] is None except
      on the last stage.
    """
    mem = memory

    def forward(graph: GraphInputs, state, inputs: Array):
        P = cast_tree(_all_params(model, data_channels, output_channels),
                      compute_dtype(mem.precision))
        if inputs is not None and not mem.stream_grid_nodes:
            inputs = inputs.astype(compute_dtype(mem.precision))
        stages = pipeline_stages(model.processor_steps, mem, layout, *stage_runners(mem),
                                 shared=False)
        with recomputed_layer_norms(mem.recompute_layer_norm):
            return stages[stage]((P, graph), state, inputs)

    return hk.without_apply_rng(hk.transform(forward))


def count_params(params) -> int:
    """Number of scalars in a parameter tree.

    Raises:
      TypeError: a leaf of `params` is not an array (`params` itself, where it is no tree).
    """
    leaves = jax.tree_util.tree_leaves(params)
    for leaf in leaves:
        if not hasattr(leaf, "shape"):
            raise WrongType(f"params is invalid: a tree of arrays (it has a leaf of type "
                            f"{type(leaf).__name__})")
    return int(sum(np.prod(a.shape) for a in leaves))


def param_shapes(model: ModelConfig, data_channels: int, output_channels: int):
    """Parameter shapes (`jax.ShapeDtypeStruct`) without allocating anything.

    Nothing runs, not even the random key's creation (it is traced): JAX's backend does not
    start, so a process may still choose its device count or join a multi-process run
    afterwards (the command line checks a checkpoint before either). Traced once per model
    and channel counts in a process (every compiled step asks for them): each call builds
    its own tree, of shapes and dtypes only (no sharding of the context of a first call).
    """
    if not (isinstance(model, ModelConfig) and is_int(data_channels)
            and is_int(output_channels)):
        return _trace_param_shapes(model, data_channels, output_channels)  # its own errors
    shapes = _traced_param_shapes(model, int(data_channels), int(output_channels))
    return jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(*s), shapes,
                                  is_leaf=lambda s: isinstance(s, tuple))


@functools.lru_cache(maxsize=64)
def _traced_param_shapes(model: ModelConfig, data_channels: int, output_channels: int):
    """(shape, dtype) of every parameter: what `param_shapes` builds its trees from."""
    return jax.tree_util.tree_map(lambda s: (s.shape, s.dtype),
                                  _trace_param_shapes(model, data_channels, output_channels))


def _trace_param_shapes(model: ModelConfig, data_channels: int, output_channels: int):
    net = make_network(model, data_channels, output_channels)
    ng, nm = 2, 2  # parameter shapes do not depend on the graph
    graph = graph_input_shapes(ng, nm, 1, 1)
    inputs = jax.ShapeDtypeStruct((ng, 1, data_channels), jnp.float32)
    return jax.eval_shape(lambda: net.init(jax.random.PRNGKey(0), graph, inputs))


class ParamMismatch(NamedTuple):
    """One way a parameter tree differs from the tree a model expects.

    Attributes:
      module: the module path.
      name: the parameter name; None where the whole module is missing or unknown.
      shape: the given leaf's shape; None where it is missing (or has no shape) and for a
        whole module.
      expected: the model's shape; None where the model has no such parameter, and for a
        whole module.
      unknown: the model has no such parameter or module (the given tree has one more);
        otherwise the given tree lacks it or has it in another shape.
    """

    module: str
    name: Optional[str]
    shape: Optional[tuple]
    expected: Optional[tuple]
    unknown: bool


def param_mismatches(params: Mapping, expected: Mapping) -> list[ParamMismatch]:
    """Every difference between two `{module: {name: array}}` trees, none if they match.

    Shapes are compared, not values or dtypes, so `expected` may be `param_shapes`' tree
    (or any tree whose leaves have a `shape`). A module that is not a mapping counts as
    one without parameters; a leaf without a `shape` counts as missing.

    Args:
      params: the tree to check.
      expected: the model's tree.

    Returns:
      First every parameter (or module) of `params` that `expected` lacks, in `params`'
      order; then every one of `expected` that `params` lacks or has in another shape, in
      `expected`'s order. A module missing on one side is one entry (`name` None).

    Raises:
      TypeError: `params` or `expected` is not a `{module: {name: array}}` mapping.
    """
    for name, tree in (("params", params), ("expected", expected)):
        require_kind(name, tree, Mapping, "a {module: {name: array}} mapping", "param_mismatches")

    def leaves(tree: Mapping, module: str) -> Mapping:
        value = tree[module]
        return value if isinstance(value, Mapping) else {}

    def shape(leaf) -> Optional[tuple]:
        s = getattr(leaf, "shape", None)
        return None if s is None else tuple(s)

    unknown, differing = [], []
    for module in params:
        if module not in expected:
            unknown.append(ParamMismatch(module, None, None, None, True))
            continue
        want = leaves(expected, module)
        unknown += [ParamMismatch(module, name, shape(leaf), None, True)
                    for name, leaf in leaves(params, module).items() if name not in want]
    for module in expected:
        if module not in params:
            differing.append(ParamMismatch(module, None, None, None, False))
            continue
        given = leaves(params, module)
        for name, leaf in leaves(expected, module).items():
            got, want = shape(given.get(name)), shape(leaf)
            if got != want:
                differing.append(ParamMismatch(module, name, got, want, False))
    return unknown + differing
