"""Fine-tuning on real-layout data from published-format weights (`gclab train --data`)."""

import contextlib
import dataclasses
import io
import json
import os
import shutil

import numpy as np
import pytest

from gclab import cli
from gclab.config import ModelConfig, TaskConfig
from gclab.memory import get_recipe
from gclab.model import param_shapes
from gclab.training.data import SAMPLE_SPACING, SyntheticWeather
from gclab.training.loop import batch_start
from gclab.weather import (
    Checkpoint,
    DatasetWeather,
    check_dataset,
    compute_stats,
    load_stats,
    open_dataset,
    raw_example,
    read_flat,
    synthetic_dataset,
    write_checkpoint,
    write_dataset,
    write_stats,
)

TASK = TaskConfig(pressure_levels=(500, 850))
CFG = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=16, processor_steps=2)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    weather = SyntheticWeather(TASK, CFG.resolution, seed=2)
    write_dataset(synthetic_dataset(weather, frames=8, batch_starts=(0, 50)), root / "data.nc")
    (root / "stats").mkdir()
    write_stats(compute_stats(synthetic_dataset(weather, frames=24, start=100)),
                root / "stats")
    rng = np.random.default_rng(0)
    shapes = param_shapes(CFG, TASK.data_channels, TASK.output_channels)
    params = {m: {n: (0.1 * rng.standard_normal(s.shape)).astype(np.float32)
                  for n, s in leaves.items()} for m, leaves in shapes.items()}
    write_checkpoint(root / "init.npz",
                     Checkpoint.from_gclab(params, CFG, TASK, "published", "CC BY-NC-SA 4.0"))
    return root


def test_dataset_weather_takes_consecutive_windows(files):
    ds = open_dataset(files / "data.nc")
    stats = load_stats(files / "stats")
    lat, lon = np.linspace(-90, 90, CFG.n_lat), np.arange(CFG.n_lon) * CFG.resolution
    source = DatasetWeather(ds, TASK, stats, lat, lon)
    assert source.windows(rollout=2) == 2 * (8 - 3)
    checked = check_dataset(ds, TASK)
    # Step 1 of a batch-3 run takes windows 3, 4, 5: row 0 from frames 3 and 4, row 1
    # from frame 0 (5 windows per row: a rollout of 2 needs 4 of the 8 frames).
    ex = source.make_batch(3, rollout=2, start=batch_start(1, 3))
    want = [raw_example(checked.isel(batch=[r]), TASK, t, 2) for r, t in ((0, 3), (0, 4),
                                                                            (1, 0))]
    for j, raw in enumerate(want):
        one = source.normalization().normalise(raw)
        for a, b in zip(ex, one):
            np.testing.assert_array_equal(np.asarray(a)[..., j, :], np.asarray(b)[..., 0, :])
    assert (batch_start(1, 3) - 1) // SAMPLE_SPACING == 3


