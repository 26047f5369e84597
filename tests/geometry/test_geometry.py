"""Geometry tests: icosahedral multimesh, grid <-> mesh edges, features, graph cache.

Checked against the official fixtures in tests/data (official_tiny: 10 deg / 2 splits,
official_small: 6 deg / 3 splits).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gclab.config import ModelConfig
from gclab.geometry import features as features_lib
from gclab.geometry import graphs as graphs_lib
from gclab.geometry import grid_mesh, icosahedral

DATA = Path(__file__).resolve().parents[1] / "data"

# name -> (resolution, mesh splits)
FIXTURES = {"official_tiny": (10.0, 2), "official_small": (6.0, 3)}

# splits -> (nodes, multimesh edges, finest max chord)
MESH_TABLE = {
    0: (12, 60, 1.05146),
    1: (42, 300, 0.61803),
    2: (162, 1260, 0.32492),
    3: (642, 5100, 0.16465),
    4: (2562, 20460, 0.08260),
    5: (10242, 81900, 0.04134),
    6: (40962, 327660, 0.02067),
}


@pytest.fixture(scope="module", params=sorted(FIXTURES))
def fixture(request):
    name = request.param
    with np.load(DATA / f"{name}.npz") as z:
        arrays = {k: z[k] for k in z.files if "param::" not in k}
    meta = json.loads((DATA / f"{name}.json").read_text())
    res, splits = FIXTURES[name]
    assert meta["config"]["resolution"] == res and meta["config"]["mesh_size"] == splits
    fraction = meta["config"]["radius_query_fraction_edge_length"]
    built = graphs_lib.build_graphs(res, splits, fraction, cache=False)
    return {"name": name, "d": arrays, "meta": meta, "g": built,
            "mesh": icosahedral.multimesh(splits)}


def _cone(points: np.ndarray, tri: np.ndarray) -> np.ndarray:
    """[P, 3] signed volumes det(v_i, v_i+1, p) of points against their triangles."""
    return np.stack([np.einsum("px,px->p", np.cross(tri[:, i], tri[:, (i + 1) % 3]), points)
                     for i in range(3)], axis=1)


# ----------------------------------------------------------------------------- mesh

@pytest.mark.parametrize("splits", sorted(MESH_TABLE))
def test_mesh_counts(splits):
    nodes, edges, max_edge = MESH_TABLE[splits]
    m = icosahedral.multimesh(splits)
    assert m.vertices.shape == (nodes, 3) and m.vertices.dtype == np.float64
    assert m.senders.shape == m.receivers.shape == (edges,)
    assert m.senders.dtype == np.int32 and m.receivers.dtype == np.int32
    assert [f.shape[0] for f in m.faces_per_level] == [20 * 4**k for k in range(splits + 1)]
    assert m.finest_faces.shape == (20 * 4**splits, 3)
    assert abs(m.finest_max_edge_length - max_edge) < 1e-5
    assert abs(m.level0_edge_length - 1.0514622) < 1e-6
    np.testing.assert_allclose(np.linalg.norm(m.vertices, axis=1), 1.0, atol=1e-6)
    assert m.senders.min() == 0 and m.senders.max() == nodes - 1


@pytest.mark.parametrize("splits", [0, 1, 2, 3, 4])
def test_mesh_edges_bidirectional_unique(splits):
    m = icosahedral.multimesh(splits)
    n = m.num_nodes
    fwd = m.senders.astype(np.int64) * n + m.receivers
    rev = m.receivers.astype(np.int64) * n + m.senders
    assert np.unique(fwd).size == fwd.size  # no duplicate directed edge
    assert np.array_equal(np.sort(fwd), np.sort(rev))  # every edge both ways, once
    assert not np.any(m.senders == m.receivers)
    undirected = np.unique(np.minimum(fwd, rev))
    assert undirected.size * 2 == fwd.size


def test_mesh_levels_nested_and_counter_clockwise():
    coarse, fine = icosahedral.multimesh(2), icosahedral.multimesh(3)
    assert np.array_equal(fine.vertices[: coarse.num_nodes], coarse.vertices)
    for k in range(3):
        assert np.array_equal(fine.faces_per_level[k], coarse.faces_per_level[k])
    for faces in fine.faces_per_level:
        tri = fine.vertices[faces]  # [F, 3, 3]
        det = np.einsum("fx,fx->f", np.cross(tri[:, 0], tri[:, 1]), tri[:, 2])
        assert (det > 0).all()  # counter-clockwise seen from outside
    # The level-0 icosahedron is rotated so that one face sits on top.
    top = icosahedral.multimesh(0)
    centroids = top.vertices[top.faces_per_level[0]].mean(axis=1)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    assert centroids[:, 2].max() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("bad", [-1, 1.5, 2.0, True, np.int64(-1)], ids=repr)
def test_bad_splits_rejected(bad):
    with pytest.raises(ValueError) as e:
        icosahedral.multimesh(bad)
    assert str(e.value) == f"splits={bad!r} is invalid: an integer >= 0"


def test_numpy_splits_are_stored_as_an_int():
    mesh = icosahedral.multimesh(np.int64(1))
    assert type(mesh.splits) is int and mesh.splits == 1


# ----------------------------------------------------------------------------- fixtures

# Angles from float32 vectors use numpy's float32 arccos/arctan2, whose SIMD code depends on
# the CPU's instruction set. The official fixtures were written on one machine; on an AVX2-only
# AMD EPYC (no AVX-512) the same numpy calls return latitudes up to 2 ulp apart from them and an
# edge-length maximum 1e-6 apart (relative). Quantities derived from these angles are therefore
# compared at float32 rounding, not bitwise; positions, edge lists and counts stay exact.
ANGLE_ATOL_DEG = 5e-5  # a few float32 ulps of an angle near 100 degrees
F32_REL = 1e-5


def test_fixture_mesh_nodes_exact(fixture):
    d, g, m = fixture["d"], fixture["g"], fixture["mesh"]
    # Bitwise the official float32 vertex positions, in the official order.
    assert np.array_equal(m.vertices.astype(np.float32), d["mesh_node_xyz"])
    assert np.array_equal(g.mesh_node_xyz, d["mesh_node_xyz"])
    lat, lon = grid_mesh.xyz_to_lat_lon(g.mesh_node_xyz)
    assert lat.dtype == lon.dtype == np.float32
    np.testing.assert_allclose(lat, d["mesh_node_lat"], rtol=0, atol=ANGLE_ATOL_DEG)
    np.testing.assert_allclose(lon, d["mesh_node_lon"], rtol=0, atol=ANGLE_ATOL_DEG)


def test_fixture_mesh_edges_exact(fixture):
    d, g = fixture["d"], fixture["g"]
    assert np.array_equal(g.mesh.senders, d["mesh_senders"])
    assert np.array_equal(g.mesh.receivers, d["mesh_receivers"])


def test_fixture_grid(fixture):
    d, g = fixture["d"], fixture["g"]
    assert np.array_equal(g.grid_lat, d["grid_lat"]) and np.array_equal(g.grid_lon, d["grid_lon"])
    lat, lon = grid_mesh.grid_node_lat_lon(g.grid_lat, g.grid_lon)
    assert np.array_equal(lat, d["node_lat"]) and np.array_equal(lon, d["node_lon"])
    assert g.n_lat == fixture["meta"]["config"]["n_lat"]
    assert g.n_lon == fixture["meta"]["config"]["n_lon"]


def test_fixture_counts_and_radius(fixture):
    g, meta = fixture["g"], fixture["meta"]["graph"]
    assert g.counts() == {
        "grid_nodes": meta["num_grid_nodes"],
        "mesh_nodes": meta["num_mesh_nodes"],
        "mesh_edges": meta["num_multimesh_edges"],
        "grid2mesh_edges": meta["num_grid2mesh_edges"],
        "mesh2grid_edges": meta["num_mesh2grid_edges"],
    }
    assert g.query_radius == meta["query_radius"]  # the same float32 value
    norms = meta["edge_normalization_factors"]
    assert g.grid2mesh.normalization == pytest.approx(norms["grid2mesh"], rel=F32_REL)
    assert g.mesh.normalization == pytest.approx(norms["mesh"], rel=F32_REL)
    assert g.mesh2grid.normalization == pytest.approx(norms["mesh2grid"], rel=F32_REL)


def test_fixture_grid2mesh_exact(fixture):
    d, g = fixture["d"], fixture["g"]
    assert np.array_equal(g.grid2mesh.senders, d["g2m_senders"])
    assert np.array_equal(g.grid2mesh.receivers, d["g2m_receivers"])


def test_fixture_mesh2grid_exact(fixture):
    """Edge by edge, the grid nodes between equally near faces included."""
    d, g, m = fixture["d"], fixture["g"], fixture["mesh"]
    assert np.array_equal(g.mesh2grid.senders, d["m2g_senders"])
    assert np.array_equal(g.mesh2grid.receivers, d["m2g_receivers"])
    # Nodes between equally near faces are many; there the official face may hold the node
    # in its cone only on its boundary, or not at all.
    points = grid_mesh.grid_positions(g.grid_lat, g.grid_lon)
    _, by_trimesh = grid_mesh.nearest_flat_faces(points, g.mesh_node_xyz, m.finest_faces)
    assert by_trimesh.sum() == {"official_tiny": 42, "official_small": 84}[fixture["name"]]
    tri = m.vertices[d["m2g_senders"].reshape(-1, 3)]
    not_inside = _cone(points.astype(np.float64), tri).min(axis=1) <= 0
    assert not_inside.sum() == {"official_tiny": 7, "official_small": 25}[fixture["name"]]
    assert np.all(by_trimesh[not_inside])


def test_fixture_node_features_exact(fixture):
    d, g = fixture["d"], fixture["g"]
    assert g.grid_node_features.dtype == np.float32
    assert np.array_equal(g.grid_node_features, d["feat_grid_nodes"])
    # sin/cos of the mesh angles: float32 rounding (see ANGLE_ATOL_DEG).
    np.testing.assert_allclose(g.mesh_node_features, d["feat_mesh_nodes"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name,key", [("grid2mesh", "g2m"), ("mesh", "mesh")])
def test_fixture_edge_features(fixture, name, key):
    d, g = fixture["d"], fixture["g"]
    es = getattr(g, name)
    assert es.features.dtype == np.float32 and es.features.shape == (es.num_edges, 4)
    np.testing.assert_allclose(es.features, d[f"feat_{key}_edges"], rtol=0, atol=1e-5)
    # The official float64 features, to float32 rounding of the angles they start from.
    np.testing.assert_allclose(es.features, d[f"feat_{key}_edges_f64"], rtol=0, atol=1e-5)
    assert es.features[:, 0].max() == 1.0


def test_fixture_edge_features_float64_on_official_edges(fixture):
    """Raw float64 features on the official edge lists match to ~1e-14."""
    d = fixture["d"]
    grid = (d["node_lat"], d["node_lon"])
    mesh = (d["mesh_node_lat"], d["mesh_node_lon"])
    for key, snd, rcv in (("g2m", grid, mesh), ("mesh", mesh, mesh), ("m2g", mesh, grid)):
        raw = features_lib.raw_edge_features(*snd, *rcv, d[f"{key}_senders"], d[f"{key}_receivers"])
        np.testing.assert_allclose(raw / raw[:, 0].max(), d[f"feat_{key}_edges_f64"],
                                   rtol=0, atol=1e-13)


def test_fixture_mesh2grid_features(fixture):
    d, g = fixture["d"], fixture["g"]
    np.testing.assert_allclose(g.mesh2grid.features, d["feat_m2g_edges"], rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- connectivity

@pytest.mark.parametrize("resolution,splits", [(4.0, 3), (1.0, 5), (30.0, 0)])
def test_grid_mesh_connectivity(resolution, splits):
    g = graphs_lib.build_graphs(resolution, splits, cache=False)
    ng, nm = g.num_grid_nodes, g.num_mesh_nodes
    assert ng == ModelConfig(resolution=resolution, mesh_splits=splits).num_grid_nodes
    # mesh2grid: three edges per grid node, from a finest face nearest to the node (which
    # holds it in its cone up to the width of the band of equally near faces).
    m2g = g.mesh2grid
    assert m2g.num_edges == 3 * ng
    assert np.array_equal(m2g.receivers, np.repeat(np.arange(ng, dtype=np.int32), 3))
    mm = icosahedral.multimesh(splits)
    tri_ids = m2g.senders.reshape(-1, 3).astype(np.int64)
    faces = mm.finest_faces.astype(np.int64)
    face_keys = set(map(tuple, faces.tolist()))
    assert all(tuple(t) in face_keys for t in tri_ids[:: max(1, ng // 5000)].tolist())
    points = grid_mesh.grid_positions(g.grid_lat, g.grid_lon).astype(np.float64)
    cone = _cone(points, mm.vertices[tri_ids])
    assert cone.min() >= -1e-6
    # grid2mesh: sorted, unique, within the radius; every mesh node reached.
    g2m = g.grid2mesh
    key = g2m.senders.astype(np.int64) * nm + g2m.receivers
    assert np.all(np.diff(key) > 0)
    dist = np.linalg.norm(points[g2m.senders] - mm.vertices[g2m.receivers], axis=1)
    assert dist.max() <= g.query_radius * (1 + 1e-12)
    if resolution <= 4.0:
        assert np.unique(g2m.receivers).size == nm
    # Spot check completeness: brute force for a few grid nodes.
    for node in np.linspace(0, ng - 1, 7).astype(int):
        d_all = np.linalg.norm(mm.vertices - points[node], axis=1)
        expect = np.flatnonzero(d_all <= g.query_radius)
        assert np.array_equal(g2m.receivers[g2m.senders == node], expect)
    # Features: first column is the normalised chord length.
    assert g.mesh.features[:, 0].max() == 1.0
    assert np.all(g.mesh2grid.features[:, 0] <= 1.0)
    assert g.mesh.normalization == pytest.approx(mm.level0_edge_length, rel=1e-6)


def test_mesh2grid_normalization_factor():
    a = graphs_lib.build_graphs(10.0, 2, cache=False)
    b = graphs_lib.build_graphs(10.0, 2, mesh2grid_edge_normalization_factor=0.5, cache=False)
    assert b.mesh2grid.normalization == 0.5
    np.testing.assert_allclose(b.mesh2grid.features, a.mesh2grid.features
                               * (a.mesh2grid.normalization / 0.5), rtol=1e-6, atol=1e-7)
    assert np.array_equal(a.grid2mesh.features, b.grid2mesh.features)


@pytest.mark.parametrize("factor", [1e-40, 5e-324])
def test_a_mesh2grid_factor_too_small_for_float32_is_refused_before_caching(factor, tmp_path):
    # Features of |d| / factor beyond float32's largest number would be inf: refused, named,
    # with the least factor that works, and nothing is cached (a later load would find the
    # file damaged and rebuild it every time).
    with pytest.raises(ValueError) as e:
        graphs_lib.build_graphs(30.0, 1, mesh2grid_edge_normalization_factor=factor,
                                cache_dir=tmp_path)
    message = str(e.value)
    assert message.startswith(f"mesh2grid_edge_normalization_factor={factor!r} is invalid: "
                              "None or a number >= "), message
    assert "stay finite in float32" in message and "\n" not in message
    assert not list(tmp_path.iterdir())
    least = float(message.split(">= ")[1].split()[0])
    g = graphs_lib.build_graphs(30.0, 1, mesh2grid_edge_normalization_factor=least,
                                cache_dir=tmp_path)
    assert np.isfinite(g.mesh2grid.features).all() and g.mesh2grid.features.max() > 1e38
    again, source = graphs_lib.load_or_build_graphs(30.0, 1, 0.6, least, cache_dir=tmp_path)
    assert source.loaded  # the cached file is sound
    _assert_same(g, again)
    # The features themselves: N named as the caller names it.
    lat, lon = np.array([0.0, 0.0]), np.array([0.0, 90.0])
    with pytest.raises(ValueError, match=r"^normalization=1e-40 is invalid: None or a number"):
        features_lib.edge_features(lat, lon, lat, lon, np.array([0]), np.array([1]), 1e-40)


# ----------------------------------------------------------------------------- API, cache

def _assert_same(a: graphs_lib.Graphs, b: graphs_lib.Graphs) -> None:
    for f in ("resolution", "mesh_splits", "radius_query_fraction_edge_length", "query_radius"):
        assert getattr(a, f) == getattr(b, f)
    for f in ("grid_lat", "grid_lon", "grid_node_features", "mesh_node_features",
              "mesh_node_xyz"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y)
    for name in ("grid2mesh", "mesh", "mesh2grid"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.normalization == y.normalization
        for f in ("senders", "receivers", "features"):
            assert getattr(x, f).dtype == getattr(y, f).dtype
            assert np.array_equal(getattr(x, f), getattr(y, f))


def test_cache_roundtrip_and_corruption(tmp_path, monkeypatch):
    first = graphs_lib.build_graphs(10.0, 2, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1 and files[0] == graphs_lib.cache_path(10.0, 2, cache_dir=tmp_path)
    assert not list(tmp_path.glob("*.tmp"))

    def no_build(*args, **kw):
        raise AssertionError("rebuilt although cached")

    real_build = graphs_lib._build
    monkeypatch.setattr(graphs_lib, "_build", no_build)
    second = graphs_lib.build_graphs(10.0, 2, cache_dir=tmp_path)
    _assert_same(first, second)

    # Corrupt files are rebuilt, not fatal.
    monkeypatch.setattr(graphs_lib, "_build", real_build)
    for garbage in (b"not a zip file", files[0].read_bytes()[:200]):
        files[0].write_bytes(garbage)
        rebuilt = graphs_lib.build_graphs(10.0, 2, cache_dir=tmp_path)
        _assert_same(first, rebuilt)
        monkeypatch.setattr(graphs_lib, "_build", no_build)
        _assert_same(first, graphs_lib.build_graphs(10.0, 2, cache_dir=tmp_path))
        monkeypatch.setattr(graphs_lib, "_build", real_build)

    # Different parameters get a different file.
    other = graphs_lib.cache_path(10.0, 2, 0.7, cache_dir=tmp_path)
    assert other != files[0]


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GCLAB_CACHE_DIR", str(tmp_path / "env"))
    g = graphs_lib.graphs_for(ModelConfig(resolution=30.0, mesh_splits=1))
    assert len(list((tmp_path / "env").glob("*.npz"))) == 1
    assert g.counts()["mesh_nodes"] == 42 and g.n_lat == 7 and g.n_lon == 12
    uncached = graphs_lib.graphs_for(ModelConfig(resolution=30.0, mesh_splits=1), cache=False)
    _assert_same(g, uncached)


@pytest.mark.parametrize("kwargs", [
    {"resolution": 7.0, "mesh_splits": 2},
    {"resolution": -1.0, "mesh_splits": 2},
    {"resolution": 0.0, "mesh_splits": 2},
    {"resolution": 10.0, "mesh_splits": -1},
    {"resolution": 10.0, "mesh_splits": 8},
    {"resolution": 10.0, "mesh_splits": 2.5},
    {"resolution": 10.0, "mesh_splits": 2, "radius_query_fraction_edge_length": 0.0},
    {"resolution": 10.0, "mesh_splits": 2, "mesh2grid_edge_normalization_factor": -1.0},
])
def test_bad_arguments(kwargs, tmp_path):
    with pytest.raises(ValueError):
        graphs_lib.build_graphs(**kwargs, cache_dir=tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, named", [
    ((4.0, 2.7), "mesh_splits=2.7"),
    ((4.0, True), "mesh_splits=True"),
    (("x", 2), "resolution='x'"),
    ((4.0, 2, "0.6"), "radius_query_fraction_edge_length='0.6'"),
])
def test_cache_path_refuses_what_build_graphs_refuses(args, named):
    from gclab.config import WrongType

    # 2.7 or True splits would name the cache of 2 or 1 splits.
    with pytest.raises(WrongType, match=f"^ModelConfig.{named} is invalid: "):
        graphs_lib.cache_path(*args)


def test_cache_path_accepts_numpy_numbers_and_refuses_a_cache_dir_of_the_wrong_kind(tmp_path):
    from gclab.config import WrongType

    assert (graphs_lib.cache_path(np.float64(4.0), np.int64(2), cache_dir=tmp_path)
            == graphs_lib.cache_path(4.0, 2, cache_dir=tmp_path))
    with pytest.raises(WrongType, match=r"^cache_path cache_dir=3 is invalid: None or a path"):
        graphs_lib.cache_path(4.0, 2, cache_dir=3)


@pytest.mark.parametrize("call, message", [
    (lambda: graphs_lib.graphs_for("cpu-4x32"), "^graphs_for needs a ModelConfig, not a str$"),
    (lambda: graphs_lib.build_graphs(10.0, 2, cache="no"),
     r"^cache='no' is invalid: True or False, not a str$"),
    (lambda: graphs_lib.build_graphs(10.0, 2, cache_dir=3),
     r"^cache_dir=3 is invalid: None or a path, not an int$"),
])
def test_graph_arguments_of_the_wrong_kind_are_type_errors(call, message):
    from gclab.config import WrongType

    with pytest.raises(WrongType, match=message):
        call()
