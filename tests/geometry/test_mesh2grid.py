"""mesh2grid by the official rule: the nearest face of the flat finest mesh, ties by trimesh.

Every grid node's face is checked against an independent brute force (the distance from
the node to every face of the finest mesh, by the closest-point regions of Ericson's
"Real-Time Collision Detection", 5.1.5), and, where several faces are equally near,
against the face `trimesh.proximity.closest_point` returns when called as the official
code calls it (all grid nodes at once, float32 mesh and grid positions).
"""

from __future__ import annotations

import numpy as np
import pytest
import trimesh
from scipy.spatial.distance import cdist

from gclab import cli
from gclab.geometry import graphs as graphs_lib
from gclab.geometry import grid_mesh, icosahedral

# Brute force: two faces within this of a node's smallest distance are equally near. The
# float64 distances below are good to ~1e-18 here; distinct faces differ by > 1e-16.
EQUAL = 1e-14


def _closest_points(p: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """[M, 3] closest point of triangle (a, b, c) to p, all [M, 3], pair by pair."""
    ab, ac = b - a, c - a
    ap, bp, cp = p - a, p - b, p - c
    d1, d2 = (ap * ab).sum(-1), (ap * ac).sum(-1)  # [M]
    d3, d4 = (bp * ab).sum(-1), (bp * ac).sum(-1)
    d5, d6 = (cp * ab).sum(-1), (cp * ac).sum(-1)
    va, vb, vc = d3 * d6 - d5 * d4, d5 * d2 - d1 * d6, d1 * d4 - d3 * d2
    with np.errstate(divide="ignore", invalid="ignore"):
        t_ab = d1 / (d1 - d3)
        t_ac = d2 / (d2 - d6)
        t_bc = (d4 - d3) / ((d4 - d3) + (d5 - d6))
        denom = va + vb + vc
        v, w = vb / denom, vc / denom
    # Regions in Ericson's order; the first that holds wins.
    regions = [
        ((d1 <= 0) & (d2 <= 0), a),  # vertex a
        ((d3 >= 0) & (d4 <= d3), b),  # vertex b
        ((vc <= 0) & (d1 >= 0) & (d3 <= 0), a + t_ab[:, None] * ab),  # side ab
        ((d6 >= 0) & (d5 <= d6), c),  # vertex c
        ((vb <= 0) & (d2 >= 0) & (d6 <= 0), a + t_ac[:, None] * ac),  # side ac
        ((va <= 0) & (d4 - d3 >= 0) & (d5 - d6 >= 0), b + t_bc[:, None] * (c - b)),  # side bc
    ]
    out = a + v[:, None] * ab + w[:, None] * ac  # inside
    for region, point in regions[::-1]:
        out = np.where(region[:, None], point, out)
    return out


def brute_force_distances(points: np.ndarray, verts: np.ndarray, faces: np.ndarray):
    """The distance from every point to every face that can be nearest, float64.

    Every face is considered; a face is left out only when it is provably not among the
    nearest: a face lies within the ball of radius r_f around its centroid c_f, so its
    distance from p is between |p - c_f| - r_f and |p - c_f| + r_f.

    Returns:
      point, face, distance: [M] each, the pairs kept (every face within 1e-9 of a
      point's nearest is among them).
    """
    points = points.astype(np.float64)
    corners = verts[faces].astype(np.float64)  # [Nf, 3, 3]
    centre = corners.mean(axis=1)  # [Nf, 3]
    radius = np.linalg.norm(corners - centre[:, None], axis=-1).max(axis=1)  # [Nf]
    kept_p, kept_f = [], []
    for s in range(0, points.shape[0], 2048):
        q = points[s:s + 2048]
        to_centre = cdist(q, centre)  # [Q, Nf]
        upper = (to_centre + radius).min(axis=1)  # [Q]
        i, f = np.nonzero(to_centre - radius <= upper[:, None] + 1e-9)
        kept_p.append(s + i)
        kept_f.append(f)
    i, f = np.concatenate(kept_p), np.concatenate(kept_f)
    a, b, c = (corners[f, k] for k in range(3))
    closest = _closest_points(points[i], a, b, c)
    return i, f, np.linalg.norm(points[i] - closest, axis=-1)


def _official_faces(points: np.ndarray, verts32: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """The faces trimesh returns, called on all points as the official code does."""
    mesh = trimesh.Trimesh(vertices=verts32, faces=faces)
    return trimesh.proximity.closest_point(mesh, points)[2]


def _setup(resolution: float, splits: int):
    mm = icosahedral.multimesh(splits)
    verts32 = mm.vertices.astype(np.float32)
    lat, lon = grid_mesh.grid_latitudes(resolution), grid_mesh.grid_longitudes(resolution)
    return mm, verts32, grid_mesh.grid_positions(lat, lon)


def test_brute_force_distance_is_right():
    """The test's own distance: known cases on one triangle in the z = 0 plane."""
    verts = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0]])
    points = np.array([[0.2, 0.2, 3], [-1, -1, 0], [2, 0, 0], [0.5, -2, 1], [1, 1, 0],
                       [0.3, 0.5, -2]])
    want = [3.0, np.sqrt(2), 1.0, np.sqrt(5), np.sqrt(0.5), 2.0]
    i, f, d = brute_force_distances(points, verts, np.array([[0, 1, 2]]))
    assert np.array_equal(i, np.arange(6)) and np.all(f == 0)
    np.testing.assert_allclose(d, want, rtol=1e-12)


