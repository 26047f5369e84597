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

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Optional

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
    from gclab.measure import format_bytes

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


def choose_scale() -> str:
    """`cpu`, `gpu` or `big`: from `GCLAB_SCALE` if set, else from the hardware.

    Raises:
      ValueError: `GCLAB_SCALE` set to anything else.
    """
    forced = os.environ.get("GCLAB_SCALE", "").strip().lower()
    if forced:
        if forced not in SCALES:
            raise ValueError(f"GCLAB_SCALE={os.environ['GCLAB_SCALE']!r} is invalid: one of "
                             + ", ".join(SCALES))
        return forced
    import jax

    if jax.default_backend() == "cpu":
        return "cpu"
    memory = _device_memory(jax.devices()[0]) or 0
    return "big" if memory >= BIG_CARD_BYTES else "gpu"


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
