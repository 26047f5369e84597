"""The book's structure: every chapter of the table of contents is a notebook with the parts a
chapter must have, committed without outputs, with a Colab set-up cell that installs gclab
from the repository named in `_config.yml` and leaves Colab's JAX alone."""

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
PAGES = [entry["file"] for part in TOC["parts"] for entry in part["chapters"]]
CHAPTERS = [page for page in PAGES if (ROOT / f"{page}.ipynb").is_file()]  # the notebooks


def _cells(name, committed=False):
    """The cells of notebook `name`; with `committed`, as git's index holds them (what a commit
    takes), since CI's nbmake run writes executed chapters back into the working tree."""
    text = None
    if committed:
        staged = subprocess.run(["git", "show", f":{name}.ipynb"], cwd=ROOT,
                                capture_output=True, text=True)
        text = staged.stdout if staged.returncode == 0 else None  # not a checkout: the file
    notebook = json.loads(text or (ROOT / f"{name}.ipynb").read_text())
    return [(c["cell_type"], "".join(c["source"]), c) for c in notebook["cells"]]


def test_toc_lists_every_notebook_of_the_book():
    on_disk = {f"book/{p.stem}" for p in (ROOT / "book").glob("*.ipynb")}
    assert set(CHAPTERS) == on_disk
    assert (ROOT / f"{TOC['root']}.md").is_file()
    assert all((ROOT / f"{page}.ipynb").is_file() or (ROOT / f"{page}.md").is_file()
               for page in PAGES)
    assert len([c for c in CHAPTERS if re.match(r"book/0\d_", c)]) == 8


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
    for kind, _, cell in _cells(name, committed=True):
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


# Packages of gclab's dependencies that a Colab runtime ships (its JAX must stay).
COLAB_SHIPS = {"jax", "jaxlib", "numpy", "scipy", "pandas", "matplotlib", "tqdm",
               "orbax-checkpoint"}


@pytest.mark.parametrize("name", CHAPTERS)
def test_colab_cell_installs_every_dependency_colab_lacks(name):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {re.split(r"[<>=!~\[ ]", d)[0].lower() for d in project["dependencies"]}
    setup = next(src for kind, src, _ in _cells(name) if kind == "code")
    installs = " ".join(re.findall(r"pip \+ \[([^\]]*)\]", setup))
    installed = set(re.findall(r"[\"']([a-z][\w.-]*)[\"']", installs))
    missing = needed - COLAB_SHIPS - installed
    assert not missing, f"{name}: Colab lacks {missing}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_first_cell_sets_allocation_and_the_cache_installs_the_book_tag_and_checks_jax(name):
    from gclab.versions import book_ref

    setup = next(src for kind, src, _ in _cells(name) if kind == "code")
    preallocate = 'os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")'
    assert preallocate in setup
    assert setup.index(preallocate) < setup.index("import jax")
    cache = 'os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", '
    assert cache in setup and setup.index(cache) < setup.index("import jax")
    assert "import gclab" not in setup[:setup.index(preallocate)]
    assert re.findall(r'GCLAB_REF = "([^"]+)"', setup) == [book_ref()]
    assert "gclab.git@{GCLAB_REF}" in setup
    assert setup.index("check_jax()") < setup.index("import jax")


# ----------------------------------------------------------------- numbers in the prose

# Literal constants a chapter may type: small counts, the model's and the task's defining
# sizes (levels, steps, widths, grid shape, card sizes), and years. Anything else that
# looks like a number must be pasted from a cell with `{glue:text}`.
ALLOWED_NUMBERS = {str(n) for n in (*range(14), 16, 20, 24, 32, 37, 40, 64, 80, 128, 256, 512,
                                    721, 1440)} | {"0.25", "0.5", "1.0"}
_FENCE = re.compile(r"^(`{3,}|~{3,})([^\n]*)\n(.*?)^\1[ \t]*$", re.S | re.M)
_NUMBER = re.compile(r"(?<![\w.^/-])\d[\d,]*(?:\.\d+)?%?(?![\w])")


def _section_numbers(markdown):
    return set(re.findall(r"^#+ ((?:\d+|[A-Z])\.\d+) ", markdown, re.M))


def _prose(markdown):
    """The markdown a reader reads as sentences: no code, no glue roles, no references."""
    markdown = markdown.split("## References")[0]
    # fenced code goes; directives ({admonition}, {dropdown}) keep their text
    markdown = _FENCE.sub(lambda m: m.group(3) if m.group(2).strip().startswith("{") else "",
                          markdown)
    markdown = re.sub(r"^:\w+:.*$", "", markdown, flags=re.M)  # directive options
    markdown = re.sub(r"\{[\w:-]+\}`[^`]*`", "", markdown)  # roles: glue, doc, ref
    markdown = re.sub(r"`[^`]*`", "", markdown)  # inline code
    markdown = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$", "", markdown, flags=re.S)  # formulas
    markdown = re.sub(r"https?://\S+", "", markdown)
    return re.sub(r"^#+ .*$", "", markdown, flags=re.M)  # headings


