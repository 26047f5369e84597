"""Tests of the memory instruments: measure, timeline, residuals, hostmem, plots."""

from __future__ import annotations

import functools
import logging
import os
import re

import matplotlib

matplotlib.use("Agg")

import haiku as hk  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from jax._src.ad_checkpoint import saved_residuals  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from gclab import plots  # noqa: E402
from gclab.measure import (  # noqa: E402
    CompiledMemory,
    Timeline,
    compile_fn,
    compiled_memory,
    format_bytes,
    label_op,
    measure_peak,
    memory_timeline,
    saved_residuals_df,
    summarize_residuals,
    track_host_memory,
)
from gclab.measure.timeline import TIMELINE_COMPILER_OPTIONS  # noqa: E402
from gclab.memory import MemoryConfig  # noqa: E402

#: Stated margin: the timeline peak lies in [(1 - MARGIN) * temp_bytes, temp_bytes].
TIMELINE_MARGIN = 0.05
S = jax.ShapeDtypeStruct
MiB = 2**20


def _toy(remat: bool, steps: int = 6, n: int = 512, d: int = 128):
    """Encoder / scanned processor / decoder toy with named scopes; grad and shapes."""

    def loss(params, x):
        we, wp, wd = params
        with jax.named_scope("encoder"):
            h = jnp.tanh(x @ we)

        def body(c, w):
            with jax.named_scope("processor"):
                c = c + jnp.tanh(c @ w) * jnp.sin(c)
            return c, None

        h, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, h, wp)
        with jax.named_scope("decoder"):
            y = jnp.tanh(h @ wd)
        return jnp.mean(y**2)

    params = (S((d, d), jnp.float32), S((steps, d, d), jnp.float32), S((d, d), jnp.float32))
    return loss, params, S((n, d), jnp.float32)


# ----------------------------------------------------------------------------- measure


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_bytes(None) == "n/a"


def test_compiled_memory_from_shapes_equals_from_arrays():
    loss, params, x = _toy(remat=False)
    grad = jax.grad(loss)
    from_shapes = compiled_memory(grad, params, x)
    arrays = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), (params, x))
    from_arrays = compiled_memory(grad, *arrays)
    assert isinstance(from_shapes, CompiledMemory)
    keys = ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "total_bytes")
    assert {k: from_shapes.to_dict()[k] for k in keys} == {
        k: from_arrays.to_dict()[k] for k in keys
    }
    args = sum(np.prod(s.shape) * 4 for s in (*params, x))
    assert from_shapes.argument_bytes == args
    grads = sum(np.prod(s.shape) * 4 for s in params)
    # Plus XLA's small index table of the output tuple.
    assert grads <= from_shapes.output_bytes <= grads + 256
    assert from_shapes.temp_bytes > 0 and from_shapes.backend == "cpu"
    assert compile_fn(grad, params, x).memory_analysis().temp_size_in_bytes == (
        from_shapes.temp_bytes
    )


def test_donation_shows_as_alias():
    """A donated argument's buffer is the output's: the total counts it once."""
    def double(a):
        return a * 2.0

    plain = compiled_memory(double, S((1024, 256), jnp.float32))
    mem = compiled_memory(double, S((1024, 256), jnp.float32), donate_argnums=0)
    assert plain.alias_bytes == 0 and mem.alias_bytes == 1024 * 256 * 4
    assert mem.total_bytes == plain.total_bytes - 1024 * 256 * 4


def test_remat_in_scan_lowers_temp():
    plain = compiled_memory(jax.grad(_toy(False)[0]), *_toy(False)[1:])
    remat = compiled_memory(jax.grad(_toy(True)[0]), *_toy(True)[1:])
    assert remat.temp_bytes < 0.75 * plain.temp_bytes


TARGET = "gclab.measure.targets:allocate"


def test_measure_peak_ok_on_cpu():
    nbytes = 64 * MiB
    result = measure_peak(TARGET, {"nbytes": nbytes}, timeout=120)
    assert result.status == "ok", result.message
    assert result.backend == "cpu"
    assert result.result == {"nbytes": nbytes, "checksum": 3.0}
    # Input and output of the jitted op are alive together: ~2x, never wildly off.
    assert 1.5 * nbytes <= result.peak_bytes <= 4 * nbytes
    assert result.wall_seconds > 0
    # Its peak resident set is an empty child's (the interpreter and JAX) with the arrays
    # on top: one read before the arrays exist, or after they are freed, would not be.
    empty = measure_peak(TARGET, {"nbytes": 4}, timeout=120)
    assert empty.status == "ok", empty.message
    assert result.peak_rss_bytes >= empty.peak_rss_bytes + nbytes


