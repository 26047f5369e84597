"""Equivalence with the official GraphCast code, checked on reference fixtures.

A fixture is a `.npz` of numpy arrays produced by the official code (see
`tests/data/README.md` for the keys): inputs, the official graph arrays and static
features, two full parameter sets (`param::`, `pparam::`) with their outputs. An optional
JSON sidecar of the same name adds provenance and the radius query; everything needed is
otherwise recovered from the arrays, so a fixture never seen before (other resolutions,
splits, widths, step counts, radius fractions or batch sizes) is checked the same way.

Two checks:

1. **network**: gclab's network on the fixture's own graph arrays, over every grid node,
   for both parameter sets (`param::` -> `outputs`, `pparam::` -> `outputs_perturbed`).
2. **graphs**: gclab builds the graphs itself from the fixture's config; its edge sets
   must equal the fixture's (sorted; mesh2grid outside face-boundary ties) and its outputs
   must match at every grid node except those ties.

Shapes: Ng grid nodes, Nm mesh nodes, E edges, B batch, C inputs, O outputs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zipfile
from pathlib import Path
from typing import Optional

import jax
import numpy as np
from scipy.spatial import cKDTree

from gclab.config import ModelConfig
from gclab.geometry.graphs import build_graphs
from gclab.geometry.grid_mesh import grid_positions
from gclab.geometry.icosahedral import multimesh
from gclab.model.graphcast import (
    graph_inputs,
    graph_inputs_from_arrays,
    make_network,
    param_shapes,
)
from gclab.model.official import flat_to_nested, from_official

DEFAULT_TOLERANCE = 1e-5
# A grid node within this barycentric distance of a finest-face edge is a tie: the face
# that contains it is a matter of rounding, and so is its mesh2grid neighbourhood.
TIE_TOLERANCE = 1e-6

REQUIRED_KEYS = (
    "grid_lat", "grid_lon", "inputs", "outputs", "outputs_perturbed",
    "g2m_senders", "g2m_receivers", "mesh_senders", "mesh_receivers",
    "m2g_senders", "m2g_receivers", "feat_grid_nodes", "feat_mesh_nodes",
    "feat_g2m_edges", "feat_mesh_edges", "feat_m2g_edges",
)


class FixtureError(ValueError):
    """A fixture file that is missing, malformed or incomplete."""


@dataclasses.dataclass(frozen=True)
class Fixture:
    """A loaded reference fixture."""
    path: Path
    arrays: dict
    config: ModelConfig
    data_channels: int
    output_channels: int
    batch: int
    params: dict  # gclab tree, `param::`
    perturbed_params: dict  # gclab tree, `pparam::`
    sidecar: Optional[dict]


@dataclasses.dataclass(frozen=True)
class Check:
    """One comparison: its name, max abs error, and whether it passed."""
    name: str
    max_abs_error: float
    passed: bool
    detail: str = ""


def load_fixture(path) -> Fixture:
    """Loads and validates a fixture; infers the model config from its arrays.

    Raises:
      FixtureError: the file is missing, not an `.npz`, lacks keys, or is inconsistent.
    """
    path = Path(path)
    if not path.is_file():
        raise FixtureError(f"fixture not found: {path}")
    if not zipfile.is_zipfile(path):
        raise FixtureError(f"{path}: not an .npz file (numpy zip archive)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise FixtureError(f"{path}: not a readable .npz fixture ({e})") from None
    missing = [k for k in REQUIRED_KEYS if k not in arrays]
    if missing:
        raise FixtureError(f"{path}: missing keys {', '.join(missing)}")
    official = flat_to_nested(arrays, "param::")
    perturbed = flat_to_nested(arrays, "pparam::")
    if not official or not perturbed:
        raise FixtureError(f"{path}: needs both 'param::' and 'pparam::' parameter sets")
    try:
        params = from_official(official)
        pparams = from_official(perturbed)
    except ValueError as e:
        raise FixtureError(f"{path}: {e}") from None
    sidecar = None
    json_path = path.with_suffix(".json")
    if json_path.is_file():
        try:
            sidecar = json.loads(json_path.read_text())
        except json.JSONDecodeError as e:
            raise FixtureError(f"{json_path}: not valid JSON ({e})") from None

    inputs = arrays["inputs"]
    if inputs.ndim != 3:
        raise FixtureError(f"{path}: inputs must be [G, B, C_in], got {inputs.shape}")
    n_grid, batch, data_channels = inputs.shape
    grid_lat, grid_lon = arrays["grid_lat"], arrays["grid_lon"]
    if n_grid != grid_lat.size * grid_lon.size:
        raise FixtureError(f"{path}: inputs have {n_grid} grid nodes, the grid "
                           f"{grid_lat.size} x {grid_lon.size}")
    resolution = float(grid_lat[1] - grid_lat[0]) if grid_lat.size > 1 else float("nan")
    n_mesh = arrays["feat_mesh_nodes"].shape[0]
    splits = round(math.log((n_mesh - 2) / 10, 4)) if n_mesh > 2 else -1
    if splits < 0 or 10 * 4**splits + 2 != n_mesh:
        raise FixtureError(f"{path}: {n_mesh} mesh nodes is not an icosahedral mesh")
    try:
        enc = params["grid2mesh_gnn/encoder_edges_grid2mesh_mlp/~/linear_0"]["w"]
        steps = params["mesh_gnn/processor_edges_mesh_mlp/~/linear_0"]["w"].shape[0]
        dec = [k for k in params if k.startswith("mesh2grid_gnn/decoder_nodes_grid_nodes_mlp")]
        out_w = params[sorted(dec)[-1]]["w"]
        hidden_layers = len(dec) - 1
    except (KeyError, IndexError) as e:
        raise FixtureError(f"{path}: parameter set is incomplete ({e})") from None
    cfg_json = (sidecar or {}).get("config", {})
    try:
        config = ModelConfig(
            resolution=resolution, mesh_splits=splits, latent_size=int(enc.shape[-1]),
            processor_steps=int(steps), hidden_layers=hidden_layers,
            radius_query_fraction_edge_length=float(
                cfg_json.get("radius_query_fraction_edge_length")
                or _infer_radius_fraction(arrays, splits)),
            mesh2grid_edge_normalization_factor=cfg_json.get(
                "mesh2grid_edge_normalization_factor"))
    except ValueError as e:
        raise FixtureError(f"{path}: {e}") from None
    expected = param_shapes(config, int(data_channels), int(out_w.shape[-1]))
    for label, tree in (("param::", params), ("pparam::", pparams)):
        problems = [f"{m}::{n}" for m in expected for n in expected[m]
                    if m not in tree or n not in tree[m]
                    or tuple(tree[m][n].shape) != tuple(expected[m][n].shape)]
        problems += [f"{m}::{n} (unexpected)" for m in tree for n in tree[m]
                     if m not in expected or n not in expected[m]]
        if problems:
            raise FixtureError(f"{path}: {label} parameters missing, unexpected or of the "
                               f"wrong shape: {', '.join(problems[:5])}"
                               + (" ..." if len(problems) > 5 else ""))
    for key, want in (("outputs", (n_grid, batch, out_w.shape[-1])),
                      ("outputs_perturbed", (n_grid, batch, out_w.shape[-1]))):
        if arrays[key].shape != want:
            raise FixtureError(f"{path}: {key} has shape {arrays[key].shape}, expected {want}")
    return Fixture(path, arrays, config, int(data_channels), int(out_w.shape[-1]), int(batch),
                   params, pparams, sidecar)


def _infer_radius_fraction(arrays: dict, splits: int) -> float:
    """The radius fraction, from the stored g2m edges (when no sidecar gives it).

    The radius lies between the longest stored g2m edge and the shortest grid-mesh pair
    that is not an edge; the midpoint of that gap, over the finest edge length.
    """


    mesh = multimesh(splits)
    grid = grid_positions(arrays["grid_lat"], arrays["grid_lon"]).astype(np.float64)
    verts = mesh.vertices
    s, r = arrays["g2m_senders"], arrays["g2m_receivers"]
    longest = float(np.linalg.norm(grid[s] - verts[r], axis=-1).max())
    # Shortest non-edge: the nearest pairs beyond `longest` from each mesh vertex.
    tree = cKDTree(grid)
    k = min(grid.shape[0], int(np.bincount(r, minlength=verts.shape[0]).max()) + 8)
    dist, _ = tree.query(verts, k=k)
    beyond = dist[dist > longest]
    shortest = float(beyond.min()) if beyond.size else longest
    return 0.5 * (longest + shortest) / mesh.finest_max_edge_length


def _fixture_graph(fx: Fixture):
    a = fx.arrays
    return graph_inputs_from_arrays(
        a["feat_grid_nodes"], a["feat_mesh_nodes"],
        a["g2m_senders"], a["g2m_receivers"], a["feat_g2m_edges"],
        a["mesh_senders"], a["mesh_receivers"], a["feat_mesh_edges"],
        a["m2g_senders"], a["m2g_receivers"], a["feat_m2g_edges"])


def _max_err(x, y, mask=None) -> float:
    d = np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))
    if mask is not None:
        d = d[mask]
    return float(d.max()) if d.size else 0.0


def tie_nodes(graphs) -> np.ndarray:
    """Grid nodes that lie on a finest-face edge (to `TIE_TOLERANCE`, barycentric)."""
    xyz = grid_positions(graphs.grid_lat, graphs.grid_lon).astype(np.float64)  # [Ng, 3]
    tri = graphs.mesh_node_xyz.astype(np.float64)[
        graphs.mesh2grid.senders.reshape(-1, 3)]  # [Ng, 3 vertices, 3]
    # Cone coordinates of each grid node in its chosen triangle: solve x = T^T c.
    coords = np.linalg.solve(np.transpose(tri, (0, 2, 1)), xyz[..., None])[..., 0]  # [Ng, 3]
    coords = coords / coords.sum(-1, keepdims=True)
    return np.nonzero(coords.min(-1) < TIE_TOLERANCE)[0]


def _sorted_pairs(s, r) -> np.ndarray:
    pairs = np.stack([np.asarray(s, np.int64), np.asarray(r, np.int64)], 1)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]


def run_checks(fx: Fixture, tolerance: float = DEFAULT_TOLERANCE) -> list:
    """Runs both checks on a loaded fixture and returns a list of `Check`s."""
    a = fx.arrays
    net = make_network(fx.config, fx.data_channels, fx.output_channels)
    apply = jax.jit(net.apply)
    inputs = a["inputs"].astype(np.float32)
    checks = []

    graph = _fixture_graph(fx)
    for label, p, key in (("param", fx.params, "outputs"),
                          ("pparam", fx.perturbed_params, "outputs_perturbed")):
        err = _max_err(apply(p, graph, inputs), a[key])
        checks.append(Check(f"network on official graphs, {label}:: -> {key}", err,
                            err <= tolerance, f"all {a[key].shape[0]} grid nodes"))

    cfg = fx.config
    graphs = build_graphs(cfg.resolution, cfg.mesh_splits, cfg.radius_query_fraction_edge_length,
                          cfg.mesh2grid_edge_normalization_factor, cache=False)
    for name, mine, s_key in (("grid2mesh", graphs.grid2mesh, "g2m"),
                              ("mesh", graphs.mesh, "mesh")):
        same = np.array_equal(_sorted_pairs(mine.senders, mine.receivers),
                              _sorted_pairs(a[f"{s_key}_senders"], a[f"{s_key}_receivers"]))
        checks.append(Check(f"{name} edge set equals the official one (sorted)",
                            0.0 if same else float("inf"), same,
                            f"{mine.senders.size} vs {a[f'{s_key}_senders'].size} edges"))
    ties = np.union1d(tie_nodes(graphs), _sidecar_ties(fx))
    keep = np.ones(graphs.num_grid_nodes, bool)
    keep[ties] = False
    mine_m2g = graphs.mesh2grid.senders.reshape(-1, 3)
    theirs = np.asarray(a["m2g_senders"]).reshape(-1, 3)
    same = (mine_m2g.shape == theirs.shape
            and np.array_equal(np.sort(mine_m2g[keep], 1), np.sort(theirs[keep], 1)))
    checks.append(Check("mesh2grid edge set equals the official one outside ties",
                        0.0 if same else float("inf"), same, f"{ties.size} tie nodes excluded"))
    own = apply(fx.params, graph_inputs(graphs), inputs)
    err = _max_err(own, a["outputs"], keep)
    checks.append(Check("network on gclab's own graphs, param:: -> outputs", err,
                        err <= tolerance, f"{keep.sum()} grid nodes ({ties.size} ties left out)"))
    own = apply(fx.perturbed_params, graph_inputs(graphs), inputs)
    err = _max_err(own, a["outputs_perturbed"], keep)
    checks.append(Check("network on gclab's own graphs, pparam:: -> outputs_perturbed", err,
                        err <= tolerance, f"{keep.sum()} grid nodes"))
    return checks


def _sidecar_ties(fx: Fixture) -> np.ndarray:
    diag = ((fx.sidecar or {}).get("graph") or {}).get("tie_diagnostics") or {}
    return np.asarray(diag.get("m2g_grid_nodes_on_face_boundary_indices", []), np.int64)
