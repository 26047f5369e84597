"""`ParallelConfig`, its spec, shard-major edge blocks and the collective byte count."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from gclab.config import MAX_INT32, ConfigError
from gclab.memory.blocks import merge_blocks, shard_block, split_blocks
from gclab.parallel import ParallelConfig, layouts, parse_parallel_spec, pipeline_layouts
from gclab.parallel.collectives import collective_bytes
from gclab.parallel.config import spec_error

# Why a layout may not have all three axes above 1 (`ParallelConfig`, `spec_error`).
THREE = ("pipeline combines with data or with spatial, not with both (XLA's SPMD "
         "partitioner aborts the process on the three axes)")


def test_default_layout_is_one_device():
    p = ParallelConfig()
    assert (p.data, p.spatial, p.pipeline, p.devices) == (1, 1, 1, 1)
    assert p.spec == "data:1,spatial:1"


@pytest.mark.parametrize("spec, sizes", [
    ("data:2,spatial:4", (2, 4, 1)),
    ("spatial:8", (1, 8, 1)),
    (" data : 3 ", (3, 1, 1)),
    ("spatial:2,data:2,pipeline:1", (2, 2, 1)),
    ("spatial:4,mesh-nodes:replicated", (1, 4, 1)),
])
def test_parse_parallel_spec(spec, sizes):
    p = parse_parallel_spec(spec)
    assert (p.data, p.spatial, p.pipeline) == sizes
    assert parse_parallel_spec(p.spec) == p
    assert p.devices == sizes[0] * sizes[1] * sizes[2]


def test_mesh_nodes_are_split_unless_the_spec_says_replicated():
    assert parse_parallel_spec("spatial:4").mesh_nodes == "split"
    kept = parse_parallel_spec("spatial:4,mesh-nodes:replicated")
    assert kept.mesh_nodes == "replicated" and kept.spec.endswith(",mesh-nodes:replicated")
    with pytest.raises(ValueError, match=r"ParallelConfig\.mesh_nodes='whole'.*split"):
        parse_parallel_spec("spatial:4,mesh-nodes:whole")


@pytest.mark.parametrize("spec", ["", "data", "data:x", "model:2", "data:-1"])
def test_malformed_spec_lists_what_is_accepted(spec):
    with pytest.raises(ValueError, match="accepted: comma-separated AXIS:SIZE"):
        parse_parallel_spec(spec)


@pytest.mark.parametrize("spec, message", [
    ("data:2,data:2", "data is given twice (data:2 and data:2)"),
    ("spatial:2,mesh-nodes:split,mesh-nodes:replicated",
     "mesh-nodes is given twice (mesh-nodes:split and mesh-nodes:replicated)"),
    ("pipeline:2,stage-steps:1/1,stage-steps:2/2",
     "stage-steps is given twice (stage-steps:1/1 and stage-steps:2/2)"),
    ("pipeline:2,microbatches:2,microbatches:4",
     "microbatches is given twice (microbatches:2 and microbatches:4)"),
])
def test_an_item_given_twice_is_named(spec, message):
    with pytest.raises(ValueError) as e:
        parse_parallel_spec(spec)
    assert str(e.value) == f"{message}: each axis or item at most once"


@pytest.mark.parametrize("spec, message", [
    # Out of range, with or without items only a pipeline has: the size is named.
    ("pipeline:99999999999",
     f"pipeline:99999999999 is invalid: an integer >= 1 (and <= {MAX_INT32})"),
    ("pipeline:99999999999,microbatches:2",
     f"pipeline:99999999999 is invalid: an integer >= 1 (and <= {MAX_INT32})"),
    ("pipeline:0,stage-steps:3", f"pipeline:0 is invalid: an integer >= 1 (and <= {MAX_INT32})"),
    ("microbatches:0", f"microbatches:0 is invalid: an integer >= 1 (and <= {MAX_INT32})"),
    # Items only a pipeline has, without one: that, whatever else is wrong with them.
    ("microbatches:2", "microbatches:2 is invalid without a pipeline: it needs pipeline:P with "
     "P >= 2"),
    ("stage-steps:4", "stage-steps:4 is invalid without a pipeline: it needs pipeline:P with "
     "P >= 2"),
    ("stage-steps:2/2", "stage-steps:2/2 is invalid without a pipeline: it needs pipeline:P "
     "with P >= 2"),
    ("pipeline:1,stage-remat:0/1", "stage-remat:0/1 is invalid without a pipeline: it needs "
     "pipeline:P with P >= 2"),
    ("microbatches:1,stage-steps:4", "stage-steps:4 is invalid without a pipeline: it needs "
     "pipeline:P with P >= 2"),
    # With a pipeline, the item's own fault.
    ("pipeline:2,stage-steps:2", "stage-steps:2 is invalid: 2 numbers separated by '/', one "
     "per stage of pipeline:2"),
    ("pipeline:2,stage-steps:0/2", "stage-steps:0/2 is invalid: every stage has 1 step or more"),
    # All three axes: XLA's SPMD partitioner aborts the process (rc 134) compiling them.
    ("data:2,spatial:2,pipeline:2", f"pipeline:2 is invalid with data:2 and spatial:2: {THREE}"),
    ("spatial:3,pipeline:2,data:2,mesh-nodes:replicated",
     f"pipeline:2 is invalid with data:2 and spatial:3: {THREE}"),
    ("data:4,spatial:2,pipeline:4,microbatches:2,stage-steps:1/1/1/1",
     f"pipeline:4 is invalid with data:4 and spatial:2: {THREE}"),
    # A size out of range is named as such, three axes or not.
    ("data:2,spatial:2,pipeline:99999999999",
     f"pipeline:99999999999 is invalid: an integer >= 1 (and <= {MAX_INT32})"),
])
def test_spec_errors_name_the_item_as_written(spec, message):
    with pytest.raises(ConfigError) as e:
        parse_parallel_spec(spec)
    assert spec_error(spec, e.value) == message


@pytest.mark.parametrize("sizes", [(2, 2, 2), (2, 3, 2), (4, 2, 3), (3, 5, 7)])
@pytest.mark.parametrize("mesh_nodes", ["split", "replicated"])
def test_a_layout_with_all_three_axes_is_refused(sizes, mesh_nodes):
    data, spatial, pipeline = sizes
    with pytest.raises(ConfigError) as e:
        ParallelConfig(data=data, spatial=spatial, pipeline=pipeline, mesh_nodes=mesh_nodes)
    assert str(e.value) == (f"ParallelConfig.pipeline={pipeline} is invalid: 1 with "
                            f"data:{data} and spatial:{spatial}; {THREE}.")
    assert e.value.field == "pipeline"
    with pytest.raises(ConfigError) as replaced:
        ParallelConfig(data=data, spatial=spatial).replace(pipeline=pipeline)
    assert str(replaced.value) == str(e.value)
    with pytest.raises(ConfigError, match=rf"^ParallelConfig\.pipeline={pipeline} is invalid"):
        parse_parallel_spec(f"data:{data},spatial:{spatial},pipeline:{pipeline}")
    # Any two of the axes are a layout.
    for two in (dict(data=data, spatial=spatial), dict(data=data, pipeline=pipeline),
                dict(spatial=spatial, pipeline=pipeline, mesh_nodes=mesh_nodes)):
        assert ParallelConfig(**two).devices == math.prod(two.get(a, 1) for a in
                                                           ("data", "spatial", "pipeline"))


@pytest.mark.parametrize("field, value", [("data", 0), ("spatial", 1.5), ("data", True),
                                          ("pipeline", 0), ("microbatches", 0)])
def test_invalid_sizes_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"ParallelConfig\.{field}="):
        ParallelConfig(**{field: value})


@pytest.mark.parametrize("field", ["data", "spatial", "pipeline", "microbatches"])
def test_sizes_are_capped_at_int32_and_numpy_sizes_stored_as_ints(field):
    changes = {field: 2**40}
    if field == "microbatches":
        changes["pipeline"] = 2
    with pytest.raises(ValueError) as e:
        ParallelConfig(**changes)
    assert str(e.value) == (f"ParallelConfig.{field}={2**40} is invalid: an integer >= 1 "
                            f"(and <= {MAX_INT32}).")
    assert getattr(ParallelConfig(**{**changes, field: MAX_INT32}), field) == MAX_INT32
    kept = ParallelConfig(**{**changes, field: np.int64(2)})
    assert type(getattr(kept, field)) is int and kept == ParallelConfig(**{**changes, field: 2})


def test_pipeline_spec_round_trips_and_splits_steps():
    p = parse_parallel_spec("data:2,pipeline:3,microbatches:4,stage-steps:2/5/9,stage-remat:1/0/9")
    assert (p.data, p.pipeline, p.microbatches, p.devices) == (2, 3, 4, 6)
    assert p.stage_steps == (2, 5, 9) and p.stage_remat == (1, 0, 9)
    assert parse_parallel_spec(p.spec) == p
    assert p.stage_bounds(16) == ((0, 2), (2, 7), (7, 16))
    # Even by default, earlier stages one step more.
    assert ParallelConfig(pipeline=3).stage_bounds(16) == ((0, 6), (6, 11), (11, 16))
    assert ParallelConfig(pipeline=4).stage_bounds(4) == ((0, 1), (1, 2), (2, 3), (3, 4))


@pytest.mark.parametrize("layout, steps, words", [
    (ParallelConfig(pipeline=5), 4, "at most 4 stages"),
    (ParallelConfig(pipeline=2, stage_steps=(3, 3)), 5, "add up to the processor's 5"),
    (ParallelConfig(pipeline=2, stage_remat=(0, 3)), 4, "stage 1 has 2 steps, fewer than 3"),
])
def test_stage_bounds_refuse_what_the_processor_cannot_hold(layout, steps, words):
    with pytest.raises(ValueError, match=words):
        layout.stage_bounds(steps)


@pytest.mark.parametrize("changes, field", [
    (dict(pipeline=2, stage_steps=(1, 2, 3)), "stage_steps"),
    (dict(pipeline=2, stage_steps=(0, 4)), "stage_steps"),
    (dict(pipeline=2, stage_remat=(-1, 0)), "stage_remat"),
    (dict(pipeline=2, stage_steps=(2, 2), stage_remat=(3, 0)), "stage_remat"),
    (dict(microbatches=2), "pipeline"),
])
def test_invalid_pipeline_fields_name_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"ParallelConfig\.{field}="):
        ParallelConfig(**changes)


def test_pipeline_batch_must_split_into_data_and_micro_batches():
    layout = ParallelConfig(data=2, pipeline=2, microbatches=3)
    layout.check_batch(12)
    with pytest.raises(ValueError, match="a multiple of 24"):
        layout.check_batch(12, accumulation=4)
    with pytest.raises(ValueError, match="a multiple of 6"):
        layout.check_batch(8)


def test_layouts_of_eight_devices():
    assert [p.spec for p in layouts(8)] == ["data:8,spatial:1", "data:4,spatial:2",
                                            "data:2,spatial:4", "data:1,spatial:8"]
    assert layouts(np.int64(8)) == layouts(8)
    assert [p.spec for p in pipeline_layouts(np.int64(4), np.int32(4))] == [
        "data:2,spatial:1,pipeline:2", "data:1,spatial:1,pipeline:4"]


def test_layouts_of_many_devices_are_every_divisor_pair():
    # Found by divisor pairs up to the square root, so that a billion devices do not take
    # a billion divisions. 2**30 has 31 divisors; a prime two.
    assert [p.data for p in layouts(2**30)] == [2**k for k in range(30, -1, -1)]
    assert [p.spec for p in layouts(7)] == ["data:7,spatial:1", "data:1,spatial:7"]
    assert [p.spec for p in layouts(36)][3:6] == ["data:9,spatial:4", "data:6,spatial:6",
                                                   "data:4,spatial:9"]
    assert [p.pipeline for p in pipeline_layouts(2**30, 16)] == [2, 4, 8, 16]
    assert [p.pipeline for p in pipeline_layouts(12, 16)] == [2, 3, 4, 6, 12]


def test_no_generated_layout_has_all_three_axes():
    for devices in range(1, 33):
        generated = list(layouts(devices))
        for steps in (1, 2, 3, 4, 16, 32):
            generated += pipeline_layouts(devices, steps)
        assert generated, devices
        for layout in generated:
            assert min(layout.data, layout.spatial, layout.pipeline) == 1, layout.spec
            assert layout.devices == devices
            assert parse_parallel_spec(layout.spec) == layout


DEVICE_COUNT = "an integer >= 1 (and <= 2147483647)"
BAD_COUNTS = [
    ("layouts(0)", lambda: layouts(0), f"devices=0 is invalid: {DEVICE_COUNT}"),
    ("layouts(True)", lambda: layouts(True), f"devices=True is invalid: {DEVICE_COUNT}"),
    ("layouts(8.0)", lambda: layouts(8.0), f"devices=8.0 is invalid: {DEVICE_COUNT}"),
    # More than a layout's sizes hold: refused by name, before any division.
    ("layouts(2**40)", lambda: layouts(2**40),
     f"devices=1099511627776 is invalid: {DEVICE_COUNT}"),
    ("pipeline_layouts(10**18, 4)", lambda: pipeline_layouts(10**18, 4),
     f"devices={10**18} is invalid: {DEVICE_COUNT}"),
    ("pipeline_layouts(True, 4)", lambda: pipeline_layouts(True, 4),
     f"devices=True is invalid: {DEVICE_COUNT}"),
    ("pipeline_layouts(4, 4.0)", lambda: pipeline_layouts(4, 4.0),
     "steps=4.0 is invalid: an integer >= 1"),
    ("pipeline_layouts(4, 0)", lambda: pipeline_layouts(4, 0),
     "steps=0 is invalid: an integer >= 1"),
    ("shard_block(8, 0)", lambda: shard_block(8, 0),
     "shard_block shards=0 is invalid: an integer >= 1"),
    ("shard_block(8, 2.0)", lambda: shard_block(8, 2.0),
     "shard_block shards=2.0 is invalid: an integer >= 1"),
    ("shard_block(0, 2)", lambda: shard_block(0, 2),
     "shard_block block=0 is invalid: an integer >= 1"),
]


@pytest.mark.parametrize("call, words", [c[1:] for c in BAD_COUNTS],
                         ids=[c[0] for c in BAD_COUNTS])
def test_layout_and_block_counts_are_integers_not_bools_or_floats(call, words):
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value) == words


@pytest.mark.parametrize("n, block, shards", [(10, 4, 1), (10, 4, 2), (1860, 700, 8),
                                              (7, 3, 3), (5, 8, 4)])
def test_shard_major_blocks_give_each_shard_its_own_contiguous_rows(n, block, shards):
    block = shard_block(block, shards)
    x = jnp.arange(n)
    blocks = np.asarray(split_blocks(x, block, fill=-1, shards=shards))  # [nb, block]
    nb = blocks.shape[0]
    per_shard = blocks.reshape(nb, shards, block // shards).transpose(1, 0, 2).reshape(shards, -1)
    flat = per_shard.reshape(-1)
    assert np.array_equal(flat[:n], np.arange(n)) and np.all(flat[n:] == -1)
    assert np.array_equal(np.asarray(merge_blocks(jnp.asarray(blocks), n, shards)), np.arange(n))
    # The decoder's node and edge blocks line up: three edges per node, same block count.
    edges = np.asarray(split_blocks(jnp.repeat(x, 3), 3 * block, fill=-1, shards=shards))
    assert edges.shape[0] == nb
    assert np.array_equal(edges.reshape(nb, block, 3), np.repeat(blocks[..., None], 3, -1))


HLO = """HloModule m

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %ar = f32[8]{0} all-reduce(f32[8]{0} %x), replica_groups={}, to_apply=%add
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %ar)
}

