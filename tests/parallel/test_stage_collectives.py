"""A pipelined step whose compiled stages hold a collective-permute is refused before it runs.

`gpipe`'s stages are the branches of one conditional, each device running its own stage's.
Where the compiler reshards rows that do not split evenly over `spatial` (mesh nodes over a
spatial size that does not divide their count, padded edge blocks), it may put a
collective-permute inside a branch; XLA:CPU's permute waits for every device of the program,
and the other stages' devices never come (the step aborted after a 40 s rendezvous timeout).
`gclab.parallel.collectives.branch_collectives` finds such permutes in the optimised HLO
(handcrafted HLO here), and `gclab train` refuses the layout in one line; `gclab memory`
still reports it, with one line saying it cannot run.

The runs over devices start fresh processes of 8 (or 4) simulated CPU devices; a process that
hung or aborted (the step before the check) fails its test by its exit status or timeout.
Tiny model: 6 deg, 2 splits (162 mesh nodes: 4 does not divide them), 2 x 16.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gclab.parallel import parse_parallel_spec
from gclab.parallel.collectives import branch_collectives, collective_bytes
from gclab.parallel.pipeline import (
    StagesWouldHang,
    check_stage_collectives,
    stage_collectives_error,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--resolution", "6", "--mesh-splits", "2", "--latent", "16", "--steps", "2"]
# Well above a compile of the tiny step on two busy cores (about 15 s); an unchecked step
# aborts after XLA:CPU's 40 s rendezvous timeout, or hangs until this.
TIMEOUT = 600

PAD = "jit(step)/jvp(network)/shard_map/cond/branch_1_fun/decoder/jit(_pad)/pad"

# Two stages (branches): stage 0 calls a fusion and a loop whose body holds the permute
# (found through the calls), stage 1 holds an all-reduce of its own group (not a permute).
# The pipeline's own permute, between the ticks, is outside the conditional (not found).
STAGED = f"""HloModule staged

%fused_computation (p.0: f32[4]) -> f32[4] {{
  %p.0 = f32[4]{{0}} parameter(0)
  ROOT %negate = f32[4]{{0}} negate(%p.0)
}}

%body (b.0: f32[4]) -> f32[4] {{
  %b.0 = f32[4]{{0}} parameter(0)
  ROOT %cp.1 = f32[4]{{0}} collective-permute(%b.0), source_target_pairs={{{{1,0}},{{3,2}}}}, \
metadata={{op_name="{PAD}"}}
}}

%cond (c.0: f32[4]) -> pred[] {{
  %c.0 = f32[4]{{0}} parameter(0)
  ROOT %constant = pred[] constant(false)
}}

%branch_0 (x.0: f32[4]) -> f32[4] {{
  %x.0 = f32[4]{{0}} parameter(0)
  %fusion = f32[4]{{0}} fusion(%x.0), kind=kLoop, calls=%fused_computation
  ROOT %while = f32[4]{{0}} while(%fusion), condition=%cond, body=%body, \
backend_config={{"known_trip_count":{{"n":"3"}}}}
}}

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}}

%branch_1 (y.0: f32[4]) -> f32[4] {{
  %y.0 = f32[4]{{0}} parameter(0)
  ROOT %all-reduce = f32[4]{{0}} all-reduce(%y.0), replica_groups=[2,2]<=[4], to_apply=%add
}}

