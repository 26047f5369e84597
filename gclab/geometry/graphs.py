"""The three GraphCast graphs with their static features: public entry point.

`build_graphs` assembles the lat/lon grid, the icosahedral multimesh, the grid2mesh,
mesh and mesh2grid edge sets and all structural features, exactly as the official
GraphCast code does (see `tests/geometry/test_geometry.py` for the checks against its fixtures).
Results are cached on disk as ``.npz`` files; `save_graphs` (``gclab graph --save``)
writes them to a file of one's choosing, to compare with another implementation.

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
import warnings
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from gclab.config import ModelConfig, WrongType, a_kind, require_kind
from gclab.files import CacheWarning, atomic_path
from gclab.geometry import features as features_lib
from gclab.geometry import grid_mesh, icosahedral
from gclab.limits import host_memory_bytes, require_fits

# Bump whenever anything that changes the built arrays changes (2: mesh2grid faces by the
# official nearest-flat-face rule, ties decided by trimesh).
GEOMETRY_VERSION = "gclab-geometry-2"

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

    def edge_set(s, r, sender_ll, receiver_ll, norm=None, name="normalization") -> EdgeSet:
        feats, used = features_lib.edge_features(*sender_ll, *receiver_ll, s, r, norm, name)
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
        # A factor too small for finite float32 features is refused here, named, before
        # anything is cached (grid2mesh and mesh features use their longest edge).
        mesh2grid=edge_set(m2g_s, m2g_r, mesh_ll, grid_ll, m2g_normalization,
                           "mesh2grid_edge_normalization_factor"),
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


def graph_arrays(g: Graphs) -> dict[str, np.ndarray]:
    """The graphs and static features as named numpy arrays.

    Keys: ``{grid2mesh,mesh,mesh2grid}_{senders,receivers,features,normalization}``,
    ``grid_node_features``, ``mesh_node_features``, ``mesh_node_xyz``, ``grid_lat``,
    ``grid_lon``, ``resolution``, ``mesh_splits``, ``radius_query_fraction_edge_length``
    and ``query_radius``. Senders and receivers index the node sets in the order of the
    official code (grid nodes latitude-major, mesh nodes in refinement order).

    Args:
      g: the graphs.

    Returns:
      A dict of arrays, as `save_graphs` writes them.
    """
    arrays: dict[str, np.ndarray] = {
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
    for name, senders_of, receivers_of in (("grid2mesh", ng, nm), ("mesh", nm, nm),
                                           ("mesh2grid", nm, ng)):
        es: EdgeSet = getattr(g, name)
        for idx, n in ((es.senders, senders_of), (es.receivers, receivers_of)):
            if idx.size and not (idx.min() >= 0 and idx.max() < n):
                raise ValueError(f"cached {name} indices out of range")
        if not np.isfinite(es.features).all():
            raise ValueError(f"cached {name} features not finite")
    return g


def _load_cache(path: Path, key: str) -> Optional[Graphs]:
    """The cached graphs at `path`; None if missing, or damaged (with a `CacheWarning`)."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            return _from_arrays(z, key)
    except Exception as e:  # noqa: BLE001 - any damage means "rebuild"
        warnings.warn(f"graph cache {path} is damaged ({type(e).__name__}: {e}); "
                      "rebuilding it", CacheWarning, stacklevel=3)
        return None


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Writes atomically (`gclab.files.atomic_path`: a temporary file, then os.replace)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def _save_cache(path: Path, g: Graphs, key: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_npz(path, {"cache_key": np.array(key), **graph_arrays(g)})


def save_graphs(g: Graphs, path: Union[str, os.PathLike]) -> Path:
    """Writes the three graphs and their static features to an ``.npz`` file.

    The file holds `graph_arrays` under those names, written atomically (a temporary
    file in the same folder, then renamed), so another implementation's graphs can be
    compared with gclab's array by array.

    Args:
      g: the graphs.
      path: the file to write; its folder must exist.

    Returns:
      The path written.

    Raises:
      OSError: the file cannot be written.
    """
    path = Path(path)
    _write_npz(path, graph_arrays(g))
    return path


def _geometry_args(resolution: object, mesh_splits: object, fraction: object,
                   m2g_normalization: object) -> tuple[float, int, float, Optional[float]]:
    """The geometry's parameters as plain numbers, once `ModelConfig` has checked them.

    Raises:
      ValueError: an invalid value; `WrongType` for one of the wrong kind (``True`` or
        ``2.7`` splits would otherwise name the cache of 1 or 2).
    """
    ModelConfig(resolution=resolution, mesh_splits=mesh_splits,
                radius_query_fraction_edge_length=fraction,
                mesh2grid_edge_normalization_factor=m2g_normalization)
    return (float(resolution), int(mesh_splits), float(fraction),
            None if m2g_normalization is None else float(m2g_normalization))


def cache_path(resolution: float, mesh_splits: int,
               radius_query_fraction_edge_length: float = 0.6,
               mesh2grid_edge_normalization_factor: Optional[float] = None,
               cache_dir: Optional[Union[str, os.PathLike]] = None) -> Path:
    """Where `build_graphs` caches the graphs for these parameters.

    Raises:
      ValueError: an invalid argument (checked as `build_graphs` checks it); `WrongType`
        (a TypeError too) for one of the wrong kind, such as ``mesh_splits=2.7``.
    """
    args = _geometry_args(resolution, mesh_splits, radius_query_fraction_edge_length,
                          mesh2grid_edge_normalization_factor)
    require_kind("cache_dir", cache_dir, (str, os.PathLike), "None or a path",
                 caller="cache_path", optional=True)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = _cache_key(*args)
    return folder / f"{key}.npz"


# ----------------------------------------------------------------------------- size

#: Upper bound of (longest finest-mesh edge) x 2**splits: 1.05 at 0 splits, rising to
#: 1.3231 at 6 splits.
_FINEST_EDGE_TIMES_2_POW_SPLITS = 1.33
#: Host bytes of building, per grid node, per grid2mesh edge and per multimesh edge, and
#: a fixed part (measured peaks of `build_graphs`: 0.57 GiB at 0.25 deg / 6 splits).
_BUILD_BYTES_PER_GRID_NODE = 450
_BUILD_BYTES_PER_GRID2MESH_EDGE = 160
_BUILD_BYTES_PER_MESH_EDGE = 150
_BUILD_BYTES_FIXED = 64 * 2**20


def estimate_grid2mesh_edges(resolution: float, mesh_splits: int,
                             radius_query_fraction_edge_length: float = 0.6) -> int:
    """About how many grid2mesh edges a geometry has, without building it.

    A cap of chord radius r covers r^2 / 4 of the sphere, so each grid node reaches about
    that fraction of the mesh nodes (all of them once r >= 2).
    """
    model = ModelConfig(resolution=resolution, mesh_splits=mesh_splits,
                        radius_query_fraction_edge_length=radius_query_fraction_edge_length)
    radius = (radius_query_fraction_edge_length * _FINEST_EDGE_TIMES_2_POW_SPLITS
              / 2**mesh_splits)
    reach = min(1.0, radius**2 / 4)
    return int(np.ceil(model.num_grid_nodes * model.num_mesh_nodes * reach))


def estimate_build_bytes(resolution: float, mesh_splits: int,
                         radius_query_fraction_edge_length: float = 0.6) -> int:
    """Host bytes `build_graphs` needs at its peak, estimated from the sizes (high side)."""
    model = ModelConfig(resolution=resolution, mesh_splits=mesh_splits,
                        radius_query_fraction_edge_length=radius_query_fraction_edge_length)
    eg = estimate_grid2mesh_edges(resolution, mesh_splits, radius_query_fraction_edge_length)
    return (_BUILD_BYTES_PER_GRID_NODE * model.num_grid_nodes
            + _BUILD_BYTES_PER_GRID2MESH_EDGE * eg
            + _BUILD_BYTES_PER_MESH_EDGE * model.num_mesh_edges + _BUILD_BYTES_FIXED)


def check_build_size(resolution: float, mesh_splits: int,
                     radius_query_fraction_edge_length: float = 0.6) -> None:
    """Refuses, before any work, graphs that would not fit in this machine's memory.

    Raises:
      gclab.limits.TooLarge: the estimate (`estimate_build_bytes`) exceeds
        `gclab.limits.host_memory_bytes()`; the message gives both.
    """
    needed = estimate_build_bytes(resolution, mesh_splits, radius_query_fraction_edge_length)
    model = ModelConfig(resolution=resolution, mesh_splits=mesh_splits)
    require_fits(f"building the graphs of a {resolution:g} deg grid ({model.num_grid_nodes:,} "
                 f"nodes) with {mesh_splits} mesh splits and radius fraction "
                 f"{radius_query_fraction_edge_length:g}", needed, host_memory_bytes(),
                 "this machine's memory")


# ----------------------------------------------------------------------------- API

@dataclasses.dataclass(frozen=True)
class GraphsSource:
    """Where `load_or_build_graphs` got the graphs from.

    Attributes:
      loaded: True if read from the disk cache, False if built.
      cache_path: the cache file (None with the cache off).
      cache_error: why a built graph could not be cached (None if it was, or cache off).
    """

    loaded: bool
    cache_path: Optional[Path]
    cache_error: Optional[str] = None

    def describe(self) -> str:
        """One phrase: ``loaded from the cache (...)``, ``built and cached (...)``, ..."""
        if self.loaded:
            return f"loaded from the cache ({self.cache_path})"
        if self.cache_path is None:
            return "built (cache off)"
        if self.cache_error is not None:
            return f"built, not cached: {self.cache_path} could not be written ({self.cache_error})"
        return f"built and cached for the next run ({self.cache_path})"


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
      gclab.limits.TooLarge: the build would not fit in memory (`check_build_size`).
    """
    return load_or_build_graphs(resolution, mesh_splits, radius_query_fraction_edge_length,
                                mesh2grid_edge_normalization_factor, cache=cache,
                                cache_dir=cache_dir)[0]


def load_or_build_graphs(
    resolution: float,
    mesh_splits: int,
    radius_query_fraction_edge_length: float = 0.6,
    mesh2grid_edge_normalization_factor: Optional[float] = None,
    *,
    cache: bool = True,
    cache_dir: Optional[Union[str, os.PathLike]] = None,
) -> tuple[Graphs, GraphsSource]:
    """`build_graphs`, and where the graphs came from (cache or build, cached or not).

    A damaged cache file is rebuilt with a `gclab.files.CacheWarning`; a cache folder
    that cannot be written does not stop the build (`GraphsSource.cache_error` says why).

    Returns:
      `(graphs, source)`.

    Raises:
      ValueError: an invalid argument (checked by `gclab.config.ModelConfig`).
      gclab.limits.TooLarge: the build would not fit in memory (`check_build_size`).
    """
    args = _geometry_args(resolution, mesh_splits, radius_query_fraction_edge_length,
                          mesh2grid_edge_normalization_factor)
    require_kind("cache", cache, bool, "True or False")
    require_kind("cache_dir", cache_dir, (str, os.PathLike), "None or a path", optional=True)
    check_build_size(*args[:3])
    if not cache:
        return _build(*args), GraphsSource(False, None)
    key = _cache_key(*args)
    path = cache_path(*args, cache_dir=cache_dir)
    graphs = _load_cache(path, key)
    if graphs is not None:
        return graphs, GraphsSource(True, path)
    graphs = _build(*args)
    try:
        _save_cache(path, graphs, key)
    except OSError as e:  # An unwritable cache folder must not stop the build.
        return graphs, GraphsSource(False, path, str(e.strerror or e))
    return graphs, GraphsSource(False, path)


def graphs_for(model_config: ModelConfig, **kw: Any) -> Graphs:
    """`build_graphs` for the geometry of a `ModelConfig`.

    Args:
      model_config: its resolution, mesh_splits, radius_query_fraction_edge_length and
        mesh2grid_edge_normalization_factor are used.
      **kw: `cache` and `cache_dir`, passed on to `build_graphs`.

    Returns:
      The graphs.
    """
    if not isinstance(model_config, ModelConfig):
        raise WrongType(f"graphs_for needs a ModelConfig, not {a_kind(model_config)}")
    return build_graphs(
        model_config.resolution,
        model_config.mesh_splits,
        model_config.radius_query_fraction_edge_length,
        model_config.mesh2grid_edge_normalization_factor,
        **kw,
    )
