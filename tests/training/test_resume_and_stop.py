"""What a resumed run must repeat of the model, and a run stopped by SIGTERM.

A checkpoint records the model's function where it keeps every parameter's shape (grid,
mesh, radius, mesh2grid normalisation, pressure levels, precision: `MODEL_SETTINGS`): a
resume that changes one restored before, and trained the parameters for another function.
SIGTERM (`timeout`, `docker stop`, a scheduler preempting the run) ended the process at
once, losing every step since the last save; now the run stops as on Ctrl-C, saving the
last step it completed.

One tiny model (30 deg, 1 split, 1 x 8) in this process; the command line's runs use a
10 deg one, whose steps are slow enough to be stopped in the middle of a run. The tests
share one worker (`xdist_group`), so each step is compiled once there.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from gclab.cli import main
from gclab.config import ModelConfig, TaskConfig
from gclab.memory import MemoryConfig
from gclab.training import loop
from gclab.training.loop import (
    MODEL_SETTINGS,
    ModelMismatch,
    Stopped,
    Terminated,
    latest_step,
    model_settings,
    train,
)

pytestmark = pytest.mark.xdist_group("resume-and-stop")

ROOT = Path(__file__).resolve().parents[2]
TASK = TaskConfig(pressure_levels=(500, 850))
TINY = ModelConfig(resolution=30.0, mesh_splits=1, latent_size=8, processor_steps=1)
KW = {"schedule_steps": 10}
# The command line's model: its steps take long enough for a run to be stopped mid-way.
T = ["--resolution", "10", "--mesh-splits", "2", "--latent", "16", "--steps", "2"]
TIMEOUT = 600


def _steps(folder) -> list:
    """The entries of `folder`, checkpoints by step first (anything else is a failure)."""
    return sorted(os.listdir(folder), key=lambda n: (not n.isdigit(), int(n) if n.isdigit()
                                                     else 0, n))


def _metadata(folder, step: int) -> Path:
    return Path(folder) / str(step) / "_CHECKPOINT_METADATA"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A folder holding step 1 of `TINY` (float32)."""
    folder = tmp_path_factory.mktemp("saved") / "ckpt"
    assert train(TINY, TASK, 1, checkpoint_dir=str(folder), **KW).checkpoint == 1
    return folder


@pytest.mark.parametrize("model, task, memory, name, stored, given", [
    (TINY.replace(resolution=20.0), TASK, None, "resolution", 30.0, 20.0),
    (TINY.replace(mesh_splits=0), TASK, None, "mesh_splits", 1, 0),
    (TINY.replace(radius_query_fraction_edge_length=0.9), TASK, None,
     "radius_query_fraction_edge_length", 0.6, 0.9),
    (TINY.replace(mesh2grid_edge_normalization_factor=2.0), TASK, None,
     "mesh2grid_edge_normalization_factor", None, 2.0),
    # As many levels (the same shapes), other pressures.
    (TINY, TaskConfig(pressure_levels=(500, 700)), None, "pressure_levels", [500, 850],
     [500, 700]),
    (TINY, TASK, MemoryConfig(precision="bf16"), "precision", "f32", "bf16"),
])
def test_a_resume_of_another_model_function_is_refused(saved, model, task, memory, name,
                                                       stored, given):
    """None of these changes a parameter's shape, so each restored before and trained the
    parameters for another function; now each is refused before any work, naming the
    setting, and nothing is saved."""
    before = _metadata(saved, 1).read_bytes()
    with pytest.raises(ModelMismatch) as e:
        train(model, task, 2, checkpoint_dir=str(saved), memory=memory, **KW)
    assert (e.value.step, e.value.name, e.value.stored, e.value.given) == (1, name, stored,
                                                                           given)
    assert str(e.value) == (f"step 1 was saved by a run with {name}={stored!r}, not {given!r} "
                            "(resume with the same value, or start another folder)")
    assert _steps(saved) == ["1"] and _metadata(saved, 1).read_bytes() == before


