"""A training run on synthetic weather: one device or a mesh, with checkpoints to resume.

`train` runs K steps of `make_train_step` (or `make_sharded_train_step` over a layout)
on `SyntheticWeather`. Step k's batch depends on the seed, the batch size, the rollout
and k only, the parameters on the seed only, and the learning-rate schedule on its own
length (`schedule_steps`, not the step count a run stops at), so a run that is stopped,
saved and resumed (`checkpoint_dir`, orbax-checkpoint) with the same settings
(`RUN_SETTINGS` and `MODEL_SETTINGS`, recorded with each checkpoint) continues with exactly
the losses an uninterrupted run has. A run stopped by Ctrl-C or SIGTERM (`Terminated`)
saves the last step it completed. In a multi-process run every process calls `train` with
the same arguments: each builds the same host batch and places its own devices' shards.

Shapes: Ng grid nodes, B batch, C data channels, O outputs, T rollout steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import inspect
import logging
import math
import os
import re
import signal
import sys
import threading
import warnings
from typing import TYPE_CHECKING, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from gclab.config import ModelConfig, TaskConfig, WrongType, is_number, require_count, require_kind
from gclab.geometry.graphs import graphs_for
from gclab.memory.config import MemoryConfig
from gclab.model.graphcast import graph_inputs, make_network, param_mismatches, param_shapes
from gclab.parallel.config import ParallelConfig
from gclab.parallel.sharding import make_mesh
from gclab.training.data import SAMPLE_SPACING, SyntheticWeather
from gclab.training.layout import (
    check_batch,
    make_sharded_train_step,
    place_example,
    place_step_args,
)
from gclab.training.losses import loss_weights
from gclab.training.step import (
    FLOAT32_MAX,
    TrainConfig,
    TrainState,
    init_state_from_params,
    make_optimizer,
    make_train_step,
)

if TYPE_CHECKING:  # imported where a checkpoint is read or written (`_orbax`)
    import orbax.checkpoint as ocp


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a run did.

    Attributes:
      losses: the loss of each step this run took (resumed runs: from the resumed step).
      first_step: index of the first step this run took (0 unless resumed).
      steps: the step count reached.
      grad_norms: the global gradient norm of each step this run took.
      checkpoint: the step a checkpoint was saved at, or None.
      state: the final `TrainState` (parameters, optimizer state, step).
    """

    losses: list
    first_step: int
    steps: int
    grad_norms: list
    checkpoint: Optional[int] = None
    state: Optional[TrainState] = None


DEFAULT_SCHEDULE_STEPS = 1000  # TrainConfig's default length


def batch_start(step: int, batch: int) -> int:
    """The first frame of step `step`'s batch: batches never share a sample."""
    return 1 + step * batch * SAMPLE_SPACING


def _check_train_arguments(model, task, steps, memory, parallel, weather, schedule_steps,
                           batch, rollout, seed, learning_rate, checkpoint_dir,
                           save_every) -> None:
    """`train`'s arguments of the wrong kind, each named before any work (inside, each
    would fail as an attribute error of some later line)."""
    for name, value, kind, optional in (("model", model, ModelConfig, False),
                                        ("task", task, TaskConfig, False),
                                        ("memory", memory, MemoryConfig, True),
                                        ("parallel", parallel, ParallelConfig, True)):
        require_kind(name, value, kind, optional=optional)
    if memory is not None and parallel is not None:  # else found as the step is traced
        parallel.check_memory(memory)
    if weather is not None and not all(callable(getattr(weather, m, None))
                                       for m in ("normalization", "make_batch")):
        raise WrongType(f"weather={weather!r} is invalid: None, or an object with "
                        "normalization() and make_batch(batch, rollout, start)")
    require_count("steps", steps, 1)
    require_count("schedule_steps", schedule_steps, 1)
    if steps > schedule_steps:  # the schedule's rate, and so every update, is 0 after it
        raise ValueError(f"steps={steps} is invalid: at most schedule_steps={schedule_steps} "
                         "(after the schedule the learning rate is 0: the steps change nothing)")
    require_count("batch", batch, 1)
    require_count("rollout", rollout, 1)
    require_count("seed", seed, 0)
    # `TrainConfig`'s rule, checked here before any graph is built (inside, it failed as a
    # ConfigError of the schedule after the graphs, or a TypeError of a comparison).
    if not is_number(learning_rate) or not 0 <= learning_rate <= FLOAT32_MAX:
        error = ValueError if is_number(learning_rate) else WrongType
        raise error(f"learning_rate={learning_rate!r} is invalid: a number >= 0 and <= "
                    f"{FLOAT32_MAX:g} (float32's largest)")
    if save_every is not None:
        require_count("save_every", save_every, 1)
        if checkpoint_dir is None:  # it would save nothing, silently
            raise ValueError(f"save_every={save_every!r} is invalid without checkpoint_dir, "
                             "the folder it saves to: give both, or leave save_every None")


