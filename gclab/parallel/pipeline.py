"""Pipeline stages over the `pipeline` mesh axis: a GPipe schedule of micro-batches.

JAX offers the pieces (`shard_map`, `ppermute`) but no pipeline schedule, so the schedule
is written here (the pattern of JAX's `shard_map` tutorial). Nothing here knows GraphCast:
`gpipe` runs P stage functions, stage s on the s-th device of the `pipeline` axis, over M
micro-batches, with `jax.shard_map` (manual over `pipeline` only, so `data` and `spatial`
stay with the compiler's automatic partitioning and the network's sharding marks keep
working inside a stage) and `jax.lax.ppermute` to hand each micro-batch's state from one
stage to the next. The network (`gclab.model.graphcast`) builds the stages: the encoder
and the first processor steps, then consecutive steps, the last steps and the decoder.

The schedule (GPipe, Huang et al. 2019) runs T = M + P - 1 ticks. At tick t, stage s works
on micro-batch t - s when 0 <= t - s < M and is idle otherwise (in an SPMD program an
idle stage still computes, on a state whose result is discarded, so the idle ticks cost
time, not correctness); then every stage sends its state to the next:

    tick       0    1    2    3    4         (P = 3 stages, M = 3 micro-batches)
    stage 0   m0   m1   m2    .    .
    stage 1    .   m0   m1   m2    .
    stage 2    .    .   m0   m1   m2   -> outputs of m0, m1, m2 at ticks 2, 3, 4

The backward pass is the transpose of this loop (JAX differentiates through the scan over
ticks and the `ppermute`s): the same ticks in reverse order, gradients flowing from the
last stage to the first. Each stage is busy M of the T ticks of each pass, so the
*bubble*, the fraction of a step a stage idles, is (P - 1) / (M + P - 1) (`bubble_fraction`);
a stage holds what the backward pass needs of the M micro-batches it ran (and of its
P - 1 idle ticks) until the backward pass reaches them.

Each micro-batch's contribution is computed exactly as without the pipeline; outputs of
idle ticks are never read, so their gradients are exact zeros, and the loss and gradients
equal one device's up to the order of float32 sums. Parameters enter every stage whole
(each stage reads its own steps' slice; GraphCast's parameters are small next to its
activations), and their gradients are summed over the stages by the transpose of
`shard_map`'s replicated inputs.

Memory: in this SPMD program every device runs the same code, so each compiles to the
same buffers, whichever stage it runs. Every stage therefore runs under a checkpoint that
saves nothing (GPipe's own re-materialisation, Huang et al. 2019): across ticks the
backward pass keeps only each tick's inputs (the state received and the tick's index; the
micro-batches are read inside the stage, so they are kept once), which are of one type
for every stage, and it runs each tick's stage again just before that tick's backward, so
a stage's internals, under its own remat (`ParallelConfig.stage_remat`), live during one
tick of the backward pass. A device thus holds M + P - 1 states and the largest stage's
one-tick internals; without the checkpoint, JAX keeps the residuals of a switch's
branches side by side where their shapes or dtypes differ (stages of different step
counts or remat, encoder against decoder), for all M + P - 1 ticks, far above any stage's
own need. The price is one more forward of every stage per micro-batch.
`gclab.sizing.pipeline_plan` sizes each stage's program the same way, and
`benchmarks/pipeline_memory.py` records both with the compiled whole step.

Shapes: M micro-batches, P stages, T = M + P - 1 ticks; a stage's state and output are
whatever its functions take and return.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from typing import Any, Callable, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from gclab.config import require_count
from gclab.parallel.collectives import branch_collectives
from gclab.parallel.config import PIPELINE_AXIS, ParallelConfig

# The layout whose pipeline the network runs while a step is traced (`use_pipeline`).
_PIPELINE = contextvars.ContextVar("gclab_pipeline", default=None)


def bubble_fraction(stages: int, microbatches: int) -> float:
    """(P - 1) / (M + P - 1): the fraction of a GPipe step each stage idles.

    Raises:
      ValueError: `stages` or `microbatches` not an integer >= 1 (no stage or no
        micro-batch is no schedule; the formula would give a negative fraction).
    """
    stages = require_count("stages", stages, 1, "bubble_fraction")
    microbatches = require_count("microbatches", microbatches, 1, "bubble_fraction")
    return (stages - 1) / (microbatches + stages - 1)


@contextlib.contextmanager
def use_pipeline(layout: Optional[ParallelConfig]) -> Iterator[None]:
    """Makes the network run `layout`'s pipeline while a step is traced (None: no pipeline)."""
    token = _PIPELINE.set(layout if layout is not None and layout.pipeline > 1 else None)
    try:
        yield
    finally:
        _PIPELINE.reset(token)


