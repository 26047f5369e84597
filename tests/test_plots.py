"""Plots of `gclab.plots`, checked through what they draw (line coordinates, titles)."""

from __future__ import annotations

import dataclasses

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from gclab import plots  # noqa: E402
from gclab.geometry import build_graphs, multimesh  # noqa: E402
from gclab.geometry.grid_mesh import xyz_to_lat_lon  # noqa: E402

GiB = 2**30


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_plot_multimesh_draws_a_mesh_with_more_levels_than_colours():
    # The levels of a 9-level mesh (8 splits), each the icosahedron's 20 faces: a real mesh
    # of 5 or more splits (GraphCast_small, GraphCast) draws the same way, only slower.
    base = multimesh(0)
    levels = len(plots.LEVEL_COLORS) + 1
    mesh = dataclasses.replace(base, splits=levels - 1,
                               faces_per_level=[base.faces_per_level[0]] * levels)
    fig = plots.plot_multimesh(mesh)
    axes = fig.axes
    assert [ax.get_title() for ax in axes[:-1]] == [f"level {i}" for i in range(levels)]
    assert axes[-1].get_title() == "multimesh (all levels)"
    assert {line.get_color() for line in axes[5].lines} == {plots.LEVEL_COLORS[5]}
    assert {line.get_color() for line in axes[levels - 1].lines} == {plots.LEVEL_COLORS[0]}


def test_level_colours_cover_every_mesh_a_model_config_allows():
    from gclab.config import ModelConfig

    ModelConfig(mesh_splits=len(plots.LEVEL_COLORS) - 1)  # the finest allowed has a colour
    with pytest.raises(ValueError, match="mesh_splits"):
        ModelConfig(mesh_splits=len(plots.LEVEL_COLORS))
    assert len(set(plots.LEVEL_COLORS)) == len(plots.LEVEL_COLORS)


def _edges(ax, color):
    """[(x0, y0, x1, y1)] of the lines of `color` (sender first, receiver last)."""
    return [(*line.get_xydata()[0], *line.get_xydata()[1])
            for line in ax.lines if line.get_color() == color]


def test_plot_graph_neighbourhood_picks_the_nearest_node_on_the_sphere():
    g = build_graphs(4.0, 3)
    xyz = g.mesh_node_xyz.astype(np.float64)
    lat, lon = xyz_to_lat_lon(xyz)
    k = int(np.argmax(np.where(lon > 190, lat, -np.inf)))  # the northernmost node past 190
    # The same point, west longitudes negative: degrees of difference from (lat, lon - 360)
    # would pick a node near 0 deg instead.
    fig = plots.plot_graph_neighbourhood(g, mesh_node_near=(lat[k], lon[k] - 360.0),
                                         lon_range=(lon[k] - 60, lon[k] + 60))
    edges = _edges(fig.axes[0], "#2ca02c")
    assert edges
    for _, _, x1, y1 in edges:
        assert (x1, y1) == pytest.approx((lon[k], lat[k]), abs=1e-4)


def test_plot_graph_neighbourhood_draws_edges_across_the_meridian_short():
    g = build_graphs(4.0, 3)
    # Grid node (2 N, 0 E): its mesh senders lie on both sides of the 0/360 meridian.
    fig = plots.plot_graph_neighbourhood(g, grid_node_near=(2.0, 0.0),
                                         mesh_node_near=(0.0, 0.0), lon_range=(-40, 40))
    ax = fig.axes[0]
    red, green = _edges(ax, "#d62728"), _edges(ax, "#2ca02c")
    assert len(red) == 3 and green
    for _, _, x1, y1 in red:
        assert (x1, y1) == pytest.approx((0.0, 2.0), abs=1e-9)  # drawn at 0, not 360
    xs = np.array([[x0, x1] for x0, _, x1, _ in red + green])
    assert (np.abs(xs[:, 0] - xs[:, 1]) < 30).all()  # no edge crosses the whole map
    assert (np.abs(xs) <= 40).all()  # and all lie within the plotted range
    assert min(xs[:, 0]) < 0 < max(xs[:, 0])  # from both sides of the meridian
    # Every node is drawn within 180 degrees of the range's middle.
    for points in ax.collections:
        assert (np.abs(points.get_offsets()[:, 0]) <= 180).all()


def test_plot_heatmap_titles_the_budget_with_the_cells_precision():
    df = pd.DataFrame([{"latent_size": 64, "processor_steps": 4,
                        "temp_bytes": 50.2 * GiB, "status": "ok"}])
    fig = plots.plot_heatmap(df, budget_bytes=50.3 * GiB)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["50.2 GiB"]  # it fits
    assert ax.get_title() == "temp bytes (budget 50.3 GiB)"
