"""Command line: `python -m gclab COMMAND ...` (or `gclab COMMAND ...`).

Commands:
  graph      node and edge counts of a grid + multimesh (built and cached); --save
             FILE.npz writes the three graphs and their static features
  reference  check gclab against a fixture produced by the official code
  memory     XLA's compiled memory of one training step, from shapes alone
  timeline   the memory timeline of one training step, as a picture
  sweep      a grid of configs x techniques, compiled and/or measured
  plan       the technique settings that fit a memory budget
  train      train on synthetic weather, on one device or a layout over several
  forecast   an autoregressive forecast from a published checkpoint and weather files
  stats      normalisation statistics of a weather dataset (the three official files)

Every error in what you type is reported in one line, `gclab COMMAND: error: --option
VALUE: what is allowed`, with exit status 2, before any work starts (output paths
included). Work too large for this machine is refused the same way, with the estimate and
the limit. A failed check, a training run that diverges, processes that do not all join a
multi-process run in time, or a file that cannot be written in the middle of a run, exits
with status 1; Ctrl-C with status 130 (what was completed kept: `train`'s last step saved
to --checkpoint-dir, `sweep`'s rows written to --out), and a training run that SIGTERM
stopped the same way with 143.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import functools
import hashlib
import json
import math
import os
import re
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
import tqdm

from gclab.config import MAX_INT32, PRESETS, ConfigError, ModelConfig, get_preset, resolve_model
from gclab.devices import CARDS, card, mem_fraction, mem_fraction_setting
from gclab.files import (
    OutputPathError,
    atomic_path,
    check_output_path,
    check_writable_folder,
    link_target,
    writable_folder,
)
from gclab.geometry.graphs import load_or_build_graphs, save_graphs
from gclab.measure.compiled import format_bytes
from gclab.memory import CPU_SCHEDULERS, cpu_scheduler, use_cpu_scheduler
from gclab.memory.config import (
    PRECISIONS,
    RECIPES,
    REMAT_SPEC_HELP,
    parse_remat_spec,
)
from gclab.model.reference import load_fixture, run_checks
from gclab.parallel import (
    PARALLEL_SPEC_HELP,
    ParallelConfig,
    initialize_processes,
    parse_parallel_spec,
    use_cpu_devices,
)
from gclab.parallel.config import spec_error
from gclab.parallel.pipeline import StagesWouldHang
from gclab.parallel.processes import (
    COORDINATOR_ENV,
    DEFAULT_INIT_TIMEOUT,
    MAX_CPU_DEVICES,
    NUM_PROCESSES_ENV,
    PROCESS_ID_ENV,
    env_count,
)
from gclab.sizing.layout_plan import plan_layout
from gclab.sizing.planner import BUDGET_HELP, NothingFits, parse_budget, plan
from gclab.sizing.step import StepSpec, compile_train_step, recipe_memory, train_step_timeline
from gclab.sizing.sweep import MEASURES, save_sweep, sweep
from gclab.sizing.sweep import grid as sweep_grid
from gclab.training.loop import (
    DEFAULT_SCHEDULE_STEPS,
    KEPT_CHECKPOINTS,
    CheckpointDirError,
    ModelMismatch,
    RestoreError,
    SaveError,
    ScheduleMismatch,
    StepsReached,
    TrainingDiverged,
    latest_step,
    train,
    tree_digest,
    weather_fingerprint,
)
from gclab.training.step import FLOAT32_MAX
from gclab.weather import (
    STATS_FILES,
    Checkpoint,
    CheckpointError,
    DataError,
    DatasetWeather,
    check_dataset,
    compute_stats,
    load_stats,
    normalization_from_stats,
    open_dataset,
    params_to_gclab_channels,
    params_to_official_channels,
    read_checkpoint,
    write_checkpoint,
    write_dataset,
    write_stats,
)
from gclab.weather.forecast import forecast


@functools.cache
def plot_suffixes() -> tuple[str, ...]:
    """File types a picture can be saved as (matplotlib's, from the name's suffix; not pgf,
    which needs a LaTeX installation).

    Asked only when a command is given a picture to write: matplotlib (and `gclab.plots`)
    take about half a second to import, which every other command would pay at start.
    """
    from matplotlib.backend_bases import FigureCanvasBase

    return tuple(f".{ext}" for ext in sorted(FigureCanvasBase.get_supported_filetypes())
                 if ext != "pgf")


SWEEP_SUFFIXES = (".json", ".csv")
SWEEP_CACHE_ENV = "GCLAB_SWEEP_CACHE"
STATS_NAMES = tuple(STATS_FILES.values())  # the three statistics files of a folder
# Seconds JAX waits for the processes beyond --coordinator-timeout: our own timer, which says
# what to check, ends the process first (`_join`).
JOIN_GRACE_SECONDS = 30
# argparse's own messages after "argument --x: " (the rest come from the types below).
_ARGPARSE_PHRASES = ("expected ", "invalid choice", "ignored explicit argument", "not allowed")


class UsageError(ValueError):
    """Bad command-line input; printed without a traceback."""


class _Interrupted(KeyboardInterrupt):
    """A stop (Ctrl-C, or SIGTERM during `gclab train`'s steps) a command has said its own
    line about already (what it saved or wrote); `exit_status` is the process's."""

    def __init__(self, exit_status: int = 130) -> None:
        super().__init__()
        self.exit_status = exit_status


def _stop(e: KeyboardInterrupt) -> tuple[str, int]:
    """(what happened, in a word or three; the exit status) of a run stopped by `e`: Ctrl-C
    is 'interrupted', 130; a stop that carries its own `exit_status` (SIGTERM during
    `gclab train`'s steps, `gclab.training.loop.Terminated`: 143) says what it was."""
    status = getattr(e, "exit_status", None)
    if isinstance(status, int) and not isinstance(status, bool) and status != 130:
        return str(e) or "stopped", status
    return "interrupted", 130


class _Parser(argparse.ArgumentParser):
    """argparse, with every error in one line: ``gclab COMMAND: error: --option VALUE: ...``.

    Attributes:
      commands: the parser of each command (on the top-level parser).
    """

    commands: dict = {}

    def error(self, message: str):
        m = re.match(r"argument ([^:]+): (.*)$", message, re.S)
        if m:
            option = m.group(1).split("/")[-1]
            rest = m.group(2)
            if rest.startswith(_ARGPARSE_PHRASES):
                if rest == "expected one argument":
                    rest += f" (write a value that starts with '-' as {option}=VALUE)"
                message = f"{option}: {rest}"
            else:  # "VALUE: what is allowed", from an option type
                message = f"{option} {rest}"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ------------------------------------------------------------------------- option types
# Each checks one option when argparse reads it, before any work, and says what is
# allowed; the rule is the config's own wherever a config has one.


def _shown(text: str) -> str:
    """The value as typed, quoted where it would not read as one word."""
    return text if text and not any(c.isspace() for c in text) else repr(text)


def _bad(text: str, allowed: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{_shown(text)}: {allowed}")


def _not_empty(text: str) -> str:
    """A path as typed, refused when empty: `Path("")` is the working directory, which
    nobody means by an empty value (an unset variable in a script, say)."""
    if not text:
        raise _bad(text, "a path, not an empty one (it would mean the working directory)")
    return text


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _bad(text, "not an integer") from None


def _parse_number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise _bad(text, "not a number") from None


def _model_field(field: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option type for one `ModelConfig` field, checked by the config's own rule."""

    def convert(text: str) -> Any:
        value = parse(text)
        try:
            ModelConfig(**{field: value})
        except ConfigError as e:
            raise _bad(text, e.allowed) from None
        return value

    return convert


def _model_list(field: str) -> Callable[[str], list[int]]:
    """Comma-separated integers, each a valid `ModelConfig` field; a repeat is left out (it
    would compile the same step again)."""
    one = _model_field(field, _parse_int)

    def convert(text: str) -> list[int]:
        try:
            return list(dict.fromkeys(one(part) for part in text.split(",")))
        except argparse.ArgumentTypeError:
            raise _bad(text, f"comma-separated integers, each >= 1 (and <= {MAX_INT32})"
                       ) from None

    return convert


def _count(minimum: int, note: str = "", maximum: int = MAX_INT32) -> Callable[[str], int]:
    def convert(text: str) -> int:
        value = _parse_int(text)
        if not minimum <= value <= maximum:
            raise _bad(text, f"an integer >= {minimum} (and <= {maximum}){note}")
        return value

    return convert


def _choice(choices: Sequence[str], parse: Callable[[str], Any] = str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        if text not in choices:
            raise _bad(text, "one of " + ", ".join(choices))
        return parse(text)

    return convert


def _preset(text: str) -> str:
    try:
        get_preset(text)
    except ValueError:
        raise _bad(text, "one of " + ", ".join(sorted(PRESETS))) from None
    return text


def _recipes(text: str) -> list[str]:
    """Comma-separated recipe names; a repeat is left out (the same step again)."""
    names = [r.strip() for r in text.split(",")]
    if not all(n in RECIPES for n in names):
        raise _bad(text, "comma-separated recipes, each one of " + ", ".join(RECIPES))
    return list(dict.fromkeys(names))


def _kept_as_typed(parse: Callable[[str], Any], allowed: str) -> Callable[[str], str]:
    """An option checked by `parse` and kept as typed (its reader parses it again)."""

    def convert(text: str) -> str:
        try:
            parse(text)
        except ValueError:
            raise _bad(text, allowed) from None
        return text

    return convert


# Kept as typed: `_check_remat` quotes it when it does not suit the model.
_remat = _kept_as_typed(parse_remat_spec, REMAT_SPEC_HELP)


def _mem_fraction_error() -> Optional[str]:
    """What is wrong with `XLA_CLIENT_MEM_FRACTION` (or the deprecated
    `XLA_PYTHON_CLIENT_MEM_FRACTION`, the one of them set), in one line, or None."""
    try:
        mem_fraction()
    except ValueError as e:
        try:
            name, text = mem_fraction_setting()
        except ValueError:  # both names set
            return str(e)
        return (f"{name}={_shown(text)}: a number in (0, 1] (the share of a GPU's "
                f"memory JAX takes; a card's budget is that share of its memory)")
    return None


def _budget(text: str) -> str:
    """A budget, kept as typed: a card's name also names its speeds (`gclab plan --devices`).

    A card read through a bad `XLA_CLIENT_MEM_FRACTION` passes here: the variable is
    at fault, not the option, and `_check_plan_options` names it before any work.
    """
    try:
        parse_budget(text)
    except ValueError:
        try:
            card(text)
        except ValueError:
            raise _bad(text, BUDGET_HELP) from None
        if _mem_fraction_error() is None:
            raise _bad(text, BUDGET_HELP) from None
    return text


# `_resolve_parallel` reads it, and quotes it as typed when it disagrees with --devices.
def _parallel(text: str) -> str:
    try:
        parse_parallel_spec(text)
    except ConfigError as e:  # a well-formed spec with a bad value: its item, as written
        raise _bad(text, spec_error(text, e)) from None
    except ValueError as e:  # a well-formed spec with a bad value names its field
        raise _bad(text, PARALLEL_SPEC_HELP if "malformed" in str(e) else str(e)) from None
    return text


def _host_port(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not (host and port.isascii() and port.isdecimal() and 1 <= int(port) <= 65535):
        raise _bad(text, "HOST:PORT with PORT in 1..65535")
    return text


def _learning_rate(text: str) -> float:
    """`TrainConfig`'s rule: float32 (where the optimizer computes) makes a larger one
    infinite, and every weight NaN in the first update."""
    value = _parse_number(text)
    if not 0 <= value <= FLOAT32_MAX:
        raise _bad(text, f"a number >= 0 and <= {FLOAT32_MAX:g} (float32's largest)")
    return value


def _missing_parent(text: str) -> Optional[str]:
    """Why a folder that does not exist yet cannot be created at `text`, or None.

    A symbolic link (a dangling one here) is created at its target, so the target's parent
    must exist, and is the one named.
    """
    target = link_target(text)
    if target is not None:
        if not target.parent.is_dir():
            return f"a symbolic link to {target}, whose folder {target.parent} does not exist"
    elif not Path(text).parent.is_dir():
        return f"no {Path(text).parent}"
    return None


def _writable_folder(text: str, what: str) -> Path:
    """`text` as a folder to write into, checked before any work: an existing folder must
    take a new file, and a missing one must have a parent (a link's target's) that does, to
    be created in (`what` names the kind of folder in the message)."""
    path = Path(_not_empty(text))
    if path.exists() and not path.is_dir():
        raise _bad(text, f"a {what} (this is a file)")
    if not path.exists():
        missing = _missing_parent(text)
        if missing:
            raise _bad(text, f"a {what} whose parent exists ({missing})")
    try:
        check_writable_folder(path if path.exists() else (link_target(text) or path).parent)
    except OutputPathError as e:
        raise _bad(text, e.reason) from None
    return path


def _path_option(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option type that looks at the file system, with an error there (a folder it may
    not search, say) said in one line that names the option, as its other checks are."""

    @functools.wraps(convert)
    def checked(text: str) -> Any:
        try:
            return convert(text)
        except OSError as e:
            where = f"{e.filename}: " if e.filename and str(e.filename) != text else ""
            raise _bad(text, f"cannot look at it ({where}{e.strerror or e})") from None

    return checked


@_path_option
def _checkpoint_dir(text: str) -> Path:
    return _writable_folder(text, "directory")


def _without_path(text: str, message: str) -> str:
    """A file error's message without the file name it starts with (the option names it)."""
    return message[len(text) + 2:] if message.startswith(f"{text}: ") else message


def _checkpoint_file(text: str):
    """A published-format checkpoint, read and checked now (`gclab.weather.Checkpoint`)."""
    try:
        return read_checkpoint(text)
    except CheckpointError as e:
        raise _bad(text, _without_path(text, str(e))) from None


def _dataset(text: str):
    """A weather dataset (netCDF file or zarr folder), opened lazily now."""
    try:
        return open_dataset(text)
    except DataError as e:
        raise _bad(text, _without_path(text, str(e))) from None


def _stats_dir(text: str):
    """A folder with the three official statistics files, read now."""
    try:
        return load_stats(text)
    except DataError as e:
        message = str(e)
        for name in STATS_NAMES:
            message = message.replace(str(Path(text) / name), name)
        raise _bad(text, _without_path(text, message)) from None


class _Input(argparse.Action):
    """An input option: `read` (an option type) reads it now, and the path as typed is
    kept as `<dest>_path`, so that no output of the command replaces it (`_check_inputs_kept`).
    """

    def __init__(self, *args, read: Callable[[str], Any], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read = _path_option(read)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        try:
            setattr(namespace, self.dest, self.read(_not_empty(values)))
        except argparse.ArgumentTypeError as e:  # as argparse reports an option type's
            raise argparse.ArgumentError(self, str(e)) from None
        setattr(namespace, f"{self.dest}_path", values)


def _input_files(args) -> list[tuple[str, str]]:
    """(what the message calls it, path) of each input file of an `_Input` option given."""
    files = []
    for dest in ("data", "stats", "checkpoint", "init_checkpoint"):
        text = getattr(args, f"{dest}_path", None)
        if text is None:
            continue
        option = f"--{dest.replace('_', '-')} {_shown(text)}"
        if dest == "stats":
            files += [(f"{name} of {option}", os.path.join(text, name)) for name in STATS_NAMES]
        else:
            files.append((option, text))
    return files


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def _check_inputs_kept(args, option: str, path) -> None:
    """Refuses, before any work, an output `path` that is one of the command's inputs."""
    for what, input_path in _input_files(args):
        if _same_file(path, input_path):
            raise UsageError(f"{option} {_shown(str(path))}: the same file as {what} (an "
                             f"output may not replace an input of the command)")


def _output_folder(text: str) -> Path:
    """A folder to write into: created if its parent exists, checked writable now."""
    return _writable_folder(text, "folder")


@_path_option
def _stats_folder(text: str) -> Path:
    """A folder to write the three statistics files into (`_output_folder`), each checked."""
    path = _output_folder(text)
    for name in STATS_NAMES if path.exists() else ():
        try:
            check_output_path(path / name)
        except OutputPathError as e:
            raise _bad(text, f"{path / name}: {e.reason}") from None
    return path


def _tolerance(text: str) -> float:
    value = _parse_number(text)
    if not 0 < value < math.inf:
        raise _bad(text, "a finite number > 0")
    return value


def _output_file(suffixes: Optional[Callable[[], Sequence[str]] | Sequence[str]] = None
                 ) -> Callable[[str], Path]:
    """A file to write: checked now (folder exists and is writable, not a directory), and
    its suffix one of `suffixes` (a sequence, or a function giving one when a name is
    checked)."""

    @_path_option
    def convert(text: str) -> Path:
        _not_empty(text)
        if text == "-":
            raise _bad(text, "a file name (gclab does not write this to standard output)")
        try:
            return check_output_path(text, suffixes() if callable(suffixes) else suffixes)
        except OutputPathError as e:
            raise _bad(text, e.reason) from None

    return convert


# ------------------------------------------------------------------------- shared options


def _add_model_args(p: argparse.ArgumentParser, *, network: bool = True) -> None:
    g = p.add_argument_group("model (a preset, or a grid and mesh)")
    g.add_argument("--preset", type=_preset,
                   help="a named preset: " + ", ".join(sorted(PRESETS)))
    g.add_argument("--resolution", type=_model_field("resolution", _parse_number),
                   metavar="DEG", help="grid spacing in degrees (divides 180, at most 180)")
    g.add_argument("--mesh-splits", type=_model_field("mesh_splits", _parse_int), metavar="N",
                   help="icosahedron refinements, 0..7")
    g.add_argument("--radius-fraction",
                   type=_model_field("radius_query_fraction_edge_length", _parse_number),
                   metavar="F",
                   help="grid2mesh radius as a fraction of the longest finest edge (0.6)")
    if network:
        g.add_argument("--latent", type=_model_field("latent_size", _parse_int), metavar="L",
                       help="latent width L (default: the preset's, else 32)")
        g.add_argument("--steps", type=_model_field("processor_steps", _parse_int),
                       metavar="S", help="processor steps S (default: the preset's, else 4)")
        g.add_argument("--levels", type=_choice(("13", "37"), int),
                       help="pressure levels, 13 or 37 (default: the preset's, else 13)")


def _add_step_args(g) -> None:
    g.add_argument("--batch", type=_count(1), default=1, metavar="B",
                   help="batch size B (default 1)")
    g.add_argument("--rollout", type=_count(1), default=1, metavar="T",
                   help="autoregressive steps T (default 1)")
    g.add_argument("--precision", type=_choice(PRECISIONS), default="f32",
                   help="f32 or bf16 (default f32)")
    g.add_argument("--cpu-scheduler", type=_choice(tuple(CPU_SCHEDULERS)),
                   help="XLA:CPU's instruction order: breadth-first (XLA's default: "
                   "independent work side by side, for threads) or depth-first (one chain "
                   "at a time: fewer bytes alive, as a rule; same instructions and results); "
                   "default: as XLA_FLAGS say. Other backends schedule on their own")


def _add_memory_args(p: argparse.ArgumentParser, *, several_recipes: bool = False) -> None:
    g = p.add_argument_group("memory techniques")
    _add_step_args(g)
    if several_recipes:
        g.add_argument("--recipe", type=_recipes, default=["none"], metavar="NAME[,NAME...]",
                       help="named recipes, overlaid in one picture: " + ", ".join(RECIPES)
                       + " (default none)")
    else:
        g.add_argument("--recipe", type=_choice(tuple(RECIPES)), default="none",
                       help="named recipe: " + ", ".join(RECIPES) + " (default none)")
    g.add_argument("--remat", type=_remat, metavar="SPEC",
                   help="processor remat: " + REMAT_SPEC_HELP)
    g.add_argument("--edge-block", type=_count(0, "; 0 turns blocks off"), metavar="N",
                   help="edges per block; 0 turns edge blocks off, and with them the "
                   "techniques that need them (processor edge blocks, streamed grid nodes)")


def _resolve_model(args):
    """(ModelConfig, TaskConfig) from --preset or --resolution/--mesh-splits (+ overrides)."""
    return resolve_model(args.preset, resolution=args.resolution, mesh_splits=args.mesh_splits,
                         radius_fraction=args.radius_fraction,
                         latent=getattr(args, "latent", None), steps=getattr(args, "steps", None),
                         levels=getattr(args, "levels", None))


def _resolve_memory(args, recipe: str):
    """The techniques of `recipe` with the memory options, as `sweep` makes them too
    (`gclab.sizing.step.recipe_memory`).

    With a pipeline's per-stage remat (`--parallel ...,stage-remat:A/B`), which takes the
    place of the processor remat, the recipe's own processor remat gives way to it (as
    `gclab plan` sizes such a layout with any recipe); a --remat other than none with it is
    refused, since it would do nothing."""
    remat = getattr(args, "remat", None)
    layout = getattr(args, "layout", None)
    staged = layout is not None and layout.stage_remat is not None
    if staged and remat is not None and parse_remat_spec(remat)["processor_remat"] != "none":
        raise UsageError(f"--remat {_shown(remat)}: only none with --parallel "
                         f"{_shown(args.parallel)} (its stage-remat sets each stage's "
                         f"checkpointed steps in place of the processor remat)")
    return recipe_memory(recipe, args.precision, rollout=args.rollout,
                         remat="none" if staged else remat,
                         edge_block=getattr(args, "edge_block", None))


def _check_remat(args, model: ModelConfig, where: str = "") -> None:
    """Refuses a --remat group of more steps than the processor has (`every:K`, `nested:K`).

    The network would take all steps as one group without a word, which is `every:S`, not
    what was typed. `where` says where the model comes from, if not from its options.
    """
    if args.remat is None:
        return
    fields, steps = parse_remat_spec(args.remat), model.processor_steps
    if fields["processor_remat"] in ("every", "nested") and fields["remat_group_size"] > steps:
        raise UsageError(f"--remat {_shown(args.remat)}: K in 1..{steps} for this model "
                         f"({steps} processor steps{where})")


def _spec(args, recipe: str) -> StepSpec:
    model, task = _resolve_model(args)
    _check_remat(args, model)
    return StepSpec(model, task, _resolve_memory(args, recipe), batch=args.batch,
                    rollout=args.rollout, recipe=recipe)


def _finite(obj):
    """`obj` with non-finite floats as None (strict JSON has no NaN or Infinity)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _print_json(obj) -> None:
    print(json.dumps(_finite(obj), indent=2, sort_keys=True, default=str, allow_nan=False))


def _save_figure(fig, path: Path) -> None:
    """Saves a figure atomically (a temporary file, then renamed into place)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix[1:].lower(), dpi=120, bbox_inches="tight")


# ----------------------------------------------------------------------------------------


def cmd_graph(args) -> int:
    model, _ = _resolve_model(args)
    t0 = time.perf_counter()
    graphs, source = load_or_build_graphs(model.resolution, model.mesh_splits,
                                          model.radius_query_fraction_edge_length,
                                          model.mesh2grid_edge_normalization_factor)
    seconds = time.perf_counter() - t0
    if args.save is not None:
        save_graphs(graphs, args.save)
    counts = graphs.counts()
    if args.json:
        _print_json({**counts, "resolution": model.resolution, "mesh_splits": model.mesh_splits,
                     "radius_query_fraction_edge_length":
                         model.radius_query_fraction_edge_length,
                     "build_seconds": round(seconds, 3), "loaded_from_cache": source.loaded,
                     "cache_path": source.cache_path, "cache_error": source.cache_error,
                     **({"saved": str(args.save)} if args.save is not None else {})})
    else:
        print(f"grid {model.resolution:g} deg ({graphs.n_lat} x {graphs.n_lon}), "
              f"{model.mesh_splits} mesh splits, radius fraction "
              f"{model.radius_query_fraction_edge_length:g}")
        for key, value in counts.items():
            print(f"  {key:<16} {value:>12,}")
        print(f"  {source.describe()}, {seconds:.2f} s")
        if not counts["grid2mesh_edges"]:
            print("  note: no grid node is within the query radius of a mesh node, so the "
                  "encoder passes nothing from grid to mesh (raise --radius-fraction)")
        if args.save is not None:
            print(f"  saved to {args.save} (senders, receivers and features of the three "
                  "graphs)")
    return 0


def cmd_reference(args) -> int:
    fixtures = [load_fixture(path) for path in args.fixtures]  # every file checked first
    status = 0
    for path, fx in zip(args.fixtures, fixtures):
        c = fx.config
        print(f"{path}: {c.resolution:g} deg, {c.mesh_splits} splits, {c.processor_steps} x "
              f"{c.latent_size}, C_in {fx.data_channels}, C_out {fx.output_channels}, "
              f"batch {fx.batch}")
        for check in run_checks(fx, args.tolerance):
            mark = "PASS" if check.passed else "FAIL"
            print(f"  {mark}  {check.name}: max abs error {check.max_abs_error:.3g} "
                  f"({check.detail})")
            status |= not check.passed
    print(f"{'all checks passed' if not status else 'some checks FAILED'} "
          f"(tolerance {args.tolerance:g} absolute)")
    return int(status)


def cmd_memory(args) -> int:
    layout = args.layout
    spec = dataclasses.replace(_spec(args, args.recipe), parallel=layout)
    compiled = compile_train_step(spec)
    record = {**compiled.memory.to_dict(), **spec.describe(), "technique": spec.technique(),
              "devices": layout.devices, "parallel": layout.spec,
              "collectives": compiled.collectives}
    if record["backend"] == "cpu":  # the order XLA:CPU compiled it in (--cpu-scheduler)
        record["cpu_scheduler"] = cpu_scheduler()
    if compiled.cannot_run is not None:  # its memory is still the compiled step's
        record["cannot_run"] = compiled.cannot_run
        print(f"gclab memory: warning: --parallel {_shown(args.parallel)}: this layout cannot "
              f"run (gclab train refuses it): {compiled.cannot_run}", file=sys.stderr)
    if args.json:
        _print_json(record)
        return 0
    print(f"one training step of {spec.title()}")
    print(f"  parameters       {record['num_params']:>14,}")
    keys = ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "total_bytes")
    if layout.devices > 1:
        print(f"  per device ({layout.devices} devices, {layout.spec}):")
        keys += ("collective_bytes",)
    for key in keys:
        print(f"  {key:<16} {format_bytes(record[key]):>14}")
    order = f" ({record['cpu_scheduler']} scheduler)" if "cpu_scheduler" in record else ""
    print(f"  backend {record['backend']}{order}, compiled in {record['compile_seconds']:.1f} s")
    return 0


def cmd_timeline(args) -> int:
    specs = [_spec(args, recipe) for recipe in args.recipe]  # all checked before compiling
    timelines, labels = [], []
    for spec in specs:  # several recipes: overlaid in one picture
        tl = train_step_timeline(spec)
        print(f"{spec.title()}: peak {format_bytes(tl.peak_bytes)} at {tl.peak_stage} "
              f"(compiled temp {format_bytes(tl.temp_bytes)})")
        if args.peak:
            table = tl.peak_table(top=args.peak)
            table["bytes"] = table["bytes"].map(format_bytes)
            print(table.to_string(index=False, max_colwidth=80))
        timelines.append(tl)
        labels.append(spec.memory_label())
    if args.plot:
        from gclab.plots import plot_timeline  # matplotlib: only for a picture (plot_suffixes)

        fig = plot_timeline(timelines if len(timelines) > 1 else timelines[0], labels=labels)
        _save_figure(fig, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _sweep_cache() -> Optional[Path]:
    """The folder `GCLAB_SWEEP_CACHE` names (created if missing), checked before the work."""
    text = os.environ.get(SWEEP_CACHE_ENV, "")
    if not text:
        return None
    try:
        return writable_folder(text, missing="create")
    except OutputPathError as e:
        # A file in its place: "not a directory", as this variable's refusal has said.
        reason = "not a directory" if e.reason == "not a folder" else e.reason
        raise UsageError(f"{SWEEP_CACHE_ENV}={text}: {reason}") from None


def cmd_sweep(args) -> int:
    # The lists replace the model's value: one given with its list would be dropped.
    for one, many in (("latent", "latents"), ("steps", "steps_list")):
        if getattr(args, one) is not None and getattr(args, many) is not None:
            raise UsageError(f"--{one} {getattr(args, one)}: leave it out with "
                             f"--{many.replace('_', '-')} (the sweep takes its values from "
                             "the list)")
    model, task = _resolve_model(args)
    cache = _sweep_cache()
    specs = sweep_grid(model, args.latents or [model.latent_size],
                       args.steps_list or [model.processor_steps], task,
                       techniques=args.recipes, precision=args.precision, batch=args.batch,
                       rollout=args.rollout)
    width = max(10, *(len(spec.technique()) for spec in specs))
    try:
        df = sweep(specs, measure=args.measure, cache_path=cache)
    except KeyboardInterrupt as e:
        done = getattr(e, "rows", None)
        if done is None:  # not in a row (before the first, say)
            raise
        _sweep_interrupted(args, specs, done, width)
    save_sweep(df, args.out)
    _print_sweep_rows(df, args.measure, width)
    print(f"wrote {args.out}")
    status = 0 if (df["status"] == "ok").all() else 1
    if args.plot:
        from gclab.plots import plot_sweep  # matplotlib: only for a picture (plot_suffixes)

        column, title = _SWEEP_PLOTS[args.measure]
        try:
            fig = plot_sweep(df, y=column, title=title)
        except ValueError:  # every row failed: the chart would be empty
            print(f"gclab sweep: --plot {_shown(str(args.plot))}: not written: no row has a "
                  f"{column} to draw (see the rows' status)", file=sys.stderr)
            return 1
        _save_figure(fig, args.plot)
        print(f"wrote {args.plot}")
    return status


#: (column, title) of the picture of a sweep of each --measure: a measured sweep has no
#: compiled bytes, only the peak its fresh process measured.
_SWEEP_PLOTS = {"compiled": ("total_bytes", "Compiled memory per technique"),
                "timed": ("total_bytes", "Compiled memory per technique"),
                "measured": ("peak_bytes", "Measured peak per technique"),
                "both": ("total_bytes", "Compiled memory per technique")}


def _seconds(value) -> str:
    """A step time in milliseconds, or n/a (none: a row that failed)."""
    if value is None or not np.isfinite(float(value)):
        return "n/a"
    return f"{1000 * float(value):.1f} ms"


def _print_sweep_rows(df, measure: str, width: int) -> None:
    """One line per row: compiled total and temp bytes, the measured peak and the step time,
    each where `measure` gives it, and the status."""
    for _, r in df.iterrows():
        parts = []
        if measure != "measured":
            parts += [f"total {format_bytes(r['total_bytes'])}",
                      f"temp {format_bytes(r['temp_bytes'])}"]
        if measure in ("measured", "both"):
            parts.append(f"peak {format_bytes(r['peak_bytes'])}")
        if measure != "compiled":
            parts.append(f"step {_seconds(r['step_seconds'])}")
        print(f"{r['model.processor_steps']:>3} x {r['model.latent_size']:<5} "
              f"{r['technique']:<{width}} {' '.join(parts)} {r['status']}")


def _sweep_interrupted(args, specs: list, done, width: int) -> None:
    """Keeps the rows a sweep completed before Ctrl-C: they are written to --out (a whole
    record of those rows; nothing is written, nor an earlier file replaced, where there is
    none), and the rows not run are listed as such."""
    if len(done):
        save_sweep(done, args.out)
        _print_sweep_rows(done, args.measure, width)
    for spec in specs[len(done):]:
        m = spec.model
        print(f"{m.processor_steps:>3} x {m.latent_size:<5} {spec.technique():<{width}} not run")
    wrote = (f"wrote them to {args.out}" if len(done)
             else f"nothing was written to --out {_shown(str(args.out))}")
    left = len(specs) - len(done)
    print(f"gclab sweep: interrupted after {len(done)} of {len(specs)} rows; {wrote}; the "
          f"{left} row{'s' if left > 1 else ''} marked 'not run' above "
          f"{'were' if left > 1 else 'was'} not run", file=sys.stderr)
    raise _Interrupted


def _check_plan_options(args) -> None:
    """Refuses what `gclab plan` would ignore: --recipes on one device (its planner picks
    each technique's setting, not a recipe), --compiled over devices (always compiled), and
    a card's budget read through a bad `XLA_CLIENT_MEM_FRACTION` (`_budget`)."""
    over_devices = args.devices is not None and args.devices > 1
    if args.recipes is not None and not over_devices:
        raise UsageError(f"--recipes {_shown(','.join(args.recipes))}: only with --devices N, "
                         "N >= 2 (on one device the plan chooses each technique's setting, "
                         "not among named recipes)")
    if args.compiled is not None and over_devices:
        raise UsageError(f"--compiled {args.compiled}: only without --devices (a plan over "
                         "devices compiles every candidate)")
    try:
        parse_budget(args.budget)
    except ValueError:
        raise UsageError(_mem_fraction_error()) from None
    if args.devices is not None and args.devices > MAX_CPU_DEVICES:
        raise UsageError(f"--devices {args.devices}: at most {MAX_CPU_DEVICES} (JAX's CPU "
                         f"backend runs no more devices in one process)")


def cmd_plan(args) -> int:
    model, task = _resolve_model(args)
    if args.devices is not None and args.devices > 1:
        planner = functools.partial(plan_layout, devices=args.devices, recipes=args.recipes)
    else:
        planner = functools.partial(plan, use_compiled={None: "auto", "auto": "auto", "yes": True,
                                                        "no": False}[args.compiled])
    try:
        result = planner(args.budget, model, task, batch=args.batch, rollout=args.rollout,
                         precision=args.precision)
    except NothingFits as e:
        print(f"gclab plan: {e}", file=sys.stderr)
        if args.json:  # a script that reads the report gets one: what was sized, none fits
            _print_json({"fits": False, "error": str(e), "candidates": e.candidates})
        return 1
    if args.json:
        _print_json(result.to_dict())
    else:
        print(result.explain())
    return 0


# ------------------------------------------------------------------------- devices, training


def _add_parallel_args(p: argparse.ArgumentParser, processes: bool = False) -> None:
    g = p.add_argument_group("devices (a layout over several devices)")
    g.add_argument("--devices", type=_count(1), metavar="N",
                   help="devices of the layout (simulated CPU devices on a CPU; default: the "
                   "layout's)")
    g.add_argument("--parallel", type=_parallel, metavar="SPEC",
                   help=f"layout: {PARALLEL_SPEC_HELP} (default data:DEVICES)")
    if processes:
        g.add_argument("--coordinator", type=_host_port, metavar="HOST:PORT",
                       help="process 0's address in a multi-process run "
                       "(default $JAX_COORDINATOR_ADDRESS)")
        g.add_argument("--num-processes", type=_count(1), metavar="P",
                       help="processes in the run (default $JAX_NUM_PROCESSES)")
        g.add_argument("--process-id", type=_count(0), metavar="I",
                       help="this process's index (default $JAX_PROCESS_ID)")
        # JAX takes the timeout (ours plus the grace) as a 32-bit count of seconds.
        g.add_argument("--coordinator-timeout", default=DEFAULT_INIT_TIMEOUT,
                       type=_count(1, maximum=MAX_INT32 - JOIN_GRACE_SECONDS),
                       metavar="SECONDS", help="how long every process waits for all of them "
                       f"to join before it stops and says what to check ({DEFAULT_INIT_TIMEOUT},"
                       " as JAX)")


def _resolve_parallel(args) -> ParallelConfig:
    """The layout of --parallel and --devices (which must agree)."""
    if args.parallel is None:
        return ParallelConfig(data=args.devices or 1)
    layout = parse_parallel_spec(args.parallel)
    if args.devices is not None and layout.devices != args.devices:
        raise UsageError(f"--parallel {_shown(args.parallel)}: its axis sizes must multiply to "
                         f"--devices {args.devices}, not {layout.devices}")
    return layout


def _env_int(name: str, minimum: int = 0) -> Optional[int]:
    """`gclab.parallel.processes.env_count`, its refusal worded as the CLI's are."""
    try:
        return env_count(name, minimum)
    except ValueError:
        text = os.environ.get(name, "").strip()
        raise UsageError(f"{name}={_shown(text)}: an integer >= {minimum}") from None


def _env_host_port(name: str) -> Optional[str]:
    text = os.environ.get(name, "")
    if not text:
        return None
    try:
        return _host_port(text)
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"{name}={e}") from None


@dataclasses.dataclass(frozen=True)
class _Processes:
    """A run's processes as the options, else the environment variables, give them; each
    `*_name` is what a message calls the value (`--num-processes 2`, `JAX_NUM_PROCESSES=2`).
    """

    count: int = 1
    count_name: str = ""
    process_id: Optional[int] = None
    id_name: str = ""
    coordinator: Optional[str] = None
    coordinator_name: str = ""


def _given(option: str, value, env: str, read: Callable[[str], Any]) -> tuple[Any, str]:
    """(value, what a message calls it) of an option, else of its environment variable."""
    if value is not None:
        return value, f"{option} {value}"
    value = read(env)
    return value, f"{env}={value}" if value is not None else ""


def _processes(args, devices: int) -> _Processes:
    """The processes of `gclab train`, checked against each other and the layout's devices."""
    count, count_name = _given("--num-processes", args.num_processes, NUM_PROCESSES_ENV,
                               lambda name: _env_int(name, minimum=1))
    process_id, id_name = _given("--process-id", args.process_id, PROCESS_ID_ENV, _env_int)
    coordinator, coordinator_name = _given("--coordinator", args.coordinator, COORDINATOR_ENV,
                                           _env_host_port)
    count = count or 1
    if process_id is not None and process_id >= count:
        raise UsageError(f"{id_name}: an integer in 0..num-processes - 1 (0..{count - 1} here)")
    if devices % count:
        raise UsageError(f"{count_name}: it must divide the layout's {devices} devices")
    if count > 1 and coordinator is None:
        raise UsageError(f"{count_name}: several processes need process 0's address: "
                         f"--coordinator HOST:PORT (or {COORDINATOR_ENV})")
    if coordinator is not None and process_id is None:
        if count > 1:
            raise UsageError(f"{coordinator_name}: each of the {count} processes needs its "
                             f"index: --process-id I (or {PROCESS_ID_ENV})")
        process_id = 0  # the only process there is
    return _Processes(count, count_name, process_id, id_name, coordinator, coordinator_name)


def _answers(address: str, seconds: float = 2.0) -> bool:
    """Whether anything accepts a connection at `HOST:PORT` within `seconds`."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=seconds):
            return True
    except OSError:
        return False


def _port_taken(address: str) -> bool:
    """Whether another program listens on `address`'s port here (process 0 serves there)."""
    port = int(address.rpartition(":")[2])
    # As JAX's gRPC server binds it: every interface, IPv6 and IPv4 where there is IPv6.
    family, host = (socket.AF_INET6, "::") if socket.has_ipv6 else (socket.AF_INET, "")
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: not TIME_WAIT
            s.bind((host, port))
    except OSError as e:
        return e.errno == errno.EADDRINUSE
    return False


def _join(procs: _Processes, timeout: int) -> None:
    """Joins the multi-process run, or says in one line why not within `timeout` seconds.

    When the processes have not all joined in time, JAX ends the process in C++ (XLA's
    DEADLINE_EXCEEDED check failure, an abort with a stack trace, not a Python exception).
    So JAX is given a little longer, and a timer of our own, which runs while JAX waits
    (its wait releases the GIL), says what to check and ends the process first.
    """
    if procs.process_id == 0 and _port_taken(procs.coordinator):
        # JAX would fail to serve there, by an error or, as often, a segmentation fault.
        raise UsageError(f"{procs.coordinator_name}: its port is in use on this host, where "
                         f"process 0 serves the run: choose a free port")
    joined = threading.Event()

    def give_up() -> None:
        if joined.is_set():
            return
        where = procs.coordinator_name
        if procs.process_id and not _answers(procs.coordinator):
            why = (f"nothing answered there in {timeout} s: check that process 0 runs with "
                   f"the same address, and that this host can reach it")
        else:
            count = procs.count_name or f"--num-processes {procs.count}"
            why = (f"not all {procs.count} processes joined in {timeout} s: check that each "
                   f"runs with this address, {count} and its own --process-id")
        print(f"gclab train: error: {where}: {why} (--coordinator-timeout {timeout})",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)

    timer = threading.Timer(timeout, give_up)
    timer.daemon = True
    timer.start()
    try:
        initialize_processes(procs.coordinator, procs.count, procs.process_id,
                             timeout=timeout + JOIN_GRACE_SECONDS)
    except jax.errors.JaxRuntimeError as e:  # e.g. process 0's port taken: a Python error
        reason = str(e).strip().split("\n")[0]
        hint = ": is the port free on this host?" if procs.process_id == 0 else ""
        raise UsageError(f"{procs.coordinator_name}: could not join the run ({reason}){hint}"
                         ) from None
    finally:
        joined.set()
        timer.cancel()


def _check_device_count(args, layout: ParallelConfig, processes: int) -> None:
    """Refuses a layout of more devices in one process than JAX's CPU backend runs."""
    per_process = layout.devices // processes
    if per_process <= MAX_CPU_DEVICES:
        return
    option = (f"--parallel {_shown(args.parallel)}" if args.parallel is not None
              else f"--devices {args.devices}")
    over = f" ({layout.devices} over {processes} processes)" if processes > 1 else ""
    raise UsageError(f"{option}: at most {MAX_CPU_DEVICES} devices in one process (JAX's CPU "
                     f"backend runs no more), not {per_process}{over}")


@contextlib.contextmanager
def _stdout_for_json_only(json_output: bool):
    """With `json_output`, what native libraries write to file descriptor 1 goes to stderr
    (Gloo, which joins the processes of a multi-process run on CPUs, prints a line there),
    while Python's `print` still writes to the real stdout: the JSON stays parseable.

    Only where `sys.stdout` is file descriptor 1 itself (not a capture or a pipe object of
    another kind); otherwise nothing changes.
    """
    try:
        own = json_output and sys.stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        own = False
    if not own:
        yield
        return
    sys.stdout.flush()
    real = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    previous, sys.stdout = sys.stdout, real
    try:
        yield
    finally:
        real.flush()
        os.dup2(real.fileno(), 1)
        sys.stdout = previous
        real.close()


def start_devices(args) -> None:
    """Sets up the devices a layout needs, before JAX starts its backends.

    JAX starts its backends lazily, at the first array or device query, and nothing in
    gclab makes one at import; so the CPU device count is set here, after the options
    are parsed and before any JAX operation, with no need to re-execute the process. On
    an accelerator the setting only concerns the CPU and the layout uses the accelerators.
    A multi-process run is joined here too (`jax.distributed.initialize` also comes first).
    """
    if not hasattr(args, "parallel"):  # plan: every layout of --devices devices
        _check_plan_options(args)  # before JAX's CPU devices are set
        if args.devices is not None and args.devices > 1:
            use_cpu_devices(args.devices)
        return
    layout = args.layout = _resolve_parallel(args)
    procs = _processes(args, layout.devices) if hasattr(args, "num_processes") else _Processes()
    _check_device_count(args, layout, procs.count)
    multiple = layout.data * _resolve_memory(args, args.recipe).microbatches
    if args.batch % (multiple * layout.microbatches):
        raise UsageError(f"--batch {args.batch}: a multiple of {multiple * layout.microbatches}"
                         f" (the data axis times the recipe's gradient-accumulation micro-batches"
                         + (f" times the pipeline's microbatches:{layout.microbatches})"
                            if layout.pipeline > 1 else ")"))
    if layout.pipeline > 1:
        ckpt = getattr(args, "init_checkpoint", None)
        model = ckpt.model if ckpt is not None else _resolve_model(args)[0]
        try:
            layout.stage_bounds(model.processor_steps)
        except ValueError as e:
            raise UsageError(f"--parallel {_shown(args.parallel)}: {e}") from None
    if layout.devices > 1:
        use_cpu_devices(max(1, layout.devices // procs.count))
    if procs.coordinator is not None:
        _join(procs, args.coordinator_timeout)


def _train_sources(args):
    """(model, task, weather or None, init params or None) of `gclab train`'s options."""
    ckpt = args.init_checkpoint
    if ckpt is not None:
        given = [f"--{k.replace('_', '-')}" for k in ("preset", "resolution", "mesh_splits",
                                                      "radius_fraction", "latent", "steps",
                                                      "levels") if getattr(args, k) is not None]
        if given:
            raise UsageError(f"{given[0]}: leave it out with --init-checkpoint (the "
                             f"checkpoint sets the model and task)")
        model, task = ckpt.model, ckpt.task
    else:
        model, task = _resolve_model(args)
    if (args.data is None) != (args.stats is None):
        raise UsageError("--data and --stats go together (training on real data needs "
                         "its normalisation statistics: gclab stats --data PATH --out DIR)")
    weather = None
    if args.data is not None:
        lat = np.linspace(-90.0, 90.0, model.n_lat)
        lon = np.arange(model.n_lon) * model.resolution
        try:
            weather = DatasetWeather(args.data, task, args.stats, lat, lon)
        except DataError as e:
            raise UsageError(f"--data/--stats: {e}") from None
        if weather.windows(args.rollout) < 1:
            frames = args.data.sizes["time"]
            _check_frames(args, frames, "training", "a target")
            raise UsageError(f"--rollout {args.rollout}: the dataset has {frames} time steps, "
                             f"a rollout of {args.rollout} needs {args.rollout + 2}")
    params = None if ckpt is None else params_to_gclab_channels(ckpt.params, task,
                                                                 model.hidden_layers)
    return model, task, weather, params


def _check_frames(args, frames: int, what: str, third: str) -> None:
    """Refuses a `--data` too short for any step (fewer than 3 time steps: 2 input frames
    and `third`), naming the file rather than the option whose limit it would break."""
    if frames < 3:
        raise UsageError(f"--data {_shown(str(args.data_path))}: {frames} time "
                         f"step{'s' if frames != 1 else ''}; {what} needs at least 3 (2 input "
                         f"frames and {third})")


#: The option of each `train` argument a checkpoint records (`gclab.training.loop.RUN_SETTINGS`).
_SCHEDULE_OPTIONS = {"schedule_steps": "--schedule-steps", "learning_rate": "--learning-rate",
                     "real_data": "--data", "seed": "--seed", "batch": "--batch",
                     "rollout": "--rollout", "data": "--data", "stats": "--stats"}


def _schedule_mismatch(e: ScheduleMismatch, folder: str) -> str:
    """The one-line message of a resumed run whose settings are not its checkpoint's."""
    option = _SCHEDULE_OPTIONS[e.name]
    where = f"the checkpoint in --checkpoint-dir {folder} (step {e.step}) was trained"
    if e.name == "data":  # `weather_fingerprint`'s words: times, grid, levels
        return (f"--data: {where} on another dataset ({e.stored}; this one has {e.given}); "
                f"resume with that one, or start another --checkpoint-dir")
    if e.name == "stats":
        return (f"--stats: {where} with other normalisation statistics ({e.stored}; these "
                f"are {e.given}); resume with those, or start another --checkpoint-dir")
    if e.name == "real_data":
        return (f"--data: {where} {'with' if e.stored else 'without'} --data (on "
                f"{'real' if e.stored else 'synthetic'} weather); resume "
                f"{'with' if e.stored else 'without'} it, or start another --checkpoint-dir")
    shown = (lambda v: f"{v:g}") if e.name == "learning_rate" else str
    return (f"{option} {shown(e.given)}: {where} with {option} {shown(e.stored)}; resume "
            f"with that, or start another --checkpoint-dir")


#: The option of each model setting a checkpoint records (`gclab.training.loop.MODEL_SETTINGS`;
#: the mesh2grid normalisation has none: it comes with --init-checkpoint only).
_MODEL_OPTIONS = {"resolution": "--resolution", "mesh_splits": "--mesh-splits",
                  "radius_query_fraction_edge_length": "--radius-fraction",
                  "pressure_levels": "--levels", "precision": "--precision"}


def _model_mismatch(e: ModelMismatch, folder: str) -> Optional[str]:
    """The one-line message of a resumed run of another model function, naming its option
    (None for a setting no option sets: the folder's message is said instead)."""
    option = _MODEL_OPTIONS.get(e.name)
    if option is None:
        return None

    def shown(value) -> str:  # levels as --levels counts them; numbers as typed
        if isinstance(value, (list, tuple)):
            return str(len(value))
        return f"{value:g}" if isinstance(value, float) else str(value)

    return (f"{option} {shown(e.given)}: the checkpoint in --checkpoint-dir {folder} (step "
            f"{e.step}) was trained with {option} {shown(e.stored)}; resume with that, or "
            f"start another --checkpoint-dir")


def _check_train_options(args) -> None:
    """Refuses, before any work, what `gclab train` would ignore or fail on at its end."""
    if args.train_steps > args.schedule_steps:  # the rate and decay are 0 past it
        raise UsageError(f"--train-steps {args.train_steps}: at most --schedule-steps "
                         f"{args.schedule_steps} (the learning rate is 0 past the schedule's "
                         "end; set --schedule-steps to the steps the whole run takes)")
    if args.seed is not None and args.init_checkpoint is not None and args.data is not None:
        raise UsageError(f"--seed {args.seed}: leave it out with --init-checkpoint and --data "
                         "(the checkpoint sets the parameters and the data the examples: "
                         "nothing is seeded)")
    if args.save_every is not None and args.checkpoint_dir is None:
        raise UsageError(f"--save-every {args.save_every}: only with --checkpoint-dir DIR "
                         "(the folder it saves to)")
    if args.save_checkpoint is not None:
        _check_inputs_kept(args, "--save-checkpoint", args.save_checkpoint)
        folder = args.checkpoint_dir
        if folder is not None:  # orbax owns that folder, and refuses files it did not write
            save = Path(os.path.realpath(args.save_checkpoint))
            owned = Path(os.path.realpath(folder))
            if save == owned or owned in save.parents:
                where = "the same path as" if save == owned else "inside"
                raise UsageError(f"--save-checkpoint {_shown(str(args.save_checkpoint))}: "
                                 f"{where} --checkpoint-dir {_shown(str(folder))} (orbax's "
                                 "folder); write the weights elsewhere")


def _stopped_saved(args, stopped, failed: bool = False) -> str:
    """What a run that stopped at a step saved (`gclab.training.loop.Stopped`), in words;
    `failed`: the step failed (rather than being interrupted)."""
    if stopped.saved is None:
        return f"nothing was saved ({stopped.why_not})"
    return (f"saved step {stopped.saved} to --checkpoint-dir {_shown(str(args.checkpoint_dir))}"
            ": resume with the same command" + (" once that is fixed" if failed else ""))


#: `gclab train` options the processes of one run may give differently: its own index, how
#: it reports (only process 0 prints and writes --save-checkpoint), how long it waits to
#: join, and how it meets the others (joining checked those); --devices and --parallel are
#: compared as the layout they make.
_PER_PROCESS = {"command", "func", "process_id", "json", "save_checkpoint",
                "coordinator_timeout", "coordinator", "num_processes", "devices", "parallel"}


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little", signed=True)


def _run_options(args, weather, init_params) -> list[tuple[str, str, str]]:
    """(option, its value as a message shows it, what identifies the value) of each option
    that sets a run, in the parser's order: input files by what they hold (a dataset by
    `weather_fingerprint`, weights by a hash), not by their path, which may differ between
    hosts."""
    fingerprint = weather_fingerprint(weather) if weather is not None else {}
    options = []
    for dest, value in vars(args).items():
        if dest in _PER_PROCESS or dest.endswith("_path"):
            continue
        option = "--parallel" if dest == "layout" else f"--{dest.replace('_', '-')}"
        shown = getattr(args, f"{dest}_path", None)
        if dest == "layout":
            shown = ident = value.spec
        elif dest == "data":
            ident = fingerprint.get("data")
        elif dest == "stats":
            ident = fingerprint.get("stats")
        elif dest == "init_checkpoint":
            ident = None if init_params is None else tree_digest(init_params)
        elif dest == "seed":
            shown = ident = 0 if value is None else value  # the default, given or not
        elif dest == "checkpoint_dir":
            shown, ident = value, None if value is None else str(value.resolve())
        else:
            shown = ident = value
        options.append((option, "left out" if shown is None else _shown(str(shown)),
                        repr(ident)))
    return options


def _check_same_options(args, weather, init_params) -> None:
    """Refuses processes of one multi-process run given different options (all but
    `_PER_PROCESS`): each would train on its own settings, out of step with the others, and
    the checkpoint record one of them. Every process gathers every process's digests of its
    options, so all of them refuse, naming the first option that differs."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    options = _run_options(args, weather, init_params)
    digests = np.array([_digest(f"{option}={ident}") for option, _, ident in options], np.int32)
    every = np.asarray(multihost_utils.process_allgather(digests))  # [processes, options]
    differ = np.flatnonzero((every != every[:1]).any(axis=0))
    if differ.size:
        j = int(differ[0])
        option, shown, _ = options[j]
        mine = every[jax.process_index(), j]
        others = [str(i) for i in range(len(every)) if every[i, j] != mine]
        which = (f"processes {', '.join(others)} of this run were" if len(others) > 1
                 else f"process {others[0]} of this run was")
        raise UsageError(f"{option} {shown}: {which} given another {option}; give every "
                         f"process the same options (all but --process-id)")


def cmd_train(args) -> int:
    layout = args.layout
    _check_train_options(args)
    seed = 0 if args.seed is None else args.seed
    model, task, weather, init_params = _train_sources(args)
    _check_remat(args, model, ", from --init-checkpoint" if args.init_checkpoint else "")
    memory = _resolve_memory(args, args.recipe)
    _check_same_options(args, weather, init_params)
    lead = jax.process_index() == 0
    progress = functools.partial(tqdm.tqdm, desc="gclab train", unit="step", file=sys.stderr,
                                 disable=not lead or None)
    try:
        result = train(model, task, args.train_steps, batch=args.batch, rollout=args.rollout,
                       memory=memory, parallel=layout, seed=seed,
                       learning_rate=args.learning_rate, schedule_steps=args.schedule_steps,
                       checkpoint_dir=None if args.checkpoint_dir is None
                       else str(args.checkpoint_dir.resolve()),
                       save_every=args.save_every, progress=progress, weather=weather,
                       init_params=init_params)
    except StagesWouldHang as e:  # found in the compiled step, before it ran
        raise UsageError(f"--parallel {_shown(args.parallel)}: {e.reason}") from None
    except ScheduleMismatch as e:  # resuming would change the run: the option, not the folder
        raise UsageError(_schedule_mismatch(e, _shown(str(args.checkpoint_dir)))) from None
    except ModelMismatch as e:  # another model function: its option, where one sets it
        folder = _shown(str(args.checkpoint_dir))
        raise UsageError(_model_mismatch(e, folder) or f"--checkpoint-dir {folder}: {e}"
                         ) from None
    except (RestoreError, CheckpointDirError) as e:  # the checkpoint folder
        raise UsageError(f"--checkpoint-dir {_shown(str(args.checkpoint_dir))}: {e}") from None
    except StepsReached as e:  # the run would take no step, and save nothing
        raise UsageError(f"--train-steps {args.train_steps}: the checkpoint in --checkpoint-dir "
                         f"{_shown(str(args.checkpoint_dir))} is at step {e.step} already (a "
                         f"resumed run continues up to --train-steps: give more than "
                         f"{e.step})") from None
    except SaveError as e:  # the steps ran, their state could not be kept: exit status 1
        held = latest_step(str(args.checkpoint_dir))  # a --save-every step before, say
        kept = (f"; step {held} is kept there: resume with the same command once that is "
                "fixed" if held is not None and held < e.step else "")
        print(f"gclab train: error: --checkpoint-dir {_shown(str(args.checkpoint_dir))}: "
              f"could not save step {e.step} ({e.reason}){kept}", file=sys.stderr)
        return 1
    except TrainingDiverged as e:  # not the input's fault as such: exit status 1
        kept = (f"; earlier checkpoints in --checkpoint-dir {_shown(str(args.checkpoint_dir))}"
                " are kept" if args.checkpoint_dir is not None
                and (e.resumed is not None or e.saved is not None) else "")
        nothing = "nothing" if e.saved is None else f"nothing after step {e.saved}"
        what = (f"the weights are not finite after step {e.step} (loss {e.loss:g}, gradient "
                f"norm {e.grad_norm:g})" if e.weights else
                f"the loss is {e.loss:g} at step {e.step} (gradient norm {e.grad_norm:g})")
        print(f"gclab train: error: {what}: training diverged and {nothing} was saved{kept}; "
              f"try a lower --learning-rate (now {args.learning_rate:g})"
              # A resume must keep the rate: a lower one starts in another folder.
              + (" with another --checkpoint-dir" if args.checkpoint_dir is not None else "")
              + (", or check --data for missing values" if args.data is not None else ""),
              file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C: what was saved, where a folder was given
        stopped = getattr(e, "stopped", None)
        if stopped is None:
            raise
        # `train` saved synchronously (orbax's writes had ended) before it re-raised.
        what, status = _stop(e)
        print(f"gclab train: {what} at step {stopped.step}; {_stopped_saved(args, stopped)}",
              file=sys.stderr)
        raise _Interrupted(status) from e
    except (ValueError, OSError) as e:  # a step's data (a DataError) or a file that failed
        stopped = getattr(e, "stopped", None)
        if stopped is None:
            raise
        what = (f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
                if isinstance(e, OSError) and e.strerror else str(e).strip().split("\n")[0])
        print(f"gclab train: error: step {stopped.step}: {what}; "
              f"{_stopped_saved(args, stopped, failed=True)}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    if not lead:
        return 0
    if args.save_checkpoint is not None:
        params = jax.tree_util.tree_map(np.asarray, jax.device_get(result.state.params))
        init = args.init_checkpoint
        ckpt = Checkpoint.from_gclab(
            params_to_official_channels(params, task, model.hidden_layers), model, task,
            f"gclab train: {result.steps} steps"
            + (f" from {init.description}" if init is not None and init.description else ""),
            init.license if init is not None else "")
        write_checkpoint(args.save_checkpoint, ckpt)
    record = {"losses": result.losses, "grad_norms": result.grad_norms,
              "first_step": result.first_step, "steps": result.steps,
              "checkpoint_step": result.checkpoint, "devices": layout.devices,
              "parallel": layout.spec, "processes": jax.process_count(),
              "backend": jax.default_backend(), "model": dataclasses.asdict(model),
              "levels": task.num_levels, "memory": dataclasses.asdict(memory),
              "batch": args.batch, "rollout": args.rollout, "seed": seed}
    if args.json:
        _print_json(record)
        return 0
    for k, loss in enumerate(result.losses, start=result.first_step + 1):
        print(f"  step {k:>5}  loss {loss:.6f}")
    where = f", saved step {result.checkpoint} to {args.checkpoint_dir}" if (
        result.checkpoint is not None) else ""
    print(f"trained to step {result.steps} on {layout.devices} {jax.default_backend()} "
          f"device(s) ({layout.spec}){where}")
    return 0


def cmd_forecast(args) -> int:
    _check_inputs_kept(args, "--out", args.out)
    ckpt = args.checkpoint
    model, task = ckpt.model, ckpt.task
    lat = np.linspace(-90.0, 90.0, model.n_lat)
    lon = np.arange(model.n_lon) * model.resolution
    try:  # the files against each other, before any graph is built
        ds = check_dataset(args.data, task, lat, lon)
        normalization_from_stats(args.stats, task)
    except DataError as e:
        raise UsageError(f"--data/--stats: {e}") from None
    _check_frames(args, ds.sizes["time"], "a forecast", "the forcings of one step")
    if ds.sizes["time"] < args.forecast_steps + 2:
        raise UsageError(f"--forecast-steps {args.forecast_steps}: at most "
                         f"{ds.sizes['time'] - 2} (the dataset has {ds.sizes['time']} time "
                         f"steps: 2 input frames, and the forcings of each step)")
    pred = forecast(ckpt, ds, args.stats, args.forecast_steps)
    write_dataset(pred, args.out)
    print(f"wrote {args.forecast_steps} step(s) of {len(pred.data_vars)} variables, batch "
          f"{pred.sizes['batch']}, to {args.out}")
    return 0


def cmd_stats(args) -> int:
    for name in STATS_NAMES:
        _check_inputs_kept(args, "--out", args.out / name)
    try:
        stats = compute_stats(args.data)
    except DataError as e:
        raise UsageError(f"--data: {e}") from None
    (link_target(args.out) or args.out).mkdir(exist_ok=True)
    write_stats(stats, args.out)
    print(f"wrote {', '.join(STATS_NAMES)} ({len(stats.mean.data_vars)} variables) to "
          f"{args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gclab", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.commands = sub.choices

    p = sub.add_parser("graph", help="node and edge counts of a grid and multimesh")
    _add_model_args(p, network=False)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--save", type=_output_file((".npz",)), metavar="FILE.npz",
                   help="write the three graphs (senders, receivers) and static features")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("reference", help="check gclab against official fixtures")
    p.add_argument("fixtures", nargs="+", type=_not_empty, metavar="PATH.npz",
                   help="fixtures written by the official code (a PATH.json sidecar is read "
                   "if present)")
    p.add_argument("--tolerance", type=_tolerance, default=1e-5,
                   help="max abs error, a finite number > 0 (default 1e-5)")
    p.set_defaults(func=cmd_reference)

    p = sub.add_parser("memory", help="compiled memory of one training step (no allocation; "
                       "per device for a layout)")
    _add_model_args(p)
    _add_memory_args(p)
    _add_parallel_args(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_memory)

    p = sub.add_parser("timeline", help="memory timeline of one training step "
                       "(--recipe A,B overlays several)")
    _add_model_args(p)
    _add_memory_args(p, several_recipes=True)
    p.add_argument("--plot", type=_output_file(plot_suffixes), metavar="FILE.png",
                   help="save the timeline picture (the suffix sets the format: png, pdf, "
                   "svg, ...)")
    p.add_argument("--peak", type=_count(1), metavar="N",
                   help="list the N largest buffers live at the peak (type, bytes, stage, op)")
    p.set_defaults(func=cmd_timeline)

    p = sub.add_parser("sweep", help="configs x techniques, compiled and/or measured "
                       f"(rows cached in ${SWEEP_CACHE_ENV} if set)")
    _add_model_args(p)
    g = p.add_argument_group("sweep")
    g.add_argument("--latents", type=_model_list("latent_size"), metavar="L[,L...]",
                   help="comma-separated latent widths (default: the model's; not with "
                   "--latent)")
    g.add_argument("--steps-list", type=_model_list("processor_steps"), metavar="S[,S...]",
                   help="comma-separated processor steps (default: the model's; not with "
                   "--steps)")
    g.add_argument("--recipes", type=_recipes, default=_recipes("none,per-step,deepmind,lean"),
                   metavar="NAME[,NAME...]",
                   help="comma-separated recipes: " + ", ".join(RECIPES) + " (default all)")
    _add_step_args(g)
    g.add_argument("--measure", type=_choice(MEASURES), default="compiled",
                   help="compiled (no allocation, the default), timed, measured (fresh "
                   "process) or both")
    g.add_argument("--out", type=_output_file(SWEEP_SUFFIXES), required=True,
                   metavar="FILE.json", help="write the rows as JSON records (.json) or CSV "
                   "(.csv)")
    g.add_argument("--plot", type=_output_file(plot_suffixes), metavar="FILE.png",
                   help="save a picture of the sweep (the suffix sets the format)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("plan", help="technique settings that fit a memory budget")
    p.add_argument("--budget", type=_budget, required=True,
                   help="bytes (16GiB, 12GB, 500MiB) or a card: " + ", ".join(CARDS))
    _add_model_args(p)
    g = p.add_argument_group("step")
    _add_step_args(g)
    g.add_argument("--compiled", type=_choice(("auto", "yes", "no")),
                   help="without --devices: verify with compiled figures: yes, no, or auto "
                   "(the default: where compiling is quick)")
    g.add_argument("--devices", type=_count(1), metavar="N",
                   help="plan a layout over N devices (every data x spatial layout and recipe "
                   "is compiled, and data x pipeline layouts with stages chosen by MILP are "
                   "weighed; the budget is per device; simulated CPU devices on a CPU)")
    g.add_argument("--recipes", type=_recipes, metavar="NAME[,NAME...]",
                   help="with --devices: the recipes to consider (default all: "
                   + ", ".join(RECIPES) + ")")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("train", help="train on synthetic or real weather (one device or a "
                       "layout), from scratch or from published weights")
    _add_model_args(p)
    _add_memory_args(p)
    g = p.add_argument_group("training")
    g.add_argument("--train-steps", type=_count(1), required=True, metavar="K",
                   help="the step count to reach (a resumed run continues up to it); at most "
                   "--schedule-steps")
    g.add_argument("--seed", type=_count(0), metavar="S",
                   help="seeds the synthetic weather (without --data) and the starting "
                   "parameters (without --init-checkpoint); refused with both (0)")
    g.add_argument("--learning-rate", type=_learning_rate, default=1e-3, metavar="LR",
                   help=f"peak learning rate, at most {FLOAT32_MAX:g} (1e-3)")
    g.add_argument("--schedule-steps", type=_count(1), default=DEFAULT_SCHEDULE_STEPS,
                   metavar="N", help="length of the learning-rate schedule: warm-up over its "
                   f"first tenth, then cosine decay ({DEFAULT_SCHEDULE_STEPS}); at least "
                   "--train-steps")
    g.add_argument("--checkpoint-dir", type=_checkpoint_dir, metavar="DIR",
                   help="resume from the latest checkpoint in DIR, and save there at the end, "
                   "or after the last completed step when a run is interrupted or a step fails "
                   f"(one process); orbax keeps the {KEPT_CHECKPOINTS} newest checkpoints "
                   "there, deleting older ones, and DIR must hold no other entry named like a "
                   "step (a number). A resumed run must keep --schedule-steps, "
                   "--learning-rate, --batch, --rollout, --data (the same dataset) and --stats, "
                   "or their absence, --seed on synthetic weather, and the model's "
                   "--resolution, --mesh-splits, --radius-fraction, --levels and --precision")
    g.add_argument("--save-every", type=_count(1), metavar="N",
                   help="with --checkpoint-dir, also save there after every N-th step (N, 2N, "
                   "...), so that a run killed outright (out of memory, preempted) resumes from "
                   "the last of them; a resumed run may change it")
    g = p.add_argument_group("real weather and published weights")
    g.add_argument("--data", action=_Input, read=_dataset, metavar="PATH",
                   help="train on this dataset (netCDF file or zarr folder, official layout) "
                   "instead of synthetic weather; needs --stats")
    g.add_argument("--stats", action=_Input, read=_stats_dir, metavar="DIR",
                   help="folder with mean_by_level.nc, stddev_by_level.nc, "
                   "diffs_stddev_by_level.nc")
    g.add_argument("--init-checkpoint", action=_Input, read=_checkpoint_file,
                   metavar="FILE.npz",
                   help="start from these weights (published format); the checkpoint sets "
                   "the model and task")
    g.add_argument("--save-checkpoint", type=_output_file((".npz",)), metavar="FILE.npz",
                   help="write the trained weights in the published format (not inside "
                   "--checkpoint-dir)")
    _add_parallel_args(p, processes=True)
    p.add_argument("--json", action="store_true", help="print JSON ({\"losses\": [...], ...})")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("forecast", help="autoregressive forecast from a checkpoint and "
                       "official-layout weather")
    p.add_argument("--checkpoint", action=_Input, read=_checkpoint_file, required=True,
                   metavar="FILE.npz",
                   help="a checkpoint in the published format (params, model_config, "
                   "task_config)")
    p.add_argument("--data", action=_Input, read=_dataset, required=True, metavar="PATH",
                   help="netCDF file (or zarr folder) in the official layout: the first two "
                   "time steps are the inputs, the next ones give the forcings")
    p.add_argument("--stats", action=_Input, read=_stats_dir, required=True, metavar="DIR",
                   help="folder with mean_by_level.nc, stddev_by_level.nc, "
                   "diffs_stddev_by_level.nc")
    p.add_argument("--forecast-steps", type=_count(1), required=True, metavar="N",
                   help="6-hour steps to predict")
    p.add_argument("--out", type=_output_file((".nc",)), required=True, metavar="FILE.nc",
                   help="write the prediction (official rollout layout) as netCDF")
    p.set_defaults(func=cmd_forecast)

    p = sub.add_parser("stats", help="normalisation statistics of a weather dataset")
    p.add_argument("--data", action=_Input, read=_dataset, required=True, metavar="PATH",
                   help="netCDF file or zarr folder in the official layout")
    p.add_argument("--out", type=_stats_folder, required=True, metavar="DIR",
                   help="folder to write mean_by_level.nc, stddev_by_level.nc and "
                   "diffs_stddev_by_level.nc into")
    p.set_defaults(func=cmd_stats)
    return parser


def _use_cpu_scheduler(name: str) -> None:
    try:
        use_cpu_scheduler(name)
    except ValueError as e:  # JAX already started (`main` called in a process that ran JAX)
        raise UsageError(f"--cpu-scheduler {name}: {str(e).split(': ', 1)[-1]}") from None


def _check_backend() -> None:
    """Starts JAX's backend now, so that a bad `JAX_PLATFORMS` is one line, not a traceback."""
    try:
        jax.default_backend()
    except Exception as e:  # noqa: BLE001 - JAX raises RuntimeError or AssertionError here
        platforms = os.environ.get("JAX_PLATFORMS", "")
        raise UsageError("JAX could not start a backend"
                         + (f" for JAX_PLATFORMS={platforms}" if platforms else "")
                         + (f": {e}" if str(e) else "")) from None


def _one_line_warnings(command: Optional[str]):
    who = f"gclab {command}" if command else "gclab"

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"{who}: warning: {message}", file=sys.stderr)

    return show


def main(argv: Optional[Sequence[str]] = None, *,
         exit_on_interrupt: Optional[bool] = None) -> int:
    """Runs one command and returns its exit status.

    Args:
      argv: the words after `gclab` (default: this process's command line).
      exit_on_interrupt: on Ctrl-C, end the process at once with status 130 (143 for
        SIGTERM during `gclab train`'s steps) rather than return it (`_exit_interrupted`);
        by default where `argv` is None, that is where `main` runs as the program (`gclab`,
        `python -m gclab`), not called in a process that goes on.
    """
    if exit_on_interrupt is None:
        exit_on_interrupt = argv is None
    for stream in (sys.stdout, sys.stderr):
        # A path's bytes that are not text in the locale's encoding (a file name in
        # Latin-1 under UTF-8, say) are printed escaped: a strict stream would fail on
        # them after the file was written.
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    named = next((w for w in words if w in parser.commands), None)  # before parsing
    with warnings.catch_warnings():  # the options' own reads (a dataset's) warn in one line too
        warnings.showwarning = _one_line_warnings(named)
        try:
            return _main(parser, argv)
        except KeyboardInterrupt as e:  # Ctrl-C, once everything a command keeps is written
            what, status = _stop(e)
            if not isinstance(e, _Interrupted):
                print(f"gclab{f' {named}' if named else ''}: {what}", file=sys.stderr)
            if exit_on_interrupt:  # here, while `e` holds the interrupted frames
                _exit_interrupted(status)
            return status


def _exit_interrupted(status: int) -> None:
    """Ends the process now with `status`, its output flushed.

    `os._exit`, not a return to the interpreter: XLA's threads may still be compiling
    (Ctrl-C comes mostly during a compile), and freeing what they use (the interrupted
    frames, which the exception's traceback holds until its handler ends) or the
    interpreter's normal shutdown then often ends in a segmentation fault (status -11,
    not 130). So it is called inside the handler. Nothing that must finish is left by
    then: a command's files are written whole or not at all before it is interrupted
    (`gclab train`'s save on stopping has waited for orbax's writes; `gclab sweep` has
    written the rows it completed), and no at-exit handler of gclab's keeps anything.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing more can be said
            stream.flush()
    os._exit(status)


def _main(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> int:
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the command's own parser, which names the command
            parser = parser.commands.get(args.command, parser)
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help, or an error already printed in one line
        return e.code if isinstance(e.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 2
    prefix = f"gclab {args.command}: error:"
    # The parsed command names the run's warnings (`main` restores the hook at the end).
    warnings.showwarning = _one_line_warnings(args.command)
    try:
        with _stdout_for_json_only(getattr(args, "json", False)):
            if getattr(args, "cpu_scheduler", None):  # read by XLA when JAX starts
                _use_cpu_scheduler(args.cpu_scheduler)
            if hasattr(args, "devices"):  # before JAX starts: simulated devices, processes
                start_devices(args)
            if args.command != "graph":  # every other command runs JAX
                _check_backend()
            return args.func(args)
    except ValueError as e:  # UsageError, config/fixture errors, TooLarge: one line
        print(f"{prefix} {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`gclab ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # a file that could not be written mid-run
        where = f": {e.filename}" if e.filename else ""
        print(f"{prefix} {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"{prefix} out of memory", file=sys.stderr)
        return 1
    except jax.errors.JaxRuntimeError as e:
        first = (str(e).strip().splitlines() or [""])[0]
        if "RESOURCE_EXHAUSTED" not in first:  # an XLA failure that is no size: as it came
            raise
        # The step, or the state it was given, does not fit the device: the sizes, not a bug.
        print(f"{prefix} out of device memory ({first[:200]}); `gclab memory` gives what "
              "this step needs, `gclab plan` a recipe or layout that fits", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
