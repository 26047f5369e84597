"""What the book's chapters share: the hardware report, the scale, guarded live runs.

Every chapter prints `hardware_report()` (backend, device, usable memory, versions, date)
so that each number in it names the machine it came from, and runs at `choose_scale()`,
one scale per device class (`gclab.devices`), chosen from the device's usable memory:

* ``cpu``: small grids, so that each chapter stays within about 3 minutes on 2 cores;
* ``16GB``, ``24GB``, ``40GB`` (T4; L4 and A10G; A100-40GB): 1 deg compiled figures and
  mid-size live runs (``SCALE == "gpu"`` holds for all three);
* ``80GB``, ``141GB`` (A100-80GB and H100; H200): the published sizes compiled,
  GraphCast_small run for real (``SCALE == "big"``).

``GCLAB_SCALE`` forces a scale (a class name, or ``gpu`` / ``big`` for the smallest class of
each). What a chapter runs on the device comes from `live_configs(chapter, scale)`, and each
run goes through `run_if_fits` (a grid of them through `guarded_grid`): compiled first, run
only when its plan fits the usable memory with `gclab.devices.FIT_MARGIN`, otherwise reported
as "needs X, does not fit". `page_text` wraps a printed line to the width a page shows.
Recorded measurements (hardware and date inside) are read with `recorded(name)`.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import platform
import textwrap
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from gclab import devices, limits
from gclab.config import (
    ModelConfig,
    SettingError,  # gclab.notebook.SettingError, as chapters and scripts import it
    TaskConfig,
    WrongType,
    a_kind,
    is_number,
    require_count,
    require_kind,
)
from gclab.recordings import output_dir
from gclab.recordings import recorded as _read_recording

try:
    from myst_nb import glue as myst_glue
except ImportError:  # a notebook outside the book's build (Colab): values are not pasted
    myst_glue = None

#: Scales, one per device class, smallest first.
SCALES = tuple(devices.DEVICE_CLASSES)
#: Older names accepted by ``GCLAB_SCALE``: the smallest class of each family.
SCALE_ALIASES = {"gpu": "16GB", "big": "80GB"}
SCALE_ENV = "GCLAB_SCALE"
#: Where new recordings are written (never into an installed package).
DATA_DIR = output_dir()
#: Characters of a printed line that a rendered page of the book shows without scrolling.
PAGE_WIDTH = 76
# How the pages write a date: to the minute, in UTC (the hardware report, recordings).
_MINUTE_UTC = "%Y-%m-%d %H:%M UTC"


class HardwareReport(dict):
    """A dict of hardware facts that prints as an aligned table."""

    def __str__(self) -> str:
        width = max(map(len, self))
        # A long value (several XLA flags) continues on lines of its own, under itself.
        return "\n".join(
            textwrap.fill(str(v), PAGE_WIDTH, initial_indent=f"{k:<{width}}  ",
                          subsequent_indent=" " * (width + 2), break_long_words=False,
                          break_on_hyphens=False) or f"{k:<{width}}  "
            for k, v in self.items())


def _host_memory() -> Optional[int]:
    """Host memory this process may use (a cgroup limit included), or None if unknown."""
    return limits.host_memory_bytes()


def hardware_report() -> HardwareReport:
    """Backend, device, memory, CPU count, library versions, the date, and ``XLA_FLAGS``
    where set."""
    import haiku
    import jax
    import jaxlib

    import gclab
    from gclab.measure.compiled import format_bytes

    device = jax.devices()[0]
    device_memory = devices.usable_bytes(device)
    host = _host_memory()
    return HardwareReport({
        "backend": jax.default_backend(),
        "device": f"{device.device_kind} (x{jax.device_count()})",
        "device memory": (f"{format_bytes(device_memory)} usable (the allocator's limit), "
                          f"class {devices.device_class_of(device_memory).name}"
                          if device_memory else "n/a (CPU: host RAM)"),
        "host memory": format_bytes(host) if host else "unknown",
        "cpu cores": os.cpu_count(),
        "platform": platform.platform(),
        "versions": f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
                    f"haiku {haiku.__version__}, gclab {gclab.__version__}",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime(_MINUTE_UTC),
        # The compiler's settings where the caller changed them (they change what it plans).
        **({"XLA flags": flags} if (flags := os.environ.get("XLA_FLAGS", "").strip()) else {}),
    })


@dataclasses.dataclass(frozen=True, eq=False)
class Scale:
    """The sizes a chapter runs at, picked from the hardware by `choose_scale`.

    A `Scale` compares equal to its name (``SCALE == "16GB"``) and to its family
    (``SCALE == "gpu"``), and its ``repr`` is the quoted name, so chapters can branch on it
    like a string; ``str(scale)`` and `describe` spell out the sizes. Only ``==`` (and
    ``in`` a list or tuple) compares so: a set or dict looks a scale up by its name's hash,
    so ``SCALE in {"gpu", "big"}`` is False for every scale, and a name in other capitals
    is not found; write ``SCALE in ("gpu", "big")``.

    Attributes:
      name: the device class (``cpu``, ``16GB``, ``24GB``, ``40GB``, ``80GB``, ``141GB``).
      family: ``cpu``, ``gpu`` (16 to 40 GB classes) or ``big`` (80 GB and more).
      compiled: the model whose training step is compiled (memory from shapes alone;
        compiling costs time, not device memory).
      live: the model that is actually run (forward passes, gradients, timed steps).
      geometries: ``(resolution, mesh_splits)`` pairs for "how it grows" sweeps, coarse
        to fine.
      timed_repeats: timed calls per measurement (after one warm-up call).
    """

    name: str
    family: str
    compiled: ModelConfig
    live: ModelConfig
    geometries: tuple
    timed_repeats: int

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return other.lower() in (self.name.lower(), self.family)
        if isinstance(other, Scale):
            return (self.name, self.compiled, self.live, self.geometries,
                    self.timed_repeats) == (other.name, other.compiled, other.live,
                                            other.geometries, other.timed_repeats)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return repr(self.name)

    def __str__(self) -> str:
        return f"{self.name}: " + "; ".join(f"{k} {v}" for k, v in self.describe().items()
                                            if k != "scale")

    def describe(self) -> dict:
        """The sizes as a flat dict of short strings."""
        def model(m: ModelConfig) -> str:
            return (f"{m.resolution:g} deg / {m.mesh_splits} splits, "
                    f"{m.processor_steps} x {m.latent_size}")

        where = self.device_class.card or "the cpu class"
        return {"scale": self.name,
                "usable": f"{_format(self.device_class.usable_bytes)} ({where})",
                "compiled": model(self.compiled), "live": model(self.live),
                "geometries": ", ".join(f"{r:g} deg/{s}" for r, s in self.geometries),
                "timed repeats": str(self.timed_repeats)}

    @property
    def device_class(self) -> devices.DeviceClass:
        """The device class this scale is made for."""
        return devices.DEVICE_CLASSES[self.name]


def _format(n: int) -> str:
    from gclab.limits import format_bytes

    return format_bytes(n)


def _scale(name: str, family: str, compiled: tuple, live: tuple, geometries: tuple,
           timed_repeats: int) -> Scale:
    def model(res: float, splits: int, steps: int, latent: int) -> ModelConfig:
        return ModelConfig(resolution=res, mesh_splits=splits, processor_steps=steps,
                           latent_size=latent)

    return Scale(name, family, model(*compiled), model(*live), geometries, timed_repeats)


_GPU_GEOMETRIES = ((4.0, 3), (2.0, 4), (1.0, 5))
_BIG_GEOMETRIES = _GPU_GEOMETRIES + ((0.25, 6),)
# (resolution, splits, steps, latent) of the compiled and live models; sweep geometries.
# Every live configuration fits its class's usable memory with the margin
# (tests/test_device_classes.py compiles them on XLA:CPU).
SCALE_TABLE = {
    # 2 cores: each chapter within about 3 minutes.
    "cpu": _scale("cpu", "cpu", (4.0, 3, 8, 128), (4.0, 3, 4, 32), ((4.0, 3), (2.0, 4)), 1),
    # T4: compiled figures of GraphCast_small's sizes, mid-size live runs.
    "16GB": _scale("16GB", "gpu", (1.0, 5, 16, 512), (2.0, 4, 16, 256), _GPU_GEOMETRIES, 3),
    # L4, A10G: a wider live network.
    "24GB": _scale("24GB", "gpu", (1.0, 5, 16, 512), (2.0, 4, 16, 512), _GPU_GEOMETRIES, 3),
    # A100-40GB.
    "40GB": _scale("40GB", "gpu", (1.0, 5, 16, 512), (2.0, 4, 16, 512), _GPU_GEOMETRIES, 3),
    # 80 GB-class: the published model compiled, GraphCast_small run for real.
    "80GB": _scale("80GB", "big", (0.25, 6, 16, 512), (1.0, 5, 16, 512), _BIG_GEOMETRIES, 5),
    # H200 and larger.
    "141GB": _scale("141GB", "big", (0.25, 6, 16, 512), (1.0, 5, 16, 512), _BIG_GEOMETRIES,
                    5),
}


def print_hardware() -> HardwareReport:
    """Prints `hardware_report()` as an aligned table and returns it."""
    report = hardware_report()
    print(report)
    return report


def scale_named(name: str, *, source: str = "") -> Scale:
    """The `Scale` called `name` (a class name or an alias, case-insensitive).

    Args:
      name: the scale's name.
      source: the environment variable `name` was read from, which the message then names
        (`choose_scale` passes ``GCLAB_SCALE``); by default the message names `name`.

    Raises:
      TypeError: `name` not a str (`WrongType`).
      ValueError: an unknown name; one line listing the allowed ones (`SettingError`, where
        it came from `source`).
    """
    allowed = "one of " + ", ".join((*SCALES, *SCALE_ALIASES))
    if not source:
        require_kind("name", name, str, f"a str, {allowed}", "scale_named")
    text = str(name).strip()
    for key in SCALES:
        if text.lower() == key.lower():
            return SCALE_TABLE[key]
    if text.lower() in SCALE_ALIASES:
        return SCALE_TABLE[SCALE_ALIASES[text.lower()]]
    if source:
        raise SettingError(f"{source}={text!r} is invalid: {allowed}")
    raise ValueError(f"scale_named name={name!r} is invalid: {allowed}")


def scale_for(usable: Optional[int]) -> Scale:
    """The scale of a device with `usable` bytes (None: a CPU)."""
    return SCALE_TABLE[devices.device_class_of(usable).name]


def choose_scale() -> Scale:
    """The `Scale` of this machine: `GCLAB_SCALE` if set, else from the usable memory.

    CPU backends get ``cpu``; accelerators get the largest device class whose usable
    memory they reach (`gclab.devices.device_class_of`).

    Raises:
      SettingError: `GCLAB_SCALE` set to anything but a scale name or alias.
    """
    forced = os.environ.get(SCALE_ENV, "").strip()
    if forced:
        return scale_named(forced, source=SCALE_ENV)
    import jax

    if jax.default_backend() == "cpu":
        return SCALE_TABLE["cpu"]
    return scale_for(devices.usable_bytes(jax.devices()[0]))


def scale_banner(scale: Scale, width: int = PAGE_WIDTH) -> str:
    """What every chapter prints: its scale, the sizes, and how to change it.

    Wrapped at `width` characters, so that a rendered page shows it whole instead of in a
    horizontally scrolled output; the list of allowed values is never split.

    Raises:
      TypeError: `scale` not a `Scale` (a scale's name is not one, as for `live_configs`).
      ValueError: `width` not an integer >= 20 (as `page_text`).
    """
    _require_scale(scale, "scale_banner")
    width = require_count("width", width, 20, "scale_banner")
    text = (f"This chapter runs at scale {scale} (set {SCALE_ENV}="
            + "|".join(SCALES) + " to change it).")
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False)


def recorded(name: str, data_dir: Optional[Path] = None) -> Optional[dict]:
    """The recording `name` (`gclab.recordings.recorded`), or None if there is none.

    Raises:
      ValueError: the file exists but is not valid JSON or names no hardware and date.
    """
    return _read_recording(name, data_dir)


def glue(name: str, value) -> None:
    """Hands `value` to the chapter's prose, where ``{glue:text}`name``` pastes it.

    It is myst-nb's `glue` without display, so that no number in the text is typed by hand:
    the book's build pastes what the cell computed. It returns None, so that a cell ending
    with a `glue` shows nothing of its own (a returned value would be displayed under the
    cell's output). Where myst-nb is not installed (Colab), nothing is pasted.

    Args:
      name: the key, unique in its notebook.
      value: a number (formatted in the text, e.g. ``{glue:text}`name:.2f```) or a string.
        NumPy scalars are pasted as the Python numbers they hold (their repr,
        ``np.float64(...)``, would not format).
    """
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    if myst_glue is not None:
        myst_glue(name, value, display=False)


# ------------------------------------------------------------------ guarded live runs


@dataclasses.dataclass(frozen=True)
class LiveConfig:
    """One configuration a chapter runs on the device.

    Attributes:
      chapter: ``01`` .. ``08``.
      label: the name the chapter shows.
      spec: the training step (a forward pass or gradient is bounded by it).
      guarded: True when the chapter runs it through `run_if_fits` or `guarded_grid` (it
        may not fit and is then shown as a plan); False when the chapter runs it
        unconditionally, so it must fit every card of the scale's class.
    """

    chapter: str
    label: str
    spec: Any
    guarded: bool = False


def _require_scale(scale: object, caller: str) -> Scale:
    """`scale` if it is a `Scale`; a `WrongType` naming `caller` otherwise (a scale's name is
    not one: its models and name are read)."""
    return require_kind("scale", scale, Scale, f"a Scale (choose_scale() or SCALE_TABLE[name], "
                        f"name one of {', '.join(SCALES)})", caller)


#: The book's chapters, as `live_configs` and `gpu_record` take them.
CHAPTERS = tuple(f"{n:02d}" for n in range(1, 9))


def _require_chapter(chapter: object, caller: str) -> str:
    """`chapter` as its two digits (``"01"``; ``1`` or ``"1"`` name it too), or one
    ValueError line naming `caller` for a chapter the book has not."""
    name = str(chapter).zfill(2)
    if name not in CHAPTERS:
        raise ValueError(f"{caller} chapter={chapter!r} is invalid: one of 01 to 08")
    return name


def live_configs(chapter: str, scale: Scale) -> list[LiveConfig]:
    """The configurations chapter `chapter` runs on the device at `scale`.

    Args:
      chapter: ``01`` to ``08``.
      scale: a `Scale`.

    Raises:
      TypeError: `scale` not a `Scale` (a scale's name is not one: its models are read).
      ValueError: an unknown chapter.
    """
    _require_scale(scale, "live_configs")
    chapter = _require_chapter(chapter, "live_configs")
    from gclab.config import get_preset
    from gclab.geometry import graphs_for
    from gclab.memory import MemoryConfig, get_recipe, parse_remat_spec, scaled_edge_block
    from gclab.sizing import StepSpec
    from gclab.sizing.sweep import grid

    task = TaskConfig.from_levels(13)
    if chapter == "01":
        return [LiveConfig("01", "forward pass", StepSpec(scale.live, task))]
    if chapter == "03":
        block = scaled_edge_block(graphs_for(scale.compiled).mesh2grid.num_edges)
        recipes = {
            "none": MemoryConfig(),
            "step": MemoryConfig(**parse_remat_spec("step")),
            "+ edge blocks (deepmind)": get_recipe("deepmind").replace(edge_block_size=block),
            "lean": get_recipe("lean").replace(edge_block_size=block),
        }
        out = [LiveConfig("03", label, StepSpec(scale.compiled, task, memory), guarded=True)
               for label, memory in recipes.items()]
        return out + [LiveConfig("03", "gradients of the live model",
                                 StepSpec(scale.live, task))]
    if chapter == "05":  # the scale's live model (cpu-4x32's on a CPU), timed in both precisions
        task = get_preset("cpu-4x32").task
        return [LiveConfig("05", f"live model {p}", StepSpec(
            scale.live, task, MemoryConfig(precision=p))) for p in ("f32", "bf16")]
    if chapter == "06":  # the (steps, latent) grid at the live model's geometry, guarded
        base = get_preset("cpu-4x32")
        model = base.model.replace(resolution=scale.live.resolution,
                                   mesh_splits=scale.live.mesh_splits)
        steps = [4, 16] if scale == "cpu" else [4, 8, 12, 16]
        latents = [32, 128, 512] if scale == "cpu" else [32, 64, 128, 256, 512]
        return [LiveConfig("06", f"{s.model.processor_steps} x {s.model.latent_size}", s,
                           guarded=True)
                for s in grid(model, latents, steps, base.task)]
    if chapter == "07":
        if scale != "big":
            return []
        full = get_preset("graphcast")
        return [LiveConfig("07", "graphcast lean bf16",
                           StepSpec(full.model, full.task, get_recipe("lean", "bf16")))]
    if chapter in ("02", "04"):  # the live model beside its plan (2.1, 4.5), where it fits
        out = [LiveConfig(chapter, "live model", StepSpec(scale.live, task), guarded=True)]
        if chapter == "02":  # and the compiled model of 2.1, which a card may not hold
            out.insert(0, LiveConfig("02", "compiled model", StepSpec(scale.compiled, task),
                                     guarded=True))
        return out
    if chapter == "08":  # layouts compile from shapes; the layout check runs a small model
        small = SCALE_TABLE["cpu"].live
        return [LiveConfig("08", "layout check (batch 4)", StepSpec(small, task, batch=4))]
    raise ValueError(f"chapter={chapter!r} is invalid: one of 01 to 08")


@dataclasses.dataclass(frozen=True)
class GuardedRun:
    """A configuration compiled from shapes, and run only if its plan fits.

    Attributes:
      label: the name shown.
      plan_bytes: XLA's compiled total (arguments + outputs + temp - aliased); the
        modelled total for a step too large for XLA to plan (`run_if_fits`).
      temp_bytes: XLA's compiled temp (0 where not compiled).
      usable_bytes: the usable memory it was checked against.
      fits: whether `plan_bytes` <= `gclab.devices.FIT_MARGIN` x `usable_bytes` (and the
        device held it when it was prepared to run).
      step: the `gclab.sizing.CompiledStep`; its `run` is None when it does not fit; None
        for a step too large for XLA to plan (`run_if_fits`).
      measured_peak_bytes: on a GPU, when asked for, the device's peak in a fresh process
        (`peak_bytes_in_use`); None otherwise.
    """

    label: str
    plan_bytes: int
    temp_bytes: int
    usable_bytes: int
    fits: bool
    step: Any = None
    measured_peak_bytes: Optional[int] = None

    @property
    def ran(self) -> bool:
        """Whether the step can be (and was prepared to be) run on the device."""
        return self.step is not None and self.step.run is not None

    @property
    def measured_over_plan(self) -> Optional[float]:
        """Measured peak / planned total, where measured."""
        if self.measured_peak_bytes is None or not self.plan_bytes:
            return None
        return self.measured_peak_bytes / self.plan_bytes

    def status(self) -> str:
        """``runs (plan X)`` or ``needs X, does not fit this card (usable Y)``."""
        if self.fits:
            return f"runs (plan {_format(self.plan_bytes)})"
        return (f"needs {_format(self.plan_bytes)}, does not fit this card (usable "
                f"{_format(self.usable_bytes)}, plans up to "
                f"{devices.FIT_MARGIN:.0%} of it)")


def usable_here() -> int:
    """Usable memory of this machine's first device.

    On CPU, the ``cpu`` class's (`gclab.devices.CPU_USABLE_BYTES`), or the host's memory
    where that is less (`gclab.limits.host_memory_bytes`, a cgroup limit included): a plan
    that fits the class but not the host would be refused when it is run.
    """
    usable = devices.usable_bytes()
    if usable is not None:
        return usable
    host = limits.host_memory_bytes()
    return min(devices.CPU_USABLE_BYTES, host) if host else devices.CPU_USABLE_BYTES


def _usable(usable: object, caller: str) -> int:
    """A ``usable=`` argument as bytes: `usable_here()` for None.

    Raises:
      TypeError: not a number (a size in words such as ``"8GiB"``, say).
      ValueError: a number that is not finite and >= 1 (nothing would fit below one byte).
    """
    if usable is None:
        return usable_here()
    allowed = "a finite number of bytes >= 1 (e.g. 8 * 2**30), or None for usable_here()"
    if not is_number(usable):
        raise WrongType(f"{caller} usable={usable!r} is invalid: {allowed}")
    if not 1 <= usable < math.inf:  # a fraction of a byte would be 0 bytes
        raise ValueError(f"{caller} usable={usable!r} is invalid: {allowed}")
    return int(usable)


def run_if_fits(spec, label: str = "", *, graphs=None, usable: Optional[int] = None,
                timeline: bool = False, measure: bool = False) -> GuardedRun:
    """Compiles one training step and prepares it to run only if its plan fits.

    Nothing is allocated for a step whose plan does not fit; it comes back with
    ``fits=False`` and its plan, for the chapter's table or graph. That includes a step
    the device itself cannot hold (`gclab.sizing.compile_train_step` would refuse it
    with `gclab.limits.TooLarge`), whatever `usable` says: `usable` is capped at the
    device's memory (on CPU the host's, a cgroup limit included). A step too large for
    XLA to plan is not compiled; its modelled total (`gclab.sizing.estimate_step_bytes`)
    stands for its plan, with ``temp_bytes`` 0 and no ``step``.

    Args:
      spec: a `gclab.sizing.StepSpec`.
      label: the name shown (default: the spec's technique).
      graphs: the model's graphs (built or loaded from the cache if None).
      usable: usable bytes to check against (default: `usable_here()`), at most the
        device's memory.
      timeline: also read the memory timeline.
      measure: on a GPU, also measure the peak in a fresh process (`measure_peak`).

    Raises:
      TypeError: `spec` not a `StepSpec` (a `LiveConfig`, say), or `usable` not a number
        (a size in words such as ``"8GiB"``, say).
      ValueError: `usable` not a finite number >= 1.
      gclab.limits.TooLarge: the model's graphs, built first (every plan needs them),
        would not fit this machine's memory.
    """
    from gclab.geometry import graphs_for
    from gclab.sizing import CompiledStep, StepSpec, compile_train_step, estimate_step_bytes
    from gclab.sizing.step import device_memory_bytes

    require_kind("spec", spec, StepSpec, "a StepSpec (a LiveConfig's .spec)", "run_if_fits")
    usable = _usable(usable, "run_if_fits")
    # Built before the guarded compile, so that a refusal there is the step's own.
    graphs = graphs if graphs is not None else graphs_for(spec.model)
    held = device_memory_bytes()  # what compile_train_step runs a step against
    if held is not None:
        usable = min(usable, held)
    label = label or spec.technique()
    planned = []  # the compiled plan, kept should the run be refused after compiling

    def run_if(memory) -> bool:
        planned.append(memory)
        return devices.fits(memory.total_bytes, usable)

    try:
        step = compile_train_step(spec, graphs, timeline=timeline, live=True, run_if=run_if)
    except limits.TooLarge:
        if not planned:  # refused before compiling: too large for XLA to plan
            return GuardedRun(label, int(estimate_step_bytes(spec, graphs)), 0, usable, False)
        # The device's memory read less when the step was run than just before.
        step = CompiledStep(spec, planned[-1])
    fits = step.run is not None
    measured = (measured_peak(spec, plan_bytes=int(step.memory.total_bytes))
                if measure and fits else None)
    return GuardedRun(label, int(step.memory.total_bytes), int(step.memory.temp_bytes),
                      usable, fits, step, measured)


def measured_peak(spec, repeats: int = 2, *, plan_bytes: Optional[int] = None
                  ) -> Optional[int]:
    """Off the CPU, the device's peak bytes of `spec`'s training step in a fresh process.

    Args:
      spec: a `gclab.sizing.StepSpec`.
      repeats: training steps run in the measuring process.
      plan_bytes: XLA's compiled total of the step, if known (else compiled from shapes,
        only where this process holds some of the card): what the fresh process must find
        free on the card.

    Returns None on a CPU, where the device reports no peak
    (`gclab.measure.peak.device_peak_available`), where this process holds too much of the
    card for a fresh process to run the step (`gclab.measure.peak.refuse_if_held`), or
    if the run failed.
    """
    import jax

    from gclab.measure import measure_peak

    if jax.default_backend() == "cpu":
        return None

    def plan() -> int:
        from gclab.sizing import train_step_memory

        return train_step_memory(spec).total_bytes

    device = jax.devices()[0]
    if _no_peak(device):
        return None
    r = measure_peak("gclab.sizing.sweep:timed_steps",
                     {"spec_json": spec.to_json(), "steps": repeats}, device=device,
                     plan_bytes=plan if plan_bytes is None else plan_bytes)
    return r.peak_bytes if r.ok else None


def _no_peak(device) -> Optional[str]:
    """Why `device` cannot have a fresh process measure its peak (None: it can): it reports
    none (`gclab.measure.peak.device_peak_available`, the one test the fresh process
    applies too). A CPU device is never refused here. Whether this process holds too much of
    the card is `measure_peak`'s own check (its ``device=`` and ``plan_bytes=``)."""
    from gclab.measure import peak

    if getattr(device, "platform", "cpu") == "cpu":
        return None
    stats = peak.memory_stats(device)
    if not peak.device_peak_available(stats):
        return peak.no_peak_reason(str(device.platform), stats)
    return None


#: Recording of each chapter made by ``benchmarks/record_gpu.py`` (``gpu-<scale>-<part>``).
GPU_RECORDING_PARTS = {"01": "chapters-01-05-07", "03": "chapter-03", "05": "chapters-01-05-07",
                       "06": "chapter-06", "07": "chapters-01-05-07"}


def gpu_record(chapter: str, scale: Scale, data_dir: Optional[Path] = None, *,
               other_scales: bool = False) -> Optional[dict]:
    """A chapter's GPU recording (``benchmarks/record_gpu.py``) as recorded, or None (also
    where a recording holds no row of this chapter: a run cut short before it).

    Args:
      chapter: ``01`` .. ``08``.
      scale: the scale whose recording is wanted.
      data_dir: the folder to read first (default: `gclab.recordings.output_dir()`).
      other_scales: where none was recorded at `scale`, the recording of the largest other
        scale that has one (its ``scale`` says which): a CPU reader still sees what a card
        did, marked as another scale's.

    Returns:
      The JSON object (``hardware``, ``date``, ``scale``, ``rows`` of this chapter's
      configurations only, ``complete``), or None where there is none.

    Raises:
      TypeError: `scale` not a `Scale` (a scale's name is not one, as for `live_configs`).
      ValueError: an unknown chapter (as for `live_configs`): a chapter the book has not
        is an error, not a chapter without a recording.
    """
    _require_scale(scale, "gpu_record")
    chapter = _require_chapter(chapter, "gpu_record")
    part = GPU_RECORDING_PARTS.get(chapter)
    if part is None:
        return None
    names = [scale.name] + ([s for s in reversed(SCALES) if s not in ("cpu", scale.name)]
                            if other_scales else [])
    for name in names:
        record = recorded(f"gpu-{name}-{part}", data_dir)
        rows = [r for r in (record or {}).get("rows", [])
                if r.get("chapter") == chapter]
        if rows:  # a run cut short before this chapter's rows counts as none
            return {**record, "scale": record.get("scale", name), "rows": rows}
    return None


def gpu_recording(chapter: str, scale: Scale, data_dir: Optional[Path] = None, *,
                  other_scales: bool = False):
    """A chapter's GPU recording at `scale` as a table, or None where none was recorded.

    Args:
      other_scales: where none was recorded at `scale`, show the largest other scale's
        (`gpu_record`); the title then names that scale.

    Returns:
      `(title, DataFrame)`: the title names the device, date, jax version and commit (and
      the scale, where it is not `scale`); the rows give each configuration's plan,
      measured peak, their ratio and step time.

    Raises:
      TypeError: `scale` not a `Scale` (a scale's name is not one, as for `live_configs`).
      ValueError: an unknown chapter (as for `live_configs`).
    """
    import pandas as pd

    _require_scale(scale, "gpu_recording")
    _require_chapter(chapter, "gpu_recording")
    record = gpu_record(chapter, scale, data_dir, other_scales=other_scales)
    if record is None:
        return None
    hw = record["hardware"]
    # Every cell a string, as `planned_and_measured_table` writes them: a ratio to 2 digits,
    # a time in seconds, "n/a" where the card measured nothing (never a NaN).
    rows = [{"configuration": r["label"], "plan": _format(r.get("plan_bytes")),
             "measured peak": _format(r.get("peak_bytes")),
             "measured / plan": _or_na(r.get("measured_over_plan"), "{:.2f}"),
             "step time": _or_na(r.get("step_seconds"), "{:.3f} s"),
             "on the card": _on_the_card(r)}
            for r in record["rows"]]
    elsewhere = (f"at scale {record['scale']}, not this chapter's {scale.name}: "
                 if record["scale"] != scale.name else "")
    title = (f"{elsewhere}recorded on {hw['device']} ({hw.get('backend')}), "
             f"{_minute(record['date'])}, "
             f"jax {hw.get('jax')}, gclab commit {str(hw.get('commit'))[:12]}"
             + (" (incomplete: the run stopped before its last configuration)"
                if record.get("complete") is False else ""))
    return title, pd.DataFrame(rows)


def _or_na(value, spec: str) -> str:
    """`value` formatted by `spec`, or "n/a" where it is missing (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return spec.format(value)


def _minute(date: str) -> str:
    """A recording's ISO date with its time zone, as `hardware_report` writes dates
    (`_MINUTE_UTC`); any other date is shown as written."""
    try:
        when = datetime.datetime.fromisoformat(str(date))
    except ValueError:
        return str(date)
    if when.tzinfo is None:  # a day only, or a time in no stated zone: nothing to convert
        return str(date)
    return when.astimezone(datetime.timezone.utc).strftime(_MINUTE_UTC)


def _on_the_card(row: Mapping) -> str:
    """What a recorded configuration did on the card: its plan's verdict (``runs (plan
    X)``), unless its measured run there failed (``measure_status`` ``oom`` or ``error``):
    then ``failed on the card (<status>)``, with the run's message where recorded."""
    status, measured = str(row.get("status", "")), row.get("measure_status")
    if (row.get("fits") and not row.get("peak_bytes") and row.get("measure_message")
            and measured not in ("oom", "error")):  # it fits, yet was not run: say why
        return str(row["measure_message"]).strip().splitlines()[0].split("; measure from")[0]
    shrunk = row.get("xla_remat")
    if shrunk and not status.startswith("failed"):  # the plan is what XLA's pass reached
        status += (f" (XLA:GPU's remat pass shrank it from {_format(shrunk.get('from_bytes'))} "
                   "while compiling, short of the card)")
    if measured not in ("oom", "error") or status.startswith("failed"):
        return status
    why = (str(row.get("measure_message") or "").strip().splitlines() or [""])[0][:200]
    return f"failed on the card ({measured})" + (f": {why}" if why else "")


