"""Tests of the helpers the chapters use: HLO fusions and FLOPs, residuals by graph set,
and the geometry figures."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from gclab import plots  # noqa: E402
from gclab.geometry import build_graphs, multimesh  # noqa: E402
from gclab.measure import (  # noqa: E402
    NOT_A_GRAPH_SET,
    bytes_by_graph_set,
    compile_fn,
    flops,
    fusion_counts,
    indexed_by,
    largest_fusion,
)

S = jax.ShapeDtypeStruct


def _matmul_then_elementwise(x, w):
    return jnp.sum(jnp.tanh(x @ w) * 2.0 + 1.0)


def test_flops_of_a_matmul_are_twice_its_multiply_adds():
    n, k, m = 64, 32, 16
    compiled = compile_fn(lambda x, w: x @ w, S((n, k), jnp.float32), S((k, m), jnp.float32))
    assert flops(compiled) == 2 * n * k * m


def _elementwise_chain(x):
    return jnp.tanh(x) * 2.0 + 1.0


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="XLA:CPU's fusion pass; a GPU fuses in passes of its own")
def test_fusion_counts_see_the_fused_elementwise_chain():
    # One chain of elementwise ops on one shape: XLA fuses it into one loop fusion (one
    # fused computation beside ENTRY, called by one fusion instruction); with its fusion
    # pass off, the same ops stay in ENTRY, and nothing is fused.
    x = S((64, 32), jnp.float32)
    fused = compile_fn(_elementwise_chain, x).as_text()
    unfused = compile_fn(_elementwise_chain, x,
                         compiler_options={"xla_disable_hlo_passes": "fusion"}).as_text()
    assert {k: v for k, v in fusion_counts(fused).items() if k != "lines"} == {
        "computations": 2, "fused computations": 1, "fusion instructions": 1}
    assert {k: v for k, v in fusion_counts(unfused).items() if k != "lines"} == {
        "computations": 1, "fused computations": 0, "fusion instructions": 0}
    # The fused computation's own lines (its body and header) are the extra lines.
    assert fusion_counts(fused)["lines"] > fusion_counts(unfused)["lines"]
    lines = largest_fusion(fused, max_lines=20)
    assert "fused" in lines[0]  # the header first, even after more than one blank line
    assert all(f" {op}(" in "".join(lines) for op in ("tanh", "multiply", "add"))
    assert largest_fusion(unfused) == []
    # A gradient's module: its fusions are counted among its computations.
    grad = compile_fn(jax.grad(_matmul_then_elementwise), S((64, 32), jnp.float32),
                      S((32, 16), jnp.float32)).as_text()
    counts = fusion_counts(grad)
    assert 1 <= counts["fused computations"] < counts["computations"]
    assert counts["fusion instructions"] >= counts["fused computations"]
    lines = largest_fusion(grad, max_lines=5, width=60)
    assert 1 <= len(lines) <= 5 and all(len(line) <= 60 for line in lines)
    assert "fused" in lines[0] and "metadata=" not in "".join(lines)


def test_largest_fusion_of_an_unfused_module_is_empty():
    assert largest_fusion("HloModule m\n\nENTRY %main {\n  ROOT %p = f32[] parameter(0)\n}") == []


# XLA:GPU's names: a Triton matmul fusion (kind=kCustom) calls a computation named
# `gemm_fusion_..._computation`, beside a loop fusion's `fused_...`; the reduction's `%add`
# is called by a reduce, not by a fusion.
_GPU_STYLE_HLO = """HloModule jit_f, \
entry_computation_layout={(f32[32,32]{1,0}, f32[32,32]{1,0})->f32[]}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%gemm_fusion_dot.1_computation (parameter_0: f32[32,32], parameter_1: f32[32,32]) -> f32[32,32] {
  %parameter_0 = f32[32,32]{1,0} parameter(0)
  %parameter_1 = f32[32,32]{1,0} parameter(1)
  ROOT %dot.0 = f32[32,32]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, \
rhs_contracting_dims={0}
}

%fused_tanh (param_0: f32[32,32]) -> f32[32,32] {
  %param_0 = f32[32,32]{1,0} parameter(0)
  ROOT %tanh.1 = f32[32,32]{1,0} tanh(%param_0)
}

