"""gclab's supported JAX range, declared once, and the warning a Colab cell prints."""

import re
from pathlib import Path

from gclab.versions import book_ref, check_jax, jax_in_range

ROOT = Path(__file__).resolve().parent.parent


def _declared() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'"jax([<>=][^"]*)"', text).group(1)


def test_the_range_is_declared_in_pyproject_and_bounded():
    spec = _declared()
    assert spec.startswith(">=") and "<" in spec.replace(">=", "")
    requirements = (ROOT / "requirements.txt").read_text().splitlines()
    assert f"jax{spec}" in requirements  # the book's own set-up agrees


def test_versions_inside_and_outside_the_range():
    assert jax_in_range("0.10.2", ">=0.7,<0.11")
    assert jax_in_range("0.7.0", ">=0.7,<0.11")
    assert not jax_in_range("0.6.2", ">=0.7,<0.11")
    assert not jax_in_range("0.11.0", ">=0.7,<0.11")
    assert jax_in_range("0.10.2.dev20261101+cuda12", ">=0.7,<0.11")


def test_check_jax_warns_only_outside_the_range(capsys):
    assert check_jax("0.10.2", ">=0.7,<0.11") is None
    assert capsys.readouterr().out == ""
    message = check_jax("0.12.1", ">=0.7,<0.11")
    assert message.startswith("WARNING: JAX 0.12.1 is outside the range gclab supports "
                              "(jax>=0.7,<0.11)")
    assert capsys.readouterr().out.strip() == message


def test_the_book_installs_the_tag_of_this_version():
    import gclab

    assert book_ref() == f"v{gclab.__version__}"
