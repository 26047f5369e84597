"""Memory techniques keep the model's function and lower compiled memory.

Equivalence: outputs and gradients of every technique and recipe equal the baseline's
(float32: max abs difference <= 1e-5 of the baseline's largest value, per parameter);
bfloat16 within the tolerances stated below. Savings: XLA:CPU compiled temp bytes of one
loss-and-gradient computation, at a small config, lower than the baseline's by the stated
factor (deterministic: compiled from shapes, nothing is timed).
"""

import re

import jax
import jax.numpy as jnp
import pytest

from gclab.config import ModelConfig
from gclab.geometry import build_graphs
from gclab.measure import saved_residuals_df, summarize_residuals
from gclab.measure.agreement import BFLOAT16_TOLERANCES as BF16
from gclab.measure.agreement import FLOAT32_TOLERANCE as TOL
from gclab.memory import RECIPES, MemoryConfig, get_recipe, parse_remat_spec
from gclab.model import graph_inputs, make_network

C, O, B = 5, 4, 2
CFG = ModelConfig(resolution=10.0, mesh_splits=2, latent_size=16, processor_steps=5)


@pytest.fixture(scope="module")
def setup():
    graph = graph_inputs(build_graphs(CFG.resolution, CFG.mesh_splits))
    inputs = jax.random.normal(jax.random.PRNGKey(1), (graph.grid_nodes.shape[0], B, C))
    targets = jax.random.normal(jax.random.PRNGKey(2), (graph.grid_nodes.shape[0], B, O))
    params = make_network(CFG, C, O).init(jax.random.PRNGKey(0), graph, inputs)
    # Non-trivial biases and norms, so every parameter matters.
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(3), len(leaves))
    params = jax.tree_util.tree_unflatten(
        tree, [p + 0.2 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)])
    return graph, inputs, targets, params


def loss_and_grads(mem, setup):
    graph, inputs, targets, params = setup
    net = make_network(CFG, C, O, mem)

    # The graph and batch are arguments, not closed over: closed-over arrays become
    # constants of the lowered module, which then lowers and compiles more slowly.
    def loss(p, g, x, y):
        return jnp.mean((net.apply(p, g, x) - y) ** 2)

    return jax.jit(jax.value_and_grad(loss))(params, graph, inputs, targets)


@pytest.fixture(scope="module")
def baseline(setup):
    return loss_and_grads(MemoryConfig(), setup)


def max_rel_diff(grads, ref):
    """Largest per-parameter max |g - g_ref| / max |g_ref| (parameters with any gradient)."""
    worst = 0.0
    for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref)):
        scale = float(jnp.abs(r).max())
        if scale > 0:
            worst = max(worst, float(jnp.abs(g - r).max()) / scale)
    return worst


F32_TECHNIQUES = {
    "remat step": MemoryConfig(processor_remat="step"),
    "remat every 2": MemoryConfig(processor_remat="every", remat_group_size=2),
    "remat every 3": MemoryConfig(processor_remat="every", remat_group_size=3),
    "remat nested 2": MemoryConfig(processor_remat="nested", remat_group_size=2),
    "remat ratio 0.4": MemoryConfig(processor_remat="ratio", remat_ratio=0.4),
    "remat ratio 0": MemoryConfig(processor_remat="ratio", remat_ratio=0.0),  # none checkpointed
    "policy dots": MemoryConfig(processor_remat="step", remat_policy="dots"),
    "policy aggregated": MemoryConfig(processor_remat="step", remat_policy="aggregated"),
    "policy node-latents": MemoryConfig(processor_remat="step", remat_policy="node-latents"),
    "checkpoint encoder": MemoryConfig(checkpoint_encoder=True),
    "checkpoint decoder": MemoryConfig(checkpoint_decoder=True),
    "edge blocks 100": MemoryConfig(edge_block_size=100),
    "edge blocks 333 + processor": MemoryConfig(edge_block_size=333, processor_edge_blocks=True),
    "gather after matmul": MemoryConfig(gather_after_matmul=True),
    "gather after matmul + blocks": MemoryConfig(gather_after_matmul=True, edge_block_size=257,
                                                 processor_edge_blocks=True),
    "recompute layer norm": MemoryConfig(recompute_layer_norm=True),
    "recompute layer norm + remat every 2": MemoryConfig(
        recompute_layer_norm=True, processor_remat="every", remat_group_size=2),
    "stream grid nodes": MemoryConfig(edge_block_size=300, stream_grid_nodes=True),
    "stream grid nodes + gather after matmul": MemoryConfig(
        edge_block_size=211, stream_grid_nodes=True, gather_after_matmul=True),
    # "none" is the baseline and "per-step" is "remat step" (the same configurations).
    **{f"recipe {name}": mem.replace(edge_block_size=300 if mem.edge_block_size else None)
       for name, mem in RECIPES.items() if name not in ("none", "per-step")},
}
# float32_aggregation is no case of its own: on float32 messages its cast is no operation,
# and the program is the baseline's. It acts in bfloat16 (the cases below).


