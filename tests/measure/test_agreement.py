"""`LayoutCheck`: a layout's loss and gradients against one device's, as chapter 8 shows them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gclab.config import ModelConfig, TaskConfig
from gclab.measure.agreement import LayoutCheck, compare_leaves
from gclab.parallel import ParallelConfig, parse_parallel_spec

ROOT = Path(__file__).resolve().parents[2]
TINY = ModelConfig(resolution=6.0, mesh_splits=2, latent_size=16, processor_steps=2)
TASK = TaskConfig.from_levels(13)


def test_compare_leaves_measures_the_worst_array_and_the_whole_vector():
    ref = [np.array([1.0, -2.0]), np.array([[4.0]])]
    assert compare_leaves([a.copy() for a in ref], ref) == (0.0, 0.0)
    worst, norm = compare_leaves([np.array([1.0, -2.0]), np.array([[4.4]])], ref)
    assert worst == pytest.approx(0.1)  # 0.4 / max |4|
    assert norm == pytest.approx(0.4 / np.sqrt(1 + 4 + 16))
    with pytest.raises(ValueError, match="as many gradient arrays as reference, and it has "
                                         "2 against 1"):
        compare_leaves(ref, ref[:1])


def test_one_device_layout_agrees_exactly_and_too_many_devices_is_refused():
    check = LayoutCheck(TINY, TASK, batch=2)
    same = check.against(ParallelConfig())
    assert same.loss == same.reference_loss and np.isfinite(same.loss)
    assert same.grad_rel == 0.0 and same.loss_rel == 0.0
    with pytest.raises(ValueError, match="needs 64 devices"):
        check.against(parse_parallel_spec("spatial:64"))


SCRIPT = """
import json, jax
jax.config.update("jax_num_cpu_devices", 4)
from gclab.config import ModelConfig, TaskConfig
from gclab.measure.agreement import LayoutCheck
from gclab.parallel import parse_parallel_spec
check = LayoutCheck(ModelConfig(resolution=6.0, mesh_splits=2, latent_size=16,
                                processor_steps=2), TaskConfig.from_levels(13), batch=2)
for spec in ("data:2", "spatial:4", "pipeline:2,microbatches:2"):
    print(json.dumps(check.against(parse_parallel_spec(spec)).to_dict()))
"""


def test_layouts_on_simulated_devices_equal_one_device_within_1e_5():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["layout"] for r in rows] == ["data:2,spatial:1", "data:1,spatial:4",
                                           "data:1,spatial:1,pipeline:2,microbatches:2"]
    for r in rows:
        assert r["loss_rel"] < 1e-5 and r["grad_rel"] < 1e-5, r
        assert r["loss"] != 0.0
