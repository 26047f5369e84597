"""Layout planner: the device layout and memory recipe that fit a card in the least time.

`plan_layout(budget, model, task, devices)` compiles one training step (shapes only) for
every data x spatial layout of `devices` devices (`gclab.parallel.layouts`) and every
named recipe, and for every data x pipeline layout (`gclab.parallel.pipeline_layouts`,
one sample per micro-batch) each recipe's techniques with the stage split and per-stage
remat that `gclab.sizing.pipeline_plan`'s MILP chooses, keeps those whose per-device
compiled total fits the usable budget (`gclab.devices.fits`: a card stands for JAX's pool
on it, as everywhere in gclab), and picks the one with the least predicted step time:

    time = (F / flops_per_s + M / memory_bytes_per_s) / D  +  C / link_bytes_per_s

F and M are the FLOPs and bytes of one training step of the global batch (forward,
backward, recompute and optimizer: `gclab.sizing.analytical.step_work`, the counts the
single-device planner ranks with, `gclab.sizing.speed`), D the devices, and C the bytes
each device receives or reduces per step, read from the partitioned program's optimised
HLO (`gclab.parallel.collectives`). It assumes no overlap of compute and communication and
perfect balance between devices, so it ranks candidates; it does not promise seconds.
A pipeline's compute term is its GPipe schedule instead (`gclab.sizing.pipeline_plan`:
M + P - 1 ticks of its slowest stage, each stage's FLOPs and bytes at the same speeds),
once per autoregressive step, plus the optimizer's bytes over D; its C, like every other
layout's, is read from its compiled step (the states each tick sends included), so one
formula ranks every row, and a pipeline is never predicted faster than the same work
perfectly balanced over its devices.
XLA's own cost analysis is not used for F: it counts a loop body once, whatever its
trip count (the 16 processor steps are one `lax.scan`).

Card speeds are the vendors' published dense figures (`gclab.sizing.speed.CARD_SPEEDS`);
a budget given in bytes is ranked with `REFERENCE_CARD`'s speeds, and the explanation
says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Union

import jax

from gclab.config import ModelConfig, TaskConfig, require_kind
from gclab.devices import FIT_MARGIN, fits
from gclab.geometry.graphs import graphs_for
from gclab.measure.compiled import format_bytes, plans_for_another_card
from gclab.memory.config import PRECISIONS, RECIPES, MemoryConfig, get_recipe, parse_remat_spec
from gclab.parallel.config import layouts, pipeline_layouts
from gclab.sizing import analytical
from gclab.sizing.pipeline_plan import plan_pipeline, step_extra_bytes
from gclab.sizing.planner import NothingFits, for_another_card, parse_budget
from gclab.sizing.speed import CARD_SPEEDS, REFERENCE_CARD, CardSpeed, card_name
from gclab.sizing.step import StepSpec, compile_train_step, recipe_memory


@dataclasses.dataclass(frozen=True)
class LayoutPlan:
    """The chosen layout and recipe, and every candidate.

    Attributes:
      spec: the chosen step (its `parallel` is the layout, `memory` the recipe).
      recipe: the recipe's name.
      per_device_bytes: its compiled total per device (arguments + outputs + temp).
      predicted_seconds: its predicted step time (a ranking, see the module docstring).
      usable_bytes: usable memory per device: the budget (`gclab.sizing.planner.parse_budget`);
        a candidate fits when its plan is at most `plan_limit_bytes`.
      speeds_of: the card whose speeds ranked the candidates.
      candidates: one dict per layout x recipe (layout, recipe, per-device bytes,
        collective bytes, predicted seconds, fits, or why it was skipped).
    """
    spec: StepSpec
    recipe: str
    per_device_bytes: int
    predicted_seconds: float
    usable_bytes: int
    speeds_of: str
    candidates: list

    @property
    def plan_limit_bytes(self) -> int:
        """What a plan may take per device: `gclab.devices.FIT_MARGIN` of `usable_bytes`."""
        return int(FIT_MARGIN * self.usable_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"devices": self.spec.parallel.devices, "parallel": self.spec.parallel.spec,
                "recipe": self.recipe, "precision": self.spec.memory.precision,
                "batch": self.spec.batch, "per_device_bytes": self.per_device_bytes,
                "predicted_seconds": self.predicted_seconds,
                "usable_bytes": self.usable_bytes, "fit_margin": FIT_MARGIN,
                "plan_limit_bytes": self.plan_limit_bytes,
                "speeds_of": self.speeds_of, "candidates": self.candidates}

    def explain(self) -> str:
        s = self.spec
        lines = [f"Usable {format_bytes(self.usable_bytes)} per device (a plan fits within "
                 f"{FIT_MARGIN:.0%} of it), {s.parallel.devices} devices, {s.title()}.",
                 f"Chosen: layout {s.parallel.spec}, recipe {self.recipe} "
                 f"({s.memory.precision}): {format_bytes(self.per_device_bytes)} per device "
                 f"(compiled), predicted {self.predicted_seconds * 1e3:.3g} ms per step with "
                 f"{self.speeds_of}'s speeds.",
                 "Candidates:"]
        for c in self.candidates:
            if c.get("skipped"):
                lines.append(f"  {c['parallel']:<18} {c['recipe']:<9} skipped: {c['skipped']}")
                continue
            mark = "fits" if c["fits"] else "does not fit"
            lines.append(f"  {c['parallel']:<18} {c['recipe']:<9} "
                         f"{format_bytes(c['per_device_bytes']):>11} per device, "
                         f"{format_bytes(c['collective_bytes']):>11} collectives, "
                         f"{c['predicted_seconds'] * 1e3:9.3g} ms  {mark}")
            if "stages" in c:
                for name, st in (("per stage (MILP)", c["stages"]), ("one ratio", c["uniform"])):
                    mem = "/".join(format_bytes(m) for m in st["memory_bytes"])
                    lines.append(f"      {name}: steps {'/'.join(map(str, st['stage_steps']))}"
                                 f", checkpointed {'/'.join(map(str, st['stage_remat']))}, "
                                 f"{mem} predicted per stage, "
                                 f"{st['step_seconds'] * 1e3:.3g} ms, bubble "
                                 f"{st['bubble']:.0%}{'' if st['fits'] else ', does not fit'}")
        return "\n".join(lines)


def predicted_seconds(spec: StepSpec, collective_bytes: int, speed: CardSpeed,
                      counts: Optional[analytical.GraphCounts] = None) -> float:
    """The predicted step time of `spec` on cards of `speed` (see the module docstring).

    `counts` are the model's graph sizes (read from its cached graphs when not given).
    """
    counts = counts if counts is not None else analytical.GraphCounts.for_model(spec.model)
    flops_per_s = speed.f32_flops if spec.memory.precision == "f32" else speed.bf16_flops
    flops, moved = analytical.step_work(spec.model, spec.task, spec.memory, counts,
                                        spec.batch, spec.rollout)
    compute = (flops / flops_per_s + moved / speed.memory_bytes_per_s) / spec.parallel.devices
    return compute + collective_bytes / speed.link_bytes_per_s


def _cannot_run(step) -> dict:
    """A candidate's ``cannot_run`` field where its compiled step would hang (a pipeline
    whose stages would wait on each other: never chosen, whatever its memory)."""
    return {} if step.cannot_run is None else {"cannot_run": step.cannot_run}


def _pipeline_candidates(model, task, devices, batch, rollout, precision, recipes, usable,
                         speed, graphs, targets=None):
    """Rows of the data x pipeline layouts: each recipe's techniques with the processor remat
    of every stage and the step split chosen by `gclab.sizing.pipeline_plan` (one sample per
    micro-batch), checked by compiling the whole step on the layout.

    Predicted time (the module docstring): the pipeline's (M + P - 1) ticks of its slowest
    stage without their link time, once per autoregressive step, the optimizer's bytes,
    and the compiled step's collective bytes over the link.
    """
    seen, costs_cache = set(), {}
    flops = speed.f32_flops if precision == "f32" else speed.bf16_flops
    # The optimizer's bytes, as `analytical.step_work` counts them for every layout.
    optimizer_seconds = (analytical.optimizer_bytes(model, task) / speed.memory_bytes_per_s
                         / devices)
    for layout in pipeline_layouts(devices, model.processor_steps):
        for recipe in recipes or list(RECIPES):
            memory = recipe_memory(recipe, precision, rollout=rollout)  # as every command
            # Each stage's remat takes the processor remat's place (as `plan_pipeline`).
            memory = memory.replace(**parse_remat_spec("none"))
            row = {"parallel": layout.spec, "recipe": recipe}
            if (layout.spec, memory) in seen:
                continue
            seen.add((layout.spec, memory))
            if batch % layout.data:
                yield {**row, "skipped": f"batch {batch} is not a multiple of "
                       f"data:{layout.data}"}, None, None
                continue
            if model.processor_steps < 5:
                yield {**row, "skipped": "the stage planner needs 5 processor steps or "
                       "more"}, None, None
                continue
            lay = layout.replace(microbatches=batch // layout.data)
            # A stage program holds the parameters and their gradients; the whole step
            # also the optimizer's moments, the new parameters and moments, the batch.
            stage_budget = usable * FIT_MARGIN - step_extra_bytes(model, task, lay, batch)
            key = (memory, lay.microbatches, lay.pipeline)
            choice = plan_pipeline(model, task, memory, lay, batch, stage_budget, flops,
                                   speed.link_bytes_per_s, graphs, compile_choices=False,
                                   costs=costs_cache.get(key),
                                   memory_bytes_per_s=speed.memory_bytes_per_s)
            costs_cache[key] = choice.costs
            row = {**row, "parallel": lay.spec, "uniform": choice.uniform.to_dict(),
                   "stage_budget": stage_budget}
            if choice.layout is None:
                yield {**row, "skipped": "no split and per-stage remat fits the stage "
                       "budget"}, None, None
                continue
            spec = StepSpec(model, task, memory, batch=batch, rollout=rollout,
                            parallel=choice.layout)
            step = compile_train_step(spec, graphs, devices=targets)
            need = step.memory.total_bytes
            coll = int(step.memory.collective_bytes)
            ticks = lay.microbatches + lay.pipeline - 1
            compute = choice.milp.step_seconds - ticks * choice.costs.link_seconds
            seconds = (rollout * compute + optimizer_seconds
                       + coll / speed.link_bytes_per_s)
            yield {**row, "parallel": choice.layout.spec, "per_device_bytes": need,
                   "collective_bytes": coll, "predicted_seconds": seconds,
                   "fits": fits(need, usable) and step.cannot_run is None,
                   "stages": choice.milp.to_dict(), **_cannot_run(step)}, spec, seconds


def compile_devices(n: int) -> list:
    """The `n` devices a layout of `n` is compiled on: the default backend's where it has that
    many (a machine of eight GPUs), else the simulated CPU devices (a machine with one GPU
    plans eight-device layouts on its CPU, as chapter 8 does).

    Raises:
      ValueError: neither backend has `n` devices (one line: how to get simulated ones).
    """
    found = jax.devices()
    if len(found) >= n:
        return found[:n]
    cpu = jax.devices("cpu")
    if len(cpu) >= n:
        return cpu[:n]
    have = (f"{len(cpu)} cpu" if jax.default_backend() == "cpu"
            else f"{len(found)} {jax.default_backend()}, {len(cpu)} cpu")
    raise ValueError(f"plan_layout: devices={n} is more than this process has "
                     f"({have}): ask for "
                     f"{n} simulated CPU devices before JAX starts "
                     "(gclab.parallel.use_cpu_devices, or gclab plan --devices)")


def _sized_candidates(model, task, devices, batch, rollout, precision, recipes, usable, speed,
                      graphs, counts, candidate_layouts, targets):
    """Every layout and recipe of `plan_layout` compiled on `targets`, and the best that fits
    as (spec, recipe, seconds, bytes), or None."""
    candidates, best = [], None
    for layout in candidate_layouts:
        for recipe in recipes or list(RECIPES):
            row = {"parallel": layout.spec, "recipe": recipe}
            memory = recipe_memory(recipe, precision, rollout=rollout)  # as every command
            if batch % (layout.data * memory.microbatches):
                candidates.append({**row, "skipped": f"batch {batch} is not a multiple of "
                                   f"data:{layout.data}"})
                continue
            spec = StepSpec(model, task, memory, batch=batch, rollout=rollout,
                            parallel=layout)
            step = compile_train_step(spec, graphs, devices=targets)
            need = step.memory.total_bytes
            coll = int(step.memory.collective_bytes)
            seconds = predicted_seconds(spec, coll, speed, counts)
            ok = fits(need, usable) and step.cannot_run is None
            candidates.append({**row, "per_device_bytes": need, "collective_bytes": coll,
                               "predicted_seconds": seconds, "fits": ok,
                               **_cannot_run(step)})
            if ok and (best is None or seconds < best[2]):
                best = (spec, recipe, seconds, need)
    # The stage programs compile on the same backend as the whole steps.
    with jax.default_device(targets[0]):
        for row, spec, seconds in _pipeline_candidates(model, task, devices, batch, rollout,
                                                       precision, recipes, usable, speed,
                                                       graphs, targets):
            candidates.append(row)
            if row.get("fits") and (best is None or seconds < best[2]):
                best = (spec, row["recipe"], seconds, row["per_device_bytes"])
    return candidates, best


def plan_layout(budget: Union[int, float, str], model: ModelConfig, task: TaskConfig,
                devices: int, *, batch: int = 1, rollout: int = 1, precision: str = "f32",
                recipes: Optional[list[str]] = None) -> LayoutPlan:
    """The layout and recipe of least predicted step time whose compiled plan fits.

    Args:
      budget: usable memory per device: bytes, a string such as '60GB', or a card of
        `gclab.devices.CARDS` (its usable memory).
      model, task: the model.
      devices: the number of devices, compiled on those of `compile_devices` (the default
        backend's, else simulated CPU devices: the process must offer at least this many,
        see `gclab.parallel.use_cpu_devices`).
      batch: the global batch; layouts whose data axis does not divide it are skipped.
      rollout: autoregressive steps.
      precision: `f32` or `bf16`.
      recipes: named recipes to consider (default: all of `RECIPES`).

    Raises:
      ValueError: a bad budget, device count, model, task, batch, rollout, precision or
        recipe list (`gclab.config.WrongType` for one of the wrong kind).
      NothingFits: no layout and recipe fits (the message lists the smallest).
    """
    usable = parse_budget(budget)
    analytical.check_step_arguments(model, task, MemoryConfig(), batch, rollout,
                                    "plan_layout")
    if precision not in PRECISIONS:
        raise ValueError(f"plan_layout: precision={precision!r} is invalid: one of "
                         + ", ".join(PRECISIONS))
    if recipes is not None:
        # A str would be read letter by letter, and an empty list would mean every recipe.
        require_kind("recipes", recipes, (list, tuple), "a list of recipe names, or None for "
                     "every recipe", "plan_layout:")
        if not recipes:
            raise ValueError("plan_layout: recipes=[] is invalid: at least one recipe name, "
                             "or None for every recipe")
        for name in recipes:
            get_recipe(name, precision)  # an unknown name: one line listing the known ones
    card = card_name(budget)
    speeds_of = card if card in CARD_SPEEDS else REFERENCE_CARD
    speed = CARD_SPEEDS[speeds_of]
    graphs = graphs_for(model)
    counts = analytical.GraphCounts.for_model(model, graphs.grid2mesh.num_edges)
    candidate_layouts = list(layouts(devices))  # checks `devices`
    targets = compile_devices(devices)
    # On a host of several GPUs, a plan for another card's budget leaves XLA:GPU's remat
    # pass out, as `plan` does: the pass would shrink it towards the present card's memory.
    with plans_for_another_card(for_another_card(budget, usable, targets[0].platform)):
        candidates, best = _sized_candidates(model, task, devices, batch, rollout, precision,
                                             recipes, usable, speed, graphs, counts,
                                             candidate_layouts, targets)
    if best is None:
        sized = [c for c in candidates if not c.get("skipped")]
        if not sized:
            raise NothingFits(f"no layout of {devices} devices divides batch {batch}",
                              candidates)
        least = min(sized, key=lambda c: c["per_device_bytes"])
        raise NothingFits(f"nothing fits {FIT_MARGIN:.0%} of {format_bytes(usable)} usable per "
                          f"device: the smallest is "
                          f"{least['parallel']} with {least['recipe']}, "
                          f"{format_bytes(least['per_device_bytes'])} per device", candidates)
    spec, recipe, seconds, need = best
    return LayoutPlan(spec, recipe, need, seconds, usable, speeds_of, candidates)
