"""Lat/lon grid and the grid <-> mesh connectivity (numpy + scipy).

The grid is pole-inclusive: latitudes ``linspace(-90, 90, 180/res + 1)``, longitudes
``arange(0, 360, res)``; grid nodes are flattened latitude-major
(``g = i_lat * n_lon + i_lon``). Grid node positions are unit vectors computed from the
float32 lat/lon, in float32 arithmetic, as in the official code.

* grid2mesh: an edge (grid node -> mesh node) for every pair whose chord distance is at
  most the query radius; sorted by sender, then receiver.
* mesh2grid: each grid node receives three edges from the vertices of the finest-mesh
  triangle that contains it, in the triangle's stored order.

Shape glossary:
  Ng: grid nodes (n_lat * n_lon).
  Nm: mesh nodes.
  Nf: faces of the finest mesh level.
  E:  edges of one edge set.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

# Grid points processed per chunk in the mesh2grid containment search.
_M2G_CHUNK = 1 << 18
# Candidate faces (nearest centroids) tested per grid point.
_M2G_CANDIDATES = 8


def _grid_size(resolution: float) -> tuple[int, int]:
    n_lat = int(round(180.0 / resolution)) + 1
    n_lon = int(round(360.0 / resolution))
    return n_lat, n_lon


def grid_latitudes(resolution: float) -> np.ndarray:
    """Pole-inclusive latitudes in degrees, ascending.

    Args:
      resolution: grid spacing in degrees (must divide 180).

    Returns:
      [n_lat] float64, ``linspace(-90, 90, 180/resolution + 1)``.
    """
    n_lat, _ = _grid_size(resolution)
    return np.linspace(-90.0, 90.0, n_lat)


def grid_longitudes(resolution: float) -> np.ndarray:
    """Longitudes in degrees from 0 (360 excluded).

    Args:
      resolution: grid spacing in degrees.

    Returns:
      [n_lon] float64, ``arange(n_lon) * resolution``.
    """
    _, n_lon = _grid_size(resolution)
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


def _cone_coordinates(points: np.ndarray, tri: np.ndarray) -> np.ndarray:
    """Signed volumes telling on which side of each triangle edge a point lies.

    Args:
      points: [P, 3] float64.
      tri: [P, K, 3, 3] float64 triangle vertices (counter-clockwise from outside).

    Returns:
      [P, K, 3] float64, det(v_i, v_{i+1}, p) for the three edges; all >= 0 means the
      ray through p hits the triangle.
    """
    a, b, c = tri[:, :, 0], tri[:, :, 1], tri[:, :, 2]  # [P, K, 3] each
    p = points[:, None, :]  # [P, 1, 3]
    return np.stack(
        [
            np.einsum("pkx,pkx->pk", np.cross(a, b), np.broadcast_to(p, a.shape)),
            np.einsum("pkx,pkx->pk", np.cross(b, c), np.broadcast_to(p, a.shape)),
            np.einsum("pkx,pkx->pk", np.cross(c, a), np.broadcast_to(p, a.shape)),
        ],
        axis=-1,
    )  # [P, K, 3]


def containing_faces(
    points: np.ndarray, mesh_xyz: np.ndarray, faces: np.ndarray
) -> np.ndarray:
    """Index of a face containing each point (vectorised, chunked).

    Candidates are the faces with the nearest centroids; among candidates that contain
    the point, the one with the nearest centroid wins (ties on shared edges resolved
    that way); if rounding leaves none containing it, the candidate that comes closest
    (largest smallest normalised cone coordinate) is taken.

    Args:
      points: [P, 3] unit vectors.
      mesh_xyz: [Nm, 3] mesh vertices.
      faces: [Nf, 3] counter-clockwise faces.

    Returns:
      [P] int64 face indices.
    """
    verts = np.asarray(mesh_xyz, dtype=np.float64)  # [Nm, 3]
    corners = verts[faces]  # [Nf, 3, 3]
    centroids = corners.mean(axis=1)  # [Nf, 3]
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    # Normalise cone coordinates by edge cross-product length, so they compare
    # across faces of different size.
    edge_scale = np.stack(
        [
            np.linalg.norm(np.cross(corners[:, 0], corners[:, 1]), axis=1),
            np.linalg.norm(np.cross(corners[:, 1], corners[:, 2]), axis=1),
            np.linalg.norm(np.cross(corners[:, 2], corners[:, 0]), axis=1),
        ],
        axis=1,
    )  # [Nf, 3]
    tree = cKDTree(centroids)
    k = min(_M2G_CANDIDATES, faces.shape[0])
    out = np.empty(points.shape[0], dtype=np.int64)  # [P]
    for start in range(0, points.shape[0], _M2G_CHUNK):
        p = np.asarray(points[start:start + _M2G_CHUNK], dtype=np.float64)  # [C, 3]
        _, cand = tree.query(p, k=k)  # [C, K], nearest first
        cand = cand.reshape(p.shape[0], k)
        cone = _cone_coordinates(p, corners[cand]) / edge_scale[cand]  # [C, K, 3]
        worst = cone.min(axis=-1)  # [C, K]
        inside = worst >= 0  # [C, K]
        first_inside = np.argmax(inside, axis=1)  # [C]
        best_effort = np.argmax(worst, axis=1)  # [C]
        pick = np.where(inside.any(axis=1), first_inside, best_effort)  # [C]
        out[start:start + p.shape[0]] = cand[np.arange(p.shape[0]), pick]
    return out


def mesh2grid_edges(
    grid_xyz: np.ndarray, mesh_xyz: np.ndarray, faces: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Edges from the three vertices of each grid node's containing finest-mesh face.

    Args:
      grid_xyz: [Ng, 3] grid node unit vectors.
      mesh_xyz: [Nm, 3] mesh vertices.
      faces: [Nf, 3] finest-level faces.

    Returns:
      senders: [3 Ng] int32 mesh nodes (face vertices in stored order).
      receivers: [3 Ng] int32, ``repeat(arange(Ng), 3)``.
    """
    face_index = containing_faces(grid_xyz, mesh_xyz, faces)  # [Ng]
    senders = faces[face_index].reshape(-1).astype(np.int32)  # [3 Ng]
    receivers = np.repeat(np.arange(grid_xyz.shape[0], dtype=np.int32), 3)  # [3 Ng]
    return senders, receivers
