"""Arguments of the measuring functions, refused in one line before any work starts."""

from __future__ import annotations

import numpy as np
import pytest

from gclab.limits import format_bytes
from gclab.measure import peak
from gclab.measure.peak import measure_peak

TARGET = "gclab.measure.targets:allocate"


@pytest.fixture
def no_child(monkeypatch):
    """`measure_peak` fails the test if it starts its child process."""
    def started(*args, **kwargs):
        raise AssertionError("measure_peak started a child")

    monkeypatch.setattr(peak.subprocess, "run", started)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"budget_bytes": "8GiB"}, TypeError,
     "measure_peak budget_bytes='8GiB' is invalid: an integer >= 1"),
    ({"budget_bytes": -1}, ValueError, "measure_peak budget_bytes=-1 is invalid: an integer >= 1"),
    ({"budget_bytes": 0}, ValueError, "measure_peak budget_bytes=0 is invalid"),
    ({"budget_bytes": 1.5e9}, TypeError, "measure_peak budget_bytes=1500000000.0 is invalid"),
    ({"timeout": -5}, ValueError,
     "measure_peak timeout=-5 is invalid: a finite number of seconds > 0"),
    ({"timeout": 0}, ValueError, "measure_peak timeout=0 is invalid"),
    ({"timeout": float("inf")}, ValueError, "measure_peak timeout=inf is invalid"),
    ({"timeout": float("nan")}, ValueError, "measure_peak timeout=nan is invalid"),
    ({"timeout": "60"}, TypeError, "measure_peak timeout='60' is invalid"),
    ({"timeout": None}, TypeError, "measure_peak timeout=None is invalid"),
])
def test_measure_peak_refuses_a_bad_budget_or_timeout_before_its_child(no_child, kwargs, error,
                                                                       words):
    with pytest.raises(error) as info:
        measure_peak(TARGET, {"nbytes": 1024}, **kwargs)
    assert str(info.value).startswith(words) and "\n" not in str(info.value)


def test_measure_peak_takes_numpy_numbers(monkeypatch):
    """A numpy budget and timeout reach the child's run as the numbers they are."""
    seen = {}

    def run(*args, timeout, **kwargs):
        seen["timeout"] = timeout
        raise peak.subprocess.TimeoutExpired("python", timeout)

    monkeypatch.setattr(peak.subprocess, "run", run)
    result = measure_peak(TARGET, {"nbytes": 1024}, budget_bytes=np.int64(2**20),
                          timeout=np.float32(2.5))
    assert seen["timeout"] == 2.5 and type(seen["timeout"]) is float
    assert result.status == "error" and result.budget_bytes == 2**20
    assert type(result.budget_bytes) is int


@pytest.mark.parametrize("digits, error, words", [
    (-1, ValueError, "format_bytes digits=-1 is invalid: an integer >= 0"),
    (2.5, TypeError, "format_bytes digits=2.5 is invalid: an integer >= 0"),
    ("2", TypeError, "format_bytes digits='2' is invalid"),
])
def test_format_bytes_refuses_bad_digits(digits, error, words):
    with pytest.raises(error, match="^" + words.replace("(", r"\(").replace(".", r"\.")):
        format_bytes(2048, digits)


def test_format_bytes_digits():
    assert format_bytes(2048, 0) == "2 KiB"
    assert format_bytes(1536, np.int64(1)) == "1.5 KiB"
