"""Pipeline planner: the step split and each stage's checkpointing, chosen by MILP.

In a pipeline the stages are not alike: the first also holds the encoder, the last the
decoder, so one remat ratio for every stage wastes memory on some and time on others.
`plan_pipeline` chooses, for P stages over S processor steps and M micro-batches, how many
steps k_s each stage runs and how many n_s of them it checkpoints (the first n_s, each
under its own checkpoint: `ParallelConfig.stage_remat`), to minimise the predicted step
time under a per-device memory budget, and compares that with one ratio for all stages.

Memory of a stage comes from XLA's compiled analysis of that stage's own program (shapes
only): what one pipeline device runs under `gclab.parallel.pipeline.gpipe`, its stage in
each of the M + P - 1 ticks under a checkpoint that saves nothing, then the backward pass
tick by tick (`stage_program_memory`, whole parameters and their gradients included). It
holds each tick's incoming state until the backward pass, and a stage's internals during
one tick of it: those are what the stage's steps and their remat change. Five compiles
fit a model linear in the steps, `StageCosts`:

    memory_s = base_kind(s) + stored x (k_s - n_s) + checkpointed x n_s

with `kind` first (encoder), middle or last (decoder); the chosen stages are compiled
again to check the fit. The whole step, compiled as one SPMD program for every device,
holds the largest stage's program and what no stage program has (`step_extra_bytes`:
the optimizer's moments, the new parameters and moments, the batch, the outputs of every
tick), so `predicted_step_bytes` is the largest stage plus those; a test checks it
against the compiled step. Time is counted in ticks of the GPipe schedule: every tick
lasts as long as the slowest stage's work on one micro-batch,

    tick = max_s ((4 + r) W_s + n_s W_step + e_s) + state_bytes / link_bytes_per_s
    step = (M + P - 1) x tick,

W_s the time of stage s's forward on one micro-batch (its steps, plus encoder or
decoder), its FLOPs over flops_per_s plus the bytes its activations move over
memory_bytes_per_s (`gclab.sizing.analytical.stage_work`, the counts every other planner
of gclab ranks with): its forward, the forward again before the backward (the stage's
checkpoint), the backward (two forwards), one more forward per checkpointed step, and the
state a stage sends per tick over the link. What the recipe itself recomputes is counted
as for every other layout (`analytical.recompute_runs`): r more forwards under
`rollout_remat`, and e_s, the encoder's (first stage) or decoder's (last) reruns under
their checkpoints or edge blocks. The MILP (`scipy.optimize.milp`) has integer
k_s, n_s and a continuous tick t >= every stage's time; it minimises t. A stage
checkpoints none of its steps or at least two (`MIN_CHECKPOINTED`: one saves nothing
under the stage's checkpoint).
`brute_force` enumerates every split and setting (small cases, a check of the MILP),
`uniform` gives every stage the same ratio on the even split.

Shapes: S processor steps, P stages, M micro-batches, b = B / (data x M) samples each.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from gclab.config import ModelConfig, TaskConfig
from gclab.geometry.graphs import Graphs, graphs_for
from gclab.measure.compiled import (
    compile_timed,
    memory_of_compiled,
    plan_only_options,
    target_platform,
)
from gclab.memory.config import MemoryConfig, parse_remat_spec
from gclab.model.graphcast import graph_inputs, make_stage_network, param_shapes
from gclab.parallel.config import ParallelConfig
from gclab.parallel.pipeline import bubble_fraction
from gclab.sizing import analytical


@dataclasses.dataclass(frozen=True)
class StageCosts:
    """A pipeline stage's memory and time, linear in its steps (see the module docstring).

    Attributes:
      base: bytes of a stage with no steps: `{'first', 'middle', 'last'}`.
      stored: bytes each stored (not checkpointed) step adds.
      checkpointed: bytes each checkpointed step adds.
      step_seconds: one processor step's forward on one micro-batch (FLOPs and bytes
        moved).
      encoder_seconds, decoder_seconds: the encoder's and decoder's forward on one.
      link_seconds: sending one micro-batch's state to the next stage.
      forward_runs: more forwards of every stage the recipe runs (`rollout_remat`).
      encoder_runs, decoder_runs: more runs of the encoder (first stage) and decoder
        (last) the recipe's checkpoints or edge blocks make.
    """
    base: dict
    stored: float
    checkpointed: float
    step_seconds: float
    encoder_seconds: float
    decoder_seconds: float
    link_seconds: float = 0.0
    forward_runs: float = 0.0
    encoder_runs: float = 0.0
    decoder_runs: float = 0.0

    def kind(self, stage: int, stages: int) -> str:
        return "first" if stage == 0 else "last" if stage == stages - 1 else "middle"

    def memory(self, stage: int, stages: int, steps: int, checkpointed: int) -> float:
        """Predicted bytes of stage `stage` of `stages` with these steps."""
        return (self.base[self.kind(stage, stages)] + self.stored * (steps - checkpointed)
                + self.checkpointed * checkpointed)

    def seconds(self, stage: int, stages: int, steps: int, checkpointed: int) -> float:
        """Predicted seconds of one tick's work (forward and backward of one micro-batch)."""
        kind = self.kind(stage, stages)
        fixed = {"first": self.encoder_seconds, "last": self.decoder_seconds}.get(kind, 0.0)
        rerun = {"first": self.encoder_runs * self.encoder_seconds,
                 "last": self.decoder_runs * self.decoder_seconds}.get(kind, 0.0)
        # Forward, the stage's forward again (its checkpoint) and backward (twice a
        # forward), plus the checkpointed steps' second forward inside that backward and
        # what the recipe reruns.
        return ((4 + self.forward_runs) * (fixed + steps * self.step_seconds) + rerun
                + checkpointed * self.step_seconds + self.link_seconds)


