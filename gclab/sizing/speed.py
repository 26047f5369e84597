"""Predicted step time: a training step's FLOPs and bytes turned into seconds.

One speed model for both planners (`gclab.sizing.plan` and
`gclab.sizing.layout_plan.plan_layout`):

    seconds = seconds_per_flop x F + seconds_per_byte x M
              + seconds_per_held_byte x A + overhead_seconds

F and M are the FLOPs and bytes moved of one training step from the analytical counts
(`gclab.sizing.analytical.step_work`: forward, backward, recompute, AdamW), A the
activation bytes the step holds (`gclab.sizing.analytical.estimate`'s temp of loss and
gradient). A matters on a CPU: XLA:CPU allocates a step's temporaries afresh each call, so
every held byte is first-touched (a page fault) and leaves the caches, and a step that
holds less can run faster even while it recomputes more (measured at ``cpu-16x512``: the
``deepmind`` recipe, which recomputes about one forward pass, ran faster than ``none``).
The coefficients come from one of two places:

* a **calibration**: real step times of the planner's candidates measured on a device
  and fitted by non-negative least squares (`fit_calibration`), recorded by
  ``python benchmarks/planner_calibration.py`` and shipped as package data
  (``gclab/recordings/planner-calibration-<device>.json``, read with
  `gclab.recordings.recorded`);
* a card's **data sheet** (`CARD_SPEEDS`): 1 / peak FLOP/s and 1 / memory bandwidth, no
  held-bytes term and no overhead (a roofline that adds the compute and memory times: it
  assumes no overlap; JAX's GPU allocator reuses its pool, so holding memory costs no
  time there).

`speed_for` picks one: a recorded calibration for the card named (or for the device
JAX finds, when no card is named), else that card's data sheet, else `REFERENCE_CARD`'s.
The model ranks candidate settings; a data sheet's seconds are a lower bound, not a
promise.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence, Union

import numpy as np
from scipy.optimize import nnls

from gclab.devices import card
from gclab.memory.config import PRECISIONS
from gclab.recordings import recorded
from gclab.sizing import analytical


@dataclasses.dataclass(frozen=True)
class CardSpeed:
    """Published peak speeds of one card (dense, no sparsity).

    Attributes:
      f32_flops: float32 matmul FLOP/s (TF32 tensor cores where the card has them, as
        XLA uses them for float32 matmuls by default on such cards).
      bf16_flops: bfloat16 (or float16 where the card has no bfloat16) FLOP/s.
      link_bytes_per_s: device-to-device bandwidth per device (NVLink, or PCIe).
      memory_bytes_per_s: bandwidth of the card's own memory.
    """
    f32_flops: float
    bf16_flops: float
    link_bytes_per_s: float
    memory_bytes_per_s: float


T = 1e12
G = 1e9
#: Vendors' data-sheet figures (SXM forms for V100/A100/H100; PCIe 3/4 x16 where no
#: NVLink; A10G with the A10's figures).
CARD_SPEEDS = {
    "T4": CardSpeed(8.1 * T, 65 * T, 16 * G, 320 * G),
    "V100-16GB": CardSpeed(15.7 * T, 125 * T, 300 * G, 900 * G),
    "V100-32GB": CardSpeed(15.7 * T, 125 * T, 300 * G, 900 * G),
    "L4": CardSpeed(60 * T, 121 * T, 32 * G, 300 * G),
    "A10G": CardSpeed(62.5 * T, 125 * T, 32 * G, 600 * G),
    "A100-40GB": CardSpeed(156 * T, 312 * T, 300 * G, 1555 * G),
    "A100-80GB": CardSpeed(156 * T, 312 * T, 300 * G, 2039 * G),
    "H100": CardSpeed(495 * T, 990 * T, 450 * G, 3350 * G),
    "H200": CardSpeed(495 * T, 990 * T, 450 * G, 4800 * G),
}
#: The card whose speeds rank candidates when nothing better is known.
REFERENCE_CARD = "H100"


@dataclasses.dataclass(frozen=True)
class SpeedModel:
    """Seconds of a training step from its FLOPs, bytes moved and bytes held.

    Attributes:
      seconds_per_flop: per FLOP.
      seconds_per_byte: per byte moved.
      seconds_per_held_byte: per activation byte held (0 for a data sheet).
      overhead_seconds: per step (launches, host work; 0 for a data sheet).
      name: what the coefficients describe, in words (``T4 data sheet``,
        ``cpu calibration``).
      source: ``data sheet`` or where the calibration was read.
      median_relative_error: of the fit over its measurements (None for a data sheet).
      max_relative_error: likewise, the largest.
      measurements: how many step times the fit used (0 for a data sheet).
    """
    seconds_per_flop: float
    seconds_per_byte: float
    seconds_per_held_byte: float
    overhead_seconds: float
    name: str
    source: str
    median_relative_error: Optional[float] = None
    max_relative_error: Optional[float] = None
    measurements: int = 0

    def seconds_of(self, flops: float, moved_bytes: float, held_bytes: float = 0.0) -> float:
        """The time of this much work, without the fixed overhead."""
        return (self.seconds_per_flop * flops + self.seconds_per_byte * moved_bytes
                + self.seconds_per_held_byte * held_bytes)

    def work(self, spec: Any, counts: Optional[analytical.GraphCounts] = None
             ) -> tuple[float, float, float]:
        """(FLOPs, bytes moved, activation bytes held) of one training step of `spec`."""
        return step_work_held(spec, counts)

    def seconds(self, spec: Any, counts: Optional[analytical.GraphCounts] = None) -> float:
        """Predicted seconds of one training step of `spec` (a `StepSpec`)."""
        return self.seconds_of(*self.work(spec, counts)) + self.overhead_seconds

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["seconds_per_gflop"] = self.seconds_per_flop * 1e9
        d["seconds_per_gib"] = self.seconds_per_byte * 2**30
        d["seconds_per_held_gib"] = self.seconds_per_held_byte * 2**30
        return d

    @classmethod
    def from_dict(cls, d: dict, source: str) -> "SpeedModel":
        """From `to_dict`'s output (extra keys ignored), read from `source`."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in d.items() if k in names}, "source": source})


