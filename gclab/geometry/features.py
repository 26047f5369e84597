"""Static structural features of nodes and edges (numpy).

Node features (float32, computed in float32 from float32 lat/lon):
  ``[cos(theta), cos(phi), sin(phi)] = [sin(lat), cos(lon), sin(lon)]`` with
  ``theta = radians(90 - lat)``, ``phi = radians(lon)``.

Edge features: ``[|d|, d_x, d_y, d_z] / N`` with ``d = R_r x_s - R_r x_r``, where ``x`` are
unit vectors made in float32 from the float32 lat/lon, ``R_r = Ry(pi/2 - theta_r)
Rz(-phi_r)`` takes the receiver to (1, 0, 0) (angles in float32, matrix and products in
float64), and ``N`` is the longest ``|d|`` of the edge set unless given. Returned in float32
(the official features are float64 before the model casts them).

Shape glossary:
  N: nodes of one node set (Ng grid nodes or Nm mesh nodes).
  E: edges of one edge set.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from gclab.geometry.grid_mesh import lat_lon_to_xyz

# Edges processed per chunk (bounds float64 temporaries to a few hundred MB).
_EDGE_CHUNK = 1 << 19
#: The largest float32: a feature beyond it would be stored as inf.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def node_features(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Structural node features.

    Args:
      lat: [N] latitudes in degrees (used as float32).
      lon: [N] longitudes in degrees (used as float32).

    Returns:
      [N, 3] float32 ``[sin(lat), cos(lon), sin(lon)]``.
    """
    lat = np.asarray(lat, dtype=np.float32)  # [N]
    lon = np.asarray(lon, dtype=np.float32)  # [N]
    theta = np.deg2rad(np.float32(90) - lat)  # [N] float32
    phi = np.deg2rad(lon)  # [N] float32
    return np.stack([np.cos(theta), np.cos(phi), np.sin(phi)], axis=-1).astype(np.float32)


def raw_edge_features(
    sender_lat: np.ndarray,
    sender_lon: np.ndarray,
    receiver_lat: np.ndarray,
    receiver_lon: np.ndarray,
    senders: np.ndarray,
    receivers: np.ndarray,
) -> np.ndarray:
    """Unnormalised edge features ``[|d|, d_x, d_y, d_z]`` in float64.

    Args:
      sender_lat, sender_lon: [Ns] degrees of the sender node set (used as float32).
      receiver_lat, receiver_lon: [Nr] degrees of the receiver node set (float32).
      senders: [E] indices into the sender node set.
      receivers: [E] indices into the receiver node set.

    Returns:
      [E, 4] float64.
    """
    s_lat = np.asarray(sender_lat, dtype=np.float32)  # [Ns]
    s_lon = np.asarray(sender_lon, dtype=np.float32)  # [Ns]
    r_lat = np.asarray(receiver_lat, dtype=np.float32)  # [Nr]
    r_lon = np.asarray(receiver_lon, dtype=np.float32)  # [Nr]
    s_xyz = lat_lon_to_xyz(s_lat, s_lon).astype(np.float64)  # [Ns, 3]
    r_xyz = lat_lon_to_xyz(r_lat, r_lon).astype(np.float64)  # [Nr, 3]
    # Per receiver node: rotation R = Ry(b) Rz(a), a = -phi, b = pi/2 - theta (float32).
    a = -np.deg2rad(r_lon).astype(np.float64)  # [Nr]
    theta = np.deg2rad(np.float32(90) - r_lat)  # [Nr] float32
    b = (np.float32(np.pi / 2) - theta).astype(np.float64)  # [Nr]
    ca, sa, cb, sb = np.cos(a), np.sin(a), np.cos(b), np.sin(b)  # [Nr] each
    rot = np.empty((r_lat.size, 3, 3), dtype=np.float64)  # [Nr, 3, 3]
    rot[:, 0, 0], rot[:, 0, 1], rot[:, 0, 2] = cb * ca, -(cb * sa), sb
    rot[:, 1, 0], rot[:, 1, 1], rot[:, 1, 2] = sa, ca, 0.0
    rot[:, 2, 0], rot[:, 2, 1], rot[:, 2, 2] = -(sb * ca), sb * sa, cb
    # The receiver in its own frame (computed once per receiver node).
    r_rot = np.einsum("nij,nj->ni", rot, r_xyz)  # [Nr, 3]

    senders = np.asarray(senders)
    receivers = np.asarray(receivers)
    out = np.empty((senders.shape[0], 4), dtype=np.float64)  # [E, 4]
    for start in range(0, senders.shape[0], _EDGE_CHUNK):
        sl = slice(start, start + _EDGE_CHUNK)
        rcv = receivers[sl]  # [C]
        m = rot[rcv]  # [C, 3, 3]
        x = s_xyz[senders[sl]]  # [C, 3]
        d = np.einsum("cij,cj->ci", m, x) - r_rot[rcv]  # [C, 3]
        out[sl, 0] = np.sqrt(np.einsum("ci,ci->c", d, d))
        out[sl, 1:] = d
    return out


def edge_features(
    sender_lat: np.ndarray,
    sender_lon: np.ndarray,
    receiver_lat: np.ndarray,
    receiver_lon: np.ndarray,
    senders: np.ndarray,
    receivers: np.ndarray,
    normalization: Optional[float] = None,
    name: str = "normalization",
) -> tuple[np.ndarray, float]:
    """Normalised structural edge features.

    Args:
      sender_lat, sender_lon: [Ns] degrees of the sender node set.
      receiver_lat, receiver_lon: [Nr] degrees of the receiver node set.
      senders: [E] indices into the sender node set.
      receivers: [E] indices into the receiver node set.
      normalization: divisor N; None uses the longest edge ``max |d|``.
      name: what the error names N (the config field it comes from).

    Returns:
      features: [E, 4] float32 ``[|d|, d_x, d_y, d_z] / N``.
      normalization: the N used (float).

    Raises:
      ValueError: an N so small that the features would not be finite in float32
        (``max |d| / N`` above `FLOAT32_MAX`); the message names `name` and the least N.
    """
    raw = raw_edge_features(sender_lat, sender_lon, receiver_lat, receiver_lon,
                            senders, receivers)  # [E, 4] float64
    longest = float(raw[:, 0].max()) if raw.shape[0] else 0.0
    if normalization is None:
        normalization = longest if raw.shape[0] else 1.0
    elif longest > normalization * FLOAT32_MAX:  # |d_x|, |d_y|, |d_z| <= |d|
        # Shown in 3 digits, rounded up: the number given is large enough.
        least = float(f"{longest / FLOAT32_MAX * 1.01:.3g}")
        raise ValueError(f"{name}={normalization!r} is invalid: None or a number >= {least:g} "
                         f"(the longest edge, {longest:.4g}, divided by float32's largest "
                         f"number, {FLOAT32_MAX:.4g}), so that the edge features it divides "
                         "stay finite in float32")
    raw /= normalization
    return raw.astype(np.float32), float(normalization)
