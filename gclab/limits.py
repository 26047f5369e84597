"""What a machine can hold: host memory, byte counts in words, and refusing work early.

Work whose size follows from its shapes (building graphs, synthetic weather, a training
step) is estimated first and refused with `TooLarge` when the estimate exceeds the limit,
before anything is allocated: one clear sentence instead of a numpy `MemoryError`, an
XLA abort, or the kernel's out-of-memory killer.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

from gclab.config import require_count

#: Largest byte count XLA is asked to plan: it counts bytes in signed 64-bit integers
#: (8 EiB) and aborts the process on overflow; 1 EiB leaves room for the estimate's error.
MAX_PLANNED_BYTES = 2**60

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


class TooLarge(ValueError):
    """Work refused before it started: its estimated size exceeds a limit."""


def format_bytes(n: float | None, digits: int = 2) -> str:
    """Formats a byte count with binary units.

    Args:
      n: number of bytes (may be negative, float, an int of any size, or None).
      digits: digits after the decimal point for units above bytes, an integer >= 0.

    Returns:
      A string such as ``'512 B'``, ``'1.50 MiB'`` or ``'3.00 GiB'``; ``'n/a'`` for
      None or NaN; counts beyond floats as a power of ten (``'about 10^620 B'``).

    Raises:
      ValueError: `digits` below 0; `WrongType` (a TypeError too) for `digits` that is no
        integer (2.5).
    """
    digits = require_count("digits", digits, 0, caller="format_bytes")
    if n is None:
        return "n/a"
    try:
        value = float(n)
    except OverflowError:  # an int beyond float range
        return f"{'-' if n < 0 else ''}about 10^{len(str(abs(n))) - 1} B"
    if math.isnan(value):
        return "n/a"
    sign = "-" if value < 0 else ""
    value = abs(value)
    if math.isinf(value):
        return f"{sign}inf B"
    i = 0
    while value >= 1024.0 and i < len(_UNITS) - 1:
        value /= 1024.0
        i += 1
    if i == 0:
        return f"{sign}{int(value)} B"
    return f"{sign}{value:.{digits}f} {_UNITS[i]}"


def host_memory_bytes() -> Optional[int]:
    """Memory this process may use: physical memory, or a smaller cgroup limit.

    Returns:
      Bytes, or None where neither can be read.
    """
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for name in _CGROUP_LIMITS:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits) if limits else None


def require_fits(what: str, needed: float, limit: Optional[float], limit_name: str) -> None:
    """Refuses work whose estimated size is over a limit.

    Args:
      what: the work, as the start of a sentence ("building the graphs of ...").
      needed: estimated bytes.
      limit: bytes allowed (None: unknown, nothing is refused).
      limit_name: what the limit is ("this machine's memory").

    Raises:
      TooLarge: `needed` > `limit`; the message gives both figures.
    """
    if limit is not None and needed > limit:
        raise TooLarge(f"{what} needs about {format_bytes(needed)}, more than {limit_name} "
                       f"({format_bytes(limit)}); refused before starting")
