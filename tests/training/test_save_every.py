"""`gclab.training.train`'s periodic checkpoints (`save_every`, `gclab train --save-every`):
a run killed outright (the OOM killer, a preempted machine) saves nothing on its way out,
and lost every step since it started; now it resumes from its last multiple of N.

One tiny model (30 deg, 1 split, 1 x 8) and schedule throughout: the tests share one
worker (`xdist_group`), so its step is compiled once there.
"""

import os

import pytest

from gclab.cli import main
from gclab.config import ModelConfig, TaskConfig
from gclab.training import loop
from gclab.training.loop import Stopped, TrainingDiverged, train

pytestmark = pytest.mark.xdist_group("save-every")

TASK = TaskConfig(pressure_levels=(500, 850))
TINY = ModelConfig(resolution=30.0, mesh_splits=1, latent_size=8, processor_steps=1)
TINY_ARGS = ["--resolution", "30", "--mesh-splits", "1", "--latent", "8", "--steps", "1"]
KW = {"schedule_steps": 10}


def _steps(folder) -> list:
    """The checkpoints in `folder`, by step."""
    return sorted(int(n) for n in os.listdir(folder)) if os.path.isdir(folder) else []


def _watching(folder, seen: list):
    """A `progress` that records the folder's checkpoints after each step (its save
    included), before the next one or the final save."""
    def progress(steps):
        for k in steps:
            yield k
            seen.append(_steps(folder))
    return progress


def _killed_after(step: int):
    """A `progress` that ends the run after `step` (counted from 1) as a kill would: with
    no save on the way out (`SystemExit` is no `Exception`, which a run saves on)."""
    def progress(steps):
        for k in steps:
            if k == step:
                raise SystemExit(137)
            yield k
    return progress


def test_every_nth_step_is_saved_during_the_run(tmp_path):
    """Five steps, `save_every=2`: steps 2 and 4 are on disk as soon as they are done, the
    final save adds 5, and orbax keeps the two newest."""
    folder, seen = tmp_path / "ckpt", []
    result = train(TINY, TASK, 5, checkpoint_dir=str(folder), save_every=2,
                   progress=_watching(folder, seen), **KW)
    assert seen == [[], [2], [2], [2, 4], [2, 4]]
    assert result.checkpoint == 5
    assert _steps(folder) == [4, 5]


def test_a_killed_run_resumes_from_its_last_periodic_save(tmp_path):
    """Killed after step 3 of 4: step 2 is on disk, and a run resumed from it, with another
    `save_every` (not a setting a resume must keep), has the losses of an uninterrupted
    run; its last step, a multiple of it, is saved once (orbax declines a second save)."""
    straight = train(TINY, TASK, 4, **KW)
    folder = tmp_path / "ckpt"
    with pytest.raises(SystemExit):
        train(TINY, TASK, 4, checkpoint_dir=str(folder), save_every=2,
              progress=_killed_after(3), **KW)
    assert _steps(folder) == [2]
    resumed = train(TINY, TASK, 4, checkpoint_dir=str(folder), save_every=4, **KW)
    assert (resumed.first_step, resumed.checkpoint) == (2, 4)
    assert _steps(folder) == [2, 4]
    assert resumed.losses == straight.losses[2:]


def test_a_run_stopped_right_after_a_periodic_save_names_it(tmp_path):
    """Ctrl-C after step 2, which `save_every=2` saved: the save on stopping would be
    declined by orbax (it holds the step), and is not tried; the run says step 2 is saved."""
    folder = tmp_path / "ckpt"

    def interrupted(steps):
        for k in steps:
            if k == 2:
                raise KeyboardInterrupt
            yield k

    with pytest.raises(KeyboardInterrupt) as e:
        train(TINY, TASK, 5, checkpoint_dir=str(folder), save_every=2,
              progress=interrupted, **KW)
    assert e.value.stopped == Stopped(3, saved=2)
    assert _steps(folder) == [2]


