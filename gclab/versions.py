"""Which JAX gclab supports, declared once (pyproject's dependencies), and a check of it.

The range is read from the installed package's metadata, which pip writes from
``pyproject.toml``; a Colab notebook installs gclab with ``--no-deps`` (to keep Colab's
own JAX), so pip checks nothing and `check_jax` says when that JAX is out of range.
This module imports no JAX, so a chapter's first cell can call it before JAX starts.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Optional

#: The git tag of this version's book: the Colab cells install gclab at this tag.
BOOK_TAG_PREFIX = "v"


def book_ref() -> str:
    """The git ref the book's Colab cells install: ``v`` + gclab's version."""
    import gclab

    return f"{BOOK_TAG_PREFIX}{gclab.__version__}"


def supported_jax() -> Optional[str]:
    """The JAX version specifier gclab declares (e.g. ``>=0.7,<0.11``), or None if gclab's
    metadata is not installed."""
    try:
        requires = importlib.metadata.requires("gclab") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in requires:
        m = re.fullmatch(r"jax\s*([<>=!~][^;]*)(;.*)?", line.strip())
        if m:
            return m.group(1).replace(" ", "")
    return None


def _parse(version: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def jax_in_range(version: str, specifier: str) -> bool:
    """Whether `version` satisfies a specifier of ``>=``, ``>``, ``<``, ``<=``, ``==`` parts."""
    v = _parse(version)
    ops = {">=": v.__ge__, ">": v.__gt__, "<=": v.__le__, "<": v.__lt__, "==": v.__eq__,
           "!=": v.__ne__}
    for part in filter(None, specifier.split(",")):
        m = re.fullmatch(r"(>=|<=|==|!=|>|<)(.+)", part.strip())
        if m is None:
            continue
        if not ops[m.group(1)](_parse(m.group(2))):
            return False
    return True


def check_jax(version: Optional[str] = None, specifier: Optional[str] = None) -> Optional[str]:
    """Prints a warning when the installed JAX is outside gclab's supported range.

    Args:
      version: the JAX version (default: the installed one, read without importing JAX).
      specifier: the range (default: `supported_jax()`).

    Returns:
      The warning printed, or None when the version is in range (or nothing is known).
    """
    specifier = specifier if specifier is not None else supported_jax()
    if version is None:
        try:
            version = importlib.metadata.version("jax")
        except importlib.metadata.PackageNotFoundError:
            return None
    if not specifier or jax_in_range(version, specifier):
        return None
    message = (f"WARNING: JAX {version} is outside the range gclab supports (jax{specifier});"
               " chapters may fail or measure differently. Install a supported JAX, e.g. "
               f"pip install 'jax[cuda12]{specifier}'.")
    print(message)
    return message
