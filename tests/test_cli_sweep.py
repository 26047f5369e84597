"""`gclab sweep` (and the recipes every command shares): one recipe is one step in every
command, an interrupted sweep keeps its rows, measured and timed rows say what they
measured, and a repeated value is swept once.

Most tests replace the row's work (`gclab.sizing.sweep._one`) with fixed figures: what is
checked is what the command does with rows, not XLA's compile.
"""

from __future__ import annotations

import importlib
import json

import pytest

from gclab import cli
from gclab.sizing.sweep import load_sweep

# The module (`gclab.sizing.sweep` is also the name of its function there).
sweep_lib = importlib.import_module("gclab.sizing.sweep")

# 10 deg / 2 splits, 2 steps x 16: the smallest step that compiles in a few seconds.
SMALL = ["--resolution", "10", "--mesh-splits", "2"]
SMALL_NET = SMALL + ["--latent", "16", "--steps", "2"]
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch):
    monkeypatch.delenv(cli.SWEEP_CACHE_ENV, raising=False)


def _fixed_rows(monkeypatch, row: dict, stop_at=None) -> list:
    """Makes every sweep row `row` (a copy), and Ctrl-C come in row `stop_at` (from 0);
    returns the specs asked for, in order."""
    asked = []

    def one(spec, measure, timeout, repeats):
        if len(asked) == stop_at:
            raise KeyboardInterrupt
        asked.append(spec)
        return dict(row)

    monkeypatch.setattr(sweep_lib, "_one", one)
    return asked


COMPILED = {"status": "ok", "message": "", "argument_bytes": MiB, "output_bytes": MiB,
            "temp_bytes": 2 * MiB, "total_bytes": 3 * MiB, "alias_bytes": MiB,
            "compile_seconds": 0.5}
MEASURED = {"status": "ok", "message": "", "peak_bytes": 5 * MiB, "peak_rss_bytes": None,
            "measure_status": "ok", "measure_message": "", "step_seconds": 0.0123}


