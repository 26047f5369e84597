"""Every command of `python -m gclab` runs, on the smallest geometry, and says what it did."""

from __future__ import annotations

import json
import re
import subprocess
import sys

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
    assert cli.main(["memory", *TINY_NET, "--recipe", "lean", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
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


@pytest.mark.parametrize("argv, words", [
    (["graph", "--preset", "cpu-4x32", *TINY], "not both"),
    (["graph", "--resolution", "6"], "--mesh-splits"),
    (["sweep", *TINY, "--latents", "8,x", "--out", "x.json"], "--latents 8,x"),
    (["memory", *TINY_NET, "--batch", "0"], "--batch"),
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
