"""Devices and processes: simulated CPU devices, and joining a multi-process run.

A run on several hosts (or several local processes) is one SPMD program: every process
runs the same script, `jax.distributed.initialize` connects them, and `jax.devices()` then
lists every process's devices, so `gclab.parallel.sharding.make_mesh` spans them all.
On one CPU machine, `jax_num_cpu_devices` makes the CPU backend offer several devices,
which is how the layouts are tested without accelerators; it must be set before JAX
starts its backends (before the first array is made).
"""

from __future__ import annotations

import os
from typing import Optional

import jax

from gclab.config import WrongType, is_int, require_count, require_kind

# Environment variables read when no option is given (the usual names of multi-process
# launchers that do not set up JAX's own cluster detection).
COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "JAX_NUM_PROCESSES"
PROCESS_ID_ENV = "JAX_PROCESS_ID"
#: The most CPU devices JAX's CPU backend runs in one process: it numbers a process's devices
#: from process_index * 2048, so a 2049th device reads as another process's, and every
#: computation over it fails ("Multiprocess computations aren't implemented on the CPU
#: backend"; measured with JAX 0.10.2, where 2048 devices compile and 2049 do not).
MAX_CPU_DEVICES = 2048
#: Seconds `initialize_processes` waits for every process to join (JAX's own default).
DEFAULT_INIT_TIMEOUT = 300


def use_cpu_devices(n: int) -> None:
    """Makes JAX's CPU backend offer `n` devices (before JAX has started its backends).

    Raises:
      TypeError: `n` is not an integer (Python or numpy).
      ValueError: fewer than 1 or more than `MAX_CPU_DEVICES`, or JAX has already started
        with fewer than `n` CPU devices (the setting can no longer change; start a fresh
        process).
    """
    # Checked before touching JAX's config: JAX accepts 0 or a negative count, and then no
    # CPU backend can start in this process ("Unable to initialize backend 'cpu'").
    if not is_int(n):
        raise WrongType(f"use_cpu_devices n={n!r} is invalid: an integer in "
                        f"1..{MAX_CPU_DEVICES}")
    n = int(n)
    if n < 1:
        raise ValueError(f"use_cpu_devices n={n} is invalid: an integer in 1..{MAX_CPU_DEVICES}")
    if n > MAX_CPU_DEVICES:  # JAX accepts the setting, then fails at the first compile
        raise ValueError(f"{n} CPU devices is more than JAX's CPU backend runs in one process "
                         f"(at most {MAX_CPU_DEVICES})")
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # backends already started: fine if there are enough devices
        have = len(jax.devices("cpu"))
        if have < n:
            raise ValueError(
                f"JAX has already started with {have} CPU devices, {n} are needed: set "
                f"jax_num_cpu_devices before the first JAX operation (a fresh process)"
            ) from None


def initialize_processes(coordinator: Optional[str] = None,
                         num_processes: Optional[int] = None,
                         process_id: Optional[int] = None,
                         timeout: int = DEFAULT_INIT_TIMEOUT) -> bool:
    """Joins a multi-process run through `jax.distributed.initialize`.

    Each argument left None is read from its environment variable (`COORDINATOR_ENV`,
    `NUM_PROCESSES_ENV`, `PROCESS_ID_ENV`).

    Args:
      coordinator: `HOST:PORT` of process 0's coordination service.
      num_processes: processes in the run.
      process_id: this process's index, 0..num_processes - 1.
      timeout: seconds to wait for every process to join. When they have not, JAX ends
        the process in C++ (an abort, not a Python exception); `gclab.cli` says so in one
        line before that.

    Returns:
      True if the process joined a run of more than one process, False if there is
      nothing to join (no coordinator given).

    Raises:
      ValueError: a coordinator without a process count and id, a process count that is
        not an integer >= 1, an id that is not an integer in 0..num_processes - 1 (as an
        argument or as its environment variable), or a timeout that is not a positive
        integer. All are checked before JAX is touched.
      TypeError: an argument of the wrong kind (`WrongType`, a ValueError too).
    """
    caller = "initialize_processes"
    # Checked before the environment is read and JAX is touched: a count or id of the wrong
    # kind would otherwise reach `jax.distributed.initialize`, which fails far from here.
    require_kind("coordinator", coordinator, str, "a str HOST:PORT", caller, optional=True)
    count_name, id_name = "num_processes", "process_id"
    if num_processes is not None:
        num_processes = require_count(count_name, num_processes, 1, caller)
    if process_id is not None:
        process_id = require_count(id_name, process_id, 0, caller)
    coordinator = coordinator or os.environ.get(COORDINATOR_ENV)
    if num_processes is None:
        num_processes, count_name = env_count(NUM_PROCESSES_ENV, 1), NUM_PROCESSES_ENV
    if process_id is None:
        process_id, id_name = env_count(PROCESS_ID_ENV, 0), PROCESS_ID_ENV
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise ValueError(f"{id_name}={process_id} is invalid: an integer in "
                         f"0..{num_processes - 1} ({count_name}={num_processes})")
    if coordinator is None:
        if num_processes not in (None, 1):
            raise ValueError(f"{num_processes} processes need a coordinator address HOST:PORT")
        return False
    if num_processes is None or process_id is None:
        raise ValueError("a coordinator needs the number of processes and this process's id")
    # A hand check rather than `require_count`, to keep the unit in the message.
    if not is_int(timeout) or timeout < 1:
        raise ValueError(f"timeout={timeout!r} is invalid: an integer >= 1 (seconds)")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, initialization_timeout=int(timeout))
    return num_processes > 1


def env_count(name: str, least: int) -> Optional[int]:
    """The integer >= `least` that environment variable `name` holds; None where it is unset
    or empty.

    Raises:
      ValueError: ``"<name>=<text> is invalid: an integer >= <least>"`` where it holds
        anything else (the message names the variable, which no argument shows).
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    # Decimal digits only: `int` would take "+2", "2_0" or non-ASCII digits.
    if not (text.isascii() and text.isdecimal()) or int(text) < least:
        raise ValueError(f"{name}={text!r} is invalid: an integer >= {least}")
    return int(text)