#: The recipe benchmark's recordings, one per backend (`benchmarks/memory_recipes.py` on a
#: CPU, `benchmarks/memory_device.py` on a GPU), shipped with gclab.
MEMORY_RECORDINGS = ("memory-cpu", "memory-gpu")


def precision_by_backend(names: Sequence[str] = MEMORY_RECORDINGS,
                         data_dir: Optional[Path] = None):
    """bfloat16 against float32 compiled temp, per recorded backend, preset and recipe.

    Returns:
      `(sources, DataFrame)`: one line per recording found naming its device, jax version
      and date; one row per (backend, preset, recipe) recorded in both precisions, with
      the device, both temps, their ratio, and whether XLA's own rematerialization pass reported
      shrinking either compile (`benchmarks/memory_device.py --report`). Recordings that
      do not exist are left out.

    Raises:
      TypeError: `names` is one str (``"memory-cpu"``), not a sequence of names
        (`WrongType`): iterated, it would be read letter by letter.
    """
    import pandas as pd

    if isinstance(names, str):
        raise WrongType(f"precision_by_backend names={names!r} is invalid: a sequence of "
                        f"recording names ([{names!r}] for one), not a str")
    sources, rows = [], []
    for name in names:
        record = recorded(name, data_dir)
        if record is None:
            continue
        hw = record["hardware"]
        backend = {"cpu": "XLA:CPU", "gpu": "XLA:GPU", "tpu": "XLA:TPU"}.get(
            hw["backend"], hw["backend"])
        cores = f" ({hw['cpu_count']} cores)" if hw["backend"] == "cpu" else ""
        sources.append(f"{backend}: {hw['device']}{cores}, jax {hw['jax']}, {hw['date'][:10]} "
                       f"({name})")
        by = {(r["preset"], r["precision"], r["recipe"]): r for r in record["recipes"]}
        for (preset, precision, recipe), f32 in by.items():
            bf16 = by.get((preset, "bf16", recipe))
            if precision == "f32" and bf16 is not None:
                rows.append({"backend": backend, "device": hw["device"], "preset": preset,
                             "recipe": recipe,
                             "f32 temp": f32["temp_bytes"], "bf16 temp": bf16["temp_bytes"],
                             "bf16 / f32": bf16["temp_bytes"] / f32["temp_bytes"],
                             "XLA remat": bool(f32.get("xla_remat") or bf16.get("xla_remat"))})
    return sources, pd.DataFrame(rows, columns=["backend", "device", "preset", "recipe",
                                                "f32 temp", "bf16 temp", "bf16 / f32",
                                                "XLA remat"])


