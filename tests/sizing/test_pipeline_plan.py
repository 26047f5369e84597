"""The pipeline planner: its MILP against brute force and one ratio for all stages, and the
linear stage-memory model against compiled stage programs."""

from __future__ import annotations

import dataclasses

import pytest

from gclab.config import ModelConfig, TaskConfig
from gclab.memory.config import MemoryConfig
from gclab.parallel import ParallelConfig
from gclab.sizing.pipeline_plan import (
    StageCosts,
    brute_force,
    evaluate,
    fit_stage_costs,
    solve_milp,
    stage_program_memory,
    uniform,
)

MB = 2**20
# A stage model like GraphCast's at a fine grid: encoder and decoder dominate memory, a
# stored step costs three times a checkpointed one, a step is cheap next to both ends.
COSTS = StageCosts(base={"first": 900 * MB, "middle": 100 * MB, "last": 1100 * MB},
                   stored=300 * MB, checkpointed=100 * MB, step_seconds=1.0,
                   encoder_seconds=2.0, decoder_seconds=2.5, link_seconds=0.1)


@pytest.mark.parametrize("steps, stages, microbatches, seconds", [
    (8, 2, 4, 1.0), (7, 3, 3, 1.0), (6, 4, 2, 1.0),
    (8, 2, 4, 1e-6),  # microsecond ticks: the solver works in units of one step
])
def test_milp_equals_brute_force_and_is_at_least_as_good_as_one_ratio(steps, stages,
                                                                        microbatches, seconds):
    costs = dataclasses.replace(COSTS, step_seconds=seconds, encoder_seconds=2 * seconds,
                                decoder_seconds=2.5 * seconds, link_seconds=0.1 * seconds)
    checked = 0
    for budget_mb in range(1200, 4000, 150):
        budget = budget_mb * MB
        best = brute_force(costs, steps, stages, microbatches, budget)
        chosen = solve_milp(costs, steps, stages, microbatches, budget)
        if best is None:
            assert chosen is None
            continue
        assert chosen.fits and sum(chosen.stage_steps) == steps
        assert all(0 <= n <= k for k, n in zip(chosen.stage_steps, chosen.stage_remat))
        assert max(chosen.memory_bytes) <= budget
        assert chosen.step_seconds == pytest.approx(best.step_seconds, rel=1e-9)
        one = uniform(costs, steps, stages, microbatches, budget)
        if one.fits:
            assert chosen.step_seconds <= one.step_seconds * (1 + 1e-9)
        checked += 1
    assert checked >= 5


def test_per_stage_choice_beats_one_ratio_where_the_stages_differ():
    # The decoder's stage needs memory, the encoder's time. 8 steps over 2 stages in
    # 1700 MiB: on 4 + 4 steps the decoder's stage must checkpoint 3, so one ratio (3/4)
    # also slows the encoder's stage, the slowest; per stage, the encoder's stage
    # checkpoints nothing and gives a step to the decoder's, which checkpoints all of its.
    costs = dataclasses.replace(COSTS, base={"first": 500 * MB, "middle": 100 * MB,
                                             "last": 1100 * MB},
                                encoder_seconds=4.0, decoder_seconds=1.0)
    budget = 1700 * MB
    one = uniform(costs, 8, 2, 4, budget)
    chosen = solve_milp(costs, 8, 2, 4, budget)
    assert one.fits and chosen.fits
    assert (one.stage_steps, one.stage_remat) == ((4, 4), (3, 3))
    assert (chosen.stage_steps, chosen.stage_remat) == ((3, 5), (0, 5))
    assert chosen.step_seconds == pytest.approx(5 * 29.1)
    assert one.step_seconds == pytest.approx(5 * 35.1)
    assert chosen.bubble == one.bubble == pytest.approx(1 / 5)


