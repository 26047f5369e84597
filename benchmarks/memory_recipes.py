"""Memory of one training step for every recipe x precision at the presets.

Compiles one full training step (loss + gradients + AdamW update, batch 1, one target
step) from shapes alone and records XLA's compiled memory analysis; then the rollout and
step-time targets. Writes `benchmarks/results/memory-<backend>.json` and
`benchmarks/results/memory-<backend>.md` (the table the README shows), each naming the
hardware and date.

    python benchmarks/memory_recipes.py            # everything (about 10 minutes on 2 cores)
    python benchmarks/memory_recipes.py --quick    # 4 deg presets only

Targets (GRAPHCAST.md figures are the official code's, XLA:CPU, compiled temp):
  * graphcast-small, f32: `none` <= 42.8 GiB; `deepmind` <= none / 8; `lean` <= none / 15.
  * graphcast (0.25 deg, 37 levels), f32: `lean` <= 16 GiB of temp.
  * rollout with remat, 4 deg / 3 splits, 16 x 512: temp(T=12) <= 1.5 x temp(T=1).
  * time: 4 deg / 3 splits, 16 x 512: `deepmind` step time <= 1.4 x `none` (median).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax

from gclab import __version__
from gclab.config import get_preset
from gclab.files import write_text_atomic
from gclab.measure import format_bytes
from gclab.memory import RECIPES, get_recipe
from gclab.sizing import StepSpec, make_live_step, train_step_memory

GIB = 2**30
RESULTS = Path(__file__).parent / "results"
OFFICIAL_GIB = {("graphcast-small", "f32"): 42.8, ("graphcast-small", "bf16"): 30.0,
                ("graphcast", "bf16"): 230.8}


def hardware() -> dict:
    dev = jax.devices()[0]
    return {"backend": jax.default_backend(), "device": dev.device_kind,
            "platform": platform.platform(), "processor": platform.processor(),
            "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
            "jax": jax.__version__, "gclab": __version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def recipe_table(presets, precisions) -> list:
    rows = []
    for preset_name in presets:
        preset = get_preset(preset_name)
        for precision in precisions:
            for recipe in RECIPES:
                spec = StepSpec(preset.model, preset.task, get_recipe(recipe, precision))
                m = train_step_memory(spec)
                row = {"preset": preset_name, "precision": precision, "recipe": recipe,
                       **m.to_dict()}
                rows.append(row)
                print(f"{preset_name:<16} {precision:<5} {recipe:<9} temp "
                      f"{format_bytes(m.temp_bytes):>11}  compile {m.compile_seconds:5.1f} s",
                      flush=True)
    return rows


def rollout_rows(preset_name: str, lengths=(1, 2, 4, 8, 12)) -> list:
    preset = get_preset(preset_name)
    rows = []
    for remat in (False, True):
        for t in lengths:
            mem = get_recipe("per-step").replace(rollout_remat=remat)
            m = train_step_memory(StepSpec(preset.model, preset.task, mem, rollout=t))
            rows.append({"preset": preset_name, "rollout": t, "rollout_remat": remat,
                         "temp_bytes": m.temp_bytes, "compile_seconds": m.compile_seconds})
            print(f"rollout T={t:<2} remat={remat!s:<5} temp {format_bytes(m.temp_bytes)}",
                  flush=True)
    return rows


def step_times(preset_name: str, recipes=("none", "deepmind", "lean"), repeats=7) -> dict:
    """Median wall time of a jitted training step per recipe, interleaved in one run."""
    preset = get_preset(preset_name)
    steps = {r: make_live_step(StepSpec(preset.model, preset.task, get_recipe(r)))
             for r in recipes}
    times = {r: [] for r in recipes}
    for _ in range(repeats):
        for r, run in steps.items():
            t0 = time.perf_counter()
            run()
            times[r].append(time.perf_counter() - t0)
    medians = {r: statistics.median(v) for r, v in times.items()}
    print("step time medians:", {r: f"{v * 1e3:.0f} ms" for r, v in medians.items()}, flush=True)
    return {"preset": preset_name, "repeats": repeats, "median_seconds": medians,
            "all_seconds": times}


def targets(rows, rollouts, timing) -> list:
    def temp(preset, precision, recipe):
        for r in rows:
            if (r["preset"], r["precision"], r["recipe"]) == (preset, precision, recipe):
                return r["temp_bytes"]
        return None

    out = []

    def add(name, value, limit, unit="GiB"):
        if value is None:
            return
        out.append({"target": name, "value": value, "limit": limit, "unit": unit,
                    "met": value <= limit})

    none_small = temp("graphcast-small", "f32", "none")
    if none_small is not None:
        add("graphcast-small f32 none <= official 42.8 GiB", none_small / GIB, 42.8)
        add("graphcast-small f32 deepmind <= none / 8",
            temp("graphcast-small", "f32", "deepmind") / GIB, none_small / GIB / 8)
        add("graphcast-small f32 lean <= none / 15",
            temp("graphcast-small", "f32", "lean") / GIB, none_small / GIB / 15)
    lean_full = temp("graphcast", "f32", "lean")
    if lean_full is not None:
        add("graphcast (0.25 deg, 37 levels) f32 lean <= 16 GiB", lean_full / GIB, 16.0)
    if rollouts:
        by = {(r["rollout"], r["rollout_remat"]): r["temp_bytes"] for r in rollouts}
        add("rollout remat: temp(T=12) <= 1.5 x temp(T=1)", by[(12, True)] / by[(1, True)], 1.5,
            "ratio")
    if timing:
        med = timing["median_seconds"]
        add("deepmind step time <= 1.4 x none", med["deepmind"] / med["none"], 1.4, "ratio")
    return out


def markdown(hw, rows, rollouts, timing, checks) -> str:
    lines = [f"# Compiled memory of one training step ({hw['backend']})", "",
             f"Hardware: {hw['device']} ({hw['platform']}, {hw['cpu_count']} cores); "
             f"jax {hw['jax']}; gclab {hw['gclab']}; {hw['date']}.",
             "XLA compiled memory analysis of one training step (loss + gradients + AdamW "
             "update), batch 1, one target step. On XLA:CPU bfloat16 does not halve temp "
             "(the CPU compiler computes in float32).", "",
             "| preset | precision | recipe | temp | total | official code |",
             "|---|---|---|---:|---:|---:|"]
    for r in rows:
        official = (OFFICIAL_GIB.get((r["preset"], r["precision"]))
                    if r["recipe"] == "none" else None)
        lines.append(f"| {r['preset']} | {r['precision']} | {r['recipe']} | "
                     f"{format_bytes(r['temp_bytes'])} | {format_bytes(r['total_bytes'])} | "
                     f"{f'{official} GiB' if official else ''} |")
    if rollouts:
        lines += ["", "Rollout (per-step remat in the processor), temp by rollout length T:", "",
                  "| T | without rollout remat | with rollout remat |", "|---:|---:|---:|"]
        by = {(r["rollout"], r["rollout_remat"]): r["temp_bytes"] for r in rollouts}
        for t in sorted({r["rollout"] for r in rollouts}):
            lines.append(f"| {t} | {format_bytes(by[(t, False)])} | "
                         f"{format_bytes(by[(t, True)])} |")
    if timing:
        lines += ["", f"Step time ({timing['preset']}, median of {timing['repeats']} "
                  "interleaved runs): " + ", ".join(
                      f"{r} {v * 1e3:.0f} ms" for r, v in timing["median_seconds"].items())]
    lines += ["", "| target | value | limit | met |", "|---|---:|---:|---|"]
    for c in checks:
        lines.append(f"| {c['target']} | {c['value']:.2f} {c['unit']} | "
                     f"{c['limit']:.2f} {c['unit']} | {'yes' if c['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 deg presets only")
    args = parser.parse_args()
    hw = hardware()
    presets = ["cpu-16x512"] if args.quick else ["cpu-16x512", "graphcast-small", "graphcast"]
    rows = recipe_table(presets, ["f32", "bf16"])
    rollouts = rollout_rows("cpu-16x512")
    timing = step_times("cpu-16x512")
    checks = targets(rows, rollouts, timing)
    RESULTS.mkdir(parents=True, exist_ok=True)
    backend = hw["backend"]
    record = {"hardware": hw, "recipes": rows, "rollout": rollouts, "step_time": timing,
              "targets": checks}
    write_text_atomic(RESULTS / f"memory-{backend}.json", json.dumps(record, indent=1))
    write_text_atomic(RESULTS / f"memory-{backend}.md",
                      markdown(hw, rows, rollouts, timing, checks))
    print(markdown(hw, rows, rollouts, timing, checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