def claim_figures(record: Optional[dict]) -> dict:
    """The authors'-claim figures of a recipe-benchmark recording, as the prose pastes them.

    Reads ``authors_claim`` (the ladder's compiled totals and the largest buffers at the
    peak of `deepmind` in bfloat16 at 0.25 deg) and, where the run was measured,
    ``claim_live``. Keys: ``device``, ``deepmind_total``, ``haiku_total``,
    ``streamed_total``, ``lean_total``, ``scheduled_total`` (`deepmind` with XLA:CPU
    ordering the program for memory), ``peak``, ``peak_f32`` (its float32 share),
    ``grid_buffers``, ``grid_bytes``, ``live_peak``, ``live_ratio``, ``live_step``, the
    verdicts ``deepmind_fits``, ``streamed_fits`` and ``scheduled_fits`` (``within 32
    GiB`` or ``over 32 GiB``, from the recorded ``fits_tpu_v4``) and ``peak_stage``
    (where the peak falls, e.g. ``backward: processor``). A figure the recording does not
    hold (or no recording) reads ``n/a``, a number NaN.
    """
    claim = (record or {}).get("authors_claim")
    live = (record or {}).get("claim_live") or {}
    nan, na = float("nan"), "n/a"
    totals = ({r["step"]: _format(r["total_bytes"]) for r in claim["rows"]} if claim else {})
    fits = {r["step"]: r.get("fits_tpu_v4") for r in claim["rows"]} if claim else {}

    def verdict(step: str) -> str:
        return {True: "within 32 GiB", False: "over 32 GiB"}.get(fits.get(step), na)

    peak = claim["peak"] if claim else None
    return {
        "deepmind_fits": verdict("deepmind"),
        "streamed_fits": verdict("stream-grid-nodes"),
        "peak_stage": str(peak.get("stage") or na) if peak else na,
        "device": record["hardware"]["device"] if record else na,
        "deepmind_total": totals.get("deepmind", na),
        "haiku_total": totals.get("haiku-layer-norm", na),
        "streamed_total": totals.get("stream-grid-nodes", na),
        "lean_total": totals.get("lean", na),
        "scheduled_total": totals.get("memory-first-schedule", na),
        "scheduled_fits": verdict("memory-first-schedule"),
        "peak": _format(peak["peak_bytes"]) if peak else na,
        # A peak of 0 bytes (a recording cut short) has no share to give.
        "peak_f32": (f"{peak['float32_bytes'] / peak['peak_bytes']:.0%}"
                     if peak and peak.get("peak_bytes") else na),
        "grid_buffers": peak["grid_sized_buffers"] if peak else nan,
        "grid_bytes": _format(peak["grid_sized_bytes"]) if peak else na,
        "live_peak": _format(live["peak_bytes"]) if live.get("peak_bytes") else na,
        "live_ratio": live.get("measured_over_plan") or nan,
        "live_step": live.get("step_seconds") or nan,
    }


