"""Timing and op-by-op bytes: the helpers behind the chapters' speed and eager figures."""

import time

import jax.numpy as jnp
import numpy as np
import pytest

from gclab.measure import median_seconds, op_by_op_bytes


def test_median_seconds_warms_up_then_times():
    calls = []
    seconds = median_seconds(lambda: (calls.append(1), time.sleep(0.01)), repeats=3)
    assert len(calls) == 4 and 0.01 <= seconds < 1.0


def test_a_long_warm_up_call_counts_as_the_first_timed_one():
    import time

    calls = []

    def step(seconds):
        calls.append(seconds)
        time.sleep(seconds)

    assert median_seconds(lambda: step(0.05), repeats=1, long_seconds=0.04) >= 0.05
    assert len(calls) == 1  # the warm-up was the timed call
    calls.clear()
    median_seconds(lambda: step(0.05), repeats=3, long_seconds=0.04)
    assert len(calls) == 3  # the warm-up and two more
    calls.clear()
    median_seconds(lambda: step(0.001), repeats=2, long_seconds=10.0)
    assert len(calls) == 3  # a short warm-up is thrown away


def test_op_by_op_bytes_counts_outputs_and_frees_after_last_use():
    def f(x):  # three [256] float32 intermediates; a is dead once b exists
        a = x * 2.0
        b = a + 1.0
        return jnp.sin(b)

    counts = op_by_op_bytes(f, jnp.ones(256, jnp.float32))
    assert counts["ops"] == 3
    assert counts["output_bytes"] == 3 * 256 * 4
    assert counts["peak_live_bytes"] == 2 * 256 * 4


@pytest.mark.parametrize("kwargs", [{"repeats": 0}, {"repeats": 1.5}, {"warmup": -1},
                                    {"long_seconds": 0}, {"long_seconds": "10"},
                                    {"long_seconds": float("nan")}])
def test_median_seconds_refuses_bad_counts(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        median_seconds(lambda: None, **kwargs)


@pytest.mark.parametrize("kwargs,words", [
    ({"repeats": True}, "median_seconds repeats=True is invalid: an integer >= 1"),
    ({"repeats": 2.0}, "median_seconds repeats=2.0 is invalid: an integer >= 1"),
    ({"repeats": np.int64(0)}, "median_seconds repeats=np.int64(0) is invalid: an integer >= 1"),
    ({"warmup": True}, "median_seconds warmup=True is invalid: an integer >= 0"),
    ({"warmup": 1.0}, "median_seconds warmup=1.0 is invalid: an integer >= 0"),
], ids=repr)
def test_median_seconds_counts_are_integers_not_bools_or_floats(kwargs, words):
    with pytest.raises(ValueError) as e:
        median_seconds(lambda: None, **kwargs)
    assert str(e.value) == words


def test_median_seconds_takes_numpy_numbers():
    calls = []
    median_seconds(lambda: calls.append(1), repeats=np.int64(2), warmup=np.int32(1),
                   long_seconds=np.float32(10.0))
    assert len(calls) == 3  # one warm-up call, two timed
