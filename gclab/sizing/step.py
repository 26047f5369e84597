"""One training step of any configuration, from shapes alone: compiled memory, timeline.

A `StepSpec` names a model, a task, the memory techniques, a batch size, a rollout
length and a layout over devices (`gclab.parallel.ParallelConfig`). `recipe_memory` gives
the techniques of a named recipe with the options every command applies to it, and
`recipe_label` names them as that recipe and what the options changed.
`train_step_memory(spec)` compiles one full training step (loss + gradients + AdamW
update, via `gclab.training`) from `jax.ShapeDtypeStruct`s, so nothing is allocated and
the 0.25 deg model can be sized on a laptop; only the graphs are built (cached on disk).
With a layout of several devices the step is partitioned (`gclab.training.layout`) and
XLA's memory figures are those of one device; the bytes its collectives move per step are
read from the optimised HLO (`gclab.parallel.collectives`). The devices may be simulated
CPU devices (`gclab.parallel.use_cpu_devices`).

Shapes: B batch, Ng grid nodes, C data channels, O outputs, T rollout steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gclab import training
from gclab.config import (
    MAX_INT32,
    ModelConfig,
    TaskConfig,
    WrongType,
    a_kind,
    is_int,
    require_count,
    require_kind,
)
from gclab.devices import usable_bytes
from gclab.geometry.graphs import Graphs, graphs_for
from gclab.limits import MAX_PLANNED_BYTES, host_memory_bytes, require_fits
from gclab.measure.compiled import (
    GPU_PLATFORMS,
    CompiledMemory,
    compile_timed,
    memory_of_compiled,
    plan_only_options,
    plans_for_another_card,
)
from gclab.measure.timeline import compile_with_timeline
from gclab.memory.config import (
    RECIPES,
    MemoryConfig,
    get_recipe,
    parse_remat_spec,
    recipe_name,
)
from gclab.model.graphcast import graph_inputs, make_network, param_shapes
from gclab.parallel.collectives import collective_bytes
from gclab.parallel.config import ParallelConfig
from gclab.parallel.pipeline import StagesWouldHang, stage_collectives_error
from gclab.parallel.sharding import make_mesh, use_layout
from gclab.sizing.analytical import GraphCounts, estimate, param_count

#: The processor remat fields of a `MemoryConfig` (those a remat spec sets), which a label
#: names as one remat spec.
_REMAT_FIELDS = tuple(parse_remat_spec("none"))
#: The fields that only edge blocks use: a label's "no edge blocks" covers them.
_BLOCK_FIELDS = ("processor_edge_blocks", "stream_grid_nodes")


def recipe_memory(name: str, precision: str = "f32", *, rollout: int = 1,
                  remat: Optional[str | dict] = None,
                  edge_block: Optional[int] = None) -> MemoryConfig:
    """The memory techniques of recipe `name` as every gclab command runs it.

    One rule for `gclab memory`, `timeline`, `sweep` and `train` (and `grid`), so that a
    recipe's name means the same step in each: a rollout of more than one step runs each
    autoregressive step under its own checkpoint (`rollout_remat`) in every recipe but
    `none`, which uses no technique at all.

    Args:
      name: a recipe (`none`, `per-step`, `deepmind`, `lean`).
      precision: `f32` or `bf16`.
      rollout: T, the autoregressive steps of the training step.
      remat: a processor remat spec (`every:2`, see `parse_remat_spec`) or its parsed
        fields, replacing the recipe's.
      edge_block: edges per block (an integer, not a bool), replacing the recipe's; 0 turns
        edge blocks off, and with them what needs them (processor edge blocks, streamed grid
        nodes).

    Raises:
      ValueError: an unknown recipe or precision, a `rollout` that is not an integer >= 1,
        a malformed `remat` (a dict may name the processor remat fields only), or an
        `edge_block` that is not an integer >= 0 (`WrongType` for a value of another kind).
    """
    rollout = require_count("rollout", rollout, 1, caller="recipe_memory:")
    memory = get_recipe(name, precision)
    changes = {}
    if remat is not None:
        require_kind("remat", remat, (str, dict), "a remat spec (str) or a dict of "
                     + ", ".join(_REMAT_FIELDS), caller="recipe_memory:")
        unknown = [k for k in remat if k not in _REMAT_FIELDS] if isinstance(remat, dict) else []
        if unknown:
            raise ValueError(f"recipe_memory: remat={remat!r} is invalid: a dict of "
                             f"{', '.join(_REMAT_FIELDS)} only, not {unknown[0]!r}")
        changes.update(parse_remat_spec(remat) if isinstance(remat, str) else remat)
    if edge_block is not None:
        # An integer: False or 0.0 for "off" would read as a typo of something else.
        edge_block = require_count("edge_block", edge_block, 0, caller="recipe_memory:")
        changes["edge_block_size"] = edge_block or None
        if not edge_block:  # no blocks: nor what needs them
            changes.update(dict.fromkeys(_BLOCK_FIELDS, False))
    if rollout > 1 and name != "none":
        changes["rollout_remat"] = True
    return memory.replace(**changes) if changes else memory


def _switch(field: str, value) -> str:
    words = field.replace("_", " ")
    if isinstance(value, bool):
        return words if value else f"no {words}"
    return f"{words} {value}"


def recipe_label(name: str, memory: MemoryConfig) -> str:
    """Recipe `name` and what `memory` changes of it (at `memory`'s precision, not named),
    joined by '+': `per-step+rollout remat`, `lean+remat every:2`, `deepmind+no edge blocks`,
    or `name` alone where `memory` is that recipe."""
    base = get_recipe(name, memory.precision)
    parts = [name]
    if any(getattr(memory, f) != getattr(base, f) for f in _REMAT_FIELDS):
        parts.append(f"remat {memory.remat_spec}")
    blocks_off = memory.edge_block_size is None and base.edge_block_size is not None
    if memory.edge_block_size != base.edge_block_size:
        parts.append("no edge blocks" if blocks_off else f"edge block {memory.edge_block_size}")
    for field in dataclasses.fields(MemoryConfig):
        f = field.name
        if (f in _REMAT_FIELDS or f == "edge_block_size" or (blocks_off and f in _BLOCK_FIELDS)
                or getattr(memory, f) == getattr(base, f)):
            continue
        parts.append(_switch(f, getattr(memory, f)))
    return "+".join(parts)


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """One training step: model, task, memory techniques, batch size, rollout length, layout.

    Batch and rollout are integers in 1..`MAX_INT32` (numpy integers are stored as int).
    `batch` is the global batch: with `parallel.data` > 1 each data slice holds
    `batch / parallel.data` samples. `recipe`, where given, is the named recipe `memory`
    was made from (`recipe_memory`): labels name it and what was changed of it. It is a
    name only: it takes no part in comparing specs, nor in `to_json` (nor in the sweep
    cache's keys, made from it), which the step compiled depends on alone.
    """
    model: ModelConfig
    task: TaskConfig
    memory: MemoryConfig = MemoryConfig()
    batch: int = 1
    rollout: int = 1
    parallel: ParallelConfig = ParallelConfig()
    recipe: Optional[str] = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.recipe is not None and (not isinstance(self.recipe, str)
                                        or self.recipe not in RECIPES):
            error = ValueError if isinstance(self.recipe, str) else WrongType
            raise error(f"StepSpec.recipe={self.recipe!r} is invalid: None or one of "
                        + ", ".join(RECIPES))
        for field, kind in (("model", ModelConfig), ("task", TaskConfig),
                            ("memory", MemoryConfig)):
            require_kind(f"StepSpec.{field}", getattr(self, field), kind)
        for field in ("batch", "rollout"):
            v = getattr(self, field)
            if not is_int(v) or not 1 <= v <= MAX_INT32:
                error = ValueError if is_int(v) else WrongType
                raise error(f"StepSpec.{field}={v!r} is invalid: an integer >= 1 "
                            f"(and <= {MAX_INT32}).")
            object.__setattr__(self, field, int(v))
        if self.batch % self.memory.microbatches:
            raise ValueError(f"StepSpec.batch={self.batch} is invalid: it must be a multiple "
                             f"of MemoryConfig.microbatches={self.memory.microbatches}.")
        require_kind("StepSpec.parallel", self.parallel, ParallelConfig)
        multiple = self.parallel.data * self.memory.microbatches * self.parallel.microbatches
        if self.batch % multiple:
            raise ValueError(f"StepSpec.batch={self.batch} is invalid: it must be a multiple of "
                             f"ParallelConfig.data x MemoryConfig.microbatches x "
                             f"ParallelConfig.microbatches = {multiple}.")
        if self.parallel.pipeline > 1:
            try:
                self.parallel.stage_bounds(self.model.processor_steps)
            except ValueError as e:
                raise ValueError(f"StepSpec.parallel={self.parallel.spec} is invalid: {e}") \
                    from None

    def memory_label(self) -> str:
        """The techniques and precision: `recipe_label` of `recipe` where one is given
        (`per-step+rollout remat (f32)`), else the recipe name if the techniques equal one,
        else a short description."""
        name = self._recipe_label()
        if name is not None:
            return f"{name} ({self.memory.precision})"
        return f"custom ({self.memory.precision}, remat {self.memory.remat_spec})"

    def technique(self) -> str:
        """Short technique label: `recipe_label` of `recipe` where one is given, else the
        recipe name (`lean`, `lean/bf16`) or `custom`."""
        name = self._recipe_label() or "custom"
        return name if self.memory.precision == "f32" else f"{name}/{self.memory.precision}"

    def _recipe_label(self) -> Optional[str]:
        if self.recipe is not None:
            return recipe_label(self.recipe, self.memory)
        return recipe_name(self.memory)

    def to_json(self) -> dict:
        """A JSON-able dict that `StepSpec.from_json` turns back into this spec.

        The layout appears only when it has several devices, so one-device records (and
        the sweep cache keys made from them) are those of before layouts existed.
        """
        record = {"model": dataclasses.asdict(self.model),
                  "levels": list(self.task.pressure_levels),
                  "precipitation_input": self.task.precipitation_input,
                  "memory": dataclasses.asdict(self.memory), "batch": self.batch,
                  "rollout": self.rollout}
        if self.parallel.devices > 1:
            record["parallel"] = dataclasses.asdict(self.parallel)
        return record

    @classmethod
    def from_json(cls, record: dict) -> "StepSpec":
        """The spec of a `to_json` dict.

        Raises:
          ValueError: `record` is not a `to_json` dict (missing or unknown keys, bad values).
        """
        try:
            task = TaskConfig(tuple(record["levels"]), record["precipitation_input"])
            return cls(ModelConfig(**record["model"]), task, MemoryConfig(**record["memory"]),
                       record["batch"], record["rollout"],
                       ParallelConfig(**record.get("parallel", {})))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a StepSpec.to_json() record ({type(e).__name__}: {e})"
                             ) from None

    def title(self) -> str:
        m = self.model
        title = (f"{m.resolution:g} deg / {m.mesh_splits} splits, {m.processor_steps} x "
                 f"{m.latent_size}, {self.task.num_levels} levels, batch {self.batch}, "
                 f"rollout {self.rollout}, {self.memory_label()}")
        if self.parallel.devices > 1:
            title += f", {self.parallel.devices} devices ({self.parallel.spec})"
        return title

    def describe(self) -> dict:
        """The resolved config as a flat JSON-able dict (with `devices` and `parallel`)."""
        return {**{f"model.{k}": v for k, v in dataclasses.asdict(self.model).items()},
                "task.levels": self.task.num_levels,
                "task.precipitation_input": self.task.precipitation_input,
                **{f"memory.{k}": v for k, v in dataclasses.asdict(self.memory).items()},
                "batch": self.batch, "rollout": self.rollout,
                "devices": self.parallel.devices, "parallel": self.parallel.spec}


@dataclasses.dataclass(frozen=True)
class StepMemory(CompiledMemory):
    """`CompiledMemory` of a training step, with the model's parameter count.

    With a layout of several devices every byte figure is per device, and
    `collective_bytes` is what the step's collectives move per device (0 on one device).
    """
    num_params: int = 0
    collective_bytes: int = 0


def _abstract(tree):
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), tree)


def spec_graphs(spec: StepSpec, graphs: Optional[Graphs] = None, caller: str = "") -> Graphs:
    """`graphs` if they are `spec.model`'s, or the model's own (`graphs_for`) where None.

    Graphs of another geometry would size (or run) a step of another model under this
    spec's name, so they are refused: the geometry they record (resolution, mesh splits,
    radius fraction) and their node and edge counts must be the model's.

    Raises:
      ValueError: graphs of another geometry (`WrongType` for something not a `Graphs`),
        in one line that starts with `caller` (a function's name) where given.
    """
    if graphs is None:
        return graphs_for(spec.model)
    require_kind("graphs", graphs, Graphs, "None or the model's Graphs (graphs_for)",
                 caller=caller, optional=True)
    m = spec.model
    wanted = (("resolution", m.resolution, graphs.resolution),
              ("mesh_splits", m.mesh_splits, graphs.mesh_splits),
              ("radius_query_fraction_edge_length", m.radius_query_fraction_edge_length,
               graphs.radius_query_fraction_edge_length),
              ("grid nodes", m.num_grid_nodes, graphs.num_grid_nodes),
              ("mesh nodes", m.num_mesh_nodes, graphs.num_mesh_nodes),
              ("mesh edges", m.num_mesh_edges, graphs.mesh.num_edges),
              ("mesh2grid edges", m.num_mesh2grid_edges, graphs.mesh2grid.num_edges))
    for what, model_value, value in wanted:
        if value != model_value:
            where = f"{caller} " if caller else ""
            raise ValueError(f"{where}graphs is invalid: graphs of spec.model's geometry "
                             f"(graphs_for(spec.model)), and these have {what} {value!r}, "
                             f"not {model_value!r}")
    return graphs


def train_step_abstract(spec: StepSpec, graphs: Optional[Graphs] = None):
    """The jittable training step and its arguments as `ShapeDtypeStruct`s.

    Returns:
      `(step_fn, (state, graph, example))`: `step_fn(state, graph, example) -> (state,
      metrics)`, donating `state` when `spec.memory.donate`.
    """
    graphs = spec_graphs(spec, graphs, "train_step_abstract")
    graph = _abstract(graph_inputs(graphs))
    net = make_network(spec.model, spec.task.data_channels, spec.task.output_channels,
                       spec.memory)
    optimizer = training.make_optimizer(training.TrainConfig())
    ng = graphs.num_grid_nodes
    example = training.example_shapes(spec.task, ng, spec.batch, spec.rollout)
    params = param_shapes(spec.model, spec.task.data_channels, spec.task.output_channels)
    state = jax.eval_shape(lambda p: training.init_state_from_params(p, optimizer), params)
    weights = training.loss_weights(spec.task, graphs.grid_lat, graphs.n_lon)
    step = training.train_step_fn(net, optimizer, spec.task, spec.memory, spec.rollout,
                                  weights)
    return step, (state, graph, example)


def train_step_memory(spec: StepSpec, graphs: Optional[Graphs] = None) -> StepMemory:
    """XLA's compiled memory of one training step of `spec`, from shapes alone."""
    _require_spec(spec, "train_step_memory")
    return compile_train_step(spec, spec_graphs(spec, graphs, "train_step_memory")).memory


def train_step_timeline(spec: StepSpec, graphs: Optional[Graphs] = None):
    """The memory timeline (`gclab.measure.timeline.Timeline`) of one training step of `spec`."""
    _require_spec(spec, "train_step_timeline")
    graphs = spec_graphs(spec, graphs, "train_step_timeline")
    return compile_train_step(spec, graphs, timeline=True).timeline


@dataclasses.dataclass(frozen=True)
class CompiledStep:
    """What one compile of a training step gives (see `compile_train_step`).

    Attributes:
      spec: the step.
      memory: XLA's compiled memory figures.
      timeline: the memory timeline (`gclab.measure.timeline.Timeline`), if asked for.
      run: if asked for, a zero-argument callable that runs one real training step on
        random state and a random batch, blocks until it is done and returns the step's
        metrics as host values (`{"loss", "grad_norm"}`, 0-d NumPy arrays); each call
        continues from the state the call before it left.
      collectives: bytes per device moved by each kind of collective in one step
        (`gclab.parallel.collectives.collective_bytes`; all 0 on one device).
      cannot_run: why the compiled step would hang if run, with a pipeline whose stages
        would wait on each other forever
        (`gclab.parallel.pipeline.stage_collectives_error`); None when it can run.
    """
    spec: StepSpec
    memory: StepMemory
    timeline: Any = None
    run: Optional[Callable[[], dict]] = None
    collectives: Optional[dict] = None
    cannot_run: Optional[str] = None


def estimate_step_bytes(spec: StepSpec, graphs: Optional[Graphs] = None) -> int:
    """The modelled total bytes of one training step (`gclab.sizing.analytical.estimate`)."""
    graphs = spec_graphs(spec, graphs, "estimate_step_bytes")
    counts = GraphCounts.for_model(spec.model, graphs.grid2mesh.num_edges)
    return estimate(spec.model, spec.task, spec.memory, batch=spec.batch, rollout=spec.rollout,
                    counts=counts, activation_bytes=4).total_bytes


def device_memory_bytes() -> Optional[int]:
    """Memory of the default device: its allocator's limit, or on CPU the host's memory."""
    return usable_bytes() or host_memory_bytes()


def check_step_size(spec: StepSpec, graphs: Optional[Graphs] = None) -> None:
    """Refuses, before compiling, a step too large for XLA to plan.

    Raises:
      gclab.limits.TooLarge: the modelled total (`estimate_step_bytes`) is beyond
        `gclab.limits.MAX_PLANNED_BYTES`, where XLA's byte counts could overflow and abort.
    """
    require_fits(f"one training step of {spec.title()}", estimate_step_bytes(spec, graphs),
                 MAX_PLANNED_BYTES, "what gclab asks XLA to plan (XLA counts bytes in 64-bit "
                 "integers and aborts on overflow)")


def compile_train_step(spec: StepSpec, graphs: Optional[Graphs] = None, *,
                       timeline: bool = False, live: bool = False,
                       seed: int = 0,
                       run_if: Optional[Callable[[StepMemory], bool]] = None,
                       devices: Optional[Sequence] = None) -> CompiledStep:
    """Compiles one training step of `spec` once, for any of memory, timeline and runs.

    Args:
      spec: the step.
      graphs: the model's graphs (built or loaded from the cache if None); graphs of
        another geometry are refused.
      timeline: also read the memory timeline from XLA's buffer assignment.
      live: compile for real arrays (random state and batch, seeded by `seed`) and
        return a runnable step; the memory figures are the same as from shapes.
      seed: seed of the random state and batch when `live` (an integer >= 0).
      run_if: with `live`, a test of the compiled memory: when it returns False, nothing
        is allocated and the returned step has no `run` (a plan that does not fit). On a
        GPU such a guarded compile leaves XLA's rematerialization pass out, so that the
        plan of a step too large for the card is its own, not what that pass reached (a
        step that fits is the same program either way).
      devices: the devices of a layout's mesh (default `jax.devices()`), or for one device
        the first of them, whose backend compiles it; e.g. a machine with one GPU plans a
        layout of 8, and the one-device step it is compared with, on its simulated CPU
        devices, `jax.devices("cpu")`.

    Returns:
      A `CompiledStep`.

    Raises:
      ValueError: a bad argument, before compiling (`WrongType` for one of the wrong kind):
        `graphs` of another geometry than `spec.model`'s (`spec_graphs`), a `seed` that is
        not an integer >= 0, `devices` that are not a non-empty sequence of JAX devices, or
        `run_if` or a `seed` other than 0 without `live` (they shape a live step only).
      gclab.limits.TooLarge: before compiling, a step too large to plan
        (`check_step_size`); with `live`, before allocating, a compiled step larger than
        the device's memory (`device_memory_bytes`).
      gclab.parallel.pipeline.StagesWouldHang: with `live` (and a run that `run_if`
        allows), before allocating, a pipelined step that would hang (`cannot_run`).
    """
    caller = "compile_train_step"
    _require_spec(spec, caller)
    for name, value in (("timeline", timeline), ("live", live)):
        require_kind(name, value, bool, "True or False", caller=caller)
    seed = require_count("seed", seed, 0, caller=caller)
    if run_if is not None and not callable(run_if):
        raise WrongType(f"{caller} run_if is invalid: None or a callable of the compiled "
                        f"memory, not {a_kind(run_if)}")
    # Both only shape a live step: without one they would be dropped without a word.
    if not live and (run_if is not None or seed != 0):
        given = "run_if" if run_if is not None else f"seed={seed}"
        raise ValueError(f"{caller} {given} is invalid without live=True: it applies to a "
                         "live step only")
    if devices is not None:
        devices = _device_list(devices, caller)
    graphs = spec_graphs(spec, graphs, caller)
    check_step_size(spec, graphs)
    step, base = train_step_abstract(spec, graphs)
    args, mesh = base, None
    if spec.parallel.devices > 1:
        mesh = make_mesh(spec.parallel, devices)
        args = training.abstract_step_args(mesh, *base)
    donate = (0,) if spec.memory.donate else ()
    # The options of the devices compiled for (a layout on simulated CPU devices beside a GPU
    # gets the CPU's), not of the default backend.
    target = (mesh.devices.flat[0] if mesh is not None
              else list(devices)[0] if devices is not None else None)
    platform = None if target is None else target.platform
    on_gpu = (platform or jax.default_backend()).lower() in GPU_PLATFORMS
    if live and run_if is not None and on_gpu:
        # A guarded step runs only where its plan fits, so XLA:GPU's rematerialization pass,
        # which shrinks a program above the card's limit towards it, could only make the plan
        # of a step that is refused anyway the pass's figure instead of the step's own: it is
        # left out (as for a plan for another card). Elsewhere a live compile keeps XLA's
        # defaults.
        with plans_for_another_card(True):
            options = plan_only_options(platform=platform)
    else:
        options = None if live else plan_only_options(platform=platform)
    lines = None
    with contextlib.ExitStack() as stack:
        # Traced with one of the target devices as JAX's default device (a CPU beside a GPU;
        # `use_layout` sets one of the mesh's): what the step decides by platform (bfloat16
        # scan residuals as bits, XLA:CPU only) follows the devices compiled for.
        if mesh is not None:
            stack.enter_context(use_layout(mesh, spec.parallel))
        elif devices is not None:
            stack.enter_context(jax.default_device(list(devices)[0]))
        if timeline:
            compiled, seconds, lines = compile_with_timeline(
                step, *args, donate_argnums=donate, name=spec.memory_label(),
                compiler_options=options)
        else:
            compiled, seconds = compile_timed(step, args, {}, donate_argnums=donate,
                                              compiler_options=options)
    m = memory_of_compiled(compiled, seconds)
    hlo = compiled.as_text() if mesh is not None else ""
    collectives = collective_bytes(hlo)
    cannot_run = stage_collectives_error(hlo, spec.parallel)
    memory = StepMemory(**dataclasses.asdict(m), num_params=param_count(spec.model, spec.task),
                        collective_bytes=collectives["total"])
    if not live or (run_if is not None and not run_if(memory)):
        return CompiledStep(spec, memory, lines, None, collectives, cannot_run)
    if cannot_run is not None:
        raise StagesWouldHang(spec.parallel.spec, cannot_run)
    require_fits(f"running one training step of {spec.title()}", memory.total_bytes,
                 device_memory_bytes(), f"this {jax.default_backend()} device's memory")
    real = _random_args(base, graphs, seed)
    if mesh is not None:
        real = training.place_step_args(mesh, *real)
    return CompiledStep(spec, memory, lines, _runner(compiled, real, mesh), collectives)


def _require_spec(spec: object, caller: str) -> None:
    if not isinstance(spec, StepSpec):
        raise WrongType(f"{caller} spec must be a StepSpec, not {a_kind(spec)}")


def _device_list(devices: object, caller: str) -> list:
    """`devices` as a list, if they are a non-empty sequence of JAX devices."""
    allowed = "a non-empty sequence of JAX devices (jax.devices())"
    if isinstance(devices, (str, bytes, dict)) or not isinstance(devices, (Sequence,
                                                                          np.ndarray)):
        raise WrongType(f"{caller} devices is invalid: {allowed}, not {a_kind(devices)}")
    listed = list(np.ravel(np.asarray(devices, dtype=object))) \
        if isinstance(devices, np.ndarray) else list(devices)
    if not listed:
        raise ValueError(f"{caller} devices=[] is invalid: {allowed}")
    for i, device in enumerate(listed):
        if not isinstance(device, jax.Device):
            raise WrongType(f"{caller} devices[{i}] is invalid: {allowed}, not "
                            f"{a_kind(device)}")
    return listed


def _random_args(abstract_args, graphs: Graphs, seed: int):
    """Real (state, graph, example): random parameters and batch of the abstract shapes,
    and the optimizer state its `init` gives (zeros).

    The values only feed timed and measured steps, so they are drawn on the host with
    NumPy's generator (seeded by `seed`): `jax.random` compiles one kernel per distinct
    shape, 3.9 s for a cpu-scale state on 2 cores (18 s as one jitted program), against
    0.4 s here.
    """
    state_s, _, example_s = abstract_args
    rng = np.random.default_rng(seed)

    def zeros(s):
        return jax.device_put(np.zeros(s.shape, s.dtype))

    def fill(s):
        if jnp.issubdtype(s.dtype, jnp.floating):
            return jax.device_put((0.1 * rng.standard_normal(s.shape, np.float32)).astype(s.dtype))
        return zeros(s)

    # Random parameters, and the optimizer state that `init` gives (zero moments and
    # counts): random second moments are negative, their square root NaN, and every step
    # after the first would time and return NaNs.
    state = state_s._replace(params=jax.tree_util.tree_map(fill, state_s.params),
                             opt_state=jax.tree_util.tree_map(zeros, state_s.opt_state),
                             step=zeros(state_s.step))
    return state, graph_inputs(graphs), jax.tree_util.tree_map(fill, example_s)


def _runner(compiled, args, mesh=None) -> Callable[[], dict]:
    holder = {"state": args[0]}

    def run() -> dict:
        with contextlib.ExitStack() as stack:
            if mesh is not None:
                stack.enter_context(jax.set_mesh(mesh))
            holder["state"], metrics = compiled(holder["state"], *args[1:])
        jax.block_until_ready(metrics)
        return jax.device_get(metrics)

    return run


def loss_grad_abstract(spec: StepSpec, graphs: Optional[Graphs] = None):
    """`(loss_fn, (params, graph, example))` with abstract arguments, for saved residuals."""
    graphs = spec_graphs(spec, graphs, "loss_grad_abstract")
    graph = _abstract(graph_inputs(graphs))
    net = make_network(spec.model, spec.task.data_channels, spec.task.output_channels,
                       spec.memory)
    example = training.example_shapes(spec.task, graphs.num_grid_nodes, spec.batch,
                                      spec.rollout)
    params = param_shapes(spec.model, spec.task.data_channels, spec.task.output_channels)
    weights = training.loss_weights(spec.task, graphs.grid_lat, graphs.n_lon)
    loss = functools.partial(training.rollout_loss, net=net, task=spec.task,
                             memory=spec.memory, rollout=spec.rollout, weights=weights)
    return loss, (params, graph, example)


def make_live_step(spec: StepSpec, seed: int = 0, graphs: Optional[Graphs] = None) -> Callable:
    """A zero-argument callable that runs one real jitted training step, blocks and
    returns the step's metrics (`CompiledStep.run`).

    It is compiled and run once before it is returned, so that timed calls measure
    the step alone.
    """
    run = compile_train_step(spec, graphs, live=True, seed=seed).run
    run()
    return run