def check_init_params(params, model: ModelConfig, task: TaskConfig) -> None:
    """Refuses starting parameters that are not `model`'s for `task` (another latent size,
    step count or channel layout), naming the first parameter that differs; Haiku would
    report it from deep inside the first step, without naming the argument.

    Raises:
      ValueError: a missing, unexpected or wrongly shaped parameter.
    """
    # Before tracing the model for its shapes.
    require_kind("init_params", params, Mapping, "a {module: {name: array}} mapping")
    want = param_shapes(model, task.data_channels, task.output_channels)
    mismatches = param_mismatches(params, want)
    if not mismatches:
        return
    # The first in module, then parameter, order: a whole module before its parameters.
    first = min(mismatches, key=lambda m: (m.module, m.name is not None, m.name or ""))
    prefix = (f"init_params is invalid for {model.latent_size} x {model.processor_steps}, "
              f"{task.output_channels} output channels: ")
    if first.name is None:
        where = "not a parameter of this model" if first.unknown else "missing"
        raise ValueError(f"{prefix}module {first.module!r} {where}")
    where = f"{prefix}{first.module}/{first.name} is"
    if first.unknown:  # whatever it holds, an array or not
        shape = "" if first.shape is None else f" of shape {first.shape},"
        raise ValueError(f"{where}{shape} not a parameter of this model")
    given = "missing" if first.shape is None else f"of shape {first.shape}"
    raise ValueError(f"{where} {given}, the model's is {first.expected}")


def schedule(steps: int, peak_learning_rate: float = 1e-3) -> TrainConfig:
    """AdamW over `steps` steps: warm-up over the first tenth, then cosine decay."""
    return TrainConfig(peak_learning_rate=peak_learning_rate, warmup_steps=steps // 10,
                       total_steps=max(steps, 1))


class RestoreError(ValueError):
    """The latest checkpoint in a folder cannot be restored: damaged, or another model's.

    The message names the step and what is wrong, not the folder (the caller names it).
    """


def _mismatch(step: int, name: str, stored, given) -> str:
    return (f"step {step} was saved by a run with {name}={stored!r}, not {given!r} (resume "
            "with the same value, or start another folder)")


class ScheduleMismatch(RestoreError):
    """The latest checkpoint was saved by a run of another schedule or other examples:
    resuming it with this one would change the run (the learning rate of every later step,
    or what it trains on).

    Attributes:
      step: the checkpoint's step.
      name: the `train` argument that differs (one of `RUN_SETTINGS`).
      stored: its value in the checkpoint.
      given: its value now.
    """

    def __init__(self, step: int, name: str, stored, given) -> None:
        super().__init__(_mismatch(step, name, stored, given))
        self.step, self.name, self.stored, self.given = step, name, stored, given


class ModelMismatch(RestoreError):
    """The latest checkpoint was saved by a run of another model function: another grid,
    mesh, radius, mesh2grid edge normalisation, pressure levels or precision. None of them
    changes a parameter's shape, so the checkpoint would restore, and its parameters go on
    training for another function than they were trained for.

    Attributes:
      step: the checkpoint's step.
      name: the config field that differs (one of `MODEL_SETTINGS`).
      stored: its value in the checkpoint (the levels as a list).
      given: its value now.
    """

    def __init__(self, step: int, name: str, stored, given) -> None:
        super().__init__(_mismatch(step, name, stored, given))
        self.step, self.name, self.stored, self.given = step, name, stored, given


class TrainingDiverged(ValueError):
    """A step's loss or gradient norm is not finite, or the weights of the last step are not:
    the weights it made are NaN or infinite.

    Nothing of the run is saved after its last `save_every` save (a checkpoint saved
    before stays as it was).

    Attributes:
      step: the step, counted from 1 (the first step a run takes is step 1).
      loss: its loss.
      grad_norm: its global gradient norm.
      weights: True where the loss and gradient norm are finite and the weights the step's
        update made are not (an update too large for float32).
      resumed: the step of the checkpoint the run resumed from (kept as it was), or None
        (no checkpoint was restored).
      saved: the last step this run saved (`save_every`; kept as it was), or None.
    """

    def __init__(self, step: int, loss: float, grad_norm: float,
                 weights: bool = False, resumed: Optional[int] = None,
                 saved: Optional[int] = None) -> None:
        what = (f"the weights are not finite after step {step} (loss {loss:g}, gradient norm "
                f"{grad_norm:g})" if weights
                else f"the loss is {loss:g} at step {step} (gradient norm {grad_norm:g})")
        nothing = "nothing" if saved is None else f"nothing after step {saved}"
        super().__init__(f"{what}: training diverged, and {nothing} was saved")
        self.step, self.loss, self.grad_norm, self.weights = step, loss, grad_norm, weights
        self.resumed, self.saved = resumed, saved


class CheckpointDirError(ValueError):
    """A checkpoint folder `train` will not use: it holds number-named entries orbax did not
    write, which orbax would take for checkpoints and delete (it keeps the two newest).

    The message names the entries, not the folder (the caller names it).

    Attributes:
      entries: the entries' names.
    """

    def __init__(self, entries: list) -> None:
        names = ", ".join(entries)
        they = "it is named like a checkpoint" if len(entries) == 1 else (
            "they are named like checkpoints")
        super().__init__(f"holds {names}, which orbax did not write: {they}, and orbax "
                         "keeps the two newest checkpoints there and deletes the others (move "
                         "what you keep there elsewhere, or choose another folder)")
        self.entries = list(entries)


