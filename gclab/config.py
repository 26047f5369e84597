"""Frozen configurations and presets.

One frozen dataclass per concern:

* `ModelConfig`: geometry (grid resolution, mesh splits, radius query) and network
  (latent width, processor steps, hidden layers).
* `TaskConfig`: what goes in and comes out of a grid node (pressure levels, inputs).
* `MemoryConfig` lives in `gclab.memory` (memory techniques are their own concern).

Every field is validated on construction; a bad value raises `ConfigError`, a
`ValueError` naming the field and what is allowed (`ConfigWrongType`, a `WrongType` too,
for a value of a kind the field does not allow).

The one rule for bad arguments, here and in every gclab module: a value of a kind that is
not allowed raises `WrongType`, which is both a `TypeError` (as Python's own functions
raise) and a `ValueError` (as every other bad argument raises), so that code catching
either, the command line's one-line report included, catches it; any other bad value
raises `ValueError`. Both name the argument and what is allowed, in one line.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, NoReturn, Optional

# Pressure levels (hPa) of the two published level sets.
PRESSURE_LEVELS_13 = (50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000)
PRESSURE_LEVELS_37 = (
    1, 2, 3, 5, 7, 10, 20, 30, 50, 70, 100, 125, 150, 175, 200, 225, 250, 300, 350, 400,
    450, 500, 550, 600, 650, 700, 750, 775, 800, 825, 850, 875, 900, 925, 950, 975, 1000,
)

SURFACE_VARIABLES = (
    "2m_temperature",
    "mean_sea_level_pressure",
    "10m_u_component_of_wind",
    "10m_v_component_of_wind",
    "total_precipitation_6hr",
)
ATMOSPHERIC_VARIABLES = (
    "temperature",
    "geopotential",
    "u_component_of_wind",
    "v_component_of_wind",
    "vertical_velocity",
    "specific_humidity",
)
FORCING_VARIABLES = (
    "toa_incident_solar_radiation",
    "year_progress_sin",
    "year_progress_cos",
    "day_progress_sin",
    "day_progress_cos",
)
STATIC_VARIABLES = ("geopotential_at_surface", "land_sea_mask")
NUM_FORCINGS = len(FORCING_VARIABLES)
NUM_STATICS = len(STATIC_VARIABLES)
STRUCTURAL_NODE_FEATURES = 3  # sin(lat), cos(lon), sin(lon)
STRUCTURAL_EDGE_FEATURES = 4  # |d|, d_x, d_y, d_z (receiver frame, normalised)
INPUT_FRAMES = 2

MAX_MESH_SPLITS = 7
#: Largest count of anything that becomes an array dimension or a loop length (latent
#: width, processor steps, batch, rollout, block sizes): int32, as XLA's loop counters
#: and gclab's node indices are.
MAX_INT32 = 2**31 - 1
#: Most grid nodes a grid may have: node indices are int32 (about a 0.0055 deg grid).
MAX_GRID_NODES = MAX_INT32
#: Largest grid2mesh radius fraction: beyond about 250 the query radius exceeds the
#: sphere's diameter even on the finest mesh (every grid node connects to every mesh
#: node), and far beyond it the float32 radius overflows.
MAX_RADIUS_FRACTION = 1000.0


class ConfigError(ValueError):
    """A config field with a value that is not allowed.

    The message is ``"<Class>.<field>=<value> is invalid: <allowed>."``; the parts are
    kept as attributes, so that a command line can name its own option instead.

    Attributes:
      owner: the config's class name.
      field: the field.
      value: the value given.
      allowed: what is allowed, in words.
    """

    def __init__(self, owner: str, field: str, value: Any, allowed: str) -> None:
        super().__init__(f"{owner}.{field}={value!r} is invalid: {allowed}.")
        self.owner, self.field, self.value, self.allowed = owner, field, value, allowed


def invalid(config: object, field: str, allowed: str, wrong_kind: bool = False) -> NoReturn:
    """Raises the error every gclab config gives for a bad field value.

    ``ConfigError("<Class>.<field>=<value> is invalid: <allowed>.")``, a `ValueError`;
    `ConfigWrongType`, a `WrongType` as well, where `wrong_kind` (the value is of a kind
    the field does not allow: a str where a number goes, say).
    """
    error = ConfigWrongType if wrong_kind else ConfigError
    raise error(type(config).__name__, field, getattr(config, field), allowed)


class WrongType(TypeError, ValueError):
    """An argument or field of a kind that is not allowed (a str where a number goes, say).

    A `TypeError` and a `ValueError` at once: see the module's docstring for why.
    """


class SettingError(ValueError):
    """A bad setting (an environment variable); a notebook shows its one line, no traceback.

    Here, below every module that reads a setting (`gclab.devices`, `gclab.notebook`), so
    that each raises the same class.
    """

    def _render_traceback_(self) -> list[str]:  # IPython shows these lines instead
        return [f"{type(self).__name__}: {self}"]


class ConfigWrongType(ConfigError, WrongType):
    """A config field with a value of a kind it does not allow (`invalid(..., wrong_kind=True)`)."""


def _shown(name: str, value: object) -> str:
    """``name=<repr>`` for a short repr, else ``name`` (a params tree or an array, say)."""
    text = repr(value)
    return f"{name}={text}" if len(text) <= 80 and "\n" not in text else name


def require_kind(name: str, value: object, kind: type | tuple, allowed: str = "",
                 caller: str = "", optional: bool = False) -> Any:
    """`value` if it is an instance of `kind` (or None, where `optional`).

    Args:
      name: the argument or field, as the message names it.
      value: what was given.
      kind: a class, or a tuple of classes.
      allowed: what is allowed, in words; by default the classes' names ("a TaskConfig").
      caller: a function's name, to start the message with (where given).
      optional: None is allowed too.

    Returns:
      `value`.

    Raises:
      WrongType: ``"<caller> <name>=<value> is invalid: <allowed>, not <a_kind(value)>"``
        otherwise (the value left out where its repr is long or spans lines).
    """
    if isinstance(value, kind) or optional and value is None:
        return value
    if not allowed:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        names = [_article(k.__name__) for k in kinds] + (["None"] if optional else [])
        allowed = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    where = f"{caller} " if caller else ""
    raise WrongType(f"{where}{_shown(name, value)} is invalid: {allowed}, not {a_kind(value)}")


def is_int(v: object) -> bool:
    """An integer (Python or numpy), and not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def require_count(name: str, value: object, least: int, caller: str = "") -> int:
    """`value` as an int if it is an integer (Python or numpy, not a bool) >= `least`.

    Raises:
      ValueError: ``"<caller> <name>=<value> is invalid: an integer >= <least>"`` otherwise
        (the caller, a function's name, only where given); `WrongType` where `value` is no
        integer at all.
    """
    if not is_int(value) or value < least:
        where = f"{caller} " if caller else ""
        error = ValueError if is_int(value) else WrongType
        raise error(f"{where}{_shown(name, value)} is invalid: an integer >= {least}")
    return int(value)