def test_the_command_line_refuses_another_mesh_radius_or_precision_in_one_line(tmp_path,
                                                                              capsys):
    folder = tmp_path / "ckpt"
    tiny = ["--resolution", "30", "--mesh-splits", "1", "--latent", "8", "--steps", "1"]
    assert main(["train", *tiny, "--train-steps", "1", "--checkpoint-dir", str(folder)]) == 0
    for option, value in (("--mesh-splits", "0"), ("--radius-fraction", "0.9"),
                          ("--precision", "bf16"), ("--resolution", "20")):
        capsys.readouterr()
        argv = [*tiny, option, value]
        assert main(["train", *argv, "--train-steps", "2", "--checkpoint-dir",
                     str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("gclab train: error: ") and err.count("\n") == 1, err
    assert _steps(folder) == ["1"]


def test_a_checkpoint_without_the_model_settings_still_resumes(saved, tmp_path):
    """Each checkpoint records them; one saved before they were recorded resumes unchecked
    in them."""
    folder = tmp_path / "old"
    shutil.copytree(saved, folder)
    metadata = _metadata(folder, 1)
    record = json.loads(metadata.read_text())
    recorded = record["custom_metadata"]
    assert {name: recorded[name] for name in MODEL_SETTINGS} == model_settings(TINY, TASK)
    for name in MODEL_SETTINGS:
        del recorded[name]
    metadata.write_text(json.dumps(record))
    resumed = train(TINY, TASK, 2, checkpoint_dir=str(folder), **KW)
    assert (resumed.first_step, resumed.checkpoint) == (1, 2)


def _terminated_after(step: int):
    """A `progress` that sends this process SIGTERM as step `step` (counted from 1) ends,
    before the next one or the final save."""
    def progress(steps):
        for k in steps:
            yield k
            if k + 1 == step:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # for the handler to have run, whichever thread got it
    return progress


@pytest.fixture
def sigterm_noted():
    """This test's own SIGTERM handler while it runs (so that a SIGTERM `train` leaves
    alone ends no test process): the signals it got."""
    got = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_stops_a_run_as_ctrl_c_does_and_saves_its_last_step(tmp_path, sigterm_noted):
    """SIGTERM as step 1 of 3 ends: the run stops before step 2 with `Terminated` (a
    `KeyboardInterrupt`), saves step 1, and puts the caller's handler back; the run
    resumes from step 1. A SIGTERM as the last step ends lets that run end with its save."""
    handler = signal.getsignal(signal.SIGTERM)
    folder = tmp_path / "ckpt"
    with pytest.raises(Terminated) as e:
        train(TINY, TASK, 3, checkpoint_dir=str(folder), progress=_terminated_after(1), **KW)
    assert isinstance(e.value, KeyboardInterrupt)
    assert (e.value.signum, e.value.exit_status) == (signal.SIGTERM, 143)
    assert e.value.stopped == Stopped(2, saved=1)
    assert _steps(folder) == ["1"]
    assert signal.getsignal(signal.SIGTERM) is handler and not sigterm_noted
    resumed = train(TINY, TASK, 3, checkpoint_dir=str(folder), progress=_terminated_after(3),
                    **KW)
    assert (resumed.first_step, resumed.checkpoint, len(resumed.losses)) == (1, 3, 2)
    assert _steps(folder) == ["1", "3"]
    assert signal.getsignal(signal.SIGTERM) is handler and not sigterm_noted


def test_outside_the_main_thread_sigterm_keeps_its_handler(sigterm_noted):
    """Only the main thread may set a handler: elsewhere the run leaves SIGTERM alone."""
    handler, seen = signal.getsignal(signal.SIGTERM), []

    def run():
        with loop._stopping_on_sigterm() as stop_if_terminated:
            seen.append(signal.getsignal(signal.SIGTERM))
            stop_if_terminated()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [handler]
    with loop._stopping_on_sigterm() as stop_if_terminated:
        assert signal.getsignal(signal.SIGTERM) is not handler
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(Terminated):
            for _ in range(1000):  # Python runs the handler between two instructions
                stop_if_terminated()
                time.sleep(0.001)
    assert signal.getsignal(signal.SIGTERM) is handler and not sigterm_noted


def _read(fd: int, seconds: float) -> bytes:
    """What `fd` gives within `seconds` (b"" where it has ended)."""
    ready, _, _ = select.select([fd], [], [], seconds)
    if not ready:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:  # the terminal's other end closed
        return b""


def test_gclab_train_saves_its_last_step_on_sigterm_and_resumes(tmp_path, capsys):
    """`gclab train` sent SIGTERM after its first step was reported: killed at once before
    (status -15, nothing saved without --save-every); now it saves the last step it
    completed, says so in one line and exits with a status of its own, and the same
    command resumes from that step. Its standard error is a terminal, so that its
    progress bar reports each step."""
    folder = tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    leader, follower = pty.openpty()
    # A terminal of 120 columns: on one of none the bar draws nothing.
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "gclab", "train", *T, "--train-steps",
                             "1000", "--checkpoint-dir", str(folder)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    err, deadline = b"", time.monotonic() + TIMEOUT
    try:
        while not re.search(rb"\| *[1-9][0-9]*/1000", err):
            assert proc.poll() is None and time.monotonic() < deadline, err.decode()[-3000:]
            err += _read(leader, 1.0)
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None or select.select([leader], [], [], 0)[0]:
            more = _read(leader, 1.0)
            if not more and proc.poll() is not None:
                break
            err += more
            assert time.monotonic() < deadline, err.decode()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(leader)
    text = err.decode(errors="replace")
    # As a process stopped by SIGTERM conventionally exits (128 + 15), not killed by it.
    assert proc.returncode == 143, (proc.returncode, text[-3000:])
    # The line among the progress bar's (it may be drawn once more as the run ends).
    lines = re.findall(r"^gclab train: terminated by SIGTERM at step (\d+); saved step "
                       r"(\d+) to --checkpoint-dir (.+): resume with the same command$",
                       text.replace("\r", "\n"), re.MULTILINE)
    assert len(lines) == 1, text[-3000:]
    stopped, saved_step, where = int(lines[0][0]), int(lines[0][1]), lines[0][2]
    assert saved_step == stopped - 1 >= 1 and where == str(folder)
    # The step is whole: no folder orbax left half written.
    assert _steps(folder) == [str(saved_step)] and latest_step(str(folder)) == saved_step
    capsys.readouterr()
    assert main(["train", *T, "--train-steps", str(saved_step + 1), "--checkpoint-dir",
                 str(folder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["first_step"], report["checkpoint_step"]) == (saved_step, saved_step + 1)
