"""Bad and unusual inputs, as a hostile new user would type them: one clear line each.

Every case of the command line ends with exit status 2 (or 1 where the work itself failed)
and exactly one line on stderr, `gclab COMMAND: error: ...`, naming the option and the value
as typed, with no traceback; nearly all are refused before any graph is built or any step
compiled. The public Python API raises a `ValueError` naming the argument. Damaged files
(fixtures, sidecars, caches) are named with what is wrong with them; a damaged cache is
rebuilt and says so. Every file gclab writes appears whole or not at all.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import jax
import numpy as np
import pytest

from gclab import cli, files, limits
from gclab.config import ConfigError, ModelConfig, TaskConfig, get_preset
from gclab.files import CacheWarning, OutputPathError, atomic_path, check_output_path
from gclab.geometry import graphs as graphs_lib
from gclab.geometry.grid_mesh import grid_latitudes, grid_longitudes
from gclab.measure.compiled import CompiledMemory
from gclab.memory.blocks import balanced_block, split_blocks
from gclab.memory.config import RECIPES, MemoryConfig, get_recipe
from gclab.memory.precision import compute_dtype
from gclab.memory.remat import remat_policy
from gclab.model.graphcast import graph_inputs, make_network
from gclab.model.reference import FixtureError, load_fixture, run_checks
from gclab.notebook import guarded_grid
from gclab.parallel.pipeline import bubble_fraction
from gclab.parallel.processes import MAX_CPU_DEVICES, initialize_processes, use_cpu_devices
from gclab.sizing import analytical, planner
from gclab.sizing.speed import data_sheet, speed_for
from gclab.sizing.step import StepSpec, compile_train_step, train_step_abstract
from gclab.training.data import SyntheticWeather

BLOCK_ROWS = np.zeros((10, 2), np.float32)
# The module, not the `sweep` function that `gclab.sizing` exports under the same name.
sweep_lib = importlib.import_module("gclab.sizing.sweep")
step_lib = importlib.import_module("gclab.sizing.step")
DATA = Path(__file__).resolve().parent / "data"
TINY_FIXTURE = DATA / "official_tiny.npz"
TINY = ["--resolution", "6", "--mesh-splits", "2"]
TINY_NET = TINY + ["--latent", "16", "--steps", "2"]
TASK = TaskConfig.from_levels(13)
# A grid no test machine can hold: 1.8e9 grid nodes (about 0.8 TB to build).
HUGE_GRID = "0.006"


@pytest.fixture(autouse=True)
def _graph_cache(tmp_path_factory, monkeypatch):
    """Graph and sweep caches in a folder of this test session."""
    monkeypatch.setenv("GCLAB_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "graphs"))
    monkeypatch.delenv("GCLAB_SWEEP_CACHE", raising=False)


@pytest.fixture
def no_work(monkeypatch):
    """Fails a test if a command gets as far as building graphs or compiling."""

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the input was checked")

    for name in ("load_or_build_graphs", "compile_train_step", "train_step_timeline", "sweep",
                 "plan", "run_checks", "train"):
        monkeypatch.setattr(cli, name, refuse)


def one_line_error(capsys, command: str) -> str:
    """The single stderr line of a failed command (asserts its form)."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"gclab {command}: error: "), err
    assert "Traceback" not in err, err
    return err


# ------------------------------------------------------------------- 1. senseless numbers