#: Why the measured column is empty on a CPU.
NOT_MEASURED = ("not measured on {backend}: no device allocator reports a peak "
                "(peak_bytes_in_use) here, so XLA's plan is the only figure")


def _check_plans(plans: object) -> dict:
    """`planned_and_measured`'s ``plans=`` as a dict ({} for None), or one `WrongType` line:
    a list would be ignored, and a value that is no pair fails deep inside."""
    allowed = "a {label: (plan_bytes, temp_bytes)} mapping"
    if plans is None:
        return {}
    if not isinstance(plans, Mapping):
        raise WrongType(f"planned_and_measured plans is {a_kind(plans)}: it must be {allowed}")
    for label, pair in plans.items():
        if (isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2
                or not all(is_number(b) for b in pair)):
            raise WrongType(f"planned_and_measured plans[{label!r}]={pair!r} is invalid: "
                            "a pair of numbers (plan_bytes, temp_bytes)")
    return dict(plans)


def planned_and_measured(configs, *, plans=None, usable: Optional[int] = None,
                         repeats: int = 2):
    """XLA's plan of each configuration and, off the CPU, the device's measured peak beside it.

    Off the CPU (a GPU, a TPU), where the device reports a peak
    (`gclab.measure.peak.device_peak_available`), each configuration whose plan fits the
    usable memory, and what this process leaves of the card
    (`gclab.measure.peak.refuse_if_held`), runs `repeats` training steps in a fresh
    process (`gclab.measure.measure_peak`, which reads the device's
    ``peak_bytes_in_use``); the table gives the peak and measured / plan. On a CPU, or
    where a configuration is not measured or its run fails, the measured columns are
    empty and ``measured`` says why: never a number that was not measured.

    Args:
      configs: ``{label: StepSpec}``, in the order shown.
      plans: ``{label: (plan_bytes, temp_bytes)}`` for configurations compiled already
        (by a sweep, say); the others are compiled here from shapes.
      usable: usable bytes to check against (default: `usable_here()`).
      repeats: training steps run in the measuring process.

    Returns:
      A DataFrame indexed by configuration: ``plan_bytes`` (XLA's total: arguments,
      outputs and temp), ``temp_bytes``, ``measured_peak_bytes`` and
      ``measured_over_plan`` (None where not measured), and ``measured`` (the peak in
      words, or why there is none).

    Raises:
      TypeError: `configs` not a mapping of labels to `StepSpec`s (a list, say, or
        `LiveConfig`s), `plans` not a mapping of labels to pairs of numbers, or `usable`
        not a number.
      ValueError: no configurations, `usable` not a finite number >= 1, or `repeats` not
        an integer >= 1.
    """
    import jax
    import pandas as pd

    from gclab import measure
    from gclab.measure import peak as peak_status
    from gclab.measure.compiled import plans_for_another_card
    from gclab.sizing import StepSpec, train_step_memory

    if not isinstance(configs, Mapping):
        raise WrongType(f"planned_and_measured configs is {a_kind(configs)}: it must "
                        "be a {label: StepSpec} mapping")
    if not configs:
        raise ValueError("planned_and_measured configs is empty: nothing to plan")
    wrong = [label for label, spec in configs.items() if not isinstance(spec, StepSpec)]
    if wrong:  # a LiveConfig, say: its StepSpec is its `spec`
        raise WrongType(f"planned_and_measured configs[{wrong[0]!r}] is "
                        f"{a_kind(configs[wrong[0]])}: each value must be a StepSpec")
    repeats = require_count("repeats", repeats, 1, "planned_and_measured")
    plans = _check_plans(plans)
    backend = jax.default_backend()
    usable = _usable(usable, "planned_and_measured")
    device = jax.devices()[0] if backend != "cpu" else None  # its backend runs already
    rows = []
    for label, spec in configs.items():
        if label in plans:
            total, temp = plans[label]
        else:  # the step's own plan, as a guarded run compiles it (`run_if_fits`): on a
            # GPU without XLA's remat pass, which would shrink a step too large for the card
            # towards it, so that it seemed to fit here while the chapters' grids say not
            with plans_for_another_card(True):
                m = train_step_memory(spec)
            total, temp = m.total_bytes, m.temp_bytes
        peak, why = None, None
        if backend == "cpu":
            why = NOT_MEASURED.format(backend=backend)
        elif not devices.fits(total, usable):
            why = f"not run: needs {_format(total)}, does not fit this card"
        else:  # a device without a peak (a card this process holds too much of: below)
            why = _no_peak(device)
        if why is None:
            r = measure.measure_peak("gclab.sizing.sweep:timed_steps",
                                     {"spec_json": spec.to_json(), "steps": repeats},
                                     device=device, plan_bytes=total)
            first = (r.message or "no peak reported").strip().splitlines()[0]
            if r.ok and r.peak_bytes is not None:
                peak = int(r.peak_bytes)
            elif r.status == peak_status.NOT_MEASURED:  # the fresh process says why
                why = first
            else:
                why = f"run failed ({r.status}): {first[:120]}"
        rows.append({"configuration": label, "plan_bytes": int(total), "temp_bytes": int(temp),
                     "measured_peak_bytes": peak,
                     "measured_over_plan": None if peak is None else peak / total,
                     "measured": _format(peak) if peak is not None else why})
    return pd.DataFrame(rows).set_index("configuration")


