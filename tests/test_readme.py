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


def test_the_command_table_names_only_options_each_command_has():
    """Every `--option` a row of the README's command table names for `gclab <command>`
    is one that command's parser defines (a renamed or dropped option leaves the README
    promising what the command refuses); the shorthand ``(--preset NAME | ...)`` stands
    for the model options, which are not listed."""
    from gclab.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(\w+)( [^`]*)?` \|", readme, re.M)
    checked = 0
    for command, usage in rows:
        if command not in commands:
            continue  # a row of another table
        defined = {o for a in commands[command]._actions for o in a.option_strings}
        named = set(re.findall(r"--[a-z][a-z0-9-]*", usage))
        assert named <= defined, f"README's `{command}` row: {sorted(named - defined)}"
        checked += 1
    assert checked >= 9  # every subcommand's row was read
