"""A formula for the memory of one GraphCast training step, from node and edge counts.

Shapes (letters used in the derivations and comments below):
  B  batch, T rollout steps, S processor steps, L latent width, H hidden layers
  Ng grid nodes, Nm mesh nodes
  Eg grid2mesh edges, Em multimesh edges, Ed mesh2grid edges (= 3 Ng)
  C  data channels of a grid node, F = C + 3 embedder input, O outputs
  u  bytes of one activation element (4 in float32, 2 in bfloat16)

What a training step holds (`MemoryEstimate`):

* **Parameters** `4 P` bytes (float32 always), `P` counted exactly as in
  GRAPHCAST.md "Parameter tree and counts" (`param_count`).
* **Gradients** `4 P` (float32: parameters are cast when read, so gradients come back
  float32 even under bfloat16).
* **AdamW state** `8 P`: first and second moments, float32, one of each per parameter.
* **Activations saved for the backward pass**, per stage, in units of `u B L` elements
  (one `[N, B, L]` array has `N B L` elements). Each coefficient is an inventory of the
  arrays the forward pass leaves for the backward pass (derivations in the constants
  below), with the small remainder calibrated against XLA:CPU's compiled temp bytes of
  loss + gradient (`jax.jit(jax.grad(loss)).lower(...).compile().memory_analysis()`)
  over 4 / 5 / 6 / 3 deg grids with 2 / 3 splits, L 32..128, S 2..6, B 1..2:

  - encoder: `EDGE_MLP_ARRAYS Eg + GRID_NODE_ARRAYS_ENCODER Ng + MESH_NODE_ARRAYS Nm`,
    plus the grid-node input `[Ng, B, F]` arrays (`INPUT_ARRAYS u B Ng C`);
  - each processor step: `EDGE_MLP_ARRAYS Em + NODE_MLP_ARRAYS Nm` (no remat), or only
    its boundary `Em + Nm` (the carried edge and node latents) under a checkpoint;
  - decoder: `EDGE_MLP_ARRAYS Ed + GRID_NODE_ARRAYS_DECODER Ng`;
  - edge embeddings (batch-independent, `u L` per edge): `EMBED_ARRAYS (Eg + Em + Ed)`.

* **temp**: XLA's temp of loss + gradient is the sum of the saved activations plus the
  backward working set beyond one processor step (a group of k steps under `every:k`
  is recomputed whole; see `_processor`). A full training step also holds the
  gradients as temporaries (`temp_bytes = loss_grad_temp_bytes + grads_bytes`).

Modelled tightly (calibrated; within 25 % of XLA:CPU on the test grid): `none` and
per-step remat (`step`), batch, steps, latent. Modelled more loosely (from the array
inventory, checked on a few configs only): `every:k`, `nested:k`, `ratio:r`, remat
policies other than `nothing`, edge blocks, processor edge blocks, gather after
matmul, whole-stage checkpoints, streamed grid nodes, bfloat16 (the formula halves every
activation; compiled steps keep some float32 buffers, e.g. LayerNorm statistics in the
backward pass and the loss, so they save less), rollout (`rollout_remat` keeps one
step's activations plus T boundaries; without it T steps' activations), microbatches.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from gclab.config import (
    MAX_INT32,
    STRUCTURAL_EDGE_FEATURES,
    ModelConfig,
    TaskConfig,
    WrongType,
    a_kind,
    is_int,
    require_kind,
)
from gclab.geometry.graphs import graphs_for
from gclab.measure.compiled import compiled_memory
from gclab.memory.blocks import balanced_block
from gclab.memory.config import MemoryConfig
from gclab.model.graphcast import graph_inputs, make_network, param_shapes

# ---------------------------------------------------------------------------------------
# Array inventory (elements per edge or node, in units of B L unless said otherwise).

#: One edge MLP on `[e, v_s, v_r]`: the `[E, B, 3L]` concatenation (3), the gathered
#: sender and receiver rows XLA:CPU keeps apart from it (2), the first layer's
#: pre-activation `h` (1) and `swish(h)` (1), the second layer's output before the
#: LayerNorm (1), the message after it (1) and the updated edge latent `e + e'` (1).
EDGE_MLP_ARRAYS = 10.0
#: One node MLP on `[v, sum e']`: the `[N, B, 2L]` concatenation (2), the incoming sum
#: (1), `h`, `swish(h)`, pre-norm output, message (4), the residual `v + v'` (1) and the
#: segment-sum gradient (a gather back to edges, 1 per node on average) (1).
NODE_MLP_ARRAYS = 10.0
#: What a checkpointed processor step keeps: its carry, edge latents `[Em, B, L]`
#: (1 per edge) and node latents `[Nm, B, L]` (1 per node).
STEP_BOUNDARY_ARRAYS = 1.0
#: Grid nodes in the encoder: grid embedder `h`, `swish(h)`, output, LayerNorm (4) and
#: the grid-node update MLP with its residual (5).
GRID_NODE_ARRAYS_ENCODER = 9.0
#: Grid nodes in the decoder: the node update on `[Ng, B, 2L]` (2 + sum + 4 + residual
#: = 8), the output MLP's `h`, `swish(h)` (2), and the gradient of the `[Ed, B, 3L]`
#: concatenation alive at the start of the backward pass (3 per edge, 3 edges per node:
#: 9). Calibrated total 28 - 9 = 19.
GRID_NODE_ARRAYS_DECODER = 19.0
#: Mesh nodes outside the processor: the encoder's mesh-node update (8), the broadcast
#: mesh embedding (1), the processor's input/output latents (2) and the decoder's
#: (unused) mesh-node update (2). Calibrated: 12.9.
MESH_NODE_ARRAYS = 13.0
#: Edge embedding MLPs `[E, 4] -> [E, L]` run once, without batch (in units of `u L` per
#: edge): `h`, `swish(h)`, output, LayerNorm output (4), the broadcast to `[E, B, L]`
#: and the batch-summed gradient (about 2.75). Calibrated: 6.76.
EMBED_ARRAYS = 6.75
#: Grid-node inputs, in units of `u B Ng C`: the float copy of `[Ng, B, C]`, the
#: `[Ng, B, C + 3]` concatenation and its gradient. Calibrated: 3.21.
INPUT_ARRAYS = 3.2
#: Extra arrays a checkpoint keeps per step under a non-`nothing` policy (per edge,
#: per node): `dots` keeps the matmul outputs (2 per MLP), `aggregated` the incoming
#: sums, `node-latents` the node latents.
POLICY_EXTRA = {"nothing": (0.0, 0.0), "dots": (2.0, 2.0), "aggregated": (0.0, 1.0),
                "node-latents": (0.0, 1.0)}

STAGES = ("inputs", "encoder", "processor", "decoder", "embeddings", "workspace")


@dataclasses.dataclass(frozen=True)
class GraphCounts:
    """Node and edge counts of one geometry.

    Attributes:
      grid_nodes: Ng.
      mesh_nodes: Nm.
      grid2mesh_edges: Eg (from the real graphs: it depends on the query radius).
      mesh_edges: Em = 20 (4^(splits+1) - 1).
      mesh2grid_edges: Ed = 3 Ng.
    """
    grid_nodes: int
    mesh_nodes: int
    grid2mesh_edges: int
    mesh_edges: int
    mesh2grid_edges: int

    @classmethod
    def for_model(cls, model: ModelConfig, grid2mesh_edges: Optional[int] = None
                  ) -> "GraphCounts":
        """Counts for a model; Eg from the (disk-cached) graphs unless given."""
        if grid2mesh_edges is None:

            grid2mesh_edges = graphs_for(model).grid2mesh.num_edges
        return cls(model.num_grid_nodes, model.num_mesh_nodes, int(grid2mesh_edges),
                   model.num_mesh_edges, model.num_mesh2grid_edges)


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """The modelled memory of one training step (bytes).

    Attributes:
      num_params: P.
      params_bytes: 4 P.
      grads_bytes: 4 P.
      optimizer_bytes: 8 P (AdamW moments).
      activation_bytes: saved activations by stage (`STAGES`), plus the backward
        working set beyond one processor step (`workspace`).
      loss_grad_temp_bytes: modelled XLA temp of loss + gradient.
      temp_bytes: modelled XLA temp of a training step (adds the gradients).
      argument_bytes: parameters, optimizer state and one example's arrays.
      total_bytes: arguments + outputs (new parameters and optimizer state, unless
        donated) + temp.
      recompute_fraction: extra forward FLOPs of the remat choices over one forward.
    """
    num_params: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activation_bytes: dict
    loss_grad_temp_bytes: int
    temp_bytes: int
    argument_bytes: int
    total_bytes: int
    recompute_fraction: float

    def to_dict(self) -> dict[str, Any]:
        """Fields as a flat JSON-able dict (`activation.<stage>` for the stages)."""
        d = dataclasses.asdict(self)
        acts = d.pop("activation_bytes")
        d.update({f"activation.{k}": v for k, v in acts.items()})
        return d


# ---------------------------------------------------------------------------------------
# Parameters.


def _mlp_params(in_dim: int, latent: int, hidden: int, out_dim: int, norm: bool) -> int:
    """`hidden` layers of width `latent` then `out_dim`; weights, biases, LayerNorm."""
    sizes = [in_dim] + [latent] * hidden + [out_dim]
    n = sum(i * o + o for i, o in zip(sizes[:-1], sizes[1:]))
    return n + (2 * out_dim if norm else 0)


def param_count(model: ModelConfig, task: TaskConfig) -> int:
    """Exact parameter count (GRAPHCAST.md, "Parameter tree and counts").

    Encoder: grid and mesh node embedders (F -> L), grid2mesh edge embedder (4 -> L),
    edge MLP (3L -> L), mesh-node MLP (2L -> L), grid-node MLP (L -> L). Processor:
    mesh edge embedder (4 -> L) and S x (edge MLP 3L -> L, node MLP 2L -> L). Decoder:
    mesh2grid edge embedder, edge MLP (3L), grid-node MLP (2L), the unused mesh-node MLP
    (L) and the output MLP (L -> O, no LayerNorm). Every MLP has H hidden layers of L.

    Raises:
      TypeError: `model` is not a `ModelConfig` or `task` not a `TaskConfig`.
    """
    for name, value, kind in (("model", model, ModelConfig), ("task", task, TaskConfig)):
        require_kind(name, value, kind, caller="param_count")
    L, H, S = model.latent_size, model.hidden_layers, model.processor_steps
    F, O, e = task.input_channels, task.output_channels, STRUCTURAL_EDGE_FEATURES

    def m(i, out=L, norm=True):
        return _mlp_params(i, L, H, out, norm)

    encoder = 2 * m(F) + m(e) + m(3 * L) + m(2 * L) + m(L)
    processor = m(e) + S * (m(3 * L) + m(2 * L))
    decoder = m(e) + m(3 * L) + m(2 * L) + m(L) + m(L, O, False)
    return encoder + processor + decoder


# ---------------------------------------------------------------------------------------
# FLOPs and bytes (for the recompute cost of remat and the predicted step time).
#
# XLA's `cost_analysis()` of a compiled step also reports FLOPs and bytes accessed, but it
# counts the body of a `while` loop once whatever its trip count (the processor's
# `lax.scan` over S steps, the loops over edge blocks, the nested remat groups), so a
# setting that moves work into loops would look cheaper than it is. The counts below are
# derived from the shapes instead, loop by loop.


def _mlp_work(rows: int, in_dim: int, latent: int, hidden: int, out_dim: int,
              norm: bool = True) -> tuple[float, float]:
    """(FLOPs, elements moved) of an MLP on `rows` rows.

    Two FLOPs per multiply-add; each layer reads its input and writes its output (the
    activation is fused into the matmul), and a LayerNorm reads and writes the output.
    """
    sizes = [in_dim] + [latent] * hidden + [out_dim]
    layers = list(zip(sizes[:-1], sizes[1:]))
    flops = 2.0 * rows * sum(i * o for i, o in layers)
    moved = float(rows) * (sum(i + o for i, o in layers) + (2 * out_dim if norm else 0))
    return flops, moved


def _edge_mlp_work(edges: int, senders: int, receivers: int, latent: int, hidden: int,
                   gather_after_matmul: bool) -> tuple[float, float]:
    """(FLOPs, elements moved) of an edge MLP on `[e, v_s, v_r]` (rows already x batch).

    Plain: two node rows gathered per edge into the `[E, B, 3L]` concatenation (3L read,
    3L written per edge), then the MLP on 3L inputs. Gather after matmul: the sender and
    the receiver part of the first layer run once per node (an L x L matmul on
    `senders + receivers` rows), the edge part on L inputs, and each edge adds two
    gathered projected rows to its first layer's output (2L read, L read and written).
    """
    L, H = latent, hidden
    if not gather_after_matmul:
        flops, moved = _mlp_work(edges, 3 * L, L, H, L)
        return flops, moved + 6.0 * L * edges
    flops, moved = _mlp_work(edges, L, L, H, L)
    p_flops, p_moved = _mlp_work(senders + receivers, L, L, 0, L, norm=False)
    return flops + p_flops, moved + p_moved + 4.0 * L * edges


def _node_mlp_work(nodes: int, edges: int, latent: int, hidden: int) -> tuple[float, float]:
    """(FLOPs, elements moved) of a node update: the sum of `edges` incoming messages
    (L read per edge, L written per node), the `[N, B, 2L]` concatenation (2L read and
    written per node) and the MLP on 2L inputs."""
    flops, moved = _mlp_work(nodes, 2 * latent, latent, hidden, latent)
    return flops, moved + float(latent) * (edges + 5 * nodes)


def stage_work(model: ModelConfig, task: TaskConfig, counts: GraphCounts, batch: int = 1,
               memory: Optional[MemoryConfig] = None) -> dict:
    """Forward (FLOPs, elements moved) of each stage's MLPs, gathers and sums.

    Gather after matmul (`memory.gather_after_matmul`) changes the edge MLPs
    (`_edge_mlp_work`); no other switch changes the forward pass. Edge embeddings
    (batch-independent, small) are left out.

    Returns:
      `{'encoder', 'processor_step', 'decoder', 'forward'}` -> `(flops, elements)`;
      `forward` is the whole network (encoder + S steps + decoder).
    """
    L, H, S = model.latent_size, model.hidden_layers, model.processor_steps
    F, O, B = task.input_channels, task.output_channels, batch
    gam = memory is not None and memory.gather_after_matmul
    c = counts
    Ng, Nm = B * c.grid_nodes, B * c.mesh_nodes

    def add(*parts):
        return (sum(p[0] for p in parts), sum(p[1] for p in parts))

    enc = add(_mlp_work(Ng, F, L, H, L),
              _edge_mlp_work(B * c.grid2mesh_edges, Ng, Nm, L, H, gam),
              _node_mlp_work(Nm, B * c.grid2mesh_edges, L, H),
              _mlp_work(Ng, L, L, H, L))
    step = add(_edge_mlp_work(B * c.mesh_edges, Nm, Nm, L, H, gam),
               _node_mlp_work(Nm, B * c.mesh_edges, L, H))
    dec = add(_edge_mlp_work(B * c.mesh2grid_edges, Nm, Ng, L, H, gam),
              _node_mlp_work(Ng, B * c.mesh2grid_edges, L, H),
              _mlp_work(Ng, L, L, H, O, norm=False))
    forward = (enc[0] + S * step[0] + dec[0], enc[1] + S * step[1] + dec[1])
    return {"encoder": enc, "processor_step": step, "decoder": dec, "forward": forward}


def stage_flops(model: ModelConfig, task: TaskConfig, counts: GraphCounts,
                batch: int = 1, memory: Optional[MemoryConfig] = None) -> dict:
    """Forward FLOPs (2 per multiply-add) of the matmuls of each stage (`stage_work`).

    Returns:
      `{'encoder', 'processor_step', 'decoder', 'forward'}`; `forward` is the whole
      network (encoder + S steps + decoder).
    """
    return {k: v[0] for k, v in stage_work(model, task, counts, batch, memory).items()}


def recompute_runs(memory: MemoryConfig, steps: int) -> dict:
    """How many extra times each stage's forward pass runs in one training step.

    A checkpointed processor step is run twice (once more in the backward pass); under
    `nested:k` a step is run three times (group recompute, then its own); encoder and
    decoder edge blocks and whole-stage checkpoints rerun their edge MLPs / stage once
    (edge blocks in the encoder rerun its edge messages, about half of it); a rollout
    under `rollout_remat` runs each forward once more.

    Returns:
      `{'encoder', 'processor_step', 'decoder', 'forward'}` -> extra runs.
    """
    n = memory.checkpointed_steps(steps)
    runs = {"encoder": 0.0, "decoder": 0.0, "forward": 0.0,
            "processor_step": float(n * (2 if memory.processor_remat == "nested" else 1))}
    if memory.checkpoint_encoder:
        runs["encoder"] = 1.0
    elif memory.edge_block_size is not None:
        runs["encoder"] = 0.5
    if memory.checkpoint_decoder or memory.edge_block_size is not None:
        runs["decoder"] = 1.0
    if memory.rollout_remat:
        runs["forward"] = 1.0
    return runs


def recompute_flops(model: ModelConfig, task: TaskConfig, memory: MemoryConfig,
                    counts: GraphCounts, batch: int = 1) -> float:
    """Extra forward FLOPs the remat choices of `memory` add to one training step
    (`recompute_runs` x the stages' FLOPs under `memory`)."""
    f = stage_flops(model, task, counts, batch, memory)
    return sum(r * f[k] for k, r in recompute_runs(memory, model.processor_steps).items())


#: The backward pass of a matmul costs two forward ones (one product per operand), and
#: moves about twice the forward's bytes (it reads what the forward saved and writes
#: gradients).
BACKWARD_FORWARDS = 2.0
#: AdamW reads parameters, gradients and two moments and writes parameters and moments:
#: 7 float32 values per parameter.
OPTIMIZER_VALUES_PER_PARAM = 7


def step_work(model: ModelConfig, task: TaskConfig, memory: MemoryConfig,
              counts: Optional[GraphCounts] = None, batch: int = 1, rollout: int = 1
              ) -> tuple[float, float]:
    """(FLOPs, bytes moved) of one training step: forward, backward, recompute, AdamW.

    Per autoregressive step: the forward (`stage_work`), `BACKWARD_FORWARDS` times it
    for the backward pass, and the recomputed stages (`recompute_runs`); activations
    are 4 bytes in float32, 2 in bfloat16. The optimizer adds
    `OPTIMIZER_VALUES_PER_PARAM` float32 values per parameter (its FLOPs are negligible).
    These are counts for a speed model (`gclab.sizing.speed`), not a promise of what a
    compiler moves: fusion may keep some intermediates in registers or caches.
    """
    c = counts or GraphCounts.for_model(model)
    u = memory.activation_bytes
    work = stage_work(model, task, c, batch, memory)
    runs = recompute_runs(memory, model.processor_steps)
    flops, moved = ((1 + BACKWARD_FORWARDS) * work["forward"][i]
                    + sum(r * work[k][i] for k, r in runs.items()) for i in (0, 1))
    return rollout * flops, rollout * u * moved + optimizer_bytes(model, task)


def optimizer_bytes(model: ModelConfig, task: TaskConfig) -> float:
    """Bytes AdamW moves per step: `OPTIMIZER_VALUES_PER_PARAM` float32 values per
    parameter (`step_work` counts them in every step's bytes)."""
    return 4.0 * OPTIMIZER_VALUES_PER_PARAM * param_count(model, task)


# ---------------------------------------------------------------------------------------
# Activations.


def _processor(model: ModelConfig, memory: MemoryConfig, c: GraphCounts) -> tuple:
    """(saved, workspace) of the processor in units of `u B L` elements.

    Without remat every step saves its internals (`EDGE_MLP_ARRAYS Em + NODE_MLP_ARRAYS
    Nm`); a checkpointed step saves its boundary (`Em + Nm`). The working set of the
    backward pass beyond one step's internals (which the stage boundaries absorb) is
    in principle `(k - 1)` steps' internals for `every:k` (the whole group is
    recomputed with its internals saved), but XLA:CPU's compiled temp grows by about
    `k - 1` boundaries only (calibrated at 4 deg / 3 splits, k = 2, 4); `k` boundaries
    for `nested:k`.
    """
    S = model.processor_steps
    internals = EDGE_MLP_ARRAYS * c.mesh_edges + NODE_MLP_ARRAYS * c.mesh_nodes
    if memory.gather_after_matmul:  # no [Em, B, 3L] concatenation; two projected rows
        internals -= 3.0 * c.mesh_edges
    if memory.processor_edge_blocks:  # edge internals live one block at a time
        internals -= (EDGE_MLP_ARRAYS - 1.0) * c.mesh_edges
    pe, pn = POLICY_EXTRA[memory.remat_policy]
    boundary = STEP_BOUNDARY_ARRAYS * (c.mesh_edges + c.mesh_nodes) + pe * c.mesh_edges \
        + pn * c.mesh_nodes
    kind = memory.processor_remat
    if kind == "none":
        return S * internals, 0.0
    if kind in ("step", "ratio"):
        n = memory.checkpointed_steps(S)
        return n * boundary + (S - n) * internals, 0.0
    k = min(memory.remat_group_size, S)
    groups = math.ceil(S / k)
    if kind == "every":  # XLA:CPU overlaps most of a group's recompute with the rest
        return groups * boundary, (k - 1) * boundary
    return groups * boundary, k * boundary  # nested


def check_step_arguments(model: Any, task: Any, memory: Any, batch: Any, rollout: Any,
                         caller: str) -> None:
    """Checks the arguments that describe one training step (as `estimate` and `plan` take).

    Raises:
      ValueError: naming `caller`, the argument and what is allowed.
    """
    for name, value, kind in (("model", model, ModelConfig), ("task", task, TaskConfig),
                              ("memory", memory, MemoryConfig)):
        require_kind(name, value, kind, caller=f"{caller}:")
    for name, value in (("batch", batch), ("rollout", rollout)):
        if not is_int(value) or not 1 <= value <= MAX_INT32:
            error = ValueError if is_int(value) else WrongType
            raise error(f"{caller}: {name}={value!r} is invalid: an integer >= 1 "
                        f"(and <= {MAX_INT32})")
    if batch % memory.microbatches:
        raise ValueError(f"{caller}: batch={batch} is invalid: it must be a multiple of "
                         f"MemoryConfig.microbatches={memory.microbatches}")


def estimate(model: ModelConfig, task: TaskConfig, memory: Optional[MemoryConfig] = None,
             *, batch: int = 1, rollout: int = 1, counts: Optional[GraphCounts] = None,
             activation_bytes: Optional[int] = None) -> MemoryEstimate:
    """Models the memory of one training step.

    Args:
      model: geometry and network.
      task: channels.
      memory: memory techniques (default: none).
      batch: B.
      rollout: T autoregressive steps.
      counts: node/edge counts (default: from the model, Eg from the cached graphs).
      activation_bytes: bytes per activation element (default 4 for `f32`, 2 for
        `bf16`; 4 gives a float32-sized upper bound for a `bf16` step).

    Returns:
      A `MemoryEstimate`.

    Raises:
      ValueError: an argument of the wrong kind, a batch or rollout that is not an integer
        >= 1, or a batch that the micro-batches do not divide.
    """
    mem = memory or MemoryConfig()
    check_step_arguments(model, task, mem, batch, rollout, "estimate")
    if counts is not None and not isinstance(counts, GraphCounts):
        raise ValueError(f"estimate: counts must be a GraphCounts, not {a_kind(counts)}")
    if activation_bytes is not None and activation_bytes not in (2, 4):
        raise ValueError(f"estimate: activation_bytes={activation_bytes!r} is invalid: "
                         "None, 2 or 4")
    c = counts or GraphCounts.for_model(model)
    u = activation_bytes or mem.activation_bytes
    L = model.latent_size
    B = batch // mem.microbatches  # activations of one micro-batch at a time
    C, O = task.data_channels, task.output_channels
    P = param_count(model, task)
    gam = mem.gather_after_matmul
    blocks = mem.edge_block_size
    stream = mem.stream_grid_nodes and blocks is not None
    concat_saving = 3.0 if gam else 0.0

    # Encoder: edge MLP on [Eg, B, 3L], grid-node embed/update, mesh-node update.
    enc_edges = (EDGE_MLP_ARRAYS - concat_saving) * c.grid2mesh_edges
    if blocks is not None:  # only one block's internals, recomputed in the backward pass
        enc_edges = 0.0
    enc_grid = 0.0 if stream else GRID_NODE_ARRAYS_ENCODER * c.grid_nodes
    encoder = enc_edges + enc_grid + MESH_NODE_ARRAYS * c.mesh_nodes
    proc, workspace = _processor(model, mem, c)
    # Decoder: edge MLP on [Ed, B, 3L] and grid-node update + output MLP.
    if blocks is not None:  # end to end per block of grid nodes: keeps grid latents only
        decoder = (0.0 if stream else 1.0) * c.grid_nodes
    else:
        decoder = (EDGE_MLP_ARRAYS - concat_saving) * c.mesh2grid_edges \
            + GRID_NODE_ARRAYS_DECODER * c.grid_nodes
    if mem.checkpoint_encoder:  # keeps its outputs: grid and mesh latents
        encoder = min(encoder, (0.0 if stream else 1.0) * c.grid_nodes + c.mesh_nodes)
        workspace = max(workspace, enc_edges + enc_grid)
    if mem.checkpoint_decoder:
        workspace = max(workspace, decoder)
        decoder = 1.0 * c.grid_nodes
    if blocks is not None:  # an encoder and a decoder block's internals in flight
        bs = max(balanced_block(c.grid2mesh_edges, blocks),
                 balanced_block(c.mesh2grid_edges, blocks))
        workspace += 2 * (EDGE_MLP_ARRAYS + GRID_NODE_ARRAYS_DECODER / 3) * bs

    per_step = {  # bytes for one autoregressive step
        "inputs": INPUT_ARRAYS * u * B * c.grid_nodes * C + u * B * c.grid_nodes * O,
        "encoder": u * B * L * encoder,
        "processor": u * B * L * proc,
        "decoder": u * B * L * decoder,
        "embeddings": u * L * EMBED_ARRAYS * (
            (0 if blocks else c.grid2mesh_edges) + c.mesh_edges
            + (0 if blocks else c.mesh2grid_edges)),
    }
    if rollout > 1:
        if mem.rollout_remat:  # T boundaries (the predicted grid state) + one step inside
            boundary = u * B * c.grid_nodes * (C + O)
            per_step = {k: v + (rollout - 1) * boundary * (k == "inputs")
                        for k, v in per_step.items()}
        else:
            per_step = {k: v * rollout for k, v in per_step.items()}
    acts = {k: int(v) for k, v in per_step.items()}
    acts["workspace"] = int(u * B * L * workspace)
    loss_grad_temp = sum(acts.values())

    params_b, grads_b, opt_b = 4 * P, 4 * P, 8 * P
    example = 4 * batch * c.grid_nodes * (C + rollout * O)
    graph = 4 * (3 * c.grid_nodes + 3 * c.mesh_nodes) + (8 + 4 * 4) * (
        c.grid2mesh_edges + c.mesh_edges + c.mesh2grid_edges)
    arguments = params_b + opt_b + example + graph
    outputs = 0 if mem.donate else params_b + opt_b
    temp = loss_grad_temp + grads_b
    f = stage_flops(model, task, c, batch, mem)
    recompute = recompute_flops(model, task, mem, c, batch) / f["forward"]
    return MemoryEstimate(
        num_params=P, params_bytes=params_b, grads_bytes=grads_b, optimizer_bytes=opt_b,
        activation_bytes=acts, loss_grad_temp_bytes=int(loss_grad_temp),
        temp_bytes=int(temp), argument_bytes=int(arguments),
        total_bytes=int(arguments + outputs + temp), recompute_fraction=float(recompute))


def compiled_loss_grad(model: ModelConfig, task: TaskConfig,
                       memory: Optional[MemoryConfig] = None, batch: int = 1):
    """XLA's `CompiledMemory` of loss + gradient, loss = mean square of the output.

    The reference the activation formula is calibrated against (`loss_grad_temp_bytes`);
    compiled from shapes alone (`[Ng, B, C]` inputs, real graph sizes).
    """


    graphs = graphs_for(model)
    graph = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                   graph_inputs(graphs))
    net = make_network(model, task.data_channels, task.output_channels, memory)
    params = param_shapes(model, task.data_channels, task.output_channels)
    inputs = jax.ShapeDtypeStruct((graphs.num_grid_nodes, batch, task.data_channels),
                                  jnp.float32)  # [Ng, B, C]

    def loss(p, g, x):
        return jnp.mean(net.apply(p, g, x) ** 2)

    return compiled_memory(jax.grad(loss), params, graph, inputs)