@pytest.mark.parametrize("name", sorted(F32_TECHNIQUES))
def test_float32_technique_keeps_loss_and_gradients(name, setup, baseline):
    loss0, grads0 = baseline
    loss, grads = loss_and_grads(F32_TECHNIQUES[name], setup)
    assert abs(float(loss) - float(loss0)) <= TOL * abs(float(loss0))
    assert max_rel_diff(grads, grads0) <= TOL


# Blocks that leave a short last block (7 edges), and one block larger than every edge set;
# the techniques above use blocks of 100 to 333 edges.
@pytest.mark.parametrize("block", [7, 100_000])
def test_results_do_not_depend_on_edge_block_size(block, setup, baseline):
    mem = MemoryConfig(edge_block_size=block, processor_edge_blocks=True)
    loss, grads = loss_and_grads(mem, setup)
    assert max_rel_diff(grads, baseline[1]) <= TOL
    assert abs(float(loss) - float(baseline[0])) <= TOL * abs(float(baseline[0]))


# bfloat16 tolerances (stated in `gclab.measure.agreement.BFLOAT16_TOLERANCES`): relative
# L2 error of outputs, relative error of the loss, relative L2 error of each parameter's
# gradient (those with a non-negligible gradient), least cosine of the whole gradient with
# the float32 one.


def bf16_recipe(name: str) -> MemoryConfig:
    """A recipe in bfloat16, its edge blocks (if any) scaled down to CFG's graph."""
    mem = get_recipe(name, "bf16")
    return mem.replace(edge_block_size=300) if mem.edge_block_size else mem


BF16_CASES = {
    **{name: bf16_recipe(name) for name in RECIPES},
    "none + float32 aggregation": bf16_recipe("none").replace(float32_aggregation=True),
}


@pytest.fixture(scope="module")
def outputs32(setup):
    """The float32 baseline's outputs."""
    graph, inputs, _, params = setup
    # Compiled, not run op by op: one compile instead of one per operation.
    return jax.jit(make_network(CFG, C, O).apply)(params, graph, inputs)


@pytest.mark.parametrize("name", list(BF16_CASES))
def test_bfloat16_within_stated_tolerance(name, setup, baseline, outputs32):
    graph, inputs, _, params = setup
    mem = BF16_CASES[name]
    out16 = jax.jit(make_network(CFG, C, O, mem).apply)(params, graph, inputs)
    assert out16.dtype == jnp.float32
    rel = float(jnp.linalg.norm(out16 - outputs32) / jnp.linalg.norm(outputs32))
    assert 0 < rel <= BF16.output
    loss, grads = loss_and_grads(mem, setup)
    assert 0 < abs(float(loss) - float(baseline[0])) <= BF16.loss * abs(float(baseline[0]))
    for g in jax.tree_util.tree_leaves(grads):
        assert g.dtype == jnp.float32  # float32 parameters give float32 gradients
    g16 = jnp.concatenate([g.ravel() for g in jax.tree_util.tree_leaves(grads)])
    g32 = jnp.concatenate([g.ravel() for g in jax.tree_util.tree_leaves(baseline[1])])
    cosine = float(g16 @ g32 / (jnp.linalg.norm(g16) * jnp.linalg.norm(g32)))
    assert cosine >= BF16.cosine
    big = [(a, b) for a, b in zip(jax.tree_util.tree_leaves(grads),
                                  jax.tree_util.tree_leaves(baseline[1]))
           if float(jnp.linalg.norm(b)) > 1e-3 * float(jnp.linalg.norm(g32))]
    for a, b in big:
        assert float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)) <= BF16.grad


def message_sums(mem: MemoryConfig, graph, inputs) -> list:
    """(rows, dtype) of every segment sum (a scatter) of the lowered forward pass of CFG's
    network under `mem`: rows are the receiving nodes (or a block of them)."""
    net = make_network(CFG, C, O, mem)
    params = jax.eval_shape(net.init, jax.random.PRNGKey(0), graph, inputs)
    text = jax.jit(net.apply).lower(params, graph, inputs).as_text()
    # [..., N, B, L] results: the dims before the element type.
    results = re.findall(r'"stablehlo\.scatter".*?\) -> tensor<([\dx]+)x(\w+)>', text, re.S)
    return [(int(dims.split("x")[-3]), dtype) for dims, dtype in results]


