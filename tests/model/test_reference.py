"""Equivalence with the official code: the shared fixtures and fixtures never seen before.

The two shared fixtures were produced by the official GraphCast code. The unseen fixtures
are written here in the same format by an independent float64 numpy forward pass of the
published model (below; it shares no code with `gclab.model`), at other resolutions,
splits, widths, step counts, hidden layers, radius fractions and batch sizes, and without
a JSON sidecar, so the config must be recovered from the arrays alone.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from gclab import cli
from gclab.geometry import build_graphs
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


def _write_fixture(path, *, resolution, splits, L, S, H, C, O, B, fraction, seed=0):
    """Writes a fixture in the official format from gclab's graphs and the numpy model."""
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


def test_sidecar_ties_are_all_found_by_geometry():
    for path in SHARED:
        side = json.loads(path.with_suffix(".json").read_text())
        listed = side["graph"]["tie_diagnostics"]["m2g_grid_nodes_on_face_boundary_indices"]
        from gclab.model import tie_nodes

        cfg = side["config"]
        found = tie_nodes(build_graphs(cfg["resolution"], cfg["mesh_size"]))
        assert set(listed) <= set(found.tolist())
        assert len(found) == len(listed)
