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

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import os
import re
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from gclab import devices
from gclab.config import WrongType, a_kind, require_kind
from gclab.limits import format_bytes

__all__ = ["DEFAULT_CPU_OPTIONS", "GPU_PLATFORMS", "PLAN_ONLY_CPU_OPTIONS", "CompiledMemory",
           "compile_fn", "compile_option_known", "compile_timed", "compiled_memory",
           "format_bytes", "known_options",
           "memory_of_compiled", "plan_only_options", "plans_for_another_card",
           "target_device", "target_platform"]


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


#: Platform names of JAX's GPU backends (``jax.Device.platform``, ``jax.default_backend()``).
GPU_PLATFORMS = ("gpu", "cuda", "rocm")
#: The pass XLA:GPU runs against a memory limit taken from the card that is present: when
#: a program's plan exceeds it, the pass recomputes values until the plan fits (chapter 4).
_XLA_REMAT_PASS = "rematerialization"
#: Whether the plan-only compiles of this context size a program for another card's memory
#: than the present GPU's (`plans_for_another_card`).
_ANOTHER_CARD = contextvars.ContextVar("gclab_plans_for_another_card", default=False)


@contextlib.contextmanager
def plans_for_another_card(another: bool = True):
    """Within it, `plan_only_options` sizes programs for another card than the present GPU.

    XLA:GPU's rematerialization pass shrinks a plan towards a limit taken from the card
    that is present, so a plan compiled on a T4 for an H100's budget would be shrunk
    towards the T4's memory; within this context a plan-only compile on a GPU leaves the
    pass out (`plan_only_options`). `gclab.sizing.plan` enters it for every budget but
    the present card's own memory.

    Args:
      another: False restores the default (plans for the present card) within an outer
        context.
    """
    token = _ANOTHER_CARD.set(bool(another))
    try:
        yield
    finally:
        _ANOTHER_CARD.reset(token)


def target_device(*trees: Any) -> Any:
    """A device the first leaf placed on (or, as a `jax.ShapeDtypeStruct`, sharded over)
    devices is on; None where no leaf is placed."""
    for leaf in jax.tree_util.tree_leaves(trees):
        sharding = getattr(leaf, "sharding", None)
        if sharding is None or not getattr(leaf, "committed", True):
            continue
        try:
            return next(iter(sharding.device_set))
        except (AttributeError, StopIteration):  # a sharding without devices
            continue
    return None


def target_platform(*trees: Any) -> str:
    """The platform a jit of these arguments compiles for: that of the first leaf placed on
    (or, as a `jax.ShapeDtypeStruct`, sharded over) devices (`target_device`), else of JAX's
    default device (`jax.default_device`), else the default backend."""
    return platform_of(target_device(*trees))


def platform_of(device: Any) -> str:
    """The platform a program on `device` compiles for; for None (a program placed on no
    device), that of JAX's default device, else the default backend
    (`gclab.devices.default_platform`)."""
    return device.platform if device is not None else devices.default_platform()


