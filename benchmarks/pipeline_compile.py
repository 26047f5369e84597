"""What a pipelined training step costs to trace and compile, with and without shared stages.

`gclab.parallel.pipeline.gpipe` runs each device's stage through one switch over the stage
functions, and tracing, differentiating and compiling a switch cost one branch each.
GraphCast's middle stages of equal steps and remat are one function
(`gclab.model.graphcast.pipeline_stages`, `shared=True`), so P stages cost three
branches; `--unshared` builds one function per stage, as P branches. For each number of
stages, one training step (batch = micro-batches, from shapes) is traced, lowered and
compiled as a memory plan is (`gclab.measure.plan_only_options`) in a fresh process with
P simulated CPU devices and JAX's compilation cache off, both ways, `--repeats` times
alternating. Writes `benchmarks/results/pipeline-compile-<backend>.json` and the copy
chapter 8 reads, `gclab/recordings/pipeline-compile-<backend>.json`.

    python benchmarks/pipeline_compile.py                       # cpu-8x128, P = 2, 4, 8
    python benchmarks/pipeline_compile.py --preset cpu-16x512 --stages 16 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from children import child_env  # noqa: E402
from fresh_clone import ROOT, commit  # noqa: E402
from options import child_output, named  # noqa: E402

from gclab.files import write_text_atomic  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SHIPPED = ROOT / "gclab" / "recordings"  # read by chapters from the installed package

# Runs in a fresh process with P simulated devices: one pipelined step, shared or not.
_CHILD = r"""
import functools, json, sys, time
import jax
stages, preset, microbatches, shared = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]),
                                        sys.argv[4] == "shared")
jax.config.update("jax_num_cpu_devices", stages)
from gclab import training
from gclab.config import get_preset
from gclab.measure import memory_of_compiled, plan_only_options
from gclab.model import graphcast
from gclab.parallel import make_mesh, parse_parallel_spec, switch_branches, use_layout
from gclab.sizing import StepSpec, train_step_abstract

graphcast.pipeline_stages = functools.partial(graphcast.pipeline_stages, shared=shared)
p = get_preset(preset)
layout = parse_parallel_spec(f"pipeline:{stages},microbatches:{microbatches}")
spec = StepSpec(p.model, p.task, batch=microbatches, parallel=layout)
step, base = train_step_abstract(spec)
mesh = make_mesh(layout)
args = training.abstract_step_args(mesh, *base)
with use_layout(mesh, layout):
    t0 = time.perf_counter()
    traced = jax.jit(step).trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile(plan_only_options())
    t3 = time.perf_counter()
m = memory_of_compiled(compiled, t3 - t2)
print(json.dumps({"trace_seconds": t1 - t0, "lower_seconds": t2 - t1,
                  "compile_seconds": m.compile_seconds, "temp_bytes": m.temp_bytes,
                  "total_bytes": m.total_bytes,
                  "switch_branches": max(switch_branches(traced.jaxpr.jaxpr))}))
"""


def run(stages: int, preset: str, microbatches: int, shared: bool) -> dict:
    env = child_env(JAX_ENABLE_COMPILATION_CACHE="false", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _CHILD, str(stages), preset, str(microbatches),
                          "shared" if shared else "unshared"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    stdout = child_output(out, "pipeline_compile.py",
                          f"P={stages} {'shared' if shared else 'unshared'}")
    return json.loads(stdout.strip().splitlines()[-1])


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The options as gclab allows them (its preset names, its pipeline specs), checked
    before any child starts; the numbers of stages."""
    from gclab.config import ConfigError, get_preset
    from gclab.parallel import parse_parallel_spec
    from gclab.parallel.config import spec_error

    named(parser, "--preset", args.preset, get_preset)
    for option, value in (("--microbatches", args.microbatches), ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{option} {value} is invalid: an integer >= 1")
    try:
        stages = [int(s) for s in args.stages.split(",")]
    except ValueError:
        stages = [0]
    if any(s < 1 for s in stages):
        parser.error(f"--stages {args.stages!r} is invalid: comma-separated integers >= 1")
    for n in stages:
        spec = f"pipeline:{n},microbatches:{args.microbatches}"
        try:
            parse_parallel_spec(spec)
        except ConfigError as e:
            parser.error(f"--stages/--microbatches: {spec_error(spec, e)}")
    return stages


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-8x128")
    parser.add_argument("--stages", default="2,4,8", help="comma-separated numbers of stages")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    stage_counts = _check(parser, args)

    from gclab.measure import machine

    hardware = machine()
    rows = []
    for stages in stage_counts:
        runs = {True: [], False: []}
        for _ in range(args.repeats):  # alternating: a slow spell hits both ways
            for shared in (True, False):
                runs[shared].append(run(stages, args.preset, args.microbatches, shared))
        for shared, per_run in runs.items():
            row = {"preset": args.preset, "stages": stages, "microbatches": args.microbatches,
                   "shared_stages": shared,
                   **{k: per_run[0][k] for k in ("temp_bytes", "total_bytes",
                                                 "switch_branches")}}
            for key in ("trace_seconds", "lower_seconds", "compile_seconds"):
                row[key] = round(statistics.median(r[key] for r in per_run), 3)
                row[key + "_runs"] = [round(r[key], 3) for r in per_run]
            rows.append(row)
            print(f"P={stages:2d} {'shared  ' if shared else 'unshared'} "
                  f"branches {row['switch_branches']:2d}  trace {row['trace_seconds']:6.2f} s  "
                  f"lower {row['lower_seconds']:5.2f} s  compile {row['compile_seconds']:6.2f} s  "
                  f"temp {row['temp_bytes'] / 2**20:8.2f} MiB", flush=True)
    path = RESULTS / f"pipeline-compile-{hardware['backend']}.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    keep = [r for r in old.get("rows", []) if r["preset"] != args.preset]
    # `hardware` and `date`: this run's; each preset's own run in `hardware_by_preset`.
    record = {"benchmark": "pipeline_compile", "commit": commit(), "hardware": hardware,
              "date": hardware["date"],
              "hardware_by_preset": {**old.get("hardware_by_preset", {}),
                                     args.preset: hardware},
              "compiled_as": "plan (gclab.measure.plan_only_options); compilation cache off",
              "repeats": {**old.get("repeats", {}), args.preset: args.repeats},
              "rows": keep + rows}
    text = json.dumps(record, indent=1) + "\n"
    for out in (path, SHIPPED / path.name):  # chapter 8 reads the shipped copy
        write_text_atomic(out, text)  # whole: a run stopped here leaves the old record
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
