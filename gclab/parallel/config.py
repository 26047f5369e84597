"""`ParallelConfig`: how a training step is laid out over devices.

A layout is the size of each axis of a device mesh; their product is the number of
devices. Each axis splits something different:

| axis | what it splits | what each device holds | communication per step |
|---|---|---|---|
| `data` | the batch | a slice of the samples; all parameters and optimizer state | an all-reduce of the gradients |
| `spatial` | grid nodes and every edge set (grid2mesh, multimesh, mesh2grid) into contiguous blocks | 1/D of every `[Ng, B, L]` and `[E, B, L]` array; the mesh nodes whole | sums into mesh nodes all-reduced, node tables gathered before the edge gathers |
| `pipeline` | the processor's steps into stages of consecutive steps (encoder with the first, decoder with the last); the batch into micro-batches that flow through the stages (GPipe, `gclab.parallel.pipeline`) | the state of every tick's micro-batch (M + P - 1), one stage's activations for one tick (stages run under a checkpoint); all parameters | one send of a micro-batch's latents (grid, mesh nodes, mesh edges) per stage and tick |

With `spatial` > 1, mesh nodes are split too by default (`mesh_nodes="split"`): each
device keeps 1/D of every mesh-node latent, sums into mesh nodes become a reduce-scatter
and the edge gathers read the nodes through an all-gather. `mesh_nodes="replicated"` keeps
them whole on every device: less communication, more memory (the 16 saved step latents of
the processor are held whole on every device).

Layouts combine with every `MemoryConfig` technique and with bfloat16: the techniques
change how each device evaluates its share, the layout which share it evaluates. One
technique has a layout's own form: a pipeline's per-stage remat (`stage_remat`) replaces
the processor remat, which must be `none` with it (`ParallelConfig.check_memory`). The axes
combine two at a time: `pipeline` goes with `data` or with `spatial`, not with both, since
XLA's SPMD partitioner aborts the process (a failed check, not an error) on a layout with
all three axes above 1; `ParallelConfig` refuses one, and `layouts` and `pipeline_layouts`
never give one. One combination compiles but cannot run: `spatial` with `pipeline` where
rows or edge blocks do not split evenly over `spatial`, because the compiler then reshards
inside a stage, where the other stages' devices never join (refused before a step runs:
`gclab.parallel.pipeline.check_stage_collectives`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Optional

import numpy as np

from gclab.config import (
    MAX_INT32,
    ConfigError,
    invalid,
    is_int,
    normalise_numbers,
    require_count,
)

# The device mesh's axis names, outermost first (`data` is the slowest-varying axis, so on
# several hosts a host's devices share a data slice and split space among themselves).
DATA_AXIS = "data"
SPATIAL_AXIS = "spatial"
PIPELINE_AXIS = "pipeline"
MESH_AXES = (DATA_AXIS, PIPELINE_AXIS, SPATIAL_AXIS)
MESH_NODES = ("split", "replicated")
PARALLEL_SPEC_HELP = ("comma-separated AXIS:SIZE with AXIS one of data, spatial, pipeline and "
                      "SIZE an integer >= 1 (e.g. data:2,spatial:4); axes left out have size 1; "
                      "mesh-nodes:replicated keeps mesh nodes whole on every device (default "
                      "split); with pipeline, microbatches:M (default 1), stage-steps:A/B/.. "
                      "(processor steps per stage, default as even as possible) and "
                      "stage-remat:A/B/.. (checkpointed steps per stage, in place of the "
                      "processor remat, which must then be none; default the memory recipe's "
                      "remat in every stage)")
# Why a layout may not have all three axes above 1 (`ParallelConfig` and `spec_error` say it).
THREE_AXES = ("pipeline combines with data or with spatial, not with both (XLA's SPMD "
              "partitioner aborts the process on the three axes)")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Sizes of the device mesh's axes; `devices` is their product.

    Attributes:
      data: devices the batch is split over. Each holds all parameters and optimizer
        state; the batch must be a multiple of it. Costs one gradient all-reduce per step.
      spatial: devices the grid nodes and edges are split over. Lowers per-device
        activation memory towards 1/spatial; costs collectives inside every GNN step
        (sums into mesh nodes, gathers of node tables).
      pipeline: stages of the processor (consecutive steps each; the encoder runs in
        the first, the decoder in the last). Each device holds one stage's activations;
        costs a bubble of (P - 1) / (M + P - 1) idle ticks per step (see
        `gclab.parallel.pipeline`). 1 where `data` and `spatial` are both above 1: the
        three axes together abort XLA's SPMD partitioner.
      microbatches: with `pipeline` > 1, M, the micro-batches the batch (each data slice
        of it) is split into for the pipeline; more of them shrink the bubble.
      stage_steps: with `pipeline` > 1, the processor steps of each stage (they must add
        up to the processor's steps); None: as even as possible, earlier stages one more.
      stage_remat: with `pipeline` > 1, the checkpointed steps of each stage (the first
        n of its steps, each under its own checkpoint, the rest stored); None: the
        `MemoryConfig`'s processor remat applied to every stage's steps. It takes the
        place of that remat, which must then be `none` (`check_memory`).
      mesh_nodes: with `spatial` > 1, `"split"` (mesh-node arrays split over `spatial`:
        1/D of their memory per device, a reduce-scatter and an all-gather per GNN step) or
        `"replicated"` (whole on every device: an all-reduce per step, no gather traffic,
        every device holds every mesh-node latent).

    The four sizes are at most `MAX_INT32`; numpy integers are accepted and stored as
    Python ints.
    """

    data: int = 1
    spatial: int = 1
    pipeline: int = 1
    mesh_nodes: str = "split"
    microbatches: int = 1
    stage_steps: Optional[tuple] = None
    stage_remat: Optional[tuple] = None

    def __post_init__(self) -> None:
        sizes = ("data", "spatial", "pipeline", "microbatches")
        for field in sizes:
            v = getattr(self, field)
            if not is_int(v) or not 1 <= v <= MAX_INT32:
                invalid(self, field, f"an integer >= 1 (and <= {MAX_INT32})",
                        wrong_kind=not is_int(v))
        normalise_numbers(self, sizes)
        if self.data > 1 and self.spatial > 1 and self.pipeline > 1:
            invalid(self, "pipeline", f"1 with data:{self.data} and spatial:{self.spatial}; "
                    + THREE_AXES)
        if self.mesh_nodes not in MESH_NODES:
            invalid(self, "mesh_nodes", "one of " + ", ".join(MESH_NODES),
                    wrong_kind=not isinstance(self.mesh_nodes, str))
        for field, least in (("stage_steps", 1), ("stage_remat", 0)):
            v = getattr(self, field)
            if v is None:
                continue
            if (not isinstance(v, (tuple, list)) or len(v) != self.pipeline
                    or not all(is_int(n) and n >= least for n in v)):
                invalid(self, field, f"None or {self.pipeline} integers >= {least}, one per "
                        "pipeline stage", wrong_kind=not isinstance(v, (tuple, list))
                        or not all(is_int(n) for n in v))
            object.__setattr__(self, field, tuple(int(n) for n in v))
        if self.pipeline == 1 and (self.microbatches != 1 or self.stage_steps is not None
                                   or self.stage_remat is not None):
            invalid(self, "pipeline", "> 1 when microbatches, stage_steps or stage_remat is set")
        if self.stage_steps is not None and self.stage_remat is not None:
            for i, (k, n) in enumerate(zip(self.stage_steps, self.stage_remat)):
                if n > k:
                    invalid(self, "stage_remat", f"at most each stage's steps (stage {i} has "
                            f"{k}, not {n})")

    def stage_bounds(self, steps: int) -> tuple:
        """`(first, end)` processor steps of each pipeline stage, for `steps` steps.

        Raises:
          ValueError: more stages than steps, stage steps that do not add up to `steps`,
            or more checkpointed steps than a stage has (one line naming the field).
        """
        p = self.pipeline
        if p > steps:
            raise ValueError(f"pipeline:{p} is invalid for a processor of {steps} steps: at "
                             f"most {steps} stages (one step or more each)")
        sizes = self.stage_steps
        if sizes is None:
            sizes = tuple(steps // p + (i < steps % p) for i in range(p))
        elif sum(sizes) != steps:
            raise ValueError(f"stage-steps:{'/'.join(map(str, sizes))} is invalid: the stages' "
                             f"steps must add up to the processor's {steps}")
        if self.stage_remat is not None:
            for i, (k, n) in enumerate(zip(sizes, self.stage_remat)):
                if n > k:
                    raise ValueError(f"stage-remat:{'/'.join(map(str, self.stage_remat))} is "
                                     f"invalid: stage {i} has {k} steps, fewer than {n}")
        ends = np.cumsum(sizes)
        return tuple((int(e - k), int(e)) for e, k in zip(ends, sizes))

    def check_batch(self, batch: int, accumulation: int = 1) -> None:
        """Raises ValueError unless `batch` splits over `data`, then into `accumulation`
        gradient-accumulation micro-batches, then into the pipeline's `microbatches`."""
        multiple = self.data * accumulation * self.microbatches
        if not is_int(batch) or batch < 1 or batch % multiple:
            raise ValueError(
                f"batch {batch} is invalid for data:{self.data}, microbatches="
                f"{accumulation} (accumulation) and pipeline microbatches:{self.microbatches}:"
                f" a multiple of {multiple}")

    def check_memory(self, memory) -> None:
        """Raises `StageRematConflict` where `memory` (a `gclab.memory.MemoryConfig`, not
        imported here: the two packages are one layer) has a processor remat other than
        `none` and this layout per-stage remat (`stage_remat`): the stages' remat takes its
        place, so the processor remat would be reported and do nothing."""
        if self.stage_remat is not None and memory.processor_remat != "none":
            raise StageRematConflict(memory, self.stage_remat)

    @property
    def devices(self) -> int:
        """The number of devices of the layout (product of the axis sizes)."""
        return self.data * self.spatial * self.pipeline

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        """Axis sizes in `MESH_AXES` order."""
        return tuple(getattr(self, name) for name in MESH_AXES)

    @property
    def spec(self) -> str:
        """This layout as a spec string (`parse_parallel_spec` reads it back)."""
        out = ",".join(f"{name}:{getattr(self, name)}" for name in ("data", "spatial"))
        if self.pipeline != 1:
            out += f",pipeline:{self.pipeline}"
        if self.microbatches != 1:
            out += f",microbatches:{self.microbatches}"
        for name, v in (("stage-steps", self.stage_steps), ("stage-remat", self.stage_remat)):
            if v is not None:
                out += f",{name}:" + "/".join(map(str, v))
        if self.mesh_nodes != "split":
            out += f",mesh-nodes:{self.mesh_nodes}"
        return out

    def replace(self, **changes) -> "ParallelConfig":
        return dataclasses.replace(self, **changes)


class StageRematConflict(ConfigError):
    """A processor remat (`MemoryConfig.processor_remat` other than `none`) with per-stage
    remat (`ParallelConfig.stage_remat`), which sets the checkpointed steps of every stage
    in its place: the processor remat would be ignored.

    Attributes (besides `ConfigError`'s, which name `MemoryConfig.processor_remat`):
      remat_spec: the processor remat as a spec (`MemoryConfig.remat_spec`, `every:2`).
      stage_remat: the layout's `stage_remat`.
    """

    def __init__(self, memory, stage_remat: tuple) -> None:
        super().__init__("MemoryConfig", "processor_remat", memory.processor_remat,
                         f"'none' with ParallelConfig.stage_remat={stage_remat}, which sets "
                         "the checkpointed steps of each pipeline stage in its place (remat "
                         f"{memory.remat_spec} would be ignored): give one or the other")
        self.remat_spec, self.stage_remat = memory.remat_spec, stage_remat


_ITEM = re.compile(r"^\s*(data|spatial|pipeline|microbatches)\s*:\s*(\d+)\s*$")
_MESH_ITEM = re.compile(r"^\s*mesh-nodes\s*:\s*(\w+)\s*$")
_STAGES_ITEM = re.compile(r"^\s*(stage-steps|stage-remat)\s*:\s*(\d+(?:\s*/\s*\d+)*)\s*$")


def parse_parallel_spec(spec: str) -> ParallelConfig:
    """A `ParallelConfig` from a spec such as `data:2,spatial:4`.

    Raises:
      ValueError: a malformed spec (the message lists what is accepted), an item given
        twice (named), or an invalid size (a `ConfigError` naming the field; `spec_error` says
        it in the spec's words).
    """
    return ParallelConfig(**_spec_sizes(spec))


def _spec_sizes(spec: str) -> dict:
    """`ParallelConfig`'s fields as a well-formed spec gives them (not yet checked).

    Raises:
      ValueError: a malformed spec (the message lists what is accepted), or an item given
        twice (named).
    """
    sizes: dict = {}
    items = spec.split(",") if isinstance(spec, str) and spec.strip() else [None]
    for item in items:
        m = _ITEM.match(item) if item is not None else None
        mesh = _MESH_ITEM.match(item) if item is not None and m is None else None
        stages = _STAGES_ITEM.match(item) if item is not None and m is None else None
        if m is not None:
            field, value = m.group(1), int(m.group(2))
        elif mesh is not None:
            field, value = "mesh_nodes", mesh.group(1)
        elif stages is not None:
            field = stages.group(1).replace("-", "_")
            value = tuple(int(n) for n in stages.group(2).split("/"))
        else:
            raise ValueError(f"malformed parallel spec {spec!r}; accepted: {PARALLEL_SPEC_HELP}")
        if field in sizes:
            raise ValueError(f"{field.replace('_', '-')} is given twice ("
                             f"{_spec_item(field, sizes[field])} and {_spec_item(field, value)}):"
                             " each axis or item at most once")
        sizes[field] = value
    return sizes


def _spec_item(field: str, value) -> str:
    """A spec item as written: `stage-steps:2/2`, `data:0`."""
    text = "/".join(map(str, value)) if isinstance(value, tuple) else value
    return f"{field.replace('_', '-')}:{text}"


def spec_error(spec: str, error: ConfigError) -> str:
    """`parse_parallel_spec(spec)`'s `error` in the spec's words (`stage-steps:2 is invalid:
    ...`), for a command line, whose user wrote a spec, not `ParallelConfig`'s fields."""
    sizes, field = _spec_sizes(spec), error.field
    # Items only a pipeline has, with no pipeline (pipeline:1, given or left out): say so
    # first, whatever else is wrong with them (stage-steps:2/2 has one stage too many, as
    # pipeline:1 counts them). A microbatches size out of range is named as such.
    piped = [f for f in sizes if f in ("stage_steps", "stage_remat")
             or f == "microbatches" and sizes[f] != 1]
    if sizes.get("pipeline", 1) == 1 and piped and field in ("pipeline", "stage_steps",
                                                               "stage_remat"):
        given = field if field in piped else piped[0]
        return (f"{_spec_item(given, sizes[given])} is invalid without a pipeline: it needs "
                "pipeline:P with P >= 2")
    item = _spec_item(field, sizes[field])
    if field == "pipeline" and error.allowed.endswith(THREE_AXES):
        return (f"{item} is invalid with data:{sizes['data']} and spatial:{sizes['spatial']}: "
                + THREE_AXES)
    if field in ("stage_steps", "stage_remat"):
        p = sizes.get("pipeline", 1)
        if len(sizes[field]) != p:
            return (f"{item} is invalid: {p} numbers separated by '/', one per stage of "
                    f"pipeline:{p}")
        if field == "stage_steps":
            return f"{item} is invalid: every stage has 1 step or more"
    return f"{item} is invalid: {error.allowed}"


def layouts(devices: int) -> list[ParallelConfig]:
    """Every data x spatial layout of `devices` devices (pipeline 1), data-heaviest first.

    Raises:
      ValueError: `devices` not an integer in 1..MAX_INT32.
    """
    devices = _device_count(devices)
    return [ParallelConfig(data=d, spatial=devices // d) for d in _divisors(devices)[::-1]]


def pipeline_layouts(devices: int, steps: int) -> list[ParallelConfig]:
    """Every data x pipeline layout of `devices` devices with 2 to `steps` stages (spatial
    1: `ParallelConfig` refuses a pipeline with both data and spatial above 1).

    Stage steps and remat are left to the pipeline planner
    (`gclab.sizing.pipeline_plan`); data-heaviest first.

    Raises:
      ValueError: `devices` not an integer in 1..MAX_INT32, or `steps` not an integer >= 1.
    """
    devices = _device_count(devices)
    steps = require_count("steps", steps, 1)
    return [ParallelConfig(data=devices // p, pipeline=p)
            for p in _divisors(devices) if 2 <= p <= steps]


def _device_count(devices: object) -> int:
    """`devices` as an int: a count a layout's sizes can hold (at most `MAX_INT32`)."""
    if not is_int(devices) or not 1 <= devices <= MAX_INT32:
        raise ValueError(f"devices={devices!r} is invalid: an integer >= 1 (and <= "
                         f"{MAX_INT32})")
    return int(devices)


def _divisors(n: int) -> list[int]:
    """The divisors of `n`, ascending. In pairs up to the square root: a count of a
    billion devices is answered at once, not after a billion divisions."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})
