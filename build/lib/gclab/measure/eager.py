"""What an op-by-op (un-fused, un-jitted) execution would allocate, from the jaxpr alone.

Shapes: none in particular; bytes of each equation's outputs.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
from jax.extend.core import Var


def op_by_op_bytes(fn: Callable, *args) -> dict:
    """Bytes an op-by-op (un-fused, un-jitted) execution of `fn` would allocate.

    Traces `fn` to a jaxpr (nothing runs) and walks its top-level equations in order, as
    eager execution does: every equation materialises its outputs, and a value is freed
    after its last use (outputs of `fn` stay to the end; arguments are not counted).

    Returns:
      ``{'ops': equations, 'output_bytes': sum of all equation outputs,
      'peak_live_bytes': most intermediate bytes alive at once}``.
    """
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr

    def nbytes(v) -> int:
        aval = v.aval
        return int(math.prod(aval.shape)) * aval.dtype.itemsize if hasattr(aval, "shape") else 0

    last_use = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if isinstance(v, Var):
                last_use[v] = i
    for v in jaxpr.outvars:
        if isinstance(v, Var):
            last_use[v] = len(jaxpr.eqns)
    live, total, peak = {}, 0, 0
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.outvars:
            live[v] = nbytes(v)
            total += live[v]
        peak = max(peak, sum(live.values()))
        for v in [v for v in live if last_use.get(v, -1) <= i]:
            del live[v]
    return {"ops": len(jaxpr.eqns), "output_bytes": total, "peak_live_bytes": peak}
