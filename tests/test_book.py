"""The book's structure: every chapter of the table of contents is a notebook with the parts a
chapter must have, committed without outputs, with a Colab set-up cell that installs gclab
from the repository named in `_config.yml` and leaves Colab's JAX alone."""

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
CHAPTERS = [entry["file"] for part in TOC["parts"] for entry in part["chapters"]]


def _cells(name):
    notebook = json.loads((ROOT / f"{name}.ipynb").read_text())
    return [(c["cell_type"], "".join(c["source"]), c) for c in notebook["cells"]]


def test_toc_lists_every_notebook_of_the_book():
    on_disk = {f"book/{p.stem}" for p in (ROOT / "book").glob("*.ipynb")}
    assert set(CHAPTERS) == on_disk
    assert (ROOT / f"{TOC['root']}.md").is_file()
    assert len([c for c in CHAPTERS if re.match(r"book/0\d_", c)]) == 7


def test_build_executes_with_a_cache_and_offers_colab():
    assert CONFIG["execute"]["execute_notebooks"] == "cache"
    assert CONFIG["launch_buttons"]["colab_url"].startswith("https://colab.research.google.com")
    assert CONFIG["repository"]["url"].startswith("https://")


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_has_the_parts_of_a_chapter(name):
    cells = _cells(name)
    markdown = "\n".join(src for kind, src, _ in cells if kind == "markdown")
    code = "\n".join(src for kind, src, _ in cells if kind == "code")
    assert cells[0][0] == "markdown" and cells[0][1].startswith("# ")
    for part in ("What you will learn", "## Summary", "## Exercises", "## References"):
        assert part in markdown, f"{name}: no '{part}'"
    assert "print_hardware()" in code or "hardware_report()" in code, f"{name}: no hardware cell"
    assert "choose_scale()" in code, f"{name}: the scale is not chosen from the hardware"
    # Committed without outputs: the build and nbmake execute them.
    for kind, _, cell in cells:
        if kind == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, name
    # Every code cell is followed by a sentence on what its output shows.
    for (kind, _, _), (next_kind, _, _) in zip(cells, cells[1:]):
        if kind == "code":
            assert next_kind == "markdown", f"{name}: two code cells in a row"


@pytest.mark.parametrize("name", CHAPTERS)
def test_colab_cell_installs_from_the_configured_repository(name):
    setup = next(src for kind, src, _ in _cells(name) if kind == "code")
    assert "google.colab" in setup
    urls = re.findall(r"git\+(https://[^\"'@]+?)(?:\.git)?[\"'@]", setup)
    assert urls == [CONFIG["repository"]["url"]]
    # Colab's GPU build of JAX must stay: nothing installed may pull in another jax.
    installs = re.findall(r"pip \+ \[([^\]]*)\]", setup)
    assert installs
    packages = " ".join(installs)
    assert not re.search(r"[\"']jax(lib)?[\"'=<>\[]", packages)
    assert "--no-deps" in installs[0]