class StepsReached(ValueError):
    """The latest checkpoint is at or past the step count a run was asked to reach: it would
    take no step and save nothing.

    Attributes:
      step: the checkpoint's step.
      steps: the step count asked for.
    """

    def __init__(self, step: int, steps: int) -> None:
        super().__init__(f"steps={steps} is invalid: the latest checkpoint is at step {step} "
                         f"already (more than {step} to train on from it)")
        self.step, self.steps = step, steps


class SaveError(Exception):
    """A checkpoint could not be saved: orbax failed, or declined the step (the folder holds
    a later one).

    Attributes:
      step: the step that was to be saved.
      reason: why not, in a few words (no orbax temporary path).
    """

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"could not save step {step} ({reason})")
        self.step, self.reason = step, reason


@dataclasses.dataclass(frozen=True)
class Stopped:
    """Where a run with a checkpoint folder stopped on an error of a step (Ctrl-C and
    SIGTERM, `Terminated`, included), and what was saved: `train` attaches it to the error
    it re-raises, as `stopped`.

    Attributes:
      step: the step that did not complete, counted from 1.
      saved: the latest step of this run in the checkpoint folder (saved on stopping, or
        before by `save_every`), or None.
      why_not: where nothing was saved, why (e.g. "no step completed").
    """

    step: int
    saved: Optional[int] = None
    why_not: str = ""


class Terminated(KeyboardInterrupt):
    """The run was sent SIGTERM (`timeout`, `docker stop`, a batch scheduler preempting it)
    while its steps ran. It stops as on Ctrl-C, with this in place of the
    `KeyboardInterrupt` (one, so that whatever stops on Ctrl-C stops on it too): before the
    next step, saving the last one it completed (`Stopped`), not in the middle of a step or
    a save. A SIGTERM during the last step lets the run end as it would have: it saves
    that step anyway.

    Attributes:
      signum: the signal (`signal.SIGTERM`).
      exit_status: the status a process stopped by it conventionally exits with (128 plus
        the signal's number: 143).
    """

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum, self.exit_status = int(signum), 128 + int(signum)


@contextlib.contextmanager
def _stopping_on_sigterm():
    """While the steps run: SIGTERM noted rather than ending the process at once (Python's
    default), and a function that raises `Terminated` once it came, for the loop to call
    between steps. The handler before is restored at the end. Only the main thread may set
    a handler: in another, SIGTERM keeps its own handler and the function does nothing."""
    received = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return

    def note(signum, frame) -> None:
        received.append(signum)

    def check() -> None:
        if received:
            raise Terminated(received[0])

    previous = signal.signal(signal.SIGTERM, note)
    try:
        yield check
    finally:
        # None: a handler set outside Python, which Python cannot set back; the default.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


#: The `train` arguments a checkpoint records (orbax's custom metadata of its step), which
#: a resumed run must repeat: they set the learning rate of every step and the examples it
#: trains on. `real_data`: whether `weather` was given (True) or synthetic (False); `seed`
#: is recorded for synthetic weather only (it seeds the examples there; a resumed run's
#: parameters are the checkpoint's); `data` and `stats` for given weather only
#: (`weather_fingerprint`). Checkpoints saved before a setting was recorded resume
#: unchecked in it.
RUN_SETTINGS = ("schedule_steps", "learning_rate", "real_data", "seed", "batch", "rollout",
                "data", "stats")

#: The fields of the model, task and memory configs (`ModelConfig`, `TaskConfig`,
#: `MemoryConfig`) a checkpoint records with `RUN_SETTINGS`, which a resumed run must repeat
#: as well: each changes the function the parameters are trained for (the grid, the
#: graphs, the channels' meaning, the arithmetic) and none a parameter's shape, so
#: restoring cannot tell them from the arrays. The latent width, processor steps, hidden
#: layers and channel counts change shapes, which a restore checks (`RestoreError`); the
#: other memory techniques keep the function (`gclab.memory.config`), and a resumed run
#: may change them. Checkpoints saved before they were recorded resume unchecked in them.
MODEL_SETTINGS = ("resolution", "mesh_splits", "radius_query_fraction_edge_length",
                  "mesh2grid_edge_normalization_factor", "pressure_levels", "precision")

#: How many checkpoints a folder keeps: orbax deletes older ones, and any other entry named
#: like a step (a number), at each save.
KEPT_CHECKPOINTS = 2


def _orbax():
    """orbax.checkpoint, imported on first use: it takes about a quarter of a second to
    import, which a program that saves and restores no checkpoint (``gclab memory``,
    ``gclab plan``) would pay at start."""
    import orbax.checkpoint

    return orbax.checkpoint


