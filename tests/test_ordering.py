"""`LONG_FIRST` (tests/conftest.py) names items that exist: a renamed test or chapter would
otherwise lose its place at the front without a word."""

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _root_conftest(config):
    """tests/conftest.py as pytest loaded it (`import conftest` may find a subfolder's)."""
    path = TESTS / "conftest.py"
    return next(p for p in config.pluginmanager.get_plugins()
                if Path(getattr(p, "__file__", None) or "") == path)


def test_each_long_item_names_a_file_and_a_test_in_it(request):
    long_first = _root_conftest(request.config).LONG_FIRST
    assert long_first
    for prefix in long_first:
        path, _, name = prefix.partition("::")
        file = TESTS.parent / path
        assert file.is_file(), f"{path} does not exist"
        if name:
            name = name.split("[")[0]
            assert f"def {name}" in file.read_text(), f"no test named {name}* in {path}"


def test_groups_are_handed_out_in_the_order_of_their_first_item(request):
    """Without `--no-loadscope-reorder`, `--dist loadgroup` hands out the largest
    `xdist_group` first, whatever `LONG_FIRST` says (pytest-xdist 3.8)."""
    if not request.config.pluginmanager.hasplugin("xdist"):
        pytest.skip("pytest-xdist is not loaded (-p no:xdist)")
    assert request.config.getoption("loadscopereorder") is False