def is_number(v: object) -> bool:
    """A real number (Python or numpy, int or float), and not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def a_kind(value: object) -> str:
    """The type of `value` with its article, for messages that name what was given.

    ``"an int"``, ``"a str"``, ``"an ndarray"``, ``"a list"``; ``None`` is ``"None"``
    (not ``"a NoneType"``). The article goes by the sound of the name: ``"a uint8"``.

    Args:
      value: any object.

    Returns:
      ``"a <type name>"`` or ``"an <type name>"``, or ``"None"``.
    """
    if value is None:
        return "None"
    return _article(type(value).__name__)


def _article(name: str) -> str:
    """A class name with its article: ``"an int"``, ``"a uint8"``, ``"an ndarray"``."""
    low = name.lower()
    # "ndarray" is said en-dee-array; "uint8", "ufunc", "uuid" and "unicode..." start
    # with a "you".
    vowel = (low[:1] in ("a", "e", "i", "o") or low.startswith("nd")
             or low.startswith("u") and not low.startswith(("uint", "ufunc", "uuid", "uni")))
    return f"{'an' if vowel else 'a'} {name}"


def normalise_numbers(config: object, ints: tuple = (), floats: tuple = ()) -> None:
    """Turns numpy scalars of a frozen dataclass's valid fields into Python int / float.

    Call after validation, so that configs compare, hash and serialise the same whatever
    kind of number they were given.
    """
    for names, kind in ((ints, int), (floats, float)):
        for name in names:
            value = getattr(config, name)
            if value is not None and type(value) is not kind:
                object.__setattr__(config, name, kind(value))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Geometry and network of one GraphCast model.

    Attributes:
      resolution: grid spacing in degrees, in (0, 180]; must divide 180 (pole-inclusive
        grid of 180/res + 1 latitudes and 360/res longitudes) and give at most
        `MAX_GRID_NODES` nodes. 0.25 is the published model; 4.0 is a small grid for
        CPU work.
      mesh_splits: refinements of the icosahedron (0..7). Each split quadruples the
        mesh faces; 6 gives 40,962 mesh nodes and 327,660 multimesh edges.
      latent_size: width L of every node and edge latent. Memory of a training step
        grows linearly with it (activations) and quadratically in parameters.
      processor_steps: message-passing steps S on the multimesh, weights unshared.
        Without remat, activation memory grows linearly with S.
      hidden_layers: hidden layers per MLP (1 in every published model).
      radius_query_fraction_edge_length: grid2mesh radius as a fraction of the longest
        finest-mesh edge, in (0, `MAX_RADIUS_FRACTION`]. 0.6 (published) reduces edge
        count and memory use, while larger values connect each grid node to more mesh
        nodes.

    Integer fields are at most `MAX_INT32`. numpy numbers are accepted and stored as
    Python int / float.
      mesh2grid_edge_normalization_factor: divides mesh2grid edge features; None
        uses the longest mesh2grid edge (the official default).
    """

    resolution: float = 4.0
    mesh_splits: int = 3
    latent_size: int = 32
    processor_steps: int = 4
    hidden_layers: int = 1
    radius_query_fraction_edge_length: float = 0.6
    mesh2grid_edge_normalization_factor: Optional[float] = None

    def __post_init__(self) -> None:
        res = self.resolution
        if not is_number(res) or not 0 < res <= 180:
            invalid(self, "resolution",
                    "a positive number of degrees, at most 180, that divides 180",
                    wrong_kind=not is_number(res))
        n = 180.0 / res
        if abs(n - round(n)) > 1e-9 or abs(360.0 / res - round(360.0 / res)) > 1e-9:
            invalid(self, "resolution", "180 / resolution must be a whole number "
                    "(e.g. 0.25, 1, 4, 10)")
        nodes = (round(n) + 1) * round(2 * n)
        if nodes > MAX_GRID_NODES:
            count = f"{nodes:,}" if nodes < 10**15 else f"about 10^{len(str(nodes)) - 1}"
            invalid(self, "resolution", f"a grid of at most {MAX_GRID_NODES:,} nodes (int32 "
                    f"indices, about 0.0055 deg), and this one has {count}")
        if not is_int(self.mesh_splits) or not 0 <= self.mesh_splits <= MAX_MESH_SPLITS:
            invalid(self, "mesh_splits", f"an integer in 0..{MAX_MESH_SPLITS}",
                    wrong_kind=not is_int(self.mesh_splits))
        for field in ("latent_size", "processor_steps", "hidden_layers"):
            v = getattr(self, field)
            if not is_int(v) or not 1 <= v <= MAX_INT32:
                invalid(self, field, f"an integer >= 1 (and <= {MAX_INT32})",
                        wrong_kind=not is_int(v))
        f = self.radius_query_fraction_edge_length
        if not is_number(f) or not 0 < f <= MAX_RADIUS_FRACTION:
            invalid(self, "radius_query_fraction_edge_length",
                    f"a number > 0 (and <= {MAX_RADIUS_FRACTION:g})", wrong_kind=not is_number(f))
        g = self.mesh2grid_edge_normalization_factor
        if g is not None and (not is_number(g) or not g > 0 or math.isinf(g)):
            invalid(self, "mesh2grid_edge_normalization_factor", "None or a finite number > 0",
                    wrong_kind=not is_number(g))
        normalise_numbers(self, ("mesh_splits", "latent_size", "processor_steps",
                                 "hidden_layers"),
                          ("resolution", "radius_query_fraction_edge_length",
                           "mesh2grid_edge_normalization_factor"))

    @property
    def n_lat(self) -> int:
        return int(round(180.0 / self.resolution)) + 1

    @property
    def n_lon(self) -> int:
        return int(round(360.0 / self.resolution))

    @property
    def num_grid_nodes(self) -> int:
        return self.n_lat * self.n_lon

    @property
    def num_mesh_nodes(self) -> int:
        return 10 * 4**self.mesh_splits + 2

    @property
    def num_mesh_edges(self) -> int:
        return 20 * (4 ** (self.mesh_splits + 1) - 1)

    @property
    def num_mesh2grid_edges(self) -> int:
        return 3 * self.num_grid_nodes

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Channels of a grid node: two input frames, forcings, statics -> one target frame.

    Attributes:
      pressure_levels: pressure levels (hPa) of the atmospheric variables; 13 or 37
        levels in the published models (`levels=13` / `37` in `TaskConfig.from_levels`).
      precipitation_input: whether total precipitation is an input (False for the
        operational model, which has it as a target only).
    """

    pressure_levels: tuple = PRESSURE_LEVELS_13
    precipitation_input: bool = True

    def __post_init__(self) -> None:
        levels = self.pressure_levels
        if not isinstance(levels, tuple) or not levels or not all(
                is_number(p) and 0 < p < math.inf for p in levels):
            invalid(self, "pressure_levels", "a non-empty tuple of positive finite "
                    "pressures (hPa)", wrong_kind=not isinstance(levels, tuple)
                    or not all(is_number(p) for p in levels))
        if len(set(levels)) != len(levels):
            invalid(self, "pressure_levels", "pressures must be distinct")
        object.__setattr__(self, "pressure_levels",
                           tuple(int(p) if is_int(p) else float(p) for p in levels))
        if not isinstance(self.precipitation_input, bool):
            invalid(self, "precipitation_input", "True or False", wrong_kind=True)

    @classmethod
    def from_levels(cls, levels: int, precipitation_input: bool = True) -> "TaskConfig":
        """The published 13- or 37-level task."""
        if levels == 13:
            return cls(PRESSURE_LEVELS_13, precipitation_input)
        if levels == 37:
            return cls(PRESSURE_LEVELS_37, precipitation_input)
        raise ValueError(f"TaskConfig levels={levels!r} is invalid: 13 or 37.")

    @property
    def num_levels(self) -> int:
        return len(self.pressure_levels)

    @property
    def target_channel_names(self) -> tuple:
        """Names of the O output channels: surface variables then (variable, level)."""
        names = list(SURFACE_VARIABLES)
        for var in ATMOSPHERIC_VARIABLES:
            names += [f"{var}@{p}" for p in self.pressure_levels]
        return tuple(names)

    @property
    def output_channels(self) -> int:
        """O = 5 + 6 x levels."""
        return len(SURFACE_VARIABLES) + len(ATMOSPHERIC_VARIABLES) * self.num_levels

    @property
    def data_channels(self) -> int:
        """C_in: data channels of a grid node, without the 3 structural features."""
        surface = len(SURFACE_VARIABLES) - (0 if self.precipitation_input else 1)
        per_frame = surface + len(ATMOSPHERIC_VARIABLES) * self.num_levels
        return INPUT_FRAMES * per_frame + (INPUT_FRAMES + 1) * len(FORCING_VARIABLES) + len(
            STATIC_VARIABLES)

    @property
    def input_channels(self) -> int:
        """F: grid-node embedder input width (data channels + 3 structural features)."""
        return self.data_channels + STRUCTURAL_NODE_FEATURES


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named model: geometry/network and task."""

    name: str
    model: ModelConfig
    task: TaskConfig
    description: str


