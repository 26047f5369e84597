"""The memory techniques: each one switch of `MemoryConfig`, and the code that applies it.

Nothing here knows GraphCast: the techniques take step functions, message functions and
parameter trees, so they serve any graph network.

| module | what it is for |
|---|---|
| `config` | `MemoryConfig` (every switch, off by default), remat specs, named recipes |
| `remat` | checkpointing of scanned steps (step, every:k, nested:k, ratio:r) and of stages |
| `blocks` | message passing over checkpointed blocks of edges |
| `precision` | the compute dtype, parameter casts, float32 aggregation |
| `schedule` | XLA:CPU's instruction order (`use_cpu_scheduler`), chosen before JAX starts |
"""

from gclab.memory.blocks import balanced_block, blocked_edge_update, blocked_sum, split_blocks
from gclab.memory.config import (
    FULL_MESH2GRID_EDGES,
    LEAN_EDGE_BLOCK,
    PRECISIONS,
    RECIPE_EDGE_BLOCK,
    RECIPES,
    REMAT_KINDS,
    REMAT_POLICIES,
    REMAT_SPEC_HELP,
    MemoryConfig,
    get_recipe,
    parse_remat_spec,
    scaled_edge_block,
)
from gclab.memory.precision import aggregate, cast_tree, compute_dtype
from gclab.memory.remat import (
    AGGREGATED_MESSAGES,
    NODE_LATENTS,
    STEP_SCOPE_PREFIX,
    remat_policy,
    scan_steps,
    stage_checkpoint,
    step_scope,
)
from gclab.memory.schedule import CPU_SCHEDULERS, cpu_scheduler, use_cpu_scheduler

__all__ = [
    "AGGREGATED_MESSAGES", "CPU_SCHEDULERS", "FULL_MESH2GRID_EDGES", "LEAN_EDGE_BLOCK",
    "NODE_LATENTS", "PRECISIONS", "RECIPES", "RECIPE_EDGE_BLOCK", "REMAT_KINDS",
    "REMAT_POLICIES", "REMAT_SPEC_HELP", "STEP_SCOPE_PREFIX",
    "MemoryConfig", "aggregate", "balanced_block", "blocked_edge_update", "blocked_sum",
    "cast_tree", "compute_dtype", "cpu_scheduler", "get_recipe", "parse_remat_spec",
    "remat_policy", "scaled_edge_block", "scan_steps", "split_blocks", "stage_checkpoint",
    "step_scope", "use_cpu_scheduler",
]
