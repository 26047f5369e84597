"""`ParallelConfig`: how a training step is laid out over devices.

A layout is the size of each axis of a device mesh; their product is the number of
devices. Each axis splits something different:

| axis | what it splits | what each device holds | communication per step |
|---|---|---|---|
| `data` | the batch | a slice of the samples; all parameters and optimizer state | an all-reduce of the gradients |
| `spatial` | grid nodes and every edge set (grid2mesh, multimesh, mesh2grid) into contiguous blocks | 1/D of every `[Ng, B, L]` and `[E, B, L]` array; the mesh nodes whole | sums into mesh nodes all-reduced, node tables gathered before the edge gathers |
| `pipeline` | reserved for stages of the network (must be 1 for now) | | |

With `spatial` > 1, mesh nodes are split too by default (`mesh_nodes="split"`): each
device keeps 1/D of every mesh-node latent, sums into mesh nodes become a reduce-scatter
and the edge gathers read the nodes through an all-gather. `mesh_nodes="replicated"` keeps
them whole on every device: less communication, more memory (the 16 saved step latents of
the processor are held whole on every device).

Layouts combine with every `MemoryConfig` technique and with bfloat16: the techniques
change how each device evaluates its share, the layout which share it evaluates.
"""

from __future__ import annotations

import dataclasses
import re

from gclab.config import invalid, is_int

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
                      "split)")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Sizes of the device mesh's axes; `devices` is their product.

    Attributes:
      data: devices the batch is split over. Each holds all parameters and optimizer
        state; the batch must be a multiple of it. Costs one gradient all-reduce per step.
      spatial: devices the grid nodes and edges are split over. Lowers per-device
        activation memory towards 1/spatial; costs collectives inside every GNN step
        (sums into mesh nodes, gathers of node tables).
      pipeline: stages of the network (reserved; must be 1).
      mesh_nodes: with `spatial` > 1, `"split"` (mesh-node arrays split over `spatial`:
        1/D of their memory per device, a reduce-scatter and an all-gather per GNN step) or
        `"replicated"` (whole on every device: an all-reduce per step, no gather traffic,
        every device holds every mesh-node latent).
    """

    data: int = 1
    spatial: int = 1
    pipeline: int = 1
    mesh_nodes: str = "split"

    def __post_init__(self) -> None:
        for field in ("data", "spatial", "pipeline"):
            v = getattr(self, field)
            if not is_int(v) or v < 1:
                invalid(self, field, "an integer >= 1")
        if self.pipeline != 1:
            invalid(self, "pipeline", "1 (pipeline stages are not implemented yet)")
        if self.mesh_nodes not in MESH_NODES:
            invalid(self, "mesh_nodes", "one of " + ", ".join(MESH_NODES))

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
        return ",".join(f"{name}:{getattr(self, name)}" for name in ("data", "spatial")
                        ) + ("" if self.pipeline == 1 else f",pipeline:{self.pipeline}") + (
                            "" if self.mesh_nodes == "split" else f",mesh-nodes:{self.mesh_nodes}")

    def replace(self, **changes) -> "ParallelConfig":
        return dataclasses.replace(self, **changes)


_ITEM = re.compile(r"^\s*(data|spatial|pipeline)\s*:\s*(\d+)\s*$")
_MESH_ITEM = re.compile(r"^\s*mesh-nodes\s*:\s*(\w+)\s*$")


def parse_parallel_spec(spec: str) -> ParallelConfig:
    """A `ParallelConfig` from a spec such as `data:2,spatial:4`.

    Raises:
      ValueError: a malformed spec or an axis named twice (the message lists what is
        accepted), or an invalid size (the message names the field).
    """
    sizes: dict = {}
    items = spec.split(",") if isinstance(spec, str) and spec.strip() else [None]
    for item in items:
        m = _ITEM.match(item) if item is not None else None
        mesh = _MESH_ITEM.match(item) if item is not None and m is None else None
        if mesh is not None and "mesh_nodes" not in sizes:
            sizes["mesh_nodes"] = mesh.group(1)
            continue
        if m is None or m.group(1) in sizes:
            raise ValueError(f"malformed parallel spec {spec!r}; accepted: {PARALLEL_SPEC_HELP}")
        sizes[m.group(1)] = int(m.group(2))
    return ParallelConfig(**sizes)


def layouts(devices: int) -> list[ParallelConfig]:
    """Every data x spatial layout of `devices` devices (pipeline 1), data-heaviest first."""
    if not is_int(devices) or devices < 1:
        raise ValueError(f"devices={devices!r} is invalid: an integer >= 1.")
    return [ParallelConfig(data=d, spatial=devices // d)
            for d in range(devices, 0, -1) if devices % d == 0]