def _nearest_sets(points, verts, faces):
    """Per point: the smallest distance, and the sorted faces within EQUAL of it."""
    i, f, d = brute_force_distances(points, verts, faces)
    nearest = np.full(points.shape[0], np.inf)
    np.minimum.at(nearest, i, d)
    close = d <= nearest[i] + EQUAL
    sets = [[] for _ in range(points.shape[0])]
    for node, face in zip(i[close].tolist(), f[close].tolist()):
        sets[node].append(face)
    return nearest, [sorted(x) for x in sets], (i, f, d)


# (resolution, splits) -> grid nodes with several equally near faces
GEOMETRIES = {(12.0, 1): 42, (5.0, 2): 114, (4.0, 3): 108, (2.0, 4): 234}


@pytest.mark.parametrize("resolution,splits", sorted(GEOMETRIES))
def test_faces_are_nearest_and_ties_are_trimesh(resolution, splits):
    mm, verts32, grid = _setup(resolution, splits)
    faces = mm.finest_faces
    built = graphs_lib.build_graphs(resolution, splits, cache=False)
    chosen_vertices = built.mesh2grid.senders.reshape(-1, 3)  # [Ng, 3]
    face_of = {tuple(f): i for i, f in enumerate(faces.tolist())}
    chosen = np.array([face_of[tuple(t)] for t in chosen_vertices.tolist()])  # [Ng]

    nearest, sets, _ = _nearest_sets(grid, verts32, faces)
    # Every node's face is one of its nearest flat faces, the nearest where one is ...
    assert all(face in near for face, near in zip(chosen.tolist(), sets))
    ties = np.array([len(near) > 1 for near in sets])  # [Ng]
    # ... and where several are equally near, the one trimesh returns.
    assert ties.sum() == GEOMETRIES[resolution, splits]
    official = _official_faces(grid, verts32, faces)
    assert np.array_equal(chosen[ties], official[ties])
    # These are real choices: trimesh does not always take the first equally near face.
    assert any(o != near[0] for o, near, t in zip(official, sets, ties) if t)
    # gclab leaves all of them, and hardly any others, to trimesh.
    _, by_trimesh = grid_mesh.nearest_flat_faces(grid, verts32, faces)
    assert np.all(by_trimesh[ties]) and by_trimesh.sum() <= ties.sum() + 5


@pytest.mark.parametrize("resolution,splits", [(5.0, 3), (1.0, 5), (2.0, 6)])
def test_faces_equal_trimesh_on_every_node(resolution, splits):
    """Finer meshes, where trimesh's own tolerance moves feet onto sides, too (6 splits)."""
    mm, verts32, grid = _setup(resolution, splits)
    face_index, by_trimesh = grid_mesh.nearest_flat_faces(grid, verts32, mm.finest_faces)
    official = _official_faces(grid, verts32, mm.finest_faces)
    assert np.array_equal(face_index, official)
    assert 0 < by_trimesh.sum() < 0.05 * grid.shape[0]


def test_trimesh_snapping_band_is_needed():
    """At 6 splits trimesh takes, for a few nodes, a face a hair farther than the nearest.

    Its closest-point routine moves a foot of perpendicular lying within its tolerance of
    a side onto that side; gclab leaves such nodes to trimesh and so agrees with it.
    """
    mm, verts32, grid = _setup(2.0, 6)
    faces = mm.finest_faces
    face_index, by_trimesh = grid_mesh.nearest_flat_faces(grid, verts32, faces)
    nodes = np.flatnonzero(by_trimesh)
    i, f, d = brute_force_distances(grid[nodes], verts32, faces)
    nearest = np.full(nodes.size, np.inf)
    np.minimum.at(nearest, i, d)
    chosen = f == face_index[nodes][i]
    excess = np.zeros(nodes.size)
    excess[i[chosen]] = d[chosen] - nearest[i[chosen]]  # [T]
    assert np.all(excess < 1e-10)
    assert np.sum(excess > 1e-12) == 3
    assert grid_mesh._TRIMESH_TOL_ZERO == trimesh.constants.tol.zero