def unglued_numbers(markdown, sections=frozenset()):
    """Numbers typed in the prose that are neither allowed constants nor section numbers."""
    found = []
    for match in _NUMBER.finditer(_prose(markdown)):
        token = match.group(0).rstrip(",")
        plain = token.rstrip("%")
        if plain in ALLOWED_NUMBERS or plain in sections or re.fullmatch(r"(19|20)\d\d", plain):
            continue
        found.append(token)
    return found


def test_unglued_number_detector():
    text = ("## 2.3 Edges\n\nThe step needs 1.23 GiB, {glue:text}`temp` in all; 16 steps of "
            "width 512 (section 2.3, Chen 2016), `every:3` and float32 and 3L.\n\n"
            "```python\nx = 1234\n```\n\n```{admonition} Takeaway\n:class: tip\nIt is 45% "
            "smaller.\n```\n\n## References\n\n* Science 382 (2023).\n")
    assert unglued_numbers(text, _section_numbers(text)) == ["1.23", "45%"]


def _glued_names(code):
    return set(re.findall(r"\bglue\(\s*[\"']([\w.-]+)[\"']", code)) | set(
        re.findall(r"\bglue\(\s*f[\"']([\w.-]+)\{", code))


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_number_in_the_prose_is_glued(name):
    cells = _cells(name)
    markdown = "\n\n".join(src for kind, src, _ in cells if kind == "markdown")
    sections = _section_numbers("\n\n".join(
        "\n\n".join(src for kind, src, _ in _cells(n) if kind == "markdown") for n in CHAPTERS))
    assert unglued_numbers(markdown, sections) == [], f"{name}: numbers typed in the prose"


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_glue_role_names_a_value_glued_in_the_same_notebook(name):
    cells = _cells(name)
    markdown = "\n".join(src for kind, src, _ in cells if kind == "markdown")
    code = "\n".join(src for kind, src, _ in cells if kind == "code")
    used = {key.split(":")[0] for key in re.findall(r"\{glue(?::\w+)?\}`([^`]+)`", markdown)}
    glued = _glued_names(code)
    prefixes = {p for p in glued if p.endswith((".", "_", "-"))}
    missing = {k for k in used if k not in glued and not any(k.startswith(p) for p in prefixes)}
    assert not missing, f"{name}: glued nowhere in the notebook: {sorted(missing)}"


def test_intro_links_the_appendix_and_a_glossary_of_the_memory_terms():
    intro = (ROOT / f"{TOC['root']}.md").read_text()
    assert "{doc}`appendix_measuring_memory`" in intro and "{doc}`glossary`" in intro
    assert "book/glossary" in PAGES
    glossary = (ROOT / "book/glossary.md").read_text()
    for term in ("remat", "residual", "fusion", "buffer assignment", "live range", "temp bytes",
                 "argument bytes", "output bytes", "multimesh"):
        assert f"\n{term}\n" in glossary, term


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_has_an_exercise_with_a_worked_answer_behind_a_toggle(name):
    markdown = "\n".join(src for kind, src, _ in _cells(name) if kind == "markdown")
    exercises = markdown.split("## Exercises")[1]
    assert re.search(r"```\{admonition\} Answer to exercise \d+\n:class: dropdown\n", exercises)


def test_glue_from_another_page_names_a_value_glued_in_that_notebook():
    pages = {f"{TOC['root']}.md", *(f"{p}.md" for p in PAGES if (ROOT / f"{p}.md").is_file())}
    pasted = []
    for page in pages:
        text = (ROOT / page).read_text()
        for doc, key in re.findall(r"\{glue(?::\w+)?\}`([\w./-]+\.ipynb)::([\w.-]+)(?::[^`]*)?`",
                                   text):
            pasted.append((page, doc, key))
            name = str(Path(page).parent / doc)[: -len(".ipynb")]
            assert name in CHAPTERS, f"{page}: no chapter {doc}"
            code = "\n".join(src for kind, src, _ in _cells(name) if kind == "code")
            glued = _glued_names(code)
            prefixes = {p for p in glued if p.endswith((".", "_", "-"))}
            assert key in glued or any(key.startswith(p) for p in prefixes), (page, doc, key)
    assert pasted, "the introduction pastes its figures from the chapters"


def test_chapters_run_here_with_the_tests_flags_and_share_their_compiles(request, tmp_path):
    """Under pytest a chapter's kernel (started by nbmake, from this environment) compiles
    without LLVM optimisation as the tests do (tests/conftest.py), and there a compile only
    read and one that runs are the same compile (`plan_only_options` sets nothing), so a
    step a test compiled is found in JAX's cache by the chapter that compiles it too."""
    import nbformat
    from nbclient import NotebookClient

    from gclab.measure import plan_only_options

    conftest = next(p for p in request.config.pluginmanager.get_plugins()
                    if getattr(p, "__file__", "") == str(ROOT / "tests" / "conftest.py"))
    assert set(conftest.TEST_XLA_FLAGS) <= set(os.environ["XLA_FLAGS"].split())
    assert plan_only_options() is None
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os\n"
        "from gclab.measure import plan_only_options\n"
        "print(os.environ['XLA_FLAGS'], plan_only_options())")])
    NotebookClient(notebook, timeout=120, resources={"metadata": {"path": str(tmp_path)}}
                   ).execute()
    (output,) = notebook.cells[0].outputs
    assert output.text.split() == [*os.environ["XLA_FLAGS"].split(), "None"]
