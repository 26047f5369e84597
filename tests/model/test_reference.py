"""Equivalence with the official code: the shared fixtures and fixtures never seen before.

The two shared fixtures were produced by the official GraphCast code. The unseen fixtures
are written here in the same format by an independent float64 numpy forward pass of the
published model (below; it shares no code with `gclab.model`), at other resolutions,
splits, widths, step counts, hidden layers, radius fractions and batch sizes, and without
a JSON sidecar, so the config must be recovered from the arrays alone.
"""

from pathlib import Path

import numpy as np
import pytest

from gclab import cli
from gclab.geometry import build_graphs, grid_mesh, icosahedral
from gclab.geometry import features as features_lib
from gclab.model import FixtureError, load_fixture, run_checks

DATA = Path(__file__).resolve().parents[1] / "data"
SHARED = sorted(DATA.glob("official_*.npz"))


def test_shared_fixtures_are_present():
    assert [p.name for p in SHARED] == ["official_small.npz", "official_tiny.npz"]


@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.stem)
def test_shared_fixture_passes_both_checks(path):
    checks = run_checks(load_fixture(path))
    assert len(checks) == 7
    failed = [c for c in checks if not c.passed]
    assert not failed, failed
    assert max(c.max_abs_error for c in checks) <= 1e-5
    # mesh2grid edge by edge, and the outputs at every grid node: no ties left out.
    by_name = {c.name: c for c in checks}
    decided = {"official_tiny": 42, "official_small": 84}[path.stem]
    assert by_name["mesh2grid edges equal the official ones, edge by edge"].detail.endswith(
        f"including the {decided} grid nodes that trimesh decides")
    n_grid = load_fixture(path).arrays["inputs"].shape[0]
    for c in checks[-2:]:
        assert c.detail == f"{n_grid} grid nodes"