SENSELESS = [
    # (argv, words the message must hold)
    (["graph", "--resolution", "inf", "--mesh-splits", "2"], ["--resolution inf", "at most 180"]),
    (["graph", "--resolution", "1e300", "--mesh-splits", "2"], ["--resolution 1e300"]),
    (["graph", "--resolution", "360", "--mesh-splits", "2"], ["--resolution 360", "at most 180"]),
    (["graph", "--resolution", "0", "--mesh-splits", "2"], ["--resolution 0", "positive"]),
    (["graph", "--resolution", "-4", "--mesh-splits", "2"], ["--resolution -4", "positive"]),
    (["graph", "--resolution", "nan", "--mesh-splits", "2"], ["--resolution nan"]),
    (["graph", "--resolution", "7", "--mesh-splits", "2"], ["--resolution 7", "180 / resolution"]),
    (["graph", "--resolution", "1e-300", "--mesh-splits", "2"],
     ["--resolution 1e-300", "int32", "10^604"]),
    (["graph", "--resolution", "four", "--mesh-splits", "2"], ["--resolution four", "number"]),
    (["graph", "--resolution", "6", "--mesh-splits", "-1"], ["--mesh-splits -1", "0..7"]),
    (["graph", "--resolution", "6", "--mesh-splits", "8"], ["--mesh-splits 8", "0..7"]),
    (["graph", "--resolution", "6", "--mesh-splits", "2.5"], ["--mesh-splits 2.5", "integer"]),
    (["graph", *TINY, "--radius-fraction", "0"], ["--radius-fraction 0", "> 0"]),
    (["graph", *TINY, "--radius-fraction", "inf"], ["--radius-fraction inf", "1000"]),
    (["graph", *TINY, "--radius-fraction", "1e308"], ["--radius-fraction 1e308", "1000"]),
    (["graph", *TINY, "--radius-fraction", "nan"], ["--radius-fraction nan"]),
    (["memory", *TINY, "--latent", "0"], ["--latent 0", ">= 1"]),
    (["memory", *TINY, "--latent", "2147483648"], ["--latent 2147483648", "2147483647"]),
    (["memory", *TINY, "--steps", "-3"], ["--steps -3", ">= 1"]),
    (["memory", *TINY_NET, "--batch", "0"], ["--batch 0", ">= 1"]),
    (["memory", *TINY_NET, "--batch", "-2"], ["--batch -2", ">= 1"]),
    (["memory", *TINY_NET, "--batch", "1e3"], ["--batch 1e3", "integer"]),
    (["memory", *TINY_NET, "--rollout", "0"], ["--rollout 0", ">= 1"]),
    (["memory", *TINY_NET, "--rollout", "99999999999"], ["--rollout 99999999999", "<="]),
    (["memory", *TINY_NET, "--edge-block", "-5"], ["--edge-block -5", "0 turns blocks off"]),
    (["memory", *TINY_NET, "--edge-block", "many"], ["--edge-block many", "integer"]),
    (["memory", *TINY_NET, "--levels", "12"], ["--levels 12", "13, 37"]),
    (["memory", *TINY_NET, "--precision", "fp16"], ["--precision fp16", "f32, bf16"]),
    (["memory", *TINY_NET, "--recipe", "leanest"], ["--recipe leanest", "lean"]),
    (["memory", *TINY_NET, "--recipe", "none,lean"], ["--recipe none,lean"]),
    (["memory", *TINY_NET, "--remat", "every:0"], ["--remat every:0", "every:K"]),
    (["memory", *TINY_NET, "--remat", "ratio:2"], ["--remat ratio:2", "R in [0, 1]"]),
    (["memory", *TINY_NET, "--remat", "ratio:nan"], ["--remat ratio:nan"]),
    (["memory", *TINY_NET, "--remat", "step,policy=all"], ["--remat step,policy=all"]),
    (["memory", "--preset", "graphcast-huge"], ["--preset graphcast-huge", "graphcast-small"]),
    (["memory", "--preset", "cpu-4x32", *TINY], ["not both"]),
    (["memory", "--resolution", "6"], ["--mesh-splits"]),
    (["memory", *TINY_NET, "--parallel", "pipeline:3"],
     ["--parallel pipeline:3", "at most 2 stages"]),
    (["train", *TINY_NET, "--train-steps", "1", "--parallel", "pipeline:2,microbatches:2"],
     ["--batch 1", "a multiple of 2", "pipeline's microbatches:2"]),
    (["memory", *TINY_NET, "--parallel", "pipeline:2,stage-steps:1/2"],
     ["--parallel pipeline:2,stage-steps:1/2", "add up to the processor's 2"]),
    (["memory", *TINY_NET, "--parallel", "pipeline:2,stage-steps:2"],
     ["--parallel pipeline:2,stage-steps:2: stage-steps:2 is invalid: 2 numbers separated by "
      "'/', one per stage of pipeline:2"]),
    (["memory", *TINY_NET, "--parallel", "pipeline:2,stage-remat:2/0"],
     ["--parallel pipeline:2,stage-remat:2/0", "stage 0 has 1 steps, fewer than 2"]),
    (["memory", *TINY_NET, "--parallel", "microbatches:2"],
     ["--parallel microbatches:2: microbatches:2 is invalid without a pipeline",
      "pipeline:P with P >= 2"]),
    (["memory", *TINY_NET, "--parallel", "data:0"], ["--parallel data:0: data:0 is invalid"]),
    (["memory", *TINY_NET, "--parallel", "pipeline:99999999999"],
     ["--parallel pipeline:99999999999: pipeline:99999999999 is invalid: an integer >= 1"]),
    (["train", *TINY_NET, "--train-steps", "1", "--parallel", "pipeline:99999999999"],
     ["--parallel pipeline:99999999999: pipeline:99999999999 is invalid: an integer >= 1"]),
    (["memory", *TINY_NET, "--parallel", "pipeline:99999999999,microbatches:2"],
     ["--parallel pipeline:99999999999,microbatches:2: pipeline:99999999999 is invalid: an "
      "integer >= 1"]),
    (["memory", *TINY_NET, "--parallel", "stage-steps:2/2"],
     ["--parallel stage-steps:2/2: stage-steps:2/2 is invalid without a pipeline",
      "pipeline:P with P >= 2"]),
    (["memory", *TINY_NET, "--parallel", "data:2,data:2"],
     ["--parallel data:2,data:2: data is given twice (data:2 and data:2): each axis or item "
      "at most once"]),
    (["memory", *TINY_NET, "--parallel", "spatial:2,mesh-nodes:whole"],
     ["mesh-nodes:whole is invalid: one of split, replicated"]),
    (["memory", *TINY_NET, "--parallel", "pipeline:2,stage-steps:1/1,stage-remat:2/0"],
     ["stage-remat:2/0 is invalid: at most each stage's steps (stage 0 has 1, not 2)"]),
    # More simulated devices in one process than JAX's CPU backend runs: refused before JAX
    # is asked for them (it would take them, then fail at the first compile).
    (["memory", *TINY_NET, "--parallel", "spatial:3000"],
     ["--parallel spatial:3000: at most 2048 devices in one process", "not 3000"]),
    (["train", *TINY_NET, "--train-steps", "1", "--devices", "2049", "--batch", "2049"],
     ["--devices 2049: at most 2048 devices in one process"]),
    (["plan", *TINY_NET, "--budget", "1GiB", "--devices", "2053"],
     ["--devices 2053: at most 2048"]),
    # A remat group larger than the processor: the network would quietly take one group.
    (["memory", *TINY_NET, "--remat", "every:100"],
     ["--remat every:100: K in 1..2 for this model (2 processor steps)"]),
    (["timeline", *TINY_NET, "--remat", "nested:3,policy=dots"], ["--remat nested:3,policy=dots"]),
    (["train", *TINY_NET, "--train-steps", "1", "--remat", "nested:3"],
     ["--remat nested:3: K in 1..2"]),
    # Options `plan` would ignore.
    (["plan", *TINY, "--budget", "8GiB", "--recipes", "lean"],
     ["--recipes lean: only with --devices N, N >= 2"]),
    (["plan", *TINY, "--budget", "8GiB", "--devices", "1", "--recipes", "lean,none"],
     ["--recipes lean,none: only with --devices N"]),
    (["plan", *TINY, "--budget", "8GiB", "--devices", "2", "--compiled", "no"],
     ["--compiled no: only without --devices"]),
    (["plan", *TINY_NET, "--budget", "1GiB", "--devices", "0"], ["--devices 0"]),
    (["timeline", *TINY_NET, "--recipe", "none,,lean"], ["--recipe none,,lean"]),
    (["timeline", *TINY_NET, "--peak", "0"], ["--peak 0", ">= 1"]),
    (["sweep", *TINY, "--latents", "8,x", "--out", "x.json"], ["--latents 8,x"]),
    (["sweep", *TINY, "--latents", "", "--out", "x.json"], ["--latents ''"]),
    (["sweep", *TINY, "--latents", "8,-8", "--out", "x.json"], ["--latents 8,-8", ">= 1"]),
    (["sweep", *TINY, "--steps-list", "0", "--out", "x.json"], ["--steps-list 0"]),
    (["sweep", *TINY, "--recipes", ",", "--out", "x.json"], ["--recipes ,", "per-step"]),
    (["sweep", *TINY, "--measure", "guessed", "--out", "x.json"], ["--measure guessed"]),
    (["sweep", *TINY, "--batch", "0", "--out", "x.json"], ["--batch 0"]),
    (["sweep", *TINY], ["--out"]),
    (["plan", *TINY, "--budget", "0"], ["--budget 0", "from 1 MiB to 1 PiB"]),
    (["plan", *TINY, "--budget", "0.5"], ["--budget 0.5", "from 1 MiB"]),
    (["plan", *TINY, "--budget", "1.5B"], ["--budget 1.5B", "from 1 MiB"]),
    (["plan", *TINY, "--budget", "1.5"], ["--budget 1.5", "from 1 MiB"]),
    (["plan", *TINY, "--budget", "1e400"], ["--budget 1e400"]),
    (["plan", *TINY, "--budget", "99999999999999999999999TB"], ["--budget 9999"]),
    (["plan", *TINY, "--budget", "nan"], ["--budget nan"]),
    (["plan", *TINY, "--budget", "=-1GB"], ["--budget =-1GB"]),
    (["plan", *TINY, "--budget=-1GB"], ["--budget -1GB"]),
    (["plan", *TINY, "--budget", "-1GB"], ["--budget", "--budget=VALUE"]),
    (["plan", *TINY, "--budget", "T5"], ["--budget T5", "A100-80GB"]),
    (["plan", *TINY, "--budget", "8GiB", "--batch", "-2"], ["--batch -2"]),
    (["plan", *TINY, "--budget", "8GiB", "--rollout", "-2"], ["--rollout -2"]),
    (["plan", *TINY, "--budget", "8GiB", "--compiled", "maybe"], ["--compiled maybe"]),
    (["reference", str(TINY_FIXTURE), "--tolerance", "0"], ["--tolerance 0", "> 0"]),
    (["reference", str(TINY_FIXTURE), "--tolerance", "inf"], ["--tolerance inf", "finite"]),
    (["reference", str(TINY_FIXTURE), "--tolerance", "nan"], ["--tolerance nan"]),
    (["reference", str(TINY_FIXTURE), "--tolerance=-1e-5"], ["--tolerance -1e-5"]),
    (["reference", str(TINY_FIXTURE), "--tolerance", "-1"], ["--tolerance -1", "> 0"]),
    (["reference", str(TINY_FIXTURE), "--tolerance", "-1e-5"], ["--tolerance=VALUE"]),
]


@pytest.mark.parametrize("argv,words", SENSELESS, ids=lambda a: " ".join(map(str, a))[:60])
def test_senseless_numbers_are_refused_before_any_work(argv, words, capsys, no_work):
    assert_refused(argv, words, capsys)


def assert_refused(argv: list, words: list, capsys) -> None:
    """`gclab argv` exits with status 2 and one error line holding each of `words`."""
    assert cli.main(argv) == 2
    err = one_line_error(capsys, argv[0])
    for word in words:
        assert word in err, err


def test_a_backend_that_cannot_start_is_one_line(capsys, monkeypatch, no_work):
    def broken():
        raise AssertionError  # what JAX raises for JAX_PLATFORMS=cuda without CUDA

    monkeypatch.setattr(cli.jax, "default_backend", broken)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert cli.main(["memory", *TINY_NET]) == 2
    assert "JAX could not start a backend for JAX_PLATFORMS=cuda" in one_line_error(
        capsys, "memory")


