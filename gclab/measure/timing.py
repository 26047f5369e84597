"""Wall-clock timing: the median of several calls after a warm-up call.

One helper for every timed call in gclab, its benchmarks and its book. Timings are
reported by benchmarks and chapters; tests never assert them.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

from gclab.config import is_number, require_count


def median_seconds(fn: Callable[[], object], repeats: int = 3, warmup: int = 1, *,
                   long_seconds: float | None = None) -> float:
    """Median wall seconds of `fn()` over `repeats` calls, after `warmup` untimed calls.

    `fn` must block until its work is done (e.g. end in `jax.block_until_ready`).

    Args:
      long_seconds: where set, a warm-up call that takes at least this long ends the
        warm-up and counts as the first timed call. A first call's one-time costs (memory
        touched for the first time, threads started) are a small part of so long a call, and
        a step that slow is not run again only to be thrown away.

    Raises:
      ValueError: `repeats` not an integer >= 1 (Python or numpy, not a bool), `warmup`
        not an integer >= 0, or `long_seconds` not a number > 0.
    """
    repeats = require_count("repeats", repeats, 1, "median_seconds")
    warmup = require_count("warmup", warmup, 0, "median_seconds")
    if long_seconds is not None and (not is_number(long_seconds) or not long_seconds > 0):
        raise ValueError(f"median_seconds long_seconds={long_seconds!r} is invalid: a number of "
                         "seconds > 0")
    times = []
    for _ in range(warmup):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        if long_seconds is not None and took >= long_seconds:
            times.append(took)
            break
    while len(times) < repeats:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(statistics.median(times))
