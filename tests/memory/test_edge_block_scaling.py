"""Edge blocks scaled from the 0.25 degree grid to smaller grids."""

from gclab.config import PRESETS
from gclab.memory import FULL_MESH2GRID_EDGES, RECIPE_EDGE_BLOCK, scaled_edge_block


def test_full_grid_keeps_the_recipe_block():
    assert FULL_MESH2GRID_EDGES == PRESETS["graphcast"].model.num_mesh2grid_edges == 3_114_720
    assert scaled_edge_block(FULL_MESH2GRID_EDGES) == RECIPE_EDGE_BLOCK


def test_smaller_grids_keep_the_block_count():
    full_blocks = FULL_MESH2GRID_EDGES / RECIPE_EDGE_BLOCK
    for preset in ("graphcast-small", "cpu-16x512"):
        edges = PRESETS[preset].model.num_mesh2grid_edges
        block = scaled_edge_block(edges)
        assert abs(edges / block - full_blocks) < 0.1 * full_blocks


def test_tiny_grids_get_the_minimum():
    assert scaled_edge_block(300) == 64
    assert scaled_edge_block(300, minimum=8) == 8