def test_an_unknown_command_or_option_is_one_line(capsys):
    assert cli.main(["bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'bogus'" in err
    assert cli.main(["graph", *TINY, "--latent", "8"]) == 2
    assert "unrecognized arguments: --latent 8" in one_line_error(capsys, "graph")


def test_no_number_becomes_infinity_in_json(capsys):
    assert cli.main(["plan", *TINY, "--budget", "8GiB", "--compiled", "no", "--json"]) == 0
    text = capsys.readouterr().out
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text)["predicted_peak_bytes"] > 0


# ------------------------------------------------------------ 2. sizes that cannot be held


def test_a_grid_beyond_memory_is_refused_with_the_figure_and_the_limit(capsys, monkeypatch):
    monkeypatch.setattr(graphs_lib, "host_memory_bytes", lambda: 2**28)
    assert cli.main(["graph", "--resolution", "0.25", "--mesh-splits", "6"]) == 2
    err = one_line_error(capsys, "graph")
    assert "0.25 deg grid (1,038,240 nodes)" in err and "needs about" in err
    assert "more than this machine's memory (256.00 MiB)" in err


def test_a_radius_that_connects_everything_is_refused_by_size(capsys, monkeypatch):
    monkeypatch.setattr(graphs_lib, "host_memory_bytes", lambda: 2**30)
    assert cli.main(["graph", "--resolution", "1", "--mesh-splits", "5",
                     "--radius-fraction", "500"]) == 2
    assert "radius fraction 500" in one_line_error(capsys, "graph")


def test_an_absurd_latent_width_is_refused_before_compiling(capsys, monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled")

    monkeypatch.setattr("gclab.sizing.step.compile_timed", no_compile)
    assert cli.main(["memory", *TINY, "--latent", "1000000000", "--steps", "1"]) == 2
    err = one_line_error(capsys, "memory")
    assert "1 x 1000000000" in err and "EiB" in err and "64-bit" in err


def test_a_live_step_beyond_device_memory_is_refused_before_allocating(monkeypatch):
    def no_allocation(*args, **kwargs):
        raise AssertionError("allocated")

    fake = CompiledMemory(10, 10, 10**6, 0, 0, 10**6 + 20, "cpu", 0.0)
    monkeypatch.setattr(step_lib, "compile_timed", lambda *a, **k: (None, 0.0))
    monkeypatch.setattr(step_lib, "memory_of_compiled", lambda *a: fake)
    monkeypatch.setattr(step_lib, "_random_args", no_allocation)
    monkeypatch.setattr(step_lib, "device_memory_bytes", lambda: 1000)
    with pytest.raises(limits.TooLarge, match=r"running one training step .*\(1000 B\)"):
        compile_train_step(_tiny_spec(), live=True)


def test_huge_work_is_refused_by_the_python_api():
    with pytest.raises(limits.TooLarge, match="this machine's memory"):
        graphs_lib.build_graphs(float(HUGE_GRID), 2)
    with pytest.raises(limits.TooLarge, match="synthetic weather"):
        SyntheticWeather(TASK, float(HUGE_GRID))
    with pytest.raises(limits.TooLarge, match="a batch of 100000000"):
        SyntheticWeather(TASK, 10.0).make_batch(100_000_000)
    assert limits.format_bytes(10**700) == "about 10^700 B"
    assert limits.format_bytes(2**62) == "4.00 EiB"


# ---------------------------------------------------------------- 3. degenerate geometries


def test_a_graph_without_grid2mesh_edges_trains(capsys):
    """4 grid nodes at the poles and 12 mesh nodes: no grid2mesh edge at all."""
    assert cli.main(["graph", "--resolution", "180", "--mesh-splits", "0"]) == 0
    assert "encoder passes nothing from grid to mesh" in capsys.readouterr().out
    model = ModelConfig(resolution=180.0, mesh_splits=0, latent_size=4, processor_steps=1)
    graphs = graphs_lib.graphs_for(model)
    assert graphs.grid2mesh.num_edges == 0
    for recipe in ("deepmind", "lean"):  # edge blocks of an empty edge set
        step, args = train_step_abstract(StepSpec(model, TASK, RECIPES[recipe]), graphs)
        jax.eval_shape(step, *args)  # traces the forward and backward passes
    net = make_network(model, TASK.data_channels, TASK.output_channels, RECIPES["lean"])
    graph = graph_inputs(graphs)
    inputs = np.ones((graphs.num_grid_nodes, 1, TASK.data_channels), np.float32)
    params = net.init(jax.random.PRNGKey(0), graph, inputs)
    assert np.isfinite(np.asarray(jax.jit(net.apply)(params, graph, inputs))).all()


# ---------------------------------------------------------------------- 4. output paths


def _output_cases(tmp_path):
    (tmp_path / "file").write_text("")
    return [
        (["sweep", *TINY, "--out", str(tmp_path / "missing" / "s.json")], "does not exist"),
        (["sweep", *TINY, "--out", str(tmp_path)], "is a directory"),
        (["sweep", *TINY, "--out", str(tmp_path / "s.txt")], ".json, .csv"),
        (["sweep", *TINY, "--out", str(tmp_path / "file" / "s.json")], "not a directory"),
        (["sweep", *TINY, "--out", str(tmp_path / "s.json"), "--plot",
          str(tmp_path / "missing" / "s.png")], "does not exist"),
        (["sweep", *TINY, "--out", str(tmp_path / "s.json"), "--plot", str(tmp_path / "s.xyz")],
         ".png"),
        (["timeline", *TINY_NET, "--plot", str(tmp_path / "nowhere" / "t.png")], "does not exist"),
        (["timeline", *TINY_NET, "--plot", str(tmp_path)], "is a directory"),
        (["timeline", *TINY_NET, "--plot", str(tmp_path / "t")], ".png"),
        (["graph", *TINY, "--save", str(tmp_path)], "is a directory"),
        (["graph", *TINY, "--save", str(tmp_path / "missing" / "g.npz")], "does not exist"),
        (["graph", *TINY, "--save", "-"], "standard output"),
    ]


@pytest.mark.parametrize("case", range(12))
def test_output_paths_are_checked_before_any_work(case, tmp_path, capsys, no_work):
    argv, words = _output_cases(tmp_path)[case]
    assert cli.main(argv) == 2
    err = one_line_error(capsys, argv[0])
    option, value = argv[-2], argv[-1]
    assert f"{option} {value}: " in err and words in err, err
    assert not (tmp_path / "missing").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_an_unwritable_place_is_refused_before_any_work(capsys, no_work):
    assert cli.main(["timeline", *TINY_NET, "--plot", "/proc/t.png"]) == 2
    assert "--plot /proc/t.png: cannot write in folder /proc" in one_line_error(
        capsys, "timeline")


def test_a_sweep_cache_that_is_a_file_is_refused(tmp_path, monkeypatch, capsys, no_work):
    (tmp_path / "cache").write_text("")
    monkeypatch.setenv("GCLAB_SWEEP_CACHE", str(tmp_path / "cache"))
    assert cli.main(["sweep", *TINY, "--out", str(tmp_path / "s.json")]) == 2
    assert f"GCLAB_SWEEP_CACHE={tmp_path / 'cache'}: not a directory" in one_line_error(
        capsys, "sweep")


@pytest.mark.parametrize("address", ["garbage", "host:0", ":1234", "host:99999", " "])
def test_a_malformed_coordinator_variable_is_one_line(address, monkeypatch, capsys, no_work):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", address)
    monkeypatch.setenv("JAX_NUM_PROCESSES", "1")
    monkeypatch.setenv("JAX_PROCESS_ID", "0")
    assert cli.main(["train", *TINY_NET, "--train-steps", "1"]) == 2
    assert (f"JAX_COORDINATOR_ADDRESS={cli._shown(address)}: HOST:PORT with PORT in 1..65535"
            in one_line_error(capsys, "train"))


# (environment, argv, the line): a bad value of a variable names the variable, not an option.
ENVIRONMENT = [
    ({"JAX_NUM_PROCESSES": "0"}, ["train", *TINY_NET, "--train-steps", "1"],
     "JAX_NUM_PROCESSES=0: an integer >= 1"),
    ({"JAX_NUM_PROCESSES": "3"}, ["train", *TINY_NET, "--train-steps", "1"],
     "JAX_NUM_PROCESSES=3: it must divide the layout's 1 devices"),
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "5"}, ["train", *TINY_NET, "--train-steps", "1"],
     "JAX_PROCESS_ID=5: an integer in 0..num-processes - 1 (0..1 here)"),
    ({"JAX_NUM_PROCESSES": "2"}, ["train", *TINY_NET, "--train-steps", "1", "--devices", "2",
                                  "--batch", "2"],
     "JAX_NUM_PROCESSES=2: several processes need process 0's address: --coordinator"),
    ({"JAX_NUM_PROCESSES": "2", "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1"},
     ["train", *TINY_NET, "--train-steps", "1", "--devices", "2", "--batch", "2"],
     "JAX_COORDINATOR_ADDRESS=127.0.0.1:1: each of the 2 processes needs its index: "
     "--process-id I (or JAX_PROCESS_ID)"),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "most"}, ["plan", *TINY, "--budget", "T4"],
     "XLA_PYTHON_CLIENT_MEM_FRACTION=most: a number in (0, 1]"),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "2"}, ["plan", *TINY, "--budget", "H100", "--devices", "2"],
     "XLA_PYTHON_CLIENT_MEM_FRACTION=2: a number in (0, 1]"),
]