def test_measure_peak_error_and_oom():
    err = measure_peak("gclab.measure.targets:fail", {"message": "boom"}, timeout=120)
    assert err.status == "error" and "boom" in err.message
    oom = measure_peak("gclab.measure.targets:exhaust", {}, timeout=120)
    assert oom.status == "oom" and "RESOURCE_EXHAUSTED" in oom.message
    missing = measure_peak("gclab.measure.targets:no_such_function", {}, timeout=120)
    assert missing.status == "error"


def test_measure_peak_oom_by_budget():
    nbytes = 32 * MiB
    result = measure_peak(TARGET, {"nbytes": nbytes}, budget_bytes=nbytes, timeout=120)
    assert result.status == "oom"
    assert "budget" in result.message
    assert result.peak_bytes > nbytes
    roomy = measure_peak(TARGET, {"nbytes": nbytes}, budget_bytes=8 * nbytes, timeout=120)
    assert roomy.status == "ok"


# ---------------------------------------------------------------------------- timeline


@pytest.fixture(scope="module")
def toy_timeline():
    """`toy_timeline(remat)`: the timeline of the gradient of `_toy(remat)`, built once per
    process for the tests that read it."""
    @functools.cache
    def build(remat: bool) -> Timeline:
        loss, params, x = _toy(remat)
        return memory_timeline(jax.grad(loss), params, x)

    return build


@pytest.mark.parametrize("remat", [False, True])
def test_timeline_peak_matches_temp_bytes(remat, toy_timeline):
    loss, params, x = _toy(remat)
    timeline = toy_timeline(remat)
    # Compiled as a timeline is (XLA:CPU's default fusion emitters, which the tests' own
    # flags turn off elsewhere: tests/conftest.py).
    temp = compile_fn(jax.grad(loss), params, x, compiler_options=TIMELINE_COMPILER_OPTIONS
                      ).memory_analysis().temp_size_in_bytes
    assert isinstance(timeline, Timeline)
    assert timeline.temp_bytes == temp
    assert (1 - TIMELINE_MARGIN) * temp <= timeline.peak_bytes <= temp
    assert len(timeline.stage) == len(timeline.instruction) == len(timeline.live_bytes)
    stages = set(timeline.stages())
    for name in ("encoder", "processor", "decoder"):
        assert name in stages
    for name in ("processor", "encoder"):
        assert "backward: " + name in stages
    df = timeline.to_dataframe()
    assert list(df.columns) == ["point", "instruction", "stage", "op_name", "live_bytes"]
    assert df["live_bytes"].max() == timeline.peak_bytes
    # The forward rises to the peak, the backward falls from it.
    assert timeline.live_bytes[-1] < timeline.peak_bytes
    first_backward = min(
        i for i, s in enumerate(timeline.stage) if str(s).startswith("backward: ")
    )
    assert timeline.peak_index >= first_backward - 5


@pytest.mark.parametrize("remat", [False, True])
def test_timeline_names_the_buffers_live_at_its_peak(remat, toy_timeline):
    timeline = toy_timeline(remat)
    values = timeline.peak_values
    # One row per buffer, largest first, and together they are the peak.
    assert sum(v.bytes for v in values) == timeline.peak_bytes
    assert [v.bytes for v in values] == sorted((v.bytes for v in values), reverse=True)
    # Each names its HLO type, and its bytes are that type's size.
    width = {"f32": 4, "bf16": 2, "s32": 4, "pred": 1}
    for v in values:
        dtype, dims = v.shape.split("[")
        size = width[dtype] * int(np.prod([int(d) for d in dims.rstrip("]").split(",") if d]))
        assert v.bytes == size, v
    table = timeline.peak_table(top=2)
    assert list(table.columns) == ["instruction", "shape", "bytes", "stage", "op_name"]
    assert int(table["bytes"].sum()) == timeline.peak_bytes
    assert len(table) == min(3, len(values))


def _big_grad(x):
    return jax.grad(lambda y: jnp.sum(jnp.tanh(jnp.sin(y) @ jnp.cos(y)) ** 2))(x)


def _small_grad(x):
    return jax.grad(lambda y: jnp.sum(jnp.tanh(jnp.sin(y) @ jnp.cos(y)) ** 2))(x)


def _copy_dump(source, target, number: str) -> None:
    """The dump files under `source` into `target`, as module `number` of another process."""
    import pathlib
    import shutil

    pathlib.Path(target).mkdir(exist_ok=True)
    for path in pathlib.Path(source).rglob("module_*after_optimizations*.txt"):
        shutil.copy(path, pathlib.Path(target) / re.sub(r"^module_\d+", f"module_{number}",
                                                         path.name))