def plan_only_options(same_hlo: bool = False, platform: str | None = None) -> dict | None:
    """XLA options for a compile that is read, never run: on CPU, the cheapest compile.

    Buffer assignment happens on the optimised HLO, before LLVM: LLVM's level changes no
    memory figure and no timeline (tested for `lean`, which uses every technique). The
    older fusion emitter forms a few fusions differently (reductions, in-place updates),
    so its compiled temp differs from the default emitters' by under 1% (tested). Together
    they make a compile several times faster than XLA's defaults (`PLAN_ONLY_CPU_OPTIONS`;
    the book's appendix measures it). Functions compiled to run keep the defaults.

    On a GPU the compile is XLA's default one, but within `plans_for_another_card` (a plan
    for a budget other than the present card's memory) it leaves XLA's rematerialization
    pass out (``xla_disable_hlo_passes=rematerialization``, added to the passes
    ``XLA_FLAGS`` disable): that pass would shrink the plan towards the present card's
    limit, not the budget's. The figure is then the program's own plan, never shrunk.

    Args:
      same_hlo: only LLVM's level, so that the optimised HLO is the one a compile that
        runs gets: for programs whose fusions or FLOPs are read, and for figures compared
        with plans recorded so (no effect on a GPU).
      platform: the platform the compile is for: that of the devices or sharding it
        targets (`target_platform`); default ``jax.default_backend()``. A machine with a
        GPU compiles layouts on its simulated CPU devices: their options are CPU ones.

    Returns:
      Only the options ``XLA_FLAGS`` do not already set to the same value; None where that
      leaves nothing: on a platform other than CPU and GPU, on a GPU outside
      `plans_for_another_card`, and where ``XLA_FLAGS`` set them for every compile (as the
      tests do). There a plan-only compile is the very compile of a step compiled to run,
      and JAX's persistent compilation cache, whose key holds these options, keeps one
      entry for both.

    Raises:
      WrongType: a `platform` that is neither None nor a str.
    """
    require_kind("platform", platform, str, "a platform name such as 'cpu' or 'gpu', or None",
                 caller="plan_only_options", optional=True)
    platform = (platform or jax.default_backend()).lower()
    if platform in GPU_PLATFORMS:
        return _without_xla_remat() if _ANOTHER_CARD.get() else None
    if platform != "cpu":
        return None
    options = {name: value for name, value in PLAN_ONLY_CPU_OPTIONS.items()
               if not (same_hlo and name == _HLO_OPTION) and not _flags_set(name, value)}
    return known_options(options, platform) or None


#: What XLA answers a compile that names an option its build does not have.
_UNKNOWN_OPTION = "No such compile option"


def compile_option_known(name: str, value: bool | int | str, platform: str) -> bool:
    """Whether this jaxlib's XLA takes `name` (set to `value`) as a per-compile option for
    `platform` ('cpu', 'gpu', ...), found by compiling a one-element program with it once
    per process.

    XLA's options come and go between releases (``xla_cpu_use_fusion_emitters``, which
    jax 0.10's XLA:CPU reads, is refused by jax 0.11.2's XLA: "No such compile option"),
    and neither JAX nor XLA lists the options a build has, so the compile is the test.
    Any other failure of the probe is raised.
    """
    require_kind("name", name, str, "an XLA option name", caller="compile_option_known")
    require_kind("value", value, (bool, int, float, str), "a bool, number or str",
                 caller="compile_option_known")
    require_kind("platform", platform, str, "a platform name such as 'cpu' or 'gpu'",
                 caller="compile_option_known")
    return _option_known(name, value, platform)


@functools.lru_cache(maxsize=None)
def _option_known(name: str, value: bool | int | float | str, platform: str) -> bool:
    try:
        device = jax.local_devices(backend=platform)[0]
    except RuntimeError:  # JAX: "Unknown backend ..." / "Backend ... failed to initialize"
        raise ValueError(f"compile_option_known platform={platform!r} is invalid: this "
                         f"process has no such backend (it has {jax.default_backend()!r})"
                         ) from None
    # In a thread of its own: a mesh the caller set (`jax.set_mesh`, `use_layout`) is the
    # caller thread's context, and a one-device program compiled inside it is refused.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_probe, name, value, device).result()


def _probe(name: str, value: Any, device: Any) -> bool:
    arg = jax.ShapeDtypeStruct((1,), np.float32,
                               sharding=jax.sharding.SingleDeviceSharding(device))
    try:
        jax.jit(_plus_one).lower(arg).compile(compiler_options={name: value})
    except Exception as error:  # jax's JaxRuntimeError (INVALID_ARGUMENT)
        if _UNKNOWN_OPTION in str(error):
            return False
        raise
    return True


def _plus_one(x):
    return x + 1


def known_options(options: Mapping[str, Any] | None, platform: str) -> dict:
    """`options` less those this jaxlib's XLA does not have for `platform`
    (`compile_option_known`): a compile naming one would fail."""
    return {name: value for name, value in (options or {}).items()
            if compile_option_known(name, value, platform)}