def _checkpoint_manager(directory: str, create: bool = True) -> ocp.CheckpointManager:
    """Orbax's manager of `directory`. Saves are synchronous: an asynchronous save whose
    folder cannot be made leaves orbax's commit threads waiting for it, and the process
    with them, for orbax's coordination timeout (300 s) before it can exit. `create`: make
    the folder now (only a save does: restoring from a missing folder creates nothing)."""
    orbax = _orbax()
    options = orbax.CheckpointManagerOptions(max_to_keep=KEPT_CHECKPOINTS, create=create,
                                             enable_async_checkpointing=False)
    return orbax.CheckpointManager(os.path.abspath(directory), options=options,
                                   item_handlers=orbax.StandardCheckpointHandler())


@contextlib.contextmanager
def _closing(manager: ocp.CheckpointManager):
    """`manager`, closed at the end whatever happens (its errors on closing unsaid)."""
    try:
        yield manager
    finally:
        with contextlib.suppress(Exception):
            manager.close()


_STEP_NAME = re.compile(r"[0-9]+")


def _is_checkpoint(path: str) -> bool:
    """Whether `path` is a folder orbax wrote (or an empty one: nothing to lose there)."""
    if not os.path.isdir(path) or os.path.islink(path):
        return False
    entries = os.listdir(path)
    return not entries or "_CHECKPOINT_METADATA" in entries or "default" in entries


def foreign_entries(directory: str) -> list:
    """The entries of `directory` named like a step (a number) that are not orbax
    checkpoints: orbax would restore the largest as one, and delete each at a save (it keeps
    the two newest checkpoints). Empty if the folder does not exist."""
    if not os.path.isdir(directory):
        return []
    names = [n for n in os.listdir(directory) if _STEP_NAME.fullmatch(n)]
    return sorted((n for n in names if not _is_checkpoint(os.path.join(directory, n))),
                  key=lambda n: (int(n), n))


def _check_folder(directory: str) -> None:
    foreign = foreign_entries(directory)
    if foreign:
        raise CheckpointDirError(foreign)


def latest_step(directory: str) -> Optional[int]:
    """The step of the latest checkpoint in `directory` (a number-named folder that is not
    empty), or None; reads the folder's names only."""
    if not os.path.isdir(directory):
        return None
    steps = [int(n) for n in os.listdir(directory) if _STEP_NAME.fullmatch(n)
             and os.path.isdir(os.path.join(directory, n))
             and os.listdir(os.path.join(directory, n))]
    return max(steps, default=None)


