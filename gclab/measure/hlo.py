"""What XLA made of a function: FLOPs and fusions of the optimised HLO.

* `flops` reads XLA's cost analysis of a compiled function (`Compiled.cost_analysis()`):
  the floating-point operations of one call, as XLA counts them for the backend.
* `fusion_counts` and `largest_fusion` read the optimised HLO text
  (`Compiled.as_text()`): every fusion is a computation of its own, named by the
  ``calls=`` of the ``fusion`` instruction that runs it, and runs as one kernel whose
  intermediates never reach memory. Its name is the backend's choice (``fused_...``,
  ``wrapped_..._computation``, ``gemm_fusion_..._computation`` for XLA:GPU's Triton
  fusions), so the computations are found through the instructions, not their names.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["flops", "fusion_counts", "hlo_computations", "largest_fusion"]

_METADATA_RE = re.compile(r", metadata=\{.*\}")
# The computation a fusion instruction runs: `%f = ... fusion(...), kind=..., calls=%name`.
_FUSION_CALLS_RE = re.compile(r" fusion\(.*?\bcalls=%?([^\s,{}]+)")


def flops(compiled: Any) -> float:
    """XLA's FLOP count of one call of a compiled function (NaN when it gives none).

    XLA's cost analysis reads the HLO, not an execution: the body of a while loop (a
    `lax.scan`, such as the processor's steps) is counted once, whatever its trip count
    (so on XLA:CPU with the jax of this repository; chapter 4 shows it live).

    Args:
      compiled: a `jax.stages.Compiled` (e.g. from `gclab.measure.compile_fn`).
    """
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float((cost or {}).get("flops", float("nan")))


def _computation_name(line: str) -> str | None:
    """The name a computation's header line declares, or None for any other line."""
    if not line or line.startswith(" ") or not line.rstrip().endswith("{"):
        return None
    words = line.split()
    return (words[1] if words[0] == "ENTRY" else words[0]).lstrip("%")


def hlo_computations(hlo: str) -> list[str]:
    """Names of the computations of an HLO module's text (``ENTRY`` and the fusions' too)."""
    return [name for name in map(_computation_name, hlo.splitlines()) if name is not None]


def _fused_computations(hlo: str) -> set[str]:
    """Names of the computations that the module's ``fusion`` instructions call."""
    return {m.group(1) for m in map(_FUSION_CALLS_RE.search, hlo.splitlines()) if m}


def fusion_counts(hlo: str) -> dict[str, int]:
    """How much of an optimised HLO module XLA fused.

    Args:
      hlo: `Compiled.as_text()`.

    Returns:
      ``{"lines", "computations", "fused computations", "fusion instructions"}``.
    """
    computations = hlo_computations(hlo)
    fused = _fused_computations(hlo)
    return {
        "lines": len(hlo.splitlines()),
        "computations": len(computations),
        "fused computations": sum(c in fused for c in computations),
        "fusion instructions": sum(" fusion(" in line for line in hlo.splitlines()),
    }


def largest_fusion(hlo: str, max_lines: int = 18, width: int = 120) -> list[str]:
    """The first lines of the fused computation with the most instructions.

    Args:
      hlo: `Compiled.as_text()`.
      max_lines: lines returned.
      width: characters kept per line (source metadata is dropped first).

    Returns:
      Its header, parameters and first instructions; empty if nothing is fused.
    """
    # Computations are separated by blank lines, sometimes more than one: a piece may start
    # with newlines, which are not part of its header.
    fused = _fused_computations(hlo)
    bodies = [b.lstrip("\n") for b in hlo.split("\n\n")]
    bodies = [b for b in bodies if _computation_name(b.split("\n", 1)[0]) in fused]
    if not bodies:
        return []
    largest = max(bodies, key=lambda b: b.count("\n"))
    return [_METADATA_RE.sub("", line)[:width] for line in largest.splitlines()[:max_lines]]