def test_zero_learning_rate_keeps_the_published_weights(files, capsys):
    out = files / "same.npz"
    assert cli.main(["train", "--init-checkpoint", str(files / "init.npz"), "--data",
                     str(files / "data.nc"), "--stats", str(files / "stats"),
                     "--train-steps", "2", "--batch", "2", "--learning-rate", "0",
                     "--save-checkpoint", str(out), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["losses"]) == 2 and all(np.isfinite(record["losses"]))
    a, b = read_flat(files / "init.npz"), read_flat(out)
    assert sorted(a) == sorted(b)
    for key in a:
        if key.startswith(("params:", "model_config:", "task_config:")) or key == "license":
            assert a[key].tobytes() == b[key].tobytes(), key
    assert "from published" in str(b["description"])


@pytest.mark.parametrize("recipe", ["none", "lean"])
def test_fine_tuning_with_a_memory_recipe_updates_the_weights(files, capsys, recipe):
    out = files / f"tuned-{recipe}.npz"
    assert cli.main(["train", "--init-checkpoint", str(files / "init.npz"), "--data",
                     str(files / "data.nc"), "--stats", str(files / "stats"),
                     "--train-steps", "6", "--batch", "1", "--rollout", "2",
                     "--recipe", recipe, "--learning-rate", "3e-3", "--schedule-steps", "6",
                     "--save-checkpoint", str(out), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["losses"]) == 6
    # The recipe is the run's (with the rematerialised rollout a recipe adds to a rollout of
    # more than one step): `none` and `lean` train with different memory configurations.
    want = get_recipe(recipe).replace(rollout_remat=recipe != "none")
    assert record["memory"] == json.loads(json.dumps(dataclasses.asdict(want)))
    init, tuned = read_flat(files / "init.npz"), read_flat(out)
    key = "params:mesh2grid_gnn/~_networks_builder/decoder_nodes_grid_nodes_mlp/~/linear_1:w"
    assert tuned[key].shape == init[key].shape
    assert not np.array_equal(tuned[key], init[key])


@pytest.fixture(scope="module")
def one_step(files, tmp_path_factory):
    """One step on --data from the published weights, saved to an orbax checkpoint folder:
    the folder and the run's --json record. Each test that resumes it copies the folder
    (`_one_step_folder`)."""
    folder = tmp_path_factory.mktemp("one_step") / "ckpt"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["train", "--init-checkpoint", str(files / "init.npz"), "--data",
                         str(files / "data.nc"), "--stats", str(files / "stats"), "--json",
                         "--train-steps", "1", "--checkpoint-dir", str(folder)]) == 0
    return folder, json.loads(out.getvalue())


def _one_step_folder(one_step, folder):
    """A copy of `one_step`'s checkpoint folder at `folder`."""
    shutil.copytree(one_step[0], folder)
    return folder


@pytest.mark.xdist_group("finetune-one-step")
def test_resumed_fine_tuning_continues_as_an_uninterrupted_run(files, one_step, capsys,
                                                               tmp_path):
    """Resuming from an orbax checkpoint of a run that started from published weights."""
    argv = ["train", "--init-checkpoint", str(files / "init.npz"), "--data",
            str(files / "data.nc"), "--stats", str(files / "stats"), "--json"]

    def run(*extra: str) -> dict:
        capsys.readouterr()
        assert cli.main([*argv, *extra]) == 0, capsys.readouterr().err[-3000:]
        return json.loads(capsys.readouterr().out)

    straight = run("--train-steps", "3", "--save-checkpoint", str(tmp_path / "straight.npz"))
    ckpt = str(_one_step_folder(one_step, tmp_path / "ckpt"))
    first = one_step[1]
    second = run("--train-steps", "3", "--checkpoint-dir", ckpt, "--save-checkpoint",
                 str(tmp_path / "resumed.npz"))
    assert first["checkpoint_step"] == 1
    assert second["first_step"] == 1 and second["checkpoint_step"] == 3
    assert first["losses"] + second["losses"] == straight["losses"]
    a, b = read_flat(tmp_path / "straight.npz"), read_flat(tmp_path / "resumed.npz")
    for key in a:
        if key.startswith("params:"):
            assert a[key].tobytes() == b[key].tobytes(), key


@pytest.mark.xdist_group("finetune-one-step")
def test_a_resume_on_other_weather_is_one_line(files, one_step, capsys, tmp_path):
    """A checkpoint records whether its run trained on --data: resuming it on the other kind
    of weather (real for synthetic, or synthetic for real) is refused, naming --data."""
    init = ["train", "--init-checkpoint", str(files / "init.npz"), "--train-steps", "1"]
    data = ["--data", str(files / "data.nc"), "--stats", str(files / "stats")]
    for first, then, words in ((data, [], "was trained with --data (on real weather)"),
                               ([], data, "was trained without --data (on synthetic weather)")):
        folder = tmp_path / ("real" if first else "synthetic")
        if first:  # the run on --data is `one_step`'s
            _one_step_folder(one_step, folder)
        else:
            assert cli.main([*init, *first, "--checkpoint-dir", str(folder)]) == 0
        capsys.readouterr()
        assert cli.main([*init, *then, "--train-steps", "2", "--checkpoint-dir",
                         str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gclab train: error: --data: the checkpoint in --checkpoint-dir "
                              f"{folder} (step 1) {words}"), err
        assert err.count("\n") == 1, err


@pytest.mark.parametrize("extra, text", [
    (["--preset", "cpu-4x32"], "--preset: leave it out with --init-checkpoint"),
    (["--latent", "8"], "--latent: leave it out with --init-checkpoint"),
    (["--stats", None], "--data and --stats go together"),
    (["--rollout", "7"], "--rollout 7: the dataset has 8 time steps"),
    (["--save-checkpoint", "x.txt"], "must end in .npz"),
    (["--save-checkpoint", "init.npz"],
     "--save-checkpoint {root}/init.npz: the same file as --init-checkpoint {root}/init.npz"),
])
def test_bad_fine_tuning_inputs_get_one_line(files, capsys, extra, text):
    argv = ["train", "--init-checkpoint", str(files / "init.npz"), "--data",
            str(files / "data.nc"), "--stats", str(files / "stats"), "--train-steps", "1"]
    if extra[1] is None:
        i = argv.index(extra[0])
        del argv[i:i + 2]
    else:
        argv += [extra[0], str(files / extra[1]) if extra[1].endswith((".txt", ".npz"))
                 else extra[1]]
    published = (files / "init.npz").read_bytes()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and text.format(root=files) in err, err
    assert (files / "init.npz").read_bytes() == published


@pytest.mark.xdist_group("finetune-one-step")
def test_a_resume_on_another_dataset_or_other_statistics_is_one_line(files, one_step, capsys,
                                                                      tmp_path):
    """A checkpoint of a run on --data records the dataset (its times, batch rows, grid and
    levels) and a hash of its statistics: a resume with another --data file or --stats was
    accepted silently before (only "real_data" was recorded)."""
    weather = SyntheticWeather(TASK, CFG.resolution, seed=2)
    write_dataset(synthetic_dataset(weather, frames=9, batch_starts=(0, 50)),
                  tmp_path / "longer.nc")
    (tmp_path / "stats").mkdir()
    write_stats(compute_stats(synthetic_dataset(weather, frames=24, start=300)),
                tmp_path / "stats")
    init = ["train", "--init-checkpoint", str(files / "init.npz")]
    folder = _one_step_folder(one_step, tmp_path / "ckpt")
    where = f"the checkpoint in --checkpoint-dir {folder} (step 1) was trained"
    for data, stats, words in (
            (tmp_path / "longer.nc", files / "stats",
             [f"--data: {where} on another dataset (8 times from ", "this one has 9 times"]),
            (files / "data.nc", tmp_path / "stats",
             [f"--stats: {where} with other normalisation statistics (sha256 "])):
        assert cli.main([*init, "--data", str(data), "--stats", str(stats),
                         "--train-steps", "2", "--checkpoint-dir", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gclab train: error: {words[0]}"), err
        assert all(w in err for w in words) and err.count("\n") == 1, err
    assert os.listdir(folder) == ["1"]


def test_a_step_whose_data_is_not_finite_saves_the_steps_before_it(files, capsys, tmp_path):
    """A NaN in a later frame of --data stopped the run at the step that reads it with
    nothing saved before; now the last completed step is saved, and the line says so."""
    ds = open_dataset(files / "data.nc").load()
    ds["2m_temperature"][0, 4] = np.nan  # row 0, frame 4: the third window reads it first
    write_dataset(ds, tmp_path / "nan.nc")
    folder = tmp_path / "ckpt"
    assert cli.main(["train", "--init-checkpoint", str(files / "init.npz"), "--data",
                     str(tmp_path / "nan.nc"), "--stats", str(files / "stats"),
                     "--train-steps", "4", "--checkpoint-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"gclab train: error: step 3: {tmp_path / 'nan.nc'}: variable "
                          "'2m_temperature' holds a non-finite value (nan) at time step 4"), err
    assert err.endswith(f"; saved step 2 to --checkpoint-dir {folder}: resume with the same "
                        "command once that is fixed\n"), err
    assert os.listdir(folder) == ["2"]
