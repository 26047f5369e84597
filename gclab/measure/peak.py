"""What a process really uses: the peak memory of a workload in a fresh process.

* **Measured** (`measure_peak`): runs a workload in a *fresh* Python process (so that
  one configuration cannot inherit another's allocator state or compile cache) and
  reads back the peak:

  - off the CPU (GPU, TPU), `device.memory_stats()['peak_bytes_in_use']`: the most bytes
    allocated at once out of the allocator's pool (blocks, not the pool: preallocation
    does not change it). The child sets ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` before
    JAX starts, so that it reserves only what it allocates (its pool grows in regions, so
    `nvidia-smi` shows somewhat more than the counter). A device whose stats hold no
    such reading (`device_peak_available`: None on Apple's METAL, no key, or -1) gives
    status ``'not measured'`` and no peak: host memory is never reported as a device's
    peak;
  - on CPU (where `memory_stats()` is None), the peak heap seen by `memray.Tracker`
    during the workload, plus the process's peak resident set size
    (`VmHWM` on Linux, else `getrusage(RUSAGE_SELF).ru_maxrss`).

  A fresh process shares the card with this one, whose JAX pool keeps what it ever took
  (all of its share of the card, where it preallocated). Given this process's `device`,
  `measure_peak` starts no child where what this process holds leaves too little for the
  plan (`refuse_if_held`): the status is then ``'not measured'`` and the message says
  how much this process holds.

  An out-of-memory failure in the child (``RESOURCE_EXHAUSTED``, ``Out of memory``,
  `MemoryError`, or the child killed by SIGKILL) comes back as status ``'oom'``; any
  other failure as ``'error'``; the caller never crashes. With `budget_bytes`, a
  measured peak above the budget is also reported as ``'oom'``: this is how a smaller
  card is simulated, and how out-of-memory is exercised on CPU.

The workload is named by an importable ``"module:function"`` string; the function
receives the JSON-able `kwargs` as keyword arguments and may return any JSON-able
value, which comes back as `PeakResult.result`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional, Union

import jax

from gclab import devices
from gclab.config import WrongType, is_int, is_number, require_count
from gclab.measure.compiled import GPU_PLATFORMS, format_bytes

_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "MemoryError")
_RESULT_PREFIX = "GCLAB_MEASURE_RESULT="
#: Status of a run that gives no peak: a device that reports none, or a child not started
#: because this process holds too much of the card (`refuse_if_held`).
NOT_MEASURED = "not measured"
#: Keys of `memory_stats()` that say what a process's allocator holds of the card, most
#: telling first: the pool (BFC), the reserved memory (CUDA's async allocator), the blocks.
_HELD_KEYS = ("pool_bytes", "bytes_reserved", "bytes_in_use")


@dataclasses.dataclass(frozen=True)
class PeakResult:
    """Outcome of one configuration run in a fresh process.

    Attributes:
      status: 'ok', 'oom' (out of memory, or measured peak above the budget), 'error'
        (any other failure, including a timeout) or 'not measured' (`NOT_MEASURED`: the
        device reports no peak, or no child was started; `peak_bytes` is None).
      message: empty when ok; otherwise what went wrong, or why there is no peak.
      backend: JAX backend of the child ('cpu', 'gpu', ...), '' if unknown.
      device: description of the child's first device, '' if unknown.
      peak_bytes: off the CPU: device peak bytes in use; CPU: memray's peak heap during
        the workload. None if not measured.
      peak_rss_bytes: peak resident set size of the child process (whole process,
        including the Python interpreter and JAX itself). None if not measured.
      wall_seconds: wall time of the workload call in the child (whole child run if
        the workload did not finish).
      result: whatever JSON the target returned (None on failure).
      budget_bytes: the budget the peak was compared against, if any.
    """

    status: str
    message: str = ""
    backend: str = ""
    device: str = ""
    peak_bytes: int | None = None
    peak_rss_bytes: int | None = None
    wall_seconds: float = float("nan")
    result: Any = None
    budget_bytes: int | None = None

    @property
    def ok(self) -> bool:
        """True when the run completed within budget."""
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as a plain dict."""
        return dataclasses.asdict(self)