@pytest.mark.parametrize("env,argv,line", ENVIRONMENT, ids=lambda v: str(v)[:50])
def test_a_bad_environment_variable_is_named_not_an_option(env, argv, line, monkeypatch, capsys,
                                                           no_work):
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                 "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(argv) == 2
    err = one_line_error(capsys, argv[0])
    assert f"error: {line}" in err, err


def test_a_bad_memory_fraction_does_not_matter_to_a_budget_in_bytes(monkeypatch, capsys):
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "most")
    assert cli.main(["plan", *TINY, "--budget", "8GiB", "--compiled", "no"]) == 0
    assert cli.main(["plan", *TINY, "--budget", "T5"]) == 2  # still the option's fault
    assert "--budget T5: a number of bytes" in one_line_error(capsys, "plan")


def test_process_0s_port_in_use_is_one_line(monkeypatch, capsys, no_work):
    """JAX would fail to serve there, as often by a segmentation fault as by an error."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        assert cli.main(["train", *TINY_NET, "--train-steps", "1", "--coordinator", address,
                         "--num-processes", "1", "--process-id", "0"]) == 2
    assert (f"--coordinator {address}: its port is in use on this host, where process 0 serves "
            "the run: choose a free port") in one_line_error(capsys, "train")


# (argv, the option given ''): an empty path would mean the working directory.
EMPTY_PATHS = [
    (["graph", *TINY, "--save", ""], "--save"),
    (["timeline", *TINY_NET, "--plot", ""], "--plot"),
    (["sweep", *TINY, "--out", ""], "--out"),
    (["train", *TINY_NET, "--train-steps", "1", "--checkpoint-dir", ""], "--checkpoint-dir"),
    (["train", *TINY_NET, "--train-steps", "1", "--save-checkpoint", ""], "--save-checkpoint"),
    (["train", "--init-checkpoint", "", "--train-steps", "1"], "--init-checkpoint"),
    (["train", *TINY_NET, "--train-steps", "1", "--data", "", "--stats", "x"], "--data"),
    (["stats", "--out", "", "--data", "x.nc"], "--out"),
    (["forecast", "--out", "", "--checkpoint", "c.npz"], "--out"),
    (["forecast", "--stats", "", "--checkpoint", "c.npz"], "--stats"),
    (["reference", ""], "PATH.npz"),
]


@pytest.mark.parametrize("argv,option", EMPTY_PATHS, ids=[f"{a[0]} {o}" for a, o in EMPTY_PATHS])
def test_an_empty_path_is_refused(argv, option, capsys, no_work):
    assert cli.main(argv) == 2
    assert f"{option} '': a path, not an empty one (it would mean the working directory)" in (
        one_line_error(capsys, argv[0]))


def _dangling_link_cases(tmp_path):
    """(argv, option, link): each output a symbolic link into a folder that does not exist;
    the option comes first, so that it is what argparse reads (and refuses) first."""
    def link(name):
        path = tmp_path / name
        path.symlink_to(tmp_path / "missing" / name)
        return str(path)

    return [
        (["graph", *TINY, "--save", link("g.npz")], "--save"),
        (["sweep", *TINY, "--out", link("s.json")], "--out"),
        (["timeline", *TINY_NET, "--plot", link("t.png")], "--plot"),
        (["train", "--save-checkpoint", link("w.npz"), *TINY_NET, "--train-steps", "1"],
         "--save-checkpoint"),
        (["train", "--checkpoint-dir", link("ckpt"), *TINY_NET, "--train-steps", "1"],
         "--checkpoint-dir"),
        (["forecast", "--out", link("f.nc"), "--checkpoint", "c.npz"], "--out"),
        (["stats", "--out", link("stats"), "--data", "x.nc"], "--out"),
    ]


@pytest.mark.parametrize("case", range(7))
def test_a_dangling_link_is_checked_where_it_points(case, tmp_path, capsys, no_work):
    """A link is written at its target (`atomic_path`): its target's folder is checked before
    any work, not the link's own."""
    argv, option, link = [(a, o, a[a.index(o) + 1]) for a, o in _dangling_link_cases(tmp_path)
                          ][case]
    assert cli.main(argv) == 2
    err = one_line_error(capsys, argv[0])
    assert f"{option} {link}: " in err, err
    assert (f"a symbolic link to {tmp_path / 'missing' / Path(link).name}, whose folder "
            f"{tmp_path / 'missing'} does not exist") in err, err
    assert not (tmp_path / "missing").exists()


def test_a_dangling_link_into_a_folder_that_exists_is_written_through(tmp_path, capsys):
    link = tmp_path / "g.npz"
    link.symlink_to(tmp_path / "target.npz")
    assert cli.main(["graph", *TINY, "--save", str(link)]) == 0
    assert link.is_symlink() and (tmp_path / "target.npz").stat().st_size > 0
    with pytest.raises(OutputPathError, match="a symbolic link to .*, whose folder .* does not"):
        (tmp_path / "l.json").symlink_to(tmp_path / "missing" / "x.json")
        check_output_path(tmp_path / "l.json")


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs /dev/null")
def test_a_device_is_never_replaced_by_an_output_file(capsys, no_work):
    assert cli.main(["graph", *TINY, "--save", "/dev/null"]) == 2
    assert "--save /dev/null: exists and is not a regular file" in one_line_error(
        capsys, "graph")
    assert not Path("/dev/null").is_file()


def test_a_picture_format_that_needs_latex_is_refused(tmp_path, capsys, no_work):
    assert cli.main(["timeline", *TINY_NET, "--plot", str(tmp_path / "t.pgf")]) == 2
    assert ".pdf" in one_line_error(capsys, "timeline")


def test_writing_through_a_symbolic_link_replaces_its_target(tmp_path):
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    files.write_text_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_the_api_checks_output_paths(tmp_path):
    with pytest.raises(OutputPathError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "x.json")
    with pytest.raises(OutputPathError, match="must end in .json"):
        check_output_path(tmp_path / "x.csv", (".json",))
    assert check_output_path(tmp_path / "x.json", (".json",)) == tmp_path / "x.json"
    assert not list(tmp_path.iterdir())  # the write check leaves nothing behind


def test_an_os_error_mid_run_is_one_line(capsys, monkeypatch, tmp_path):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "g.npz"))

    monkeypatch.setattr(cli, "save_graphs", disk_full)
    assert cli.main(["graph", *TINY, "--save", str(tmp_path / "g.npz")]) == 1
    assert "No space left on device: " in one_line_error(capsys, "graph")


