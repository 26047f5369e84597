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
2. **graphs**: gclab builds the graphs itself from the fixture's config; its grid2mesh and
   mesh edge sets must equal the fixture's (sorted), its mesh2grid edges must equal the
   fixture's edge by edge, grid nodes on equally near faces included, and its outputs
   must match at every grid node.

The official mesh2grid rule leaves some grid nodes between equally near faces and takes
whatever trimesh returns there (see `gclab.geometry.grid_mesh`); gclab asks trimesh too, so on
fixtures of the official code the two agree everywhere. A fixture whose producer broke
those ties differently (another trimesh, another implementation) still passes if every
node where the edges differ is such a tie: those nodes are left out of the output
comparison, and the check says how many they are.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import Optional

import jax
import numpy as np
from scipy.spatial import cKDTree

from gclab.config import ConfigError, ModelConfig, WrongType, a_kind, is_int, is_number
from gclab.geometry.graphs import build_graphs
from gclab.geometry.grid_mesh import grid_positions, nearest_flat_faces, point_triangle_distance
from gclab.geometry.icosahedral import multimesh
from gclab.limits import TooLarge, format_bytes, host_memory_bytes, require_fits
from gclab.model.graphcast import (
    graph_inputs,
    graph_inputs_from_arrays,
    make_network,
    param_shapes,
)
from gclab.model.official import flat_to_nested, from_official

DEFAULT_TOLERANCE = 1e-5
# Two faces a grid node is equally near, to this (unit-sphere lengths, 0.6 m on the Earth):
# float64 rounding, and trimesh moving a foot of perpendicular onto a face side, which
# at 7 splits adds up to 6e-8, both stay below it.
TIE_TOLERANCE = 1e-7

#: What reading a damaged or truncated `.npz` raises: zipfile's and numpy's errors, and
#: zlib's for the damaged deflate data of a compressed member (`np.savez_compressed`).
NPZ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)

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
    if not isinstance(path, (str, os.PathLike)):
        raise FixtureError(f"a fixture path must be a str or os.PathLike, not "
                           f"{a_kind(path)}")
    path = Path(path)
    if path.is_dir():
        raise FixtureError(f"{path}: is a folder, not an .npz fixture")
    if not path.is_file():
        raise FixtureError(f"fixture not found: {path}")
    try:
        zipped = is_npz(path)
    except OSError as e:
        raise FixtureError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not zipped:
        raise FixtureError(f"{path}: not an .npz file (numpy zip archive)")
    try:
        arrays = read_npz(path, "the fixture's arrays")
    except TooLarge as e:
        raise FixtureError(str(e)) from None
    except NPZ_ERRORS as e:
        raise FixtureError(f"{path}: not a readable .npz fixture, damaged or truncated "
                           f"({e})") from None
    missing = [k for k in REQUIRED_KEYS if k not in arrays]
    if missing:
        raise FixtureError(f"{path}: missing keys {', '.join(missing)}")
    try:
        official = flat_to_nested(arrays, "param::")
        perturbed = flat_to_nested(arrays, "pparam::")
    except ValueError as e:
        raise FixtureError(f"{path}: {e}") from None
    if not official or not perturbed:
        raise FixtureError(f"{path}: needs both 'param::' and 'pparam::' parameter sets")
    try:
        params = from_official(official)
        pparams = from_official(perturbed)
    except ValueError as e:
        raise FixtureError(f"{path}: {e}") from None
    sidecar = _read_sidecar(path.with_suffix(".json"))
    resolution, n_grid, n_mesh = _check_arrays(path, arrays)
    _, batch, data_channels = arrays["inputs"].shape
    if sidecar is not None:
        ties = sidecar.get("graph", {}).get("tie_diagnostics", {}).get(
            "m2g_grid_nodes_on_face_boundary_indices", [])
        if any(not 0 <= i < n_grid for i in ties):
            raise FixtureError(f"{path.with_suffix('.json')}: graph.tie_diagnostics."
                               f"m2g_grid_nodes_on_face_boundary_indices must be grid nodes "
                               f"in 0..{n_grid - 1}")
    splits = round(math.log((n_mesh - 2) / 10, 4))
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


def is_npz(path) -> bool:
    """Whether the file `path` is a zip archive, as every `.npz` file is.

    `zipfile.is_zipfile` answers False for a file it cannot open, so an unreadable file
    (no read permission) would be reported as "not an .npz"; the file is opened here
    instead, and that error comes through.

    Raises:
      OSError: the file cannot be opened (missing, a folder, no permission).
    """
    with open(path, "rb") as f:
        return zipfile.is_zipfile(f)