def active_pipeline() -> Optional[ParallelConfig]:
    """The layout whose pipeline is in use (`use_pipeline`), when a mesh with a `pipeline`
    axis of its size is set; else None."""
    layout = _PIPELINE.get()
    mesh = jax.sharding.get_abstract_mesh()
    if layout is None or mesh.empty or PIPELINE_AXIS not in mesh.axis_names:
        return None
    size = dict(zip(mesh.axis_names, mesh.axis_sizes))[PIPELINE_AXIS]
    if size != layout.pipeline:
        raise ValueError(f"the mesh's pipeline axis has {size} devices, the layout "
                         f"{layout.spec} {layout.pipeline} stages")
    return layout


def gpipe(stages: Sequence[Callable], params: Any, xs: Any, state: Any,
          microbatches: int) -> Any:
    """Runs `stages` as a GPipe pipeline over the `pipeline` axis of the active mesh.

    Args:
      stages: P functions `stage(params, state, x) -> (state, out)`. Stage 0 reads the
        micro-batch `x` and ignores `state`; stage s > 0 continues from the state stage
        s - 1 returned; the last stage's `out` is the result (the others return zeros of
        its shape and dtype). Every stage returns a state of the same structure. One
        function may stand at several places (stages that run one program, telling
        themselves apart by `jax.lax.axis_index(PIPELINE_AXIS)`): it is one branch of the
        switch, so it is traced, differentiated and compiled once.
      params: a pytree every stage receives whole (e.g. the network's parameters).
      xs: a pytree of micro-batches, each leaf `[M, ...]`.
      state: a pytree of zeros shaped like the state passed between stages (what stage
        s > 0 receives at an idle tick).
      microbatches: M.

    Returns:
      The last stage's outputs, each leaf `[M, ...]` (micro-batch m at index m).

    Raises:
      ValueError: no stage, `microbatches` not an integer >= 1, or a leaf of `xs` whose
        leading dimension is not `microbatches` (stage 0 reads micro-batch
        min(t, M - 1) at tick t, so a mismatch would silently drop or repeat
        micro-batches). Checked on static shapes while tracing: nothing waits on a device.
    """
    M = require_count("microbatches", microbatches, 1, "gpipe")
    if len(stages) == 0:
        raise ValueError(f"gpipe stages={stages!r} is invalid: at least one stage function")
    for path, leaf in jax.tree_util.tree_leaves_with_path(xs):
        shape = tuple(jnp.shape(leaf))
        if not shape or shape[0] != M:
            raise ValueError(f"gpipe xs{jax.tree_util.keystr(path)} of shape {shape} is "
                             f"invalid: every leaf of xs is [microbatches, ...] = [{M}, ...]")
    P = len(stages)
    ticks = M + P - 1
    forward = [(i, i + 1) for i in range(P - 1)]  # stage s sends to stage s + 1

    def branch(stage):
        # Each stage runs under a checkpoint that saves nothing (GPipe's
        # re-materialisation): the backward pass keeps only each tick's inputs and runs the
        # stage again, tick by tick, before its backward. The micro-batch is read inside, so
        # that those inputs are the state received and the tick (the micro-batches are
        # kept once, not once per tick). They are of one type for every stage, so the
        # switch keeps one set per tick, and a stage's internals live during one tick of
        # the backward pass only. Every stage's results differ from device to device
        # (`shard_map`'s varying type), so that the branches have one type.
        def run(params, state, xs, t):
            # Stage 0 reads micro-batch t (after the last one it reruns micro-batch M - 1,
            # and that result is never read).
            x = jax.tree_util.tree_map(lambda a: a[jnp.minimum(t, M - 1)], xs)
            return _varying(stage(params, state, x))
        return jax.checkpoint(run, policy=jax.checkpoint_policies.nothing_saveable)

    # One branch per distinct function: tracing, differentiating and compiling a switch
    # cost a branch each, so P stages of three kinds (first, middle, last) cost three.
    kinds = list(dict.fromkeys(stages))
    branches = [branch(stage) for stage in kinds]
    kind_of_stage = jnp.asarray([kinds.index(stage) for stage in stages], jnp.int32)  # [P]

    def per_device(params, xs, state):
        s = jax.lax.axis_index(PIPELINE_AXIS)
        # Cast here, outside the switch: the transpose of a cast is a sum over `pipeline`
        # (the parameters' gradients summed over the stages), a collective that every
        # device must join, so none may sit inside a branch only one stage takes (one the
        # compiler puts there is refused before a step runs: `check_stage_collectives`).
        params, xs, state = _varying((params, xs, state))

        def tick(state, t):
            # Each device runs its own stage's program (own steps, own remat), picked by
            # its index on the `pipeline` axis.
            state, out = jax.lax.switch(kind_of_stage[s], branches, params, state, xs, t)
            state = jax.lax.ppermute(state, PIPELINE_AXIS, forward)
            return state, out

        _, outs = jax.lax.scan(tick, state, jnp.arange(ticks))  # [T, ...] leaves
        # The last stage emits micro-batch t - (P - 1) at tick t.
        return jax.tree_util.tree_map(lambda a: a[None, P - 1:], outs)  # [1, M, ...]

    run = jax.shard_map(per_device, in_specs=(PartitionSpec(), PartitionSpec(),
                                              PartitionSpec()),
                        out_specs=PartitionSpec(PIPELINE_AXIS), axis_names={PIPELINE_AXIS})
    outs = run(params, xs, state)  # [P, M, ...] leaves
    return jax.tree_util.tree_map(lambda a: a[-1], outs)  # [M, ...] from the last stage