def planned_and_measured_table(beside) -> tuple:
    """`planned_and_measured`'s result, formatted for the page.

    Returns:
      `(table, notes)`: the table has ``XLA plan`` (arguments, outputs and temp),
      ``of which temp``, ``measured peak`` and ``measured / plan`` (2 digits), with "n/a"
      where nothing was measured; `notes` lists, once each, why a peak is missing (one
      line per reason, for the text under the table), empty where every peak was measured.

    Raises:
      ValueError: `beside` lacks a column `planned_and_measured` writes; `WrongType` where
        it is no DataFrame.
    """
    import pandas as pd

    require_kind("beside", beside, pd.DataFrame, "a DataFrame (planned_and_measured's result)",
                 "planned_and_measured_table")
    for column in ("plan_bytes", "temp_bytes", "measured_peak_bytes", "measured_over_plan",
                   "measured"):
        if column not in beside.columns:
            have = ", ".join(map(repr, map(str, beside.columns))) or "none"
            raise ValueError(f"planned_and_measured_table: beside has no column {column!r} "
                             f"(planned_and_measured's result has it); columns: {have}")

    measured = beside["measured_peak_bytes"].notna()
    table = pd.DataFrame({
        "XLA plan": beside["plan_bytes"].map(_format),
        "of which temp": beside["temp_bytes"].map(_format),
        "measured peak": [_format(v) if ok else "n/a"
                          for v, ok in zip(beside["measured_peak_bytes"], measured)],
        "measured / plan": [f"{v:.2f}" if ok else "n/a"
                            for v, ok in zip(beside["measured_over_plan"], measured)],
    }, index=beside.index)
    notes = list(dict.fromkeys(beside.loc[~measured, "measured"]))
    return table, notes


