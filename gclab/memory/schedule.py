"""XLA:CPU's instruction order: a memory technique that changes no instruction.

Which buffers are alive together depends on the order XLA runs a program's instructions
in, and that order is the backend scheduler's choice. XLA:CPU's default scheduler walks the
program breadth-first, keeping independent work side by side so that its runtime can run it
at once on several threads (``--xla_cpu_enable_concurrency_optimized_scheduler``, on by
default); with the option off, XLA walks it depth-first, finishing one chain of work before
it starts the next, which usually keeps fewer values alive. The instructions and their
results are the same; only the order changes. Measured (``benchmarks/cpu_scheduler.py``):
at cpu-8x128 every recipe needs less temp depth-first, `lean` about half; on a much smaller
model (10 deg, 5 x 16) `none` and `per-step` needed 4% and 10% more, so compare the two for
the step at hand (``gclab memory --cpu-scheduler ...``, each in its own process).

XLA reads the option once, when JAX starts its CPU backend, not per compile: so it is set in
``XLA_FLAGS`` before the first JAX operation (`use_cpu_scheduler`, or ``gclab ...
--cpu-scheduler depth-first``), never later. XLA:GPU and TPU schedule with passes of their
own, which the option does not reach.
"""

from __future__ import annotations

import os
import re

from gclab.devices import backends_started

#: The XLA flag, and its value for each of gclab's names, XLA's default first.
CPU_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"
CPU_SCHEDULERS = {"breadth-first": "true", "depth-first": "false"}


def cpu_scheduler() -> str:
    """The scheduler ``XLA_FLAGS`` name for XLA:CPU (the last setting of the flag counts, as
    in XLA): ``breadth-first`` (XLA's default) or ``depth-first``."""
    values = re.findall(rf"{CPU_SCHEDULER_FLAG}=(\S+)", os.environ.get("XLA_FLAGS", ""))
    off = values and values[-1].lower() in ("false", "0")
    return "depth-first" if off else "breadth-first"


def _check_name(name: object) -> None:
    if not isinstance(name, str) or name not in CPU_SCHEDULERS:
        raise ValueError(f"cpu scheduler {name!r} is invalid: one of "
                         f"{', '.join(CPU_SCHEDULERS)}")


def cpu_scheduler_flags(name: str, flags: str = "") -> str:
    """`flags` (a value of ``XLA_FLAGS``) with XLA:CPU's scheduler set to `name`: any
    setting of the flag there replaced, every other flag kept in its place. For a process
    yet to start (`use_cpu_scheduler` sets this process's own).

    Raises:
      ValueError: an unknown name.
    """
    _check_name(name)
    kept = [f for f in flags.split() if not f.startswith(CPU_SCHEDULER_FLAG)]
    return " ".join([*kept, f"{CPU_SCHEDULER_FLAG}={CPU_SCHEDULERS[name]}"])


def use_cpu_scheduler(name: str) -> None:
    """Chooses XLA:CPU's scheduler for this process: call it before the first JAX operation.

    Sets the flag in ``XLA_FLAGS`` (replacing any setting of it there, keeping every other
    flag), so that processes this one starts inherit it, and JAX's compilation cache, whose
    key holds ``XLA_FLAGS``, keeps the two orders' programs apart.

    Args:
      name: ``depth-first`` (fewer values alive, as a rule) or ``breadth-first`` (XLA's
        default).

    Raises:
      ValueError: an unknown name, or JAX has already started its backends under the other
        setting (XLA read the flag then; choose it in a fresh process).
    """
    _check_name(name)
    if cpu_scheduler() == name:
        return
    if backends_started():
        raise ValueError(f"cpu scheduler {name}: JAX has already started with the "
                         f"{cpu_scheduler()} scheduler, and XLA reads the setting only then "
                         "(choose it before the first JAX operation, in a fresh process)")
    os.environ["XLA_FLAGS"] = cpu_scheduler_flags(name, os.environ.get("XLA_FLAGS", ""))