def test_timeline_kept_dump_reads_its_own_compile(tmp_path):
    """XLA numbers the modules it dumps per process: a folder shared by two processes holds
    two `module_0000`s, or another's module sorts after this one's. Each compile dumps into
    a fresh subfolder of `keep_dump`, and a dump of another module is never read."""
    from gclab.measure import timeline_from_dump
    from gclab.measure.timeline import compile_with_timeline

    big = memory_timeline(_big_grad, S((256, 256), jnp.float32), keep_dump=str(tmp_path / "a"))
    shared = tmp_path / "shared"
    _copy_dump(tmp_path / "a", shared, "9999")  # another process's, sorting last
    compiled, _, small = compile_with_timeline(_small_grad, S((32, 32), jnp.float32),
                                               keep_dump=str(shared))
    assert small.temp_bytes < big.peak_bytes
    assert 0 < small.peak_bytes <= small.temp_bytes
    assert os.path.dirname(small.dump_dir) == str(shared)
    assert os.path.basename(small.dump_dir).startswith("gclab_xla_dump_")
    assert big.dump_dir != small.dump_dir
    # Both in one folder: the module the HLO names is read, whichever sorts last.
    flat = tmp_path / "flat"
    _copy_dump(small.dump_dir, flat, "0000")
    _copy_dump(big.dump_dir, flat, "0001")
    again = timeline_from_dump(str(flat), compiled.as_text(), temp_bytes=small.temp_bytes)
    assert again.peak_bytes == small.peak_bytes
    # Without the HLO, the last one is read: its peak exceeds this compile's temp bytes.
    with pytest.raises(ValueError, match=r"is not this compile's: its peak of \d+ B "
                                         rf"exceeds temp_bytes={small.temp_bytes} B"):
        timeline_from_dump(str(flat), temp_bytes=small.temp_bytes)
    with pytest.raises(FileNotFoundError, match="of module jit_other"):
        timeline_from_dump(str(flat), "HloModule jit_other, is_scheduled=true\n")
    # A name too long for a dump file's name: XLA writes none, and another module's files
    # must not stand in for them.
    long = "jit_" + "x" * 200
    with pytest.raises(FileNotFoundError, match=f"of module {long} .*its name has 204 "
                                                "characters"):
        timeline_from_dump(str(flat), f"HloModule {long}, is_scheduled=true\n")


def test_timeline_sees_remat_saving(toy_timeline):
    plain, remat = toy_timeline(False), toy_timeline(True)
    assert remat.peak_bytes < 0.75 * plain.peak_bytes


def _step_order(stages, prefix):
    """Steps labelled `prefix + i`, ordered by the median position of their points (XLA
    may schedule a few independent ops of a step, e.g. slicing its weights, early)."""
    points: dict[int, list[int]] = {}
    for i, s in enumerate(stages):
        if s.startswith(prefix) and s[len(prefix):].isdigit():
            points.setdefault(int(s[len(prefix):]), []).append(i)
    return sorted(points, key=lambda k: np.median(points[k]))


@pytest.mark.parametrize(
    "memory",
    [MemoryConfig(), MemoryConfig(processor_remat="every", remat_group_size=2,
                                  checkpoint_encoder=True),
     MemoryConfig(processor_remat="nested", remat_group_size=2, processor_edge_blocks=True,
                  edge_block_size=2000)],
    ids=["none", "every-2", "nested-2-blocks"],
)
def test_timeline_attributes_processor_steps(memory, tmp_path):
    """Unrolled, the timeline of gclab's loss and gradient names every processor step,
    forward in order and backward in reverse, with the peak of XLA's (rolled) schedule.
    (The gradient without the optimizer's update: the update adds no processor step, and
    leaving it out halves the compile.)"""
    import dataclasses

    from gclab.config import PRESETS
    from gclab.measure import timeline_from_dump
    from gclab.sizing import StepSpec, loss_grad_abstract

    preset = PRESETS["cpu-4x32"]
    steps = 5  # groups of two and a remainder of one under "every"/"nested"
    model = dataclasses.replace(preset.model, processor_steps=steps, latent_size=16)
    loss, args = loss_grad_abstract(StepSpec(model, preset.task, memory))
    unrolled = memory_timeline(jax.grad(loss), *args, keep_dump=str(tmp_path))
    rolled = timeline_from_dump(unrolled.dump_dir, unroll_loops=False,
                                temp_bytes=unrolled.temp_bytes)
    assert unrolled.unrolled and not rolled.unrolled
    assert len(unrolled) > len(rolled)
    assert unrolled.peak_bytes == rolled.peak_bytes
    assert unrolled.peak_bytes <= unrolled.temp_bytes  # the margin: tests above
    assert _step_order(unrolled.stage, "processor step ") == list(range(steps))
    # The backward runs the steps in reverse.
    backward = _step_order(unrolled.stage, "backward: processor step ")
    assert backward == list(range(steps))[::-1]
    assert not any("step" in s for s in rolled.stages())
    assert unrolled.loops_note == rolled.loops_note == ""
    # Where a backend's program keeps no trip count, the timeline says so instead of
    # numbering nothing in silence.
    import glob

    (hlo,) = [f for f in glob.glob(os.path.join(unrolled.dump_dir, "*after_optimizations.txt"))]
    with open(hlo) as f:
        text = re.sub(r'"known_trip_count":\{"n":"\d+"\},?', "", f.read())
    blind = timeline_from_dump(unrolled.dump_dir, text, temp_bytes=unrolled.temp_bytes)
    assert not blind.unrolled and not any("step" in s for s in blind.stages())
    assert re.fullmatch(r"none of its \d+ while loops has a trip count XLA knows",
                        blind.loops_note)
    # Every iteration repeats the bytes XLA planned for its loop body.
    df = unrolled.to_dataframe()
    per_step = df[df.stage.str.fullmatch(r"processor step \d")].groupby("stage").live_bytes
    if memory.processor_remat == "none":
        assert per_step.max().nunique() == 1


