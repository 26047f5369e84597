"""Memory techniques, each one switch of a frozen `MemoryConfig` (all off by default).

Every technique keeps the model's function: float32 techniques change gradients by float32
rounding only (tests hold them to 1e-5 relative); bfloat16 changes them within the tolerance
stated in `tests/memory/test_techniques.py`.

| switch | what it does | memory | compute |
|---|---|---|---|
| `processor_remat` | checkpoint processor steps: `step`, `every:k` (groups of k scanned steps under one checkpoint), `nested:k` (groups of k, and every step inside a group), `ratio:r` (checkpoint ceil(r*S) steps, store the rest) | per-step: S x one step's internals -> S x (node + edge latents) + one step's internals | one extra forward of the checkpointed steps (~+30% step time) |
| `remat_policy` | what a checkpoint may keep: `nothing`, `dots` (matmul outputs), `aggregated` (summed messages), `node-latents` | between none and full remat | less recompute than `nothing` |
| `checkpoint_encoder` / `checkpoint_decoder` | one checkpoint around the whole grid2mesh / mesh2grid GNN | their `[E, B, 3L]` internals are not kept for the backward pass | one extra encoder / decoder forward |
| `edge_block_size` | encoder and decoder edges in blocks of this many edges, each block under its own checkpoint; the decoder runs grid nodes in blocks end to end | no full `[E, B, L]` or `[E, B, 3L]` array lives at once | one extra forward of the edge MLPs; a sequential loop over blocks |
| `processor_edge_blocks` | the same blocks for the processor's edge updates | removes the `[E, B, 3L]` concatenation of each processor step | as above |
| `stream_grid_nodes` | grid-node latents are computed block by block where they are used (encoder edge blocks, decoder blocks) | no `[Ng, B, L]` array at all: memory no longer grows with the grid | the grid embedding runs once per grid2mesh edge and once more in the decoder |
| `gather_after_matmul` | split the first layer of each edge MLP: `W [e, v_s, v_r] = W_e e + (W_s v)[s] + (W_r v)[r]` | no `[E, B, 3L]` concatenation; matmuls on nodes instead of edges | fewer FLOPs (nodes are fewer than edges) |
| `precision` | `bf16`: bfloat16 activations and compute, float32 parameters, gradients and optimizer state; encoder edge sum in float32; what the backward pass keeps is bfloat16 (LayerNorm keeps only its input, scanned residuals are stored as uint16 bits so that XLA:CPU makes no float32 copy of them) | saved activations halved; XLA:CPU compiled temp 0.5-0.75x float32 (its kernels still compute in float32) | faster matmuls on GPU/TPU |
| `recompute_layer_norm` | every LayerNorm keeps only its input for the backward pass and recomputes its float32 statistics there (a bfloat16 LayerNorm always does) | no float32 intermediates of the normalisation kept in a float32 step | the statistics once more per LayerNorm in the backward pass |
| `float32_aggregation` | sum incoming messages in float32 everywhere (not only in the encoder) | one float32 `[N, B, L]` buffer per sum | small |
| `rollout_remat` | each autoregressive step of a rollout under its own checkpoint | grows far slower than T | one extra forward per step |
| `microbatches` | gradient accumulation over this many micro-batches | activations of B / k samples | none (sequential) |
| `donate` | donate parameters and optimizer state to the train step | the updated state reuses the old buffers | none |
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import re
from typing import Optional

from gclab.config import (
    MAX_INT32,
    PRESETS,
    WrongType,
    invalid,
    is_int,
    is_number,
    normalise_numbers,
    require_count,
)

REMAT_KINDS = ("none", "step", "every", "nested", "ratio")
REMAT_POLICIES = ("nothing", "dots", "aggregated", "node-latents")
PRECISIONS = ("f32", "bf16")
#: Bytes of one activation element at each precision (what a step keeps between kernels:
#: bfloat16 is kept in 2 bytes on every backend, even where XLA:CPU computes in float32).
ACTIVATION_BYTES = {"f32": 4, "bf16": 2}
REMAT_SPEC_HELP = (
    "none | step | every:K | nested:K | ratio:R (K an integer >= 1, R in [0, 1]), optionally "
    "followed by ',policy=NAME' with NAME one of " + ", ".join(REMAT_POLICIES)
    + " (not after none or ratio:0, which checkpoint no step)")


def unread_remat_fields(kind: str, ratio: float) -> tuple:
    """The processor remat parameters that processor remat `kind` (with `remat_ratio`
    `ratio`) does not read: `remat_group_size` but for `every` and `nested`, `remat_ratio`
    but for `ratio`, and `remat_policy` where no step is checkpointed (`none`, `ratio:0`)."""
    unread = []
    if kind not in ("every", "nested"):
        unread.append("remat_group_size")
    if kind != "ratio":
        unread.append("remat_ratio")
    if kind == "none" or (kind == "ratio" and ratio == 0):
        unread.append("remat_policy")
    return tuple(unread)


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """Memory techniques of one training step. All off by default (the baseline).

    Attributes:
      processor_remat: `none`, `step`, `every`, `nested` or `ratio` (see module table).
        Checkpointing every step roughly makes the backward pass of the processor two
        times more expensive in FLOPs and removes all but its step boundaries from memory.
      remat_group_size: k for `every` and `nested` (the GraphCast authors used 3); the
        default 1 for the other kinds, which have no groups. Groups hold at most k steps:
        the last is shorter where k does not divide the steps it checkpoints, and a k of
        at least those steps makes one group of them all (the named recipes rely on it for
        short processors and pipeline stages; `gclab train --remat` refuses a k above the
        model's steps, where a typo is likelier than intent).
      remat_ratio: r for `ratio`: the first ceil(r * S) steps are checkpointed; the
        default 1.0 for the other kinds.
      remat_policy: what checkpointed code may save (`nothing` saves least); `nothing`
        where no step is checkpointed (`none`, `ratio` with r = 0).
      checkpoint_encoder: one checkpoint around the whole encoder (grid2mesh GNN).
      checkpoint_decoder: one checkpoint around the whole decoder (mesh2grid GNN).
      edge_block_size: encoder/decoder edges per block (None: no blocks). Smaller blocks
        lower the peak further but run more, smaller kernels.
      processor_edge_blocks: also run the processor's edge updates in blocks.
      gather_after_matmul: apply the sender/receiver parts of each edge MLP's first layer
        to node latents before the gather.
      stream_grid_nodes: never hold all grid-node latents: encoder edge blocks embed the
        grid nodes they send from, and decoder blocks embed and update their own grid
        nodes (needs `edge_block_size`). Removes every `[Ng, B, L]` array, at the cost
        of embedding each grid node once more per outgoing grid2mesh edge.
      precision: `f32` or `bf16` (bfloat16 activations, float32 parameters and gradients).
        Roughly halves what the backward pass keeps; gradients change by bfloat16
        rounding (within the tolerances of `tests/memory/test_techniques.py`).
      recompute_layer_norm: every float32 LayerNorm keeps only its input for the backward
        pass and recomputes its statistics there, as a bfloat16 one always does (off:
        differentiated as written, as Haiku's LayerNorm in the official code is).
      float32_aggregation: sum messages in float32 everywhere (the encoder always does).
      rollout_remat: checkpoint each autoregressive step of a rollout.
      microbatches: gradient accumulation over this many micro-batches (1: off).
      donate: donate parameters and optimizer state buffers to the train step.
    """

    processor_remat: str = "none"
    remat_group_size: int = 1
    remat_ratio: float = 1.0
    remat_policy: str = "nothing"
    checkpoint_encoder: bool = False
    checkpoint_decoder: bool = False
    edge_block_size: Optional[int] = None
    processor_edge_blocks: bool = False
    gather_after_matmul: bool = False
    stream_grid_nodes: bool = False
    precision: str = "f32"
    recompute_layer_norm: bool = False
    float32_aggregation: bool = False
    rollout_remat: bool = False
    microbatches: int = 1
    donate: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.processor_remat, str) or self.processor_remat not in REMAT_KINDS:
            invalid(self, "processor_remat", "one of " + ", ".join(REMAT_KINDS),
                    wrong_kind=not isinstance(self.processor_remat, str))
        if not is_int(self.remat_group_size) or not 1 <= self.remat_group_size <= MAX_INT32:
            invalid(self, "remat_group_size", f"an integer >= 1 (and <= {MAX_INT32})",
                    wrong_kind=not is_int(self.remat_group_size))
        r = self.remat_ratio
        if not is_number(r) or not 0 <= r <= 1:
            invalid(self, "remat_ratio", "a number in [0, 1]", wrong_kind=not is_number(r))
        if not isinstance(self.remat_policy, str) or self.remat_policy not in REMAT_POLICIES:
            invalid(self, "remat_policy", "one of " + ", ".join(REMAT_POLICIES),
                    wrong_kind=not isinstance(self.remat_policy, str))
        # A parameter the processor remat does not read would be kept and shown, and do
        # nothing: each must keep its default.
        kind, unread = self.processor_remat, unread_remat_fields(self.processor_remat, r)
        if "remat_group_size" in unread and self.remat_group_size != 1:
            invalid(self, "remat_group_size", f"1 (the default) with processor_remat={kind!r}: "
                    "only every and nested run groups of steps")
        if "remat_ratio" in unread and r != 1:
            invalid(self, "remat_ratio", f"1.0 (the default) with processor_remat={kind!r}: "
                    "only ratio reads it")
        if "remat_policy" in unread and self.remat_policy != "nothing":
            invalid(self, "remat_policy", f"'nothing' (the default) with processor_remat={kind!r}"
                    + (" and remat_ratio=0" if kind == "ratio" else "")
                    + ": no processor step is checkpointed, so no policy applies")
        for field in ("checkpoint_encoder", "checkpoint_decoder", "processor_edge_blocks",
                      "gather_after_matmul", "float32_aggregation", "rollout_remat", "donate",
                      "stream_grid_nodes", "recompute_layer_norm"):
            if not isinstance(getattr(self, field), bool):
                invalid(self, field, "True or False", wrong_kind=True)
        if self.edge_block_size is not None and (
                not is_int(self.edge_block_size) or not 1 <= self.edge_block_size <= MAX_INT32):
            invalid(self, "edge_block_size", f"None or an integer >= 1 (and <= {MAX_INT32})",
                    wrong_kind=not is_int(self.edge_block_size))
        if self.processor_edge_blocks and self.edge_block_size is None:
            invalid(self, "processor_edge_blocks", "needs edge_block_size to be set")
        if self.stream_grid_nodes and self.edge_block_size is None:
            invalid(self, "stream_grid_nodes", "needs edge_block_size to be set")
        if not isinstance(self.precision, str) or self.precision not in PRECISIONS:
            invalid(self, "precision", "one of " + ", ".join(PRECISIONS),
                    wrong_kind=not isinstance(self.precision, str))
        if not is_int(self.microbatches) or not 1 <= self.microbatches <= MAX_INT32:
            invalid(self, "microbatches", f"an integer >= 1 (and <= {MAX_INT32})",
                    wrong_kind=not is_int(self.microbatches))
        normalise_numbers(self, ("remat_group_size", "edge_block_size", "microbatches"),
                          ("remat_ratio",))

    def replace(self, **changes) -> "MemoryConfig":
        """A copy with `changes`.

        The processor remat's parameters (`remat_group_size`, `remat_ratio`,
        `remat_policy`) that `changes` does not name and that the new processor remat does
        not read (`unread_remat_fields`) go back to their defaults, so that
        `replace(processor_remat="none")` of a `nested:4,policy=dots` config is plain
        `none`; those `changes` names are checked as given.

        Raises:
          ValueError: a bad value (`ConfigError`), or a name that is no field (`WrongType`,
            which lists the fields).
        """
        unknown = [name for name in changes if name not in _DEFAULTS]
        if unknown:
            raise WrongType(f"MemoryConfig.replace {unknown[0]}={changes[unknown[0]]!r} is "
                            f"invalid: no such field; the fields are {', '.join(_DEFAULTS)}")
        kind = changes.get("processor_remat", self.processor_remat)
        ratio = changes.get("remat_ratio", self.remat_ratio)
        if isinstance(kind, str) and kind in REMAT_KINDS and is_number(ratio):
            for field in unread_remat_fields(kind, ratio):
                changes.setdefault(field, _DEFAULTS[field])
        return dataclasses.replace(self, **changes)

    @property
    def activation_bytes(self) -> int:
        """Bytes of one activation element at this config's precision (`ACTIVATION_BYTES`)."""
        return ACTIVATION_BYTES[self.precision]

    @property
    def remat_spec(self) -> str:
        """This config's processor remat as a spec string (see `parse_remat_spec`)."""
        kind = self.processor_remat
        spec = {"every": f"every:{self.remat_group_size}",
                "nested": f"nested:{self.remat_group_size}",
                "ratio": f"ratio:{_decimal(self.remat_ratio)}"}.get(kind, kind)
        if self.remat_policy != "nothing":
            spec += f",policy={self.remat_policy}"
        return spec

    def checkpointed_steps(self, steps: int) -> int:
        """How many of `steps` processor steps run under a checkpoint."""
        if self.processor_remat == "none":
            return 0
        if self.processor_remat == "ratio":
            return min(steps, math.ceil(self.remat_ratio * steps - 1e-9))
        return steps


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(MemoryConfig)}