def _preset(name, description, task, **model):
    return Preset(name, ModelConfig(**model), task, description)


_TASK13 = TaskConfig.from_levels(13)
_TASK37 = TaskConfig.from_levels(37)
_TASK13_OPS = TaskConfig.from_levels(13, precipitation_input=False)

PRESETS = {p.name: p for p in (
    _preset("graphcast", "GraphCast: 0.25 deg, 37 levels, 6 splits, 16 x 512", _TASK37,
            resolution=0.25, mesh_splits=6, latent_size=512, processor_steps=16),
    _preset("graphcast-small", "GraphCast_small: 1 deg, 13 levels, 5 splits, 16 x 512", _TASK13,
            resolution=1.0, mesh_splits=5, latent_size=512, processor_steps=16),
    _preset("graphcast-operational",
            "GraphCast_operational: 0.25 deg, 13 levels without precipitation input, 6 splits",
            _TASK13_OPS, resolution=0.25, mesh_splits=6, latent_size=512, processor_steps=16),
    _preset("cpu-4x32", "CPU family: 4 deg, 3 splits, 4 steps x 32 latent, 13 levels", _TASK13,
            resolution=4.0, mesh_splits=3, latent_size=32, processor_steps=4),
    _preset("cpu-8x128", "CPU family: 4 deg, 3 splits, 8 steps x 128 latent, 13 levels",
            _TASK13, resolution=4.0, mesh_splits=3, latent_size=128, processor_steps=8),
    _preset("cpu-16x512", "CPU family: 4 deg, 3 splits, 16 steps x 512 latent, 13 levels",
            _TASK13, resolution=4.0, mesh_splits=3, latent_size=512, processor_steps=16),
    _preset("cpu-2deg-16x512", "CPU family: 2 deg, 4 splits, 16 steps x 512 latent, 13 levels",
            _TASK13, resolution=2.0, mesh_splits=4, latent_size=512, processor_steps=16),
)}


