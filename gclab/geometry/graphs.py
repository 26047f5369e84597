"""The three GraphCast graphs with their static features: public entry point.

`build_graphs` assembles the lat/lon grid, the icosahedral multimesh, the grid2mesh,
mesh and mesh2grid edge sets and all structural features, exactly as the official
GraphCast code does (see `tests/geometry/test_geometry.py` for the checks against its fixtures).
Results are cached on disk as ``.npz`` files.

Shape glossary:
  Ng: grid nodes (n_lat * n_lon, latitude-major).
  Nm: mesh nodes (finest icosahedral level).
  E:  edges of one edge set.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from gclab.config import ModelConfig
from gclab.geometry import features as features_lib
from gclab.geometry import grid_mesh, icosahedral

# Bump whenever anything that changes the built arrays changes.
GEOMETRY_VERSION = "gclab-geometry-1"

_EDGE_SETS = ("grid2mesh", "mesh", "mesh2grid")


@dataclasses.dataclass(frozen=True, eq=False)
class EdgeSet:
    """One edge set with its structural features.

    Attributes:
      senders: [E] int32 sender node indices.
      receivers: [E] int32 receiver node indices.
      features: [E, 4] float32 ``[|d|, d_x, d_y, d_z] / normalization``.
      normalization: the divisor N used for the features.
    """

    senders: np.ndarray
    receivers: np.ndarray
    features: np.ndarray
    normalization: float

    @property
    def num_edges(self) -> int:
        return int(self.senders.shape[0])

    def in_degree(self, num_receivers: int) -> np.ndarray:
        """[N] int: the number of edges each of `num_receivers` receiver nodes receives."""
        return np.bincount(self.receivers, minlength=num_receivers)


@dataclasses.dataclass(frozen=True, eq=False)
class Graphs:
    """Grid, mesh and the three edge sets of a GraphCast model.

    Attributes:
      resolution: grid spacing in degrees.
      mesh_splits: icosahedron refinements.
      radius_query_fraction_edge_length: grid2mesh radius / longest finest-mesh edge.
      query_radius: the grid2mesh chord radius actually used (float32 value).
      grid_lat: [n_lat] float64 degrees, -90..90.
      grid_lon: [n_lon] float64 degrees, 0..360-res.
      grid_node_features: [Ng, 3] float32.
      mesh_node_features: [Nm, 3] float32.
      mesh_node_xyz: [Nm, 3] float32 unit vectors.
      grid2mesh: senders index grid nodes, receivers mesh nodes.
      mesh: multimesh edges (mesh -> mesh).
      mesh2grid: senders index mesh nodes, receivers grid nodes.
    """

    resolution: float
    mesh_splits: int
    radius_query_fraction_edge_length: float
    query_radius: float
    grid_lat: np.ndarray
    grid_lon: np.ndarray
    grid_node_features: np.ndarray
    mesh_node_features: np.ndarray
    mesh_node_xyz: np.ndarray
    grid2mesh: EdgeSet
    mesh: EdgeSet
    mesh2grid: EdgeSet

    @property
    def n_lat(self) -> int:
        return int(self.grid_lat.shape[0])

    @property
    def n_lon(self) -> int:
        return int(self.grid_lon.shape[0])

    @property
    def num_grid_nodes(self) -> int:
        return self.n_lat * self.n_lon

    @property
    def num_mesh_nodes(self) -> int:
        return int(self.mesh_node_xyz.shape[0])

    def in_degree(self, edge_set: str) -> np.ndarray:
        """[N] int: edges received per receiver node of `edge_set`.

        Args:
          edge_set: ``'grid2mesh'`` or ``'mesh'`` (N = Nm) or ``'mesh2grid'`` (N = Ng).
        """
        if edge_set not in _EDGE_SETS:
            raise ValueError(f"unknown edge set {edge_set!r}; one of {', '.join(_EDGE_SETS)}")
        n = self.num_grid_nodes if edge_set == "mesh2grid" else self.num_mesh_nodes
        return getattr(self, edge_set).in_degree(n)

    def counts(self) -> dict:
        """Node and edge counts."""
        return {
            "grid_nodes": self.num_grid_nodes,
            "mesh_nodes": self.num_mesh_nodes,
            "mesh_edges": self.mesh.num_edges,
            "grid2mesh_edges": self.grid2mesh.num_edges,
            "mesh2grid_edges": self.mesh2grid.num_edges,
        }


def _query_radius(finest_max_edge_length: float, fraction: float) -> float:
    """The radius as the official code computes it (float32 product)."""
    return float(np.float32(finest_max_edge_length) * np.float32(fraction))


def _build(resolution: float, mesh_splits: int, fraction: float,
           m2g_normalization: Optional[float]) -> Graphs:
    """Builds everything from scratch (no cache)."""
    mm = icosahedral.multimesh(mesh_splits)
    mesh_xyz32 = mm.vertices.astype(np.float32)  # [Nm, 3]
    mesh_lat, mesh_lon = grid_mesh.xyz_to_lat_lon(mesh_xyz32)  # [Nm] float32 each

    grid_lat = grid_mesh.grid_latitudes(resolution)  # [n_lat]
    grid_lon = grid_mesh.grid_longitudes(resolution)  # [n_lon]
    node_lat, node_lon = grid_mesh.grid_node_lat_lon(grid_lat, grid_lon)  # [Ng] each
    grid_xyz = grid_mesh.grid_positions(grid_lat, grid_lon)  # [Ng, 3] float32

    radius = _query_radius(mm.finest_max_edge_length, fraction)
    g2m_s, g2m_r = grid_mesh.grid2mesh_edges(grid_xyz, mesh_xyz32, radius)  # [E] each
    m2g_s, m2g_r = grid_mesh.mesh2grid_edges(grid_xyz, mesh_xyz32, mm.finest_faces)
    del grid_xyz

    def edge_set(s, r, sender_ll, receiver_ll, norm=None) -> EdgeSet:
        feats, used = features_lib.edge_features(*sender_ll, *receiver_ll, s, r, norm)
        return EdgeSet(s.astype(np.int32), r.astype(np.int32), feats, used)

    grid_ll = (node_lat, node_lon)
    mesh_ll = (mesh_lat, mesh_lon)
    return Graphs(
        resolution=float(resolution),
        mesh_splits=int(mesh_splits),
        radius_query_fraction_edge_length=float(fraction),
        query_radius=radius,
        grid_lat=grid_lat,
        grid_lon=grid_lon,
        grid_node_features=features_lib.node_features(node_lat, node_lon),
        mesh_node_features=features_lib.node_features(mesh_lat, mesh_lon),
        mesh_node_xyz=mesh_xyz32,
        grid2mesh=edge_set(g2m_s, g2m_r, grid_ll, mesh_ll),
        mesh=edge_set(mm.senders, mm.receivers, mesh_ll, mesh_ll),
        mesh2grid=edge_set(m2g_s, m2g_r, mesh_ll, grid_ll, m2g_normalization),
    )


# ----------------------------------------------------------------------------- cache

def _cache_key(resolution: float, mesh_splits: int, fraction: float,
               m2g_normalization: Optional[float]) -> str:
    params = {
        "version": GEOMETRY_VERSION,
        "resolution": repr(float(resolution)),
        "mesh_splits": int(mesh_splits),
        "radius_query_fraction_edge_length": repr(float(fraction)),
        "mesh2grid_edge_normalization_factor": (
            None if m2g_normalization is None else repr(float(m2g_normalization))),
    }
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:20]
    return f"graphs_r{float(resolution):g}_s{int(mesh_splits)}_{digest}"


def default_cache_dir() -> Path:
    """`GCLAB_CACHE_DIR` if set, else ``~/.cache/gclab/graphs``."""
    env = os.environ.get("GCLAB_CACHE_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "gclab" / "graphs"


def _to_arrays(g: Graphs, key: str) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {
        "cache_key": np.array(key),
        "resolution": np.array(g.resolution, dtype=np.float64),
        "mesh_splits": np.array(g.mesh_splits, dtype=np.int64),
        "radius_query_fraction_edge_length": np.array(
            g.radius_query_fraction_edge_length, dtype=np.float64),
        "query_radius": np.array(g.query_radius, dtype=np.float64),
        "grid_lat": g.grid_lat,
        "grid_lon": g.grid_lon,
        "grid_node_features": g.grid_node_features,
        "mesh_node_features": g.mesh_node_features,
        "mesh_node_xyz": g.mesh_node_xyz,
    }
    for name in _EDGE_SETS:
        es: EdgeSet = getattr(g, name)
        arrays[f"{name}_senders"] = es.senders
        arrays[f"{name}_receivers"] = es.receivers
        arrays[f"{name}_features"] = es.features
        arrays[f"{name}_normalization"] = np.array(es.normalization, dtype=np.float64)
    return arrays


def _from_arrays(z: Any, key: str) -> Graphs:
    """Rebuilds `Graphs` from a loaded npz; raises on any inconsistency."""
    if str(z["cache_key"][()]) != key:
        raise ValueError("cache key mismatch")
    edge_sets = {}
    for name in _EDGE_SETS:
        s = np.asarray(z[f"{name}_senders"])
        r = np.asarray(z[f"{name}_receivers"])
        f = np.asarray(z[f"{name}_features"])
        if s.dtype != np.int32 or r.dtype != np.int32 or f.dtype != np.float32:
            raise ValueError(f"bad dtype in cached {name}")
        if s.shape != r.shape or s.ndim != 1 or f.shape != (s.shape[0], 4):
            raise ValueError(f"bad shapes in cached {name}")
        edge_sets[name] = EdgeSet(s, r, f, float(z[f"{name}_normalization"][()]))
    g = Graphs(
        resolution=float(z["resolution"][()]),
        mesh_splits=int(z["mesh_splits"][()]),
        radius_query_fraction_edge_length=float(z["radius_query_fraction_edge_length"][()]),
        query_radius=float(z["query_radius"][()]),
        grid_lat=np.asarray(z["grid_lat"]),
        grid_lon=np.asarray(z["grid_lon"]),
        grid_node_features=np.asarray(z["grid_node_features"]),
        mesh_node_features=np.asarray(z["mesh_node_features"]),
        mesh_node_xyz=np.asarray(z["mesh_node_xyz"]),
        **edge_sets,
    )
    ng, nm = g.num_grid_nodes, g.num_mesh_nodes
    if (g.grid_node_features.shape != (ng, 3) or g.mesh_node_features.shape != (nm, 3)
            or g.mesh_node_xyz.shape != (nm, 3)
            or g.mesh2grid.num_edges != 3 * ng):
        raise ValueError("inconsistent cached graph sizes")
    return g


def _load_cache(path: Path, key: str) -> Optional[Graphs]:
    """The cached graphs at `path`, or None if missing or unreadable."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            return _from_arrays(z, key)
    except Exception:  # noqa: BLE001 - any damage means "rebuild"
        return None