def test_label_op_rules():
    assert label_op("jvp(grid2mesh_gnn)/dot_general") == "encoder"
    assert label_op("transpose(jvp(mesh_gnn))/while/body/mul") == "backward: processor"
    assert label_op("jvp(mesh2grid_gnn/~/linear)/add") == "decoder"
    assert label_op("jvp(processor_step_3)/add") == "processor step 3"
    assert label_op("jvp()/broadcast_in_dim") is None
    assert label_op("jvp(foo)/x", [("foo", "custom")]) == "custom"


# --------------------------------------------------------------------------- residuals


class _Block(hk.Module):
    def __call__(self, x):
        return jax.nn.relu(hk.Linear(32)(x))


class _Processor(hk.Module):
    def __call__(self, x):
        return hk.layer_stack(3)(lambda h: h + jnp.tanh(hk.Linear(32)(h)))(x)


def _haiku_loss():
    def net(x):
        x = _Block(name="grid2mesh_gnn")(x)
        x = _Processor(name="mesh_gnn")(x)
        x = _Block(name="mesh2grid_gnn")(x)
        return jnp.mean(x**2)

    model = hk.transform(net)
    x = jnp.ones((64, 16))
    params = model.init(jax.random.PRNGKey(0), x)
    return (lambda p, xx: model.apply(p, None, xx)), params, x


def test_residuals_grouped_by_module():
    loss, params, x = _haiku_loss()
    df = saved_residuals_df(loss, params, x)
    assert list(df.columns[:5]) == ["module", "shape", "dtype", "bytes", "description"]
    expected = sum(
        int(np.prod(aval.shape)) * aval.dtype.itemsize
        for aval, _ in saved_residuals(loss, params, x)
    )
    assert df["bytes"].sum() == expected
    modules = set(df["module"])
    assert {"grid2mesh_gnn", "mesh_gnn", "mesh2grid_gnn", "inputs/params"} <= modules
    # The scanned processor stacks its residuals over the 3 layers.
    stacked = df[df["module"] == "mesh_gnn"]["shape"]
    assert any(len(s) == 3 and s[0] == 3 for s in stacked)
    summary = summarize_residuals(df)
    assert summary["bytes"].sum() == expected
    assert summary["bytes"].is_monotonic_decreasing
    assert summary.loc[0, "module"] == "mesh_gnn"
    no_args = summarize_residuals(df, include_arguments=False)
    assert "inputs/params" not in set(no_args["module"])


def test_residuals_shrink_with_remat():
    loss, params, x = _toy(remat=False, n=64, d=32)
    loss_r, _, _ = _toy(remat=True, n=64, d=32)
    plain = saved_residuals_df(loss, params, x)
    remat = saved_residuals_df(loss_r, params, x)
    assert remat["bytes"].sum() < plain["bytes"].sum()


# ---------------------------------------------------------------------------- hostmem


