"""What a device can hold: one rule for usable memory, cards by name, device classes.

Usable memory is what JAX's allocator lets a program use, never the card's printed size:

* for a device that is present, the allocator's limit, ``device.memory_stats()["bytes_limit"]``;
* for a card that is not present (planning for a T4 on a laptop), the card's memory times
  the share of it that JAX's GPU client takes for its pool: `DEFAULT_MEM_FRACTION` (0.75),
  or ``XLA_CLIENT_MEM_FRACTION`` where that is set (``XLA_PYTHON_CLIENT_MEM_FRACTION``, the
  name it replaces, where only that is; `mem_fraction`).
  ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` only delays allocation: the limit is the same.

A configuration *fits* when XLA's compiled plan is at most `FIT_MARGIN` of usable memory:
the rest covers what the plan does not count (allocator fragmentation, cuDNN and cuBLAS
workspaces, autotuning buffers). The planner, the chapters, the plots and the README all
use `usable_bytes` and `fits`; there is no other definition of "fits" in gclab.

Device classes group cards whose usable memory sets what a chapter can run
(`device_class`): ``cpu``, ``16GB``, ``24GB``, ``40GB``, ``80GB`` and ``141GB``.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from typing import Any, Optional

from gclab.config import SettingError, is_number, require_kind

GB = 10**9
GiB = 2**30
#: Share of a GPU's memory that JAX's allocator takes by default.
DEFAULT_MEM_FRACTION = 0.75
#: Share of usable memory a compiled plan may take and still count as fitting.
FIT_MARGIN = 0.9
#: The variable that sets JAX's GPU pool as a share of the card (jaxlib >= 0.10 reads it first).
MEM_FRACTION_ENV = "XLA_CLIENT_MEM_FRACTION"
#: Its deprecated name, still read where `MEM_FRACTION_ENV` is not set.
DEPRECATED_MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"


@dataclasses.dataclass(frozen=True)
class Card:
    """One accelerator's memory as its vendor states it, or as CUDA reports it where that is
    less (the T4's).

    Attributes:
      name: the name accepted wherever a budget is (``T4``, ``A100-40GB``).
      memory_bytes: memory in bytes.
      unit: how the vendor counts it: ``GB`` (10^9 bytes) or ``GiB`` (2^30 bytes).
      kind: ``gpu`` (JAX's GPU client takes a fraction for its pool) or ``tpu`` (the
        whole high-bandwidth memory of one chip is the limit).
    """

    name: str
    memory_bytes: int
    unit: str
    kind: str = "gpu"

    def describe(self) -> str:
        size = self.memory_bytes / (GB if self.unit == "GB" else GiB)
        return f"{self.name} ({size:g} {self.unit})"


def _cards(*cards: Card) -> dict[str, Card]:
    return {c.name: c for c in cards}


#: Cards by name. NVIDIA counts GB (10^9 bytes); Google counts TPU memory per chip in GiB.
CARDS: dict[str, Card] = _cards(
    # Not the printed 16 GB: CUDA gives a T4 15,835,660,288 bytes in all (deviceQuery on
    # Colab's T4: "15102 MBytes (15835660288 bytes)"; PyTorch's out-of-memory messages there:
    # "14.75 GiB total capacity"), and JAX's pool is its share of that.
    Card("T4", 15_835_660_288, "GB"),
    Card("V100-16GB", 16 * GB, "GB"),
    Card("L4", 24 * GB, "GB"),
    Card("A10G", 24 * GB, "GB"),
    Card("V100-32GB", 32 * GB, "GB"),
    Card("A100-40GB", 40 * GB, "GB"),
    Card("A100-80GB", 80 * GB, "GB"),
    Card("H100", 80 * GB, "GB"),
    Card("H200", 141 * GB, "GB"),
    Card("TPU-v4", 32 * GiB, "GiB", "tpu"),
    Card("TPU-v5e", 16 * GiB, "GiB", "tpu"),
)


@dataclasses.dataclass(frozen=True)
class DeviceClass:
    """Cards grouped by what they can run; the class's card is the smallest of the group.

    Attributes:
      name: ``cpu``, ``16GB``, ``24GB``, ``40GB``, ``80GB`` or ``141GB``.
      card: the card whose usable memory the class promises (None for ``cpu``).
      usable_bytes: usable memory of that card (for ``cpu``: `CPU_USABLE_BYTES`).
    """

    name: str
    card: Optional[str]
    usable_bytes: int

    @property
    def budget_bytes(self) -> int:
        """What a compiled plan may take on every device of this class: `FIT_MARGIN` x the
        smallest usable memory the class admits (`CLASS_TOLERANCE` x `usable_bytes`)."""
        low = self.usable_bytes if self.card is None else CLASS_TOLERANCE * self.usable_bytes
        return int(FIT_MARGIN * low)


#: Host memory a ``cpu``-class run may use: a 2-core CI runner with 7 GB, less Python and JAX.
CPU_USABLE_BYTES = 6 * GiB


def mem_fraction_setting() -> Optional[tuple[str, str]]:
    """The variable that sets JAX's GPU pool, and its text, as jaxlib reads them; None if unset.

    jaxlib (``generate_pjrt_gpu_plugin_options`` in ``xla_client.py``) reads
    ``XLA_CLIENT_MEM_FRACTION``, else its deprecated name ``XLA_PYTHON_CLIENT_MEM_FRACTION``,
    and refuses both at once; so does this.

    Raises:
      SettingError: both variables are set (a `ValueError`, shown in one line by a notebook).
    """
    new = os.environ.get(MEM_FRACTION_ENV, "").strip()
    old = os.environ.get(DEPRECATED_MEM_FRACTION_ENV, "").strip()
    if new and old:
        raise SettingError(f"{MEM_FRACTION_ENV}={new!r} and {DEPRECATED_MEM_FRACTION_ENV}={old!r} "
                           f"are both set: JAX refuses both; unset {DEPRECATED_MEM_FRACTION_ENV} "
                           f"(deprecated)")
    if new:
        return MEM_FRACTION_ENV, new
    if old:
        return DEPRECATED_MEM_FRACTION_ENV, old
    return None


def mem_fraction() -> float:
    """JAX's GPU pool as a share of the card: what `mem_fraction_setting` names, or 0.75.

    Raises:
      SettingError: the variable is set to anything but a number in (0, 1], or both names
        are set (`mem_fraction_setting`); a `ValueError`, shown in one line by a notebook.
    """
    setting = mem_fraction_setting()
    if setting is None:
        return DEFAULT_MEM_FRACTION
    name, text = setting
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise SettingError(f"{name}={text!r} is invalid: a number in (0, 1]")
    return value


def card(name: str) -> Card:
    """The `Card` called `name` (case-insensitive).

    Raises:
      ValueError: an unknown name (the message lists the known ones).
    """
    for key, value in CARDS.items():
        if key.lower() == str(name).strip().lower():
            return value
    raise ValueError(f"unknown card {name!r}: one of " + ", ".join(CARDS))


def card_usable_bytes(name: str) -> int:
    """Usable memory of a card that is not present (see the module docstring)."""
    c = card(name)
    return c.memory_bytes if c.kind == "tpu" else int(mem_fraction() * c.memory_bytes)


def device_bytes_limit(device: Any) -> Optional[int]:
    """The allocator limit a device reports, or None (CPU, or a backend without stats)."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - some backends raise instead of returning None
        return None
    limit = (stats or {}).get("bytes_limit")
    return int(limit) if limit else None


def default_platform() -> str:
    """The platform a program compiles for where its arguments are placed on no device: that
    of JAX's default device (`jax.default_device`, which code compiling for given devices
    sets while it traces), else the default backend."""
    import jax

    default = jax.config.jax_default_device
    if default is not None:
        return default if isinstance(default, str) else default.platform
    return jax.default_backend()


def usable_bytes(device: Any = None, *, card_name: Optional[str] = None) -> Optional[int]:
    """Memory a program may use: a present device's allocator limit, or a named card's.

    Args:
      device: a JAX device (default: the first device, when no `card_name` is given).
      card_name: a card in `CARDS` that need not be present.

    Returns:
      Bytes; None for a device that reports no limit (CPU).
    """
    if card_name is not None:
        return card_usable_bytes(card_name)
    if device is None:
        import jax

        device = jax.devices()[0]
    return device_bytes_limit(device)


def _require_bytes(caller: str, name: str, value: Any, least: int, note: str = "") -> None:
    """Refuses a byte count that is no number, or one below `least` (or NaN)."""
    allowed = f"a number of bytes >= {least}{note}"
    if not is_number(value):
        # A bool is a number to isinstance, yet no byte count: `()` admits no kind at all.
        require_kind(name, value, () if isinstance(value, bool) else numbers.Real, allowed,
                     caller=caller)
    if not value >= least:
        raise ValueError(f"{caller} {name}={value!r} is invalid: {allowed}")


def fits(plan_bytes: float, usable: float) -> bool:
    """Whether a compiled plan of `plan_bytes` fits `usable` bytes with the margin.

    Raises:
      ValueError: `plan_bytes` below 0 or `usable` below 1 (or NaN); `WrongType` (a
        TypeError too) for either that is no number (None, ``"1GB"``).
    """
    _require_bytes("fits", "plan_bytes", plan_bytes, 0)
    _require_bytes("fits", "usable", usable, 1, " (usable_bytes() is None on a CPU)")
    return plan_bytes <= FIT_MARGIN * usable


#: A device counts as of a class when it has this share of the class's usable memory:
#: drivers report a little less than the printed size (ECC, reserved memory).
CLASS_TOLERANCE = 0.95


def device_class_of(usable: Optional[int]) -> DeviceClass:
    """The largest class whose usable memory `usable` bytes reach (None: ``cpu``).

    A device reaches a class with `CLASS_TOLERANCE` of the class's usable memory; the
    scales leave that much to spare (`FIT_MARGIN` is smaller). A card that reaches no GPU
    class (one smaller than a T4) is of the ``cpu`` class: the smallest GPU class's
    configurations need more than it holds.

    Raises:
      ValueError: `usable` below 1 (or NaN); `WrongType` (a TypeError too) for a `usable`
        that is neither None nor a number (``"16GB"``: a class is found by its bytes).
    """
    if usable is None:
        return DEVICE_CLASSES["cpu"]
    _require_bytes("device_class_of", "usable", usable, 1, " or None (a CPU)")
    chosen = DEVICE_CLASSES["cpu"]
    for cls in DEVICE_CLASSES.values():
        if cls.card is not None and usable >= CLASS_TOLERANCE * cls.usable_bytes:
            chosen = cls
    return chosen


def _classes() -> dict[str, DeviceClass]:
    out = {"cpu": DeviceClass("cpu", None, CPU_USABLE_BYTES)}
    for name, card_name in (("16GB", "T4"), ("24GB", "L4"), ("40GB", "A100-40GB"),
                            ("80GB", "H100"), ("141GB", "H200")):
        c = CARDS[card_name]
        out[name] = DeviceClass(name, card_name, int(DEFAULT_MEM_FRACTION * c.memory_bytes))
    return out


#: Device classes, smallest first; each promises its card's usable memory at JAX's default.
DEVICE_CLASSES: dict[str, DeviceClass] = _classes()


def backends_started() -> bool:
    """Whether JAX has started its backends in this process (after the first array or
    device query), so that settings read at start (the CPU device count, ``XLA_FLAGS``)
    can no longer change.

    JAX has no public query for it; what it does expose is that its backend-start settings
    (``jax_num_cpu_devices``) refuse a new value once the backends run. So this asks for a
    different count and puts the old one back: nothing changes, whatever the answer.
    """
    import jax

    now = jax.config.jax_num_cpu_devices
    try:
        jax.config.update("jax_num_cpu_devices", now + 1 if now > 0 else 1)
    except RuntimeError:
        return True
    jax.config.update("jax_num_cpu_devices", now)
    return False