ENTRY %main.2 (Arg_0.3: f32[32,32], Arg_1.3: f32[32,32]) -> f32[] {
  %Arg_0.3 = f32[32,32]{1,0} parameter(0)
  %Arg_1.3 = f32[32,32]{1,0} parameter(1)
  %gemm_fusion_dot.1 = f32[32,32]{1,0} fusion(%Arg_0.3, %Arg_1.3), kind=kCustom, \
calls=%gemm_fusion_dot.1_computation, \
backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %loop_tanh_fusion = f32[32,32]{1,0} fusion(%gemm_fusion_dot.1), kind=kLoop, calls=%fused_tanh
  %zero = f32[] constant(0)
  ROOT %sum = f32[] reduce(%loop_tanh_fusion, %zero), dimensions={0,1}, to_apply=%add
}
"""


def test_fusion_counts_follow_the_fusion_instructions_whatever_the_names():
    """Every computation a fusion instruction calls is a fused computation, also when the
    backend names it otherwise than `fused_...`; a reduce's computation is not one."""
    counts = fusion_counts(_GPU_STYLE_HLO)
    assert {k: v for k, v in counts.items() if k != "lines"} == {
        "computations": 4, "fused computations": 2, "fusion instructions": 2}
    # The largest fusion is the matmul's (three instructions), not the tanh's (two).
    lines = largest_fusion(_GPU_STYLE_HLO)
    assert lines[0].startswith("%gemm_fusion_dot.1_computation (")
    assert " dot(" in "".join(lines) and len(lines) == 5


def test_indexed_by_matches_the_first_axis_of_a_set_size():
    counts = {"grid_nodes": 100, "mesh_edges": 40, "mesh_nodes": 12, "grid2mesh_edges": 40}
    assert indexed_by((4, 12, 1, 32), counts) == "mesh_nodes"
    assert indexed_by((100, 1, 32), counts) == "grid_nodes"
    assert indexed_by((40, 1, 32), counts) == "mesh_edges or grid2mesh_edges"
    assert indexed_by((32, 32), counts) == NOT_A_GRAPH_SET


def test_bytes_by_graph_set_sums_each_set():
    df = pd.DataFrame({"shape": [(100, 1, 8), (100, 1, 4), (12, 1, 8), (8, 8)],
                       "bytes": [3200, 1600, 384, 256]})
    by_set = bytes_by_graph_set(df, {"grid_nodes": 100, "mesh_nodes": 12})
    assert by_set.to_dict() == {"grid_nodes": 4800, "mesh_nodes": 384, NOT_A_GRAPH_SET: 256}
    assert list(by_set.index)[0] == "grid_nodes"


def test_in_degree_counts_received_edges():
    g = build_graphs(10.0, 2)
    m2g = g.in_degree("mesh2grid")
    assert m2g.shape == (g.num_grid_nodes,) and (m2g == 3).all()
    g2m = g.in_degree("grid2mesh")
    assert g2m.shape == (g.num_mesh_nodes,) and g2m.sum() == g.grid2mesh.num_edges
    assert (g.in_degree("mesh") == np.bincount(g.mesh.receivers)).all()


def test_orthographic_puts_the_view_point_at_the_centre():
    lat0, lon0 = 30.0, 20.0
    la, lo = np.deg2rad(lat0), np.deg2rad(lon0)
    toward = np.array([[np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)]])
    x, y, visible = plots.orthographic(np.concatenate([toward, -toward]), lat0, lon0)
    np.testing.assert_allclose([x[0], y[0]], [0.0, 0.0], atol=1e-12)
    assert visible.tolist() == [True, False]


def test_plot_multimesh_draws_each_level_then_all():
    mesh = multimesh(2)
    fig = plots.plot_multimesh(mesh)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["level 0", "level 1", "level 2",
                                               "multimesh (all levels)"]
    # the last panel draws the edges of every level: as many lines as the three panels
    assert len(axes[3].lines) == sum(len(ax.lines) for ax in axes[:3])


def test_plot_graph_neighbourhood_draws_three_mesh2grid_edges():
    g = build_graphs(4.0, 3)
    fig = plots.plot_graph_neighbourhood(g)
    ax = fig.axes[0]
    assert "(red: 3)" in ax.get_title()
    red = [line for line in ax.lines if line.get_color() == "#d62728"]
    assert len(red) == 3


# --------------------------------------------------------------------------- collectives

_STAGES_HLO = """HloModule piped, entry_computation_layout={(s32[], f32[256]{0})->f32[256]{0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

%stage_0 (p.0: f32[256]) -> f32[256] {
  %p.0 = f32[256]{0} parameter(0)
  %head = f32[8]{0} slice(f32[256]{0} %p.0), slice={[0:8]}
  %ar.0 = f32[8]{0} all-reduce(f32[8]{0} %head), replica_groups={{0,1}}, to_apply=%add
  ROOT %r.0 = f32[256]{0} pad(f32[8]{0} %ar.0, f32[] %z), padding=0_248
}

%stage_1 (p.1: f32[256]) -> f32[256] {
  %p.1 = f32[256]{0} parameter(0)
  %ar.1 = f32[256]{0} all-reduce(f32[256]{0} %p.1), replica_groups={{0,1}}, to_apply=%add
  ROOT %cp.1 = f32[256]{0} collective-permute(f32[256]{0} %ar.1), source_target_pairs={{0,1}}
}

%stage_2 (p.2: f32[256]) -> f32[256] {
  %p.2 = f32[256]{0} parameter(0)
  %cp.2 = f32[512]{0} collective-permute(f32[512]{0} %w), source_target_pairs={{1,0}}
  ROOT %r.2 = f32[256]{0} slice(f32[512]{0} %cp.2), slice={[0:256]}
}

%ENTRY_BODY%
"""

