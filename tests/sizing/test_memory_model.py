"""Analytical memory model, sweeps and planner: checked against XLA:CPU's compiled figures."""

from __future__ import annotations

import importlib
import math

import jax
import jax.numpy as jnp
import pytest

from gclab.config import PRESETS, ModelConfig, TaskConfig
from gclab.devices import FIT_MARGIN, card_usable_bytes
from gclab.geometry import graphs_for
from gclab.measure import measure_peak
from gclab.memory import RECIPES
from gclab.model import count_params, graph_inputs, make_network, param_shapes
from gclab.sizing import StepSpec, analytical, layout_plan, planner, speed, train_step_memory
from gclab.training import TrainConfig, make_optimizer

# The module: `gclab.sizing.sweep` is also the name of the function the package exports.
sweep = importlib.import_module("gclab.sizing.sweep")

TASK = TaskConfig.from_levels(13)

# (resolution, splits, latent, steps, batch, recipe): the three geometries of the brief,
# latent 32..256, steps 2..8, batch 1..2, recipes none and per-step.
CALIBRATION_GRID = [
    (4.0, 3, 32, 2, 1, "none"),
    (4.0, 3, 256, 8, 1, "per-step"),
    (4.0, 3, 64, 6, 2, "per-step"),
    (6.0, 3, 64, 8, 1, "none"),
    (6.0, 3, 256, 2, 2, "per-step"),
    (5.0, 2, 32, 8, 2, "per-step"),
    (5.0, 2, 256, 4, 1, "none"),
]


@pytest.mark.parametrize("res,splits,latent,steps,batch,recipe", CALIBRATION_GRID)
def test_analytical_temp_within_25_percent_of_compiled(res, splits, latent, steps, batch,
                                                       recipe):
    model = ModelConfig(resolution=res, mesh_splits=splits, latent_size=latent,
                        processor_steps=steps)
    mem = RECIPES[recipe]
    compiled = analytical.compiled_loss_grad(model, TASK, mem, batch).temp_bytes
    modelled = analytical.estimate(model, TASK, mem, batch=batch).loss_grad_temp_bytes
    assert abs(modelled / compiled - 1) < 0.25, (modelled, compiled)


def _tree_bytes(tree) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(tree))


def test_estimate_parts_match_the_real_trees_and_remat_lowers_activations():
    model = PRESETS["cpu-8x128"].model
    e = analytical.estimate(model, TASK, RECIPES["none"])
    shapes = param_shapes(model, TASK.data_channels, TASK.output_channels)
    assert e.params_bytes == _tree_bytes(shapes)
    # The optimizer the training step builds, initialised on those shapes: its two moments
    # per parameter, plus its step counters (scalars).
    opt = jax.eval_shape(make_optimizer(TrainConfig()).init, shapes)
    assert 0 <= _tree_bytes(opt) - e.optimizer_bytes <= 64
    # Gradients of the loss of a bfloat16 network, traced on the real graph's shapes: the
    # modelled 4 bytes per parameter hold only if they come back float32.
    bf16 = RECIPES["none"].replace(precision="bf16")
    net = make_network(model, TASK.data_channels, TASK.output_channels, bf16)
    graphs = graphs_for(model)
    graph = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                   graph_inputs(graphs))
    inputs = jax.ShapeDtypeStruct((graphs.num_grid_nodes, 1, TASK.data_channels), jnp.float32)
    grads = jax.eval_shape(jax.grad(lambda p, g, x: jnp.mean(net.apply(p, g, x) ** 2)),
                           shapes, graph, inputs)
    assert analytical.estimate(model, TASK, bf16).grads_bytes == _tree_bytes(grads)
    assert e.to_dict()["activation.processor"] == e.activation_bytes["processor"]
    step = analytical.estimate(model, TASK, RECIPES["per-step"])
    assert step.activation_bytes["processor"] < e.activation_bytes["processor"] / 5
    assert step.activation_bytes["encoder"] == e.activation_bytes["encoder"]
    assert e.recompute_fraction == 0 and 0 < step.recompute_fraction < 1
    two = analytical.estimate(model, TASK, RECIPES["none"], batch=2)
    assert two.activation_bytes["processor"] == 2 * e.activation_bytes["processor"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_param_count_matches_count_params(name):
    preset = PRESETS[name]
    task = preset.task
    shapes = param_shapes(preset.model, task.data_channels, task.output_channels)
    assert analytical.param_count(preset.model, task) == count_params(shapes)


def test_param_count_published_figures():
    assert analytical.param_count(PRESETS["graphcast"].model, PRESETS["graphcast"].task) \
        == 36_348_131
    assert analytical.param_count(ModelConfig(latent_size=32, processor_steps=4), TASK) \
        == 70_739


@pytest.mark.parametrize("text,expected", [
    ("16GiB", 16 * 2**30), ("12GB", 12 * 10**9), ("500MiB", 500 * 2**20),
    ("T4", int(0.75 * 15_835_660_288)),
    ("h100", 60 * 10**9), ("A100-40GB", 30 * 10**9), (1234567, 1234567),
    ("2097152", 2097152), ("1MiB", 2**20), ("1.5 GiB", int(1.5 * 2**30)),
])
def test_parse_budget(text, expected):
    assert planner.parse_budget(text) == expected


@pytest.mark.parametrize("bad", ["16 parsecs", "GiB", "-1GB", "", "T5", 0, True, "1.5B",
                                 2**20 - 1, "1000KB"])
def test_parse_budget_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="accepted"):
        planner.parse_budget(bad)