# ----------------------------------------------------------------------- 5. damaged files


def _fixture_arrays():
    with np.load(TINY_FIXTURE) as z:
        return {k: z[k] for k in z.files}


def _setting(key, value):
    def damage(a):
        a[key] = value(a[key]) if callable(value) else value
    return damage


def _index(key, i, value):
    def damage(a):
        a[key] = a[key].copy()
        a[key][i] = value
    return damage


FIXTURE_DAMAGE = [
    # (name, damage to the arrays, words)
    ("g2m_out_of_range", _index("g2m_senders", 5, 10**6), "g2m_senders must index grid nodes"),
    ("m2g_negative", _index("m2g_senders", 0, -3), "from -3"),
    ("mesh_out_of_range", _index("mesh_receivers", 0, 162), "mesh nodes 0..161"),
    ("one_latitude", _setting("grid_lat", lambda x: x[:1]), "at least 2 latitudes"),
    ("descending", _setting("grid_lat", lambda x: x[::-1].copy()), "descends from 90 to -90"),
    ("uneven", _setting("grid_lat", lambda x: np.r_[x[:-1], 95.0]), "ascend evenly"),
    ("nan_latitude", _setting("grid_lat", lambda x: np.full_like(x, np.nan)), "NaN"),
    ("no_longitudes", _setting("grid_lon", lambda x: x[:0]), "grid_lon must be the 36"),
    ("short_features", _setting("feat_g2m_edges", lambda x: x[:-3]), "(E, 4)"),
    ("float_indices", _setting("g2m_senders", lambda x: x.astype(np.float32)), "integers"),
    ("text_inputs", _setting("inputs", lambda x: np.full(x.shape, "a")), "floating-point"),
    ("nan_inputs", _setting("inputs", lambda x: np.full_like(x, np.nan)), "NaN"),
    ("empty_batch", _setting("inputs", lambda x: x[:, :0]), "B, C_in >= 1"),
    ("not_icosahedral", _setting("feat_mesh_nodes", lambda x: x[:100]), "not an icosahedral"),
    ("m2g_not_3_per_node", _setting("m2g_senders", lambda x: x[:-1]), "(E,), (E,), (E, 4)"),
    ("nan_parameter", _setting("param::mesh_gnn/~_networks_builder/processor_edges_0_mesh_mlp"
                               "/~/linear_0::b", lambda x: x * np.nan), "finite"),
]


@pytest.mark.parametrize("name,damage,words", FIXTURE_DAMAGE, ids=[d[0] for d in FIXTURE_DAMAGE])
def test_a_damaged_fixture_is_named_with_what_is_wrong(name, damage, words, tmp_path, capsys,
                                                         no_work):
    arrays = _fixture_arrays()
    damage(arrays)
    path = tmp_path / f"{name}.npz"
    np.savez(path, **arrays)
    with pytest.raises(FixtureError) as e:
        load_fixture(path)
    assert str(e.value).startswith(f"{path}: ") and words in str(e.value)
    assert cli.main(["reference", str(path)]) == 2
    assert words in one_line_error(capsys, "reference")


SIDECARS = [
    ("[1, 2]", "must hold a JSON object, not a list"),
    ('{"config": "x"}', "'config' must be a JSON object"),
    ('{"graph": [1]}', "'graph' must be a JSON object"),
    ('{"config": {"radius_query_fraction_edge_length": "abc"}}', "config.radius_query_fraction"),
    ('{"config": {"radius_query_fraction_edge_length": NaN}}', "config.radius_query_fraction"),
    ('{"config": {"mesh2grid_edge_normalization_factor": -1}}', "config.mesh2grid_edge"),
    ('{"graph": {"tie_diagnostics": {"m2g_grid_nodes_on_face_boundary_indices": [1e9]}}}',
     "list of grid node indices"),
    ('{"graph": {"tie_diagnostics": {"m2g_grid_nodes_on_face_boundary_indices": [5000]}}}',
     "grid nodes in 0..683"),
    ('{"config": {', "not valid JSON"),
    (b"\xff\xfe garbage", "not a readable JSON text file"),
    ("[" * 100_000, "nested too deeply"),
]


@pytest.mark.parametrize("text,words", SIDECARS, ids=[str(s[1])[:30] for s in SIDECARS])
def test_a_sidecar_of_the_wrong_shape_is_named(text, words, tmp_path, capsys, no_work):
    path = tmp_path / "fx.npz"
    np.savez(path, **_fixture_arrays())
    sidecar = path.with_suffix(".json")
    sidecar.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert cli.main(["reference", str(path)]) == 2
    err = one_line_error(capsys, "reference")
    assert f"{sidecar}: " in err and words in err


def test_a_mesh2grid_normalization_too_small_for_float32_is_one_line(tmp_path, capsys):
    # Allowed by ModelConfig (finite, > 0), but the mesh2grid features of this geometry
    # would be inf in float32: refused when the graphs are built, by name, in one line.
    path = tmp_path / "fx.npz"
    np.savez(path, **_fixture_arrays())
    sidecar = json.loads((DATA / "official_tiny.json").read_text())
    sidecar["config"]["mesh2grid_edge_normalization_factor"] = 1e-40
    path.with_suffix(".json").write_text(json.dumps(sidecar))
    assert cli.main(["reference", str(path)]) == 2
    err = one_line_error(capsys, "reference")
    assert ("mesh2grid_edge_normalization_factor=1e-40 is invalid: None or a number >= "
            "9.29e-40") in err and "stay finite in float32" in err


def test_unreadable_fixture_files(tmp_path, capsys, no_work):
    path = tmp_path / "fx.npz"
    np.savez_compressed(path, **_fixture_arrays())
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 256] = bytes(256)  # inside a compressed member
    (tmp_path / "corrupt.npz").write_bytes(bytes(data))
    (tmp_path / "half.npz").write_bytes(path.read_bytes()[:len(data) // 2])
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "folder.npz").mkdir()
    for name, words in (("corrupt", "damaged or truncated"), ("half", "not an .npz"),
                        ("empty", "not an .npz"), ("folder", "is a folder"),
                        ("absent", "not found")):
        assert cli.main(["reference", str(tmp_path / f"{name}.npz")]) == 2
        assert words in one_line_error(capsys, "reference")


def test_a_fixture_header_declaring_more_than_its_member_holds_is_named(tmp_path, capsys,
                                                                        no_work):
    path = tmp_path / "fx.npz"
    np.savez(path, **{k: v for k, v in _fixture_arrays().items() if k != "inputs"})
    header = io.BytesIO()  # 728 TiB declared: numpy would allocate it before reading
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (10**14,)})
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("inputs.npy", header.getvalue() + bytes(64))
    assert cli.main(["reference", str(path)]) == 2
    err = one_line_error(capsys, "reference")  # was "out of memory", naming no file
    assert f"{path}: " in err and "member inputs.npy: its .npy header declares shape " \
        "(100000000000000,) of float64 (727.60 TiB), more than the 64 bytes" in err


def test_an_unreadable_fixture_is_not_called_a_non_npz_file(tmp_path, lock_file, capsys,
                                                            no_work):
    # `zipfile.is_zipfile` answers False for a file it cannot open.
    path = tmp_path / "locked.npz"
    path.write_bytes(TINY_FIXTURE.read_bytes())
    lock_file(path)
    assert cli.main(["reference", str(path)]) == 2
    assert f"{path}: cannot read it (Permission denied)" in one_line_error(capsys, "reference")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file without read permission")
def test_a_fixture_without_read_permission_is_named_unreadable(tmp_path, capsys, no_work):
    path = tmp_path / "locked.npz"
    path.write_bytes(TINY_FIXTURE.read_bytes())
    path.chmod(0)
    try:
        assert cli.main(["reference", str(path)]) == 2
        assert "cannot read it (Permission denied)" in one_line_error(capsys, "reference")
    finally:
        path.chmod(0o600)


