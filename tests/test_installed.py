"""An installed (non-editable) gclab finds its recordings, and writes none into itself."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import json, os, sys
import gclab
from gclab.notebook import DATA_DIR, recorded
from gclab.recordings import output_dir, packaged_names
from gclab.versions import supported_jax
record = recorded("memory-cpu")
print(json.dumps({"file": gclab.__file__, "names": packaged_names(),
                  "source": record["source"], "rows": len(record["recipes"]),
                  "device": record["hardware"]["device"], "date": record["date"],
                  "out": str(output_dir()), "data_dir": str(DATA_DIR),
                  "jax": supported_jax()}))
"""


def test_a_non_editable_install_reads_its_recordings(tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(ROOT)],
                   check=True, capture_output=True, text=True, timeout=600)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("GCLAB_RECORDINGS", None)
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=work, env=env, check=True,
                         capture_output=True, text=True, timeout=300)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(found["file"]).resolve().is_relative_to(target.resolve())
    assert "memory-cpu" in found["names"]
    assert found["source"] == "gclab/recordings/memory-cpu.json" and found["rows"] >= 8
    assert found["device"] == "cpu" and found["date"].startswith("20")
    # New recordings go to the working directory, never into site-packages.
    assert Path(found["out"]) == work / "gclab-recordings" == Path(found["data_dir"])
    # The supported JAX range travels in the installed metadata.
    assert set(found["jax"].split(",")) == {">=0.7", "<0.11"}


@pytest.mark.parametrize("name", ["memory-cpu.json", "memory-gpu.json",
                                  "official-forecast-cpu.json"])
def test_the_shipped_recording_is_the_recorded_benchmark(name):
    """The benchmark (`memory_recipes.py`, `memory_device.py`, `official_forecast.py`) writes
    both; a hand edit of one of them would show here."""
    root = Path(__file__).resolve().parents[1]
    shipped = root / "gclab" / "recordings" / name
    assert shipped.read_bytes() == (root / "benchmarks" / "results" / name).read_bytes()
