"""`LONG_FIRST` (tests/conftest.py) names items that exist: a renamed test or chapter would
otherwise lose its place at the front without a word."""

from pathlib import Path

import pytest
from conftest import LONG_FIRST, ROOT


@pytest.mark.parametrize("prefix", LONG_FIRST)
def test_each_long_item_names_a_file_and_a_test_in_it(prefix):
    path, _, name = prefix.partition("::")
    file = ROOT / path
    assert file.is_file(), f"{path} does not exist"
    if name:
        assert f"def {name}" in Path(file).read_text(), f"no test named {name}* in {path}"