def test_hostmem_peak_covers_numpy_array():
    nbytes = 40 * MiB
    with track_host_memory() as host:
        array = np.ones(nbytes // 8)
        array += 1
        del array
    assert host.peak_bytes >= nbytes
    assert host.peak_bytes < 3 * nbytes
    assert list(host.snapshots.columns) == ["time_s", "heap_bytes", "rss_bytes"]
    assert len(host.snapshots) >= 1
    top = host.top_allocations(3)
    assert top["bytes"].iloc[0] <= host.peak_bytes


# ------------------------------------------------------------------------------ plots


def _save(fig: Figure, tmp_path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    fig.savefig(path)
    assert path.stat().st_size > 1000


def test_plot_timeline(tmp_path):
    loss, params, x = _toy(remat=False, n=64, d=32)
    plain = memory_timeline(jax.grad(loss), params, x, name="plain")
    remat = memory_timeline(jax.grad(_toy(True, n=64, d=32)[0]), params, x, name="remat")
    fig = plots.plot_timeline(plain)
    ax = fig.axes[0]
    runs = sum(
        1 for i in range(len(plain.stage)) if i == 0 or plain.stage[i] != plain.stage[i - 1]
    )
    assert len(ax.collections) == runs
    assert len(ax.lines) == 2  # the timeline and its temp_bytes line
    assert "MiB" in ax.yaxis.get_major_formatter()(2 * MiB, 0)
    _save(fig, tmp_path, "timeline")
    both = plots.plot_timeline([plain, remat], labels=["before", "after"])
    assert len(both.axes[0].lines) == 4
    texts = [t.get_text() for t in both.axes[0].get_legend().get_texts()]
    assert any(t.startswith("before") for t in texts) and any(t.startswith("after") for t in texts)
    _save(both, tmp_path, "timeline2")


def test_plot_residuals(tmp_path):
    df = pd.DataFrame(
        {"module": ["a", "b", "a", "inputs/params"], "bytes": [10, 20, 30, 5]}
    )
    fig = plots.plot_residuals(df)
    assert len(fig.axes[0].patches) == 3
    assert len(plots.plot_residuals(df, include_arguments=False).axes[0].patches) == 2
    _save(fig, tmp_path, "residuals")


def test_plot_tradeoff(tmp_path):
    df = pd.DataFrame(
        {
            "recipe": ["none", "remat", "remat", "bf16"],
            "step_seconds": [1.0, 1.3, 1.4, 0.8],
            "peak_bytes": [4 * 2**30, 2 * 2**30, 2.1 * 2**30, 3 * 2**30],
        }
    )
    fig = plots.plot_tradeoff(df)
    assert len(fig.axes[0].collections) == 3
    _save(fig, tmp_path, "tradeoff")


def test_plot_guarded_heatmap_labels_a_cell_that_did_not_fit_with_its_plan():
    df = pd.DataFrame([
        {"latent_size": latent, "processor_steps": steps, "temp_bytes": latent * steps * MiB,
         "total_bytes": 2 * latent * steps * MiB, "fits": (latent, steps) != (512, 8)}
        for latent in (128, 512) for steps in (4, 8)])
    fig = plots.plot_guarded_heatmap(df)
    texts = {t.get_position(): t.get_text() for t in fig.axes[0].texts}
    assert texts[(1, 1)] == "needs\n" + format_bytes(2 * 512 * 8 * MiB, 1)  # its plan
    assert texts[(0, 0)] == format_bytes(128 * 4 * MiB, 1)  # a cell that ran: its temp
    assert sum(t.startswith("needs") for t in texts.values()) == 1


def test_plot_heatmap_marks_oom(tmp_path):
    rows = []
    for latent in (128, 256, 512):
        for steps in (4, 8):
            rows.append(
                {
                    "latent_size": latent,
                    "processor_steps": steps,
                    "temp_bytes": latent * steps * MiB,
                    "status": "oom" if (latent, steps) == (128, 4) else "ok",
                }
            )
    df = pd.DataFrame(rows)
    fig = plots.plot_heatmap(df, budget_bytes=2048 * MiB)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 6
    # (128, 4) by status; (512, 8) = 4096 MiB over budget; the others fit.
    assert sum(t.startswith("OOM") for t in texts) == 2
    assert len(fig.axes) == 2  # the heatmap and its colour bar
    _save(fig, tmp_path, "heatmap")
    # Nothing fits: every cell is marked, and there is no colour scale to read.
    none_fit = plots.plot_heatmap(df, budget_bytes=1 * MiB)
    assert all(t.get_text().startswith("OOM") for t in none_fit.axes[0].texts)
    assert len(none_fit.axes) == 1


def test_bytes_axis_ticks_are_round_binary_numbers():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 470 * MiB])
    plots.bytes_axis(ax.yaxis)
    fig.canvas.draw()
    ticks = [t for t in ax.get_yticks() if 0 <= t <= 470 * MiB]
    assert len(ticks) >= 3
    assert all(t % (50 * MiB) == 0 for t in ticks), [t / MiB for t in ticks]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "100 MiB" in labels or "200 MiB" in labels, labels
    plt.close(fig)


def test_bytes_axis_log_ticks_are_powers_of_four():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.loglog([1e4, 1e7], [300 * MiB, 70 * 1024 * MiB])
    plots.bytes_axis(ax.yaxis)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    assert len(ticks) >= 3
    assert all(np.log2(t) % 2 == 0 for t in ticks), ticks  # 256 MiB, 1 GiB, 4 GiB, ...
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "1 GiB" in labels and "16 GiB" in labels, labels
    plt.close(fig)


def test_plot_fit_chart(tmp_path):
    df = pd.DataFrame(
        {"config": ["small", "medium", "large"], "total_bytes": [8e9, 30e9, 120e9]}
    )
    fig = plots.plot_fit_chart(df, cards=(16, 24, 40, 80))
    ax = fig.axes[0]
    assert len(ax.lines) == 4
    # Cards in GB of 10^9 bytes, as the planner counts them.
    assert sorted(line.get_ydata()[0] for line in ax.lines) == [
        g * 1e9 for g in (16, 24, 40, 80)
    ]
    assert len(ax.patches) == 3
    red = matplotlib.colors.to_rgba("#d62728")
    assert ax.patches[2].get_facecolor() == red  # 120 GB fits no card
    assert ax.patches[0].get_facecolor() != red
    _save(fig, tmp_path, "fit")


