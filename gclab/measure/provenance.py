"""Where a recorded measurement was taken: the machine, the versions and the date.

Every benchmark writes this beside its figures, so that a number in the book or the README
can always be traced to the hardware, software and time that produced it.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from typing import Any

import jax

import gclab
from gclab.measure.compiled import plan_only_options


def machine(**extra: Any) -> dict[str, Any]:
    """The machine and versions a measurement ran on, with the date (UTC).

    Args:
      **extra: further fields a benchmark records with them (e.g. ``simulated_devices``).

    Returns:
      backend, device kind, platform, processor, CPU count, the 1-minute load average (a
      busy machine inflates wall times), Python, jax and gclab versions, the compiler
      settings (``XLA_FLAGS``, and the options of a compile only read,
      `plan_only_options`, whose memory plan may differ from a compile that runs by under
      1% on XLA:CPU), and the date.
    """
    return {"backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
            **extra, "platform": platform.platform(), "processor": platform.processor(),
            "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
            "jax": jax.__version__, "gclab": gclab.__version__,
            "load_average_1min": round(os.getloadavg()[0], 2),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "plan_only_options": plan_only_options(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
