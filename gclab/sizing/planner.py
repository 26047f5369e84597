"""Memory planner: the technique settings that fit a budget in the least predicted time.

`plan(budget, model, task)` considers a ladder of `MemoryConfig`s (`ladder`)

  none, gather after matmul (gam), ratio:r (a small MILP picks how many steps to
  checkpoint), per-step, every:k / nested:k, + edge blocks, + processor edge blocks,
  + gam, deepmind, lean (nested remat, blocks everywhere, gam, streamed grid nodes),

predicts each one's peak with the analytical model (`gclab.sizing.analytical`) and its
step time with a speed model (`gclab.sizing.speed`: the step's FLOPs and bytes, counted
with recompute, in seconds by a calibration measured on the device or by the card's data
sheet), and takes the fastest that fits. Where compiling is quick, it verifies the
choice with XLA's compiled figure (`gclab.sizing.train_step_memory`), going on to the
next fastest until a compiled figure fits. With compiled figures in use, the returned
setting's compiled figure never exceeds `headroom x budget` (the budget is usable memory,
`gclab.devices`; a plan may take `FIT_MARGIN` of it by default).

A setting that saves memory and time at once (gather after matmul removes the
`[E, B, 3L]` concatenation and two thirds of each edge MLP's first-layer FLOPs) beats one
that saves memory by recomputing, whenever it fits.

Shapes: B batch, S processor steps, L latent, Ng grid nodes, Nm mesh nodes, E edges.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from typing import Any, Optional, Union

import jax
import numpy as np
import pandas as pd
from scipy.optimize import Bounds, LinearConstraint, milp

from gclab.config import ModelConfig, TaskConfig, a_kind, is_number
from gclab.devices import CARDS, FIT_MARGIN, card_usable_bytes, usable_bytes
from gclab.measure.compiled import GPU_PLATFORMS, format_bytes, plans_for_another_card
from gclab.memory.config import ACTIVATION_BYTES, PRECISIONS, RECIPES, MemoryConfig
from gclab.sizing import analytical
from gclab.sizing.speed import SpeedModel, card_name, present_device, speed_for
from gclab.sizing.step import StepSpec, train_step_memory

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
#: Largest budget accepted: 1 PiB, over ten thousand times the largest card in `CARDS`.
MAX_BUDGET = 2**50
#: The least budget taken: a smaller figure is far more often a unit left off ('1.5' for
#: '1.5GB') than memory one means to plan for; the smallest preset, cpu-4x32, needs 1.1 MiB
#: for its 70,739 parameters, gradients and AdamW state alone.
MIN_BUDGET = 2**20
BUDGET_HELP = ("a number of bytes (e.g. 1000000), a number with a unit (B, KB, MB, GB, TB "
               "for powers of 1000; KiB, MiB, GiB, TiB for powers of 1024; e.g. '16GiB', "
               "'12GB', '500MiB'), or a card (its usable memory): " + ", ".join(CARDS)
               + "; from 1 MiB to 1 PiB")
#: Auto mode compiles only grids up to this many nodes (2 deg: 16,380; 1 deg takes tens
#: of seconds per compile, 0.25 deg minutes).
AUTO_COMPILE_MAX_GRID_NODES = 70_000  # up to 1 deg: a compile takes seconds
#: Edge block sizes of the ladder.
EDGE_BLOCK = 65536


class NothingFits(ValueError):
    """No candidate setting fits the budget.

    Attributes:
      candidates: what was sized (the planner's candidate rows), so that a caller can
        show how far each one is from fitting; empty where the planner keeps none.
    """

    def __init__(self, message: str, candidates: Optional[list] = None):
        super().__init__(message)
        self.candidates = list(candidates or [])


def parse_budget(budget: Union[int, float, str]) -> int:
    """Usable bytes of a budget: a number, a string with a unit, or a card name.

    A card name gives the card's usable memory (`gclab.devices.card_usable_bytes`: JAX's
    pool, 0.75 of the card unless ``XLA_CLIENT_MEM_FRACTION``, or the older
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``, says otherwise).

    Raises:
      ValueError: an unknown card, unit or malformed string (names the accepted forms).
    """
    value = None
    if is_number(budget):
        value = float(budget)
    elif isinstance(budget, str):
        text = budget.strip()
        for name in CARDS:
            if text.lower() == name.lower():
                return card_usable_bytes(name)
        m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)(?:[eE](\d+))?\s*([A-Za-z]*)", text)
        if m and m.group(3).upper() in _UNITS:
            value = float(m.group(1) + (f"e{m.group(2)}" if m.group(2) else ""))
            value *= _UNITS[m.group(3).upper()]
    if value is None or not MIN_BUDGET <= value <= MAX_BUDGET:  # NaN and inf fail too
        raise ValueError(f"bad budget {budget!r}; accepted: {BUDGET_HELP}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The chosen setting and how it was chosen (the fastest that fits).

    Attributes:
      memory: the chosen techniques.
      label: a short name of the setting.
      predicted_peak_bytes: its peak (compiled total, or the modelled total).
      source: `compiled` or `modelled`.
      recompute_fraction: extra forward FLOPs over one forward pass.
      budget_bytes: the budget (the same as `usable_bytes`).
      usable_bytes: the budget: usable memory (for a card, JAX's pool on it), as
        `gclab.devices` defines it.
      plan_limit_bytes: what a plan may take: `headroom x usable_bytes`
        (`gclab.devices.FIT_MARGIN` by default), what the peak must stay under.
      candidates: every candidate considered (label, modelled and compiled bytes, recompute,
        predicted seconds, fits), fastest first.
      model: the model.
      task: the task.
      batch: B.
      rollout: T.
      milp: what the mixed-integer problem chose (steps checkpointed, edge blocks).
      predicted_seconds: the chosen setting's predicted step time.
      speed: the speed model that ranked the candidates (`gclab.sizing.speed`).
    """
    memory: MemoryConfig
    label: str
    predicted_peak_bytes: int
    source: str
    recompute_fraction: float
    budget_bytes: int
    usable_bytes: int
    plan_limit_bytes: int
    candidates: pd.DataFrame
    model: ModelConfig
    task: TaskConfig
    batch: int
    rollout: int
    milp: dict
    predicted_seconds: float = float("nan")
    speed: Optional[SpeedModel] = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary."""
        return {"label": self.label, "memory": dataclasses.asdict(self.memory),
                "predicted_peak_bytes": self.predicted_peak_bytes, "source": self.source,
                "recompute_fraction": self.recompute_fraction,
                "budget_bytes": self.budget_bytes, "usable_bytes": self.usable_bytes,
                "plan_limit_bytes": self.plan_limit_bytes,
                "milp": self.milp, "predicted_seconds": self.predicted_seconds,
                "speed": self.speed.to_dict() if self.speed else None,
                "candidates": json_records(self.candidates)}

    def explain(self) -> str:
        """The choice in words."""
        m = self.model
        lines = [
            f"Usable memory {format_bytes(self.usable_bytes)} (a plan may take "
            f"{format_bytes(self.plan_limit_bytes)}) for {m.resolution:g} deg / "
            f"{m.mesh_splits} splits, {m.processor_steps} x {m.latent_size}, "
            f"{self.task.num_levels} levels, batch {self.batch}, rollout {self.rollout}.",
            f"Chosen: {self.label} (processor remat {self.memory.remat_spec}"
            + (f", edge blocks of {self.memory.edge_block_size}"
               if self.memory.edge_block_size else "")
            + (", processor edge blocks" if self.memory.processor_edge_blocks else "")
            + (", gather after matmul" if self.memory.gather_after_matmul else "")
            + (", streamed grid nodes" if self.memory.stream_grid_nodes else "") + ").",
            f"Predicted peak {format_bytes(self.predicted_peak_bytes)} ({self.source}), "
            f"about {100 * self.recompute_fraction:.0f}% extra forward FLOPs.",
            f"Predicted step {_ms(self.predicted_seconds)} with "
            f"{self.speed.name if self.speed else 'no speed model'}"
            + (f"; {_ms(self._seconds_of('none'))} for none." if "none" in
               set(self.candidates["label"]) and self.label != "none" else "."),
        ]
        faster = self.candidates[self.candidates["predicted_seconds"]
                                 < self.predicted_seconds * (1 - 1e-9)]
        if len(faster):
            lines.append("Faster settings did not fit: " + ", ".join(
                f"{r.label} ({format_bytes(r.peak_bytes)}, {_ms(r.predicted_seconds)})"
                for r in faster.itertuples()) + ".")
        if self.milp.get("status") == "infeasible":
            lines.append("No mix of checkpointed processor steps and edge blocks fits by the "
                         "formula (the MILP is infeasible); the settings above come from the "
                         "ladder.")
        elif self.milp:
            lines.append(f"The MILP checkpoints {self.milp.get('steps', 0)} of "
                         f"{m.processor_steps} processor steps"
                         + (" with edge blocks" if self.milp.get("edge_blocks") else "")
                         + f" ({self.milp.get('status', '')}).")
        return "\n".join(lines)

    def _seconds_of(self, label: str) -> float:
        return float(self.candidates.loc[self.candidates["label"] == label,
                                         "predicted_seconds"].iloc[0])


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def json_records(df: pd.DataFrame) -> list:
    """DataFrame rows as JSON-able dicts (NaN as None)."""
    return [{k: (None if isinstance(v, float) and math.isnan(v) else
                 v.item() if hasattr(v, "item") else v) for k, v in r.items()}
            for r in df.to_dict(orient="records")]


def ladder(S: int, precision: str = "f32", rollout: int = 1) -> list[tuple[str, MemoryConfig]]:
    """The candidate settings before the MILP's mix, as `(label, MemoryConfig)`.

    Remat and edge blocks trade time for memory; gather after matmul (`+gam`) saves both,
    so it appears at several rungs. A rollout of more than one step adds every rung but
    `none` once more with each autoregressive step under its own checkpoint, labelled
    ``+rollout remat`` as `gclab.sizing.step.recipe_label` names it: ``deepmind+rollout
    remat`` is the step ``gclab memory --recipe deepmind --rollout T`` compiles
    (`recipe_memory`), ``deepmind`` the recipe's techniques without it.

    Args:
      S: processor steps (group sizes above S are left out).
      precision: `f32` or `bf16`.
      rollout: T, the autoregressive steps of the training step.
    """
    base = MemoryConfig(precision=precision)
    blocks = dict(edge_block_size=EDGE_BLOCK)
    step = base.replace(processor_remat="step")
    out = [("none", base), ("gam", base.replace(gather_after_matmul=True)),
           ("per-step", step), ("per-step+gam", step.replace(gather_after_matmul=True))]
    for k in sorted({2, 3, 4} & set(range(2, S + 1))):
        out.append((f"every:{k}", base.replace(processor_remat="every", remat_group_size=k)))
        out.append((f"nested:{k}", base.replace(processor_remat="nested", remat_group_size=k)))
    out += [
        ("per-step+blocks", step.replace(**blocks)),
        ("per-step+blocks+ckpt", step.replace(checkpoint_encoder=True,
                                              checkpoint_decoder=True, **blocks)),
        ("per-step+all-blocks", step.replace(processor_edge_blocks=True, **blocks)),
        ("per-step+all-blocks+gam", step.replace(processor_edge_blocks=True,
                                                 gather_after_matmul=True, **blocks)),
        ("deepmind", RECIPES["deepmind"].replace(precision=precision)),
        ("lean", RECIPES["lean"].replace(precision=precision)),
    ]
    if rollout > 1:
        out += [(f"{label}+rollout remat", m.replace(rollout_remat=True))
                for label, m in out if label != "none"]
    return out


def _milp(model, task, counts, limit, batch, rollout, precision, u, speed):
    """Which steps to checkpoint (and whether to use edge blocks) in the least time, within
    `limit` bytes (what a plan may take).

    Variables: x_i in {0, 1} checkpoints processor step i; y in {0, 1} turns on the
    encoder/decoder edge blocks. Memory is linear in them (from the analytical model:
    each checkpointed step trades its internals for its boundary; blocks remove the
    encoder/decoder edge internals), and so is the predicted time (`speed`: the
    recomputed forward FLOPs and bytes, and the change in bytes held).

    Returns:
      `(memory_config or None, info)`.
    """
    S = model.processor_steps
    base = MemoryConfig(precision=precision)

    def total(mem):
        return analytical.estimate(model, task, mem, batch=batch, rollout=rollout,
                                   counts=counts, activation_bytes=u).total_bytes

    def extra_seconds(mem, held):  # per rollout step, as the memory change
        work = analytical.stage_work(model, task, counts, batch, mem)
        runs = analytical.recompute_runs(mem, S)
        flops, moved = (sum(r * work[k][i] for k, r in runs.items()) for i in (0, 1))
        return rollout * speed.seconds_of(flops, u * moved, held)

    m0 = total(base)
    per_step = (total(base.replace(processor_remat="step")) - m0) / S  # < 0
    blocks_mem = base.replace(edge_block_size=EDGE_BLOCK)
    d_blocks = total(blocks_mem) - m0
    step_seconds = extra_seconds(base.replace(processor_remat="step"), S * per_step) / S
    c = np.array([step_seconds] * S + [extra_seconds(blocks_mem, d_blocks)])
    a = np.array([per_step] * S + [d_blocks])
    # Symmetry: checkpoint the first steps (x_i >= x_{i+1}), as `ratio` does.
    rows = [a]
    lo, hi = [-np.inf], [limit - m0]
    for i in range(S - 1):
        r = np.zeros(S + 1)
        r[i], r[i + 1] = 1, -1
        rows.append(r)
        lo.append(0)
        hi.append(np.inf)
    res = milp(c, constraints=LinearConstraint(np.array(rows), lo, hi),
               integrality=np.ones(S + 1), bounds=Bounds(0, 1))
    if res.x is None:
        return None, {"status": "infeasible"}
    x = np.round(res.x).astype(int)
    n, y = int(x[:S].sum()), bool(x[S])
    mem = base
    if n:
        mem = mem.replace(processor_remat="ratio", remat_ratio=n / S) if n < S else \
            mem.replace(processor_remat="step")
    if y:
        mem = mem.replace(edge_block_size=EDGE_BLOCK)
    return mem, {"status": "optimal", "steps": n, "edge_blocks": y,
                 "extra_seconds": float(res.fun)}


# Compiled once per process: plans at several budgets (a sweep of cards, say) share the
# candidates they compile; the figures of one backend do not change within a process, but
# those compiled for another card than the present GPU leave XLA's remat pass out.
@functools.lru_cache(maxsize=512)
def _compiled_total(model: ModelConfig, task: TaskConfig, mem: MemoryConfig, batch: int,
                    rollout: int, another_card: bool = False) -> int:
    with plans_for_another_card(another_card):
        return train_step_memory(StepSpec(model, task, mem, batch, rollout)).total_bytes


def for_another_card(budget: Union[int, float, str], total: int,
                     platform: Optional[str] = None) -> bool:
    """Whether a plan for `budget` (`total` usable bytes), compiled for devices of `platform`
    (default: the default backend's), is for another card than this machine's GPU: neither
    its allocator's limit nor the name of its card. XLA:GPU's remat pass targets the present
    card's memory: for another card's budget, the plan's compiles leave it out
    (`gclab.measure.compiled.plans_for_another_card`). `plan` and
    `gclab.sizing.layout_plan.plan_layout` (a host with several GPUs) ask it."""
    if (platform or jax.default_backend()) not in GPU_PLATFORMS:
        return False  # not compiled for a GPU: the pass is not run to fit memory
    if total == usable_bytes():
        return False
    named = card_name(budget)
    return named is None or named != present_device()


def plan(budget: Union[int, float, str], model: ModelConfig, task: TaskConfig, *,
         batch: int = 1, rollout: int = 1, precision: str = "f32",
         use_compiled: Union[bool, str] = "auto", headroom: float = FIT_MARGIN,
         speed: Optional[SpeedModel] = None) -> Plan:
    """The memory techniques that fit `budget` in the least predicted step time.

    Args:
      budget: usable bytes, a string such as '16GiB' / '12GB' / '500MiB', or a card in
        `CARDS` (its usable memory).
      model: geometry and network.
      task: channels.
      batch: B.
      rollout: T.
      precision: `f32` or `bf16`.
      use_compiled: True: verify with compiled figures (XLA on this machine; on a GPU,
        for a budget other than its own memory, without XLA's rematerialization pass,
        which would shrink them towards this card's memory); False: the analytical model
        only; `auto`: compiled where the grid has at most `AUTO_COMPILE_MAX_GRID_NODES`
        nodes.
      headroom: the fraction of the budget a peak may use (`gclab.devices.FIT_MARGIN`).
      speed: how candidates' step times are predicted (default
        `gclab.sizing.speed.speed_for`: the calibration recorded for the card `budget`
        names, or for the device JAX finds when it names none, else that card's data
        sheet).

    Returns:
      A `Plan`.

    Raises:
      NothingFits: no candidate fits (the message gives the smallest requirement found).
      ValueError: a bad budget or argument.
    """
    total = parse_budget(budget)
    analytical.check_step_arguments(model, task, MemoryConfig(), batch, rollout, "plan")
    if precision not in PRECISIONS:
        raise ValueError(f"plan: precision={precision!r} is invalid: one of "
                         + ", ".join(PRECISIONS))
    if not is_number(headroom) or not 0 < headroom <= 1:
        raise ValueError(f"headroom={headroom!r} is invalid: a number in (0, 1]")
    if use_compiled not in (True, False, "auto"):
        raise ValueError(f"use_compiled={use_compiled!r} is invalid: True, False or 'auto'")
    limit = int(headroom * total)  # what a plan may take of the usable `total`
    compiled = (model.num_grid_nodes <= AUTO_COMPILE_MAX_GRID_NODES
                if use_compiled == "auto" else bool(use_compiled))
    another_card = compiled and for_another_card(budget, total)
    counts = analytical.GraphCounts.for_model(model)
    u = ACTIVATION_BYTES[precision]

    cands = ladder(model.processor_steps, precision, rollout)
    if speed is None:
        speed = speed_for(card_name(budget), precision)
    elif not isinstance(speed, SpeedModel):
        raise ValueError(f"plan: speed must be a SpeedModel, not {a_kind(speed)}")
    milp_mem, milp_info = _milp(model, task, counts, limit, batch, rollout, precision, u,
                                speed)
    if milp_mem is not None and all(milp_mem != m for _, m in cands):
        label = (f"milp({milp_mem.remat_spec}" + (",blocks" if milp_mem.edge_block_size
                                                   else "") + ")")
        cands.insert(1, (label, milp_mem))
        if rollout > 1:  # its mix, each autoregressive step checkpointed too (as `ladder`)
            cands.insert(2, (f"{label}+rollout remat", milp_mem.replace(rollout_remat=True)))
    rows = []
    for label, mem in cands:
        e = analytical.estimate(model, task, mem, batch=batch, rollout=rollout, counts=counts,
                                activation_bytes=u)
        seconds = speed.seconds(StepSpec(model, task, mem, batch, rollout), counts)
        rows.append({"label": label, "memory": mem, "modelled_bytes": e.total_bytes,
                     "recompute": e.recompute_fraction, "predicted_seconds": seconds,
                     "compiled_bytes": np.nan})
    # Fastest first; among equally fast ones the smallest.
    rows.sort(key=lambda r: (r["predicted_seconds"], r["modelled_bytes"]))

    chosen = None
    for r in rows:
        if compiled:
            if r["modelled_bytes"] > 1.5 * limit:  # the model is rarely this far off
                continue
            r["compiled_bytes"] = _compiled_total(model, task, r["memory"], batch, rollout,
                                                  another_card)
            if r["compiled_bytes"] <= limit:
                chosen = r
                break
        elif r["modelled_bytes"] <= limit:
            chosen = r
            break
    table = pd.DataFrame([{k: v for k, v in r.items() if k != "memory"} for r in rows])
    table["peak_bytes"] = table["compiled_bytes"].where(table["compiled_bytes"].notna(),
                                                        table["modelled_bytes"])
    table["fits"] = table["peak_bytes"] <= limit
    if chosen is None:
        smallest = table["peak_bytes"].min()
        if compiled and table["compiled_bytes"].notna().any():
            smallest = table["compiled_bytes"].min()
        raise NothingFits(
            f"nothing fits: the smallest requirement found is {format_bytes(smallest)} "
            f"({'compiled' if compiled else 'modelled'}) but a plan may take "
            f"{format_bytes(limit)} ({headroom:g} x usable {format_bytes(total)})",
            # Rows of plain numbers, bools and None (pandas' JSON), as a report writes them.
            candidates=json.loads(table.to_json(orient="records")))
    peak = chosen["compiled_bytes"] if compiled else chosen["modelled_bytes"]
    return Plan(memory=chosen["memory"], label=chosen["label"],
                predicted_peak_bytes=int(peak), source="compiled" if compiled else "modelled",
                recompute_fraction=float(chosen["recompute"]), budget_bytes=total,
                usable_bytes=total, plan_limit_bytes=limit, candidates=table, model=model,
                task=task, batch=batch, rollout=rollout, milp=milp_info,
                predicted_seconds=float(chosen["predicted_seconds"]), speed=speed)