def test_cli_reference_exit_status(capsys):
    assert cli.main(["reference", *map(str, SHARED)]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == 14 and "FAIL" not in out


# ----------------------------------------------------------------------------------------
# An independent numpy forward pass of the published model (float64).


def _mlp(params, prefix, x, layer_norm=True):
    k = 0
    while f"{prefix}_mlp/~/linear_{k}" in params:
        p = params[f"{prefix}_mlp/~/linear_{k}"]
        x = x @ p["w"] + p["b"]
        if f"{prefix}_mlp/~/linear_{k + 1}" in params:
            x = x / (1.0 + np.exp(-x))
        k += 1
    if layer_norm:
        p = params[f"{prefix}_layer_norm"]
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        x = (x - mu) / np.sqrt(var + 1e-5) * p["scale"] + p["offset"]
    return x


def _numpy_graphcast(params, a, steps):
    """Official flat params (module -> name -> array), fixture arrays -> outputs [G, B, O]."""
    P = {k: {n: v.astype(np.float64) for n, v in d.items()} for k, d in params.items()}
    inp = a["inputs"].astype(np.float64)
    G, B, C = inp.shape
    M = a["feat_mesh_nodes"].shape[0]

    def feats(x, n):
        return np.broadcast_to(x.astype(np.float64)[:, None], (n, B, x.shape[-1]))

    def net(name, block, x, **kw):
        return _mlp(P, f"{name}/~_networks_builder/{block}", x, **kw)

    def seg(x, r, n):
        out = np.zeros((n,) + x.shape[1:])
        np.add.at(out, r, x)
        return out

    g2m, mesh, m2g = "grid2mesh_gnn", "mesh_gnn", "mesh2grid_gnn"
    vg = net(g2m, "encoder_nodes_grid_nodes",
             np.concatenate([inp, feats(a["feat_grid_nodes"], G)], -1))
    vm = net(g2m, "encoder_nodes_mesh_nodes",
             np.concatenate([np.zeros((M, B, C)), feats(a["feat_mesh_nodes"], M)], -1))
    e = net(g2m, "encoder_edges_grid2mesh", feats(a["feat_g2m_edges"], len(a["g2m_senders"])))
    s, r = a["g2m_senders"], a["g2m_receivers"]
    msg = net(g2m, "processor_edges_0_grid2mesh", np.concatenate([e, vg[s], vm[r]], -1))
    dm = net(g2m, "processor_nodes_0_mesh_nodes", np.concatenate([vm, seg(msg, r, M)], -1))
    dg = net(g2m, "processor_nodes_0_grid_nodes", vg)
    vm, vg = vm + dm, vg + dg
    e = net(mesh, "encoder_edges_mesh", feats(a["feat_mesh_edges"], len(a["mesh_senders"])))
    s, r = a["mesh_senders"], a["mesh_receivers"]
    for i in range(steps):
        msg = net(mesh, f"processor_edges_{i}_mesh", np.concatenate([e, vm[s], vm[r]], -1))
        vm = vm + net(mesh, f"processor_nodes_{i}_mesh_nodes",
                      np.concatenate([vm, seg(msg, r, M)], -1))
        e = e + msg
    e = net(m2g, "encoder_edges_mesh2grid", feats(a["feat_m2g_edges"], len(a["m2g_senders"])))
    s, r = a["m2g_senders"], a["m2g_receivers"]
    msg = net(m2g, "processor_edges_0_mesh2grid", np.concatenate([e, vm[s], vg[r]], -1))
    vg = vg + net(m2g, "processor_nodes_0_grid_nodes", np.concatenate([vg, seg(msg, r, G)], -1))
    return net(m2g, "decoder_nodes_grid_nodes", vg, layer_norm=False)


def _official_params(rng, C, O, L, S, H):
    """A full official-format parameter set with non-trivial biases and norms."""
    blocks = {
        "grid2mesh_gnn": [("encoder_nodes_grid_nodes", C + 3), ("encoder_nodes_mesh_nodes", C + 3),
                          ("encoder_edges_grid2mesh", 4), ("processor_edges_0_grid2mesh", 3 * L),
                          ("processor_nodes_0_mesh_nodes", 2 * L),
                          ("processor_nodes_0_grid_nodes", L)],
        "mesh_gnn": [("encoder_edges_mesh", 4)]
        + [(f"processor_edges_{i}_mesh", 3 * L) for i in range(S)]
        + [(f"processor_nodes_{i}_mesh_nodes", 2 * L) for i in range(S)],
        "mesh2grid_gnn": [("encoder_edges_mesh2grid", 4), ("processor_edges_0_mesh2grid", 3 * L),
                          ("processor_nodes_0_grid_nodes", 2 * L),
                          ("processor_nodes_0_mesh_nodes", L),
                          ("decoder_nodes_grid_nodes", L)],
    }
    out = {}
    for gnn, specs in blocks.items():
        for block, n_in in specs:
            last = O if block == "decoder_nodes_grid_nodes" else L
            sizes = [n_in] + [L] * H + [last]
            base = f"{gnn}/~_networks_builder/{block}"
            for k, (i, o) in enumerate(zip(sizes[:-1], sizes[1:])):
                out[f"{base}_mlp/~/linear_{k}"] = {
                    "w": (rng.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32),
                    "b": (0.3 * rng.standard_normal(o)).astype(np.float32)}
            if block != "decoder_nodes_grid_nodes":
                out[f"{base}_layer_norm"] = {
                    "scale": (1 + 0.3 * rng.standard_normal(last)).astype(np.float32),
                    "offset": (0.3 * rng.standard_normal(last)).astype(np.float32)}
    return out


def _write_fixture(path, *, resolution, splits, L, S, H, C, O, B, fraction, seed=0,
                   m2g_faces=None):
    """Writes a fixture in the official format from gclab's graphs and the numpy model.

    `m2g_faces` ({grid node: three mesh nodes}) gives those grid nodes another face, as
    another producer of fixtures might.
    """
    rng = np.random.default_rng(seed)
    g = build_graphs(resolution, splits, fraction)
    a = {
        "grid_lat": g.grid_lat, "grid_lon": g.grid_lon,
        "inputs": rng.standard_normal((g.num_grid_nodes, B, C)).astype(np.float32),
        "feat_grid_nodes": g.grid_node_features, "feat_mesh_nodes": g.mesh_node_features,
    }
    for key, es in (("g2m", g.grid2mesh), ("mesh", g.mesh), ("m2g", g.mesh2grid)):
        a[f"{key}_senders"], a[f"{key}_receivers"] = es.senders, es.receivers
        a[f"feat_{key}_edges"] = es.features
    if m2g_faces:
        senders = g.mesh2grid.senders.copy().reshape(-1, 3)
        for node, face in m2g_faces.items():
            senders[node] = face
        a["m2g_senders"] = senders.reshape(-1)
        mesh_ll = grid_mesh.xyz_to_lat_lon(g.mesh_node_xyz)
        grid_ll = grid_mesh.grid_node_lat_lon(g.grid_lat, g.grid_lon)
        a["feat_m2g_edges"], _ = features_lib.edge_features(
            *mesh_ll, *grid_ll, a["m2g_senders"], a["m2g_receivers"])
    for prefix, out_key in (("param::", "outputs"), ("pparam::", "outputs_perturbed")):
        p = _official_params(rng, C, O, L, S, H)
        a[out_key] = _numpy_graphcast(p, a, S).astype(np.float32)
        for module, leaves in p.items():
            for name, v in leaves.items():
                a[f"{prefix}{module}::{name}"] = v
    np.savez(path, **a)
    return a


UNSEEN = [
    dict(resolution=12.0, splits=1, L=8, S=2, H=1, C=3, O=2, B=3, fraction=0.6),
    dict(resolution=9.0, splits=2, L=24, S=5, H=2, C=6, O=4, B=1, fraction=1.0),
    dict(resolution=5.0, splits=3, L=12, S=1, H=1, C=4, O=3, B=2, fraction=0.45),
]


@pytest.mark.parametrize("cfg", UNSEEN, ids=lambda c: f"{c['resolution']:g}deg-{c['splits']}")
def test_unseen_fixture_passes_and_config_is_recovered(tmp_path, cfg):
    path = tmp_path / "unseen.npz"
    _write_fixture(path, **cfg)
    fx = load_fixture(path)
    m = fx.config
    assert (m.resolution, m.mesh_splits, m.latent_size, m.processor_steps, m.hidden_layers) == (
        cfg["resolution"], cfg["splits"], cfg["L"], cfg["S"], cfg["H"])
    assert (fx.data_channels, fx.output_channels, fx.batch) == (cfg["C"], cfg["O"], cfg["B"])
    assert m.radius_query_fraction_edge_length == pytest.approx(cfg["fraction"], rel=0.05)
    checks = run_checks(fx)
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]