ENTRY %main (i: s32[], z: f32[4]) -> f32[4] {{
  %i = s32[] parameter(0)
  %z = f32[4]{{0}} parameter(1)
  %conditional = f32[4]{{0}} conditional(%i, %z, %z), branch_computations={{%branch_0, %branch_1}}
  ROOT %cp.9 = f32[4]{{0}} collective-permute(%conditional), source_target_pairs={{{{0,2}},{{1,3}}}}
}}
"""


def test_branch_collectives_finds_a_permute_a_stage_calls_and_none_outside():
    assert branch_collectives(STAGED) == [PAD]  # by its op_name
    assert branch_collectives(STAGED, ("all-reduce",)) == ["all-reduce"]  # by its HLO name
    # Its bytes are counted as before: 3 trips of the stage's permute, and the entry's.
    assert collective_bytes(STAGED)["collective-permute"] == 3 * 16 + 16
    # Stage 0's computations called from no branch: its permute is outside (not found).
    assert branch_collectives(_only_branch_1(STAGED)) == []


def _only_branch_1(hlo: str) -> str:
    out = hlo.replace("branch_computations={%branch_0, %branch_1}",
                      "branch_computations={%branch_1}")
    assert out != hlo
    return out


def test_branch_collectives_reads_two_branches_nested_and_async_forms():
    two = STAGED.replace("branch_computations={%branch_0, %branch_1}",
                         "true_computation=%branch_1, false_computation=%branch_0")
    assert branch_collectives(two) == [PAD]
    # %branch_0 only as a branch of a conditional inside %branch_1; an asynchronous permute
    # in %branch_1, counted once (its start).
    nested = _only_branch_1(STAGED).replace(
        "ROOT %all-reduce = f32[4]{0} all-reduce(%y.0), replica_groups=[2,2]<=[4], "
        "to_apply=%add",
        "%inner = f32[4]{0} conditional(%y.0, %y.0), branch_computations={%branch_0}\n"
        "  %cp-start = (f32[4]{0}, f32[4]{0}) collective-permute-start(%inner), "
        "source_target_pairs={{0,1}}\n"
        "  ROOT %cp-done = f32[4]{0} collective-permute-done(%cp-start)")
    assert "%cp-done" in nested
    assert sorted(branch_collectives(nested)) == ["cp-start", PAD]


def test_a_pipeline_with_a_permute_in_a_stage_is_refused_in_one_message():
    layout = parse_parallel_spec("spatial:2,pipeline:2")
    reason = stage_collectives_error(STAGED, layout)
    assert reason.startswith("the compiler put 1 collective-permute(s) inside the pipeline's "
                             "stages (one in decoder/jit(_pad)/pad), to reshard rows that do "
                             "not split evenly over spatial:2"), reason
    assert "the stages would wait on each other forever" in reason
    assert "mesh-nodes:replicated" in reason and "no edge blocks" in reason
    assert "\n" not in reason
    with pytest.raises(StagesWouldHang) as e:
        check_stage_collectives(STAGED, layout)
    assert isinstance(e.value, ValueError) and e.value.reason == reason
    assert str(e.value) == f"layout {layout.spec} cannot run: {reason}"
    # Without a pipeline every device takes the same branch: nothing to refuse.
    assert stage_collectives_error(STAGED, parse_parallel_spec("spatial:2")) is None
    check_stage_collectives(STAGED, parse_parallel_spec("spatial:2"))


def _gclab(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "gclab", *argv], capture_output=True,
                          text=True, env=env, timeout=TIMEOUT)


def test_train_refuses_a_spatial_pipeline_layout_whose_stages_would_hang():
    """spatial:4 of 162 mesh nodes: the step used to abort (rc 134) after 40 s."""
    proc = _gclab("train", *TINY, "--train-steps", "1", "--parallel", "spatial:4,pipeline:2")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith(
        "gclab train: error: --parallel spatial:4,pipeline:2: the compiler put "), proc.stderr
    assert "the stages would wait on each other forever" in proc.stderr
    assert proc.stdout == ""


def test_memory_reports_a_layout_that_cannot_run_and_accepts_an_even_one():
    """Edge blocks pad: spatial:2 of an even node count still hangs, and `gclab memory` says
    so in one line beside its figures; without edge blocks the layout is accepted."""
    blocked = _gclab("memory", *TINY, "--recipe", "lean", "--edge-block", "700", "--parallel",
                     "spatial:2,pipeline:2", "--json")
    assert blocked.returncode == 0, blocked.stderr[-3000:]
    record = json.loads(blocked.stdout)
    assert record["total_bytes"] > 0 and record["collective_bytes"] > 0
    assert "wait on each other forever" in record["cannot_run"]
    assert blocked.stderr == ("gclab memory: warning: --parallel spatial:2,pipeline:2: this "
                              "layout cannot run (gclab train refuses it): "
                              f"{record['cannot_run']}\n")
    even = _gclab("memory", *TINY, "--parallel", "spatial:2,pipeline:2", "--json")
    assert even.returncode == 0, even.stderr[-3000:]
    assert "cannot_run" not in json.loads(even.stdout) and even.stderr == ""


def test_a_live_compile_refuses_a_step_that_cannot_run_before_allocating(monkeypatch):
    """`compile_train_step(live=True)`, what the chapters and the sweep call: a step whose
    compiled stages would hang raises before any array is made; one that `run_if` will not
    run keeps its plan and the reason (the planner's and `gclab memory`'s case)."""
    from gclab.config import ModelConfig, TaskConfig
    from gclab.sizing import step as step_module

    reason = "the compiler put 1 collective-permute(s) inside the pipeline's stages"
    monkeypatch.setattr(step_module, "stage_collectives_error", lambda hlo, layout: reason)

    def no_arrays(*args, **kwargs):
        raise AssertionError("arrays were made for a step that cannot run")

    monkeypatch.setattr(step_module, "_random_args", no_arrays)
    # Both calls below compile the same program: it is compiled once, and what each call
    # does with the compiled step is what is checked.
    compile_timed, compiled = step_module.compile_timed, []

    def compile_once(*args, **kwargs):
        if not compiled:
            compiled.append(compile_timed(*args, **kwargs))
        return compiled[0]

    monkeypatch.setattr(step_module, "compile_timed", compile_once)
    spec = step_module.StepSpec(ModelConfig(resolution=6.0, mesh_splits=2, latent_size=16,
                                            processor_steps=2), TaskConfig.from_levels(13))
    with pytest.raises(StagesWouldHang, match=re.escape(f"cannot run: {reason}")):
        step_module.compile_train_step(spec, live=True)
    kept = step_module.compile_train_step(spec, live=True, run_if=lambda memory: False)
    assert kept.cannot_run == reason and kept.memory.total_bytes > 0
    assert len(compiled) == 1