@pytest.mark.parametrize("recipe", ["none", "lean"])  # whole and blocked sums
def test_float32_aggregation_sums_processor_and_decoder_messages_in_float32(recipe,
                                                                           shapes_of):
    """In bfloat16 the encoder's sum alone is float32; float32_aggregation makes the
    processor's (mesh rows) and the decoder's (grid rows) float32 too. Read from the lowered
    program (no compile)."""
    graph, inputs = shapes_of(CFG)
    mesh_rows = graph.mesh_nodes.shape[0]
    plain, f32 = (message_sums(bf16_recipe(recipe).replace(float32_aggregation=on), graph,
                               inputs) for on in (False, True))
    assert [rows for rows, _ in f32] == [rows for rows, _ in plain]
    assert {dtype for _, dtype in f32} == {"f32"}
    assert sorted(dtype for _, dtype in plain) == ["bf16"] * (len(plain) - 1) + ["f32"]
    summed16 = {rows for rows, dtype in plain if dtype == "bf16"}
    assert mesh_rows in summed16 and summed16 - {mesh_rows}  # processor and decoder


# ----------------------------------------------------------------------------------------
# Savings: compiled temp bytes on XLA:CPU at a small config (6 deg / 3 splits, 8 x 128).

MEM_CFG = ModelConfig(resolution=6.0, mesh_splits=3, latent_size=128, processor_steps=8)


@pytest.fixture(scope="module")
def baseline_temp(grad_temp):
    return grad_temp(MEM_CFG, MemoryConfig())


# (technique, the largest allowed fraction of the baseline's temp bytes)
SAVINGS = {
    "remat step": (MemoryConfig(processor_remat="step"), 0.6),
    "remat every 3": (MemoryConfig(processor_remat="every", remat_group_size=3), 0.75),
    "remat nested 3": (MemoryConfig(processor_remat="nested", remat_group_size=3), 0.6),
    "remat ratio 0.5": (MemoryConfig(processor_remat="ratio", remat_ratio=0.5), 0.85),
    "policy dots": (MemoryConfig(processor_remat="step", remat_policy="dots"), 0.8),
    "policy aggregated": (MemoryConfig(processor_remat="step", remat_policy="aggregated"), 0.6),
    "edge blocks": (MemoryConfig(edge_block_size=1024), 0.95),
    "edge blocks + processor": (MemoryConfig(edge_block_size=1024,
                                             processor_edge_blocks=True), 0.5),
    "gather after matmul": (MemoryConfig(gather_after_matmul=True), 0.97),
    "recompute layer norm": (MemoryConfig(recompute_layer_norm=True), 0.9),
    "stream grid nodes": (MemoryConfig(edge_block_size=1024, stream_grid_nodes=True), 0.85),
    "recipe deepmind": (get_recipe("deepmind").replace(edge_block_size=1024), 0.7),
    "recipe lean": (get_recipe("lean").replace(edge_block_size=1024), 0.35),
}


# One worker compiles the baseline and the programs the ratio test reads again.
@pytest.mark.xdist_group("compiled-temp")
@pytest.mark.parametrize("name", sorted(SAVINGS))
def test_technique_lowers_compiled_temp(name, grad_temp, baseline_temp):
    mem, factor = SAVINGS[name]
    assert grad_temp(MEM_CFG, mem) <= factor * baseline_temp


def test_streaming_grid_nodes_lowers_temp_below_edge_blocks_alone(grad_temp):
    """On a grid-dominated config (2 deg grid, 3 splits, 2 x 64), streaming grid nodes
    removes the [Ng, B, L] arrays that edge blocks alone still keep."""
    cfg = ModelConfig(resolution=2.0, mesh_splits=3, latent_size=64, processor_steps=2)
    blocks = grad_temp(cfg, MemoryConfig(edge_block_size=1024))
    streamed = grad_temp(cfg, MemoryConfig(edge_block_size=1024, stream_grid_nodes=True))
    assert streamed <= 0.6 * blocks


@pytest.mark.xdist_group("compiled-temp")
def test_remat_ratio_is_monotone(grad_temp, baseline_temp):
    """Checkpointing half the steps needs less than checkpointing none and more than
    checkpointing every one (the baseline and remat step, compiled once for the savings
    above)."""
    half = grad_temp(MEM_CFG, MemoryConfig(processor_remat="ratio", remat_ratio=0.5))
    every = grad_temp(MEM_CFG, MemoryConfig(processor_remat="step"))
    assert baseline_temp > half > every


@pytest.mark.parametrize("stage,field", [("encoder", "checkpoint_encoder"),
                                         ("decoder", "checkpoint_decoder")])