@dataclasses.dataclass(frozen=True)
class StageChoice:
    """Steps and checkpointed steps of every stage, and what they cost.

    Attributes:
      stage_steps, stage_remat: per stage (`ParallelConfig.stage_steps`, `stage_remat`).
      memory_bytes: predicted bytes per stage.
      tick_seconds: the slowest stage's tick.
      step_seconds: (M + P - 1) ticks.
      recomputed_steps: checkpointed steps over all stages (each one extra forward per
        micro-batch).
      bubble: (P - 1) / (M + P - 1).
      fits: every stage within the budget.
    """
    stage_steps: tuple
    stage_remat: tuple
    memory_bytes: tuple
    tick_seconds: float
    step_seconds: float
    recomputed_steps: int
    bubble: float
    fits: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: The fewest steps a stage checkpoints, when it checkpoints any. Under the stage's own
#: checkpoint, one checkpointed step (a scan of one iteration) saves nothing: XLA removes
#: the loop and merges the step's recomputation with the stage's (a first stage of
#: `cpu-8x128` compiles to about as much with one of its 4 steps checkpointed as with
#: none, and far less with two).
MIN_CHECKPOINTED = 2


def checkpointable(n: int) -> bool:
    """Whether a stage may checkpoint `n` of its steps in a plan (0, or at least
    `MIN_CHECKPOINTED`)."""
    return n == 0 or n >= MIN_CHECKPOINTED


def evaluate(costs: StageCosts, steps: tuple, remat: tuple, microbatches: int,
             budget: float) -> StageChoice:
    """The cost of one choice of stage steps and checkpointed steps."""
    P = len(steps)
    mem = tuple(costs.memory(s, P, k, n) for s, (k, n) in enumerate(zip(steps, remat)))
    tick = max(costs.seconds(s, P, k, n) for s, (k, n) in enumerate(zip(steps, remat)))
    steps, remat = tuple(int(k) for k in steps), tuple(int(n) for n in remat)
    mem = tuple(float(m) for m in mem)
    return StageChoice(steps, remat, mem, float(tick), (microbatches + P - 1) * float(tick),
                       int(sum(remat)), bubble_fraction(P, microbatches),
                       all(m <= budget for m in mem))


