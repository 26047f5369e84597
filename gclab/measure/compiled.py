"""What XLA plans: the compiled memory of a function, from shapes alone.

* **Planned** (`compiled_memory`, `compile_fn`): XLA's own accounting of a compiled
  function (`Compiled.memory_analysis()`): bytes of arguments, outputs, temporaries
  and aliased (donated) buffers. It needs no allocation: arguments may be
  `jax.ShapeDtypeStruct` pytrees, so a configuration far larger than this machine can
  be sized in seconds. Note: on CPU, `peak_memory_in_bytes` leaves out temporaries,
  so we never use it; `total_bytes` is computed here as
  ``argument + output + temp - alias``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from gclab.limits import format_bytes

__all__ = ["DEFAULT_CPU_OPTIONS", "PLAN_ONLY_CPU_OPTIONS", "CompiledMemory", "compile_fn",
           "compile_timed", "compiled_memory", "format_bytes", "memory_of_compiled",
           "plan_only_options"]


#: XLA:CPU options of a compile that is read, never run (`plan_only_options`).
#: ``xla_backend_optimization_level`` 0 turns LLVM's optimisation of the generated machine
#: code off; ``xla_cpu_use_fusion_emitters`` off generates fusions with XLA:CPU's older
#: elemental emitter instead of the MLIR fusion emitters, whose per-fusion pass pipeline is
#: most of a compile at level 0. Measured on two cores, one training step at 4 deg / 3
#: splits, 8 x 128, compiled from shapes at level 0: 5.2 -> 3.0 s (`none`), 8.8 -> 4.9 s
#: (`lean`). A compile that runs keeps both defaults: at LLVM's default level the older
#: emitter compiles slower (chapter 5's training runs, 45 s against 15 s,
#: `benchmarks/results/chapter-profile-cpu*.json`).
PLAN_ONLY_CPU_OPTIONS = types.MappingProxyType({"xla_backend_optimization_level": 0,
                                                "xla_cpu_use_fusion_emitters": False})
#: The one of `PLAN_ONLY_CPU_OPTIONS` that changes the optimised HLO (`plan_only_options`'s
#: ``same_hlo`` leaves it out).
_HLO_OPTION = "xla_cpu_use_fusion_emitters"
#: XLA:CPU's own defaults for the same two options, spelled out: per compile, they give a
#: step the compiler a reader's runs get, whatever ``XLA_FLAGS`` say.
DEFAULT_CPU_OPTIONS = types.MappingProxyType({"xla_backend_optimization_level": 3,
                                              "xla_cpu_use_fusion_emitters": True})


def plan_only_options(same_hlo: bool = False) -> dict | None:
    """XLA options for a compile that is read, never run: on CPU, the cheapest compile.

    Buffer assignment happens on the optimised HLO, before LLVM: LLVM's level changes no
    memory figure and no timeline (tested for `lean`, which uses every technique). The
    older fusion emitter forms a few fusions differently (reductions, in-place updates),
    so its compiled temp differs from the default emitters' by under 1% (tested). Together
    they make a compile several times faster than XLA's defaults (`PLAN_ONLY_CPU_OPTIONS`;
    the book's appendix measures it). Functions compiled to run keep the defaults.

    Args:
      same_hlo: only LLVM's level, so that the optimised HLO is the one a compile that
        runs gets: for programs whose fusions or FLOPs are read, and for figures compared
        with plans recorded so.

    Returns:
      Only the options ``XLA_FLAGS`` do not already set to the same value; None where that
      leaves nothing: off the CPU backend, and where ``XLA_FLAGS`` set them for every
      compile (as the tests do). There a plan-only compile is the very compile of a step
      compiled to run, and JAX's persistent compilation cache, whose key holds these
      options, keeps one entry for both.
    """
    if jax.default_backend() != "cpu":
        return None
    options = {name: value for name, value in PLAN_ONLY_CPU_OPTIONS.items()
               if not (same_hlo and name == _HLO_OPTION) and not _flags_set(name, value)}
    return options or None


def _flags_set(name: str, value: bool | int) -> bool:
    """Whether ``XLA_FLAGS`` set the flag `name` to `value` (the last setting of a flag
    given twice is the one XLA keeps; a boolean reads true/false or 1/0)."""
    values = re.findall(rf"--{name}=(\S+)", os.environ.get("XLA_FLAGS", ""))
    if not values:
        return False
    last = values[-1].lower()
    if isinstance(value, bool):
        return last in (("true", "1") if value else ("false", "0"))
    return last == str(value)


# --------------------------------------------------------------------------- planned


@dataclasses.dataclass(frozen=True)
class CompiledMemory:
    """XLA's memory plan for one compiled function.

    Attributes:
      argument_bytes: bytes of all (flattened) arguments.
      output_bytes: bytes of all outputs.
      temp_bytes: bytes of XLA's preallocated temporary buffer(s): activations,
        residuals, gradients in flight, workspace.
      alias_bytes: bytes of outputs that reuse (donated) argument buffers.
      generated_code_bytes: size of the generated code.
      total_bytes: ``argument + output + temp - alias``: what the call needs at once.
      backend: platform the function was compiled for ('cpu', 'gpu', ...).
      compile_seconds: wall time of lowering plus compilation.
    """

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    generated_code_bytes: int
    total_bytes: int
    backend: str
    compile_seconds: float

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as a plain dict (JSON-able)."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return (
            f"CompiledMemory(total={format_bytes(self.total_bytes)}, "
            f"temp={format_bytes(self.temp_bytes)}, "
            f"args={format_bytes(self.argument_bytes)}, "
            f"out={format_bytes(self.output_bytes)}, "
            f"alias={format_bytes(self.alias_bytes)}, backend={self.backend})"
        )


def compile_timed(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    static_argnums: Sequence[int] | int = (),
    donate_argnums: Sequence[int] | int = (),
    compiler_options: Mapping[str, Any] | None = None,
) -> tuple[Any, float]:
    """`compile_fn` that also returns the seconds that lowering and compiling took."""
    start = time.perf_counter()
    jitted = jax.jit(fn, static_argnums=static_argnums, donate_argnums=donate_argnums)
    lowered = jitted.lower(*args, **kwargs)
    if compiler_options:
        compiled = lowered.compile(compiler_options=dict(compiler_options))
    else:
        compiled = lowered.compile()
    return compiled, time.perf_counter() - start


def compile_fn(
    fn: Callable[..., Any],
    *args: Any,
    static_argnums: Sequence[int] | int = (),
    donate_argnums: Sequence[int] | int = (),
    compiler_options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Jits, lowers and compiles `fn` for the given arguments, without running it.

    Args:
      fn: the function to compile.
      *args: arrays or `jax.ShapeDtypeStruct` pytrees (static arguments as values).
      static_argnums: passed to `jax.jit`.
      donate_argnums: passed to `jax.jit`.
      compiler_options: optional XLA debug options for this compile only (e.g.
        ``{'xla_dump_to': dir}``).
      **kwargs: keyword arguments of `fn` (arrays or shapes).

    Returns:
      The `jax.stages.Compiled` object (`memory_analysis()`, `as_text()`, ...).
    """
    compiled, _ = compile_timed(
        fn, args, kwargs, static_argnums, donate_argnums, compiler_options
    )
    return compiled


