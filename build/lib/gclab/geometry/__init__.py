"""Geometry: the lat/lon grid, the icosahedral multimesh and the three graphs (numpy/scipy).

Built once, outside the network: the network only ever sees ready graphs and features.

| module | what it is for |
|---|---|
| `icosahedral` | the multimesh, in the official vertex, face and edge order |
| `grid_mesh` | lat/lon grids, grid2mesh radius query, mesh2grid triangles |
| `features` | static node and edge features |
| `graphs` | `build_graphs`: all three graphs with features, cached on disk |
"""

from gclab.geometry.features import edge_features, node_features, raw_edge_features
from gclab.geometry.graphs import (
    GEOMETRY_VERSION,
    EdgeSet,
    Graphs,
    GraphsSource,
    build_graphs,
    cache_path,
    check_build_size,
    default_cache_dir,
    estimate_build_bytes,
    estimate_grid2mesh_edges,
    graphs_for,
    load_or_build_graphs,
)
from gclab.geometry.grid_mesh import (
    grid2mesh_edges,
    grid_latitudes,
    grid_longitudes,
    grid_node_lat_lon,
    grid_positions,
    lat_lon_to_xyz,
    mesh2grid_edges,
    xyz_to_lat_lon,
)
from gclab.geometry.icosahedral import Multimesh, faces_to_edges, icosahedron, multimesh

__all__ = [
    "EdgeSet", "GEOMETRY_VERSION", "Graphs", "GraphsSource", "Multimesh", "build_graphs",
    "cache_path", "check_build_size", "default_cache_dir", "edge_features", "estimate_build_bytes",
    "estimate_grid2mesh_edges", "faces_to_edges", "graphs_for", "grid2mesh_edges",
    "grid_latitudes", "grid_longitudes", "grid_node_lat_lon", "grid_positions", "icosahedron",
    "lat_lon_to_xyz", "load_or_build_graphs", "mesh2grid_edges", "multimesh", "node_features",
    "raw_edge_features", "xyz_to_lat_lon",
]