def test_a_wrong_output_fails_the_check(tmp_path):
    path = tmp_path / "wrong.npz"
    a = _write_fixture(path, **UNSEEN[0])
    a["outputs_perturbed"] = a["outputs_perturbed"].copy()
    a["outputs_perturbed"][5, 0, 1] += 1e-3
    np.savez(path, **a)
    checks = {c.name: c for c in run_checks(load_fixture(path))}
    bad = [c for c in checks.values() if not c.passed]
    assert len(bad) == 2 and all("outputs_perturbed" in c.name for c in bad)
    assert cli.main(["reference", str(path)]) == 1


def test_tolerance_option_is_honoured(tmp_path):
    path = tmp_path / "loose.npz"
    a = _write_fixture(path, **UNSEEN[0])
    a["outputs"] = a["outputs"] + 5e-5
    np.savez(path, **a)
    assert cli.main(["reference", str(path)]) == 1
    assert cli.main(["reference", str(path), "--tolerance", "1e-4"]) == 0


def test_malformed_fixtures_get_clear_errors(tmp_path, capsys):
    with pytest.raises(FixtureError, match="not found"):
        load_fixture(tmp_path / "missing.npz")
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(FixtureError, match="not an .npz"):
        load_fixture(tmp_path / "text.npz")
    full = dict(np.load(SHARED[1]))
    del full["m2g_senders"]
    np.savez(tmp_path / "incomplete.npz", **full)
    with pytest.raises(FixtureError, match="missing keys m2g_senders"):
        load_fixture(tmp_path / "incomplete.npz")
    full = dict(np.load(SHARED[1]))
    for key in [k for k in full if k.startswith("pparam::")]:
        del full[key]
    np.savez(tmp_path / "noperturbed.npz", **full)
    with pytest.raises(FixtureError, match="pparam::"):
        load_fixture(tmp_path / "noperturbed.npz")
    full = dict(np.load(SHARED[1]))
    del full["param::mesh_gnn/~_networks_builder/processor_edges_1_mesh_mlp/~/linear_0::w"]
    np.savez(tmp_path / "gap.npz", **full)
    with pytest.raises(FixtureError):
        load_fixture(tmp_path / "gap.npz")
    full = dict(np.load(SHARED[1]))
    del full["pparam::grid2mesh_gnn/~_networks_builder/encoder_edges_grid2mesh_layer_norm::scale"]
    np.savez(tmp_path / "noscale.npz", **full)
    with pytest.raises(FixtureError, match="pparam:: parameters missing.*layer_norm::scale"):
        load_fixture(tmp_path / "noscale.npz")
    assert cli.main(["reference", str(tmp_path / "missing.npz")]) == 2
    assert "fixture not found" in capsys.readouterr().err