@functools.lru_cache(maxsize=64)
def _counts(model) -> analytical.GraphCounts:
    return analytical.GraphCounts.for_model(model)


def step_work_held(spec: Any, counts: Optional[analytical.GraphCounts] = None
                   ) -> tuple[float, float, float]:
    """(FLOPs, bytes moved, activation bytes held) of one training step of `spec` (a
    `StepSpec`), from the analytical counts."""
    c = counts or _counts(spec.model)
    flops, moved = analytical.step_work(spec.model, spec.task, spec.memory, c, spec.batch,
                                        spec.rollout)
    held = analytical.estimate(spec.model, spec.task, spec.memory, batch=spec.batch,
                               rollout=spec.rollout, counts=c).loss_grad_temp_bytes
    return flops, moved, float(held)


def _require_precision(fn: str, precision: Any) -> None:
    """Raises the ValueError of an unknown precision (any other name would silently read
    as bfloat16 speeds)."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"{fn} precision={precision!r} is invalid: one of "
                         + ", ".join(PRECISIONS))


def data_sheet(card_name: str, precision: str = "f32") -> SpeedModel:
    """The roofline of a card in `CARD_SPEEDS` at `precision`.

    Raises:
      ValueError: a card without recorded speeds, or a precision not in
        `gclab.memory.config.PRECISIONS` (`f32`, `bf16`).
    """
    if card_name not in CARD_SPEEDS:
        raise ValueError(f"no speeds for card {card_name!r}: one of " + ", ".join(CARD_SPEEDS))
    _require_precision("data_sheet", precision)
    s = CARD_SPEEDS[card_name]
    flops = s.f32_flops if precision == "f32" else s.bf16_flops
    return SpeedModel(1.0 / flops, 1.0 / s.memory_bytes_per_s, 0.0, 0.0,
                      f"{card_name} data sheet", "data sheet")


def fit_calibration(specs: Sequence[Any], seconds: Sequence[float],
                    name: str = "calibration") -> SpeedModel:
    """Fits the four coefficients (all >= 0) of the speed model to measured step times
    (least squares on relative error, so a fast step counts as much as a slow one).

    Args:
      specs: the measured steps (`StepSpec`s).
      seconds: their measured step times.
      name: what the fit describes.

    Raises:
      ValueError: fewer than three measurements, or lengths that differ.
    """
    if len(specs) != len(seconds) or len(specs) < 3:
        raise ValueError("fit_calibration: at least three (spec, seconds) pairs are needed")
    work = np.array([step_work_held(s) for s in specs])  # [n, 3]
    t = np.asarray(seconds, np.float64)  # [n]
    design = np.column_stack([work, np.ones(len(t))])  # [n, 4]
    scale = design.max(axis=0)  # columns of order 1, for the solver
    coef, _ = nnls(design / scale / t[:, None], np.ones(len(t)))
    coef = coef / scale
    rel = np.abs(design @ coef / t - 1)
    return SpeedModel(*(float(x) for x in coef), name, "fit",
                      float(np.median(rel)), float(rel.max()), len(t))


def calibration_name(device: str) -> str:
    """The recording that holds the calibration of `device` (``cpu`` or a card name)."""
    return f"planner-calibration-{device.lower()}"


def load_calibration(device: str) -> Optional[SpeedModel]:
    """The recorded calibration of `device` (``cpu`` or a card name), or None."""
    record = recorded(calibration_name(device))
    if record is None or "fit" not in record:
        return None
    hw = record["hardware"]
    fit = dict(record["fit"])
    fit["name"] = (f"{device} calibration ({hw.get('device', device)}, "
                   f"{hw.get('cpu_count', '?')} cores, {str(record['date'])[:10]})"
                   if device == "cpu" else
                   f"{device} calibration ({hw.get('device', device)}, {str(record['date'])[:10]})")
    return SpeedModel.from_dict(fit, record["source"])


def card_of_device_kind(kind: str) -> Optional[str]:
    """The `CARD_SPEEDS` card a JAX ``device_kind`` names (``NVIDIA H100 80GB HBM3`` ->
    ``H100``, ``Tesla T4`` -> ``T4``), or None."""
    text = kind.upper().replace(" ", "-")
    for name in sorted(CARD_SPEEDS, key=len, reverse=True):
        base, _, size = name.upper().partition("-")
        if base in text.split("-") and (not size or size in text):
            return name
    return None


def present_device() -> str:
    """``cpu`` on a CPU, else the card of the first device (its ``device_kind`` when no
    card matches)."""
    import jax

    dev = jax.devices()[0]
    if dev.platform == "cpu":
        return "cpu"
    return card_of_device_kind(dev.device_kind) or dev.device_kind


def card_name(budget: Union[int, float, str, None]) -> Optional[str]:
    """The `gclab.devices.CARDS` name a budget names (any case), else None."""
    if not isinstance(budget, str):
        return None
    try:
        return card(budget).name
    except ValueError:
        return None


def speed_for(card_named: Optional[str] = None, precision: str = "f32") -> SpeedModel:
    """The speed model to rank candidates with.

    Args:
      card_named: the card a budget names; None for the device JAX finds.
      precision: `f32` or `bf16` (a data sheet's FLOP/s differ; a calibration was fitted
        on float32 steps and is used for both).

    Returns:
      A recorded calibration of that device, else its data sheet, else
      `REFERENCE_CARD`'s (its `name` says which).

    Raises:
      ValueError: a precision not in `gclab.memory.config.PRECISIONS`.
    """
    # Checked here too: a calibration is used for both precisions and would hide a typo.
    _require_precision("speed_for", precision)
    device = card_named or present_device()
    calibrated = load_calibration(device)
    if calibrated is not None:
        return calibrated
    if device in CARD_SPEEDS:
        return data_sheet(device, precision)
    ref = data_sheet(REFERENCE_CARD, precision)
    return dataclasses.replace(ref, name=f"{ref.name} (no speeds known for {device})")

