"""Icosahedral multimesh (numpy only).

The multimesh has the vertices of the finest refinement level and the triangles of every
level 0..splits. Vertex order, face order and rounding follow the official GraphCast
construction bit for bit (checked against the official fixtures in `tests/data`):

* level 0: the 12 vertices ``for c1 in (1, -1): for c2 in (phi, -phi):
  (c1, c2, 0), (0, c1, c2), (c2, 0, c1)``, normalised in float32, then rotated about the
  y axis by ``(pi - 2 arcsin(phi / sqrt(3))) / 2`` (row vectors times ``Ry``, in float64,
  rounded back to float32) so that one face sits on top;
* a split replaces triangle (a, b, c) by ``[a, ab, ca], [ab, b, bc], [ca, bc, c],
  [ab, bc, ca]`` (counter-clockwise kept); midpoints are numbered in order of first use
  over the faces, asking for (a, b), (b, c), (c, a) per face, and are the float32 mean
  of the two end points pushed back onto the unit sphere.

Shape glossary:
  Nm: mesh nodes (vertices of the finest level), ``10 * 4**splits + 2``.
  Fk: faces of level k, ``20 * 4**k``.
  E:  directed multimesh edges, ``3 * sum_k Fk = 20 * (4**(splits + 1) - 1)``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gclab.config import require_count

_PHI = (1.0 + np.sqrt(5.0)) / 2.0

# Level-0 faces, counter-clockwise seen from outside, in the official order.
_ICOSAHEDRON_FACES = np.array(
    [
        [0, 1, 2], [0, 6, 1], [8, 0, 2], [8, 4, 0], [3, 8, 2],
        [3, 2, 7], [7, 2, 1], [0, 4, 6], [4, 11, 6], [6, 11, 5],
        [1, 5, 7], [4, 10, 11], [4, 8, 10], [10, 8, 3], [10, 3, 9],
        [11, 10, 9], [11, 9, 5], [5, 9, 7], [9, 3, 7], [1, 6, 5],
    ],
    dtype=np.int64,
)  # [20, 3]


@dataclasses.dataclass(frozen=True)
class Multimesh:
    """An icosahedral multimesh.

    Attributes:
      splits: number of refinements of the icosahedron.
      vertices: [Nm, 3] float64 unit vectors (values exactly representable in float32,
        as the official mesh is float32).
      faces_per_level: list of splits + 1 int64 arrays [Fk, 3], level 0 first.
      senders: [E] int32 multimesh edge senders (F[:,0], F[:,1], F[:,2] over all faces).
      receivers: [E] int32 multimesh edge receivers (F[:,1], F[:,2], F[:,0]).
      finest_max_edge_length: longest chord of the finest level (float32 arithmetic,
        as the official code).
      level0_edge_length: chord length of an icosahedron edge (the longest mesh edge).
    """

    splits: int
    vertices: np.ndarray
    faces_per_level: list
    senders: np.ndarray
    receivers: np.ndarray
    finest_max_edge_length: float
    level0_edge_length: float

    @property
    def finest_faces(self) -> np.ndarray:
        """[F_splits, 3] faces of the finest level."""
        return self.faces_per_level[-1]

    @property
    def num_nodes(self) -> int:
        return int(self.vertices.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.senders.shape[0])


def _float32_norm(v: np.ndarray) -> np.ndarray:
    """Row norms of float32 vectors, rounded like the official per-vertex norm.

    Products are rounded to float32, summed in float64, rounded to float32, then the
    square root is taken in float32 (what the BLAS float32 dot behind
    ``np.linalg.norm`` of a 3-vector does).

    Args:
      v: [N, 3] float32.

    Returns:
      [N, 1] float32 norms.
    """
    sq = (v * v).astype(np.float64)  # [N, 3]
    total = (sq[:, 0] + sq[:, 1] + sq[:, 2]).astype(np.float32)  # [N]
    return np.sqrt(total)[:, None]  # [N, 1]


def icosahedron() -> tuple[np.ndarray, np.ndarray]:
    """The rotated level-0 icosahedron.

    Returns:
      vertices: [12, 3] float32 unit vectors.
      faces: [20, 3] int64.
    """
    base = []
    for c1 in (1.0, -1.0):
        for c2 in (_PHI, -_PHI):
            base += [(c1, c2, 0.0), (0.0, c1, c2), (c2, 0.0, c1)]
    vertices = np.array(base, dtype=np.float32)  # [12, 3]
    vertices = vertices / _float32_norm(vertices)  # [12, 3] float32
    angle = (np.pi - 2.0 * np.arcsin(_PHI / np.sqrt(3.0))) / 2.0
    c, s = np.cos(angle), np.sin(angle)
    rot_y = np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])  # [3, 3] float64
    vertices = (vertices.astype(np.float64) @ rot_y).astype(np.float32)  # [12, 3]
    return vertices, _ICOSAHEDRON_FACES.copy()


def split_once(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Splits every triangle into four (vectorised).

    Args:
      vertices: [V, 3] float32 unit vectors.
      faces: [F, 3] int64.

    Returns:
      vertices: [V + F * 3 / 2, 3] float32, the old vertices first.
      faces: [4F, 3] int64, the four children of face i at rows 4i..4i+3.
    """
    n_old = vertices.shape[0]
    a, b, c = faces[:, 0], faces[:, 1], faces[:, 2]  # [F] each
    # Requested midpoints in request order: per face (a,b), (b,c), (c,a).
    first = np.stack([a, b, c], axis=1).reshape(-1)  # [3F]
    second = np.stack([b, c, a], axis=1).reshape(-1)  # [3F]
    lo = np.minimum(first, second)  # [3F]
    hi = np.maximum(first, second)  # [3F]
    key = lo * n_old + hi  # [3F]
    uniq, first_pos, inverse = np.unique(key, return_index=True, return_inverse=True)
    # Number unique edges by order of first request.
    order = np.argsort(first_pos, kind="stable")  # [U]
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    mid_index = (n_old + rank[inverse.reshape(-1)]).reshape(-1, 3)  # [F, 3]: ab, bc, ca
    new_lo = uniq[order] // n_old  # [U]
    new_hi = uniq[order] % n_old  # [U]
    mids = (vertices[new_lo] + vertices[new_hi]) / np.float32(2.0)  # [U, 3] float32
    mids = mids / _float32_norm(mids)  # [U, 3] float32
    ab, bc, ca = mid_index[:, 0], mid_index[:, 1], mid_index[:, 2]
    children = np.stack(
        [
            np.stack([a, ab, ca], axis=1),
            np.stack([ab, b, bc], axis=1),
            np.stack([ca, bc, c], axis=1),
            np.stack([ab, bc, ca], axis=1),
        ],
        axis=1,
    ).reshape(-1, 3)  # [4F, 3]
    return np.concatenate([vertices, mids], axis=0), children