def _other_face(g, node, equally_near):
    """Another finest face for a grid node, across a side: an equally near one, or not."""
    faces = icosahedral.multimesh(g.mesh_splits).finest_faces
    point = grid_mesh.grid_positions(g.grid_lat, g.grid_lon)[node]
    dist = grid_mesh.point_triangle_distance(point, g.mesh_node_xyz[faces])  # [Nf]
    chosen = g.mesh2grid.senders.reshape(-1, 3)[node]
    others = [f for f in range(faces.shape[0]) if not np.array_equal(faces[f], chosen)
              and np.isin(faces[f], chosen).sum() == 2]  # across a side
    f = min(others, key=lambda f: dist[f])
    assert (dist[f] - dist.min() <= 1e-12) == equally_near
    return faces[f]


def test_fixture_with_ties_broken_differently(tmp_path, capsys):
    """Another producer's tie-breaking passes, leaving those nodes out and saying so."""
    cfg = UNSEEN[0]
    g = build_graphs(cfg["resolution"], cfg["splits"], cfg["fraction"])
    points = grid_mesh.grid_positions(g.grid_lat, g.grid_lon)
    faces = icosahedral.multimesh(g.mesh_splits).finest_faces
    _, by_trimesh = grid_mesh.nearest_flat_faces(points, g.mesh_node_xyz, faces)
    ties = np.flatnonzero(by_trimesh)
    assert ties.size == 42
    path = tmp_path / "ties.npz"
    _write_fixture(path, **cfg, m2g_faces={int(n): _other_face(g, n, True) for n in ties[:3]})
    checks = {c.name: c for c in run_checks(load_fixture(path))}
    assert all(c.passed for c in checks.values()), checks
    m2g = checks["mesh2grid edges equal the official ones, edge by edge"]
    assert "3 grid nodes differ: 3 ties the fixture's producer broke differently" in m2g.detail
    own = checks["network on gclab's own graphs, param:: -> outputs"]
    assert own.detail == f"{g.num_grid_nodes - 3} grid nodes (3 ties broken differently left out)"
    assert cli.main(["reference", str(path)]) == 0
    assert "3 ties the fixture's producer broke differently" in capsys.readouterr().out


def test_fixture_with_another_face_off_ties_fails(tmp_path):
    cfg = UNSEEN[0]
    g = build_graphs(cfg["resolution"], cfg["splits"], cfg["fraction"])
    points = grid_mesh.grid_positions(g.grid_lat, g.grid_lon)
    faces = icosahedral.multimesh(g.mesh_splits).finest_faces
    _, by_trimesh = grid_mesh.nearest_flat_faces(points, g.mesh_node_xyz, faces)
    node = int(np.flatnonzero(~by_trimesh)[g.num_grid_nodes // 3])
    path = tmp_path / "other.npz"
    _write_fixture(path, **cfg, m2g_faces={node: _other_face(g, node, False)})
    checks = {c.name: c for c in run_checks(load_fixture(path))}
    m2g = checks["mesh2grid edges equal the official ones, edge by edge"]
    assert not m2g.passed and "1 grid nodes differ: 0 ties" in m2g.detail
    assert cli.main(["reference", str(path)]) == 1
    # The same face with its vertices in another order is not a tie either.
    tie = int(np.flatnonzero(by_trimesh)[0])
    _write_fixture(path, **cfg, m2g_faces={tie: g.mesh2grid.senders[3 * tie:3 * tie + 3][::-1]})
    m2g = {c.name: c for c in run_checks(load_fixture(path))}[m2g.name]
    assert not m2g.passed and "1 grid nodes differ: 0 ties" in m2g.detail


def test_run_checks_names_an_argument_of_the_wrong_kind():
    from gclab.config import WrongType

    with pytest.raises(WrongType, match="^run_checks needs a Fixture .*, not a str$"):
        run_checks("x.npz")
    fx = load_fixture(SHARED[0])
    with pytest.raises(WrongType, match="^tolerance='1e-5' is invalid: a finite number > 0$"):
        run_checks(fx, "1e-5")
    with pytest.raises(ValueError, match="^tolerance=0 is invalid: a finite number > 0$"):
        run_checks(fx, 0)
