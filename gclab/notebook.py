"""What the book's chapters share: the hardware report, the scale, recorded measurements.

Every chapter prints `hardware_report()` (backend, device, memory, versions, date) so that
each number in it names the machine it came from, and runs at `choose_scale()`:

* `cpu`: small grids, so that each chapter stays within about 3 minutes on 2 cores;
* `gpu`: a Colab-class card (T4 16 GB, L4 24 GB): 1 deg compiled figures, larger live runs;
* `big`: an 80 GB-class card (A100/H100): the published sizes, run for real.

The scale comes from the hardware and can be forced with `GCLAB_SCALE=cpu|gpu|big`.
Measurements recorded on a GPU live in `book/data/<name>.json` (hardware and date inside)
and are read with `recorded(name)`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
from pathlib import Path
from typing import Optional

from gclab.config import ModelConfig

try:
    from myst_nb import glue as myst_glue
except ImportError:  # a notebook outside the book's build (Colab): values are not pasted
    myst_glue = None

SCALES = ("cpu", "gpu", "big")
BIG_CARD_BYTES = 60 * 2**30  # cards with at least this much memory run at `big`
DATA_DIR = Path(__file__).resolve().parent.parent / "book" / "data"


class HardwareReport(dict):
    """A dict of hardware facts that prints as an aligned table."""

    def __str__(self) -> str:
        width = max(map(len, self))
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.items())


def _device_memory(device) -> Optional[int]:
    try:
        stats = device.memory_stats()
    except Exception:  # some backends raise instead of returning None
        return None
    return None if not stats else stats.get("bytes_limit")


def _host_memory() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def hardware_report() -> HardwareReport:
    """Backend, device, memory, CPU count, library versions and the date."""
    import haiku
    import jax
    import jaxlib

    import gclab
    from gclab.measure.compiled import format_bytes

    device = jax.devices()[0]
    device_memory = _device_memory(device)
    host = _host_memory()
    return HardwareReport({
        "backend": jax.default_backend(),
        "device": f"{device.device_kind} (x{jax.device_count()})",
        "device memory": format_bytes(device_memory) if device_memory else "n/a (CPU: host RAM)",
        "host memory": format_bytes(host) if host else "unknown",
        "cpu cores": os.cpu_count(),
        "platform": platform.platform(),
        "versions": f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
                    f"haiku {haiku.__version__}, gclab {gclab.__version__}",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    })


@dataclasses.dataclass(frozen=True, eq=False)
class Scale:
    """The sizes a chapter runs at, picked from the hardware by `choose_scale`.

    A `Scale` compares equal to its name (``SCALE == "cpu"``) and its ``repr`` is the
    quoted name, so chapters can branch on it like a string; ``str(scale)`` and
    `describe` spell out the sizes.

    Attributes:
      name: ``cpu``, ``gpu`` or ``big``.
      compiled: the model whose training step is compiled (memory from shapes alone;
        compiling costs time, not device memory).
      live: the model that is actually run (forward passes, gradients, timed steps).
      geometries: ``(resolution, mesh_splits)`` pairs for "how it grows" sweeps, coarse
        to fine.
      timed_repeats: timed calls per measurement (after one warm-up call).
    """

    name: str
    compiled: ModelConfig
    live: ModelConfig
    geometries: tuple
    timed_repeats: int

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.name == other
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

        return {"scale": self.name, "compiled": model(self.compiled), "live": model(self.live),
                "geometries": ", ".join(f"{r:g} deg/{s}" for r, s in self.geometries),
                "timed repeats": str(self.timed_repeats)}


def _scale(name: str, compiled: tuple, live: tuple, geometries: tuple,
           timed_repeats: int) -> Scale:
    def model(res: float, splits: int, steps: int, latent: int) -> ModelConfig:
        return ModelConfig(resolution=res, mesh_splits=splits, processor_steps=steps,
                           latent_size=latent)

    return Scale(name, model(*compiled), model(*live), geometries, timed_repeats)


# (resolution, splits, steps, latent) of the compiled and live models; sweep geometries.
SCALE_TABLE = {
    # 2 cores: each chapter within about 3 minutes.
    "cpu": _scale("cpu", (4.0, 3, 8, 128), (4.0, 3, 4, 32), ((4.0, 3), (2.0, 4)), 1),
    # Colab T4 / L4: compiled figures of GraphCast_small's sizes, mid-size live runs.
    "gpu": _scale("gpu", (1.0, 5, 16, 512), (2.0, 4, 16, 256),
                  ((4.0, 3), (2.0, 4), (1.0, 5)), 3),
    # 80 GB-class: the published model compiled, GraphCast_small run for real.
    "big": _scale("big", (0.25, 6, 16, 512), (1.0, 5, 16, 512),
                  ((4.0, 3), (2.0, 4), (1.0, 5), (0.25, 6)), 5),
}


def print_hardware() -> HardwareReport:
    """Prints `hardware_report()` as an aligned table and returns it."""
    report = hardware_report()
    print(report)
    return report


def choose_scale() -> Scale:
    """The `Scale` of this machine: `GCLAB_SCALE` if set, else from the hardware.

    CPU backends get ``cpu``; accelerators with at least `BIG_CARD_BYTES` of memory get
    ``big``, smaller ones ``gpu``.

    Raises:
      ValueError: `GCLAB_SCALE` set to anything but ``cpu``, ``gpu`` or ``big``.
    """
    forced = os.environ.get("GCLAB_SCALE", "").strip().lower()
    if forced:
        if forced not in SCALES:
            raise ValueError(f"GCLAB_SCALE={os.environ['GCLAB_SCALE']!r} is invalid: one of "
                             + ", ".join(SCALES))
        return SCALE_TABLE[forced]
    import jax

    if jax.default_backend() == "cpu":
        return SCALE_TABLE["cpu"]
    memory = _device_memory(jax.devices()[0]) or 0
    return SCALE_TABLE["big" if memory >= BIG_CARD_BYTES else "gpu"]


def recorded(name: str, data_dir: Optional[Path] = None) -> Optional[dict]:
    """The recorded measurement `book/data/<name>.json`, or None if there is none.

    Raises:
      ValueError: the file exists but is not valid JSON or names no hardware and date.
    """
    path = Path(data_dir or DATA_DIR) / f"{name}.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(record, dict) or "hardware" not in record or "date" not in record:
        raise ValueError(f"{path}: a recording must name its 'hardware' and 'date'")
    return record


def glue(name: str, value):
    """Hands `value` to the chapter's prose, where ``{glue:text}`name``` pastes it; returns it.

    It is myst-nb's `glue` without display, so that no number in the text is typed by hand:
    the book's build pastes what the cell computed. Where myst-nb is not installed (Colab),
    the value is only returned.

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
    return value