%cond (p: (s32[], f32[8])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[4,2]) -> f32[8] {
  %a = f32[4,2]{1,0} parameter(0)
  %ag = f32[16,2]{1,0} all-gather(f32[4,2]{1,0} %a), dimensions={0}
  %ags = (f32[4,2]{1,0}, bf16[16,2]{1,0}) all-gather-start(f32[4,2]{1,0} %a), dimensions={0}
  %agd = bf16[16,2]{1,0} all-gather-done((f32[4,2]{1,0}, bf16[16,2]{1,0}) %ags)
  %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body, TRIPS
  ROOT %rs = f32[2]{0} reduce-scatter(f32[8]{0} %y), dimensions={0}, to_apply=%add
}
""".replace("TRIPS", 'backend_config={"known_trip_count":{"n":"5"}}')


def test_collective_bytes_count_results_once_per_execution():
    counts = collective_bytes(HLO)
    assert counts["all-gather"] == 16 * 2 * 4 + 16 * 2 * 2  # sync + the done half only
    assert counts["all-reduce"] == 5 * 8 * 4  # inside a 5-trip loop
    assert counts["reduce-scatter"] == 2 * 4
    assert counts["total"] == counts["all-gather"] + counts["all-reduce"] + 8
    assert collective_bytes("")["total"] == 0


def test_step_spec_carries_a_layout():
    from gclab.config import ModelConfig, TaskConfig
    from gclab.sizing.step import StepSpec

    model, task = ModelConfig(resolution=6.0, mesh_splits=2), TaskConfig.from_levels(13)
    one = StepSpec(model, task)
    assert "parallel" not in one.to_json()  # one-device records are unchanged
    spec = StepSpec(model, task, batch=4, parallel=parse_parallel_spec("data:2,spatial:2"))
    assert StepSpec.from_json(spec.to_json()) == spec
    assert spec.describe()["devices"] == 4 and spec.describe()["parallel"] == "data:2,spatial:2"
    with pytest.raises(ValueError, match="StepSpec.batch=3 is invalid"):
        StepSpec(model, task, batch=3, parallel=ParallelConfig(data=2))


def test_the_former_module_of_collective_bytes_still_imports_and_says_where_it_went():
    import importlib
    import sys

    sys.modules.pop("gclab.measure.collectives", None)
    with pytest.warns(DeprecationWarning, match="moved to gclab.parallel.collectives"):
        old = importlib.import_module("gclab.measure.collectives")
    assert old.collective_bytes is collective_bytes
    assert old.collective_bytes(HLO) == collective_bytes(HLO)


@pytest.mark.parametrize("remat", [
    dict(processor_remat="step"),
    dict(processor_remat="every", remat_group_size=2),
    dict(processor_remat="nested", remat_group_size=2),
    dict(processor_remat="ratio", remat_ratio=0.5),
    dict(processor_remat="step", remat_policy="dots"),
])
def test_a_processor_remat_with_per_stage_remat_is_refused(remat):
    """Per-stage remat sets the checkpointed steps of every stage in place of the processor
    remat, which was reported (`gclab train --json`) and did nothing: refused where a
    pipelined network is built (`gclab memory`, the API) and before a run's first work."""
    from gclab.config import ModelConfig, TaskConfig
    from gclab.memory.config import MemoryConfig
    from gclab.model.graphcast import pipeline_stages
    from gclab.parallel import StageRematConflict
    from gclab.training.loop import train

    memory, layout = MemoryConfig(**remat), ParallelConfig(pipeline=2, stage_remat=(1, 1))
    with pytest.raises(StageRematConflict) as e:
        layout.check_memory(memory)
    assert isinstance(e.value, ConfigError)
    assert (e.value.owner, e.value.field, e.value.value) == ("MemoryConfig", "processor_remat",
                                                             remat["processor_remat"])
    assert (e.value.remat_spec, e.value.stage_remat) == (memory.remat_spec, (1, 1))
    assert str(e.value) == (
        f"MemoryConfig.processor_remat={remat['processor_remat']!r} is invalid: 'none' with "
        "ParallelConfig.stage_remat=(1, 1), which sets the checkpointed steps of each "
        f"pipeline stage in its place (remat {memory.remat_spec} would be ignored): give one "
        "or the other.")
    with pytest.raises(StageRematConflict):
        pipeline_stages(4, memory, layout, None, None)
    model = ModelConfig(resolution=30.0, mesh_splits=1, latent_size=8, processor_steps=2)
    with pytest.raises(StageRematConflict):
        train(model, TaskConfig(), 1, memory=memory, parallel=layout)
    # Either alone is a layout's own choice: no remat with per-stage remat, or the
    # processor remat in every stage.
    layout.check_memory(MemoryConfig())
    ParallelConfig(pipeline=2).check_memory(memory)
    assert len(pipeline_stages(4, MemoryConfig(), layout, None, None)) == 2