def test_stage_checkpoint_drops_its_saved_residuals(stage, field, setup):
    """A whole-stage checkpoint keeps none of the stage's intermediates for the backward
    pass (JAX's saved residuals). On XLA:CPU the compiled temp of a single step barely
    changes (the backward pass starts at the decoder, and the encoder's recomputation
    coincides with the end of the backward pass); the saving shows in rollouts."""
    graph, inputs, targets, params = setup

    def residual_bytes(mem):
        net = make_network(CFG, C, O, mem)
        df = saved_residuals_df(
            lambda p: jnp.mean((net.apply(p, graph, inputs) - targets) ** 2), params)
        summary = summarize_residuals(df).set_index("module")["bytes"]
        return int(summary.get(stage, 0))

    before = residual_bytes(MemoryConfig())
    after = residual_bytes(MemoryConfig(**{field: True}))
    assert before > 0 and after == 0


# ----------------------------------------------------------------------------------------
# Config and spec errors.


@pytest.mark.parametrize("spec,fields", [
    ("none", dict(processor_remat="none")),
    ("step", dict(processor_remat="step")),
    ("every:3", dict(processor_remat="every", remat_group_size=3)),
    ("nested:4", dict(processor_remat="nested", remat_group_size=4)),
    ("ratio:0.25", dict(processor_remat="ratio", remat_ratio=0.25)),
    ("step,policy=dots", dict(processor_remat="step", remat_policy="dots")),
])
def test_parse_remat_spec(spec, fields):
    parsed = parse_remat_spec(spec)
    assert {k: parsed[k] for k in fields} == fields
    assert MemoryConfig(**parsed).remat_spec == spec


@pytest.mark.parametrize("spec", ["", "every", "every:x", "ratio:1.5", "step:3", "stepp",
                                  "step,policy=all", "every:0"])
def test_malformed_remat_spec_lists_what_is_accepted(spec):
    with pytest.raises(ValueError, match="every:K|policy|remat_group_size|remat_ratio"):
        parse_remat_spec(spec)


@pytest.mark.parametrize("field,value", [
    ("processor_remat", "sometimes"), ("remat_group_size", 0), ("remat_ratio", 2.0),
    ("remat_policy", "everything"), ("edge_block_size", 0), ("precision", "fp8"),
    ("microbatches", 0), ("checkpoint_encoder", "yes"), ("stream_grid_nodes", 1),
])
def test_memory_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"MemoryConfig.{field}="):
        MemoryConfig(**{field: value})


def test_block_switches_need_a_block_size():
    with pytest.raises(ValueError, match="processor_edge_blocks"):
        MemoryConfig(processor_edge_blocks=True)
    with pytest.raises(ValueError, match="stream_grid_nodes"):
        MemoryConfig(stream_grid_nodes=True)


def test_unknown_recipe_lists_recipes():
    with pytest.raises(ValueError, match="none, per-step, deepmind, lean"):
        get_recipe("tiny")


def test_checkpointed_steps_of_a_ratio():
    assert MemoryConfig(processor_remat="ratio", remat_ratio=0.5).checkpointed_steps(16) == 8
    assert MemoryConfig(processor_remat="ratio", remat_ratio=0.3).checkpointed_steps(16) == 5
    assert MemoryConfig(processor_remat="ratio", remat_ratio=0.0).checkpointed_steps(16) == 0
    assert MemoryConfig(processor_remat="step").checkpointed_steps(16) == 16
    assert MemoryConfig().checkpointed_steps(16) == 0


def test_stage_checkpoints_lower_compiled_temp_of_a_rollout():
    """In a 3-step rollout each step's encoder and decoder are no longer the first or last
    thing the backward pass meets, and their checkpoints lower XLA:CPU's compiled temp of
    the rollout's loss and gradient. (One test: the baseline is compiled once for the three
    checkpoints. Without the optimizer's update, which the checkpoints do not touch: the
    ratios are those of the whole training step to 0.3%, in 60% of the compile time. In a
    2-step rollout they are not lower: 1.00 to 1.01 of the baseline.)"""
    from gclab.config import TaskConfig
    from gclab.measure import compiled_memory
    from gclab.sizing import StepSpec, loss_grad_abstract

    cfg = ModelConfig(resolution=6.0, mesh_splits=3, latent_size=64, processor_steps=4)
    task = TaskConfig(pressure_levels=(500, 850))
    base = MemoryConfig(processor_remat="step")

    def temp(mem):
        loss, args = loss_grad_abstract(StepSpec(cfg, task, mem, rollout=3))
        return compiled_memory(jax.grad(loss), *args).temp_bytes

    baseline = temp(base)
    for fields, factor in ((dict(checkpoint_encoder=True), 0.9),
                           (dict(checkpoint_decoder=True), 0.9),
                           (dict(checkpoint_encoder=True, checkpoint_decoder=True), 0.75)):
        assert temp(base.replace(**fields)) <= factor * baseline, fields