def read_npz(path, what: str) -> dict:
    """The `{key: array}` dict of the `.npz` file `path`, read without pickle, with what
    would not fit refused before numpy allocates it.

    The members' unpacked sizes together (from the archive's directory) must fit in this
    machine's memory. Each member's `.npy` header is then read before its data (a few bytes,
    inflated where the member is compressed) and the bytes its shape and dtype declare are
    compared with the bytes the member holds: numpy allocates the declared shape before
    reading the data, so a damaged header (a shape of 10^14, say) would end in a
    `MemoryError` naming neither the file nor the member.

    Args:
      path: the file, a zip archive (see `is_npz`).
      what: the arrays, for the message of a file too large ("the fixture's arrays").

    Returns:
      The arrays under their `np.load` keys (member names without `.npy`).

    Raises:
      TooLarge: the arrays unpack to more than this machine's memory, or numpy ran out of
        memory reading one (the message names the file, and the member).
      NPZ_ERRORS: a damaged or truncated file, or an array that needs pickle; the message
        of one member's fault starts with "member NAME: ".
    """
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        unpacked = sum(info.file_size for info in infos)  # from the archive's directory
        require_fits(f"{path}: reading {what} ({unpacked:,} bytes unpacked)", unpacked,
                     host_memory_bytes(), "this machine's memory")
        arrays = {}
        for info in infos:
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            try:
                with z.open(info) as member:
                    _check_npy_header(member, info.file_size)
                    member.seek(0)  # `read_array` reads the header again, from the start
                    arrays[key] = np.lib.format.read_array(member, allow_pickle=False)
            except MemoryError as e:
                raise TooLarge(f"{path}: reading member {info.filename}: out of memory "
                               f"({_first_line(e)})") from None
            except NPZ_ERRORS as e:
                raise ValueError(f"member {info.filename}: {_first_line(e)}") from None
    return arrays


def _check_npy_header(member, size: int) -> None:
    """Reads the `.npy` header at the start of `member` (a zip member of `size` bytes
    unpacked) and raises `ValueError` if its shape and dtype declare more bytes than follow
    it. Object arrays are left to `read_array`, which refuses them (pickle)."""
    version = np.lib.format.read_magic(member)
    # Versions 2.0 and 3.0 differ only in the header's text encoding (latin-1, UTF-8),
    # which does not change the shape or the itemsize read here.
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, _, dtype = read_header(member)
    if dtype.hasobject:
        return
    declared = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    held = size - member.tell()
    if declared > held:
        raise ValueError(f"its .npy header declares shape {shape} of {dtype} "
                         f"({format_bytes(declared)}), more than the {held:,} bytes of data "
                         f"it holds")


def _first_line(e: BaseException) -> str:
    """An exception's message in one line (its type where it has none)."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _read_sidecar(json_path: Path) -> Optional[dict]:
    """The fixture's JSON sidecar (None if there is none), checked for the keys gclab reads."""
    if not json_path.exists():
        return None

    def fail(what: str):
        raise FixtureError(f"{json_path}: {what}")

    try:
        sidecar = json.loads(json_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        fail(f"not valid JSON ({e})")
    except RecursionError:
        fail("not valid JSON (nested too deeply)")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"not a readable JSON text file ({type(e).__name__}: {e})")
    if not isinstance(sidecar, dict):
        fail(f"must hold a JSON object, not {a_kind(sidecar)}")
    for key in ("config", "graph"):
        if not isinstance(sidecar.get(key, {}), dict):
            fail(f"'{key}' must be a JSON object, not {sidecar[key]!r}")
    cfg = sidecar.get("config", {})
    for field in ("radius_query_fraction_edge_length", "mesh2grid_edge_normalization_factor"):
        value = cfg.get(field)
        if value is None:
            continue
        try:
            if not is_number(value):
                raise ConfigError("ModelConfig", field, value, "a finite number > 0")
            ModelConfig(**{field: value})
        except ConfigError as e:
            fail(f"config.{field}={value!r} is invalid: {e.allowed}")
    diag = sidecar.get("graph", {}).get("tie_diagnostics", {})
    if not isinstance(diag, dict):
        fail(f"graph.tie_diagnostics must be a JSON object, not {diag!r}")
    ties = diag.get("m2g_grid_nodes_on_face_boundary_indices", [])
    if not isinstance(ties, list) or not all(is_int(i) for i in ties):
        fail("graph.tie_diagnostics.m2g_grid_nodes_on_face_boundary_indices must be a list "
             "of grid node indices")
    return sidecar


# Edge sets of a fixture: (key prefix, what senders index, what receivers index).
_FIXTURE_EDGES = (("g2m", "grid", "mesh"), ("mesh", "mesh", "mesh"), ("m2g", "mesh", "grid"))


