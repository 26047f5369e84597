"""Published GraphCast checkpoints <-> gclab's configs and parameter tree, losslessly.

A published checkpoint is one `np.savez` file of 0-d and parameter arrays (no pickle) under
flat `:`-separated keys:

* ``params:<haiku module path>:<w|b|scale|offset>``: the parameters, official module paths;
* ``model_config:<field>``: the official model config (`resolution`, `mesh_size`,
  `latent_size`, `gnn_msg_steps`, `hidden_layers`, `radius_query_fraction_edge_length`,
  and `mesh2grid_edge_normalization_factor` unless it is None);
* ``task_config:<field>[:<index>]``: the official task config, tuple fields element by
  element (`input_variables`, `target_variables`, `forcing_variables`, `pressure_levels`,
  and the string `input_duration`);
* ``description`` and ``license``: strings.

Scalars are 0-d float64 / int64 / unicode arrays. `read_checkpoint` turns the file into a
`Checkpoint` (gclab's `ModelConfig`, `TaskConfig` and stacked parameter tree) and
`write_checkpoint` writes it back: a round trip gives the same keys and the same bytes in
every array. The official task is kept whole (`OfficialTask`) so that its variable order
survives; gclab's `TaskConfig` is derived from it, and a task gclab's network cannot run
(other variables, another input duration) is refused naming the key.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Union

import numpy as np

from gclab.config import (
    ATMOSPHERIC_VARIABLES,
    FORCING_VARIABLES,
    STATIC_VARIABLES,
    SURFACE_VARIABLES,
    ModelConfig,
    TaskConfig,
    WrongType,
    a_kind,
    require_kind,
)
from gclab.files import atomic_path
from gclab.limits import TooLarge
from gclab.model.graphcast import param_mismatches, param_shapes
from gclab.model.official import from_official, to_official
from gclab.model.reference import NPZ_ERRORS, is_npz, read_npz

PathLike = Union[str, os.PathLike]
SEP = ":"

#: Official model-config field -> gclab `ModelConfig` field.
MODEL_FIELDS = {
    "resolution": "resolution",
    "mesh_size": "mesh_splits",
    "latent_size": "latent_size",
    "gnn_msg_steps": "processor_steps",
    "hidden_layers": "hidden_layers",
    "radius_query_fraction_edge_length": "radius_query_fraction_edge_length",
    "mesh2grid_edge_normalization_factor": "mesh2grid_edge_normalization_factor",
}
OPTIONAL_MODEL_FIELDS = ("mesh2grid_edge_normalization_factor",)
TASK_TUPLE_FIELDS = ("input_variables", "target_variables", "forcing_variables",
                     "pressure_levels")
TASK_FIELDS = TASK_TUPLE_FIELDS + ("input_duration",)
TOP_LEVEL = ("params", "model_config", "task_config", "description", "license")
PARAM_NAMES = ("w", "b", "scale", "offset")

# The published tasks list the target surface variables in this order (v before u).
OFFICIAL_SURFACE_VARIABLES = ("2m_temperature", "mean_sea_level_pressure",
                              "10m_v_component_of_wind", "10m_u_component_of_wind",
                              "total_precipitation_6hr")
INPUT_DURATION = "12h"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read: the message names the file and the key."""