# ------------------------------------------------------------------ timings and their spread


@dataclasses.dataclass(frozen=True)
class TimeComparison:
    """Two sets of timings of the same work, compared with their run-to-run spread.

    Attributes:
      subject: the name of the timings judged.
      reference: the name of the timings it is judged against.
      ratio: median subject seconds / median reference seconds.
      spread: the larger relative spread, (slowest - fastest) / median, of the two.
      verdict: ``faster than`` or ``slower than`` when every run of one took less time than
        every run of the other; otherwise ``within the run-to-run spread of`` (a tie: the
        two ranges overlap).
    """

    subject: str
    reference: str
    ratio: float
    spread: float
    verdict: str

    @property
    def distinct(self) -> bool:
        """Whether the difference is larger than the spread (the ranges do not overlap)."""
        return self.verdict != "within the run-to-run spread of"


def _relative_spread(seconds: Sequence[float]) -> float:
    import statistics

    return (max(seconds) - min(seconds)) / statistics.median(seconds)


def _check_timings(fn: str, name: str, seconds: Sequence[float], least: int) -> list:
    """`seconds` as a list (a generator is read once, here), or the ValueError of timings
    that are no sequence, fewer than `least` or not all positive numbers (a median, spread
    or ratio of them would be a statistics or division error)."""
    if isinstance(seconds, (str, bytes)) or not hasattr(seconds, "__iter__"):
        raise WrongType(f"{fn}: {name!r} needs a list of timings (seconds), got "
                        f"{a_kind(seconds)}")
    seconds = list(seconds)
    if len(seconds) < least or not all(
            is_number(t) and 0 < t < math.inf
            for t in seconds):
        count = "two or more" if least == 2 else "one or more"
        raise ValueError(f"{fn}: {name!r} needs {count} positive timings, got {seconds!r}")
    return seconds


