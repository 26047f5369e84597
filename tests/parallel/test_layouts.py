"""Every layout gives one device's loss and gradients (float32, 1e-5 relative).

Each case runs `layout_worker.py` in a fresh process with N simulated CPU devices (the
device count must be set before JAX starts). Tiny model: 6 deg, 2 splits, 2 x 16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parent / "layout_worker.py"
ROOT = WORKER.parents[2]
TOLERANCE = 1e-5
# bfloat16: a layout changes the order of sums, so roundings differ a little from one
# device's bfloat16 run; against one device's float32 baseline the tolerances are those
# every bfloat16 recipe meets on one device (tests/memory/test_techniques.py).
BF16_LAYOUT_GRAD_NORM_REL = 2e-2
BF16_GRAD_TOL = 1e-1
BF16_COSINE = 0.995


def run_worker(devices: int, rollout: int, cases: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, str(WORKER), str(devices), str(rollout), cases],
                          capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("devices, rollout, cases", [
    (2, 2, "data:2,spatial:1@none;data:1,spatial:2@none;"
           "data:1,spatial:2,mesh-nodes:replicated@blocks-remat"),
    (4, 1, "data:2,spatial:2@blocks-remat;data:1,spatial:4@lean"),
    (8, 1, "data:2,spatial:4@blocks-remat;data:1,spatial:8@none"),
])
def test_layout_matches_one_device(devices, rollout, cases):
    results = run_worker(devices, rollout, cases)
    assert len(results) == len(cases.split(";"))
    for r in results:
        assert r["loss_rel"] < TOLERANCE, r
        assert r["grad_rel"] < TOLERANCE, r


def test_bfloat16_layouts_stay_within_the_bfloat16_tolerances():
    results = run_worker(4, 1, "data:2,spatial:2@bf16;data:1,spatial:4@lean-bf16")
    assert len(results) == 2
    for r in results:
        assert r["grad_norm_rel"] < BF16_LAYOUT_GRAD_NORM_REL, r
        assert 0 < r["grad_norm_rel_f32"] <= BF16_GRAD_TOL, r
        assert r["grad_cosine_f32"] >= BF16_COSINE, r
