"""What XLA:CPU's concurrency-optimised scheduler costs in compiled memory, and buys in time.

XLA:CPU orders each program's instructions with a scheduler that keeps independent work
apart so that it can run at once (``--xla_cpu_enable_concurrency_optimized_scheduler``, on
by default); the order decides which buffers are alive together, and so the compiled temp.
The option is read when JAX's CPU client starts (given per compile, in the compiler options,
it leaves the plan as it was), so each setting runs in a fresh process with it in
``XLA_FLAGS``, JAX's compilation cache off. For every recipe and precision, one training
step of the preset is compiled from shapes as a plan is (`gclab.measure.plan_only_options`);
with ``--timed``, those recipes are also compiled to run (XLA's default options) and timed:
the median of ``--repeats`` steps after one untimed in each process, and the median of
``--rounds`` such processes per setting, the settings alternating. Writes
``benchmarks/results/cpu-scheduler-cpu.json`` and the copy the appendix reads,
``gclab/recordings/cpu-scheduler-cpu.json``. The option off is what gclab's switch
`gclab.memory.use_cpu_scheduler("depth-first")` (``--cpu-scheduler depth-first``) sets.

    python benchmarks/cpu_scheduler.py                      # cpu-8x128, every recipe, both
    python benchmarks/cpu_scheduler.py --preset cpu-4x32 --recipes none --timed none
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from children import child_env  # noqa: E402
from fresh_clone import ROOT, commit  # noqa: E402
from options import child_output, named  # noqa: E402

from gclab.files import OutputPathError, check_output_path, write_text_atomic  # noqa: E402
from gclab.memory.schedule import CPU_SCHEDULER_FLAG, cpu_scheduler_flags  # noqa: E402

NAME = "cpu-scheduler-cpu"
OUTPUTS = (ROOT / "benchmarks" / "results" / f"{NAME}.json",
           ROOT / "gclab" / "recordings" / f"{NAME}.json")  # the appendix reads this copy
FLAG = CPU_SCHEDULER_FLAG
# The record's names for the option's two values, and gclab's for the order each gives.
SETTINGS = {"concurrency-optimized": "breadth-first", "off": "depth-first"}  # XLA's default first

# Runs in a fresh process whose XLA_FLAGS name the setting: one JSON line per step.
_CHILD = r"""
import json, sys
from gclab.config import get_preset
from gclab.measure import median_seconds
from gclab.memory import get_recipe
from gclab.sizing import StepSpec, compile_train_step
preset, recipes, precisions, timed, repeats, plans = (
    sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","),
    set(filter(None, sys.argv[4].split(","))), int(sys.argv[5]), sys.argv[6] == "plans")
p = get_preset(preset)
for precision in precisions:
    for recipe in recipes:
        spec = StepSpec(p.model, p.task, get_recipe(recipe, precision))
        row = {"recipe": recipe, "precision": precision}
        if plans:  # the first round's; a later one only times
            plan = compile_train_step(spec)
            row.update(temp_bytes=plan.memory.temp_bytes, total_bytes=plan.memory.total_bytes,
                       compile_seconds=plan.memory.compile_seconds)
        if recipe in timed:
            live = compile_train_step(spec, live=True)
            row["live_temp_bytes"] = live.memory.temp_bytes
            row["step_seconds"] = median_seconds(live.run, repeats)
        print(json.dumps(row), flush=True)
