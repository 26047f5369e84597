"""The README's commands and measured blocks stay true."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _update_readme():
    spec = importlib.util.spec_from_file_location("update_readme",
                                                  ROOT / "benchmarks" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_measured_blocks_match_the_recorded_results():
    readme = (ROOT / "README.md").read_text()
    assert _update_readme().render(readme) == readme


def test_readme_states_the_two_commands_that_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert ("pip install -r requirements.txt && python book/run_chapters.py && "
            "jupyter-book build . -W --keep-going") in readme
    assert "pip install -r requirements.txt && pytest" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q -r requirements.txt" in ci
    assert re.search(r'^(PYTEST_ADDOPTS=("[^"]*"|\S+) )?python -m pytest$', ci, re.M)
    assert "jupyter-book build . -W --keep-going" in ci


def test_every_picture_the_readme_shows_exists():
    readme = (ROOT / "README.md").read_text()
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert pictures
    for path in pictures:
        assert (ROOT / path).is_file(), path


def test_layout_table_names_every_subpackage():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    packages = sorted(p.parent.name for p in (ROOT / "gclab").glob("*/__init__.py"))
    assert packages == ["geometry", "measure", "memory", "model", "parallel", "recordings",
                        "sizing", "training", "weather"]
    for name in packages:
        assert f"`gclab/{name}/`" in layout, name