def switch_branches(jaxpr: Any) -> list:
    """The number of branches of every switch (`cond`) in `jaxpr`, nested ones included, in
    the order met: for a traced pipelined step, what `gpipe` traces and compiles per tick.

    Args:
      jaxpr: a `jax.extend.core.Jaxpr` (e.g. `jax.jit(f).trace(*args).jaxpr.jaxpr`).
    """
    counts = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "cond":
            counts.append(len(eqn.params["branches"]))
        for value in eqn.params.values():
            for v in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(v, "jaxpr", v)  # a ClosedJaxpr's jaxpr, or a Jaxpr
                if hasattr(inner, "eqns"):
                    counts += switch_branches(inner)
    return counts


class StagesWouldHang(ValueError):
    """A pipelined step whose compiled program would hang (`check_stage_collectives`).

    Attributes:
      spec: the layout's spec (`ParallelConfig.spec`).
      reason: what is wrong and what to do, without the layout's name (for a caller that
        names the option it came from).
    """

    def __init__(self, spec: str, reason: str):
        super().__init__(f"layout {spec} cannot run: {reason}")
        self.spec, self.reason = spec, reason


# Steps of an op_name that say nothing of where in the network an instruction comes from.
_PLUMBING = {"closed_call", "checkpoint", "rematted_computation", "while", "body", "cond",
             "shard_map"}


def stage_collectives_error(hlo_text: str, layout: ParallelConfig) -> Optional[str]:
    """Why a compiled step of `layout` would hang, or None when it would not.

    `gpipe` keeps its own collectives out of the switch of stages: each device runs only its
    own stage's branch. The compiler may still put one inside a branch when it reshards an
    array the network marks over `spatial` (`gclab.parallel.split_rows`): a
    collective-permute where rows do not split evenly (mesh nodes over a spatial size that
    does not divide their count, the padded edge blocks of `MemoryConfig.edge_block_size`).
    Its rendezvous waits for every device of the program (XLA:CPU's), and the devices of
    the other stages, running their own branch, never come: the step waits forever (on
    XLA:CPU it aborts after 40 s). Such a permute is looked for in the optimised HLO
    (`gclab.parallel.collectives.branch_collectives`); the other collectives of a stage
    (all-reduce, all-gather over `spatial` or `data`) wait only for their own group's
    devices, which run the same stage.

    Args:
      hlo_text: the optimised HLO of the compiled step (`Compiled.as_text()`).
      layout: its layout; without a pipeline (`pipeline` 1) the answer is None.
    """
    if layout.pipeline <= 1:
        return None
    found = branch_collectives(hlo_text, ("collective-permute",))
    if not found:
        return None
    where = next((w for w in map(_within_stage, found) if w), None)
    one = f" (one in {where})" if where else ""
    return (f"the compiler put {len(found)} collective-permute(s) inside the pipeline's "
            f"stages{one}, to reshard rows that do not split evenly over "
            f"spatial:{layout.spatial} (or padded edge blocks); every device must join one, but "
            "the devices of the other stages run their own stage, so the stages would wait on "
            "each other forever: use mesh-nodes:replicated, a spatial size that divides the "
            "mesh's node count (and the grid's and each edge set's), or no edge blocks")


def _within_stage(op_name: str) -> str:
    """The last steps of `op_name` inside a stage's branch (`encoder/jit(_pad)/pad`), or
    '' where it names no step inside one."""
    parts = op_name.split("/")
    starts = [i for i, p in enumerate(parts) if re.fullmatch(r"branch_\d+_fun", p)]
    if not starts:
        return ""
    return "/".join([p for p in parts[starts[-1] + 1:] if p not in _PLUMBING][-3:])


def check_stage_collectives(hlo_text: str, layout: ParallelConfig) -> None:
    """Raises `StagesWouldHang` where a compiled step of `layout` would hang
    (`stage_collectives_error`); to be called before the step runs."""
    reason = stage_collectives_error(hlo_text, layout)
    if reason is not None:
        raise StagesWouldHang(layout.spec, reason)


def _varying(tree: Any) -> Any:
    """`tree` with every leaf typed as varying over the `pipeline` axis."""
    def cast(a):
        if PIPELINE_AXIS in jax.typeof(a).mat.varying:
            return a
        return jax.lax.pcast(a, PIPELINE_AXIS, to="varying")
    return jax.tree_util.tree_map(cast, tree)