# ASCII digits only (re.ASCII): a group size or a ratio is an integer or a plain decimal
# (`every:3`, `ratio:0.25`), not whatever int() and float() also read ('3_0', '-0', ' 3',
# Unicode digits, '1e-3', 'inf').
_SPEC = re.compile(r"^(none|step|every|nested|ratio)(?::([^,]*))?(?:,policy=([\w-]+))?$",
                   re.ASCII)
_GROUP = re.compile(r"\d+", re.ASCII)
_RATIO = re.compile(r"\d+(?:\.\d*)?|\.\d+", re.ASCII)


def _decimal(value: float) -> str:
    """`value` as the shortest plain decimal that reads back as the same float ('0.5',
    '1', '0.123456789', '0.0000001'): what `parse_remat_spec` reads."""
    text = repr(float(value))
    if "e" in text or "E" in text:  # repr's exponent form: spelled out in full
        text = format(decimal.Decimal(text), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def parse_remat_spec(spec: str) -> dict:
    """Parses a processor remat spec into `MemoryConfig` fields.

    Args:
      spec: `none`, `step`, `every:K`, `nested:K` or `ratio:R`, optionally followed by
        `,policy=NAME` (e.g. `every:3`, `ratio:0.5,policy=dots`).

    Returns:
      A dict of `processor_remat`, `remat_group_size`, `remat_ratio`, `remat_policy`.

    Raises:
      ValueError: a malformed spec, listing what is accepted.
    """
    m = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if m is None:
        raise ValueError(f"malformed remat spec {spec!r}; accepted: {REMAT_SPEC_HELP}")
    kind, arg, policy = m.groups()
    fields = {"processor_remat": kind, "remat_group_size": 1, "remat_ratio": 1.0,
              "remat_policy": policy or "nothing"}
    number = {"every": _GROUP, "nested": _GROUP, "ratio": _RATIO}.get(kind)
    if (arg is None) != (number is None) or number is not None and not number.fullmatch(arg):
        raise ValueError(f"malformed remat spec {spec!r}; accepted: {REMAT_SPEC_HELP}")
    if kind in ("every", "nested"):
        fields["remat_group_size"] = int(arg)
    elif kind == "ratio":
        fields["remat_ratio"] = float(arg)
    if fields["remat_policy"] not in REMAT_POLICIES:
        raise ValueError(f"unknown remat policy {policy!r} in {spec!r}; accepted: "
                         + ", ".join(REMAT_POLICIES))
    MemoryConfig(**fields)  # range checks with field names
    return fields


# Edge blocks used by the named recipes (gclab's choices: the GraphCast authors describe
# edge blocks but publish no size). Results do not depend on the block size.
RECIPE_EDGE_BLOCK = 65536
LEAN_EDGE_BLOCK = 8192
# Mesh2grid edges of the published 0.25 degree grid (three per grid node).
FULL_MESH2GRID_EDGES = PRESETS["graphcast"].model.num_mesh2grid_edges


def scaled_edge_block(num_mesh2grid_edges: int, block: int = RECIPE_EDGE_BLOCK,
                      minimum: int = 64) -> int:
    """The edge block that cuts a smaller grid's mesh2grid edges into as many blocks as
    `block` cuts the 0.25 degree grid's.

    Block counts, not block sizes, decide how much of an edge set is alive at once, so a
    recipe compiled on a small grid keeps its memory behaviour with this block size.

    Args:
      num_mesh2grid_edges: mesh2grid edges of the grid at hand (3 Ng).
      block: the block size at 0.25 degree.
      minimum: the smallest block returned.

    Raises:
      ValueError: an argument that is not an integer >= 1 (`WrongType` for one that is
        no integer at all).
    """
    edges = require_count("num_mesh2grid_edges", num_mesh2grid_edges, 1, "scaled_edge_block")
    block = require_count("block", block, 1, "scaled_edge_block")
    minimum = require_count("minimum", minimum, 1, "scaled_edge_block")
    return max(minimum, edges * block // FULL_MESH2GRID_EDGES)

RECIPES = {
    "none": MemoryConfig(),
    "per-step": MemoryConfig(processor_remat="step"),
    # The GraphCast authors' description: checkpoint every 3 processor steps, the whole
    # encoder and the whole decoder, and edge blocks inside the encoder and decoder.
    "deepmind": MemoryConfig(processor_remat="every", remat_group_size=3,
                             checkpoint_encoder=True, checkpoint_decoder=True,
                             edge_block_size=RECIPE_EDGE_BLOCK),
    # The least memory gclab reaches in float32.
    "lean": MemoryConfig(processor_remat="nested", remat_group_size=4,
                         checkpoint_encoder=True, checkpoint_decoder=True,
                         edge_block_size=LEAN_EDGE_BLOCK, processor_edge_blocks=True,
                         gather_after_matmul=True, stream_grid_nodes=True),
}


def get_recipe(name: str, precision: str = "f32") -> MemoryConfig:
    """A named recipe (`none`, `per-step`, `deepmind`, `lean`) at a precision."""
    if not isinstance(name, str) or name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; accepted: {', '.join(RECIPES)}")
    return RECIPES[name].replace(precision=precision)


def recipe_name(memory: MemoryConfig) -> Optional[str]:
    """The name of the recipe `memory` equals at its own precision, or None."""
    for name, recipe in RECIPES.items():
        if recipe.replace(precision=memory.precision) == memory:
            return name
    return None