# ---------------------------------------------------------------------------------------
# Grouped processor remat: the optimum group size.


def step_boundary_and_internals(model: ModelConfig, counts: GraphCounts, batch: int = 1,
                                activation_bytes: int = 4) -> tuple[float, float]:
    """Bytes of one stored processor-step boundary (b) and of one step's internals (c).

    A boundary is the edge and node latents carried from one step to the next,
    `STEP_BOUNDARY_ARRAYS (Em + Nm)` arrays of `B L` elements; the internals are what a
    step saves for its own backward pass, `EDGE_MLP_ARRAYS Em + NODE_MLP_ARRAYS Nm`.
    """
    unit = activation_bytes * batch * model.latent_size
    b = STEP_BOUNDARY_ARRAYS * (counts.mesh_edges + counts.mesh_nodes) * unit
    c = (EDGE_MLP_ARRAYS * counts.mesh_edges + NODE_MLP_ARRAYS * counts.mesh_nodes) * unit
    return b, c


def optimal_group_size(steps: int, boundary_bytes: float, internals_bytes: float) -> float:
    """The group size k* = sqrt(b S / c) that minimises a + b S / k + c k.

    Checkpointing S steps in groups of k stores S / k group boundaries (b bytes each) and
    holds one recomputed group's internals (k steps of c bytes) in the backward pass;
    d/dk (b S / k + c k) = 0 at k* = sqrt(b S / c). The square-root rule k = sqrt(S) is
    the case b = c.
    """
    return math.sqrt(boundary_bytes * steps / internals_bytes)


@dataclasses.dataclass(frozen=True)
class GroupedRematFit:
    """A least-squares fit of `temp(k) = a + b S / k + c k` to compiled temps.

    Attributes:
      a: bytes that do not depend on k.
      b: bytes per stored group boundary.
      c: bytes per step of the recomputed group.
      steps: S.
    """
    a: float
    b: float
    c: float
    steps: int

    def __call__(self, k):
        return self.a + self.b * self.steps / k + self.c * k

    @property
    def optimum(self) -> float:
        """k* of the fit (`optimal_group_size`); NaN when b or c is not positive."""
        if self.b <= 0 or self.c <= 0:
            return float("nan")
        return optimal_group_size(self.steps, self.b, self.c)


def fit_grouped_remat(group_sizes, temps, steps: int) -> GroupedRematFit:
    """Fits `a + b S / k + c k` to the compiled temps of `every:k` for several k."""
    ks = np.asarray(group_sizes, np.float64)
    design = np.stack([np.ones_like(ks), steps / ks, ks], axis=1)  # [n, 3]
    coef, *_ = np.linalg.lstsq(design, np.asarray(temps, np.float64), rcond=None)
    return GroupedRematFit(*(float(x) for x in coef), steps=int(steps))
