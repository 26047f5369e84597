"""Small workloads for `gclab.measure.peak.measure_peak` (used by the tests and the book).

Each function takes JSON-able keyword arguments, runs in the child process that
`measure_peak` starts, and returns a JSON-able summary.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def allocate(nbytes: int = 64 * 2**20, repeat: int = 1) -> dict[str, Any]:
    """Allocates a float32 array of about `nbytes` and runs a jitted op on it.

    The jitted op (``x * 2 + 1``) keeps the input alive and produces an output of the
    same size, so the expected peak is about ``2 * nbytes``.

    Args:
      nbytes: bytes of the input array (rounded down to whole float32 elements).
      repeat: how many times the jitted op runs.

    Returns:
      ``{'nbytes': ..., 'checksum': ...}``.
    """
    n = max(int(nbytes) // 4, 1)
    x = jnp.ones((n,), jnp.float32)
    op = jax.jit(lambda v: v * 2.0 + 1.0)
    y = x
    for _ in range(int(repeat)):
        y = op(x)
    y.block_until_ready()
    return {"nbytes": n * 4, "checksum": float(y[0])}


def fail(message: str = "deliberate failure") -> None:
    """Raises `ValueError(message)`; exercises the 'error' path."""
    raise ValueError(message)


def exhaust(message: str = "RESOURCE_EXHAUSTED: Out of memory allocating 1 TiB") -> None:
    """Raises an error that looks like XLA's out-of-memory; exercises the 'oom' path."""
    raise RuntimeError(message)