def test_evaluate_counts_ticks_and_the_bubble():
    c = evaluate(COSTS, (3, 5), (1, 2), microbatches=4, budget=4096 * MB)
    # stage 0: 4 (2 + 3) + 1 + 0.1 = 21.1; stage 1: 4 (2.5 + 5) + 2 + 0.1 = 32.1
    assert c.tick_seconds == pytest.approx(32.1)
    assert c.step_seconds == pytest.approx(5 * 32.1)
    assert c.memory_bytes == (900 * MB + 2 * 300 * MB + 100 * MB,
                              1100 * MB + 3 * 300 * MB + 2 * 100 * MB)
    assert c.recomputed_steps == 3 and c.fits


TINY = ModelConfig(resolution=6.0, mesh_splits=2, latent_size=16, processor_steps=5)
TASK = TaskConfig.from_levels(13)


def test_stage_memory_model_bounds_compiled_stage_programs():
    # At most 5% below what a stage compiles to and a quarter above: a stage's internals
    # live one tick, and the first stored step adds more to that tick's peak than the
    # next ones (the fit's slope is the first one's, of a middle stage).
    costs = fit_stage_costs(TINY, TASK, MemoryConfig(), microbatches=2, microbatch=1,
                            flops_per_s=1e12, link_bytes_per_s=1e10)
    assert costs.stored > costs.checkpointed > 0
    assert costs.base["first"] > costs.base["middle"] and costs.base["last"] > costs.base["middle"]
    layout = ParallelConfig(pipeline=2, microbatches=2, stage_steps=(2, 3), stage_remat=(0, 3))
    for stage, (k, n) in enumerate(zip((2, 3), (0, 3))):
        compiled = stage_program_memory(TINY, TASK, MemoryConfig(), layout, stage, 1)
        assert 0.95 * compiled <= costs.memory(stage, 2, k, n) <= 1.25 * compiled


@pytest.mark.parametrize("rollout_remat", [False, True])
@pytest.mark.parametrize("recipe", ["none", "per-step", "deepmind", "lean"])
def test_a_pipeline_is_never_predicted_faster_than_its_work_perfectly_balanced(recipe,
                                                                              rollout_remat):
    # Guards against stage ticks that leave out what the recipe recomputes (rollout remat,
    # encoder and decoder checkpoints, edge blocks) or the bytes activations move, while
    # the layouts they are ranked against count them (`analytical.step_work`).
    from gclab.memory import get_recipe
    from gclab.sizing import analytical
    from gclab.sizing.pipeline_plan import even_split, stage_times

    model = ModelConfig(resolution=10.0, mesh_splits=2, latent_size=16, processor_steps=6)
    task = TaskConfig(pressure_levels=(500, 850))
    memory = get_recipe(recipe, "f32").replace(rollout_remat=rollout_remat,
                                               processor_remat="none", remat_group_size=1,
                                               remat_ratio=1.0)
    counts = analytical.GraphCounts(grid_nodes=648, mesh_nodes=162, mesh_edges=1920,
                                    grid2mesh_edges=1500, mesh2grid_edges=1944)
    flops_per_s, bytes_per_s = 1e12, 1e11
    for stages, microbatches, microbatch in ((2, 1, 1), (2, 4, 2), (3, 8, 1), (2, 64, 1)):
        times = stage_times(model, task, memory, microbatch, flops_per_s, 1e9, counts,
                            bytes_per_s)
        costs = StageCosts({"first": 0, "middle": 0, "last": 0}, 0.0, 0.0,
                           **{**times, "link_seconds": 0.0})
        split = even_split(model.processor_steps, stages)
        piped = evaluate(costs, split, (0,) * stages, microbatches, 1.0).step_seconds
        batch = microbatches * microbatch
        flops, moved = analytical.step_work(model, task, memory, counts, batch)
        moved -= analytical.optimizer_bytes(model, task)
        work = flops / flops_per_s + moved / bytes_per_s
        assert piped >= work / stages * (1 - 1e-12), (stages, microbatches, piped, work)
        # Exactly the work the other layouts count, plus one forward: the stages' own
        # checkpoint.
        f, m = analytical.stage_work(model, task, counts, batch, memory)["forward"]
        total = microbatches * sum(costs.seconds(s, stages, k, 0) for s, k in enumerate(split))
        assert total == pytest.approx(work + f / flops_per_s + 4 * m / bytes_per_s, rel=1e-9)
