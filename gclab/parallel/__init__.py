"""Parallel layouts: one training step over several devices, on JAX's own SPMD machinery.

| module | what it is for |
|---|---|
| `config` | `ParallelConfig` (sizes of the `data`, `spatial`, `pipeline` mesh axes) and its spec |
| `pipeline` | GPipe stages on the `pipeline` axis (`gpipe`: `shard_map`, `ppermute`) |
| `sharding` | the device mesh; where node and edge arrays live (`split_rows`, `full_rows`) |
| `processes` | simulated CPU devices; joining a multi-process run (`jax.distributed`) |
"""

from gclab.parallel.config import (
    DATA_AXIS,
    MESH_AXES,
    MESH_NODES,
    PARALLEL_SPEC_HELP,
    PIPELINE_AXIS,
    SPATIAL_AXIS,
    ParallelConfig,
    StageRematConflict,
    layouts,
    parse_parallel_spec,
    pipeline_layouts,
)
from gclab.parallel.pipeline import (
    active_pipeline,
    bubble_fraction,
    gpipe,
    switch_branches,
    use_pipeline,
)
from gclab.parallel.processes import initialize_processes, use_cpu_devices
from gclab.parallel.sharding import (
    active_axes,
    full_rows,
    global_array,
    make_mesh,
    mesh_rows,
    replicated,
    rows_sharding,
    spatial_shards,
    split_rows,
    split_shards,
    use_layout,
)

__all__ = [
    "DATA_AXIS", "MESH_AXES", "MESH_NODES", "PARALLEL_SPEC_HELP", "PIPELINE_AXIS", "SPATIAL_AXIS",
    "ParallelConfig", "StageRematConflict", "active_axes", "active_pipeline", "bubble_fraction",
    "gpipe", "pipeline_layouts", "use_pipeline", "full_rows", "global_array",
    "initialize_processes", "layouts", "make_mesh", "mesh_rows", "parse_parallel_spec",
    "replicated", "rows_sharding", "spatial_shards", "split_rows", "split_shards",
    "switch_branches", "use_cpu_devices", "use_layout",
]