def tree_digest(tree, dtype=None) -> str:
    """The sha256 (hex) of every array of `tree`: its dtype, shape and bytes, each leaf as
    `dtype` where given (numbers that compare equal then hash the same, however stored).
    What a run records of its statistics, and `gclab train` of the weights each process
    was given."""
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        a = np.ascontiguousarray(np.asarray(leaf, dtype=dtype))
        digest.update(f"{a.dtype}{a.shape}".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def _shown_time(value) -> str:
    if isinstance(value, np.datetime64):
        return str(np.datetime_as_string(value, unit="m"))
    return str(value)


def _data_fingerprint(ds) -> str:
    """A dataset in a few words: its time steps, first and last datetime, batch rows, grid
    and levels (what sets the examples of each step, short of reading them)."""
    times = ds.coords["datetime"] if "datetime" in ds.coords else ds.coords.get("time")
    span = ""
    if times is not None and times.size:
        values = np.asarray(times.values).ravel()
        span = f" from {_shown_time(values[0])} to {_shown_time(values[-1])}"
    levels = ("levels " + ",".join(f"{v:g}" for v in np.asarray(ds.coords["level"]).ravel())
              if "level" in ds.coords else "no levels")
    return (f"{ds.sizes['time']} times{span}, {ds.sizes.get('batch', 1)} batch rows, grid "
            f"{ds.sizes.get('lat', '?')} x {ds.sizes.get('lon', '?')}, {levels}")


def weather_fingerprint(weather) -> dict:
    """What a checkpoint records of given weather, for a resumed run to repeat: `stats`, a
    hash of its normalisation statistics; `data`, where it has a dataset (`ds`, as
    `gclab.weather.DatasetWeather`), its time steps, first and last datetime, batch rows,
    grid and levels."""
    fingerprint = {"stats": f"sha256 {tree_digest(weather.normalization(), np.float64)[:16]}"}
    ds = getattr(weather, "ds", None)
    if ds is not None and hasattr(ds, "sizes") and "time" in ds.sizes:
        fingerprint["data"] = _data_fingerprint(ds)
    return fingerprint


def _without_abandoned_reads(hook: Callable) -> Callable:
    """`sys.unraisablehook` `hook`, silent about the reads orbax abandons when one fails:
    their tensorstore callbacks, completing in other threads, find the event loop closed,
    and their coroutines raise again when they are collected."""

    def hook_(unraisable) -> None:
        error, where = unraisable.exc_value, unraisable.object
        if not ((isinstance(error, RuntimeError) and str(error) == "Event loop is closed")
                or (inspect.iscoroutine(where) and "orbax" in where.cr_code.co_filename)):
            hook(unraisable)

    hook_.without_abandoned_reads = True
    return hook_


class _AbandonedReadsLog(logging.Filter):
    """Drops asyncio's report of a task or future whose exception nobody retrieved: after a
    failed restore, the reads orbax abandoned finish in tensorstore's threads and are
    reported when collected, which may be any time later (at exit, say)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Future exception was never retrieved",
                                               "Task exception was never retrieved"))


_ABANDONED_READS_LOG = _AbandonedReadsLog()


@contextlib.contextmanager
def _quiet_orbax():
    """Orbax's logged warnings unsaid, and the noise of the reads it abandons when one fails
    (asyncio's "exception was never retrieved", unraisable errors, "never awaited"). The
    abandoned tasks and coroutines are collected here, on a failure; the unraisable errors
    are silenced from the start, and after a failure, they and asyncio's reports of
    exceptions never retrieved for good: some come later, from tensorstore's threads."""
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
    levels, hook = [logger.level for logger in loggers], sys.unraisablehook
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    if not getattr(hook, "without_abandoned_reads", False):
        sys.unraisablehook = _without_abandoned_reads(hook)
    try:
        yield
    except Exception:
        logging.getLogger("asyncio").addFilter(_ABANDONED_READS_LOG)  # once: a set of filters
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
            gc.collect()
        raise
    else:
        sys.unraisablehook = hook
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _reason(error: BaseException) -> str:
    """The first line of the innermost cause of an orbax error (its outer ones are long)."""
    while error.__cause__ is not None:
        error = error.__cause__
    line = str(error).strip().split("\n")[0]
    line = line if len(line) <= 200 else line[:197] + "..."
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


def _check_stored_shapes(manager: ocp.CheckpointManager, step: int, like: TrainState) -> None:
    """Raises `RestoreError` unless step `step` holds arrays of `like`'s names and shapes."""
    folder = os.path.join(str(manager.directory), str(step))
    if os.path.isdir(folder) and not os.listdir(folder):
        raise RestoreError(f"step {step} is an empty folder (no checkpoint in it)")
    try:
        stored = {m.name: tuple(m.shape)
                  for m in jax.tree_util.tree_leaves(manager.item_metadata(step).tree)}
    except Exception as e:  # noqa: BLE001 - orbax raises what its readers raise
        raise RestoreError(f"step {step} is damaged or incomplete ({_reason(e)})") from None
    wanted = {".".join(_orbax().tree.str_keypath(path)): tuple(a.shape)
              for path, a in jax.tree_util.tree_leaves_with_path(like)}
    for name, shape in wanted.items():
        if name not in stored:
            raise RestoreError(f"step {step} holds a checkpoint of another model (it has no "
                               f"{name})")
        if stored[name] != shape:
            raise RestoreError(f"step {step} holds a checkpoint of another model ({name} has "
                               f"shape {stored[name]}, this model needs {shape})")
    if len(stored) != len(wanted):
        raise RestoreError(f"step {step} holds a checkpoint of another model ({len(stored)} "
                           f"arrays, this model has {len(wanted)})")


def restore_state(directory: str, like: TrainState) -> Optional[TrainState]:
    """The latest `TrainState` saved under `directory`, laid out like `like` (JAX arrays),
    or None.

    Raises:
      RestoreError: the latest checkpoint is damaged, empty, or of another model (arrays
        of other names or shapes).
    """
    if not os.path.isdir(directory):  # nothing to restore, and nothing made before a save
        return None
    with _quiet_orbax(), _closing(_checkpoint_manager(directory, create=False)) as manager:
        step = manager.latest_step()
        if step is None:
            return None
        _check_stored_shapes(manager, step, like)
        target = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), like)
        failure = None
        try:
            restored = manager.restore(step, args=_orbax().args.StandardRestore(target))
        except Exception as e:  # noqa: BLE001 - orbax raises what its readers raise
            failure = _reason(e)
        if failure is not None:  # raised out here, so that no context keeps orbax's error
            raise RestoreError(f"step {step} is damaged ({failure})")
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like),
                                        jax.tree_util.tree_leaves(restored))


def model_settings(model: ModelConfig, task: TaskConfig,
                   memory: Optional[MemoryConfig] = None) -> dict:
    """What a checkpoint records of `model`, `task` and `memory` (`MODEL_SETTINGS`), as JSON
    keeps it: the levels as a list (JSON has no tuple, and a list read back is no tuple)."""
    memory = memory or MemoryConfig()
    return {"resolution": model.resolution, "mesh_splits": model.mesh_splits,
            "radius_query_fraction_edge_length": model.radius_query_fraction_edge_length,
            "mesh2grid_edge_normalization_factor": model.mesh2grid_edge_normalization_factor,
            "pressure_levels": list(task.pressure_levels), "precision": memory.precision}


