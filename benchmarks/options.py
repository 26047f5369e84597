"""Option checks the benchmark scripts share: each refuses a bad value in one line
(argparse's ``parser.error``: the script's name, the option, what is allowed; exit 2)
before any compile or child process, so that a typo in the last value costs nothing.
"""

from __future__ import annotations

import argparse
from typing import Callable


def named(parser: argparse.ArgumentParser, option: str, text: str,
          lookup: Callable[[str], object]) -> list[str]:
    """The comma-separated names of `text`, each one `lookup` accepts (gclab's own
    `get_preset` or `get_recipe`, whose ValueError names the allowed ones)."""
    names = text.split(",")
    try:
        for name in names:
            lookup(name)
    except ValueError as e:
        parser.error(f"{option}: {e}")
    return names


def integers(parser: argparse.ArgumentParser, option: str, text: str, low: int, high: int,
             what: str, why: str = "") -> list[int]:
    """The comma-separated integers of `text`, each from `low` to `high`; the refusal
    says they are `what`, and `why` (in brackets) where given."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not low <= v <= high for v in values):
        parser.error(f"{option} {text}: comma-separated {what} from {low} to {high}"
                     + (f" ({why})" if why else ""))
    return values