def _looks_like_oom(text: str) -> bool:
    return any(marker in text for marker in _OOM_MARKERS)


def _repo_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def device_peak_available(stats: object) -> bool:
    """Whether a device's `memory_stats()` hold a peak that is a reading.

    The one test of gclab for a device peak (the fresh process reads one only where it
    holds, the chapters measure only where it holds): a mapping whose
    ``peak_bytes_in_use`` is an integer >= 0. None (a CPU, Apple's METAL), a mapping
    without the key, or a negative value (a counter the backend does not keep) is none.
    """
    if not isinstance(stats, Mapping):
        return False
    value = stats.get("peak_bytes_in_use")
    return is_int(value) and value >= 0


def memory_stats(device: Any) -> Optional[Mapping]:
    """``device.memory_stats()``, or None where it has none, or raises, or is no mapping."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - some backends raise instead of returning None
        return None
    return stats if isinstance(stats, Mapping) else None


def no_peak_reason(backend: str, stats: object) -> str:
    """Why `stats` (a device's `memory_stats()` on `backend`) hold no peak, in one line."""
    if not isinstance(stats, Mapping):
        detail = "memory_stats() is None"
    elif "peak_bytes_in_use" not in stats:
        detail = "memory_stats() has no peak_bytes_in_use"
    else:
        detail = f"peak_bytes_in_use is {stats['peak_bytes_in_use']!r}"
    return (f"not measured on {backend}: its device reports no peak ({detail}); host memory "
            "is no device peak")


def held_bytes(stats: object) -> int:
    """What a process's allocator holds of the card, from its device's `memory_stats()`.

    The largest of ``pool_bytes``, ``bytes_reserved`` and ``bytes_in_use`` that are
    present (JAX's pool keeps what it took: it never gives memory back to the card); 0
    where none is (or `stats` is None).
    """
    if not isinstance(stats, Mapping):
        return 0
    values = [int(stats[k]) for k in _HELD_KEYS if is_int(stats.get(k)) and stats[k] >= 0]
    return max(values, default=0)


def _card_bytes(platform: str, limit: int) -> int:
    """The card's memory from its allocator limit: a GPU's pool is `mem_fraction` of it."""
    if platform not in GPU_PLATFORMS:
        return limit  # a TPU's limit is its whole memory
    try:
        return int(limit / devices.mem_fraction())
    except ValueError:  # a bad memory-fraction variable: count the limit alone
        return limit


def refuse_if_held(
    device: Any, plan_bytes: Union[int, None, Callable[[], Optional[int]]]
) -> Optional[PeakResult]:
    """A 'not measured' result where this process holds too much of the card for a child.

    JAX's pool in this process keeps every byte it took (all of its share at once where
    it preallocated), so a fresh process on the same card has at most the card's memory
    less that, and never more than its own allocator limit. Nothing is started or
    initialised here: `device` is one this process holds already.

    Args:
      device: this process's device on the card the child will use (`jax.devices()[0]`
        of a backend started already); None, or a CPU device, is never refused.
      plan_bytes: the plan the child will run (XLA's compiled total), a function that
        returns it (called only where this process holds some of the card), or None
        (unknown: refused only where nothing at all is left).

    Returns:
      None where a child may start; otherwise a `PeakResult` with status 'not measured'
      whose message says how much this process holds.
    """
    platform = str(getattr(device, "platform", "cpu"))
    if device is None or platform == "cpu":
        return None
    stats = memory_stats(device)
    held = held_bytes(stats)
    limit = stats.get("bytes_limit") if stats is not None else None
    if held <= 0 or not is_int(limit) or limit <= 0:
        return None  # nothing held, or nothing to compare it with
    room = max(0, min(int(limit), _card_bytes(platform, int(limit)) - held))
    plan = plan_bytes() if callable(plan_bytes) else plan_bytes
    if room >= 1 and (plan is None or devices.fits(plan, room)):
        return None
    need = f"the plan ({format_bytes(plan)})" if plan is not None else "a fresh process"
    # Preallocation off helps only where it was on: otherwise the pool grew by use.
    hint = ("" if os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() == "false"
            else ", or set XLA_PYTHON_CLIENT_PREALLOCATE=false before JAX starts")
    return PeakResult(
        status=NOT_MEASURED,
        message=(
            f"not measured: this process holds {format_bytes(held)} of the {platform} "
            f"device's memory (JAX's pool does not give it back), leaving "
            f"{format_bytes(room)}, too little for {need}; measure from a fresh process"
            + hint
        ),
        backend=platform,
        device=str(getattr(device, "device_kind", device)),
    )


def measure_peak(
    target: str,
    kwargs: Mapping[str, Any] | None = None,
    *,
    timeout: float = 600.0,
    budget_bytes: int | None = None,
    env: Mapping[str, str] | None = None,
    track_heap: bool = True,
    device: Any = None,
    plan_bytes: Union[int, None, Callable[[], Optional[int]]] = None,
) -> PeakResult:
    """Runs ``target(**kwargs)`` in a fresh Python process and measures its peak.

    Args:
      target: importable ``"package.module:function"``; the function builds and runs
        the workload (compile included) and returns a JSON-able value.
      kwargs: JSON-able keyword arguments for the target.
      timeout: seconds before the child is killed (status 'error'), a finite number > 0.
      budget_bytes: if given, an integer >= 1: a measured peak (`peak_bytes`) above it
        makes the status 'oom' with a message saying the budget was breached.
      env: extra environment variables for the child (override the defaults).
      track_heap: on CPU, trace the heap with memray (slower for allocation-heavy
        workloads); if False only the peak RSS is measured and compared to the budget.
      device: this process's device, where its backend has started already: no child
        starts where this process holds too much of that card for `plan_bytes`
        (`refuse_if_held`; status 'not measured'). None: no check (nothing is started
        here to make one).
      plan_bytes: the workload's plan, for that check (see `refuse_if_held`).

    Returns:
      A `PeakResult`; this function does not raise on failures of the child.

    Raises:
      ValueError: for a `target` without ``:``, a `timeout` not > 0 or not finite, a
        `budget_bytes` below 1 (before any child starts); `WrongType` (a TypeError too)
        for a `timeout` that is no number or a `budget_bytes` that is no integer
        (``"8GiB"``, say).
    """
    # Checked before the child runs: a bad budget or timeout would only show after it.
    if budget_bytes is not None:
        budget_bytes = require_count("budget_bytes", budget_bytes, 1, caller="measure_peak")
    if not is_number(timeout) or not math.isfinite(timeout) or timeout <= 0:
        error = ValueError if is_number(timeout) else WrongType
        shown = f"timeout={timeout!r}" if len(repr(timeout)) <= 80 else "timeout"
        raise error(f"measure_peak {shown} is invalid: a finite number of seconds > 0")
    timeout = float(timeout)
    if ":" not in target:
        raise ValueError(f"target must look like 'module:function', got {target!r}")
    refused = refuse_if_held(device, plan_bytes)
    if refused is not None:
        return dataclasses.replace(refused, budget_bytes=budget_bytes)
    payload = json.dumps(
        {"target": target, "kwargs": dict(kwargs or {}), "track_heap": bool(track_heap)}
    )
    child_env = dict(os.environ)
    child_env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    root = _repo_root()
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, child_env.get("PYTHONPATH", "")) if p
    )
    if env:
        child_env.update({str(k): str(v) for k, v in env.items()})
    code = "import sys; from gclab.measure.peak import run_worker; sys.exit(run_worker())"
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            check=False,
            input=payload,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env,
            cwd=root,
        )
    except subprocess.TimeoutExpired:
        return PeakResult(
            status="error",
            message=f"timeout after {timeout:g} s",
            wall_seconds=time.perf_counter() - start,
            budget_bytes=budget_bytes,
        )
    wall = time.perf_counter() - start

    report: dict[str, Any] | None = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT_PREFIX):
            report = json.loads(line[len(_RESULT_PREFIX):])
            break

    if report is None:
        tail = (proc.stderr or proc.stdout or "")[-2000:]
        if proc.returncode == -signal.SIGKILL or _looks_like_oom(tail):
            status, why = "oom", "child killed (SIGKILL) or out of memory"
        else:
            status, why = "error", f"child exited with code {proc.returncode}"
        return PeakResult(
            status=status,
            message=f"{why}: {tail.strip()}" if tail.strip() else why,
            wall_seconds=wall,
            budget_bytes=budget_bytes,
        )

    result = PeakResult(
        status=report["status"],
        message=report.get("message", ""),
        backend=report.get("backend", ""),
        device=report.get("device", ""),
        peak_bytes=report.get("peak_bytes"),
        peak_rss_bytes=report.get("peak_rss_bytes"),
        wall_seconds=float(report.get("wall_seconds", wall)),
        result=report.get("result"),
        budget_bytes=budget_bytes,
    )
    if result.status == "ok" and budget_bytes is not None:
        measured = result.peak_bytes if result.peak_bytes is not None else result.peak_rss_bytes
        if measured is not None and measured > budget_bytes:
            result = dataclasses.replace(
                result,
                status="oom",
                message=(
                    f"budget breached: measured peak {format_bytes(measured)} > "
                    f"budget {format_bytes(budget_bytes)}"
                ),
            )
    return result


