"""Wall-clock timing: the median of several calls after a warm-up call.

One helper for every timed call in gclab, its benchmarks and its book. Timings are
reported by benchmarks and chapters; tests never assert them.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> float:
    """Median wall seconds of `fn()` over `repeats` calls, after `warmup` untimed calls.

    `fn` must block until its work is done (e.g. end in `jax.block_until_ready`).

    Raises:
      ValueError: `repeats` < 1 or `warmup` < 0.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} is invalid: an integer >= 1")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} is invalid: an integer >= 0")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(statistics.median(times))
