"""`gclab.training`'s checkpoint folder: saves that fail or that orbax declines, entries
orbax would delete, runs that would take no step, and runs that stop early (Ctrl-C, a step
whose data cannot be read), which save their last completed step."""

import math
import os
import threading

import jax.numpy as jnp
import optax
import pytest

from gclab.config import ModelConfig, TaskConfig
from gclab.training import loop
from gclab.training.data import SyntheticWeather
from gclab.training.loop import (
    CheckpointDirError,
    SaveError,
    StepsReached,
    Stopped,
    foreign_entries,
    save_state,
    train,
    weather_fingerprint,
)
from gclab.training.step import init_state_from_params

TASK = TaskConfig(pressure_levels=(500, 850))
TINY = ModelConfig(resolution=6.0, mesh_splits=2, latent_size=16, processor_steps=2)


def _state(step: int):
    """A small `TrainState` at `step` (what a save writes does not depend on the model)."""
    return init_state_from_params({"m": {"w": jnp.ones(3)}}, optax.adam(1e-3))._replace(
        step=jnp.int32(step))


def orbax_threads() -> list:
    """Orbax's background threads still running (a failed asynchronous save left them
    waiting 300 s for the folder it could not make, and the process could not exit)."""
    return [t for t in threading.enumerate() if type(t).__module__.startswith("orbax")]


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if `train` gets as far as building graphs."""
    monkeypatch.setattr(loop, "graphs_for",
                        lambda *a: pytest.fail("work started before the folder was checked"))


def test_a_save_to_a_file_is_one_error_and_leaves_no_thread_behind(tmp_path):
    """Orbax's traceback logs, its temporary path in the message, and its commit threads
    waiting on (the process hung 300 s at exit) before; now one `SaveError`."""
    path = tmp_path / "ckpt"
    path.write_text("a file where the folder was")
    with pytest.raises(SaveError) as e:
        save_state(str(path), _state(5))
    assert (e.value.step, e.value.reason) == (5, "it is a file, not a folder")
    assert str(e.value) == "could not save step 5 (it is a file, not a folder)"
    assert not orbax_threads()
    assert path.read_text() == "a file where the folder was"


def test_a_save_orbax_declines_is_an_error(tmp_path):
    """Orbax saves only steps past its latest: a save of step 3 next to step 5 wrote nothing
    and was reported saved before."""
    assert save_state(str(tmp_path), _state(5)) == 5
    for step in (3, 5):
        with pytest.raises(SaveError, match=f"^could not save step {step} \\(orbax declined "
                           "it: the folder holds step 5"):
            save_state(str(tmp_path), _state(step))
    assert os.listdir(tmp_path) == ["5"]


def test_entries_orbax_did_not_write_are_refused_not_deleted(tmp_path, no_work):
    """Orbax takes any number-named entry for a checkpoint, and deletes it when it keeps
    only the two newest: a user's `1/results.csv` was deleted. Orbax's own steps and an
    empty folder (nothing to lose) pass."""
    for step in (2, 3):
        save_state(str(tmp_path), _state(step))
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "results.csv").write_text("a,b\n")
    (tmp_path / "7").write_text("notes")
    (tmp_path / "9").mkdir()
    (tmp_path / "notes").mkdir()
    assert foreign_entries(str(tmp_path)) == ["1", "7"]
    with pytest.raises(CheckpointDirError) as e:
        save_state(str(tmp_path), _state(4))
    assert e.value.entries == ["1", "7"]
    assert str(e.value).startswith("holds 1, 7, which orbax did not write: they are named "
                                   "like checkpoints, and orbax keeps the two newest")
    with pytest.raises(CheckpointDirError):
        train(TINY, TASK, 5, checkpoint_dir=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["1", "2", "3", "7", "9", "notes"]
    assert (tmp_path / "1" / "results.csv").read_text() == "a,b\n"


def test_steps_at_or_below_the_checkpoint_are_refused_before_any_work(tmp_path, monkeypatch):
    """A run asked to reach a step its checkpoint already passed took no step and said
    "saved step 4" (orbax declined the save) before."""
    save_state(str(tmp_path), _state(4))
    monkeypatch.setattr(loop, "graphs_for", lambda *a: pytest.fail("work started"))
    for steps in (3, 4):
        with pytest.raises(StepsReached) as e:
            train(TINY, TASK, steps, schedule_steps=10, checkpoint_dir=str(tmp_path))
        assert (e.value.step, e.value.steps) == (4, steps)
        assert str(e.value).startswith(f"steps={steps} is invalid: the latest checkpoint is at "
                                       "step 4 already")


def _stop_at(step: int, error: BaseException):
    """A `progress` that raises `error` when the loop reaches `step` (0-based)."""
    def progress(steps):
        for k in steps:
            if k == step:
                raise error
            yield k
    return progress


def test_an_interrupted_run_saves_its_last_step_and_resumes_exactly(tmp_path):
    """Ctrl-C after two steps of four saved nothing before. Now the state of step 2 is
    saved, the KeyboardInterrupt re-raised with a `Stopped`, and the run resumed from it has
    the losses of an uninterrupted one."""
    kw = {"schedule_steps": 10}
    straight = train(TINY, TASK, 4, **kw)
    folder = tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt) as e:
        train(TINY, TASK, 4, checkpoint_dir=str(folder),
              progress=_stop_at(2, KeyboardInterrupt()), **kw)
    assert e.value.stopped == Stopped(3, saved=2)
    assert os.listdir(folder) == ["2"]
    resumed = train(TINY, TASK, 4, checkpoint_dir=str(folder), **kw)
    assert resumed.first_step == 2 and resumed.checkpoint == 4
    assert resumed.losses == straight.losses[2:]


def test_a_step_that_fails_saves_the_steps_before_it(tmp_path):
    """An error reading a step's weather (a DataError or OSError) is re-raised after the
    last completed step is saved; a run that completed no step saves nothing, and makes no
    folder."""
    weather = SyntheticWeather(TASK, TINY.resolution, seed=0)

    class Failing:
        def normalization(self):
            return weather.normalization()

        def make_batch(self, batch, rollout, start):
            if start == loop.batch_start(1, batch):
                raise OSError(5, "Input/output error", "data.nc")
            return weather.make_batch(batch, rollout, start)

    folder = tmp_path / "ckpt"
    with pytest.raises(OSError) as e:
        train(TINY, TASK, 3, schedule_steps=10, weather=Failing(), checkpoint_dir=str(folder))
    assert e.value.stopped == Stopped(2, saved=1)
    assert os.listdir(folder) == ["1"]
    empty = tmp_path / "empty"
    with pytest.raises(KeyboardInterrupt) as e:
        train(TINY, TASK, 3, schedule_steps=10, checkpoint_dir=str(empty),
              progress=_stop_at(0, KeyboardInterrupt()))
    assert e.value.stopped == Stopped(1, why_not="no step completed")
    assert not empty.exists()


def test_a_run_that_diverges_makes_no_folder_and_says_nothing_was_restored(tmp_path):
    """The largest learning rate float32 holds: step 1's loss and gradient are finite, its
    update is not. The run stops as a diverged one does, saving nothing: the folder was
    made (empty) before the first save; and the divergence said earlier checkpoints were
    kept when there were none."""
    folder = tmp_path / "new"
    with pytest.raises(loop.TrainingDiverged) as e:
        train(TINY, TASK, 1, learning_rate=3.4e38, schedule_steps=1,
              checkpoint_dir=str(folder))
    assert e.value.weights and e.value.step == 1 and math.isfinite(e.value.loss)
    assert str(e.value).startswith("the weights are not finite after step 1 (loss ")
    assert e.value.resumed is None and e.value.saved is None
    assert str(e.value).endswith("training diverged, and nothing was saved")
    assert not folder.exists() and os.listdir(tmp_path) == []


def test_the_fingerprint_of_given_weather_names_its_statistics():
    """Recorded with each checkpoint of a run on given weather (`RUN_SETTINGS`): a hash of
    its normalisation statistics (and, for a dataset, its times, grid and levels:
    tests/weather/test_finetune.py)."""
    a, b = (SyntheticWeather(TASK, TINY.resolution, seed=s) for s in (0, 0))
    other = SyntheticWeather(TaskConfig(pressure_levels=(500, 700, 850)), TINY.resolution)
    assert weather_fingerprint(a) == weather_fingerprint(b)
    assert set(weather_fingerprint(a)) == {"stats"}
    assert weather_fingerprint(a)["stats"].startswith("sha256 ")
    assert weather_fingerprint(other) != weather_fingerprint(a)
    assert {"data", "stats"} <= set(loop.RUN_SETTINGS)