def test_fit_chart_card_labels_in_gib_and_apart():
    """The book's card lines are labelled in GiB, as the axis, and close limits do not
    overlap (the T4's and the L4's on the 0.25 degree chart)."""
    import matplotlib.pyplot as plt

    from gclab import devices

    cards = plots.plan_limits_gb()
    for name, gb in cards.items():
        card = name.split(":")[0]
        limit = devices.FIT_MARGIN * devices.card_usable_bytes(card)
        assert gb == limit / 1e9 and name == f"{card}: {format_bytes(limit)}", name
    df = pd.DataFrame({"config": ["small", "huge"], "total_bytes": [5e9, 360e9]})
    fig = plots.plot_fit_chart(df, cards=cards)
    fig.canvas.draw()
    text = matplotlib.text.Text.get_window_extent  # the label alone, not its stroke
    boxes = sorted((text(t) for t in fig.axes[0].texts), key=lambda b: b.y0)
    assert len(boxes) == len(cards)
    assert all(a.y1 <= b.y0 + 0.5 for a, b in zip(boxes, boxes[1:])), boxes
    plt.close(fig)


def test_stage_colors_fixed():
    assert plots.stage_color("encoder") == plots.STAGE_COLORS["encoder"]
    assert plots.stage_color("processor step 2") == plots.STAGE_COLORS["processor"]
    assert plots.stage_color("backward: encoder") != plots.stage_color("encoder")


def test_one_compile_gives_memory_timeline_and_a_runnable_step(caplog):
    """`compile_train_step` compiles once for real arrays: its memory equals the figure from
    shapes alone, its timeline agrees with it, and the step runs and returns its metrics."""
    import dataclasses

    from gclab.config import PRESETS
    from gclab.sizing import StepSpec, compile_train_step

    preset = PRESETS["cpu-4x32"]
    model = dataclasses.replace(preset.model, latent_size=16, processor_steps=2)
    spec = StepSpec(model, preset.task, MemoryConfig(processor_remat="step"))
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        step = compile_train_step(spec, timeline=True, live=True)
    compiled = re.findall(r"Compiling (jit\(\w+\))", caplog.text)
    assert "jit(step)" in compiled
    # The random state and batch are drawn on the host: no random kernel is compiled for them.
    assert not [name for name in compiled if "normal" in name or "threefry_split" in name]
    # From shapes with a timeline too: a timeline compile keeps XLA:CPU's default emitters,
    # which the tests' flags turn off for other compiles (tests/conftest.py).
    assert step.memory.temp_bytes == compile_train_step(spec, timeline=True).memory.temp_bytes
    plain = compile_train_step(spec)
    assert plain.timeline is None and plain.run is None
    assert abs(step.memory.temp_bytes - plain.memory.temp_bytes) <= 0.01 * step.memory.temp_bytes
    assert step.timeline.temp_bytes == step.memory.temp_bytes
    assert step.timeline.peak_bytes <= step.memory.temp_bytes
    # Read with the default emitters although the tests' flags turn them off: 1,446 points
    # here, against 1,663,910 in the older emitter's dump of the same step.
    assert len(step.timeline) < 20_000
    assert any(s.startswith("processor step") for s in step.timeline.stages())
    metrics = step.run()
    # A mean square error of a network on random inputs and random targets: finite and
    # positive (a NaN or a zero loss is a step that computed nothing useful); host values.
    assert set(metrics) == {"loss", "grad_norm"}
    assert all(isinstance(v, np.ndarray) for v in metrics.values())
    assert np.isfinite(metrics["loss"]) and metrics["loss"] > 0
    assert np.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    # Again, on the state the first call left: the state it starts from is the optimizer's
    # own (zero moments), so later steps stay finite and their times are those of real steps.
    for _ in range(2):
        again = step.run()
        assert np.isfinite(again["loss"]) and np.isfinite(again["grad_norm"]), again