def even_split(steps: int, stages: int) -> tuple:
    """`ParallelConfig`'s default split: as even as possible, earlier stages one more."""
    return tuple(int(b - a) for a, b in ParallelConfig(pipeline=stages).stage_bounds(steps))


def solve_milp(costs: StageCosts, steps: int, stages: int, microbatches: int,
               budget: float) -> Optional[StageChoice]:
    """The split and checkpointed steps of least predicted step time that fit, by MILP.

    Variables `[k_0..k_{P-1}, n_0..n_{P-1}, z_0..z_{P-1}, t, m]`: steps and checkpointed
    steps (integers), whether a stage checkpoints (binary: n_s is 0 or at least
    `MIN_CHECKPOINTED`), the tick t and the largest stage's bytes m (continuous). Ties in
    t are broken towards a smaller m (every device of the compiled step holds the largest
    stage's), then towards fewer checkpointed steps.

    Returns:
      The choice, or None when nothing fits.
    """
    P, S = stages, steps
    nv = 3 * P + 2  # k, n, z, t, m
    T, Mv = 3 * P, 3 * P + 1
    rows, lo, hi = [], [], []

    def row(entries: dict, low: float, high: float) -> None:
        r = np.zeros(nv)
        for i, v in entries.items():
            r[i] = v
        rows.append(r)
        lo.append(low)
        hi.append(high)

    # Units of order one for the solver's tolerances: time in processor steps, memory in
    # budgets.
    unit_s = costs.step_seconds if costs.step_seconds > 0 else 1.0
    unit_b = max(abs(budget), costs.stored, 1.0)
    row({s: 1 for s in range(P)}, S, S)  # the steps add up to S
    for s in range(P):
        kind = costs.kind(s, P)
        row({P + s: 1, s: -1}, -np.inf, 0)  # n_s <= k_s
        row({P + s: 1, 2 * P + s: -S}, -np.inf, 0)  # n_s = 0 unless z_s
        row({P + s: 1, 2 * P + s: -MIN_CHECKPOINTED}, 0, np.inf)  # z_s: n_s >= the least
        row({s: costs.stored / unit_b, P + s: (costs.checkpointed - costs.stored) / unit_b},
            -np.inf, (budget - costs.base[kind]) / unit_b)  # the stage fits
        row({s: costs.stored / unit_b, P + s: (costs.checkpointed - costs.stored) / unit_b,
             Mv: -1}, -np.inf, -costs.base[kind] / unit_b)  # it is at most m
        fixed = costs.seconds(s, P, 0, 0) / unit_s
        row({s: (4 + costs.forward_runs) * costs.step_seconds / unit_s,
             P + s: costs.step_seconds / unit_s, T: -1}, -np.inf, -fixed)  # tick <= t
    # Ties: m (in budgets, at most one) costs far less than any change of t (a step), and
    # a checkpointed step far less than a change of m by a thousandth of the budget; the
    # solver closes the gap fully, so that the ties hold.
    tie = 1e-8 / max(1, S)
    c = np.array([0.0] * P + [tie] * P + [0.0] * P + [1.0, 1e-3])
    lower = np.array([1] * P + [0] * P + [0] * P + [0.0, -np.inf])
    upper = np.array([S] * P + [S] * P + [1] * P + [np.inf, np.inf])
    integrality = np.array([1] * (3 * P) + [0, 0])
    res = milp(c, constraints=LinearConstraint(np.array(rows), lo, hi),
               integrality=integrality, bounds=Bounds(lower, upper),
               options={"mip_rel_gap": 0.0})
    if res.x is None:
        return None
    x = np.round(res.x).astype(int)
    return evaluate(costs, tuple(x[:P]), tuple(x[P:2 * P]), microbatches, budget)