def compare_times(samples: Mapping[str, Sequence[float]], subject: str,
                  reference: str) -> TimeComparison:
    """Says whether `subject` ran faster or slower than `reference`, or within the noise.

    A difference counts only when the two ranges of timings do not overlap: on a shared
    machine, a median a few per cent apart is not a result. Time the two alternately
    (one run of each per round), so that a change in the machine's load hits both.

    Args:
      samples: seconds per run, by name (two runs at least each; any iterable of them, a
        generator too).
      subject: the name judged.
      reference: the name it is judged against.

    Raises:
      ValueError: a name missing from `samples`, fewer than two timings, or a timing that
        is not a positive number; `WrongType` where a name's timings are no list of them
        (one number, say).
    """
    import statistics

    checked = {}
    for name in (subject, reference):
        if name not in samples:
            raise ValueError(f"compare_times: no timings named {name!r}; have "
                             + ", ".join(map(repr, samples)))
        if name not in checked:  # a generator compared with itself is read once
            checked[name] = _check_timings("compare_times", name, samples[name], least=2)
    a, b = checked[subject], checked[reference]
    if max(a) < min(b):
        verdict = "faster than"
    elif min(a) > max(b):
        verdict = "slower than"
    else:
        verdict = "within the run-to-run spread of"
    return TimeComparison(subject, reference, statistics.median(a) / statistics.median(b),
                          max(_relative_spread(a), _relative_spread(b)), verdict)