def faces_to_edges(faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Directed edges of triangles: 0->1, 1->2, 2->0 (all first edges, then all second...).

    Args:
      faces: [F, 3] int.

    Returns:
      senders, receivers: [3F] int32 each.
    """
    senders = np.concatenate([faces[:, 0], faces[:, 1], faces[:, 2]]).astype(np.int32)
    receivers = np.concatenate([faces[:, 1], faces[:, 2], faces[:, 0]]).astype(np.int32)
    return senders, receivers


def _max_edge_length(vertices: np.ndarray, faces: np.ndarray) -> float:
    """Longest chord over the edges of `faces`, in float32 arithmetic."""
    s, r = faces_to_edges(faces)
    d = vertices[s] - vertices[r]  # [3F, 3] float32
    return float(np.sqrt((d * d).sum(axis=1)).max())


def multimesh(splits: int) -> Multimesh:
    """Builds the icosahedral multimesh with `splits` refinements.

    Args:
      splits: number of refinements, >= 0.

    Returns:
      The multimesh (finest vertices, faces of all levels, directed edges).

    Raises:
      ValueError: `splits` not an integer >= 0 (Python or numpy, not a bool).
    """
    splits = require_count("splits", splits, 0)
    vertices, faces = icosahedron()
    levels = [faces]
    for _ in range(splits):
        vertices, faces = split_once(vertices, faces)
        levels.append(faces)
    all_faces = np.concatenate(levels, axis=0)  # [sum Fk, 3]
    senders, receivers = faces_to_edges(all_faces)
    return Multimesh(
        splits=splits,
        vertices=vertices.astype(np.float64),
        faces_per_level=levels,
        senders=senders,
        receivers=receivers,
        finest_max_edge_length=_max_edge_length(vertices, levels[-1]),
        level0_edge_length=_max_edge_length(vertices[:12], levels[0]),
    )