def uniform(costs: StageCosts, steps: int, stages: int, microbatches: int,
            budget: float) -> StageChoice:
    """One remat ratio for every stage, on the even split: the least ratio that fits.

    Stage s checkpoints ceil(r k_s) of its k_s steps (`MemoryConfig`'s `ratio:r`), none
    where that is one step (it would save nothing, see `MIN_CHECKPOINTED`); r runs over
    the ratios that change some stage's count. When none fits, r = 1.
    """
    split = even_split(steps, stages)
    ratios = sorted({n / k for k in split for n in range(k + 1)})
    choice = None
    for r in ratios:
        remat = tuple(min(k, math.ceil(r * k - 1e-9)) for k in split)
        remat = tuple(n if checkpointable(n) else 0 for n in remat)
        choice = evaluate(costs, split, remat, microbatches, budget)
        if choice.fits:
            return choice
    return choice


def brute_force(costs: StageCosts, steps: int, stages: int, microbatches: int,
                budget: float) -> Optional[StageChoice]:
    """Every split and every stage's checkpointed steps (`checkpointable`): the fastest that
    fits (small cases)."""
    best = None
    for cuts in itertools.combinations(range(1, steps), stages - 1):
        split = tuple(np.diff((0,) + cuts + (steps,)).tolist())
        for remat in itertools.product(*([n for n in range(k + 1) if checkpointable(n)]
                                         for k in split)):
            choice = evaluate(costs, split, remat, microbatches, budget)
            if choice.fits and (best is None or choice.step_seconds < best.step_seconds - 1e-15):
                best = choice
    return best


# ---------------------------------------------------------------------------------------
# Compiled stage programs.


def stage_program_memory(model: ModelConfig, task: TaskConfig, memory: MemoryConfig,
                         layout: ParallelConfig, stage: int, microbatch: int,
                         graphs: Optional[Graphs] = None) -> int:
    """Compiled bytes (arguments + outputs + temp) of one stage's GPipe program, shapes only.

    The program is what one pipeline device runs (`gclab.parallel.pipeline.gpipe`) with
    its own stage in every tick: M + P - 1 ticks (M = `layout.microbatches` micro-batches
    of `microbatch` samples), each running the stage under a checkpoint that saves nothing,
    the state it returns fed to the next tick (as the next stage would receive it), then
    the backward pass, tick by tick: the stage run again and differentiated (gradients of
    the whole parameters). The cotangents of each tick's outputs are arguments scaled by
    the tick, so that none is known to be zero.
    """
    graphs = graphs if graphs is not None else graphs_for(model)
    C, O, M = task.data_channels, task.output_channels, layout.microbatches
    ticks = M + layout.pipeline - 1
    first, last = stage == 0, stage == layout.pipeline - 1
    sds = jax.ShapeDtypeStruct
    graph = jax.tree_util.tree_map(lambda a: sds(a.shape, a.dtype), graph_inputs(graphs))
    params = param_shapes(model, C, O)
    x = sds((graphs.num_grid_nodes, microbatch, C), jnp.float32)
    net0 = make_stage_network(model, C, O, memory, layout, 0)
    state = jax.eval_shape(net0.apply, params, graph, None, x)[0]
    net = make_stage_network(model, C, O, memory, layout, stage)
    out = jax.eval_shape(net.apply, params, graph, state, x)[1]
    xs = jax.tree_util.tree_map(lambda a: sds((M,) + a.shape, a.dtype), x) if first else None
    cotangents = (state, out if last else None)

    @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable)
    def run(params, graph, state, xs, t):  # as `gpipe` runs a stage in a tick
        x = None if xs is None else xs[jnp.minimum(t, M - 1)]
        return net.apply(params, graph, state, x)

    def program(params, graph, xs, state, cotangents):
        def total(params):
            def tick(carry, t):
                state, acc = carry
                state, out = run(params, graph, state, xs, t)
                scale = (t + 1).astype(jnp.float32)
                dots = [scale * jnp.vdot(a.astype(jnp.float32), b.astype(jnp.float32))
                        for a, b in zip(jax.tree_util.tree_leaves((state, out)),
                                        jax.tree_util.tree_leaves(cotangents))]
                return (state, acc + sum(dots)), None
            (_, acc), _ = jax.lax.scan(tick, (state, jnp.zeros((), jnp.float32)),
                                       jnp.arange(ticks))
            return acc
        return jax.grad(total)(params)

    # The options of the platform compiled for (`jax.default_device`, where a caller set it).
    compiled, seconds = compile_timed(program, (params, graph, xs, state, cotangents), {},
                                      compiler_options=plan_only_options(
                                          platform=target_platform()))
    return int(memory_of_compiled(compiled, seconds).total_bytes)