def check_run_settings(directory: str, settings: dict) -> None:
    """Raises `ScheduleMismatch` (`ModelMismatch`) if the latest checkpoint under `directory`
    recorded other values of `settings` of `RUN_SETTINGS` (`MODEL_SETTINGS`). A folder
    without a checkpoint, a setting the checkpoint did not record (saved before it was
    recorded) or a checkpoint whose metadata cannot be read passes (restoring it reports
    the damage)."""
    if not os.path.isdir(directory):
        return
    with _quiet_orbax(), _closing(_checkpoint_manager(directory, create=False)) as manager:
        step = manager.latest_step()
        if step is None:
            return
        try:
            stored = dict(manager.metadata(step).custom_metadata or {})
        except Exception:  # noqa: BLE001 - damaged: `restore_state` names what is wrong
            return
    for names, error in ((RUN_SETTINGS, ScheduleMismatch), (MODEL_SETTINGS, ModelMismatch)):
        for name in names:
            if name in stored and name in settings and stored[name] != settings[name]:
                raise error(step, name, stored[name], settings[name])


def _save_failure(directory: str, error: BaseException) -> str:
    """Why a save failed, in a few words: the folder's state where that is it, else the
    innermost error without the path orbax wrote to (a temporary one of its own)."""
    if os.path.lexists(directory) and not os.path.isdir(directory):
        return "it is a file, not a folder"
    while error.__cause__ is not None:
        error = error.__cause__
    if isinstance(error, OSError) and error.strerror:
        return f"{type(error).__name__}: {error.strerror}"
    return _reason(error)


def save_state(directory: str, state: TrainState, settings: Optional[dict] = None) -> int:
    """Saves `state` under `directory` at its step count; returns that step.

    Orbax keeps the two newest checkpoints there (`KEPT_CHECKPOINTS`), deleting older ones.

    Args:
      directory: the checkpoint folder (made if missing).
      state: what to save.
      settings: recorded with the step (`RUN_SETTINGS`), for `check_run_settings`.

    Raises:
      CheckpointDirError: the folder holds number-named entries that are not orbax
        checkpoints (orbax would delete them).
      SaveError: orbax failed (the folder is a file, say), or declined the step (the folder
        holds this step or a later one); nothing was saved.
    """
    step = int(jax.device_get(state.step))
    _check_folder(directory)
    failure, saved, latest = None, False, None
    with _quiet_orbax():
        try:
            with _closing(_checkpoint_manager(directory)) as manager:
                latest = manager.latest_step()
                saved = manager.save(step, args=_orbax().args.StandardSave(state),
                                     custom_metadata=settings or {})
                manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - orbax raises what its writers raise
            failure = _save_failure(directory, e)
    if failure is not None:  # raised out here, so that no context keeps orbax's error
        raise SaveError(step, failure)
    if not saved:
        raise SaveError(step, f"orbax declined it: the folder holds step {latest}, and orbax "
                        "saves only steps past its latest")
    return step


def _save_on_stop(directory: str, state: TrainState, start: int, settings: dict,
                  failed: int, saved: Optional[int] = None) -> Stopped:
    """Saves `state`, the state after the last step that completed, when a run stops on an
    error of a later step: only in a one-process run (the other processes of a run are
    not stopping with this one, and a save needs them all), only when a step completed
    since `start`, only finite weights, and only a step not saved already. `failed`: the
    step that was running (where the state cannot tell); `saved`: the last step this run
    saved (`save_every`), which the `Stopped` names where nothing later is saved."""
    try:
        deleted = any(a.is_deleted() for a in jax.tree_util.tree_leaves(state)
                      if isinstance(a, jax.Array))
        done = None if deleted else int(jax.device_get(state.step))
    except Exception:  # noqa: BLE001 - the step that made it failed on the device
        done = None
    if done is None:  # given (donated) to the step that failed, or never computed
        return Stopped(failed, saved=saved,
                       why_not="the state of the last step did not survive")
    stopped = Stopped(done + 1, saved=saved)
    # Held already: saved by `save_every`, also where the interrupt came as that save ended,
    # before `train` took note of it (orbax would decline the step).
    if done == saved or latest_step(directory) == done:
        return dataclasses.replace(stopped, saved=done)
    if jax.process_count() > 1:
        return dataclasses.replace(stopped, why_not="a multi-process run saves only at its end")
    if done == start:
        return dataclasses.replace(stopped, why_not="no step completed")
    if not bool(_all_finite(state.params)):
        return dataclasses.replace(stopped, why_not="the weights are not finite")
    try:
        return dataclasses.replace(stopped, saved=save_state(directory, state, settings))
    except (SaveError, CheckpointDirError) as e:
        return dataclasses.replace(stopped, why_not=str(e))


