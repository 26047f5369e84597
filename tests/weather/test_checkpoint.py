"""Published checkpoint files: lossless round trips, the official key layout, clear errors."""

import io
import os
import struct
import zipfile

import jax
import numpy as np
import pytest

from gclab import cli
from gclab.config import ModelConfig, TaskConfig
from gclab.geometry import build_graphs
from gclab.model import graph_inputs, make_network
from gclab.weather import (
    Checkpoint,
    CheckpointError,
    OfficialTask,
    read_checkpoint,
    read_flat,
    to_flat,
    write_checkpoint,
)

TASK = TaskConfig(pressure_levels=(500, 850))
CFG = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=16, processor_steps=2)


@pytest.fixture(scope="module")
def params():
    graphs = build_graphs(CFG.resolution, CFG.mesh_splits)
    net = make_network(CFG, TASK.data_channels, TASK.output_channels)
    inputs = np.zeros((CFG.num_grid_nodes, 1, TASK.data_channels), np.float32)
    p = net.init(jax.random.PRNGKey(0), graph_inputs(graphs), inputs)
    return jax.tree_util.tree_map(np.asarray, p)


def _same_bytes(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


def test_round_trip_is_lossless(tmp_path, params):
    ckpt = Checkpoint.from_gclab(params, CFG, TASK, "tiny", "CC BY-SA 4.0")
    write_checkpoint(tmp_path / "a.npz", ckpt)
    back = read_checkpoint(tmp_path / "a.npz")
    assert back.model == CFG and back.task == TASK
    assert back.description == "tiny" and back.license == "CC BY-SA 4.0"
    assert back.model.mesh2grid_edge_normalization_factor is None
    for module, leaves in params.items():
        for name, value in leaves.items():
            assert back.params[module][name].tobytes() == value.tobytes()
    write_checkpoint(tmp_path / "b.npz", back)
    _same_bytes(read_flat(tmp_path / "a.npz"), read_flat(tmp_path / "b.npz"))


def test_key_layout_matches_the_published_files(tmp_path, params):
    flat = to_flat(Checkpoint.from_gclab(params, CFG.replace(
        mesh2grid_edge_normalization_factor=0.5), TASK))
    # Official module paths, one per processor step; 0-d float64 / int64 / unicode scalars.
    assert "params:mesh_gnn/~_networks_builder/processor_edges_1_mesh_mlp/~/linear_0:w" in flat
    assert flat["model_config:resolution"].dtype == np.float64
    assert flat["model_config:mesh_size"].dtype == np.int64
    assert flat["model_config:gnn_msg_steps"].shape == ()
    assert flat["model_config:mesh2grid_edge_normalization_factor"] == 0.5
    assert flat["task_config:pressure_levels:1"] == 850
    assert flat["task_config:pressure_levels:1"].dtype == np.int64
    assert str(flat["task_config:target_variables:2"]) == "10m_v_component_of_wind"
    assert str(flat["task_config:input_duration"]) == "12h"
    assert flat["description"].dtype.kind == "U"
    n_inputs = sum(k.startswith("task_config:input_variables:") for k in flat)
    assert n_inputs == 5 + 6 + 5 + 2
    # Without precipitation input the published task lists 4 surface inputs.
    ops = OfficialTask.from_task(TaskConfig(TASK.pressure_levels, False))
    assert "total_precipitation_6hr" not in ops.input_variables
    assert ops.to_task() == TaskConfig(TASK.pressure_levels, False)


def test_a_file_in_the_official_order_round_trips_byte_for_byte(tmp_path, params):
    # The official writer puts params first, then the configs, description, license;
    # another variable order in the task is kept as it is.
    flat = to_flat(Checkpoint.from_gclab(params, CFG, TASK, "d", "l"))
    order = [k for k in flat if k.startswith("task_config:input_variables:")]
    swapped = dict(flat)
    swapped[order[0]], swapped[order[1]] = flat[order[1]], flat[order[0]]
    np.savez(tmp_path / "official.npz", **swapped)
    ckpt = read_checkpoint(tmp_path / "official.npz")
    write_checkpoint(tmp_path / "again.npz", ckpt)
    _same_bytes(read_flat(tmp_path / "official.npz"), read_flat(tmp_path / "again.npz"))


LAST_W = "params:mesh2grid_gnn/~_networks_builder/decoder_nodes_grid_nodes_mlp/~/linear_1:w"


def _put(flat: dict, key: str, index: tuple, value) -> None:
    flat[key] = flat[key].copy()  # the parameters' arrays are read-only
    flat[key][index] = value


@pytest.mark.parametrize("change, message", [
    (lambda f: f.pop("model_config:latent_size"), "missing key 'model_config:latent_size'"),
    (lambda f: f.pop("license"), "missing key 'license'"),
    (lambda f: f.update({"model_config:dropout": np.asarray(0.1)}),
     "unknown key 'model_config:dropout'"),
    (lambda f: f.update({"optimizer:lr": np.asarray(0.1)}), "unknown key 'optimizer:lr'"),
    (lambda f: f.update({"task_config:input_duration": np.asarray("18h")}),
     "task_config:input_duration must be '12h'"),
    (lambda f: f.update({"task_config:target_variables:0": np.asarray("snow")}),
     "task_config:target_variables must be"),
    (lambda f: f.pop("task_config:pressure_levels:0"), "pressure_levels has elements [1]"),
    (lambda f: f.update({"model_config:mesh_size": np.asarray([1, 2])}),
     "model_config:mesh_size must be a 0-d array of an integer"),
    (lambda f: f.update({"model_config:mesh_size": np.asarray(99)}), "mesh_splits=99"),
    (lambda f: f.update({"params:mesh_gnn/~_networks_builder/x:w": np.zeros(2)}),
     "unknown key 'params:mesh_gnn/~_networks_builder/x:w'"),
    (lambda f: f.update({"params:grid2mesh_gnn/x:w": np.zeros(2)}),
     "not an official GraphCast parameter path"),
    (lambda f: f.pop("params:mesh2grid_gnn/~_networks_builder/decoder_nodes_grid_nodes_mlp"
                     "/~/linear_1:b"), "missing key 'params:mesh2grid_gnn/"),
    (lambda f: f.update({"params:mesh2grid_gnn/~_networks_builder/decoder_nodes_grid_nodes_"
                         "mlp/~/linear_1:b": np.zeros(3, np.float32)}),
     "linear_1:b has shape (3,), this model_config and task_config need"),
    (lambda f: [f.pop(k) for k in list(f) if k.startswith("params:")], "no parameters"),
    (lambda f: _put(f, LAST_W, (3, 4), np.nan),
     f"{LAST_W} holds a non-finite value (nan) at index (3, 4); parameters must be finite"),
    (lambda f: _put(f, LAST_W, (0, 0), -np.inf), f"{LAST_W} holds a non-finite value (-inf) "
                                                 "at index (0, 0)"),
    (lambda f: f.update({LAST_W: f[LAST_W].astype(np.int32)}),
     f"{LAST_W} has dtype int32; parameters must be floating point"),
    (lambda f: f.update({LAST_W: f[LAST_W].astype(str)}), f"{LAST_W} has dtype <U"),
])
def test_bad_checkpoints_name_the_key(tmp_path, params, change, message):
    flat = to_flat(Checkpoint.from_gclab(params, CFG, TASK))
    change(flat)
    np.savez(tmp_path / "bad.npz", **flat)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(tmp_path / "bad.npz")
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(tmp_path / "bad.npz") in str(e.value)


def test_missing_corrupt_and_pickled_files(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        read_checkpoint(tmp_path / "none.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        read_checkpoint(tmp_path / "junk.npz")
    np.savez(tmp_path / "pickled.npz", description=np.asarray([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        read_checkpoint(tmp_path / "pickled.npz")


def _damage_deflate(path, member: str) -> None:
    """Sets the first byte of `member`'s deflate data to 0xff (a reserved block type)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        start = z.getinfo(member).header_offset
    name_len, extra_len = struct.unpack("<HH", data[start + 26:start + 30])
    data[start + 30 + name_len + extra_len] = 0xff
    path.write_bytes(bytes(data))


def _one_line_error(capsys, argv) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("option", ["--checkpoint", "--init-checkpoint"])
def test_damaged_deflate_data_is_named_with_its_member(tmp_path, params, capsys, option):
    path = tmp_path / "zipped.npz"
    np.savez_compressed(path, **to_flat(Checkpoint.from_gclab(params, CFG, TASK)))
    _damage_deflate(path, "license.npy")
    with pytest.raises(CheckpointError) as e:  # was a zlib.error traceback
        read_checkpoint(path)
    assert str(e.value).startswith(f"{path}: not a checkpoint") and "license.npy" in str(e.value)
    command = "forecast" if option == "--checkpoint" else "train"
    err = _one_line_error(capsys, [command, option, str(path)])
    assert f"{option} {path}: " in err and "license.npy: Error -3" in err


def test_a_header_declaring_more_than_its_member_holds_is_refused_before_reading(
        tmp_path, params, capsys):
    flat = to_flat(Checkpoint.from_gclab(params, CFG, TASK))
    path = tmp_path / "huge.npz"
    np.savez(path, **{k: v for k, v in flat.items() if k != LAST_W})
    header = io.BytesIO()  # 728 TiB declared: numpy would allocate it before reading
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (10**14,)})
    with zipfile.ZipFile(path, "a") as z:
        z.writestr(LAST_W + ".npy", header.getvalue() + bytes(64))
    with pytest.raises(CheckpointError) as e:  # not a MemoryError traceback
        read_checkpoint(path)
    message = str(e.value)
    assert message.startswith(f"{path}: ") and f"member {LAST_W}.npy" in message
    assert "declares shape (100000000000000,) of float64" in message and "64 bytes" in message
    err = _one_line_error(capsys, ["forecast", "--checkpoint", str(path)])
    assert f"{LAST_W}.npy" in err and "out of memory" not in err


def test_an_unreadable_checkpoint_is_not_called_a_non_zip_file(tmp_path, params, lock_file,
                                                               capsys):
    # `zipfile.is_zipfile` answers False for a file it cannot open.
    path = tmp_path / "locked.npz"
    write_checkpoint(path, Checkpoint.from_gclab(params, CFG, TASK))
    lock_file(path)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(path)
    assert str(e.value) == f"{path}: cannot read it (Permission denied)"
    err = _one_line_error(capsys, ["forecast", "--checkpoint", str(path)])
    assert f"--checkpoint {path}: cannot read it (Permission denied)" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file without read permission")
def test_a_checkpoint_without_read_permission_is_named_unreadable(tmp_path, params):
    path = tmp_path / "locked.npz"
    write_checkpoint(path, Checkpoint.from_gclab(params, CFG, TASK))
    path.chmod(0)
    try:
        with pytest.raises(CheckpointError, match="cannot read it \\(Permission denied\\)"):
            read_checkpoint(path)
    finally:
        path.chmod(0o600)


def test_a_failed_write_keeps_the_old_file(tmp_path, params):
    path = tmp_path / "c.npz"
    write_checkpoint(path, Checkpoint.from_gclab(params, CFG, TASK, "old"))
    # The right shapes (checked first), of a dtype that would need pickle.
    module = "grid2mesh_gnn/encoder_nodes_grid_nodes_mlp/~/linear_0"
    leaves = {**params[module], "w": np.asarray(params[module]["w"], object)}
    bad = Checkpoint.from_gclab({**params, module: leaves}, CFG, TASK)
    with pytest.raises(CheckpointError, match="grid2mesh_gnn/~_networks_builder/encoder_nodes_"
                                              "grid_nodes_mlp/~/linear_0:w has dtype object"):
        write_checkpoint(path, bad)
    assert read_checkpoint(path).description == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["c.npz"]


def test_write_checkpoint_refuses_what_would_not_read_back(tmp_path, params):
    # Guards against writing parameters of another task (a file read_checkpoint would then
    # refuse) and an AttributeError for a dict. Nothing is written on a refusal.
    import dataclasses

    path = tmp_path / "w.npz"
    with pytest.raises(CheckpointError, match=f"^{path}: params:grid2mesh_gnn/.*linear_0:w has "
                                              r"shape \(54, 16\), this model_config and "
                                              r"task_config need \(186, 16\)$"):
        write_checkpoint(path, Checkpoint.from_gclab(params, CFG, TaskConfig()))
    mixed = dataclasses.replace(Checkpoint.from_gclab(params, CFG, TASK),
                                official_task=OfficialTask.from_task(TaskConfig()))
    with pytest.raises(CheckpointError, match=f"^{path}: official_task is for TaskConfig"):
        write_checkpoint(path, mixed)
    with pytest.raises(TypeError, match=r"^ckpt is invalid: a Checkpoint \(read_checkpoint"
                                        r"\(path\) or Checkpoint.from_gclab\), not a dict$"):
        write_checkpoint(path, params)
    assert list(tmp_path.iterdir()) == []
    write_checkpoint(path, Checkpoint.from_gclab(params, CFG, TASK))
    assert read_checkpoint(path).task == TASK