# The step that uses every technique (`lean`: nested remat, edge blocks in every stage,
# streamed grid nodes, gather after matmul, whole-stage checkpoints), so every kind of loop
# and fusion the techniques make is in it. It costs an LLVM-optimised compile (55 s in a full
# test run on two cores); the plainest step (`none`, 28 s) adds no kind of program to it.
@pytest.mark.parametrize("recipe", ["lean"])
def test_plan_only_compile_keeps_the_memory_plan(recipe):
    """Compiles that are only read skip LLVM's optimisation; XLA's buffer assignment comes
    before it, so every memory figure is unchanged (both levels set per compile, with
    XLA:CPU's default fusion emitters, as a reader's compile has them). They also use the
    older fusion emitter (`PLAN_ONLY_CPU_OPTIONS`, which the tests' `XLA_FLAGS` set for
    every compile), which changes the compiled temp by less than 1%."""
    import dataclasses

    from gclab.config import PRESETS
    from gclab.measure.compiled import DEFAULT_CPU_OPTIONS, PLAN_ONLY_CPU_OPTIONS
    from gclab.memory import get_recipe
    from gclab.sizing import StepSpec, train_step_abstract

    preset = PRESETS["cpu-4x32"]
    model = dataclasses.replace(preset.model, latent_size=16, processor_steps=3)
    memory = get_recipe(recipe)
    if memory.edge_block_size is not None:
        memory = memory.replace(edge_block_size=500)
    step, args = train_step_abstract(StepSpec(model, preset.task, memory))
    # XLA's defaults, and the same with the level `plan_only_options` sets.
    default = compile_fn(step, *args, compiler_options=DEFAULT_CPU_OPTIONS)
    plan = compile_fn(step, *args,
                      compiler_options={**DEFAULT_CPU_OPTIONS, "xla_backend_optimization_level": 0})
    plan_only = compile_fn(step, *args, compiler_options=PLAN_ONLY_CPU_OPTIONS)
    assert (abs(plan_only.memory_analysis().temp_size_in_bytes
                - plan.memory_analysis().temp_size_in_bytes)
            <= 0.01 * plan.memory_analysis().temp_size_in_bytes)
    for field in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
                  "alias_size_in_bytes"):
        assert (getattr(plan.memory_analysis(), field)
                == getattr(default.memory_analysis(), field)), field
    # Both levels took effect: the same optimised HLO, other machine code.
    from jax.experimental.serialize_executable import serialize

    assert plan.as_text() == default.as_text()
    assert serialize(plan)[0] != serialize(default)[0]


def test_plan_only_options_set_what_xla_flags_do_not(monkeypatch):
    """On CPU, `plan_only_options` turns LLVM's optimisation and the MLIR fusion emitters
    off, each unless `XLA_FLAGS` already do (the last setting of a flag counts); where
    they do both, it sets nothing. With `same_hlo`, it sets LLVM's level only."""
    from gclab.measure import plan_only_options

    level, emitters = "--xla_backend_optimization_level", "--xla_cpu_use_fusion_emitters"
    both = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
    only_emitters = {"xla_cpu_use_fusion_emitters": False}
    only_level = {"xla_backend_optimization_level": 0}
    for flags, options in (("", both), ("--xla_cpu_enable_fast_math=false", both),
                           (f"{level}=0", only_emitters), (f"{level}=2", both),
                           (f"{level}=0 {level}=2", both), (f"{level}=2 {level}=0", only_emitters),
                           (f"{emitters}=false", only_level), (f"{emitters}=0", only_level),
                           (f"{emitters}=true", both), (f"{emitters}=false {emitters}=True", both),
                           (f"{level}=0 {emitters}=False", None)):
        monkeypatch.setenv("XLA_FLAGS", flags)
        assert plan_only_options() == options, flags
        assert plan_only_options(same_hlo=True) == (
            None if options is None or "xla_backend_optimization_level" not in options
            else only_level), flags


def test_a_step_compiled_to_read_and_one_compiled_to_run_share_one_cache_entry(tmp_path):
    """Under the tests' flags a plan-only step and the same step compiled to run are one
    compile: the second is read from JAX's persistent compilation cache (which every test
    process uses, tests/conftest.py). The cache here is an empty one of this test's own, so
    the first compile is written to it, and a hit on the second is the first one's entry."""
    import dataclasses

    import jax.monitoring
    from jax.experimental.compilation_cache import compilation_cache

    from gclab.config import PRESETS
    from gclab.sizing import StepSpec, compile_train_step

    preset = PRESETS["cpu-4x32"]
    model = dataclasses.replace(preset.model, latent_size=8, processor_steps=2)
    spec = StepSpec(model, preset.task, MemoryConfig(checkpoint_decoder=True))
    events = []

    def listen(event, **kwargs):
        if event in ("/jax/compilation_cache/compile_requests_use_cache",
                     "/jax/compilation_cache/cache_hits"):
            events.append(event.rsplit("/", 1)[1])

    shared = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    compilation_cache.reset_cache()  # the next compile opens this test's cache
    jax.monitoring.register_event_listener(listen)
    try:
        planned = compile_train_step(spec)  # read only
        first = list(events)
        events.clear()
        live = compile_train_step(spec, live=True)
    finally:
        jax.monitoring.unregister_event_listener(listen)
        jax.config.update("jax_compilation_cache_dir", shared)
        compilation_cache.reset_cache()
    # The planned compile missed (its step and the small programs that build its inputs,
    # whichever this process had not yet compiled); every compile the live one asked of the
    # cache was found there.
    assert first and "cache_hits" not in first, "the planned step was not compiled afresh"
    requests, hits = events.count("compile_requests_use_cache"), events.count("cache_hits")
    assert hits == requests >= 1, "the step compiled to run was compiled again"
    assert live.memory.temp_bytes == planned.memory.temp_bytes
    live.run()