def step_extra_bytes(model: ModelConfig, task: TaskConfig, layout: ParallelConfig,
                     batch: int) -> int:
    """Bytes a pipeline device's training step holds besides its stage program.

    The optimizer's two moments, the new parameters and moments (float32, five times the
    parameters: the stage program has the parameters and their gradients), the batch of
    its data slice (inputs and targets, float32), the network's outputs of every tick
    (`[M + P - 1, Ng, b, O]`, which `gpipe` stacks on every device) and their cotangents,
    and the predictions of the data slice (`[Ng, B / data, O]`) and their cotangents, the
    loss's. One rollout step.
    """
    counts = analytical.GraphCounts.for_model(model)
    b = batch // layout.data  # samples of one data slice
    ticks = layout.microbatches + layout.pipeline - 1
    outputs = ticks * counts.grid_nodes * (b // layout.microbatches) * task.output_channels
    predictions = counts.grid_nodes * b * task.output_channels
    batch_values = counts.grid_nodes * b * (task.data_channels + task.output_channels)
    return 4 * (5 * analytical.param_count(model, task) + batch_values
                + 2 * (outputs + predictions))


def predicted_step_bytes(choice: "StageChoice", extra_bytes: float) -> float:
    """A pipeline step's predicted bytes per device: its largest stage and what every
    device holds besides (`step_extra_bytes`). Every device runs the same program, which
    holds the largest stage's internals, whichever stage it runs."""
    return max(choice.memory_bytes) + extra_bytes


def fit_stage_costs(model: ModelConfig, task: TaskConfig, memory: MemoryConfig,
                    microbatches: int, microbatch: int, flops_per_s: float,
                    link_bytes_per_s: float, graphs: Optional[Graphs] = None,
                    stages: int = 3, memory_bytes_per_s: float = math.inf) -> StageCosts:
    """`StageCosts` from five compiled stage programs and the model's FLOPs and bytes.

    Middle stages of 2 and 3 stored steps and of 3 checkpointed steps give the per-step
    bytes and a middle stage's base; first and last stages of 2 stored steps give theirs.
    Stages of one step, or one scan of one step, compile to less than the line through
    these (XLA simplifies a loop of one iteration), so the model is above them. The
    programs are those of a pipeline of `stages` stages (at least 3, for a middle stage;
    at most S - 2, for 3 steps in one): a device holds a state per tick, M + P - 1 of them,
    so where `stages` is more than the fit's pipeline has, the bases grow by a state per
    tick it lacks. Times count FLOPs at `flops_per_s` and the bytes activations move at
    `memory_bytes_per_s` (the default, infinite, counts FLOPs only).
    """
    graphs = graphs if graphs is not None else graphs_for(model)
    S = model.processor_steps
    if S < 5:
        raise ValueError(f"fitting stage costs needs 5 processor steps or more, not {S}")
    P = min(max(3, stages), S - 2)

    def compiled(stage, steps, checkpointed):
        rest = S - steps
        split = [steps if s == stage else 0 for s in range(P)]
        others = [s for s in range(P) if s != stage]
        for i in range(rest):  # the other stages' steps: they do not change this stage
            split[others[i % len(others)]] += 1
        remat = [checkpointed if s == stage else 0 for s in range(P)]
        layout = ParallelConfig(pipeline=P, microbatches=microbatches,
                                stage_steps=tuple(split), stage_remat=tuple(remat))
        return stage_program_memory(model, task, memory, layout, stage, microbatch, graphs)

    counts = analytical.GraphCounts.for_model(model, graphs.grid2mesh.num_edges)
    state_bytes = _state_bytes(model, memory, microbatch, counts)
    m2, m3, m3c = compiled(1, 2, 0), compiled(1, 3, 0), compiled(1, 3, 3)
    stored = m3 - m2
    base_mid = m2 - 2 * stored
    checkpointed = (m3c - base_mid) / 3
    more = state_bytes * max(0, stages - P)  # states of the ticks the fit's pipeline lacks
    base = {"middle": base_mid + more, "first": compiled(0, 2, 0) - 2 * stored + more,
            "last": compiled(P - 1, 2, 0) - 2 * stored + more}
    return StageCosts(base, float(stored), float(checkpointed),
                      **stage_times(model, task, memory, microbatch, flops_per_s,
                                    link_bytes_per_s, counts, memory_bytes_per_s))


def _state_bytes(model: ModelConfig, memory: MemoryConfig, microbatch: int,
                 counts: analytical.GraphCounts) -> int:
    """Bytes of the state one stage hands the next per micro-batch (grid, mesh nodes, mesh
    edges, each of the latent width)."""
    return memory.activation_bytes * microbatch * model.latent_size * (
        counts.grid_nodes + counts.mesh_nodes + counts.mesh_edges)


def stage_times(model: ModelConfig, task: TaskConfig, memory: MemoryConfig, microbatch: int,
                flops_per_s: float, link_bytes_per_s: float,
                counts: Optional[analytical.GraphCounts] = None,
                memory_bytes_per_s: float = math.inf) -> dict:
    """The time fields of `StageCosts` (no compile): each part's forward on one micro-batch
    of `microbatch` samples, FLOPs at `flops_per_s` and activation bytes at
    `memory_bytes_per_s`, a state's send at `link_bytes_per_s`, and what the recipe reruns
    (`analytical.recompute_runs`; its processor remat is the stages', `stage_remat`)."""
    counts = counts if counts is not None else analytical.GraphCounts.for_model(model)
    itemsize = memory.activation_bytes
    state_bytes = _state_bytes(model, memory, microbatch, counts)
    work = analytical.stage_work(model, task, counts, microbatch, memory)
    seconds = {part: flops / flops_per_s + itemsize * moved / memory_bytes_per_s
               for part, (flops, moved) in work.items()}
    runs = analytical.recompute_runs(memory.replace(processor_remat="none"),
                                     model.processor_steps)
    return {"step_seconds": seconds["processor_step"], "encoder_seconds": seconds["encoder"],
            "decoder_seconds": seconds["decoder"],
            "link_seconds": state_bytes / link_bytes_per_s, "forward_runs": runs["forward"],
            "encoder_runs": runs["encoder"], "decoder_runs": runs["decoder"]}


@dataclasses.dataclass(frozen=True)
class PipelineChoice:
    """The MILP's per-stage choice and one ratio for all stages, for one pipeline layout.

    Attributes:
      layout: the pipeline layout with the MILP's stage steps and remat (None when
        nothing fits).
      costs: the fitted `StageCosts`.
      stage_budget: bytes a stage program may take (the device's share of the plan
        minus what the step holds besides, `step_extra_bytes`).
      milp: the MILP's `StageChoice` (None when nothing fits).
      uniform: one ratio for all stages on the even split.
      compiled_milp, compiled_uniform: compiled bytes of each stage's program for both.
      extra_bytes: what the whole step holds per device besides a stage program
        (`step_extra_bytes`).
    """
    layout: Optional[ParallelConfig]
    costs: StageCosts
    stage_budget: float
    milp: Optional[StageChoice]
    uniform: StageChoice
    compiled_milp: tuple
    compiled_uniform: tuple
    extra_bytes: float = 0.0

    def predicted_step_bytes(self, choice: Optional[StageChoice] = None) -> Optional[float]:
        """Predicted bytes per device of the whole step of `choice` (default the MILP's)."""
        choice = self.milp if choice is None else choice
        return None if choice is None else predicted_step_bytes(choice, self.extra_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"parallel": None if self.layout is None else self.layout.spec,
                "costs": dataclasses.asdict(self.costs), "stage_budget": self.stage_budget,
                "milp": None if self.milp is None else self.milp.to_dict(),
                "uniform": self.uniform.to_dict(), "compiled_milp": list(self.compiled_milp),
                "compiled_uniform": list(self.compiled_uniform),
                "extra_bytes": self.extra_bytes}

    def explain(self) -> str:
        """Two lines: the MILP's stages and one ratio's."""
        def line(name, c, compiled):
            mem = "/".join(f"{m / 2**20:.1f}" for m in (compiled or c.memory_bytes))
            return (f"{name}: steps {'/'.join(map(str, c.stage_steps))}, checkpointed "
                    f"{'/'.join(map(str, c.stage_remat))}, {mem} MiB per stage"
                    f"{' (compiled)' if compiled else ''}, predicted {c.step_seconds * 1e3:.3g}"
                    f" ms, bubble {c.bubble:.0%}{'' if c.fits else ', does not fit'}")
        out = [line("one ratio", self.uniform, self.compiled_uniform)]
        out.append("per stage (MILP): nothing fits" if self.milp is None
                   else line("per stage (MILP)", self.milp, self.compiled_milp))
        return "\n".join(out)


def plan_pipeline(model: ModelConfig, task: TaskConfig, memory: MemoryConfig,
                  layout: ParallelConfig, batch: int, stage_budget: float,
                  flops_per_s: float, link_bytes_per_s: float,
                  graphs: Optional[Graphs] = None, compile_choices: bool = True,
                  costs: Optional[StageCosts] = None,
                  memory_bytes_per_s: float = math.inf) -> PipelineChoice:
    """The MILP's stage steps and per-stage remat for `layout` (its data, pipeline and
    microbatches), against one ratio for all stages.

    Args:
      model, task, memory: the step (`memory`'s processor remat is replaced per stage).
      layout: data x pipeline layout; `microbatches` of them per data slice.
      batch: the global batch (a multiple of data x microbatches).
      stage_budget: bytes each stage's program may take.
      flops_per_s, link_bytes_per_s: the card's speeds.
      graphs: the model's graphs.
      compile_choices: compile both choices' stage programs (else only predicted).
      costs: `StageCosts` already fitted for this micro-batch and number of stages
        (else fitted here).
      memory_bytes_per_s: the card's memory bandwidth (infinite: stage times count FLOPs
        only).
    """
    graphs = graphs if graphs is not None else graphs_for(model)
    S, P, M = model.processor_steps, layout.pipeline, layout.microbatches
    layout.check_batch(batch)
    # Each stage's remat takes the processor remat's place (`ParallelConfig.check_memory`).
    memory = memory.replace(**parse_remat_spec("none"))
    b = batch // (layout.data * M)
    if costs is None:
        costs = fit_stage_costs(model, task, memory, M, b, flops_per_s, link_bytes_per_s,
                                graphs, P, memory_bytes_per_s)
    chosen = solve_milp(costs, S, P, M, stage_budget)
    one = uniform(costs, S, P, M, stage_budget)

    def compiled(choice):
        if not compile_choices or choice is None:
            return ()
        lay = layout.replace(stage_steps=choice.stage_steps, stage_remat=choice.stage_remat)
        return tuple(stage_program_memory(model, task, memory, lay, s, b, graphs)
                     for s in range(P))

    best = None if chosen is None else layout.replace(stage_steps=chosen.stage_steps,
                                                      stage_remat=chosen.stage_remat)
    return PipelineChoice(best, costs, float(stage_budget), chosen, one, compiled(chosen),
                          compiled(one), float(step_extra_bytes(model, task, layout, batch)))
