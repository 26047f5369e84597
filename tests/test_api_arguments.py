"""Bad arguments to public helper functions: one ValueError (TypeError for a wrong type)
whose message names the argument and what is allowed, never a KeyError, a
ZeroDivisionError, numpy's own complaint or a silently wrong result. (The refusals are cases
of the `API` list of tests/test_bad_inputs.py; here, what they still accept.)"""

import numpy as np
import pytest

from gclab.geometry.grid_mesh import grid_latitudes, grid_longitudes
from gclab.memory.blocks import balanced_block, split_blocks
from gclab.memory.precision import compute_dtype
from gclab.memory.remat import remat_policy
from gclab.parallel import processes
from gclab.parallel.pipeline import bubble_fraction
from gclab.sizing.speed import data_sheet

ROWS = np.zeros((10, 2), np.float32)


def test_good_arguments_still_work_numpy_scalars_included():
    assert balanced_block(np.int64(10), np.int32(4)) == 4  # 3 blocks of 4, 4, 2 -> 4
    assert balanced_block(0, 8) == 1  # no rows: one block of padding
    assert split_blocks(ROWS, np.int64(4), shards=np.int64(2)).shape == (3, 4, 2)
    assert bubble_fraction(np.int64(4), np.int32(13)) == 3 / 16
    assert compute_dtype("bf16") == np.dtype("bfloat16")
    assert callable(remat_policy("dots"))
    np.testing.assert_array_equal(grid_latitudes(np.float32(45)), [-90, -45, 0, 45, 90])
    assert grid_longitudes(90.0).tolist() == [0, 90, 180, 270]
    assert data_sheet("H100", "bf16").seconds_per_flop == pytest.approx(1 / 990e12)


class _Untouchable:
    """Stands in for `jax` in `gclab.parallel.processes`: a refusal must come before JAX's
    config is touched (a count JAX accepts but cannot start leaves the process without a
    CPU backend), so any use of it fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"use_cpu_devices touched jax.{name} before refusing")


@pytest.mark.parametrize("n,error,words", [
    (0, ValueError, "use_cpu_devices n=0 is invalid: an integer in 1..2048"),
    (-1, ValueError, "use_cpu_devices n=-1 is invalid: an integer in 1..2048"),
    (np.int64(0), ValueError, "use_cpu_devices n=0 is invalid"),
    ("4", TypeError, "use_cpu_devices n='4' is invalid: an integer in 1..2048"),
    (4.0, TypeError, "use_cpu_devices n=4.0 is invalid"),
    (True, TypeError, "use_cpu_devices n=True is invalid"),
    (processes.MAX_CPU_DEVICES + 1, ValueError, "(at most 2048)"),
], ids=repr)
def test_use_cpu_devices_refuses_before_touching_jax(n, error, words, monkeypatch):
    # Only refusals: a successful call would change this pytest process's JAX backends.
    monkeypatch.setattr(processes, "jax", _Untouchable())
    with pytest.raises(error) as e:
        processes.use_cpu_devices(n)
    assert words in str(e.value), str(e.value)
