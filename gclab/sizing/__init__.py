"""Sizing: one compiled training step, the memory formula, sweeps and the planner.

| module | what it is for |
|---|---|
| `step` | `StepSpec` and one compiled training step: memory, timeline, a runnable step |
| `analytical` | the memory formula (bytes by stage, from graph counts and switches) |
| `sweep` | a grid of configurations x techniques, compiled or measured, cached |
| `planner` | the technique settings that fit a memory budget |
| `layout_plan` | the layout (data x spatial, data x pipeline) and recipe of least predicted time |
| `pipeline_plan` | each pipeline stage's steps and remat by MILP, against one ratio for all |
"""

from gclab.sizing.analytical import GraphCounts, MemoryEstimate, estimate, param_count
from gclab.sizing.planner import CARDS, NothingFits, Plan, parse_budget, plan
from gclab.sizing.step import (
    CompiledStep,
    StepMemory,
    StepSpec,
    compile_train_step,
    loss_grad_abstract,
    make_live_step,
    plan_only_options,
    train_step_abstract,
    train_step_memory,
    train_step_timeline,
)
from gclab.sizing.sweep import load_sweep, save_sweep, sweep

__all__ = [
    "CARDS", "CompiledStep", "GraphCounts", "MemoryEstimate", "NothingFits", "Plan",
    "StepMemory", "StepSpec", "compile_train_step", "estimate", "load_sweep",
    "loss_grad_abstract", "make_live_step", "plan_only_options",
    "param_count", "parse_budget", "plan", "save_sweep", "sweep", "train_step_abstract",
    "train_step_memory",
    "train_step_timeline",
]
