"""Bad arguments to public helper functions: one ValueError (TypeError for a wrong type)
whose message names the argument and what is allowed, never a KeyError, a
ZeroDivisionError, numpy's own complaint or a silently wrong result."""

import numpy as np
import pytest

from gclab.geometry.grid_mesh import grid_latitudes, grid_longitudes
from gclab.memory.blocks import balanced_block, split_blocks
from gclab.memory.precision import compute_dtype
from gclab.memory.remat import remat_policy
from gclab.parallel import processes
from gclab.parallel.pipeline import bubble_fraction
from gclab.sizing.speed import data_sheet, speed_for

ROWS = np.zeros((10, 2), np.float32)

API = [
    (lambda: compute_dtype("fp16"), "compute_dtype precision='fp16' is invalid: one of f32, bf16"),
    (lambda: remat_policy("bogus"),
     "remat_policy name='bogus' is invalid: one of nothing, dots, aggregated, node-latents"),
    (lambda: balanced_block(10, 0), "balanced_block block=0 is invalid: an integer >= 1"),
    (lambda: balanced_block(10, 2.5), "balanced_block block=2.5 is invalid"),
    (lambda: balanced_block(-1, 4), "balanced_block n=-1 is invalid: an integer >= 0"),
    (lambda: split_blocks(ROWS, 0), "split_blocks block=0 is invalid: an integer >= 1"),
    (lambda: split_blocks(ROWS, 4, shards=0), "split_blocks shards=0 is invalid"),
    (lambda: bubble_fraction(0, 4), "bubble_fraction stages=0 is invalid: an integer >= 1"),
    (lambda: bubble_fraction(4, 0), "bubble_fraction microbatches=0 is invalid"),
    (lambda: bubble_fraction(2.5, 4), "bubble_fraction stages=2.5 is invalid"),
    (lambda: grid_latitudes(7.0), "grid_latitudes resolution=7.0 is invalid: 180 / resolution"),
    (lambda: grid_latitudes(0.0), "grid_latitudes resolution=0.0 is invalid: a positive number"),
    (lambda: grid_latitudes(-1.0), "grid_latitudes resolution=-1.0 is invalid"),
    (lambda: grid_latitudes(float("nan")), "grid_latitudes resolution=nan is invalid"),
    (lambda: grid_longitudes(7.0), "grid_longitudes resolution=7.0 is invalid"),
    (lambda: data_sheet("H100", "fp16"),
     "data_sheet precision='fp16' is invalid: one of f32, bf16"),
    (lambda: speed_for("H100", "fp16"), "speed_for precision='fp16' is invalid"),
]


@pytest.mark.parametrize("call,words", API, ids=[w for _, w in API])
def test_a_bad_argument_is_named(call, words):
    with pytest.raises(ValueError) as e:
        call()
    assert words in str(e.value), str(e.value)


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