def _check_arrays(path: Path, arrays: dict) -> tuple[float, int, int]:
    """Checks a fixture's arrays against each other before any of them is used.

    Returns:
      `(resolution, grid nodes, mesh nodes)`.

    Raises:
      FixtureError: naming the file, the array and what is wrong with it.
    """

    def fail(what: str):
        raise FixtureError(f"{path}: {what}")

    for key in REQUIRED_KEYS:
        a = arrays[key]
        integer = key.endswith(("_senders", "_receivers"))
        if a.dtype.kind not in ("iu" if integer else "f"):
            fail(f"{key} must hold {'integers' if integer else 'floating-point numbers'}, "
                 f"not {a.dtype}")
        if not integer and not np.isfinite(a).all():
            fail(f"{key} holds NaN or infinite values")
    for key, a in arrays.items():
        if key.startswith(("param::", "pparam::")) and (
                a.dtype.kind != "f" or not np.isfinite(a).all()):
            fail(f"{key} must hold finite floating-point numbers")
    lat, lon = arrays["grid_lat"], arrays["grid_lon"]
    if lat.ndim != 1 or lat.size < 2:
        fail(f"grid_lat must list at least 2 latitudes (-90 and 90), got shape {lat.shape}")
    if np.isclose(lat[0], 90) and np.isclose(lat[-1], -90):
        fail("grid_lat descends from 90 to -90; gclab's grids ascend from -90 to 90")
    if not np.allclose(lat, np.linspace(-90.0, 90.0, lat.size), rtol=0, atol=1e-6):
        fail(f"grid_lat must ascend evenly from -90 to 90 (pole-inclusive), got {lat.size} "
             f"values from {lat[0]:g} to {lat[-1]:g}")
    resolution = float(lat[1] - lat[0])
    try:
        model = ModelConfig(resolution=resolution)
    except ConfigError as e:
        fail(f"grid_lat's spacing of {resolution:g} deg is invalid: {e.allowed}")
    if lon.shape != (model.n_lon,) or not np.allclose(
            lon, np.arange(model.n_lon) * resolution, rtol=0, atol=1e-6):
        fail(f"grid_lon must be the {model.n_lon} longitudes 0, {resolution:g}, ..., "
             f"{360 - resolution:g} of a {resolution:g} deg grid, got shape {lon.shape}")
    n_grid = model.num_grid_nodes
    inputs = arrays["inputs"]
    if inputs.ndim != 3 or inputs.shape[0] != n_grid or 0 in inputs.shape:
        fail(f"inputs must be [G, B, C_in] with G = {n_grid} grid nodes ({model.n_lat} x "
             f"{model.n_lon}) and B, C_in >= 1, got {inputs.shape}")
    feats = arrays["feat_mesh_nodes"]
    n_mesh = feats.shape[0] if feats.ndim == 2 else 0
    nodes = {"grid": n_grid, "mesh": n_mesh}
    splits = round(math.log((n_mesh - 2) / 10, 4)) if n_mesh > 2 else -1
    if splits < 0 or 10 * 4**splits + 2 != n_mesh:
        fail(f"{n_mesh} mesh nodes (feat_mesh_nodes) is not an icosahedral mesh")
    for key, rows in (("feat_grid_nodes", n_grid), ("feat_mesh_nodes", n_mesh)):
        if arrays[key].shape != (rows, 3):
            fail(f"{key} must have shape ({rows}, 3), got {arrays[key].shape}")
    for prefix, sender_kind, receiver_kind in _FIXTURE_EDGES:
        s, r = arrays[f"{prefix}_senders"], arrays[f"{prefix}_receivers"]
        f = arrays[f"feat_{prefix}_edges"]
        if s.ndim != 1 or r.shape != s.shape or f.shape != (s.size, 4):
            fail(f"{prefix}_senders, {prefix}_receivers and feat_{prefix}_edges must have "
                 f"shapes (E,), (E,), (E, 4), got {s.shape}, {r.shape}, {f.shape}")
        for name, idx, kind in (("senders", s, sender_kind), ("receivers", r, receiver_kind)):
            if idx.size and not (0 <= idx.min() and idx.max() < nodes[kind]):
                fail(f"{prefix}_{name} must index {kind} nodes 0..{nodes[kind] - 1}, got "
                     f"values from {idx.min()} to {idx.max()}")
    if arrays["m2g_senders"].size != 3 * n_grid:
        fail(f"m2g_senders must hold 3 edges per grid node ({3 * n_grid}), got "
             f"{arrays['m2g_senders'].size}")
    return resolution, n_grid, n_mesh


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


