"""Instruments: what XLA plans, what a process uses, and when memory is live.

| module | what it is for |
|---|---|
| `compiled` | XLA's compiled memory of a function, from shapes alone |
| `collectives` | bytes a partitioned program's collectives move per device, from its HLO |
| `peak` | the measured peak of a workload in a fresh process |
| `timeline` | the memory timeline of a compiled function, from XLA's buffer assignment |
| `residuals` | what JAX saves for the backward pass, by module |
| `hostmem` | host (numpy) allocations during a block of code, with memray |
| `hlo` | FLOPs and fusions of a compiled function's optimised HLO |
| `timing` | the median wall time of a call |
| `provenance` | the machine, versions and date a recorded measurement names |
| `eager` | bytes an op-by-op execution would allocate |
| `targets` | small workloads for `measure_peak` (tests and the book) |
"""

from gclab.measure.compiled import (
    DEFAULT_CPU_OPTIONS,
    PLAN_ONLY_CPU_OPTIONS,
    CompiledMemory,
    compile_fn,
    compile_timed,
    compiled_memory,
    format_bytes,
    known_options,
    memory_of_compiled,
    plan_only_options,
)
from gclab.measure.eager import op_by_op_bytes
from gclab.measure.hlo import flops, fusion_counts, hlo_computations, largest_fusion
from gclab.measure.hostmem import HostMemory, track_host_memory
from gclab.measure.peak import PeakResult, measure_peak
from gclab.measure.provenance import machine
from gclab.measure.residuals import (
    ARGUMENTS_GROUP,
    NOT_A_GRAPH_SET,
    bytes_by_graph_set,
    indexed_by,
    module_of_scope,
    saved_residuals_df,
    summarize_residuals,
)
from gclab.measure.timeline import (
    BACKWARD_PREFIX,
    LiveValue,
    Timeline,
    compile_with_timeline,
    label_op,
    memory_timeline,
    timeline_from_dump,
)
from gclab.measure.timing import median_seconds
from gclab.parallel.collectives import COLLECTIVES, collective_bytes

__all__ = [
    "ARGUMENTS_GROUP", "BACKWARD_PREFIX", "COLLECTIVES", "NOT_A_GRAPH_SET", "CompiledMemory",
    "DEFAULT_CPU_OPTIONS", "PLAN_ONLY_CPU_OPTIONS",
    "HostMemory", "LiveValue", "PeakResult", "Timeline", "bytes_by_graph_set", "collective_bytes",
    "compile_fn",
    "compile_timed", "compile_with_timeline", "compiled_memory", "flops", "format_bytes",
    "known_options",
    "fusion_counts", "hlo_computations", "indexed_by", "label_op", "largest_fusion", "machine",
    "measure_peak",
    "median_seconds", "memory_of_compiled", "memory_timeline", "module_of_scope",
    "op_by_op_bytes", "plan_only_options", "saved_residuals_df", "summarize_residuals",
    "timeline_from_dump", "track_host_memory",
]