def test_a_fixture_larger_than_memory_is_refused_before_reading(monkeypatch, capsys, no_work):
    monkeypatch.setattr("gclab.model.reference.host_memory_bytes", lambda: 10**5)
    assert cli.main(["reference", str(TINY_FIXTURE)]) == 2
    err = one_line_error(capsys, "reference")
    assert "reading the fixture's arrays" in err and "(97.66 KiB)" in err


def test_every_fixture_is_checked_before_any_is_run(tmp_path, capsys, no_work):
    assert cli.main(["reference", str(TINY_FIXTURE), str(tmp_path / "absent.npz")]) == 2
    assert "absent.npz" in one_line_error(capsys, "reference")


def test_a_damaged_graph_cache_is_rebuilt_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GCLAB_CACHE_DIR", str(tmp_path))
    assert cli.main(["graph", *TINY]) == 0
    assert "built and cached for the next run" in capsys.readouterr().out
    assert cli.main(["graph", *TINY]) == 0
    assert "loaded from the cache" in capsys.readouterr().out
    (cached,) = tmp_path.glob("*.npz")
    cached.write_bytes(cached.read_bytes()[:1000])  # truncated
    assert cli.main(["graph", *TINY]) == 0
    out, err = capsys.readouterr()
    assert "built and cached" in out
    assert err.startswith("gclab graph: warning: graph cache") and "damaged" in err
    assert err.count("\n") == 1
    assert graphs_lib.build_graphs(6.0, 2, cache_dir=tmp_path).num_grid_nodes == 1860