def ties_broken_differently(graphs, m2g_senders: np.ndarray) -> np.ndarray:
    """Grid nodes whose mesh2grid face differs from gclab's, between equally near faces.

    Args:
      graphs: gclab's `Graphs`.
      m2g_senders: [3 Ng] another producer's mesh2grid senders (three per grid node, in
        grid node order).

    Returns:
      [T] int64 grid nodes where the two faces are different faces (not the same three
      vertices in another order) and the node is equally near both (to `TIE_TOLERANCE`).
    """

    mine = graphs.mesh2grid.senders.reshape(-1, 3)  # [Ng, 3]
    theirs = np.asarray(m2g_senders).reshape(-1, 3)  # [Ng, 3]
    differ = np.flatnonzero((np.sort(mine, axis=1) != np.sort(theirs, axis=1)).any(axis=1))
    xyz = grid_positions(graphs.grid_lat, graphs.grid_lon)[differ]  # [D, 3]
    verts = graphs.mesh_node_xyz.astype(np.float64)  # [Nm, 3]
    gap = np.abs(point_triangle_distance(xyz, verts[mine[differ]])
                 - point_triangle_distance(xyz, verts[theirs[differ]]))  # [D]
    return differ[gap <= TIE_TOLERANCE]


def _sorted_pairs(s, r) -> np.ndarray:
    pairs = np.stack([np.asarray(s, np.int64), np.asarray(r, np.int64)], 1)
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]


def run_checks(fx: Fixture, tolerance: float = DEFAULT_TOLERANCE) -> list:
    """Runs both checks on a loaded fixture and returns a list of `Check`s.

    Raises:
      ValueError: `tolerance` not a finite number > 0; `WrongType` (a TypeError too) for
        `fx` not a `Fixture` or `tolerance` not a number.
    """
    if not isinstance(fx, Fixture):
        raise WrongType(f"run_checks needs a Fixture (see load_fixture), not {a_kind(fx)}")
    if not is_number(tolerance) or not 0 < tolerance < math.inf:
        error = ValueError if is_number(tolerance) else WrongType
        raise error(f"tolerance={tolerance!r} is invalid: a finite number > 0")
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
    check, ties = _mesh2grid_check(graphs, a["m2g_senders"], a["m2g_receivers"])
    checks.append(check)
    keep = np.ones(graphs.num_grid_nodes, bool)
    keep[ties] = False
    left_out = f" ({ties.size} ties broken differently left out)" if ties.size else ""
    own = apply(fx.params, graph_inputs(graphs), inputs)
    err = _max_err(own, a["outputs"], keep)
    checks.append(Check("network on gclab's own graphs, param:: -> outputs", err,
                        err <= tolerance, f"{keep.sum()} grid nodes{left_out}"))
    own = apply(fx.perturbed_params, graph_inputs(graphs), inputs)
    err = _max_err(own, a["outputs_perturbed"], keep)
    checks.append(Check("network on gclab's own graphs, pparam:: -> outputs_perturbed", err,
                        err <= tolerance, f"{keep.sum()} grid nodes{left_out}"))
    return checks


def _mesh2grid_check(graphs, m2g_senders, m2g_receivers) -> tuple[Check, np.ndarray]:
    """gclab's mesh2grid edges against a fixture's, edge by edge, ties included.

    Returns:
      The check, and the [T] grid nodes where the fixture broke a tie differently.
    """

    name = "mesh2grid edges equal the official ones, edge by edge"
    mine = graphs.mesh2grid
    none = np.zeros(0, np.int64)
    if (np.shape(m2g_senders) != mine.senders.shape
            or not np.array_equal(m2g_receivers, mine.receivers)):
        return Check(name, float("inf"), False, f"{np.size(m2g_senders)} vs {mine.num_edges} "
                     "edges, or other receivers"), none
    differ = np.flatnonzero((mine.senders.reshape(-1, 3)
                             != np.asarray(m2g_senders).reshape(-1, 3)).any(axis=1))  # [D]
    if differ.size == 0:
        xyz = grid_positions(graphs.grid_lat, graphs.grid_lon)  # [Ng, 3]
        _, by_trimesh = nearest_flat_faces(xyz, graphs.mesh_node_xyz,
                                           multimesh(graphs.mesh_splits).finest_faces)
        return Check(name, 0.0, True, f"{mine.num_edges} edges, including the "
                     f"{by_trimesh.sum()} grid nodes that trimesh decides"), none
    ties = ties_broken_differently(graphs, m2g_senders)  # [T]
    others = differ.size - ties.size
    return Check(name, 0.0 if not others else float("inf"), not others,
                 f"{differ.size} grid nodes differ: {ties.size} ties the fixture's producer "
                 f"broke differently (left out below), {others} not ties"), ties