def _without_xla_remat() -> dict | None:
    """``xla_disable_hlo_passes`` with XLA's rematerialization pass added to the passes
    ``XLA_FLAGS`` disable (a compile's option replaces the flag's list); None where the
    flags disable it already."""
    values = re.findall(r"--xla_disable_hlo_passes=(\S+)", os.environ.get("XLA_FLAGS", ""))
    passes = [p for p in values[-1].split(",") if p] if values else []
    if _XLA_REMAT_PASS in passes:
        return None
    return {"xla_disable_hlo_passes": ",".join([*passes, _XLA_REMAT_PASS])}


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


#: Dtypes JAX narrows to 32 bits while its 64-bit mode (``jax_enable_x64``) is off.
_X64_DTYPES = tuple(np.dtype(d) for d in ("float64", "int64", "uint64", "complex128"))


def require_plannable(caller: str, fn: object, args: Sequence[Any],
                      kwargs: Mapping[str, Any]) -> None:
    """Refuses, before compiling, what XLA would plan as something else or not at all.

    A `jax.ShapeDtypeStruct` of a 64-bit dtype with JAX's 64-bit mode off is compiled as
    its 32-bit counterpart, without a word, and the plan is half the bytes asked for; a
    negative dimension fails deep in the compiler.

    Args:
      caller: the function's name, to start the message with.
      fn: the function to compile.
      args, kwargs: its arguments.

    Raises:
      ValueError: in one line naming `caller` and the argument's path (`args[0]['w']`): a
        64-bit dtype with 64-bit mode off, or a negative dimension; `WrongType` for an `fn`
        that is not callable.
    """
    if not callable(fn):
        raise WrongType(f"{caller} fn is invalid: a function to compile, not {a_kind(fn)}")
    x64 = bool(jax.config.jax_enable_x64)
    leaves, _ = jax.tree_util.tree_flatten_with_path((tuple(args), dict(kwargs)))
    for path, leaf in leaves:
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            continue
        # The first key is args or kwargs; the rest is the path inside them.
        top = "args" if path[0].idx == 0 else "kwargs"
        rest = path[1:]
        if top == "kwargs":
            name, rest = f"kwargs[{rest[0].key!r}]", rest[1:]
        else:
            name, rest = f"args[{rest[0].idx}]", rest[1:]
        name += jax.tree_util.keystr(tuple(rest))
        if any(d < 0 for d in leaf.shape if isinstance(d, int)):
            raise ValueError(f"{caller} {name} shape={tuple(leaf.shape)} is invalid: "
                             "dimensions >= 0")
        dtype = np.dtype(leaf.dtype)
        if not x64 and dtype in _X64_DTYPES:
            raise ValueError(
                f"{caller} {name} dtype={dtype.name} is invalid: a dtype of at most 32 bits "
                f"while JAX's 64-bit mode is off (it would be compiled as "
                f"{jax.dtypes.canonicalize_dtype(dtype).name}, half the bytes); turn "
                "jax_enable_x64 on to plan it")


def compiled_memory(
    fn: Callable[..., Any],
    *args: Any,
    static_argnums: Sequence[int] | int = (),
    donate_argnums: Sequence[int] | int = (),
    **kwargs: Any,
) -> CompiledMemory:
    """XLA's memory plan of `jax.jit(fn)(*args, **kwargs)`, without running it.

    Compiled with `plan_only_options` for the platform the arguments are placed on
    (`target_platform`): the plan is read, the code never runs.

    Args:
      fn: the function to size (typically a training step).
      *args: arrays or `jax.ShapeDtypeStruct` pytrees; shapes allocate nothing.
      static_argnums: passed to `jax.jit`.
      donate_argnums: passed to `jax.jit` (donated bytes show up as `alias_bytes`).
      **kwargs: keyword arguments of `fn`.

    Returns:
      A `CompiledMemory`.

    Raises:
      ValueError: a 64-bit `jax.ShapeDtypeStruct` while JAX's 64-bit mode is off, or a
        negative dimension (`require_plannable`); `WrongType` for an `fn` not callable.
    """
    require_plannable("compiled_memory", fn, args, kwargs)
    compiled, seconds = compile_timed(
        fn, args, kwargs, static_argnums, donate_argnums,
        plan_only_options(platform=target_platform(args, kwargs))
    )
    return memory_of_compiled(compiled, seconds)


# -------------------------------------------------------------------------- measured
