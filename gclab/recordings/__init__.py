"""Recorded measurements that travel with the package, and where new ones are written.

Recordings are JSON files that name their hardware and date (and, from a GPU, the jax
version and gclab commit). Those that ship with gclab are package data in this folder,
read with `importlib.resources`, so that an installed gclab (Colab's ``pip install``)
finds them. New recordings are never written into an installed package: they go to
`output_dir()`, the folder named by ``GCLAB_RECORDINGS``, else ``gclab-recordings`` at the
root of the checkout gclab runs from (so that a recording made from the repository's root
is found by the chapters, which run in ``book/``), else ``gclab-recordings`` in the working
directory (an installed gclab); `recorded` reads that folder first.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Optional

RECORDINGS_ENV = "GCLAB_RECORDINGS"
#: The folder's name, at the checkout's root or in the working directory.
FOLDER = "gclab-recordings"


def checkout_root() -> Optional[Path]:
    """The repository gclab runs from: the folder above the ``gclab`` package when it holds
    gclab's ``pyproject.toml`` (a checkout, or an editable install); None for an installed
    gclab."""
    root = Path(__file__).resolve().parents[2]
    try:
        text = (root / "pyproject.toml").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return root if 'name = "gclab"' in text else None


def output_dir() -> Path:
    """Where new recordings go, whatever the working directory when gclab runs from a
    checkout: ``$GCLAB_RECORDINGS``, else the checkout's ``gclab-recordings``, else
    ``./gclab-recordings``."""
    if os.environ.get(RECORDINGS_ENV):
        return Path(os.environ[RECORDINGS_ENV])
    root = checkout_root()
    return (root if root is not None else Path.cwd()) / FOLDER


def packaged_names() -> list[str]:
    """Names of the recordings shipped with gclab (without ``.json``)."""
    folder = resources.files(__name__)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def _text(name: str, data_dir: Optional[Path]) -> tuple[Optional[str], str]:
    for folder in ([Path(data_dir)] if data_dir else [output_dir()]):
        path = folder / f"{name}.json"
        if path.is_file():
            return path.read_text(), str(path)
    packaged = resources.files(__name__) / f"{name}.json"
    if packaged.is_file():
        return packaged.read_text(), f"gclab/recordings/{name}.json"
    return None, ""


def recorded(name: str, data_dir: Optional[Path] = None) -> Optional[dict]:
    """The recording `name`: from `data_dir` (default `output_dir()`), else the package's.

    Returns:
      The JSON object, with ``source`` set to where it was read; None if there is none.

    Raises:
      ValueError: the file is not valid JSON or names no hardware and date.
    """
    text, where = _text(name, data_dir)
    if text is None:
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e})") from None
    hardware = record.get("hardware") if isinstance(record, dict) else None
    date = record.get("date") or (hardware.get("date") if isinstance(hardware, dict) else None)
    if not hardware or not date:
        raise ValueError(f"{where}: a recording must name its 'hardware' and 'date'")
    record.setdefault("date", date)
    record["source"] = where
    return record