PLAN_MODEL = ModelConfig(resolution=4.0, mesh_splits=3, latent_size=64, processor_steps=4)


def _compiled_total(recipe: str) -> int:
    return planner._compiled_total(PLAN_MODEL, TASK, RECIPES[recipe], 1, 1)


def test_planner_never_exceeds_budget_with_compiled_figures():
    """With an H100's data sheet the fastest candidates need the most memory: at each budget
    the planner compiles the faster ones, refuses those whose compiled plan does not fit, and
    takes the fastest that does."""
    lean, none = _compiled_total("lean"), _compiled_total("none")
    assert lean < none
    sheet = speed.data_sheet("H100")
    seconds = []
    for frac in (0.3, 0.5, 0.85):
        budget = int(lean + frac * (none - lean))
        p = planner.plan(budget, PLAN_MODEL, TASK, use_compiled=True, headroom=1.0, speed=sheet)
        assert p.source == "compiled" and p.plan_limit_bytes == budget
        assert p.predicted_peak_bytes <= budget and p.memory != RECIPES["none"]
        table = p.candidates
        assert not table.empty and p.label in set(table["label"])
        assert "Chosen" in p.explain()
        # Every faster candidate was compiled and did not fit, or was far over by the
        # formula; below the largest budget there is one (the choice was not the first).
        faster = table[table["predicted_seconds"] < p.predicted_seconds]
        assert bool(len(faster)) == (frac < 0.85) and not faster["fits"].any()
        assert (faster["compiled_bytes"].isna() | (faster["compiled_bytes"] > budget)).all()
        assert p.predicted_seconds == table.loc[table["fits"], "predicted_seconds"].min()
        if not seconds:
            # Compiled afresh (the planner's figures are cached per process): the same plan.
            again = train_step_memory(StepSpec(PLAN_MODEL, TASK, p.memory)).total_bytes
            assert again == p.predicted_peak_bytes
        seconds.append(p.predicted_seconds)
    # A larger budget gives a faster step: each lets a faster candidate fit.
    assert seconds[0] > seconds[1] > seconds[2]


def test_planner_picks_the_fastest_when_generous_and_raises_when_tiny():
    none = _compiled_total("none")
    p = planner.plan(2 * none, PLAN_MODEL, TASK, use_compiled=True,
                     speed=speed.data_sheet("H100"))
    # Everything fits: the fastest is none with gather after matmul (fewer FLOPs, no remat).
    assert p.candidates["fits"].all() and p.label == "gam"
    assert p.memory == RECIPES["none"].replace(gather_after_matmul=True)
    assert p.predicted_seconds == p.candidates["predicted_seconds"].min()
    with pytest.raises(planner.NothingFits, match="smallest requirement"):
        planner.plan("1MiB", PLAN_MODEL, TASK, use_compiled=True)


def test_planner_analytical_presets_use_remat_on_small_cards():
    small = PRESETS["graphcast-small"]
    t4 = planner.plan("T4", small.model, small.task, use_compiled=False)
    h100 = planner.plan("H100", small.model, small.task, use_compiled=False)
    assert t4.source == "modelled" and t4.predicted_peak_bytes <= t4.plan_limit_bytes
    assert t4.recompute_fraction > h100.recompute_fraction
    # JAX's pool on a T4 (11.9 GB) is too small for any MILP mix of remat and blocks; on an
    # A100-40GB (30 GB) the MILP finds one.
    assert t4.milp["status"] == "infeasible" and t4.label in ("deepmind", "lean")
    a100 = planner.plan("A100-40GB", small.model, small.task, use_compiled=False)
    assert a100.milp["status"] == "optimal"
    with pytest.raises(planner.NothingFits):
        planner.plan("L4", PRESETS["graphcast"].model, PRESETS["graphcast"].task,
                     use_compiled=False)