_SWITCH = """ENTRY %main (i: s32[], x: f32[256]) -> f32[256] {
  %i = s32[] parameter(0)
  %x = f32[256]{0} parameter(1)
  ROOT %c = f32[256]{0} conditional(s32[] %i, X, X, X), BRANCHES
}""".replace("X", "f32[256]{0} %x").replace(
    "BRANCHES", "branch_computations={%stage_0, %stage_1, %stage_2}")

_COND = """ENTRY %main (q: pred[], x: f32[256]) -> f32[256] {
  %q = pred[] parameter(0)
  %x = f32[256]{0} parameter(1)
  ROOT %c = f32[256]{0} conditional(pred[] %q, X, X), BRANCHES
}""".replace("X", "f32[256]{0} %x").replace(
    "BRANCHES", "true_computation=%stage_0, false_computation=%stage_2")


def test_collective_bytes_of_a_switch_are_its_busiest_branch_per_kind():
    """A device runs one branch of a conditional (a pipeline's stages are the branches of a
    `lax.switch`): per kind, the most any branch moves, from every branch listed."""
    from gclab.measure import collective_bytes

    got = collective_bytes(_STAGES_HLO.replace("%ENTRY_BODY%", _SWITCH))
    # stage_1's all-reduce of 256 floats and stage_2's permute of 512, not stage_0's 8.
    assert got["all-reduce"] == 256 * 4 and got["collective-permute"] == 512 * 4
    assert got["total"] == 768 * 4
    # Two branches in `lax.cond`'s form.
    got = collective_bytes(_STAGES_HLO.replace("%ENTRY_BODY%", _COND))
    assert (got["all-reduce"], got["collective-permute"]) == (8 * 4, 512 * 4)


def test_collective_bytes_of_a_switch_in_a_loop_count_each_iteration():
    from gclab.measure import collective_bytes

    # The switch as the body of a loop of three iterations.
    looped = _SWITCH.replace("ENTRY %main", "%body") + "\n\n" + (
        "%cond (t: (s32[], f32[256])) -> pred[] {\n"
        "  ROOT %k = pred[] constant(true)\n}\n\n"
        "ENTRY %main (t: (s32[], f32[256])) -> (s32[], f32[256]) {\n"
        "  %t = (s32[], f32[256]{0}) parameter(0)\n"
        "  ROOT %w = (s32[], f32[256]{0}) while((s32[], f32[256]{0}) %t), condition=%cond, "
        'body=%body, backend_config={"known_trip_count":{"n":"3"}}\n}')
    got = collective_bytes(_STAGES_HLO.replace("%ENTRY_BODY%", looped))
    assert (got["all-reduce"], got["collective-permute"]) == (3 * 256 * 4, 3 * 512 * 4)


_SWITCH_WORKER = """
import jax
jax.config.update("jax_num_cpu_devices", 2)
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

def quiet(a):  # sums 4 floats over the devices
    return a + jax.lax.psum(a[:4], "x").sum()

def busy(a):  # sums all 256
    return a + jax.lax.psum(a, "x")

def per_device(a):
    return jax.lax.switch(jax.lax.axis_index("x"), (quiet, busy), a)

mesh = Mesh(jax.devices(), ("x",))
f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
print(f.lower(jax.ShapeDtypeStruct((2 * 256,), jnp.float32)).compile().as_text())
"""


def test_collective_bytes_of_a_compiled_switch_count_its_busier_branch():
    """A real partitioned program whose second branch sums more: its bytes, not the first's,
    whichever order the branches are listed in."""
    import re
    import subprocess
    import sys

    from gclab.measure import collective_bytes

    run = subprocess.run([sys.executable, "-c", _SWITCH_WORKER], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    hlo = run.stdout
    lists = re.findall(r"branch_computations=\{([^}]*)\}", hlo)
    assert lists and all("," in b for b in lists)
    got = collective_bytes(hlo)
    assert got["all-reduce"] == 256 * 4 == got["total"]

    def reverse(m: re.Match) -> str:
        return "branch_computations={" + ", ".join(reversed(m.group(1).split(", "))) + "}"

    assert collective_bytes(re.sub(r"branch_computations=\{([^}]*)\}", reverse, hlo)) == got
