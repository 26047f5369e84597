"""The environment of a benchmark's child Python process.

Several benchmarks measure in a fresh process (what XLA reads once when JAX starts, a
process's own peak, a compile that no cache in this process may answer). Each child must
import this checkout's gclab and benchmarks, whatever the caller installed: `child_env`
puts the repository first on ``PYTHONPATH`` and keeps the caller's entries after it, but no
empty one (Python reads an empty entry as the working folder). This module imports nothing
of gclab, so that the official code's children of `official_side_by_side.py` stay free of
it. (``subprocess`` and ``os.environ`` do the rest; no library covers the path rule.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """`base` (``os.environ`` by default) with `ROOT` first on ``PYTHONPATH`` (each entry
    once, none empty), then `extra` set over it."""
    env = dict(os.environ if base is None else base)
    paths = [str(ROOT), *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    env.update(extra)
    return env