@jax.jit
def _all_finite(tree) -> jax.Array:
    """Whether every number of `tree` is finite (one replicated scalar, however the arrays
    are laid out)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree_util.tree_leaves(tree)]))


def train(model: ModelConfig, task: TaskConfig, steps: int, *, batch: int = 1,
          rollout: int = 1, memory: Optional[MemoryConfig] = None,
          parallel: Optional[ParallelConfig] = None, seed: int = 0,
          learning_rate: float = 1e-3, schedule_steps: int = DEFAULT_SCHEDULE_STEPS,
          checkpoint_dir: Optional[str] = None, save_every: Optional[int] = None,
          progress: Optional[Callable] = None, weather=None,
          init_params: Optional[dict] = None) -> TrainResult:
    """Trains `model` on synthetic weather for `steps` steps (or up to it, when resuming).

    Args:
      model, task: the network and its channels. A resumed run must keep the grid, mesh,
        radius, mesh2grid edge normalisation and pressure levels (`MODEL_SETTINGS`), and,
        as its parameters' shapes, the latent width, steps, hidden layers and channels.
      steps: K, the step count to reach.
      batch: B, the global batch (a multiple of `parallel.data` x microbatches); a resumed
        run must keep it.
      rollout: T, autoregressive steps per example; a resumed run must keep it.
      memory: memory techniques (default none). A resumed run must keep its precision.
      parallel: the layout (default: one device). Its devices are the first of
        `jax.devices()` (every process's, in a multi-process run). With per-stage remat
        (`stage_remat`), `memory`'s processor remat must be none.
      seed: seeds the synthetic weather (without `weather`) and the parameters (without
        `init_params`); a resumed run on synthetic weather must keep it.
      learning_rate: the peak of the schedule (`schedule`): a number from 0 to float32's
        largest; a resumed run must keep it.
      schedule_steps: the schedule's length (warm-up over its first tenth, then cosine
        decay); a resumed run must keep it.
      checkpoint_dir: resume from the latest checkpoint here, if any, and save the state
        at the end, or, in a one-process run, after the last step that completed when a
        step fails or is interrupted (Ctrl-C, or SIGTERM in the main thread: `Terminated`).
        Orbax keeps the two newest checkpoints there. Nothing is made there before the
        first save.
      save_every: with `checkpoint_dir`, also save the state after every step whose number
        (counted from 1) is a multiple of it, so that a run killed outright (the OOM
        killer, a preempted machine) loses fewer steps; None: no such saves. A resumed
        run may change it.
      progress: wraps the range of steps (e.g. `tqdm.tqdm`); None: no wrapping.
      weather: where examples come from: an object with `normalization()` and
        `make_batch(batch, rollout, start)` (`gclab.weather.DatasetWeather` for real
        data); None: `SyntheticWeather` of `task` at the model's resolution, seeded.
      init_params: starting parameters in gclab's tree and channel layout (e.g. a
        published checkpoint's, `gclab.weather.params_to_gclab_channels`); None: a
        seeded initialisation.

    Returns:
      A `TrainResult`.

    Raises:
      ValueError: a batch that does not fit the layout, a layout with more devices than
        JAX has, `steps`, `schedule_steps`, `batch` or `rollout` < 1, `steps` beyond
        `schedule_steps`, `seed` < 0, `learning_rate` < 0, beyond float32's largest or
        NaN, `save_every` < 1 or without `checkpoint_dir`, or `init_params` not the
        model's (each named before any work).
      TypeError: `model`, `task`, `memory`, `parallel`, `weather`, `learning_rate` or
        `save_every` of the wrong kind.
      StageRematConflict: a processor remat other than none in `memory` with per-stage remat
        in `parallel` (a `ConfigError`, checked before any work).
      CheckpointDirError: `checkpoint_dir` holds number-named entries that are not orbax
        checkpoints (checked before any work: orbax would delete them).
      StepsReached: the latest checkpoint in `checkpoint_dir` is at step `steps` or past
        it (checked before any work).
      RestoreError: the latest checkpoint in `checkpoint_dir` is damaged or another
        model's; `ScheduleMismatch` (checked before any work) when it was saved by a run
        with another of `RUN_SETTINGS` (`schedule_steps`, `learning_rate`, `batch`,
        `rollout`, synthetic or given `weather`, `seed` on synthetic weather, and the
        dataset and statistics of given weather, `weather_fingerprint`); `ModelMismatch`
        (checked before any work) when by a run of another grid, mesh, radius, mesh2grid
        edge normalisation, pressure levels or precision (`MODEL_SETTINGS`).
      TrainingDiverged: a step's loss or gradient norm is not finite, or the weights to
        save are not (nothing more is saved; `resumed` says whether a checkpoint was
        restored, `saved` the last step this run saved).
      SaveError: a checkpoint (`save_every`'s or the final one) could not be saved: the run
        stops there.
      Terminated: the process was sent SIGTERM while the steps ran (a `KeyboardInterrupt`,
        raised before the next step); as any error of a step below.
      Any error of a step (KeyboardInterrupt, a `DataError` or `OSError` reading the
        weather, ...) is re-raised as it came; with `checkpoint_dir`, after the state of
        the last completed step was saved there, and with a `Stopped` as its `stopped`.
    """
    _check_train_arguments(model, task, steps, memory, parallel, weather, schedule_steps,
                           batch, rollout, seed, learning_rate, checkpoint_dir, save_every)
    if init_params is not None:
        check_init_params(init_params, model, task)
    steps = int(steps)
    # Python numbers: the checkpoint's metadata is JSON.
    settings = {"schedule_steps": int(schedule_steps), "learning_rate": float(learning_rate),
                "real_data": weather is not None, "batch": int(batch), "rollout": int(rollout)}
    if weather is None:
        settings["seed"] = int(seed)
    else:
        settings.update(weather_fingerprint(weather))
    settings.update(model_settings(model, task, memory))
    if checkpoint_dir is not None:
        _check_folder(checkpoint_dir)
        check_run_settings(checkpoint_dir, settings)
        reached = latest_step(checkpoint_dir)
        if reached is not None and reached >= steps:
            raise StepsReached(reached, steps)
    memory = memory or MemoryConfig()
    parallel = parallel or ParallelConfig()
    graphs = graphs_for(model)
    graph = graph_inputs(graphs)
    net = make_network(model, task.data_channels, task.output_channels, memory)
    if weather is None:
        weather = SyntheticWeather(task, model.resolution, seed=seed)
    norm = weather.normalization()
    optimizer = make_optimizer(schedule(schedule_steps, learning_rate))
    weights = loss_weights(task, graphs.grid_lat, graphs.n_lon)
    first = weather.make_batch(batch, rollout, batch_start(0, batch))
    # Given parameters (published weights are read as numpy arrays) go to the device now, in
    # JAX's dtypes, as the first step would put them: the state is JAX arrays throughout,
    # which a resumed run's restore lays its checkpoint out like.
    params = (jax.tree_util.tree_map(jnp.asarray, init_params) if init_params is not None
              else net.init(jax.random.PRNGKey(seed), graph, first.inputs))
    state = init_state_from_params(params, optimizer)
    mesh = None
    if parallel.devices > 1:
        mesh = make_mesh(parallel)
        check_batch(mesh, batch, memory, parallel)
        step_fn = make_sharded_train_step(net, optimizer, task, memory, rollout, weights, mesh,
                                          norm.residual_scale, parallel)
        state, graph, _ = place_step_args(mesh, state, graph, first)
    else:
        if batch % memory.microbatches:
            raise ValueError(f"batch {batch} is not a multiple of microbatches="
                             f"{memory.microbatches}")
        step_fn = make_train_step(net, optimizer, task, memory, rollout, weights,
                                  norm.residual_scale)
    restored = None
    if checkpoint_dir is not None:
        restored = restore_state(checkpoint_dir, state)
        state = restored or state
    start = int(jax.device_get(state.step))
    resumed = start if restored is not None else None
    losses, grad_norms = [], []
    wrap = progress or (lambda r: r)
    k, saved = start, None  # the step running (0-based), the last step this run saved
    # SIGTERM stops the run as Ctrl-C does, between steps: the save on stopping, or the
    # final save, is made whole.
    with _stopping_on_sigterm() as stop_if_terminated:
        try:
            for k in wrap(range(start, steps)):
                stop_if_terminated()  # Terminated, before step k + 1
                example = weather.make_batch(batch, rollout, batch_start(k, batch))
                if mesh is not None:
                    example = place_example(mesh, example)
                state, metrics = step_fn(state, graph, example)
                metrics = jax.device_get(metrics)  # every step's: checking them costs no extra sync
                losses.append(float(metrics["loss"]))
                grad_norms.append(float(metrics["grad_norm"]))
                # A non-finite gradient makes every weight NaN in this step's update: stop before
                # a later step or the save below spends time on them or keeps them.
                if not (math.isfinite(losses[-1]) and math.isfinite(grad_norms[-1])):
                    raise TrainingDiverged(k + 1, losses[-1], grad_norms[-1], resumed=resumed,
                                           saved=saved)
                if save_every is not None and (k + 1) % save_every == 0:
                    # Every process saves (orbax's save waits for them all), the final save's way.
                    if not _all_finite(state.params):  # as the final save below
                        raise TrainingDiverged(k + 1, losses[-1], grad_norms[-1], weights=True,
                                               resumed=resumed, saved=saved)
                    saved = save_state(checkpoint_dir, state, settings)
            # The last step's update comes after its loss: a finite loss and gradient with an
            # update too large for float32 leave NaN or infinite weights, not saved either.
            if losses and saved != steps and not _all_finite(state.params):
                raise TrainingDiverged(steps, losses[-1], grad_norms[-1], weights=True,
                                       resumed=resumed, saved=saved)
        except (TrainingDiverged, SaveError, CheckpointDirError):  # nothing more to save
            raise
        except (KeyboardInterrupt, Exception) as e:  # a step that failed or was interrupted
            if checkpoint_dir is not None:
                e.stopped = _save_on_stop(checkpoint_dir, state, start, settings, k + 1, saved)
                done = (f"saved step {e.stopped.saved} to {checkpoint_dir}"
                        if e.stopped.saved is not None else f"nothing saved ({e.stopped.why_not})")
                e.add_note(f"gclab.training.train stopped at step {e.stopped.step}: {done}")
            raise
        if checkpoint_dir is not None and saved != steps:  # orbax declines a step it holds
            saved = save_state(checkpoint_dir, state, settings)
    return TrainResult(losses, start, max(start, steps), grad_norms, saved, state)