@pytest.mark.parametrize("splits", range(7))
def test_finest_mesh_is_convex(splits):
    """The shortcut of `nearest_flat_faces` (deep in a face's prism: that face) needs it."""
    mm = icosahedral.multimesh(splits)
    verts = mm.vertices.astype(np.float32).astype(np.float64)
    faces = mm.finest_faces
    normal = np.cross(verts[faces[:, 1]] - verts[faces[:, 0]],
                      verts[faces[:, 2]] - verts[faces[:, 0]])  # [Nf, 3]
    # Every vertex of the faces across a side lies below the face's plane.
    owner = {(int(f[i]), int(f[(i + 1) % 3])): n for n, f in enumerate(faces) for i in range(3)}
    for side in range(3):
        a, b = faces[:, side], faces[:, (side + 1) % 3]
        other = np.array([owner[int(y), int(x)] for x, y in zip(a, b)])  # the face across
        height = np.einsum("fx,fgx->fg", normal,
                           verts[faces[other]] - verts[faces[:, 0]][:, None])  # [Nf, 3]
        assert height.max() <= 1e-12 * np.abs(height).max()
        assert (height < -1e-12).any(axis=1).all()


def test_mesh2grid_edges_are_face_vertices_in_stored_order():
    mm, verts32, grid = _setup(4.0, 3)
    senders, receivers = grid_mesh.mesh2grid_edges(grid, verts32, mm.finest_faces)
    face_index, _ = grid_mesh.nearest_flat_faces(grid, verts32, mm.finest_faces)
    assert senders.dtype == receivers.dtype == np.int32
    assert np.array_equal(senders, mm.finest_faces[face_index].reshape(-1))
    assert np.array_equal(receivers, np.repeat(np.arange(grid.shape[0]), 3))


# ----------------------------------------------------------------------------- cache

def test_cache_key_changed_with_the_rule(tmp_path, monkeypatch):
    assert graphs_lib.GEOMETRY_VERSION != "gclab-geometry-1"
    now = graphs_lib.cache_path(10.0, 2, cache_dir=tmp_path)
    graphs_lib.build_graphs(10.0, 2, cache_dir=tmp_path)
    monkeypatch.setattr(graphs_lib, "GEOMETRY_VERSION", "gclab-geometry-1")
    before = graphs_lib.cache_path(10.0, 2, cache_dir=tmp_path)
    assert before != now
    # A file cached under the old key is never read under the new one.
    with np.load(now) as z:
        assert str(z["cache_key"][()]) == now.stem
    assert graphs_lib._load_cache(now, before.stem) is None


# ----------------------------------------------------------------------------- gclab graph --save

def test_cli_graph_save_writes_the_graphs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GCLAB_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "graphs.npz"
    assert cli.main(["graph", "--resolution", "10", "--mesh-splits", "2", "--save", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    assert not list(tmp_path.glob("*.tmp"))
    g = graphs_lib.build_graphs(10.0, 2, cache=False)
    with np.load(out) as z:
        for name in ("grid2mesh", "mesh", "mesh2grid"):
            es = getattr(g, name)
            assert np.array_equal(z[f"{name}_senders"], es.senders)
            assert np.array_equal(z[f"{name}_receivers"], es.receivers)
            assert np.array_equal(z[f"{name}_features"], es.features)
        assert np.array_equal(z["grid_node_features"], g.grid_node_features)
        assert np.array_equal(z["mesh_node_features"], g.mesh_node_features)


@pytest.mark.parametrize("where,message", [("missing/graphs.npz", "does not exist"),
                                           (".", "is a directory")])
def test_cli_graph_save_checks_the_path_first(tmp_path, monkeypatch, capsys, where, message):
    def no_build(*args, **kw):
        raise AssertionError("built before checking --save")

    # What `gclab graph` builds (or loads) its graphs with, as the CLI module sees it.
    monkeypatch.setattr(cli, "load_or_build_graphs", no_build)
    path = tmp_path / where
    code = cli.main(["graph", "--resolution", "10", "--mesh-splits", "2", "--save", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"gclab graph: error: --save {path}: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "missing").exists()