def test_planner_offers_rollout_remat_for_a_rollout_under_the_commands_names():
    """At a rollout of several steps every setting is offered with each autoregressive step
    checkpointed too, named as the commands name that step (``deepmind+rollout remat`` is
    ``gclab memory --recipe deepmind --rollout T``'s); a budget only those fit is met."""
    from gclab.sizing.step import recipe_memory

    rungs = dict(planner.ladder(4, "f32", rollout=3))
    for recipe in ("per-step", "deepmind", "lean"):
        assert rungs[f"{recipe}+rollout remat"] == recipe_memory(recipe, rollout=3)
        assert not rungs[recipe].rollout_remat
    assert "none+rollout remat" not in rungs
    assert not any(m.rollout_remat for _, m in planner.ladder(4, "f32"))
    model = ModelConfig(resolution=6.0, mesh_splits=2, latent_size=32, processor_steps=4)
    task = TaskConfig(pressure_levels=(500, 850))
    chosen = planner.plan("40MiB", model, task, rollout=4, use_compiled=False)
    assert chosen.memory.rollout_remat and chosen.label.endswith("+rollout remat")
    plain = chosen.candidates[~chosen.candidates.label.str.endswith("rollout remat")]
    assert not plain.fits.any()  # without rollout remat nothing fits this budget


TINY = ModelConfig(resolution=6.0, mesh_splits=2, latent_size=16, processor_steps=2)


def test_usable_bytes_of_a_plan_are_the_budget_and_a_plan_takes_fit_margin_of_them():
    """`usable_bytes` is the budget, as `gclab.devices` defines usable memory, in both
    planners and their JSON; `plan_limit_bytes` is what a plan may take of it."""
    usable = card_usable_bytes("T4")
    one = planner.plan("T4", TINY, TASK, use_compiled=False)
    assert one.usable_bytes == one.budget_bytes == usable
    assert one.plan_limit_bytes == int(FIT_MARGIN * usable)
    assert one.to_dict()["usable_bytes"] == usable
    assert one.to_dict()["plan_limit_bytes"] == one.plan_limit_bytes
    assert one.predicted_peak_bytes <= one.plan_limit_bytes
    assert set(one.candidates.loc[one.candidates["fits"], "label"]) == set(
        one.candidates.loc[one.candidates["peak_bytes"] <= one.plan_limit_bytes, "label"])
    tight = planner.plan(usable, TINY, TASK, use_compiled=False, headroom=0.5)
    assert (tight.usable_bytes, tight.plan_limit_bytes) == (usable, int(0.5 * usable))
    over = layout_plan.plan_layout("T4", TINY, TASK, 1, recipes=["none"]).to_dict()
    assert over["usable_bytes"] == usable
    assert over["plan_limit_bytes"] == int(FIT_MARGIN * usable) == one.plan_limit_bytes
    assert over["per_device_bytes"] <= over["plan_limit_bytes"]


def test_sweep_columns_and_cache(tmp_path, monkeypatch):
    specs = sweep.grid(TINY, [16], [1, 2], TASK, techniques=["none", "per-step"])
    assert [(s.model.processor_steps, s.technique()) for s in specs] == [
        (1, "none"), (1, "per-step"), (2, "none"), (2, "per-step")]
    calls = []
    real = sweep.train_step_memory

    def counting(spec):
        calls.append(spec)
        return real(spec)

    monkeypatch.setattr(sweep, "train_step_memory", counting)
    df = sweep.sweep(specs, cache_path=tmp_path, progress=False)
    assert len(calls) == 4 and len(df) == 4
    for col in ("model.latent_size", "model.processor_steps", "memory.processor_remat",
                "batch", "rollout", "technique", "num_params", "argument_bytes",
                "output_bytes", "temp_bytes", "total_bytes", "compile_seconds",
                "step_seconds", "peak_bytes", "status", "jax", "gclab"):
        assert col in df.columns, col
    assert (df["status"] == "ok").all() and (df["temp_bytes"] > 0).all()
    assert not df["cached"].any()
    again = sweep.sweep(specs, cache_path=tmp_path, progress=False)
    assert len(calls) == 4  # everything read from the cache
    assert again["cached"].all()
    assert list(again["temp_bytes"]) == list(df["temp_bytes"])
    path = sweep.save_sweep(df, tmp_path / "out.json")
    assert len(sweep.load_sweep(path)) == 4
    # A damaged cache file is recomputed, and the row written again.
    damaged = sorted(tmp_path.glob("*.json"))[0]
    damaged.write_text('["not", "a", "row"]')
    third = sweep.sweep(specs, cache_path=tmp_path, progress=False)
    assert len(calls) == 5 and (~third["cached"]).sum() == 1
    assert list(third["temp_bytes"]) == list(df["temp_bytes"])


