"""Lat/lon grid and the grid <-> mesh connectivity (numpy + scipy; trimesh for ties).

The grid is pole-inclusive: latitudes ``linspace(-90, 90, 180/res + 1)``, longitudes
``arange(0, 360, res)``; grid nodes are flattened latitude-major
(``g = i_lat * n_lon + i_lon``). Grid node positions are unit vectors computed from the
float32 lat/lon, in float32 arithmetic, as in the official code.

* grid2mesh: an edge (grid node -> mesh node) for every pair whose chord distance is at
  most the query radius; sorted by sender, then receiver.
* mesh2grid: each grid node receives three edges from the vertices of one finest-mesh
  face, in the face's stored order. The face is the official one: the face of the *flat*
  finest mesh (its vertices joined by plane triangles) nearest to the node's unit vector,
  as ``trimesh.proximity.closest_point`` returns it for
  ``trimesh.Trimesh(vertices=float32 mesh vertices, faces=finest faces)``.

Where one face is nearest, it is the face whose cone holds the node's direction (at every
geometry tested here); but the nearest face is not always unique. The sphere bulges above
the flat mesh, so along every edge runs a band where the nearest point of both faces is
on the shared edge itself: there both faces are exactly equally near (around a vertex,
all of its faces are). The band is about ``L**3 / 11`` radians wide for edges of chord
``L``: 1.5 km on the Earth at 3 splits, 24 m at 5, 3 m at 6. Mesh edges run along the
meridians that are multiples of 60 deg, so lat/lon grids put nodes all along them into these
bands. There the official choice is whatever trimesh returns: trimesh compares squared
distances and, where the two smallest differ by less than its merge tolerance (1e-8) and
both exceed it, takes the face whose normal points closer to the node; otherwise its
rounding and the order of its R-tree candidates decide. trimesh's closest-point routine
also moves a foot of perpendicular that lies within a tolerance of a side onto the side
(its ``tol.zero``, 1e-13, on depth x side length x twice the area: about 2e-8, or
0.1 m, at 6 splits), which makes a face and its neighbour equally near in its arithmetic.

gclab computes that face without trimesh wherever one face is nearer than every other by
more than `EQUAL_DISTANCE_MARGIN` and the foot is clear of trimesh's snapping band (with
a margin); trimesh decides the rest (about 0.2% of the nodes at 0.25 deg / 6 splits).

Shape glossary:
  Ng: grid nodes (n_lat * n_lon).
  Nm: mesh nodes.
  Nf: faces of the finest mesh level.
  P:  query points (grid nodes).
  K:  candidate faces per point.
  E:  edges of one edge set.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from gclab.config import ConfigError, ModelConfig

# Grid points processed per chunk in the mesh2grid search.
_M2G_CHUNK = 1 << 18
# Candidate faces (nearest centroids) per grid point: whose prism holds it, then, for
# points near a side, whose distance is measured.
_M2G_FIRST_CANDIDATES = 2
_M2G_CANDIDATES = 8
# Two faces whose distances from a point differ by at most this (unit-sphere lengths) are
# equally near: their order is a matter of float64 rounding (about 1e-16 here), and the
# official choice between them is whatever trimesh returns.
EQUAL_DISTANCE_MARGIN = 1e-12
# A point whose foot of perpendicular lies this deep inside a face (unit-sphere lengths)
# is nearer to it than to any other face by far more than EQUAL_DISTANCE_MARGIN (the mesh
# is convex, so their squared distances differ by at least this squared); shallower
# points get their distances to every candidate face measured.
_PRISM_DEPTH = 1e-5
# trimesh's closest-point routine (`trimesh.triangles.closest_point`) tests the foot of a
# point against each side with an absolute tolerance, trimesh's `tol.zero`: a foot whose
# depth inside a side, times the side's length and twice the face's area, is below it is
# moved onto that side. Feet within _SNAP_MARGIN times that depth are left to trimesh.
_TRIMESH_TOL_ZERO = 1e-13
_SNAP_MARGIN = 100.0


def _grid_size(resolution: float, fn: str) -> tuple[int, int]:
    """(n_lat, n_lon) of a grid spacing; raises ValueError where it makes no grid.

    The rule is `ModelConfig`'s (a number of degrees in (0, 180] that divides 180, of at
    most `gclab.config.MAX_GRID_NODES` nodes): a spacing that does not divide 180 gives
    rows that stop short of a pole, and 0, a negative number or NaN give no grid at all.
    """
    try:
        ModelConfig(resolution=resolution)
    except ConfigError as e:
        raise ValueError(f"{fn} resolution={resolution!r} is invalid: {e.allowed}") from None
    n_lat = int(round(180.0 / resolution)) + 1
    n_lon = int(round(360.0 / resolution))
    return n_lat, n_lon


def grid_latitudes(resolution: float) -> np.ndarray:
    """Pole-inclusive latitudes in degrees, ascending.

    Args:
      resolution: grid spacing in degrees (must divide 180).

    Returns:
      [n_lat] float64, ``linspace(-90, 90, 180/resolution + 1)``.

    Raises:
      ValueError: a resolution `ModelConfig` refuses.
    """
    n_lat, _ = _grid_size(resolution, "grid_latitudes")
    return np.linspace(-90.0, 90.0, n_lat)


def grid_longitudes(resolution: float) -> np.ndarray:
    """Longitudes in degrees from 0 (360 excluded).

    Args:
      resolution: grid spacing in degrees (must divide 180).

    Returns:
      [n_lon] float64, ``arange(n_lon) * resolution``.

    Raises:
      ValueError: a resolution `ModelConfig` refuses.
    """
    _, n_lon = _grid_size(resolution, "grid_longitudes")
    return np.arange(n_lon, dtype=np.float64) * float(resolution)


def grid_node_lat_lon(grid_lat: np.ndarray, grid_lon: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-node float32 latitude and longitude, latitude-major.

    Args:
      grid_lat: [n_lat] degrees.
      grid_lon: [n_lon] degrees.

    Returns:
      node_lat, node_lon: [Ng] float32 degrees.
    """
    lat = np.asarray(grid_lat, dtype=np.float32)  # [n_lat]
    lon = np.asarray(grid_lon, dtype=np.float32)  # [n_lon]
    node_lat = np.repeat(lat, lon.size)  # [Ng]
    node_lon = np.tile(lon, lat.size)  # [Ng]
    return node_lat, node_lon