def test_a_diverged_run_names_its_last_periodic_save(tmp_path, capsys):
    """A learning rate of 1e30 with no warm-up: step 1's update is finite but huge, step 2's
    loss is NaN. Step 1, saved by `save_every=1`, is kept, and the error says so, rather
    than that nothing was saved."""
    folder = tmp_path / "ckpt"
    with pytest.raises(TrainingDiverged) as e:
        train(TINY, TASK, 4, learning_rate=1e30, schedule_steps=4, checkpoint_dir=str(folder),
              save_every=1)
    assert (e.value.step, e.value.saved, e.value.resumed) == (2, 1, None)
    assert "training diverged, and nothing after step 1 was saved" in str(e.value)
    assert _steps(folder) == [1]
    other = tmp_path / "other"
    assert main(["train", *TINY_ARGS, "--train-steps", "4", "--learning-rate", "1e30",
                 "--schedule-steps", "4", "--checkpoint-dir", str(other),
                 "--save-every", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert (f"training diverged and nothing after step 1 was saved; earlier checkpoints in "
            f"--checkpoint-dir {other} are kept; try a lower --learning-rate") in err, err
    assert _steps(other) == [1]


@pytest.mark.parametrize("save_every,error,words", [
    (0, ValueError, "save_every=0 is invalid: an integer >= 1"),
    (-1, ValueError, "save_every=-1 is invalid: an integer >= 1"),
    (1.5, TypeError, "save_every=1.5 is invalid: an integer >= 1"),
    (True, TypeError, "save_every=True is invalid: an integer >= 1"),
    ("2", TypeError, "save_every='2' is invalid: an integer >= 1"),
])
def test_a_save_every_that_is_no_step_count_is_refused_before_any_work(
        tmp_path, monkeypatch, save_every, error, words):
    monkeypatch.setattr(loop, "graphs_for", lambda *a: pytest.fail("work started"))
    with pytest.raises(error) as e:
        train(TINY, TASK, 2, checkpoint_dir=str(tmp_path / "ckpt"), save_every=save_every,
              **KW)
    assert str(e.value) == words
    assert not (tmp_path / "ckpt").exists()


def test_save_every_without_a_folder_is_refused_before_any_work(monkeypatch):
    """It would save nothing, and say nothing of it."""
    monkeypatch.setattr(loop, "graphs_for", lambda *a: pytest.fail("work started"))
    with pytest.raises(ValueError) as e:
        train(TINY, TASK, 2, save_every=2, **KW)
    assert str(e.value) == ("save_every=2 is invalid without checkpoint_dir, the folder it "
                            "saves to: give both, or leave save_every None")


@pytest.mark.parametrize("argv,words", [
    (["--save-every", "2"], "gclab train: error: --save-every 2: only with --checkpoint-dir "
                            "DIR (the folder it saves to)"),
    (["--save-every", "0", "--checkpoint-dir", "ckpt"], "gclab train: error: --save-every 0: "
                                                        "an integer >= 1"),
    (["--save-every", "x", "--checkpoint-dir", "ckpt"], "gclab train: error: --save-every x: "
                                                        "not an integer"),
])
def test_a_bad_save_every_is_one_line_and_exit_2(argv, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(loop, "graphs_for", lambda *a: pytest.fail("work started"))
    assert main(["train", *TINY_ARGS, "--train-steps", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(words) and err.count("\n") == 1, err
    assert not (tmp_path / "ckpt").exists()


def test_the_cli_saves_every_n_steps_and_resumes_with_another_n(tmp_path, capsys):
    """--save-every is not one of the options a resumed run must keep (`RUN_SETTINGS`)."""
    folder = tmp_path / "ckpt"
    run = ["train", *TINY_ARGS, "--schedule-steps", "10", "--checkpoint-dir", str(folder)]
    assert main([*run, "--train-steps", "3", "--save-every", "2"]) == 0
    assert "saved step 3" in capsys.readouterr().out
    assert _steps(folder) == [2, 3]
    assert main([*run, "--train-steps", "4", "--save-every", "1"]) == 0, capsys.readouterr().err
    assert "saved step 4" in capsys.readouterr().out
    assert _steps(folder) == [3, 4]


def test_the_help_says_what_save_every_does(capsys):
    assert main(["train", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--save-every N with --checkpoint-dir, also save there after every N-th step" in out


def test_an_interrupt_as_a_periodic_save_ends_still_names_that_save(tmp_path, monkeypatch):
    """Ctrl-C landing just as orbax committed step 2, before the run took note of it: the
    save on stopping must not try step 2 again (orbax declines it) and report that nothing
    was saved while step 2 is on disk."""
    folder = tmp_path / "ckpt"
    real = loop.save_state
    calls = []

    def save_then_interrupt(*args, **kwargs):
        step = real(*args, **kwargs)
        calls.append(step)
        if len(calls) == 1:
            raise KeyboardInterrupt  # the save is done, `train` has not heard of it
        return step

    monkeypatch.setattr(loop, "save_state", save_then_interrupt)
    with pytest.raises(KeyboardInterrupt) as e:
        train(TINY, TASK, 5, checkpoint_dir=str(folder), save_every=2, **KW)
    assert e.value.stopped == Stopped(3, saved=2)
    assert calls == [2] and _steps(folder) == [2]


def test_a_failed_periodic_save_names_the_step_still_kept(tmp_path, monkeypatch, capsys):
    """Step 4's save fails (a full disk, say): the run stops with one line that says step 2
    is still in the folder and how to go on from it."""
    folder = tmp_path / "ckpt"
    real = loop.save_state

    def disk_full_at_4(directory, state, *args, **kwargs):
        if int(state.step) == 4:
            raise loop.SaveError(4, "OSError: No space left on device")
        return real(directory, state, *args, **kwargs)

    monkeypatch.setattr(loop, "save_state", disk_full_at_4)
    assert main(["train", *TINY_ARGS, "--train-steps", "5", "--schedule-steps", "10",
                 "--checkpoint-dir", str(folder), "--save-every", "2"]) == 1
    err = capsys.readouterr().err
    assert err == (f"gclab train: error: --checkpoint-dir {folder}: could not save step 4 "
                   "(OSError: No space left on device); step 2 is kept there: resume with the "
                   "same command once that is fixed\n")
    assert _steps(folder) == [2]
