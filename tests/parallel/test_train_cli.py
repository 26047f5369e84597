"""`gclab train` and `gclab memory` over devices: errors, resume, several processes.

Runs that need several (simulated) devices start fresh processes: JAX's CPU device count
is fixed when it starts. Runs on one device call `gclab.cli.main` in the test's own process
(`here`), which saves a Python and JAX start each. Compiles skip LLVM optimisation
(`XLA_FLAGS`, as in every test process) to stay quick.
The processes write every compile to JAX's persistent cache (tests/conftest.py sets its
directory), not only those over JAX's default second: the tiny model's steps compile in
less, and the runs of one test compile the same steps again.
The tests that compare a run with an uninterrupted one on one device share that run
(`one_device`), and one worker (`xdist_group`), so it is run once.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tqdm

from gclab.cli import main
from gclab.config import PRESSURE_LEVELS_13, ModelConfig, TaskConfig
from gclab.memory import get_recipe
from gclab.parallel.config import parse_parallel_spec
from gclab.sizing import StepSpec
from gclab.sizing.layout_plan import predicted_seconds
from gclab.sizing.speed import CARD_SPEEDS
from gclab.training import loop

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--resolution", "6", "--mesh-splits", "2", "--latent", "16", "--steps", "2"]
TIMEOUT = 900


def here(capsys, *argv: str) -> dict:
    """`gclab ARGV` (with `--json`) on one device, in this process: its JSON report."""
    capsys.readouterr()  # what came before
    assert main(list(argv)) == 0, capsys.readouterr().err[-3000:]
    return json.loads(capsys.readouterr().out)


# The tests that compare a run with `one_device`: one worker, so that it runs once.
ONE_DEVICE_GROUP = pytest.mark.xdist_group("one-device-run")


@pytest.fixture(scope="module")
def one_device() -> dict:
    """`gclab train TINY --train-steps 4 --batch 2 --json` on one device, in this process:
    its JSON report. Its first two losses are those of the same run of two steps."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["train", *TINY, "--train-steps", "4", "--batch", "2", "--json"])
    assert status == 0, err.getvalue()[-3000:]
    report = json.loads(out.getvalue())
    assert (report["processes"], report["devices"]) == (1, 1)
    assert len(report["losses"]) == 4 and np.all(np.isfinite(report["losses"]))
    return report


def _env(extra_env: dict | None = None) -> dict:
    # The test process's XLA_FLAGS (tests/conftest.py) pass on unchanged, so a run here and
    # one in a child compile a step under one key of JAX's persistent cache.
    return dict(os.environ,
                PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                           if p), **(extra_env or {}))


