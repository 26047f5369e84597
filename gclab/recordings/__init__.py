"""Recorded measurements that travel with the package, and where new ones are written.

Recordings are JSON files that name their hardware and date (and, from a GPU, the jax
version and gclab commit). Those that ship with gclab are package data in this folder,
read with `importlib.resources`, so that an installed gclab (Colab's ``pip install``)
finds them. New recordings are never written into an installed package: they go to
`output_dir()`, the folder named by ``GCLAB_RECORDINGS`` or ``gclab-recordings`` in the
working directory; `recorded` reads that folder first.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Optional

RECORDINGS_ENV = "GCLAB_RECORDINGS"


def output_dir() -> Path:
    """Where new recordings go: ``$GCLAB_RECORDINGS`` or ``./gclab-recordings``."""
    return Path(os.environ.get(RECORDINGS_ENV) or Path.cwd() / "gclab-recordings")


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
