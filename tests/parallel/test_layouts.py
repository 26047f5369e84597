"""Every layout gives one device's loss and gradients (float32, 1e-5 relative).

Every case runs in `layout_worker.py`, a fresh process with 8 simulated CPU devices (the
device count must be set before JAX starts; a layout of N devices runs on the first N).
The cases of all tests run in one such process (`layout_results`, once per module: JAX
starts, the graphs are built and each one-device reference is compiled once, not once per
test), and each test checks its own cases; the module's tests share one xdist worker
(`xdist_group`, with `--dist loadgroup`). Tiny model: 6 deg, 2 splits, 2 x 16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gclab.measure.agreement import BFLOAT16_TOLERANCES, FLOAT32_TOLERANCE

WORKER = Path(__file__).resolve().parent / "layout_worker.py"
ROOT = WORKER.parents[2]
# bfloat16: a layout changes the order of sums, so roundings differ a little from one
# device's bfloat16 run (`layout_grad_norm`); against one device's float32 baseline the
# tolerances are those every bfloat16 recipe meets on one device
# (tests/memory/test_techniques.py).
TOLERANCE, BF16 = FLOAT32_TOLERANCE, BFLOAT16_TOLERANCES


DEVICES = 8
FLOAT32_CASES = [
    (2, "data:2,spatial:1@none;data:1,spatial:2@none;"
        "data:1,spatial:2,mesh-nodes:replicated@blocks-remat"),
    (1, "data:2,spatial:2@blocks-remat;data:1,spatial:4@lean"),
    (1, "data:2,spatial:4@blocks-remat;data:1,spatial:8@none"),
]
BFLOAT16_CASES = (1, "data:2,spatial:2@bf16;data:1,spatial:4@lean-bf16")

pytestmark = pytest.mark.xdist_group("layouts")


def items(rollout: int, cases: str) -> list[str]:
    """The worker's `LAYOUT@MEMORY@ROLLOUT` items of `cases`."""
    return [f"{case}@{rollout}" for case in cases.split(";")]


def run_worker(devices: int, cases: list[str]) -> dict[str, dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, str(WORKER), str(devices), ";".join(cases)],
                          capture_output=True, text=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["case"]: r for r in records}


@pytest.fixture(scope="module")
def layout_results() -> dict[str, dict]:
    """Every case of this module, run by one worker process."""
    cases = [c for rollout, spec in (*FLOAT32_CASES, BFLOAT16_CASES)
             for c in items(rollout, spec)]
    return run_worker(DEVICES, cases)


def results_of(layout_results: dict, rollout: int, cases: str) -> list[dict]:
    wanted = items(rollout, cases)
    missing = [c for c in wanted if c not in layout_results]
    assert not missing, f"the worker reported nothing for {missing}"
    return [layout_results[c] for c in wanted]


@pytest.mark.parametrize("rollout, cases", FLOAT32_CASES)
def test_layout_matches_one_device(layout_results, rollout, cases):
    results = results_of(layout_results, rollout, cases)
    assert len(results) == len(cases.split(";"))
    for r in results:
        assert r["loss_rel"] < TOLERANCE, r
        assert r["grad_rel"] < TOLERANCE, r


def test_bfloat16_layouts_stay_within_the_bfloat16_tolerances(layout_results):
    results = results_of(layout_results, *BFLOAT16_CASES)
    assert len(results) == 2
    for r in results:
        assert r["grad_norm_rel"] < BF16.layout_grad_norm, r
        assert 0 < r["loss_rel_f32"] <= BF16.loss, r
        assert 0 < r["grad_norm_rel_f32"] <= BF16.grad, r
        assert r["grad_cosine_f32"] >= BF16.cosine, r