def test_a_recipe_is_the_same_step_in_memory_and_sweep_over_a_rollout(tmp_path, capsys):
    """`memory --recipe per-step --rollout 2` checkpointed each rollout step and `sweep
    --recipes per-step --rollout 2` did not: one name, two steps, two sizes (and `memory`
    called its step custom). Both are now `per-step+rollout remat`, of the same bytes."""
    assert cli.main(["memory", *SMALL_NET, "--rollout", "2", "--recipe", "per-step",
                     "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)
    out = tmp_path / "sweep.json"
    assert cli.main(["sweep", *SMALL, "--latents", "16", "--steps-list", "2", "--rollout", "2",
                     "--recipes", "per-step", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert memory["memory.rollout_remat"] is row["memory.rollout_remat"] is True
    assert memory["total_bytes"] == row["total_bytes"]
    assert memory["technique"] == row["technique"] == "per-step+rollout remat"
    assert "per-step+rollout remat" in capsys.readouterr().out


def test_recipe_labels_name_the_recipe_and_what_the_options_changed():
    from gclab.sizing.step import recipe_label, recipe_memory

    def label(name, **options):
        return recipe_label(name, recipe_memory(name, **options))

    assert label("per-step", rollout=3) == "per-step+rollout remat"
    assert label("none", rollout=3) == "none"  # no technique at all, over any rollout
    assert label("none", remat="every:2") == "none+remat every:2"
    assert label("lean", remat="every:2") == "lean+remat every:2"
    assert label("lean", edge_block=0) == "lean+no edge blocks"
    assert label("deepmind", precision="bf16", edge_block=64) == "deepmind+edge block 64"
    # The same techniques asked for by two names keep the name asked for.
    assert label("none", remat="step") == "none+remat step"
    assert label("per-step") == "per-step"


def test_timeline_tells_recipes_apart_under_the_same_options(monkeypatch, tmp_path, capsys):
    """`--recipe none,lean --remat every:2` labelled both lines and both curves `custom (f32,
    remat every:2)`."""
    import gclab.plots

    drawn = []

    class Figure:  # what the command saves: the labels are what is checked
        def savefig(self, path, **kwargs):
            open(path, "wb").close()

    def plot_timeline(timelines, labels=None):
        drawn.extend(labels)
        return Figure()

    monkeypatch.setattr(gclab.plots, "plot_timeline", plot_timeline)
    assert cli.main(["timeline", *SMALL_NET, "--recipe", "none,lean", "--remat", "every:2",
                     "--plot", str(tmp_path / "t.png")]) == 0
    assert drawn == ["none+remat every:2 (f32)", "lean+remat every:2 (f32)"]
    lines = [line for line in capsys.readouterr().out.splitlines() if "peak" in line]
    assert [label in line for label, line in zip(drawn, lines)] == [True, True]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_an_interrupted_sweep_writes_the_rows_it_completed(suffix, monkeypatch, tmp_path,
                                                          capsys):
    """Ctrl-C in the third of four rows lost the two done: --out was written at the end only.
    Now they are written (a whole file load_sweep reads), the others listed as not run."""
    asked = _fixed_rows(monkeypatch, COMPILED, stop_at=2)
    out = tmp_path / f"sweep{suffix}"
    assert cli.main(["sweep", *SMALL, "--latents", "8,16", "--steps-list", "2",
                     "--recipes", "none,lean", "--out", str(out)]) == 130
    done = load_sweep(out)
    assert list(done["technique"]) == ["none", "lean"] and len(asked) == 2
    assert list(done["model.latent_size"]) == [8, 8]
    assert list(done["total_bytes"]) == [3 * MiB, 3 * MiB]
    captured = capsys.readouterr()
    not_run = [line.split() for line in captured.out.splitlines() if "not run" in line]
    assert not_run == [["2", "x", "16", "none", "not", "run"],
                       ["2", "x", "16", "lean", "not", "run"]]
    assert captured.err.splitlines()[-1] == (
        f"gclab sweep: interrupted after 2 of 4 rows; wrote them to {out}; the 2 rows marked "
        "'not run' above were not run")


def test_a_sweep_interrupted_in_its_first_row_keeps_an_earlier_file(monkeypatch, tmp_path,
                                                                    capsys):
    _fixed_rows(monkeypatch, COMPILED, stop_at=0)
    out = tmp_path / "sweep.json"
    out.write_text("[]\n")
    assert cli.main(["sweep", *SMALL, "--latents", "8", "--steps-list", "2", "--recipes",
                     "none", "--out", str(out)]) == 130
    assert out.read_text() == "[]\n"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"gclab sweep: interrupted after 0 of 1 rows; nothing was written to --out {out}; the "
        "1 row marked 'not run' above was not run")


def test_a_measured_sweep_prints_and_draws_its_peak_and_step_time(monkeypatch, tmp_path,
                                                                  capsys):
    """`--measure measured` printed `total n/a temp n/a` and drew an empty chart of compiled
    bytes (axis `0 B`, `-0 B`): a measured sweep has only the peak and the step time."""
    import gclab.plots

    _fixed_rows(monkeypatch, MEASURED)
    drawn = []
    real = gclab.plots.plot_sweep

    def plot_sweep(df, **kwargs):
        fig = real(df, **kwargs)
        drawn.append(fig)
        return fig

    monkeypatch.setattr(gclab.plots, "plot_sweep", plot_sweep)
    plot = tmp_path / "sweep.png"
    assert cli.main(["sweep", *SMALL, "--latents", "8,16", "--steps-list", "2", "--recipes",
                     "none", "--measure", "measured", "--out", str(tmp_path / "s.json"),
                     "--plot", str(plot)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if " x " in line]
    assert len(rows) == 2 and all(r.endswith("peak 5.00 MiB step 12.3 ms ok") for r in rows)
    assert "n/a" not in "".join(rows)
    (ax,) = drawn[0].axes
    assert list(ax.lines[0].get_ydata()) == [5 * MiB, 5 * MiB]
    assert ax.get_ylabel() == "peak bytes" and plot.stat().st_size > 0


def test_a_timed_sweep_prints_its_step_time(monkeypatch, tmp_path, capsys):
    _fixed_rows(monkeypatch, {**COMPILED, "step_seconds": 0.25})
    assert cli.main(["sweep", *SMALL, "--latents", "8", "--steps-list", "2", "--recipes",
                     "none", "--measure", "timed", "--out", str(tmp_path / "s.json")]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if " x " in line]
    assert row.endswith("total 3.00 MiB temp 2.00 MiB step 250.0 ms ok"), row


def test_a_sweep_with_nothing_to_draw_writes_no_picture(monkeypatch, tmp_path, capsys):
    _fixed_rows(monkeypatch, {**MEASURED, "status": "error", "message": "boom",
                              "peak_bytes": None, "step_seconds": None})
    plot = tmp_path / "sweep.png"
    assert cli.main(["sweep", *SMALL, "--latents", "8", "--steps-list", "2", "--recipes",
                     "none", "--measure", "measured", "--out", str(tmp_path / "s.json"),
                     "--plot", str(plot)]) == 1
    assert not plot.exists()
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"gclab sweep: --plot {plot}: not written: no row has a peak_bytes to draw (see the "
        "rows' status)")


def test_a_repeated_value_is_swept_once(monkeypatch, tmp_path):
    """`--latents 16,16` compiled the same step twice and wrote two equal rows."""
    asked = _fixed_rows(monkeypatch, COMPILED)
    out = tmp_path / "s.json"
    assert cli.main(["sweep", *SMALL, "--latents", "16,8,16", "--steps-list", "2,2",
                     "--recipes", "none,lean,none", "--out", str(out)]) == 0
    assert [(s.model.latent_size, s.technique()) for s in asked] == [
        (16, "none"), (16, "lean"), (8, "none"), (8, "lean")]
    assert len(json.loads(out.read_text())) == 4


def test_plot_sweep_refuses_a_column_with_nothing_to_draw():
    import pandas as pd

    from gclab.plots import plot_sweep

    df = pd.DataFrame({"model.latent_size": [8], "model.processor_steps": [2],
                       "technique": ["none"], "total_bytes": [None], "peak_bytes": [MiB]})
    with pytest.raises(ValueError, match="no row has a total_bytes to draw"):
        plot_sweep(df)
    assert plot_sweep(df, y="peak_bytes").axes