def gclab(*argv: str, extra_env: dict | None = None, wait: bool = True):
    env = _env(extra_env)
    cmd = [sys.executable, "-m", "gclab", *argv]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("argv, message", [
    (["--train-steps", "0"], "--train-steps 0: an integer >= 1"),
    (["--train-steps", "2", "--seed", "-1"], "--seed -1: an integer >= 0"),
    (["--train-steps", "2", "--parallel", "data:x"], "--parallel data:x: comma-separated"),
    (["--train-steps", "2", "--parallel", "pipeline:3"],
     "--parallel pipeline:3: pipeline:3 is invalid for a processor of 2 steps"),
    (["--train-steps", "2", "--devices", "4", "--parallel", "data:2"],
     "--parallel data:2: its axis sizes must multiply to --devices 4, not 2"),
    (["--train-steps", "2", "--devices", "0"], "--devices 0: an integer >= 1"),
    (["--train-steps", "2", "--devices", "2", "--batch", "3"], "--batch 3: a multiple of 2"),
    (["--train-steps", "2", "--coordinator", "nowhere"], "--coordinator nowhere: HOST:PORT"),
    (["--train-steps", "2", "--num-processes", "2", "--process-id", "2"],
     "--process-id 2: an integer in 0..num-processes - 1"),
    (["--train-steps", "2", "--coordinator-timeout", "0"], "--coordinator-timeout 0: an integer"),
])
def test_train_errors_are_one_line_with_exit_status_2(argv, message, capsys):
    assert main(["train", *TINY, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gclab train: error: ") and message in err and "\n" not in err


@ONE_DEVICE_GROUP
def test_resumed_run_has_the_losses_of_an_uninterrupted_one(tmp_path, capsys, one_device):
    ckpt = str(tmp_path / "ckpt")
    first = here(capsys, "train", *TINY, "--train-steps", "2", "--batch", "2", "--checkpoint-dir",
                  ckpt, "--json")
    assert first["checkpoint_step"] == 2
    second = here(capsys, "train", *TINY, "--train-steps", "4", "--batch", "2", "--checkpoint-dir",
                   ckpt, "--json")
    assert second["first_step"] == 2 and second["checkpoint_step"] == 4
    assert first["losses"] + second["losses"] == one_device["losses"]


def test_resuming_with_another_schedule_or_other_examples_is_refused(tmp_path, capsys):
    """The schedule sets every later step's learning rate, and the seed, batch and rollout
    the examples of every later step: a resumed run must keep them. The checkpoint records
    them (orbax's custom metadata of its step); one saved before it did resumes unchecked."""
    ckpt = tmp_path / "ckpt"
    here(capsys, "train", *TINY, "--train-steps", "1", "--checkpoint-dir", str(ckpt), "--json")
    for option, value, stored in (("--schedule-steps", "500", "1000"),
                                  ("--learning-rate", "0.01", "0.001"), ("--seed", "3", "0"),
                                  ("--batch", "2", "1"), ("--rollout", "2", "1")):
        assert main(["train", *TINY, "--train-steps", "2", "--checkpoint-dir", str(ckpt),
                     option, value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"gclab train: error: {option} {value}: the checkpoint in "
                              f"--checkpoint-dir {ckpt} (step 1) was trained with {option} "
                              f"{stored}; resume with that"), err
    assert sorted(os.listdir(ckpt)) == ["1"]
    # A checkpoint of an earlier gclab, which recorded no schedule, resumes with any.
    metadata = ckpt / "1" / "_CHECKPOINT_METADATA"
    record = json.loads(metadata.read_text())
    assert record.pop("custom_metadata") == {
        "schedule_steps": 1000, "learning_rate": 0.001, "real_data": False, "seed": 0,
        "batch": 1, "rollout": 1, "resolution": 6.0, "mesh_splits": 2,
        "radius_query_fraction_edge_length": 0.6, "mesh2grid_edge_normalization_factor": None,
        "pressure_levels": list(PRESSURE_LEVELS_13), "precision": "f32"}
    metadata.write_text(json.dumps(record))
    resumed = here(capsys, "train", *TINY, "--train-steps", "2", "--checkpoint-dir", str(ckpt),
                   "--schedule-steps", "500", "--json")
    assert resumed["first_step"] == 1 and resumed["checkpoint_step"] == 2


def test_a_run_that_diverges_stops_and_saves_nothing(tmp_path, capsys):
    """A learning rate of 1e30 with no warm-up: step 1's update is finite but huge, step 2's
    loss is NaN. The run stops there with one line and exit status 1; the checkpoint of
    step 1 stays as it was, and neither a checkpoint nor --save-checkpoint gets NaN weights."""
    ckpt, weights = tmp_path / "ckpt", tmp_path / "weights.npz"
    lr = ["--learning-rate", "1e30", "--schedule-steps", "4"]
    here(capsys, "train", *TINY, "--train-steps", "1", *lr, "--checkpoint-dir", str(ckpt),
         "--json")
    step1 = {f.relative_to(ckpt): f.read_bytes() for f in ckpt.rglob("*") if f.is_file()}
    assert main(["train", *TINY, "--train-steps", "4", *lr, "--checkpoint-dir", str(ckpt),
                 "--save-checkpoint", str(weights)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("gclab train: error: the loss is nan at step 2 (gradient norm "), err
    assert (f"training diverged and nothing was saved; earlier checkpoints in --checkpoint-dir "
            f"{ckpt} are kept; try a lower --learning-rate (now 1e+30) with another "
            "--checkpoint-dir") in err, err  # a resume must keep the rate it was saved with
    assert not weights.exists()
    assert {f.relative_to(ckpt): f.read_bytes() for f in ckpt.rglob("*") if f.is_file()} == step1


def test_a_run_that_diverges_from_scratch_makes_no_folder(tmp_path, capsys):
    """Nothing was restored, so no earlier checkpoint is kept (the line said so before), and
    --checkpoint-dir is not made before the first save (an empty one was)."""
    folder = tmp_path / "ckpt"
    assert main(["train", *TINY, "--train-steps", "1", "--learning-rate", "3.4e38",
                 "--schedule-steps", "1", "--checkpoint-dir", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "training diverged and nothing was saved; try" in err, err
    assert "earlier checkpoints" not in err, err
    assert not folder.exists()


def _orbax_threads() -> list:
    return [t for t in threading.enumerate() if type(t).__module__.startswith("orbax")]


def test_a_save_that_fails_is_one_line_and_leaves_no_thread_waiting(tmp_path, capsys,
                                                                     monkeypatch):
    """--checkpoint-dir replaced by a file during the run: some 200 lines of orbax's
    tracebacks, a message naming orbax's temporary folder, and orbax's threads waiting 300 s
    for the folder (the process could not exit) before; now one line naming the option, the
    step and why, and nothing left running."""
    folder = tmp_path / "ckpt"
    restore = loop.restore_state

    def restore_then_replace(directory, like):
        state = restore(directory, like)
        shutil.rmtree(folder, ignore_errors=True)
        folder.write_text("a file where the folder was")
        return state

    monkeypatch.setattr(loop, "restore_state", restore_then_replace)
    assert main(["train", *TINY, "--train-steps", "1", "--checkpoint-dir", str(folder)]) == 1
    assert capsys.readouterr().err == (f"gclab train: error: --checkpoint-dir {folder}: could "
                                       "not save step 1 (it is a file, not a folder)\n")
    assert not _orbax_threads()


def test_an_interrupted_run_saves_its_last_step_and_says_so(tmp_path, capsys, monkeypatch):
    """Ctrl-C during step 2 of 3 left --checkpoint-dir empty before. Now step 1 is saved, one
    line says so (exit status 130), and the same command resumes from it as an
    uninterrupted run goes on."""
    straight = here(capsys, "train", *TINY, "--train-steps", "3", "--json")
    argv = ["train", *TINY, "--train-steps", "3", "--checkpoint-dir", str(tmp_path / "ckpt")]

    def ctrl_c_in_step_2(steps, **kwargs):
        for k in steps:
            if k == 1:
                raise KeyboardInterrupt
            yield k

    with monkeypatch.context() as m:
        m.setattr(tqdm, "tqdm", ctrl_c_in_step_2)
        assert main(argv) == 130
    assert capsys.readouterr().err == (f"gclab train: interrupted at step 2; saved step 1 to "
                                       f"--checkpoint-dir {tmp_path / 'ckpt'}: resume with the "
                                       "same command\n")
    resumed = here(capsys, *argv, "--json")
    assert resumed["first_step"] == 1 and resumed["losses"] == straight["losses"][1:]


@pytest.mark.parametrize("command", ["train", "memory"])
def test_a_remat_that_per_stage_remat_would_ignore_is_one_line(command):
    """`--remat` with `stage-remat`: the stages' remat took its place, and the run or the
    figures were those of no --remat while --json reported it. Refused in one line naming
    both, before any step is compiled."""
    steps = [*TINY[:-1], "4"]
    argv = [command, *steps, "--devices", "2", "--parallel", "pipeline:2,stage-remat:1/1",
            "--remat", "every:2", *(["--train-steps", "2"] if command == "train" else [])]
    proc = subprocess.run([sys.executable, "-m", "gclab", *argv], capture_output=True,
                          text=True, timeout=TIMEOUT, env=_env())
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr == (
        f"gclab {command}: error: --remat every:2: only none with --parallel "
        "pipeline:2,stage-remat:1/1 (its stage-remat sets each stage's checkpointed steps in "
        "place of the processor remat)\n") and not proc.stdout


def test_a_recipe_s_own_remat_gives_way_to_per_stage_remat():
    """A recipe with a processor remat of its own (`per-step`) and no --remat: the layout's
    per-stage remat takes its place, as `gclab plan` sizes such a layout with any recipe,
    so the plan's recipe and layout run as given (two devices: a fresh process)."""
    steps = [*TINY[:-1], "4"]
    report = gclab("memory", *steps, "--recipe", "per-step", "--devices", "2", "--parallel",
                   "pipeline:2,stage-remat:1/1", "--json")
    assert report["memory.processor_remat"] == "none" and report["temp_bytes"] > 0
    assert report["parallel"].endswith("stage-remat:1/1")


def test_a_folder_a_run_cannot_use_is_one_line(tmp_path, capsys):
    """A --train-steps the checkpoint already reached took no step and said "saved step 2";
    a number-named folder of the user's was deleted by orbax (it keeps the two newest
    checkpoints and deletes the other number-named entries). Both are refused now."""
    folder = tmp_path / "ckpt"
    here(capsys, "train", *TINY, "--train-steps", "2", "--checkpoint-dir", str(folder), "--json")
    for steps in ("1", "2"):
        assert main(["train", *TINY, "--train-steps", steps, "--checkpoint-dir",
                     str(folder)]) == 2
        assert capsys.readouterr().err == (
            f"gclab train: error: --train-steps {steps}: the checkpoint in --checkpoint-dir "
            f"{folder} is at step 2 already (a resumed run continues up to --train-steps: give "
            "more than 2)\n")
    (folder / "1").mkdir()
    (folder / "1" / "results.csv").write_text("a,b\n")
    assert main(["train", *TINY, "--train-steps", "3", "--checkpoint-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gclab train: error: --checkpoint-dir {folder}: holds 1, which orbax "
                          "did not write: it is named like a checkpoint, and orbax keeps the two "
                          "newest checkpoints there"), err
    assert err.count("\n") == 1, err
    assert sorted(os.listdir(folder)) == ["1", "2"]
    assert (folder / "1" / "results.csv").read_text() == "a,b\n"


def test_processes_that_do_not_all_join_stop_with_one_line():
    """Nothing answers process 1 at its coordinator; process 0 (a coordinator of its own) waits
    for a process 1 that never comes. Each says so in one line, exit status 1, after
    --coordinator-timeout: not JAX's abort (XLA's DEADLINE_EXCEEDED check failure and stack
    trace), which comes only JOIN_GRACE_SECONDS later."""
    alone = ["--train-steps", "1", "--devices", "2", "--batch", "2", "--num-processes", "2",
             "--coordinator-timeout", "2"]
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    procs = [gclab("train", *TINY, *alone, "--coordinator", address, "--process-id", str(i),
                   wait=False) for i, address in zip((1, 0), addresses)]
    outs = finish(procs)
    nobody, missing = [err for _, err in outs]
    assert [p.returncode for p in procs] == [1, 1], (nobody[-3000:], missing[-3000:])
    assert nobody == (f"gclab train: error: --coordinator {addresses[0]}: nothing answered there "
                      "in 2 s: check that process 0 runs with the same address, and that this "
                      "host can reach it (--coordinator-timeout 2)\n")
    assert missing == (f"gclab train: error: --coordinator {addresses[1]}: not all 2 processes "
                       "joined in 2 s: check that each runs with this address, --num-processes 2"
                       " and its own --process-id (--coordinator-timeout 2)\n")


def _truncate_data(step: Path) -> None:
    for f in (step / "default" / "ocdbt.process_0" / "d").iterdir():
        f.write_bytes(f.read_bytes()[:10])


CHECKPOINT_DAMAGE = [
    # (name, damage to the saved step 1 folder, model options, words of the message)
    ("other_model", lambda step: None, [*TINY[:5], "8", *TINY[6:]],
     ["step 1 holds a checkpoint of another model (params.grid2mesh_gnn/",
      "has shape (16,), this model needs (8,))"]),
    ("empty_step", lambda step: (step.parent / "5").mkdir(), TINY,
     ["step 5 is an empty folder"]),
    ("empty_metadata", lambda step: (step / "default" / "_METADATA").write_bytes(b""), TINY,
     ["step 1 is damaged or incomplete (JSONDecodeError: "]),
    ("truncated_data", _truncate_data, TINY, ["step 1 is damaged (ValueError: "]),
]


def test_a_checkpoint_that_cannot_be_resumed_is_one_line(tmp_path, capsys):
    saved = tmp_path / "saved"
    here(capsys, "train", *TINY, "--train-steps", "1", "--checkpoint-dir", str(saved), "--json")
    for name, damage, model, words in CHECKPOINT_DAMAGE:
        folder = tmp_path / name
        shutil.copytree(saved, folder)
        damage(folder / "1")
        assert main(["train", *model, "--train-steps", "2", "--checkpoint-dir",
                     str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gclab train: error: --checkpoint-dir {folder}: "), err
        assert err.count("\n") == 1 and all(w in err for w in words), err
    # asyncio reports the reads orbax abandoned when they are collected, at any time later
    # (at exit, say): after a failed restore those reports stay unsaid, its other errors not.
    asyncio_log = logging.getLogger("asyncio")
    for text, shown in (("Future exception was never retrieved", False),
                        ("Task exception was never retrieved", False), ("Unclosed client", True)):
        assert bool(asyncio_log.filter(logging.makeLogRecord({"msg": text}))) == shown, text
    # End to end: nothing after the line, not even the noise of orbax's abandoned reads.
    proc = subprocess.run([sys.executable, "-m", "gclab", "train", *TINY, "--train-steps", "2",
                           "--checkpoint-dir", str(tmp_path / "truncated_data")],
                          capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert "step 1 is damaged" in proc.stderr


def report(stdout: str) -> dict:
    """The JSON report in a process's output (gloo prints its connection lines there too)."""
    return json.loads(stdout[stdout.index("{\n"):])


def finish(procs: list) -> list:
    """The (stdout, stderr) of processes started with `gclab(..., wait=False)`; any left
    running after `TIMEOUT` is killed."""
    try:
        return [p.communicate(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@ONE_DEVICE_GROUP
def test_two_processes_train_like_one_device(one_device):
    """Two processes of two simulated devices each (one layout over all four) train as one
    device does. That a layout in one process of four devices does is checked for every
    layout in tests/parallel/test_layouts.py."""
    layout = ["--train-steps", "2", "--batch", "2", "--devices", "4", "--parallel",
              "data:2,spatial:2", "--json"]
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [gclab("train", *TINY, *layout, "--coordinator", coordinator,
                   "--num-processes", "2", "--process-id", str(i), wait=False)
             for i in range(2)]
    outs = finish(procs)
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    two = report(outs[0][0])
    assert '"losses"' not in outs[1][0]  # only process 0 reports
    assert (two["processes"], two["devices"]) == (2, 4)
    np.testing.assert_allclose(two["losses"], one_device["losses"][:2], rtol=1e-5)


def test_processes_given_different_options_are_refused():
    """Processes of one run given --seed 0 and --seed 1 trained, each on its own examples,
    and the checkpoint recorded one seed. Each process now gathers every process's digest of
    its options after joining, and every one refuses, naming the first that differs."""
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [gclab("train", *TINY, "--train-steps", "1", "--devices", "2", "--batch", "2",
                   "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(i),
                   "--seed", str(i), wait=False) for i in range(2)]
    outs = finish(procs)
    assert [p.returncode for p in procs] == [2, 2], [err[-3000:] for _, err in outs]
    for i, (_, err) in enumerate(outs):
        assert err.endswith(f"gclab train: error: --seed {i}: process {1 - i} of this run was "
                            "given another --seed; give every process the same options (all "
                            "but --process-id)\n"), err[-3000:]


def test_memory_reports_per_device_figures_and_collectives(capsys):
    one = here(capsys, "memory", *TINY, "--batch", "2", "--json")
    split = gclab("memory", *TINY, "--batch", "2", "--devices", "4", "--parallel",
                  "data:1,spatial:4", "--json")
    assert (one["devices"], one["parallel"]) == (1, "data:1,spatial:1")
    assert (split["devices"], split["parallel"]) == (4, "data:1,spatial:4")
    assert one["collective_bytes"] == 0 < split["collective_bytes"]
    assert split["collectives"]["total"] == split["collective_bytes"]
    assert split["temp_bytes"] < 0.6 * one["temp_bytes"]
    assert split["argument_bytes"] < one["argument_bytes"]


def test_plan_over_devices_picks_the_fastest_layout_and_recipe_that_fits():
    # 21 MiB usable per device (a plan fits within 90% of it): some fit, some do not.
    result = gclab("plan", *TINY, "--budget", "21MiB", "--devices", "2", "--batch", "2",
                   "--recipes", "none,lean", "--json")
    rows = [r for r in result["candidates"] if "pipeline" not in r["parallel"]]
    piped = [r for r in result["candidates"] if "pipeline" in r["parallel"]]
    # 2 processor steps: too few for the stage planner, said so.
    assert piped and all("needs 5 processor steps" in r["skipped"] for r in piped)
    assert {(r["parallel"], r["recipe"]) for r in rows} == {
        (p, r) for p in ("data:2,spatial:1", "data:1,spatial:2") for r in ("none", "lean")}
    fitting = [r for r in rows if r["fits"]]
    limit = result["fit_margin"] * result["usable_bytes"]
    assert result["usable_bytes"] == 21 * 2**20 and result["fit_margin"] == 0.9
    assert fitting and len(fitting) < len(rows)
    assert all(r["per_device_bytes"] <= limit for r in fitting)
    assert all(r["per_device_bytes"] > limit for r in rows if not r["fits"])
    best = min(fitting, key=lambda r: r["predicted_seconds"])
    assert (result["parallel"], result["recipe"]) == (best["parallel"], best["recipe"])
    assert result["per_device_bytes"] == best["per_device_bytes"]
    assert result["speeds_of"] == "H100"


@ONE_DEVICE_GROUP
def test_pipeline_trains_like_one_device(one_device):
    """`gclab train` over a pipeline. (What its stages send, collective permutes in both
    passes, is checked on the compiled pipeline steps of tests/parallel/test_pipeline.py;
    `gclab memory` over a layout in test_memory_reports_per_device_figures_and_collectives.)"""
    pipeline = ["--parallel", "pipeline:2,microbatches:2"]
    piped = gclab("train", *TINY, "--train-steps", "2", "--batch", "2", *pipeline, "--json")
    assert (piped["devices"], piped["parallel"]) == (2, "data:1,spatial:1,pipeline:2,"
                                                        "microbatches:2")
    np.testing.assert_allclose(piped["losses"], one_device["losses"][:2], rtol=1e-5)


def test_plan_over_devices_weighs_pipeline_stages_chosen_by_milp():
    """In bfloat16: its stages cast the float32 parameters themselves (the stage programs
    the planner sizes and the whole step it compiles). Float32 stages are planned in
    tests/parallel/test_pipeline.py."""
    five_steps = [*TINY[:-1], "5"]
    result = gclab("plan", *five_steps, "--budget", "1GiB", "--devices", "2", "--batch", "2",
                   "--recipes", "none", "--precision", "bf16", "--json")
    (piped,) = [r for r in result["candidates"] if "pipeline" in r["parallel"]]
    stages, one = piped["stages"], piped["uniform"]
    assert sum(stages["stage_steps"]) == sum(one["stage_steps"]) == 5
    assert stages["fits"] and max(stages["memory_bytes"]) <= piped["stage_budget"]
    assert stages["step_seconds"] <= one["step_seconds"] * (1 + 1e-9)
    assert stages["bubble"] == one["bubble"] == 1 / 3  # P = 2, M = 2
    steps = "/".join(map(str, stages["stage_steps"]))
    assert f"pipeline:2,microbatches:2,stage-steps:{steps}" in piped["parallel"]
    assert piped["per_device_bytes"] > 0 and piped["collective_bytes"] > 0
    # Ranked by the formula of every other row: the same work perfectly balanced over the
    # two devices (no bubble, no stage checkpoint) is a lower bound of the pipeline's time.
    model = ModelConfig(resolution=6, mesh_splits=2, latent_size=16, processor_steps=5)
    spec = StepSpec(model, TaskConfig(), get_recipe("none", "bf16"), batch=2,
                    parallel=parse_parallel_spec(piped["parallel"]))
    balanced = predicted_seconds(spec, piped["collective_bytes"], CARD_SPEEDS["H100"])
    assert balanced <= piped["predicted_seconds"] <= 4 * balanced, (balanced, piped)
