"""The book's plotting and notebook functions refuse bad arguments in one line, at entry."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from gclab import notebook, plots  # noqa: E402
from gclab.config import WrongType  # noqa: E402

GRID = pd.DataFrame({"latent_size": [1, 2], "processor_steps": [1, 1],
                     "temp_bytes": [1e6, 2e6], "total_bytes": [2e6, 3e6], "fits": [True, True]})
FITS = pd.DataFrame({"config": ["a", "b"], "total_bytes": [1e9, 2e9]})
TRADEOFF = pd.DataFrame({"recipe": ["a", "b"], "step_seconds": [1.0, 2.0],
                         "peak_bytes": [1e9, 2e9]})
LAYOUTS = pd.DataFrame({"layout": ["a", "a"], "devices": [1, 2], "temp / device": [4e9, 2e9]})
CPU = notebook.SCALE_TABLE["cpu"]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _one_line(error: pytest.ExceptionInfo) -> None:
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("fits", [["False", True], [np.nan, True], ["0", True], [0, 1]])
def test_guarded_heatmap_refuses_fits_that_are_not_true_or_false(fits):
    with pytest.raises(WrongType, match=r"^plot_guarded_heatmap: df\['fits'\] holds .*: True or "
                                        "False only"):
        plots.plot_guarded_heatmap(GRID.assign(fits=fits))
    # True and False held as objects are still taken: the first cell did not fit.
    fig = plots.plot_guarded_heatmap(GRID.assign(fits=pd.Series([False, True], dtype=object)))
    assert fig.axes[0].texts[0].get_text().startswith("needs")


@pytest.mark.parametrize("call, match", [
    (lambda: plots.plan_limits_gb("H100"), r"^plan_limits_gb names='H100' is invalid: a "
                                           r"sequence of card names \(\['H100'\] for one card\)"),
    (lambda: notebook.precision_by_backend("memory-cpu"),
     r"^precision_by_backend names='memory-cpu' is invalid: a sequence of recording names"),
])
def test_a_name_is_not_a_sequence_of_names(call, match):
    with pytest.raises(WrongType, match=match):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda: plots.plot_fit_chart(FITS.assign(total_bytes=[1e9, np.nan])),
     r"^plot_fit_chart: df\['total_bytes'\] is nan for config 'b': a finite number"),
    (lambda: plots.plot_tradeoff(TRADEOFF.assign(step_seconds=[1.0, np.nan])),
     r"^plot_tradeoff: df\['step_seconds'\] is nan for recipe 'b': a finite number"),
    (lambda: plots.plot_tradeoff(TRADEOFF.assign(step_seconds=[np.nan, np.nan])),
     r"^plot_tradeoff: df\['step_seconds'\] is nan for recipe 'a'"),
    (lambda: plots.plot_tradeoff(TRADEOFF.assign(peak_bytes=[1e9, np.inf])),
     r"^plot_tradeoff: df\['peak_bytes'\] is inf for recipe 'b'"),
])
def test_values_drawn_must_be_finite(call, match):
    with pytest.raises(ValueError, match=match) as error:
        call()
    _one_line(error)


@pytest.mark.parametrize("call, match", [
    (lambda: plots.plot_fit_chart(FITS.drop(columns="config")),
     r"^plot_fit_chart: df has no column 'config' \(label\); columns: 'total_bytes'$"),
    (lambda: plots.plot_fit_chart(FITS, value="peak_bytes"),
     r"^plot_fit_chart: df has no column 'peak_bytes' \(value\); columns: 'config', "),
    (lambda: plots.plot_heatmap(GRID.drop(columns="temp_bytes")),
     r"^plot_heatmap: df has no column 'temp_bytes' \(value\); columns: 'latent_size'"),
    (lambda: plots.plot_heatmap(GRID, x="latent"),
     r"^plot_heatmap: df has no column 'latent' \(x\)"),
    (lambda: plots.plot_tradeoff(TRADEOFF.drop(columns="recipe")),
     r"^plot_tradeoff: df has no column 'recipe' \(recipe\); columns: 'step_seconds', "),
    (lambda: plots.plot_residuals(pd.DataFrame({"module": ["encoder"]})),
     r"^plot_residuals: df has no column 'bytes' .*; columns: 'module'$"),
    (lambda: plots.plot_guarded_heatmap(GRID.drop(columns="fits")),
     r"^plot_guarded_heatmap: df has no column 'fits' \(fits\)"),
    (lambda: plots.plot_layout_memory(LAYOUTS.drop(columns="devices"), 4e9),
     r"^plot_layout_memory: df has no column 'devices'"),
    (lambda: notebook.planned_and_measured_table(pd.DataFrame({"plan_bytes": [1]})),
     r"^planned_and_measured_table: beside has no column 'temp_bytes' .*; columns: "
     r"'plan_bytes'$"),
])
def test_a_missing_column_is_named_with_the_columns_there(call, match):
    with pytest.raises(ValueError, match=match) as error:
        call()
    assert not isinstance(error.value, KeyError)
    _one_line(error)


@pytest.mark.parametrize("call, error, match", [
    (lambda: plots.plot_tradeoff(TRADEOFF.iloc[:0]), ValueError,
     r"^plot_tradeoff: df has no rows: nothing to draw$"),
    (lambda: plots.plot_layout_memory(LAYOUTS.iloc[:0], 4e9), ValueError,
     r"^plot_layout_memory: df has no rows"),
    (lambda: plots.plot_timeline([]), ValueError,
     r"^plot_timeline: timeline_or_list is empty"),
    (lambda: plots.plot_stage_memory({}, 1e9), ValueError,
     r"^plot_stage_memory: series is empty"),
    (lambda: plots.plot_stage_memory([[1e9]], 1e9), WrongType,
     r"^plot_stage_memory series=.* is invalid: a \{choice name: bytes per stage\} mapping"),
    (lambda: plots.plot_heatmap(GRID, budget_bytes="16GB"), WrongType,
     r"^plot_heatmap budget_bytes='16GB' is invalid: a number of bytes >= 0 or None, not a str$"),
    (lambda: plots.plot_fit_chart(FITS, cards=16), WrongType,
     r"^plot_fit_chart cards=16 is invalid: a sequence of GB limits, or a \{name: GB\} mapping"),
    (lambda: plots.plot_fit_chart(FITS, cards={"T4": "16"}), ValueError,
     r"^plot_fit_chart cards=.* is invalid: .* each limit a number > 0$"),
])
def test_empty_or_wrong_kind_inputs_are_refused_at_entry(call, error, match):
    with pytest.raises(error, match=match) as raised:
        call()
    _one_line(raised)


@pytest.mark.parametrize("call", [notebook.gpu_record, notebook.gpu_recording])
@pytest.mark.parametrize("chapter", ["99", "one", 1.0])
def test_gpu_recordings_refuse_an_unknown_chapter_as_live_configs_does(call, chapter, tmp_path):
    with pytest.raises(ValueError, match=rf"^{call.__name__} chapter={chapter!r} is invalid: "
                                         "one of 01 to 08$"):
        call(chapter, CPU, tmp_path)
    assert call(2, CPU, tmp_path) is None  # a chapter without a recording: None, as before


@pytest.mark.parametrize("scale", ["gpu", None])
def test_scale_banner_takes_a_scale_only(scale):
    with pytest.raises(WrongType, match=r"^scale_banner scale=.* is invalid: a Scale"):
        notebook.scale_banner(scale)


def test_a_budget_of_zero_bytes_is_titled():
    fig = plots.plot_heatmap(GRID, budget_bytes=0)
    assert fig.axes[0].get_title().endswith("(budget 0 B)")


def test_claim_figures_of_a_zero_byte_peak_read_n_a():
    record = {"hardware": {"device": "cpu"}, "authors_claim": {"rows": [], "peak": {
        "peak_bytes": 0, "float32_bytes": 0, "grid_sized_buffers": 0, "grid_sized_bytes": 0}}}
    assert notebook.claim_figures(record)["peak_f32"] == "n/a"