def time_table(samples: Mapping[str, Sequence[float]]):
    """Median, fastest and slowest run and relative spread of each set of timings.

    Args:
      samples: seconds per run, by name (one run at least each; any iterable of them, a
        generator too).

    Returns:
      A DataFrame indexed by name: ``median_seconds``, ``fastest_seconds``,
      ``slowest_seconds``, ``spread`` ((slowest - fastest) / median) and ``runs``.

    Raises:
      ValueError: no names, no timings or a timing that is not a positive number;
        `WrongType` where a name's timings are no list of them (one number, say).
    """
    import statistics

    import pandas as pd

    if not isinstance(samples, Mapping) or not samples:
        raise ValueError(f"time_table: samples={samples!r} is invalid: seconds per run, by "
                         "name (one name at least)")
    checked = {name: _check_timings("time_table", name, seconds, least=1)
               for name, seconds in samples.items()}  # each generator read once, here
    return pd.DataFrame([{"name": k, "median_seconds": statistics.median(v),
                          "fastest_seconds": min(v), "slowest_seconds": max(v),
                          "spread": _relative_spread(v), "runs": len(v)}
                         for k, v in checked.items()]).set_index("name")


# ------------------------------------------------------------------ a guarded grid


#: A timed step at least this long counts its first call (`guarded_grid`): measured on two
#: cores, the first call of a compiled training step took about 0.1 to 0.4 s longer than the
#: next (0.28 against 0.09 s for 4 x 32 at 4 deg; 7.99 against 7.60 and 8.19 s for 16 x 512;
#: another day 7.59 against 7.29 and 7.79 s, and 3.66 against 3.31 and 3.36 s for 4 x 512),
#: so from 5 s on it is within the spread of the later calls, and chapter 6 does not run its
#: widest cells once more only to throw the time away.
LONG_STEP_SECONDS = 5.0


def guarded_grid(configs: Sequence[LiveConfig], *, usable: Optional[int] = None,
                 repeats: int = 1):
    """Compiles each configuration, and times only those whose plan fits.

    Each configuration goes through `run_if_fits`: compiled once for real arrays, but
    allocated and run only when its plan (XLA's total: arguments, outputs and temp) fits
    `gclab.devices.FIT_MARGIN` of the usable memory; the others keep their plan and are
    shown as "needs X, does not fit this card". On a CPU this costs what
    ``sweep(measure="timed")`` costs: one compile and `repeats` steps per cell.

    Args:
      configs: `LiveConfig`s (``live_configs("06", scale)``), in the order shown; any
        iterable of them (a generator too).
      usable: usable bytes to check against (default: `usable_here()`).
      repeats: timed steps per cell that fits, after one untimed step; a step that takes
        `LONG_STEP_SECONDS` or more is timed from its first call (`median_seconds`'s
        ``long_seconds``).

    Returns:
      A DataFrame, one row per configuration: ``label``, ``processor_steps``,
      ``latent_size``, ``params``, ``temp_bytes``, ``total_bytes``, ``fits``,
      ``step_seconds`` (NaN where the cell did not run), ``status`` (``ok`` or ``oom``, as
      `gclab.plots.plot_heatmap` reads it) and ``on_card`` (``ran`` or ``needs X, does
      not fit this card``).

    Raises:
      TypeError: `configs` not an iterable of `LiveConfig`s, or `usable` not a number.
      ValueError: no configurations, `repeats` not an integer >= 1, or `usable` not a
        finite number >= 1.
    """
    import gc

    import pandas as pd

    from gclab.measure.timing import median_seconds
    from gclab.sizing import param_count

    repeats = require_count("repeats", repeats, 1, "guarded_grid")
    allowed = "guarded_grid: configs are LiveConfigs (`live_configs(chapter, scale)`), not"
    try:
        configs = list(configs)  # a generator is read once: checked and run from this list
    except TypeError:
        raise WrongType(f"{allowed} {a_kind(configs)}") from None
    wrong = [c for c in configs if not isinstance(c, LiveConfig)]
    if wrong:  # a StepSpec, say (`run_if_fits` takes those): its label and guard are missing
        raise WrongType(f"{allowed} {type(wrong[0]).__name__}")
    usable = _usable(usable, "guarded_grid")
    if not configs:  # a table without columns, which no chapter could index
        raise ValueError("guarded_grid configs is empty: nothing to run")
    rows = []
    for config in configs:
        guarded = run_if_fits(config.spec, config.label, usable=usable)
        seconds = (median_seconds(guarded.step.run, repeats, long_seconds=LONG_STEP_SECONDS)
                   if guarded.ran else math.nan)
        model = config.spec.model
        rows.append({"label": config.label, "processor_steps": model.processor_steps,
                     "latent_size": model.latent_size,
                     "params": param_count(model, config.spec.task),
                     "temp_bytes": guarded.temp_bytes, "total_bytes": guarded.plan_bytes,
                     "fits": guarded.fits, "step_seconds": seconds,
                     "status": "ok" if guarded.fits else "oom",
                     "on_card": "ran" if guarded.ran else
                     f"needs {_format(guarded.plan_bytes)}, does not fit this card"})
        del guarded
        gc.collect()  # the cell's arrays go before the next cell allocates its own
    return pd.DataFrame(rows)


def page_text(text: str, width: int = PAGE_WIDTH) -> str:
    """`text` with every line wrapped at `width` characters, for a printed cell output.

    A rendered page scrolls a longer line sideways and hides its end; wrapped, it shows
    whole. Continuation lines are indented by two spaces; words are never split.

    Raises:
      ValueError: `width` not an integer >= 20.
    """
    width = require_count("width", width, 20)
    return "\n".join(
        textwrap.fill(line, width, subsequent_indent="  ", break_long_words=False,
                      break_on_hyphens=False) if len(line) > width else line
        for line in str(text).splitlines())