@dataclasses.dataclass(frozen=True)
class OfficialTask:
    """The official task config as stored (variable order kept).

    Attributes:
      input_variables: variables of the input frames (targets, forcings, statics).
      target_variables: variables the network predicts.
      forcing_variables: variables known at the target time.
      pressure_levels: levels (hPa) of the atmospheric variables.
      input_duration: time span of the input frames, e.g. "12h" (two 6-hour frames).
    """

    input_variables: tuple
    target_variables: tuple
    forcing_variables: tuple
    pressure_levels: tuple
    input_duration: str

    @classmethod
    def from_task(cls, task: TaskConfig) -> "OfficialTask":
        """The published task with `task`'s levels and precipitation input."""
        surface = tuple(v for v in OFFICIAL_SURFACE_VARIABLES
                        if task.precipitation_input or v != "total_precipitation_6hr")
        return cls(surface + ATMOSPHERIC_VARIABLES + FORCING_VARIABLES + STATIC_VARIABLES,
                   OFFICIAL_SURFACE_VARIABLES + ATMOSPHERIC_VARIABLES, FORCING_VARIABLES,
                   tuple(task.pressure_levels), INPUT_DURATION)

    def to_task(self, where: str = "task_config") -> TaskConfig:
        """gclab's `TaskConfig`; raises `CheckpointError` naming the field gclab cannot run."""
        targets = set(SURFACE_VARIABLES + ATMOSPHERIC_VARIABLES)
        if set(self.target_variables) != targets or len(self.target_variables) != len(targets):
            raise CheckpointError(f"{where}:target_variables must be the published targets "
                                  f"{sorted(targets)}, got {list(self.target_variables)}")
        if set(self.forcing_variables) != set(FORCING_VARIABLES):
            raise CheckpointError(f"{where}:forcing_variables must be {list(FORCING_VARIABLES)}"
                                  f", got {list(self.forcing_variables)}")
        inputs = set(self.input_variables)
        precip = "total_precipitation_6hr" in inputs
        expected = (targets - ({"total_precipitation_6hr"} - inputs)) | set(
            FORCING_VARIABLES) | set(STATIC_VARIABLES)
        if inputs != expected or len(self.input_variables) != len(expected):
            raise CheckpointError(
                f"{where}:input_variables must be the targets (with or without "
                f"total_precipitation_6hr), forcings and statics, got "
                f"{list(self.input_variables)}")
        if self.input_duration != INPUT_DURATION:
            raise CheckpointError(f"{where}:input_duration must be {INPUT_DURATION!r} (two "
                                  f"6-hour input frames), got {self.input_duration!r}")
        try:
            return TaskConfig(tuple(self.pressure_levels), precip)
        except ValueError as e:
            raise CheckpointError(f"{where}:pressure_levels: {e}") from None


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A GraphCast checkpoint in gclab's terms.

    Attributes:
      params: gclab's parameter tree `{module: {name: array}}` (processor steps stacked).
      model: the network and geometry.
      task: gclab's task (levels, precipitation input), derived from `official_task`.
      official_task: the task as the file stores it (kept for a lossless write).
      description: free text of the file.
      license: licence text of the file.
    """

    params: dict
    model: ModelConfig
    task: TaskConfig
    official_task: OfficialTask
    description: str = ""
    license: str = ""

    @classmethod
    def from_gclab(cls, params: Mapping, model: ModelConfig, task: TaskConfig,
                   description: str = "", license: str = "") -> "Checkpoint":
        """A checkpoint of gclab parameters with the published task layout.

        Raises:
          TypeError: an argument of the wrong kind (`params` not a mapping of mappings).
        """
        _require_parts(params, model, task)
        require_kind("description", description, str)
        require_kind("license", license, str)
        return cls({m: dict(v) for m, v in params.items()}, model, task,
                   OfficialTask.from_task(task), description, license)


CHECKPOINT = "a Checkpoint (read_checkpoint(path) or Checkpoint.from_gclab)"


def _require_parts(params, model, task) -> None:
    """Refuses parameters, model or task of the wrong kind (`WrongType`, named)."""
    require_kind("params", params, Mapping, "a {module: {name: array}} mapping")
    for module, leaves in params.items():
        require_kind(f"params[{module!r}]", leaves, Mapping, "a {name: array} mapping")
    require_kind("model", model, ModelConfig)
    require_kind("task", task, TaskConfig)


def _require_checkpoint(ckpt) -> None:
    """Refuses a checkpoint argument that is no `Checkpoint` or holds parts of the wrong
    kind (a `Checkpoint` is a plain dataclass: its fields are not checked when made)."""
    require_kind("ckpt", ckpt, Checkpoint, CHECKPOINT)
    _require_parts(ckpt.params, ckpt.model, ckpt.task)
    require_kind("ckpt.official_task", ckpt.official_task, OfficialTask)


def to_flat(ckpt: Checkpoint) -> dict:
    """The flat `{key: array}` dict a checkpoint file holds (see the module docstring).

    Raises:
      TypeError: `ckpt` not a `Checkpoint`, or one with parts of the wrong kind.
    """
    _require_checkpoint(ckpt)
    flat: dict = {}
    for module, leaves in to_official(ckpt.params).items():
        for name, value in leaves.items():
            flat[f"params{SEP}{module}{SEP}{name}"] = np.asarray(value)
    for official, field in MODEL_FIELDS.items():
        value = getattr(ckpt.model, field)
        if value is not None:  # the official writer leaves None fields out
            flat[f"model_config{SEP}{official}"] = np.asarray(value)
    for field in TASK_FIELDS:
        value = getattr(ckpt.official_task, field)
        if field in TASK_TUPLE_FIELDS:
            for i, item in enumerate(value):
                flat[f"task_config{SEP}{field}{SEP}{i}"] = np.asarray(item)
        else:
            flat[f"task_config{SEP}{field}"] = np.asarray(value)
    flat["description"] = np.asarray(ckpt.description)
    flat["license"] = np.asarray(ckpt.license)
    return flat


def _scalar(flat: Mapping, key: str, kinds: str, path: str):
    value = flat[key]
    if value.shape != () or value.dtype.kind not in kinds:
        what = {"f": "a number", "i": "an integer", "U": "a string"}
        raise CheckpointError(f"{path}: {key} must be a 0-d array of "
                              f"{' or '.join(what[k] for k in kinds if k in what)}, "
                              f"got shape {value.shape} dtype {value.dtype}")
    return value.item()


def _indexed(flat: Mapping, prefix: str, path: str) -> dict:
    """{index: key} of the keys `prefix:<index>`; unnumbered keys are refused."""
    out = {}
    for key in flat:
        if key.startswith(prefix + SEP):
            index = key[len(prefix) + 1:]
            if not index.isdigit():
                raise CheckpointError(f"{path}: unknown key {key!r}: {prefix} is a tuple, "
                                      f"its keys are {prefix}{SEP}0, {prefix}{SEP}1, ...")
            out[int(index)] = key
    if sorted(out) != list(range(len(out))):
        raise CheckpointError(f"{path}: {prefix} has elements {sorted(out)}, expected "
                              f"0..{len(out) - 1} without gaps")
    return out


def from_flat(flat: Mapping[str, np.ndarray], path: str = "checkpoint") -> Checkpoint:
    """A `Checkpoint` from the flat dict of a file; `CheckpointError` names a bad key.

    Raises:
      TypeError: `flat` not a mapping with str keys (`read_flat(path)`), `path` not a str.
      CheckpointError: a missing, unknown or malformed key, or parameters that do not fit
        the file's model and task.
    """
    require_kind("flat", flat, Mapping, "a {key: array} mapping (read_flat(path))")
    require_kind("path", path, str)
    key = next((k for k in flat if not isinstance(k, str)), None)
    if key is not None:
        raise WrongType(f"flat is invalid: its keys must be str, {key!r} is {a_kind(key)}")
    flat = {key: np.asarray(value) for key, value in flat.items()}
    for key in flat:
        if key.split(SEP, 1)[0] not in TOP_LEVEL:
            raise CheckpointError(f"{path}: unknown key {key!r}: keys start with one of "
                                  f"{', '.join(TOP_LEVEL)}")
    for key in ("description", "license"):
        if key not in flat:
            raise CheckpointError(f"{path}: missing key {key!r}")
    model_kwargs = {}
    for key in flat:
        if key.startswith("model_config" + SEP) and key[13:] not in MODEL_FIELDS:
            raise CheckpointError(f"{path}: unknown key {key!r}: model_config fields are "
                                  f"{', '.join(MODEL_FIELDS)}")
    for official, field in MODEL_FIELDS.items():
        key = f"model_config{SEP}{official}"
        if key not in flat:
            if official in OPTIONAL_MODEL_FIELDS:
                model_kwargs[field] = None
                continue
            raise CheckpointError(f"{path}: missing key {key!r}")
        kinds = "i" if field in ("mesh_splits", "latent_size", "processor_steps",
                                 "hidden_layers") else "fi"
        model_kwargs[field] = _scalar(flat, key, kinds, path)
    try:
        model = ModelConfig(**model_kwargs)
    except ValueError as e:
        raise CheckpointError(f"{path}: model_config: {e}") from None

    for key in flat:
        if key.startswith("task_config" + SEP) and key[12:].split(SEP)[0] not in TASK_FIELDS:
            raise CheckpointError(f"{path}: unknown key {key!r}: task_config fields are "
                                  f"{', '.join(TASK_FIELDS)}")
    task_kwargs = {}
    for field in TASK_TUPLE_FIELDS:
        prefix = f"task_config{SEP}{field}"
        if prefix in flat:
            raise CheckpointError(f"{path}: key {prefix!r} must be split element by element "
                                  f"({prefix}{SEP}0, ...)")
        keys = _indexed(flat, prefix, path)
        if not keys:
            raise CheckpointError(f"{path}: missing key {prefix + SEP + '0'!r}")
        kinds = "fi" if field == "pressure_levels" else "U"
        task_kwargs[field] = tuple(_scalar(flat, keys[i], kinds, path) for i in sorted(keys))
    key = f"task_config{SEP}input_duration"
    if key not in flat:
        raise CheckpointError(f"{path}: missing key {key!r}")
    task_kwargs["input_duration"] = _scalar(flat, key, "U", path)
    official_task = OfficialTask(**task_kwargs)
    task = official_task.to_task(f"{path}: task_config")

    official_params: dict = {}
    for key, value in flat.items():
        if not key.startswith("params" + SEP):
            continue
        module, sep, name = key[len("params") + 1:].rpartition(SEP)
        if not sep or name not in PARAM_NAMES:
            raise CheckpointError(f"{path}: unknown key {key!r}: parameter keys are "
                                  f"params{SEP}<module path>{SEP}<{'|'.join(PARAM_NAMES)}>")
        _check_values(key, value, path)
        official_params.setdefault(module, {})[name] = value
    if not official_params:
        raise CheckpointError(f"{path}: no parameters (no key starts with 'params{SEP}')")
    try:
        params = from_official(official_params)
    except ValueError as e:
        raise CheckpointError(f"{path}: params: {e}") from None
    check_params(params, model, task, path)
    return Checkpoint(params, model, task, official_task,
                      _scalar(flat, "description", "U", path),
                      _scalar(flat, "license", "U", path))


def _check_values(key: str, value: np.ndarray, path: str) -> None:
    """Refuses a parameter that is not floating point or holds NaN or infinity (the network
    would compute NaN, or cast integers silently)."""
    if value.dtype.kind != "f":
        raise CheckpointError(f"{path}: {key} has dtype {value.dtype}; parameters must be "
                              f"floating point")
    finite = np.isfinite(value)
    if not finite.all():
        i = np.unravel_index(np.argmin(finite), value.shape)
        raise CheckpointError(f"{path}: {key} holds a non-finite value ({value[i]:g}) at "
                              f"index {tuple(int(j) for j in i)}; parameters must be finite")


def check_params(params: Mapping, model: ModelConfig, task: TaskConfig,
                 path: str = "checkpoint") -> None:
    """Raises `CheckpointError` naming the first parameter the network lacks, has more of,
    or has in another shape than `model` and `task` give."""
    shapes = param_shapes(model, task.data_channels, task.output_channels)
    # Zero-stride stand-ins: `to_official` unstacks them without allocating anything.
    stand_ins = {m: {n: np.broadcast_to(np.int8(0), v.shape) for n, v in leaves.items()}
                 for m, leaves in shapes.items()}
    expected = to_official(stand_ins)
    # Compared key by key, as the file stores them: a module without parameters has no key.
    try:
        official = to_official(params)
    except ValueError as e:  # a module path that is no GraphCast one, named by the file
        raise CheckpointError(f"{path}: params: {e}") from None
    got = {m: leaves for m, leaves in official.items() if leaves}
    mismatches = param_mismatches(got, expected)
    if not mismatches:
        return
    first = mismatches[0]  # an unknown key before a missing or misshapen one
    # A whole module unknown or missing: named by its first key.
    name = first.name if first.name is not None else next(
        iter(got[first.module] if first.unknown else expected[first.module]))
    key = f"params{SEP}{first.module}{SEP}{name}"
    if first.unknown:
        raise CheckpointError(f"{path}: unknown key {key!r}: not a parameter of this "
                              f"model_config and task_config")
    if first.shape is None:
        raise CheckpointError(f"{path}: missing key {key!r}")
    raise CheckpointError(f"{path}: {key} has shape {first.shape}, this model_config "
                          f"and task_config need {first.expected}")


def read_flat(path: PathLike) -> dict:
    """The `{key: array}` dict of an `.npz` file, read without pickle.

    Raises:
      TypeError: `path` is not a str, bytes or `os.PathLike` (an integer too: `os` would
        take it for an open file descriptor).
      CheckpointError: the file is missing, a folder, unreadable, not a zip archive,
        damaged or truncated (a damaged `.npy` header or deflate stream included: the
        message names the member), needs pickle, or would not fit in memory.
    """
    require_kind("path", path, (str, bytes, os.PathLike),
                 "a str, bytes or os.PathLike (an .npz file)")
    if os.path.isdir(path):
        raise CheckpointError(f"{path}: not a checkpoint (a folder, not an .npz file)")
    try:
        zipped = is_npz(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except OSError as e:  # no permission, say: not to be called "not a zip archive"
        raise CheckpointError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not zipped:
        raise CheckpointError(f"{path}: not a checkpoint (an .npz file is a zip archive, "
                              f"this is not one)")
    try:
        return read_npz(path, "the checkpoint's arrays")
    except TooLarge as e:
        raise CheckpointError(str(e)) from None
    except NPZ_ERRORS as e:
        raise CheckpointError(f"{path}: not a checkpoint (.npz without pickle): "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                              ) from None


def read_checkpoint(path: PathLike) -> Checkpoint:
    """Reads a published (or gclab-written) GraphCast checkpoint.

    Raises:
      TypeError: `path` is not a str, bytes or `os.PathLike`.
      CheckpointError: the file is missing, not an `.npz`, or has a missing, unknown or
        malformed key, or a parameter that is not floating point or not finite (the
        message names it).
    """
    return from_flat(read_flat(path), str(path))


def write_checkpoint(path: PathLike, ckpt: Checkpoint) -> None:
    """Writes `ckpt` in the published format, atomically (temporary file, then rename).

    Args:
      path: the `.npz` file to (re)write.
      ckpt: the checkpoint.

    Raises:
      TypeError: `ckpt` not a `Checkpoint` (or one with parts of the wrong kind).
      CheckpointError: parameters that do not fit `ckpt.model` and `ckpt.task` (the file
        would not read back), a `ckpt.official_task` of another task than `ckpt.task`, or
        an array that is not numbers or strings (it would need pickle). Nothing is written.
    """
    _require_checkpoint(ckpt)
    try:
        task = ckpt.official_task.to_task(f"{path}: official_task")
    except (TypeError, ValueError) as e:  # malformed fields: a message of its own
        raise CheckpointError(str(e) if isinstance(e, CheckpointError) else
                              f"{path}: official_task: {e}") from None
    if task != ckpt.task:  # the file's task is the official one, read back
        raise CheckpointError(f"{path}: official_task is for {task}, the checkpoint's task "
                              f"is {ckpt.task}")
    check_params(ckpt.params, ckpt.model, ckpt.task, str(path))
    flat = to_flat(ckpt)
    for key, value in flat.items():
        if value.dtype.kind not in "biufU":  # numbers and strings only: no pickle
            raise CheckpointError(f"{path}: {key} has dtype {value.dtype}; a checkpoint "
                                  f"holds numbers and strings only")
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **flat)
