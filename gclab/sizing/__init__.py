"""Sizing: one compiled training step, the memory formula, sweeps and the planner.

| module | what it is for |
|---|---|
| `step` | `StepSpec` and one compiled training step: memory, timeline, a runnable step |
| `analytical` | the memory formula (bytes by stage, from graph counts and switches) |
| `sweep` | a grid of configurations x techniques, compiled or measured, cached |
| `speed` | predicted step time: FLOPs and bytes in seconds (calibrated, or a data sheet) |
| `planner` | the technique settings that fit a memory budget in the least predicted time |
| `layout_plan` | the layout (data x spatial, data x pipeline) and recipe of least predicted time |
| `pipeline_plan` | each pipeline stage's steps and remat by MILP, against one ratio for all |
"""

from gclab.sizing.analytical import GraphCounts, MemoryEstimate, estimate, param_count
from gclab.sizing.planner import CARDS, NothingFits, Plan, ladder, parse_budget, plan
from gclab.sizing.speed import SpeedModel, data_sheet, load_calibration, speed_for
from gclab.sizing.step import (
    CompiledStep,
    StepMemory,
    StepSpec,
    compile_train_step,
    estimate_step_bytes,
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
    "SpeedModel", "StepMemory", "StepSpec", "compile_train_step", "data_sheet", "estimate",
    "estimate_step_bytes",
    "ladder", "load_calibration", "load_sweep", "speed_for",
    "loss_grad_abstract", "make_live_step", "plan_only_options",
    "param_count", "parse_budget", "plan", "save_sweep", "sweep", "train_step_abstract",
    "train_step_memory",
    "train_step_timeline",
]