def test_sweep_timed_and_measured_on_cpu():
    spec = sweep.grid(TINY, [16], [1], TASK)
    assert StepSpec.from_json(spec[0].to_json()) == spec[0]
    timed = sweep.sweep(spec, measure="timed", progress=False, repeats=2).iloc[0]
    assert timed["status"] == "ok" and timed["temp_bytes"] > 0
    assert 0 < timed["step_seconds"] < math.inf and 0 < timed["compile_seconds"] < math.inf
    row = sweep.sweep(spec, measure="measured", progress=False, timeout=300).iloc[0]
    assert row["status"] == "ok", row["message"]
    assert 0 < row["step_seconds"] < math.inf
    # The child runs the step: its peak heap (memray) and its peak resident set are an empty
    # child's with at least XLA's bytes of the step on top (its arguments, temporaries and
    # outputs, live while it runs); a peak read before the step, or from a process that does
    # not run it, would not be.
    empty = measure_peak("gclab.measure.targets:allocate", {"nbytes": 4}, timeout=120)
    assert empty.status == "ok", empty.message
    assert timed["total_bytes"] > timed["argument_bytes"] > 0
    assert row["peak_bytes"] >= empty.peak_bytes + timed["total_bytes"]
    assert row["peak_rss_bytes"] >= empty.peak_rss_bytes + timed["total_bytes"]


def test_sweep_refuses_what_is_not_a_spec():
    with pytest.raises(ValueError, match="StepSpec"):
        sweep.sweep([TINY])
    with pytest.raises(ValueError, match="measure"):
        sweep.sweep([], measure="guess")


def test_grouped_remat_fit_recovers_its_coefficients_and_optimum():
    S, a, b, c = 16, 1000.0, 30.0, 120.0
    ks = [1, 2, 4, 8, 16]
    fit = analytical.fit_grouped_remat(ks, [a + b * S / k + c * k for k in ks], S)
    assert abs(fit.a - a) < 1e-6 and abs(fit.b - b) < 1e-6 and abs(fit.c - c) < 1e-6
    assert abs(fit.optimum - 2.0) < 1e-9  # sqrt(30 * 16 / 120)
    assert abs(fit(fit.optimum) - (a + 2 * (b * c * S) ** 0.5)) < 1e-6
    assert analytical.optimal_group_size(S, 5.0, 5.0) == 4.0  # b = c: the square-root rule
    falling = analytical.fit_grouped_remat(ks, [a - 5.0 * k for k in ks], S)
    assert falling.optimum != falling.optimum  # NaN: c < 0, no trade-off to optimise


def test_step_boundary_is_what_a_step_hands_on_and_cheaper_than_its_internals():
    model = PRESETS["cpu-4x32"].model
    b, c = analytical.step_boundary_and_internals(
        model, analytical.GraphCounts.for_model(model))
    # What one processor step hands to the next, one batch element in float32: a latent per
    # mesh node and per mesh edge, counted on the built graph (not by GraphCounts' rule).
    graphs = graphs_for(model)
    assert b == 4 * model.latent_size * (graphs.num_mesh_nodes + graphs.mesh.num_edges)
    assert b < c  # else storing boundaries instead of internals would save nothing


@pytest.mark.parametrize("name", ["rows.json", "rows.csv", "rows.CSV", "rows"])
def test_a_saved_sweep_reads_back_whatever_the_suffix_case(name, tmp_path):
    import pandas as pd

    df = pd.DataFrame([{"technique": "none", "temp_bytes": 10, "status": "ok"},
                       {"technique": "lean", "temp_bytes": 4, "status": "oom"}])
    back = sweep.load_sweep(sweep.save_sweep(df, tmp_path / name))
    pd.testing.assert_frame_equal(back, df)


@pytest.mark.parametrize("name,text,words", [
    ("s.json", "", "s.json: not JSON (Expecting value"),
    ("s.json", "[1, 2]", "s.json: JSON of the wrong shape (a list of other things than "
     "objects); a sweep is a JSON list of row objects (save_sweep)"),
    ("s.json", '{"technique": "none"}', "s.json: JSON of the wrong shape (not a list)"),
    ("s.csv", "", "s.csv: not a CSV table (No columns to parse from file)"),
], ids=["empty", "list of numbers", "object", "empty csv"])
def test_a_file_that_is_no_sweep_is_named(name, text, words, tmp_path):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError) as e:
        sweep.load_sweep(tmp_path / name)
    assert str(e.value).startswith(f"load_sweep {tmp_path / name}") and words in str(e.value)


def test_a_folder_is_no_sweep(tmp_path):
    with pytest.raises(ValueError, match="load_sweep .*: a folder, not a sweep file"):
        sweep.load_sweep(tmp_path)