def _peak_rss_bytes() -> int:
    """This process's peak resident set size.

    On Linux, `VmHWM` from /proc/self/status: it starts afresh at exec, whereas
    `ru_maxrss` of a forked-and-exec'd child starts from its parent's high-water mark.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # KiB on Linux, B on macOS


def run_worker() -> int:
    """Entry point of the child process started by `measure_peak` (reads stdin)."""
    import importlib
    import traceback

    spec = json.loads(sys.stdin.read())
    report: dict[str, Any] = {"status": "error", "message": ""}
    start = time.perf_counter()
    tmpdir = tempfile.mkdtemp(prefix="gclab_measure_")
    try:
        module_name, func_name = spec["target"].split(":", 1)
        func = getattr(importlib.import_module(module_name), func_name)
        device = jax.devices()[0]  # starts the backend before anything is tracked
        backend = jax.default_backend()
        report["backend"] = backend
        report["device"] = str(getattr(device, "device_kind", device))
        stats = memory_stats(device)
        # memray counts host memory: a peak only on a CPU, never in place of a device's
        use_memray = backend == "cpu" and stats is None and spec.get("track_heap", True)
        no_peak = None
        start = time.perf_counter()
        if use_memray:
            import memray

            trace = os.path.join(tmpdir, "trace.bin")
            with memray.Tracker(trace, native_traces=False, follow_fork=False):
                value = func(**spec["kwargs"])
            report["peak_bytes"] = int(memray.FileReader(trace).metadata.peak_memory)
        else:
            value = func(**spec["kwargs"])
            stats = memory_stats(device)
            if device_peak_available(stats):
                report["peak_bytes"] = int(stats["peak_bytes_in_use"])
            elif backend != "cpu":
                no_peak = no_peak_reason(backend, stats)
        report["wall_seconds"] = time.perf_counter() - start
        report["result"] = json.loads(json.dumps(value, default=str))
        report["status"] = "ok" if no_peak is None else NOT_MEASURED
        report["message"] = no_peak or ""
    except BaseException as exc:  # noqa: BLE001 - every failure must be reported
        text = f"{type(exc).__name__}: {exc}"
        report["status"] = (
            "oom" if isinstance(exc, MemoryError) or _looks_like_oom(text) else "error"
        )
        report["message"] = text[:4000]
        report["traceback"] = traceback.format_exc()[-4000:]
        report["wall_seconds"] = time.perf_counter() - start
    finally:
        report["peak_rss_bytes"] = _peak_rss_bytes()
        for name in os.listdir(tmpdir):
            os.remove(os.path.join(tmpdir, name))
        os.rmdir(tmpdir)
    sys.stdout.flush()
    print(_RESULT_PREFIX + json.dumps(report), flush=True)
    return 0