def _save_cache(path: Path, g: Graphs, key: str) -> None:
    """Writes atomically (temporary file in the same folder, then os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **_to_arrays(g, key))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def cache_path(resolution: float, mesh_splits: int,
               radius_query_fraction_edge_length: float = 0.6,
               mesh2grid_edge_normalization_factor: Optional[float] = None,
               cache_dir: Optional[Union[str, os.PathLike]] = None) -> Path:
    """Where `build_graphs` caches the graphs for these parameters."""
    key = _cache_key(resolution, mesh_splits, radius_query_fraction_edge_length,
                     mesh2grid_edge_normalization_factor)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return folder / f"{key}.npz"


# ----------------------------------------------------------------------------- API

def build_graphs(
    resolution: float,
    mesh_splits: int,
    radius_query_fraction_edge_length: float = 0.6,
    mesh2grid_edge_normalization_factor: Optional[float] = None,
    *,
    cache: bool = True,
    cache_dir: Optional[Union[str, os.PathLike]] = None,
) -> Graphs:
    """Builds (or loads from the disk cache) the GraphCast graphs and static features.

    Args:
      resolution: grid spacing in degrees; must divide 180.
      mesh_splits: icosahedron refinements (0..7).
      radius_query_fraction_edge_length: grid2mesh radius as a fraction of the longest
        finest-mesh edge (0.6 in the published models).
      mesh2grid_edge_normalization_factor: divisor of the mesh2grid edge features;
        None uses the longest mesh2grid edge (official default).
      cache: read and write the on-disk cache.
      cache_dir: cache folder; defaults to `GCLAB_CACHE_DIR` or ``~/.cache/gclab/graphs``.

    Returns:
      The graphs.

    Raises:
      ValueError: if an argument is invalid (checked by `gclab.config.ModelConfig`).
    """
    ModelConfig(
        resolution=resolution,
        mesh_splits=mesh_splits,
        radius_query_fraction_edge_length=radius_query_fraction_edge_length,
        mesh2grid_edge_normalization_factor=mesh2grid_edge_normalization_factor,
    )
    args = (float(resolution), int(mesh_splits), float(radius_query_fraction_edge_length),
            None if mesh2grid_edge_normalization_factor is None
            else float(mesh2grid_edge_normalization_factor))
    if not cache:
        return _build(*args)
    key = _cache_key(*args)
    path = cache_path(*args, cache_dir=cache_dir)
    graphs = _load_cache(path, key)
    if graphs is not None:
        return graphs
    graphs = _build(*args)
    try:
        _save_cache(path, graphs, key)
    except OSError:
        pass  # An unwritable cache folder must not stop the build.
    return graphs


def graphs_for(model_config: ModelConfig, **kw: Any) -> Graphs:
    """`build_graphs` for the geometry of a `ModelConfig`.

    Args:
      model_config: its resolution, mesh_splits, radius_query_fraction_edge_length and
        mesh2grid_edge_normalization_factor are used.
      **kw: `cache` and `cache_dir`, passed on to `build_graphs`.

    Returns:
      The graphs.
    """
    return build_graphs(
        model_config.resolution,
        model_config.mesh_splits,
        model_config.radius_query_fraction_edge_length,
        model_config.mesh2grid_edge_normalization_factor,
        **kw,
    )