def test_plot_layout_memory_draws_each_layout_and_the_even_split():
    df = pd.DataFrame({"layout": ["spatial"] * 4 + ["data"],
                       "devices": [1, 2, 4, 8, 8],
                       "temp / device": [800 * MiB, 400 * MiB, 210 * MiB, 110 * MiB, 800 * MiB]})
    fig = plots.plot_layout_memory(df, 800 * MiB)
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["spatial", "data", "1 / D of one device"]
    assert list(lines[-1].get_ydata()) == [800 * MiB, 100 * MiB]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1", "2", "4", "8"]
    assert fig.axes[0].get_xticklabels(minor=True) == []


def test_plot_stage_memory_groups_bars_by_stage_and_refuses_uneven_choices():
    fig = plots.plot_stage_memory({"one ratio": [5 * MiB, 1 * MiB, 6 * MiB],
                                   "MILP": [5 * MiB, 4 * MiB, 5 * MiB]}, 5.5 * MiB)
    ax = fig.axes[0]
    assert len(ax.patches) == 6 and ax.get_lines()[0].get_ydata()[0] == 5.5 * MiB
    with pytest.raises(ValueError, match="same number of stages"):
        plots.plot_stage_memory({"a": [1.0], "b": [1.0, 2.0]}, 1.0)


@pytest.mark.parametrize("platform", ["cpu", "cuda", "rocm", "tpu"])
def test_a_timeline_names_xla_cpu_options_only_on_the_cpu(platform, monkeypatch):
    # XLA:GPU refuses a compile naming an XLA:CPU option ("No such compile option"), which
    # broke every timeline the chapters drew on a GPU.
    from gclab.measure import timeline as timeline_module

    seen = {}

    class Stop(Exception):
        pass

    def capture(fn, args, kwargs, static_argnums, donate_argnums, options):
        seen.update(options)
        raise Stop

    monkeypatch.setattr(timeline_module, "platform_of", lambda device: platform)
    monkeypatch.setattr(timeline_module, "compile_timed", capture)
    with pytest.raises(Stop):
        timeline_module.compile_with_timeline(jnp.sin, jax.ShapeDtypeStruct((4,), jnp.float32),
                                              compiler_options={"xla_gpu_option": 1})
    named = {k for k in seen if k.startswith("xla_cpu_")}
    assert named == (set(TIMELINE_COMPILER_OPTIONS) if platform == "cpu" else set())
    assert seen["xla_gpu_option"] == 1 and seen["xla_dump_hlo_as_text"] is True


def test_timeline_compiler_options_refuses_a_platform_that_is_not_a_name():
    from gclab.config import WrongType
    from gclab.measure.timeline import timeline_compiler_options

    with pytest.raises(WrongType, match="platform"):
        timeline_compiler_options(None)


def test_options_an_xla_build_lacks_are_left_out(monkeypatch):
    # jax 0.11.2's XLA refuses xla_cpu_use_fusion_emitters, which jax 0.10's reads: a plan
    # or a timeline naming an option the build lacks would fail to compile at all.
    import types

    from gclab.measure import compiled, known_options, plan_only_options
    from gclab.measure import timeline as timeline_module
    from gclab.measure.compiled import compile_option_known

    assert compile_option_known("xla_backend_optimization_level", 0, "cpu")
    assert not compile_option_known("xla_cpu_gclab_option_xla_lacks", True, "cpu")
    gone = {"xla_cpu_gclab_option_xla_lacks": True}
    assert known_options({**gone, "xla_backend_optimization_level": 0}, "cpu") == {
        "xla_backend_optimization_level": 0}
    assert known_options(None, "cpu") == {}
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setattr(compiled, "PLAN_ONLY_CPU_OPTIONS", types.MappingProxyType(
        {**gone, "xla_backend_optimization_level": 0}))
    assert plan_only_options() == {"xla_backend_optimization_level": 0}
    monkeypatch.setattr(compiled, "PLAN_ONLY_CPU_OPTIONS", types.MappingProxyType(gone))
    assert plan_only_options() is None
    monkeypatch.setattr(timeline_module, "TIMELINE_COMPILER_OPTIONS",
                        types.MappingProxyType(gone))
    assert timeline_module.timeline_compiler_options("cpu") == {}
    # The timeline of a step still compiles (and its points are read) without it.
    loss = jax.grad(lambda x: jnp.sin(x).sum())
    assert memory_timeline(loss, jax.ShapeDtypeStruct((8,), jnp.float32)).peak_bytes >= 0
