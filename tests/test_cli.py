"""Every command of `python -m gclab` runs, on the smallest geometry, and says what it did."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jax
import pytest

from gclab import cli
from gclab.devices import FIT_MARGIN, card_usable_bytes
from gclab.measure.compiled import format_bytes

# 6 deg / 2 splits, 2 steps x 16: each compile takes a few seconds.
TINY = ["--resolution", "6", "--mesh-splits", "2"]
TINY_NET = TINY + ["--latent", "16", "--steps", "2"]


def test_graph_prints_counts_as_json(capsys):
    assert cli.main(["graph", *TINY, "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["grid_nodes"] == 31 * 60
    assert counts["mesh2grid_edges"] == 3 * counts["grid_nodes"]
    assert counts["mesh_nodes"] == 162  # 10 * 4**2 + 2 vertices after 2 splits


def test_memory_reports_compiled_bytes(capsys):
    # This process runs XLA:CPU's default order, which --cpu-scheduler may name again.
    assert cli.main(["memory", *TINY_NET, "--recipe", "lean", "--json",
                     "--cpu-scheduler", "breadth-first"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["cpu_scheduler"] == "breadth-first"
    assert record["temp_bytes"] > 0
    assert record["total_bytes"] == (record["argument_bytes"] + record["output_bytes"]
                                     + record["temp_bytes"] - record["alias_bytes"])
    assert record["memory.processor_remat"] == "nested" and record["model.latent_size"] == 16
    assert record["num_params"] > 0


def test_timeline_writes_a_picture_and_lists_the_buffers_at_the_peak(tmp_path, capsys):
    """One run (a timeline compile cannot come from JAX's cache: it reads XLA's dump)."""
    out = tmp_path / "timeline.png"
    assert cli.main(["timeline", *TINY_NET, "--recipe", "none,per-step", "--peak", "3",
                     "--plot", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("peak" in line for line in lines) == 2 and out.stat().st_size > 10_000
    headers = [i for i, line in enumerate(lines)
               if line.split()[:3] == ["instruction", "shape", "bytes"]]
    assert len(headers) == 2  # one table per recipe
    for header in headers:
        rows = lines[header + 1:header + 5]
        # the three largest buffers and one row for the rest, each with its HLO type
        assert rows[-1].split()[0] == "(others)"
        assert all(re.search(r"\b(f32|bf16|u16|s32|pred)\[", row) for row in rows[:3])


def test_sweep_writes_rows_and_a_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GCLAB_SWEEP_CACHE", str(tmp_path / "cache"))
    out, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    assert cli.main(["sweep", *TINY, "--latents", "8,16", "--steps-list", "2",
                     "--recipes", "none,per-step", "--out", str(out), "--plot", str(plot)]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 4 and {r["technique"] for r in rows} == {"none", "per-step"}
    assert plot.stat().st_size > 10_000


def test_plan_explains_its_choice(capsys):
    assert cli.main(["plan", "--budget", "8GiB", *TINY, "--compiled", "no"]) == 0
    assert "Chosen:" in capsys.readouterr().out


def test_plan_usable_memory_is_the_budget_in_words_and_in_json(capsys):
    """Usable memory is the budget (`gclab.devices`: for a T4, JAX's pool on it) in the text
    and in the JSON; what a plan may take, `FIT_MARGIN` of it, is `plan_limit_bytes`."""
    usable = card_usable_bytes("T4")
    limit = int(FIT_MARGIN * usable)
    argv = ["plan", "--budget", "T4", *TINY_NET, "--compiled", "no"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert cli.main([*argv, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["usable_bytes"] == record["budget_bytes"] == usable
    assert record["plan_limit_bytes"] == limit and record["predicted_peak_bytes"] <= limit
    assert text.startswith(f"Usable memory {format_bytes(usable)} (a plan may take "
                           f"{format_bytes(limit)}) for 6 deg"), text


def test_plan_that_nothing_fits_names_what_a_plan_may_take_of_usable_memory(capsys):
    assert cli.main(["plan", "--budget", "16MiB", *TINY_NET, "--compiled", "no"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gclab plan: nothing fits: "), err
    assert "but a plan may take 14.40 MiB (0.9 x usable 16.00 MiB)" in err, err


def test_plan_json_that_nothing_fits_is_still_a_report(capsys):
    """With --json a script reads stdout: where nothing fits it gets a report saying so,
    with what was sized, not an empty output (the line on stderr and status 1 stay)."""
    argv = ["plan", "--budget", "16MiB", *TINY_NET, "--compiled", "no", "--json"]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["fits"] is False and report["error"].startswith("nothing fits: ")
    assert report["candidates"] and captured.err.startswith("gclab plan: nothing fits: ")


@pytest.mark.parametrize("argv, words", [
    (["graph", "--preset", "cpu-4x32", *TINY], "not both"),
    (["graph", "--resolution", "6"], "--mesh-splits"),
    (["memory", *TINY_NET, "--cpu-scheduler", "fast"],
     "--cpu-scheduler fast: one of breadth-first, depth-first"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gclab {argv[0]}: error:") and words in err
    assert "\n" not in err and "Traceback" not in err


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "gclab", "graph", *TINY], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "grid2mesh" in proc.stdout


def test_another_order_than_a_started_process_runs_is_one_line(capsys):
    jax.devices()  # JAX starts here, and XLA reads the order once, now: breadth-first
    assert cli.main(["memory", *TINY_NET, "--cpu-scheduler", "depth-first"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gclab memory: error: --cpu-scheduler depth-first: JAX has already "
                          "started with the breadth-first scheduler") and "\n" not in err


def test_a_fresh_process_compiles_in_the_order_cpu_scheduler_names():
    proc = subprocess.run([sys.executable, "-m", "gclab", "memory", *TINY_NET, "--json",
                           "--cpu-scheduler", "depth-first"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["cpu_scheduler"] == "depth-first"


def test_weights_an_update_makes_infinite_are_not_saved(tmp_path, capsys):
    """The largest learning rate float32 holds, with no warm-up: step 1's loss is finite and
    its update overflows. The run stops with one line and exit status 1, saving nothing."""
    ckpt, weights = tmp_path / "ckpt", tmp_path / "w.npz"
    assert cli.main(["train", *TINY_NET, "--train-steps", "1", "--schedule-steps", "1",
                     "--learning-rate", "3.4e38", "--checkpoint-dir", str(ckpt),
                     "--save-checkpoint", str(weights)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("gclab train: error: the weights are not finite after step 1 "
                          "(loss "), err
    assert "training diverged and nothing was saved" in err, err
    assert not weights.exists() and not (ckpt.exists() and any(ckpt.iterdir()))


def test_a_step_the_device_cannot_hold_is_one_line(monkeypatch, capsys):
    """`gclab train` far too large for the machine ran out of device memory with a
    traceback of XLA's RESOURCE_EXHAUSTED: now one line naming the commands that size a
    step, exit 1; another XLA failure still comes as it came."""
    import jax

    def out_of_memory(*args, **kwargs):
        raise jax.errors.JaxRuntimeError(
            "RESOURCE_EXHAUSTED: Out of memory allocating 40000000000 bytes.\nmore")

    monkeypatch.setattr(cli, "train", out_of_memory)
    argv = ["train", "--resolution", "30", "--mesh-splits", "1", "--latent", "8", "--steps",
            "1", "--train-steps", "1"]
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == (
        "gclab train: error: out of device memory (RESOURCE_EXHAUSTED: Out of memory "
        "allocating 40000000000 bytes.); `gclab memory` gives what this step needs, `gclab "
        "plan` a recipe or layout that fits\n")

    def broken(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("INTERNAL: something else")

    monkeypatch.setattr(cli, "train", broken)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        cli.main(argv)


def test_graph_save_refuses_a_name_that_is_no_npz(tmp_path, capsys):
    """`--save g` replaced a file `g` (a script, say) with a zip archive."""
    kept = tmp_path / "g"
    kept.write_text("print('mine')\n")
    assert cli.main(["graph", "--preset", "cpu-4x32", "--save", str(kept)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--save" in err and ".npz" in err, err
    assert kept.read_text() == "print('mine')\n"


def test_a_dataset_too_short_for_any_step_is_blamed_on_data(tmp_path, capsys):
    """One time step: `train` blamed `--rollout 1`; the file is what is short (`forecast`'s
    case is in tests/weather/test_weather_cli.py)."""
    from gclab.config import TaskConfig
    from gclab.training.data import SyntheticWeather
    from gclab.weather import compute_stats, synthetic_dataset, write_dataset, write_stats

    weather = SyntheticWeather(TaskConfig.from_levels(13), 30.0, seed=0)
    one = tmp_path / "one.nc"
    write_dataset(synthetic_dataset(weather, frames=3).isel(time=slice(0, 1)), one)
    stats = tmp_path / "stats"
    stats.mkdir()
    write_stats(compute_stats(synthetic_dataset(weather, frames=8, start=10)), stats)
    model = ["--resolution", "30", "--mesh-splits", "1", "--latent", "8", "--steps", "1"]
    assert cli.main(["train", *model, "--train-steps", "1", "--data", str(one),
                     "--stats", str(stats)]) == 2
    assert capsys.readouterr().err == (
        f"gclab train: error: --data {one}: 1 time step; training needs at least 3 (2 input "
        "frames and a target)\n")


def test_with_json_only_the_json_reaches_stdout():
    """A multi-process `train --json` printed Gloo's '[Gloo] Rank 0 is connected to 1 peer
    ranks' on stdout before its JSON: what native code writes to file descriptor 1 now goes
    to stderr, and Python's output still to stdout."""
    code = ("import os, sys, json\n"
            "from gclab.cli import _stdout_for_json_only\n"
            "with _stdout_for_json_only(True):\n"
            "    os.write(1, b'[Gloo] Rank 0 is connected to 1 peer ranks\\n')\n"
            "    print(json.dumps({'ok': 1}))\n"
            "print('after')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == '{"ok": 1}\nafter\n'
    assert r.stderr == "[Gloo] Rank 0 is connected to 1 peer ranks\n"


def test_starting_the_command_line_imports_no_plotting_or_checkpoint_library():
    """matplotlib (with `gclab.plots`) and orbax are imported by the commands that draw or
    read and write checkpoints, when they do: every other command, `--help` and each
    one-line refusal of a bad option started about 0.6 s later with them."""
    code = ("import sys, gclab.cli\n"
            "print(sorted(m for m in ('matplotlib', 'gclab.plots', 'orbax') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[]\n"


def test_a_picture_name_is_checked_against_matplotlibs_file_types(tmp_path, capsys):
    assert ".png" in cli.plot_suffixes() and ".pgf" not in cli.plot_suffixes()
    assert cli.main(["timeline", "--preset", "cpu-4x32", "--plot", str(tmp_path / "t.pgf")]) == 2
    err = capsys.readouterr().err
    assert "--plot" in err and ".png" in err and err.count("\n") == 1, err


class _Exited(Exception):
    """What `os._exit` raises in the tests below, with the status and whether an exception
    was being handled then."""


def _exit_recorded(monkeypatch) -> None:
    def exit_now(status):
        raise _Exited(status, sys.exc_info()[0])

    monkeypatch.setattr(cli.os, "_exit", exit_now)


def test_ctrl_c_ends_the_program_at_once_with_130(monkeypatch, capsys):
    """Ctrl-C during a compile printed "interrupted", and then the interpreter's shutdown
    often crashed (status -11) on what XLA's compile threads still used. The program now
    ends with os._exit(130) inside the handler, while the interrupted frames are alive; a
    caller of `main` in a process that goes on still gets 130 back."""
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_memory", interrupted)
    _exit_recorded(monkeypatch)
    argv = ["memory", *TINY_NET]
    monkeypatch.setattr(sys, "argv", ["gclab", *argv])
    with pytest.raises(_Exited) as e:
        cli.main()
    assert e.value.args == (130, KeyboardInterrupt)
    assert capsys.readouterr().err == "gclab memory: interrupted\n"
    assert cli.main(argv) == 130


def test_a_training_run_sigterm_stopped_exits_143(monkeypatch, tmp_path, capsys):
    """SIGTERM stops `gclab train` between steps as Ctrl-C does (`Terminated`, a
    KeyboardInterrupt): it was reported as "interrupted", with status 130."""
    from gclab.training.loop import Stopped, Terminated

    def terminated(*args, **kwargs):
        e = Terminated()
        e.stopped = Stopped(3, saved=2)
        raise e

    monkeypatch.setattr(cli, "train", terminated)
    _exit_recorded(monkeypatch)
    argv = ["train", *TINY_NET, "--train-steps", "5", "--checkpoint-dir", str(tmp_path / "c")]
    monkeypatch.setattr(sys, "argv", ["gclab", *argv])
    with pytest.raises(_Exited) as e:
        cli.main()
    assert e.value.args == (143, cli._Interrupted)
    assert capsys.readouterr().err == (
        f"gclab train: terminated by SIGTERM at step 3; saved step 2 to --checkpoint-dir "
        f"{tmp_path / 'c'}: resume with the same command\n")
    assert cli.main(argv) == 143