"""


def run(setting: str, preset: str, recipes: list[str], precisions: list[str],
        timed: list[str], repeats: int, plans: bool = True) -> list[dict]:
    """The rows of one setting, from a fresh process: each step's plan where `plans`, and
    the step times of `timed`."""
    flags = cpu_scheduler_flags(SETTINGS[setting], os.environ.get("XLA_FLAGS", ""))
    env = child_env(XLA_FLAGS=flags,  # the caller's other flags stay
                    JAX_ENABLE_COMPILATION_CACHE="false", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _CHILD, preset, ",".join(recipes),
                          ",".join(precisions), ",".join(timed), str(repeats),
                          "plans" if plans else "times"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    stdout = child_output(out, "cpu_scheduler.py", f"scheduler {setting}")
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _names(parser: argparse.ArgumentParser, option: str, text: str, allowed,
           empty: bool = False) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    wrong = [n for n in names if n not in allowed]
    if wrong or (not names and not empty):
        parser.error(f"{option} {text!r} is invalid: comma-separated names of "
                     f"{', '.join(allowed)}")
    return names


def main(argv: list[str] | None = None) -> int:
    from gclab.config import get_preset
    from gclab.memory.config import PRECISIONS, RECIPES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-8x128")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--timed", default="none,lean",
                        help="recipes also compiled to run and timed, in each precision "
                             "(empty: none)")
    parser.add_argument("--repeats", type=int, default=7, help="timed steps per process")
    parser.add_argument("--rounds", type=int, default=3,
                        help="processes per setting for the timed recipes, alternating")
    parser.add_argument("--out", type=Path, default=OUTPUTS[0],
                        help=f"the record (default benchmarks/results/{NAME}.json, copied "
                             "into gclab/recordings)")
    args = parser.parse_args(argv)
    named(parser, "--preset", args.preset, get_preset)
    recipes = _names(parser, "--recipes", args.recipes, RECIPES)
    precisions = _names(parser, "--precisions", args.precisions, PRECISIONS)
    timed = _names(parser, "--timed", args.timed, recipes, empty=True)
    for option, value in (("--repeats", args.repeats), ("--rounds", args.rounds)):
        if value < 1:
            parser.error(f"{option} {value} is invalid: an integer >= 1")
    outputs = (args.out, OUTPUTS[1]) if args.out == OUTPUTS[0] else (args.out,)
    try:  # before any child: a run must not end by failing to write its record
        for out in outputs:
            check_output_path(out, (".json",))
    except OutputPathError as e:
        parser.error(f"--out: {e}")

    from gclab.measure import machine

    hardware = machine()
    rows, times = [], {}
    # Round 1 plans every step and times `timed`; later rounds time `timed` again, the
    # settings alternating, so that a slow spell of a shared machine hits both.
    for round_ in range(args.rounds if timed else 1):
        for setting in SETTINGS:
            for row in run(setting, args.preset, timed if round_ else recipes, precisions,
                           timed, args.repeats, plans=not round_):
                key = setting, row["precision"], row["recipe"]
                if "step_seconds" in row:
                    times.setdefault(key, []).append(round(row["step_seconds"], 4))
                if not round_:
                    rows.append({"scheduler": setting, **row})
                plan = (f"temp {row['temp_bytes'] / 2**20:9.2f} MiB  compile "
                        f"{row['compile_seconds']:5.1f} s" if not round_ else "")
                took = f"  step {row['step_seconds']:.3f} s" if "step_seconds" in row else ""
                print(f"{round_ + 1} {setting:22s} {row['precision']:4s} {row['recipe']:9s} "
                      f"{plan}{took}", flush=True)
    for row in rows:  # the median of the rounds, and every round's
        runs = times.get((row["scheduler"], row["precision"], row["recipe"]))
        if runs:
            row.update(step_seconds=statistics.median(runs), step_seconds_rounds=runs)
    record = {"benchmark": "cpu_scheduler", "commit": commit(), "hardware": hardware,
              "date": hardware["date"], "preset": args.preset, "flag": FLAG,
              "compiled_as": "plan (gclab.measure.plan_only_options), and with --timed to "
                             "run (XLA's default options); compilation cache off",
              "repeats": args.repeats, "rounds": args.rounds, "rows": rows}
    text = json.dumps(record, indent=1) + "\n"
    for out in outputs:
        write_text_atomic(out, text)  # whole: a run stopped before here leaves the old one
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