def memory_of_compiled(compiled: Any, compile_seconds: float = float("nan")) -> CompiledMemory:
    """Reads `CompiledMemory` off an already compiled function.

    Args:
      compiled: a `jax.stages.Compiled`.
      compile_seconds: the compile time to record, if known.

    Returns:
      The memory plan.

    Raises:
      RuntimeError: if the backend offers no memory analysis.
    """
    stats = compiled.memory_analysis()
    if stats is None:
        raise RuntimeError("this backend returns no memory_analysis()")
    if isinstance(stats, (list, tuple)):  # one per device on some versions
        stats = stats[0]
    arg = int(stats.argument_size_in_bytes)
    out = int(stats.output_size_in_bytes)
    tmp = int(stats.temp_size_in_bytes)
    alias = int(stats.alias_size_in_bytes)
    code = int(getattr(stats, "generated_code_size_in_bytes", 0) or 0)
    try:
        backend = compiled.runtime_executable().client.platform
    except Exception:  # noqa: BLE001 - the platform name is informative only
        backend = jax.default_backend()
    return CompiledMemory(
        argument_bytes=arg,
        output_bytes=out,
        temp_bytes=tmp,
        alias_bytes=alias,
        generated_code_bytes=code,
        total_bytes=arg + out + tmp - alias,
        backend=str(backend),
        compile_seconds=float(compile_seconds),
    )


def compiled_memory(
    fn: Callable[..., Any],
    *args: Any,
    static_argnums: Sequence[int] | int = (),
    donate_argnums: Sequence[int] | int = (),
    **kwargs: Any,
) -> CompiledMemory:
    """XLA's memory plan of `jax.jit(fn)(*args, **kwargs)`, without running it.

    Compiled with `plan_only_options` (the plan is read, the code never runs).

    Args:
      fn: the function to size (typically a training step).
      *args: arrays or `jax.ShapeDtypeStruct` pytrees; shapes allocate nothing.
      static_argnums: passed to `jax.jit`.
      donate_argnums: passed to `jax.jit` (donated bytes show up as `alias_bytes`).
      **kwargs: keyword arguments of `fn`.

    Returns:
      A `CompiledMemory`.
    """
    compiled, seconds = compile_timed(
        fn, args, kwargs, static_argnums, donate_argnums, plan_only_options()
    )
    return memory_of_compiled(compiled, seconds)


# -------------------------------------------------------------------------- measured