def lat_lon_to_xyz(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Unit vectors from latitude/longitude in degrees, in the dtype of the inputs.

    Args:
      lat: [N] degrees.
      lon: [N] degrees.

    Returns:
      [N, 3] (cos(phi) sin(theta), sin(phi) sin(theta), cos(theta)) with
      theta = radians(90 - lat), phi = radians(lon).
    """
    phi = np.deg2rad(lon)  # [N]
    theta = np.deg2rad(90 - lat)  # [N]
    sin_theta = np.sin(theta)  # [N]
    return np.stack([np.cos(phi) * sin_theta, np.sin(phi) * sin_theta, np.cos(theta)], axis=-1)


def xyz_to_lat_lon(xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latitude/longitude (degrees, lon in [0, 360)) of unit vectors, in their dtype.

    Args:
      xyz: [N, 3] unit vectors.

    Returns:
      lat, lon: [N] each.
    """
    lon = np.mod(np.rad2deg(np.arctan2(xyz[:, 1], xyz[:, 0])), 360)  # [N]
    lat = 90 - np.rad2deg(np.arccos(xyz[:, 2]))  # [N]
    return lat, lon


def grid_positions(grid_lat: np.ndarray, grid_lon: np.ndarray) -> np.ndarray:
    """Grid node unit vectors, latitude-major, from float32 lat/lon in float32 math.

    Args:
      grid_lat: [n_lat] degrees.
      grid_lon: [n_lon] degrees.

    Returns:
      [Ng, 3] float32.
    """
    lat = np.asarray(grid_lat, dtype=np.float32)  # [n_lat]
    lon = np.asarray(grid_lon, dtype=np.float32)  # [n_lon]
    phi = np.deg2rad(lon)  # [n_lon]
    theta = np.deg2rad(np.float32(90) - lat)  # [n_lat]
    sin_t, cos_t = np.sin(theta)[:, None], np.cos(theta)[:, None]  # [n_lat, 1]
    cos_p, sin_p = np.cos(phi)[None, :], np.sin(phi)[None, :]  # [1, n_lon]
    out = np.empty((lat.size, lon.size, 3), dtype=np.float32)  # [n_lat, n_lon, 3]
    out[..., 0] = cos_p * sin_t
    out[..., 1] = sin_p * sin_t
    out[..., 2] = np.broadcast_to(cos_t, (lat.size, lon.size))
    return out.reshape(-1, 3)  # [Ng, 3]


def grid2mesh_edges(
    grid_xyz: np.ndarray, mesh_xyz: np.ndarray, radius: float
) -> tuple[np.ndarray, np.ndarray]:
    """Radius-query edges from grid nodes to mesh nodes.

    Args:
      grid_xyz: [Ng, 3] grid node unit vectors.
      mesh_xyz: [Nm, 3] mesh node unit vectors.
      radius: chord-distance threshold (inclusive).

    Returns:
      senders: [E] int32 grid node indices, ascending.
      receivers: [E] int32 mesh node indices, ascending within a sender.
    """
    n_mesh = mesh_xyz.shape[0]
    grid_tree = cKDTree(np.asarray(grid_xyz, dtype=np.float64), balanced_tree=False,
                        compact_nodes=False)
    mesh_tree = cKDTree(np.asarray(mesh_xyz, dtype=np.float64))
    pairs = grid_tree.sparse_distance_matrix(mesh_tree, float(radius), output_type="ndarray")
    key = pairs["i"].astype(np.int64) * n_mesh + pairs["j"]  # [E]
    del pairs
    key.sort()
    senders = (key // n_mesh).astype(np.int32)  # [E]
    receivers = (key % n_mesh).astype(np.int32)  # [E]
    return senders, receivers


def point_triangle_distance(points: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Euclidean distance from points to flat triangles (float64).

    The foot of the perpendicular when it falls inside the triangle, else the nearest
    point of the three sides.

    Args:
      points: [..., 3] points.
      triangles: [..., 3, 3] triangle corners, broadcastable against `points`.

    Returns:
      [...] float64 distances.
    """
    p = np.asarray(points, dtype=np.float64)  # [..., 3]
    tri = np.asarray(triangles, dtype=np.float64)  # [..., 3, 3]
    corners = [tri[..., i, :] for i in range(3)]  # 3 x [..., 3]
    sides = [corners[(i + 1) % 3] - corners[i] for i in range(3)]  # 3 x [..., 3]
    normal = np.cross(sides[0], -sides[2])  # [..., 3]
    inside = True
    nearest_side_sq = np.inf
    for corner, side in zip(corners, sides):
        w = p - corner  # [..., 3]
        inside = inside & (_dot(np.cross(normal, side), w) >= 0)
        t = np.clip(_dot(w, side) / _dot(side, side), 0.0, 1.0)  # [...]
        r = w - t[..., None] * side  # [..., 3]
        nearest_side_sq = np.minimum(nearest_side_sq, _dot(r, r))
    height = _dot(normal, p - corners[0])  # [...]
    plane_sq = height * height / _dot(normal, normal)
    return np.sqrt(np.where(inside, plane_sq, nearest_side_sq))


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dot product over the last axis."""
    return np.einsum("...x,...x->...", a, b)


def _face_frames(
    mesh_xyz: np.ndarray, faces: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inward unit side normals in each face's plane, their offsets, and trimesh's band.

    Args:
      mesh_xyz: [Nm, 3] mesh vertices.
      faces: [Nf, 3] counter-clockwise faces.

    Returns:
      inward: [Nf, 3, 3] float64, side i (corner i to i+1) normal, in the face plane,
        pointing into the face.
      offset: [Nf, 3] float64, so that ``inward . p - offset`` is the depth of the foot of
        p's perpendicular inside side i's line (negative outside).
      snap_depth: [Nf, 3] float64, `_SNAP_MARGIN` times the depth below which trimesh
        moves a foot onto side i.
    """
    corners = np.asarray(mesh_xyz, dtype=np.float64)[faces]  # [Nf, 3, 3]
    sides = np.roll(corners, -1, axis=1) - corners  # [Nf, 3, 3]
    normal = np.cross(sides[:, 0], -sides[:, 2])  # [Nf, 3]
    area2 = np.linalg.norm(normal, axis=1)  # [Nf], twice the area
    side_len = np.linalg.norm(sides, axis=2)  # [Nf, 3]
    inward = np.cross((normal / area2[:, None])[:, None, :], sides)  # [Nf, 3, 3]
    inward /= side_len[..., None]
    offset = np.einsum("fsx,fsx->fs", inward, corners)  # [Nf, 3]
    snap_depth = _SNAP_MARGIN * _TRIMESH_TOL_ZERO / (area2[:, None] * side_len)  # [Nf, 3]
    return inward, offset, snap_depth


def nearest_flat_faces(
    points: np.ndarray, mesh_xyz: np.ndarray, faces: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Face of the flat triangle mesh nearest to each point, as trimesh picks it.

    The rule of the official code (see the module docstring): the face that
    ``trimesh.proximity.closest_point`` returns for ``Trimesh(mesh_xyz, faces)``. It is
    computed here without trimesh wherever one face is nearer than every other by more
    than `EQUAL_DISTANCE_MARGIN` and the point's foot is clear of trimesh's snapping band,
    and with trimesh for the few other points.

    Args:
      points: [P, 3] unit vectors (float32 grid positions, as the official code).
      mesh_xyz: [Nm, 3] mesh vertices (float32, as the official code).
      faces: [Nf, 3] counter-clockwise faces.

    Returns:
      face_index: [P] int64.
      by_trimesh: [P] bool, the points decided by trimesh: their nearest faces are equally
        near (to `EQUAL_DISTANCE_MARGIN`), or their foot lies in trimesh's snapping band.
    """
    verts = np.asarray(mesh_xyz, dtype=np.float64)  # [Nm, 3]
    corners = verts[faces]  # [Nf, 3, 3]
    centroids = corners.mean(axis=1)  # [Nf, 3]
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    inward, offset, snap_depth = _face_frames(verts, faces)
    shallow_depth = np.maximum(snap_depth, _PRISM_DEPTH)  # [Nf, 3]
    tree = cKDTree(centroids)

    # 1. The face whose prism holds the point deepest, among the nearest centroids. Deep
    #    inside one face's prism, that face is the nearest by far (the mesh is convex:
    #    tests/test_mesh2grid.py checks it).
    k = min(_M2G_FIRST_CANDIDATES, faces.shape[0])
    face_index = np.empty(points.shape[0], dtype=np.int64)  # [P]
    shallow = np.empty(points.shape[0], dtype=bool)  # [P]
    for start in range(0, points.shape[0], _M2G_CHUNK):
        p = np.asarray(points[start:start + _M2G_CHUNK], dtype=np.float64)  # [C, 3]
        _, cand = tree.query(p, k=k)  # [C, K]
        cand = cand.reshape(p.shape[0], k)
        depth = np.einsum("cksx,cx->cks", inward[cand], p) - offset[cand]  # [C, K, 3]
        best = np.argmax(depth.min(axis=-1), axis=1)  # [C]
        rows = np.arange(p.shape[0])
        best_face = cand[rows, best]  # [C]
        face_index[start:start + p.shape[0]] = best_face
        shallow[start:start + p.shape[0]] = (
            depth[rows, best] < shallow_depth[best_face]).any(axis=1)

    # 2. Near a side: the distance to more candidates, nearest first.
    rows = np.flatnonzero(shallow)  # [S]
    q = np.asarray(points[rows], dtype=np.float64)  # [S, 3]
    k = min(_M2G_CANDIDATES, faces.shape[0])
    _, near = tree.query(q, k=k)  # [S, K]
    near = near.reshape(rows.size, k)
    dist = point_triangle_distance(q[:, None, :], corners[near])  # [S, K]
    order = np.argsort(dist, axis=1)[:, :2]  # [S, 2]
    two = np.take_along_axis(dist, order, axis=1)  # [S, 2]
    nearest = near[np.arange(rows.size), order[:, 0]]  # [S]
    face_index[rows] = nearest

    # 3. Equally near faces, or a foot in trimesh's snapping band: trimesh decides.
    foot = np.einsum("stx,sx->st", inward[nearest], q) - offset[nearest]  # [S, 3]
    undecided = ((two[:, 1] - two[:, 0] <= EQUAL_DISTANCE_MARGIN)
                 | (foot < snap_depth[nearest]).any(axis=1))  # [S]
    by_trimesh = np.zeros(points.shape[0], dtype=bool)  # [P]
    by_trimesh[rows[undecided]] = True
    if undecided.any():
        face_index[by_trimesh] = _trimesh_closest_faces(points[by_trimesh], mesh_xyz, faces)
    return face_index, by_trimesh


def _trimesh_closest_faces(
    points: np.ndarray, mesh_xyz: np.ndarray, faces: np.ndarray
) -> np.ndarray:
    """The faces `trimesh.proximity.closest_point` returns, called as the official code does.

    Args:
      points: [T, 3] query points.
      mesh_xyz: [Nm, 3] mesh vertices.
      faces: [Nf, 3] faces.

    Returns:
      [T] int64 face indices.
    """
    import trimesh  # Slow to import; imported when a graph is built.

    mesh = trimesh.Trimesh(vertices=mesh_xyz, faces=faces)
    _, _, face_index = trimesh.proximity.closest_point(mesh, points)
    return np.asarray(face_index, dtype=np.int64)


def mesh2grid_edges(
    grid_xyz: np.ndarray, mesh_xyz: np.ndarray, faces: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Edges from the three vertices of each grid node's nearest flat finest-mesh face.

    Args:
      grid_xyz: [Ng, 3] grid node unit vectors.
      mesh_xyz: [Nm, 3] mesh vertices.
      faces: [Nf, 3] finest-level faces.

    Returns:
      senders: [3 Ng] int32 mesh nodes (face vertices in stored order).
      receivers: [3 Ng] int32, ``repeat(arange(Ng), 3)``.
    """
    face_index, _ = nearest_flat_faces(grid_xyz, mesh_xyz, faces)  # [Ng]
    senders = faces[face_index].reshape(-1).astype(np.int32)  # [3 Ng]
    receivers = np.repeat(np.arange(grid_xyz.shape[0], dtype=np.int32), 3)  # [3 Ng]
    return senders, receivers