def test_a_graph_cache_with_indices_out_of_range_is_not_trusted(tmp_path):
    graphs_lib.build_graphs(6.0, 2, cache_dir=tmp_path)
    (cached,) = tmp_path.glob("*.npz")
    with np.load(cached) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["mesh2grid_senders"] = arrays["mesh2grid_senders"] + 10_000  # well-formed, wrong
    np.savez(cached, **arrays)
    with pytest.warns(CacheWarning, match="mesh2grid indices out of range"):
        g = graphs_lib.build_graphs(6.0, 2, cache_dir=tmp_path)
    assert g.mesh2grid.senders.max() < g.num_mesh_nodes


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_an_unwritable_graph_cache_is_reported_not_claimed(capsys, monkeypatch):
    monkeypatch.setenv("GCLAB_CACHE_DIR", "/proc/gclab-cache")
    assert cli.main(["graph", *TINY]) == 0
    out = capsys.readouterr().out
    assert "built, not cached: /proc/gclab-cache" in out and "for the next run" not in out
    assert cli.main(["graph", *TINY, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["loaded_from_cache"] is False and record["cache_error"]


def _tiny_spec(latent=8):
    model = ModelConfig(resolution=6.0, mesh_splits=2, latent_size=latent, processor_steps=2)
    return StepSpec(model, TASK)


ROW = {"status": "ok", "message": "", "argument_bytes": 10, "output_bytes": 10,
       "temp_bytes": 10, "total_bytes": 30, "alias_bytes": 0, "compile_seconds": 0.1}


@pytest.mark.parametrize("cached", [
    "[1, 2]", '"ok"', "{}", '{"status": "ok", "message": ""}',
    json.dumps({**ROW, "total_bytes": "30"}), json.dumps({**ROW, "temp_bytes": -1}),
    json.dumps({**ROW, "compile_seconds": None}), "{not json", "",
])
def test_a_sweep_cache_row_of_the_wrong_shape_is_recomputed(cached, tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_lib, "_one", lambda *a: dict(ROW))
    spec = _tiny_spec()
    path = tmp_path / f"{sweep_lib.cache_key(spec, 'compiled')}.json"
    path.write_text(cached)
    with pytest.warns(CacheWarning, match=re.escape(f"sweep cache row {path} is damaged")):
        df = sweep_lib.sweep([spec], cache_path=tmp_path, progress=False)
    assert not df["cached"][0] and df["total_bytes"][0] == 30
    assert json.loads(path.read_text())["total_bytes"] == 30  # rewritten whole
    df = sweep_lib.sweep([spec], cache_path=tmp_path, progress=False)
    assert df["cached"][0]


def test_a_sweep_cache_row_that_cannot_be_written_does_not_stop_the_sweep(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(sweep_lib, "_one", lambda *a: dict(ROW))
    spec = _tiny_spec()
    (tmp_path / f"{sweep_lib.cache_key(spec, 'compiled')}.json").mkdir()  # in the way
    with pytest.warns(CacheWarning, match="could not be written"):
        df = sweep_lib.sweep([spec], cache_path=tmp_path, progress=False)
    assert df["total_bytes"][0] == 30


# ---------------------------------------------------------------- 6. the words of a message


def test_edge_block_0_turns_off_what_needs_blocks_instead_of_blaming_a_field():
    args = cli.build_parser().parse_args(["memory", *TINY_NET, "--recipe", "lean",
                                          "--edge-block", "0"])
    mem = cli._spec(args, args.recipe).memory
    assert mem.edge_block_size is None and not mem.stream_grid_nodes
    assert not mem.processor_edge_blocks and mem.gather_after_matmul


def test_every_option_has_help():
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    for name, p in sub.choices.items():
        for action in p._actions:
            assert action.help, f"gclab {name} {action.option_strings or action.dest}"


# ------------------------------------------------------------------------- 7. atomic writes


class Crash(Exception):
    pass


def test_atomic_path_leaves_nothing_half_written(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(Crash):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise Crash
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]
    files.write_text_atomic(target, "new")
    assert target.read_text() == "new" and list(tmp_path.iterdir()) == [target]
    assert target.stat().st_mode & 0o777 != 0o600  # an ordinary file, not mkstemp's mode


def test_a_crash_while_writing_leaves_no_file_a_later_run_trusts(tmp_path, monkeypatch):
    import pandas as pd

    def crash(self, path, *args, **kwargs):
        Path(path).write_text("[{")  # half a file
        raise Crash

    monkeypatch.setattr(pd.DataFrame, "to_csv", crash)
    with pytest.raises(Crash):
        sweep_lib.save_sweep(pd.DataFrame([ROW]), tmp_path / "s.csv")
    assert not list(tmp_path.iterdir())

    def half_savez(f, **arrays):
        f.write(b"PK\x03\x04 half")
        raise Crash

    monkeypatch.setattr(graphs_lib.np, "savez", half_savez)
    with pytest.raises(Crash):
        graphs_lib.build_graphs(6.0, 2, cache_dir=tmp_path / "g")
    assert not list((tmp_path / "g").iterdir())  # no cache file, no temporary


def test_pictures_are_written_atomically(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    fig = plt.figure()
    out = tmp_path / "p.png"
    cli._save_figure(fig, out)
    assert out.read_bytes()[:4] == b"\x89PNG" and list(tmp_path.iterdir()) == [out]

    def crash(*args, **kwargs):
        raise Crash

    monkeypatch.setattr(fig, "savefig", crash)
    with pytest.raises(Crash):
        cli._save_figure(fig, tmp_path / "q.pdf")
    assert list(tmp_path.iterdir()) == [out]
    plt.close(fig)


# ------------------------------------------------------------------------ 8. the Python API

API = [
    (lambda: ModelConfig(resolution=float("inf")), "ModelConfig.resolution=inf"),
    (lambda: ModelConfig(resolution=1e-300), "int32"),
    (lambda: ModelConfig(resolution=270.0), "at most 180"),
    (lambda: ModelConfig(mesh_splits=3.0), "ModelConfig.mesh_splits=3.0"),
    (lambda: ModelConfig(latent_size=2**40), "ModelConfig.latent_size"),
    (lambda: ModelConfig(radius_query_fraction_edge_length=1e308), "1000"),
    (lambda: ModelConfig(hidden_layers=True), "ModelConfig.hidden_layers=True"),
    (lambda: MemoryConfig(edge_block_size=-5), "MemoryConfig.edge_block_size=-5"),
    (lambda: MemoryConfig(microbatches=2**40), "MemoryConfig.microbatches"),
    (lambda: MemoryConfig(remat_ratio=float("nan")), "MemoryConfig.remat_ratio=nan"),
    (lambda: MemoryConfig(stream_grid_nodes=True), "needs edge_block_size"),
    (lambda: TaskConfig(pressure_levels=(500, float("inf"))), "TaskConfig.pressure_levels"),
    (lambda: TaskConfig(pressure_levels=[500, 850]), "TaskConfig.pressure_levels"),
    (lambda: TaskConfig.from_levels(12), "13 or 37"),
    (lambda: StepSpec("graphcast", TASK),
     "StepSpec.model='graphcast' is invalid: a ModelConfig, not a str"),
    (lambda: StepSpec(ModelConfig(), TASK, "lean"),
     "StepSpec.memory='lean' is invalid: a MemoryConfig, not a str"),
    (lambda: StepSpec(ModelConfig(), TASK, batch=0), "StepSpec.batch=0"),
    (lambda: StepSpec(ModelConfig(), TASK, rollout=2**31), "StepSpec.rollout=2147483648"),
    (lambda: StepSpec(ModelConfig(), TASK, MemoryConfig(microbatches=2), batch=3), "multiple"),
    (lambda: StepSpec.from_json({"model": {}}), "not a StepSpec.to_json() record"),
    (lambda: StepSpec.from_json({**_tiny_spec().to_json(), "batch": -1}), "StepSpec.batch=-1"),
    (lambda: SyntheticWeather("13 levels", 10.0),
     "SyntheticWeather.task='13 levels' is invalid: a TaskConfig"),
    (lambda: SyntheticWeather(TASK, 7.0), "SyntheticWeather.resolution=7.0"),
    (lambda: SyntheticWeather(TASK, 10.0, basis=10**9), "SyntheticWeather.basis"),
    (lambda: SyntheticWeather(TASK, 10.0, seed=-1), "SyntheticWeather.seed=-1"),
    (lambda: SyntheticWeather(TASK, 10.0).make_batch(0), "make_batch batch=0"),
    (lambda: SyntheticWeather(TASK, 10.0).make_batch(1, rollout=2.0), "make_batch rollout=2.0"),
    (lambda: load_fixture(DATA / "absent.npz"), "fixture not found"),
    (lambda: load_fixture(DATA), "is a folder"),
    (lambda: graphs_lib.build_graphs(6.0, 2, cache="yes"), "cache='yes'"),
    (lambda: planner.parse_budget(float("inf")), "bad budget inf"),
    (lambda: planner.parse_budget(2**51), "1 PiB"),
    (lambda: planner.parse_budget("1e400"), "bad budget '1e400'"),
    (lambda: planner.plan("8GiB", ModelConfig(resolution=6.0, mesh_splits=2), TASK, batch=-2),
     "plan: batch=-2"),
    (lambda: planner.plan("8GiB", ModelConfig(resolution=6.0, mesh_splits=2), TASK,
                          precision="fp8"), "plan: precision='fp8'"),
    (lambda: planner.plan("8GiB", ModelConfig(resolution=6.0, mesh_splits=2), TASK,
                          headroom="0.9"), "headroom='0.9'"),
    (lambda: planner.plan("8GiB", "graphcast", TASK),
     "plan: model='graphcast' is invalid: a ModelConfig, not a str"),
    (lambda: analytical.estimate(ModelConfig(resolution=6.0, mesh_splits=2), TASK, rollout=0),
     "estimate: rollout=0"),
    (lambda: sweep_lib.grid(ModelConfig(), [], [2]), "grid: latent_sizes=[]"),
    (lambda: sweep_lib.grid(ModelConfig(), [8], [0]), "grid: steps_list=[0]"),
    (lambda: sweep_lib.grid(ModelConfig(), [8], [2], techniques=[]), "techniques is empty"),
    (lambda: sweep_lib.grid(ModelConfig(), [8], [2], techniques=["leanest"]), "unknown recipe"),
    (lambda: sweep_lib.sweep([]), "specs is empty"),
    (lambda: sweep_lib.sweep([_tiny_spec()], repeats=0), "repeats=0"),
    (lambda: guarded_grid([], repeats=1.5), "repeats=1.5"),
    (lambda: sweep_lib.sweep([_tiny_spec()], timeout=float("nan")), "timeout=nan"),
    (lambda: sweep_lib.sweep([_tiny_spec()], cache_path=TINY_FIXTURE), "not a folder"),
    (lambda: compile_train_step("spec"), "spec must be a StepSpec"),
    (lambda: get_recipe(["lean"]), "unknown recipe ['lean']"),
    (lambda: get_preset(["graphcast"]), "unknown preset ['graphcast']"),
    (lambda: MemoryConfig(processor_remat=np.array(["step", "step"])),
     "MemoryConfig.processor_remat=array"),
    (lambda: graphs_lib.build_graphs(6.0, 2, cache_dir=123), "cache_dir=123"),
    (lambda: graphs_lib.graphs_for("cpu-4x32"), "graphs_for needs a ModelConfig"),
    (lambda: load_fixture(None), "a fixture path must be a str or os.PathLike"),
    (lambda: run_checks("fixture.npz"), "run_checks needs a Fixture"),
    (lambda: run_checks(load_fixture(TINY_FIXTURE), float("nan")), "tolerance=nan"),
    (lambda: run_checks(load_fixture(TINY_FIXTURE), "1e-5"), "tolerance='1e-5'"),
    (lambda: analytical.estimate(ModelConfig(), TASK, counts="x"),
     "counts must be a GraphCounts"),
    (lambda: analytical.estimate(ModelConfig(), TASK, activation_bytes=-4),
     "activation_bytes=-4"),
    (lambda: sweep_lib.save_sweep([ROW], "x.json"), "save_sweep needs a DataFrame"),
    (lambda: check_output_path(123), "a path must be a str or os.PathLike"),
    (lambda: use_cpu_devices(MAX_CPU_DEVICES + 1), "JAX's CPU backend runs in one process (at "
     "most 2048)"),
    (lambda: initialize_processes("127.0.0.1:1", 2, 0, timeout=0), "timeout=0 is invalid"),
    # Helpers of the memory, parallel, geometry and sizing layers.
    (lambda: compute_dtype("fp16"), "compute_dtype precision='fp16' is invalid: one of f32, bf16"),
    (lambda: remat_policy("bogus"),
     "remat_policy name='bogus' is invalid: one of nothing, dots, aggregated, node-latents"),
    (lambda: balanced_block(10, 0), "balanced_block block=0 is invalid: an integer >= 1"),
    (lambda: balanced_block(10, 2.5), "balanced_block block=2.5 is invalid"),
    (lambda: balanced_block(-1, 4), "balanced_block n=-1 is invalid: an integer >= 0"),
    (lambda: split_blocks(BLOCK_ROWS, 0), "split_blocks block=0 is invalid: an integer >= 1"),
    (lambda: split_blocks(BLOCK_ROWS, 4, shards=0), "split_blocks shards=0 is invalid"),
    (lambda: bubble_fraction(0, 4), "bubble_fraction stages=0 is invalid: an integer >= 1"),
    (lambda: bubble_fraction(4, 0), "bubble_fraction microbatches=0 is invalid"),
    (lambda: bubble_fraction(2.5, 4), "bubble_fraction stages=2.5 is invalid"),
    (lambda: grid_latitudes(7.0), "grid_latitudes resolution=7.0 is invalid: 180 / resolution"),
    (lambda: grid_latitudes(0.0), "grid_latitudes resolution=0.0 is invalid: a positive number"),
    (lambda: grid_latitudes(-1.0), "grid_latitudes resolution=-1.0 is invalid"),
    (lambda: grid_latitudes(float("nan")), "grid_latitudes resolution=nan is invalid"),
    (lambda: grid_longitudes(7.0), "grid_longitudes resolution=7.0 is invalid"),
    (lambda: data_sheet("H100", "fp16"),
     "data_sheet precision='fp16' is invalid: one of f32, bf16"),
    (lambda: speed_for("H100", "fp16"), "speed_for precision='fp16' is invalid"),
    (lambda: sweep_lib.load_sweep(TINY_FIXTURE), "official_tiny.npz: not JSON"),
    (lambda: sweep_lib.load_sweep(DATA / "official_tiny.json"),
     "official_tiny.json: JSON of the wrong shape (not a list)"),
    (lambda: guarded_grid([], repeats=True), "repeats=True is invalid: an integer >= 1"),
    (lambda: guarded_grid([], usable=0), "guarded_grid usable=0 is invalid"),
    # A factor so small that the mesh2grid features would be inf in float32.
    (lambda: graphs_lib.build_graphs(30.0, 1, mesh2grid_edge_normalization_factor=1e-40,
                                     cache=False),
     "mesh2grid_edge_normalization_factor=1e-40 is invalid: None or a number >= 1.83e-39"),
]


@pytest.mark.parametrize("call,words", API, ids=[w for _, w in API])
def test_the_python_api_names_the_bad_argument(call, words):
    with pytest.raises(ValueError) as e:
        call()
    assert words in str(e.value), str(e.value)


def test_config_errors_keep_field_and_allowed_values():
    with pytest.raises(ConfigError) as e:
        ModelConfig(mesh_splits=9)
    assert (e.value.owner, e.value.field, e.value.value) == ("ModelConfig", "mesh_splits", 9)
    assert e.value.allowed == "an integer in 0..7"


def test_numpy_numbers_are_accepted_and_stored_as_python_numbers():
    m = ModelConfig(resolution=np.float32(6), mesh_splits=np.int64(2), latent_size=np.int32(8))
    assert m == ModelConfig(resolution=6.0, mesh_splits=2, latent_size=8)
    assert type(m.mesh_splits) is int and type(m.resolution) is float
    spec = StepSpec(m, TASK, MemoryConfig(edge_block_size=np.int64(64)), batch=np.int64(2))
    json.dumps(spec.to_json())  # plain Python numbers all the way down
    assert SyntheticWeather(TASK, np.float64(10.0), seed=np.int64(1)).num_grid_nodes == 684


# ------------------------------------------------------------- 9. end to end, in a process


# A process for each way a refusal reaches the user: the option parser's, a ValueError
# of the work caught by `cli.main`, and the sizing of a step. A refusal of an --out (the
# parser's) and of a fixture file (a ValueError) are checked here, in this process, case by
# case (`test_output_paths_are_checked_before_any_work`, `test_unreadable_fixture_files`).
END_TO_END = [
    (["graph", "--resolution", "inf", "--mesh-splits", "2", "--json"], "--resolution inf"),
    (["graph", "--resolution", HUGE_GRID, "--mesh-splits", "2"], "more than this machine's"),
    (["memory", *TINY, "--latent", "1000000000", "--steps", "1"], "64-bit"),
]


@pytest.mark.parametrize("argv,words", END_TO_END, ids=[a[0][0] for a in END_TO_END])
def test_no_traceback_end_to_end(argv, words, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gclab", *argv], capture_output=True,
                          text=True, timeout=600, cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, "GCLAB_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# One sharded sum over the first N of JAX's CPU devices, for each N given: its result or
# JAX's error, a line each.
_DEVICES_SCRIPT = """
import sys, jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
jax.config.update("jax_num_cpu_devices", max(map(int, sys.argv[1:])))
for n in map(int, sys.argv[1:]):
    mesh = Mesh(np.array(jax.devices()[:n]), ("x",))
    x = jax.device_put(np.ones(n, np.float32), NamedSharding(mesh, PartitionSpec("x")))
    try:
        print(float(jax.jit(lambda a: a.sum())(x)))
    except Exception as e:
        print(str(e).splitlines()[0])
"""


def test_the_cpu_device_limit_is_jaxs():
    """`MAX_CPU_DEVICES` is where JAX's CPU backend stops: a computation over that many
    devices runs, over one more it fails (JAX accepts the device count itself)."""
    proc = subprocess.run([sys.executable, "-c", _DEVICES_SCRIPT, str(MAX_CPU_DEVICES),
                           str(MAX_CPU_DEVICES + 1)], capture_output=True, text=True, timeout=300)
    most, more = proc.stdout.splitlines()
    assert most == f"{float(MAX_CPU_DEVICES)}", proc.stdout + proc.stderr[-2000:]
    assert "Multiprocess computations aren't implemented on the CPU backend" in more, more


# ------------------------------------------------------- train and sweep options that clash

TRAIN_CLASHES = [
    # (argv, words the message must hold)
    (["train", *TINY_NET, "--train-steps", "1", "--learning-rate", "1e300"],
     ["--learning-rate 1e300", "float32's largest"]),
    (["train", *TINY_NET, "--train-steps", "1001"],
     ["--train-steps 1001", "at most --schedule-steps 1000"]),
    (["train", *TINY_NET, "--train-steps", "5", "--schedule-steps", "4"],
     ["--train-steps 5", "at most --schedule-steps 4"]),
    (["sweep", *TINY, "--latent", "64", "--latents", "8", "--out", "x.json"],
     ["--latent 64", "with --latents"]),
    (["sweep", *TINY, "--steps", "3", "--steps-list", "1,2", "--out", "x.json"],
     ["--steps 3", "with --steps-list"]),
]


@pytest.mark.parametrize("argv,words", TRAIN_CLASHES, ids=lambda a: " ".join(map(str, a))[:60])
def test_options_a_run_would_ignore_or_overflow_are_refused(argv, words, capsys, no_work):
    assert_refused(argv, words, capsys)


@pytest.mark.parametrize("inside", [False, True])
def test_save_checkpoint_in_the_checkpoint_dir_is_refused(inside, tmp_path, capsys, no_work):
    """Orbax owns --checkpoint-dir: a weights file there, or the folder itself (not yet made),
    would fail only after training."""
    folder = tmp_path / "ckpt.npz"
    save = folder / "w.npz" if inside else folder
    if inside:
        folder.mkdir()
    assert cli.main(["train", *TINY_NET, "--train-steps", "1", "--checkpoint-dir", str(folder),
                     "--save-checkpoint", str(save)]) == 2
    err = one_line_error(capsys, "train")
    where = "inside" if inside else "the same path as"
    assert f"--save-checkpoint {save}: {where} --checkpoint-dir {folder}" in err, err


def test_a_seed_with_nothing_to_seed_is_refused(tmp_path, capsys, no_work):
    """With --init-checkpoint and --data the weights and the examples are given: --seed
    would be ignored."""
    from gclab.model import param_shapes
    from gclab.training.data import SyntheticWeather
    from gclab.weather import (
        Checkpoint,
        compute_stats,
        synthetic_dataset,
        write_checkpoint,
        write_dataset,
        write_stats,
    )

    model = ModelConfig(resolution=30.0, mesh_splits=1, latent_size=8, processor_steps=1)
    params = {m: {n: np.zeros(s.shape, np.float32) for n, s in leaves.items()}
              for m, leaves in param_shapes(model, TASK.data_channels,
                                            TASK.output_channels).items()}
    write_checkpoint(tmp_path / "init.npz", Checkpoint.from_gclab(params, model, TASK, "", ""))
    weather = SyntheticWeather(TASK, model.resolution, seed=0)
    write_dataset(synthetic_dataset(weather, frames=4), tmp_path / "data.nc")
    (tmp_path / "stats").mkdir()
    write_stats(compute_stats(synthetic_dataset(weather, frames=4)), tmp_path / "stats")
    argv = ["train", "--init-checkpoint", str(tmp_path / "init.npz"), "--data",
            str(tmp_path / "data.nc"), "--stats", str(tmp_path / "stats"), "--train-steps", "1"]
    assert cli.main([*argv, "--seed", "3"]) == 2
    assert "--seed 3: leave it out with --init-checkpoint and --data" in one_line_error(
        capsys, "train")