def get_preset(name: str) -> Preset:
    """Looks up a preset by name; unknown names list the known ones."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(
            f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def resolve_model(preset: Optional[str] = None, *, resolution: Optional[float] = None,
                  mesh_splits: Optional[int] = None, radius_fraction: Optional[float] = None,
                  latent: Optional[int] = None, steps: Optional[int] = None,
                  levels: Optional[int] = None) -> tuple[ModelConfig, TaskConfig]:
    """A model and task from a preset name, or from a grid and mesh, with overrides.

    Args:
      preset: a name of `PRESETS`; or None, and then `resolution` and `mesh_splits`.
      resolution, mesh_splits: the grid and mesh when no preset is given (13 levels).
      radius_fraction, latent, steps: override `radius_query_fraction_edge_length`,
        `latent_size`, `processor_steps`.
      levels: 13 or 37 pressure levels (keeps the preset's precipitation input).

    Raises:
      ValueError: both or neither of a preset and a grid, or an invalid value (the
        message names the option).
    """
    if preset is not None:
        if resolution is not None or mesh_splits is not None:
            raise ValueError("give either --preset or --resolution/--mesh-splits, not both")
        chosen = get_preset(preset)
        model, task = chosen.model, chosen.task
    else:
        if resolution is None or mesh_splits is None:
            raise ValueError("give --preset NAME, or both --resolution DEG and --mesh-splits N")
        model = ModelConfig(resolution=resolution, mesh_splits=mesh_splits)
        task = TaskConfig.from_levels(13)
    changes = {}
    if radius_fraction is not None:
        changes["radius_query_fraction_edge_length"] = radius_fraction
    if latent is not None:
        changes["latent_size"] = latent
    if steps is not None:
        changes["processor_steps"] = steps
    if changes:
        model = model.replace(**changes)
    if levels is not None:
        task = TaskConfig.from_levels(levels, task.precipitation_input)
    return model, task
