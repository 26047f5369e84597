"""Where GPU recordings go and where the chapters look: the same folder, whatever the working
directory (`benchmarks/record_gpu.py` runs from the repository's root, chapters in ``book/``).
"""

import json
import sys
import types
from pathlib import Path

import pytest

import gclab
import gclab.recordings as recordings
from gclab.recordings import RECORDINGS_ENV, output_dir

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def checkout(monkeypatch, tmp_path):
    """gclab as if it ran from a checkout at `tmp_path / "repo"` (its ``pyproject.toml``,
    its ``book/``); the working directory is the checkout's root."""
    repo = tmp_path / "repo"
    (repo / "book").mkdir(parents=True)
    (repo / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    monkeypatch.setattr(recordings, "__file__", str(repo / "gclab" / "recordings" /
                                                    "__init__.py"))
    monkeypatch.delenv(RECORDINGS_ENV, raising=False)
    monkeypatch.chdir(repo)
    return repo


def test_from_a_checkout_the_folder_is_the_checkouts_whatever_the_working_directory(
        monkeypatch, tmp_path):
    monkeypatch.delenv(RECORDINGS_ENV, raising=False)
    here = Path(gclab.__file__).resolve().parents[1] / "gclab-recordings"
    for cwd in (tmp_path, tmp_path / "book"):
        cwd.mkdir(exist_ok=True)
        monkeypatch.chdir(cwd)
        assert output_dir() == here


def test_gclab_recordings_names_the_folder(checkout, monkeypatch, tmp_path):
    monkeypatch.setenv(RECORDINGS_ENV, str(tmp_path / "mine"))
    assert output_dir() == tmp_path / "mine"


@pytest.mark.parametrize("pyproject", [None, '[project]\nname = "other"\n'])
def test_an_installed_gclab_writes_into_the_working_directory(checkout, pyproject):
    """Not a checkout of gclab (site-packages, or another project's folder): ``./``."""
    if pyproject is None:
        (checkout / "pyproject.toml").unlink()
    else:
        (checkout / "pyproject.toml").write_text(pyproject)
    assert recordings.checkout_root() is None
    assert output_dir() == checkout / "gclab-recordings"


def test_a_recording_made_from_the_root_is_read_by_a_chapter_in_book(checkout, monkeypatch):
    """`record_gpu.py --part 2` on a card, as documented (from the repository's root), then
    chapter 1's `gpu_recording` run with the working directory ``book/``."""
    import jax

    from gclab import notebook

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import record_gpu
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    card = types.SimpleNamespace(platform="gpu", id=0, device_kind="NVIDIA H100 80GB HBM3",
                                 memory_stats=lambda: {"bytes_limit": 63_773_786_112})
    monkeypatch.setattr(jax, "devices", lambda *a, **k: [card])
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(jax, "device_count", lambda *a, **k: 1)
    monkeypatch.delenv("GCLAB_SCALE", raising=False)
    monkeypatch.setenv("GCLAB_COMMIT", "0123456789abcdef")
    row = {"chapter": "01", "label": "forward pass", "plan_bytes": 2**30, "fits": True,
           "status": "runs (plan 1.00 GiB)", "peak_bytes": 2**30, "step_seconds": 0.1}
    monkeypatch.setattr(record_gpu, "record_part", lambda part, scale, dry_run, save: {
        "part": part.name, "scale": scale.name, "rows": [row]})
    assert record_gpu.main(["--part", "2"]) == 0
    scale = notebook.choose_scale()
    written = checkout / "gclab-recordings" / f"gpu-{scale.name}-chapters-01-05-07.json"
    assert json.loads(written.read_text())["rows"] == [row]
    monkeypatch.chdir(checkout / "book")
    found = notebook.gpu_recording("01", scale)
    assert found is not None, "the chapter does not find the recording"
    title, table = found
    assert title.startswith("recorded on NVIDIA H100 80GB HBM3 (gpu)")
    assert list(table["configuration"]) == ["forward pass"]
