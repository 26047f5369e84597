"""Pipeline stages' memory and time: one remat ratio for all stages against the MILP's choice.

For P stages over a preset's S processor steps with M micro-batches, fits the stage-memory
model of `gclab.sizing.pipeline_plan` from compiled stage programs (shapes only, XLA:CPU),
sets a per-stage budget (a fraction of the largest stage of the even split without
remat), and compares one ratio for all stages (`uniform`) with the MILP's split and
per-stage checkpointed steps: each stage's compiled memory (what one pipeline device holds
running that stage: every tick's incoming state, and the stage's internals during one
tick of the backward pass), the recomputed forward FLOPs per step (every stage once more
under its checkpoint, and the checkpointed steps once more), the bubble, and the
predicted step time with an H100's published speeds. It also compiles the whole training
step of both layouts on P simulated CPU devices, one SPMD program whose per-device
figure is one number for all stages, next to the planner's prediction of it
(`PipelineChoice.predicted_step_bytes`), and runs it: the median wall time of several
steps after a warm-up, next to the time predicted with this CPU's calibrated speed
(`gclab/recordings/planner-calibration-cpu.json`) for P devices of its speed each and for
all P devices' work on the one CPU, which is what the simulated devices do. Writes
`benchmarks/results/pipeline-<backend>.json` and `.md` with the hardware and date, or
`--out FILE.json` and the `.md` beside it; a run adds its rows to an existing record,
replacing only the rows of the (preset, stages) it computed again, so a run of a few stage
counts leaves the others as they were.

    python benchmarks/pipeline_memory.py                  # cpu-8x128, P = 2 and 4, M = 4
    python benchmarks/pipeline_memory.py --preset cpu-4x32 --stages 2 --fraction 0.95 \
        --out /tmp/pipeline.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import jax

MAX_DEVICES = 4
jax.config.update("jax_num_cpu_devices", MAX_DEVICES)

from options import integers, record_to_extend  # noqa: E402  (benchmarks/, beside this script)

from gclab.config import get_preset  # noqa: E402
from gclab.files import write_text_atomic  # noqa: E402
from gclab.geometry.graphs import graphs_for  # noqa: E402
from gclab.measure import machine  # noqa: E402
from gclab.measure.timing import median_seconds  # noqa: E402
from gclab.memory import MemoryConfig  # noqa: E402
from gclab.parallel import ParallelConfig  # noqa: E402
from gclab.sizing import StepSpec, compile_train_step  # noqa: E402
from gclab.sizing.analytical import GraphCounts, stage_flops  # noqa: E402
from gclab.sizing.layout_plan import CARD_SPEEDS, REFERENCE_CARD  # noqa: E402
from gclab.sizing.pipeline_plan import (  # noqa: E402
    StageCosts,
    evaluate,
    even_split,
    fit_stage_costs,
    plan_pipeline,
)
from gclab.sizing.speed import load_calibration  # noqa: E402

RESULTS = Path(__file__).parent / "results"
MiB = 2**20


def hardware() -> dict:
    return machine(simulated_devices=jax.device_count())


def _key(row: dict, preset: str) -> tuple:
    """What a row measures: (preset, stages); rows recorded before rows named their preset
    are of the record's `preset`."""
    return row.get("preset", preset), row["stages"]


def merged(rows: list, old: dict) -> list:
    """`rows` with `old`'s rows whose (preset, stages) this run did not compute, in
    (preset, stages) order: a run of a few stage counts adds to the record instead of
    replacing it. Rows recorded before rows named their preset and date get their file's."""
    preset = old.get("args", {}).get("preset")
    date = old.get("hardware", {}).get("date")
    mine = {_key(r, preset) for r in rows}
    kept = [{"preset": preset, "date": date, **r} for r in old.get("rows", [])
            if _key(r, preset) not in mine]
    return sorted(rows + kept, key=lambda r: (r["preset"], r["stages"]))


def markdown(record: dict) -> str:
    hw, a, cal = record["hardware"], record["args"], record["cpu_calibration"]
    presets = sorted({r.get("preset", a["preset"]) for r in record["rows"]}) or [a["preset"]]
    names = ", ".join(f"`{p}`" for p in presets)
    lines = [f"Pipeline stages of {names} (M = {a['microbatches']} micro-batches of "
             f"{a['microbatch']} sample(s), no other memory technique), compiled on "
             f"{hw['backend']} ({hw['cpu_count']} cores, {hw['simulated_devices']} simulated "
             f"devices), jax {hw['jax']}, {hw['date']}, load average "
             f"{hw['load_average_1min']:.1f} at the start and {record['load_average_1min_end']:.1f}"
             " at the end. Every stage runs under a checkpoint "
             "(GPipe's re-materialisation). Stage memory: each stage's own program "
             "(compiled: every tick's incoming state, the stage's internals during one tick "
             "of the backward pass); SPMD: the whole step compiled on the layout, per device, "
             "and the planner's prediction of it (the largest stage's model plus what the "
             "step holds besides). Budget per stage: "
             f"{a['fraction']:g} x the largest stage of the even split without remat "
             "(predicted); predicted / compiled max: the stage model's largest stage over the "
             "compiled one. Recomputed: every stage's forward once more, and the "
             f"checkpointed steps once more. Predicted step: {record['speeds_of']}'s "
             "published speeds, and this CPU's calibrated speed "
             f"({cal['name']}, {cal['source']}) for P devices of that speed each, or for all "
             "P devices' work on the one CPU. Measured: median of "
             f"{a['repeats']} steps after a warm-up, all P simulated devices sharing "
             f"{hw['cpu_count']} cores: every device computes at every tick (idle ticks "
             "too, their results discarded), so it measures the work of the whole SPMD "
             "program on one CPU, not the step time of P devices. A choice over its "
             "budget is marked *over budget*.", "",
             "| preset | P | choice | budget / stage | steps | checkpointed | memory per stage "
             "(compiled) | predicted / compiled max | recomputed GFLOP / step | bubble | "
             "predicted step (H100) | SPMD per device (compiled / predicted) | predicted "
             "step (CPU, P devices / one CPU) | measured step (simulated devices) |",
             "|---|---:|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in record["rows"]:
        first = f"| {r.get('preset', a['preset'])} | {r['stages']} |"
        for name in ("uniform", "milp"):
            c = r[name]
            if c is None:
                lines.append(f"{first} {name} | {r['budget'] / MiB:.1f} MiB | "
                             "nothing fits | | | | | | | | | |")
                continue
            mem = " / ".join(f"{m / MiB:.1f}" for m in c["compiled"])
            label = "one ratio" if name == "uniform" else "per stage (MILP)"
            # The planner's fallback where nothing fits the budget: shown, but not as a fit.
            if not c.get("fits", True):
                label += " (*over budget*)"
            lines.append(
                f"{first} {label}"
                f" | {r['budget'] / MiB:.1f} MiB | {'/'.join(map(str, c['stage_steps']))} | "
                f"{'/'.join(map(str, c['stage_remat']))} | {mem} MiB | "
                f"{max(c['memory_bytes']) / max(c['compiled']):.2f} | "
                f"{c['recomputed_flops'] / 1e9:.3g} | {c['bubble']:.0%} | "
                f"{c['step_seconds'] * 1e3:.3g} ms | "
                f"{c['spmd_total_bytes'] / MiB:.1f} / {c['predicted_spmd_bytes'] / MiB:.1f} MiB"
                f" | {c['cpu_predicted_seconds']:.2f} / {c['cpu_shared_predicted_seconds']:.2f} s"
                f" | {c['measured_seconds']:.2f} s |")
    return "\n".join(lines) + "\n"


def cpu_costs(costs: StageCosts, flops: dict, seconds_per_flop: float) -> StageCosts:
    """`costs` with this CPU's calibrated speed (no link: simulated devices share memory)."""
    return dataclasses.replace(costs, step_seconds=flops["processor_step"] * seconds_per_flop,
                               encoder_seconds=flops["encoder"] * seconds_per_flop,
                               decoder_seconds=flops["decoder"] * seconds_per_flop,
                               link_seconds=0.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-8x128")
    parser.add_argument("--stages", default="2,4")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--fraction", type=float, default=0.9,
                        help="per-stage budget: this fraction of the largest stage of the "
                        "even split without remat")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per choice")
    parser.add_argument("--out", type=Path, default=None,
                        help="the record to write (default benchmarks/results/"
                             "pipeline-<backend>.json); the .md goes beside it")
    args = parser.parse_args(argv)
    # Every option is checked before anything compiles: a bad one costs nothing.
    try:
        preset = get_preset(args.preset)
    except ValueError as e:
        parser.error(f"--preset: {e}")
    top = min(MAX_DEVICES, preset.model.processor_steps)
    stages = integers(parser, "--stages", args.stages, 2, top, "stage counts",
                      f"{MAX_DEVICES} simulated devices, {preset.model.processor_steps} "
                      f"processor steps in {args.preset}")
    if not 0 < args.fraction <= 1:
        parser.error(f"--fraction {args.fraction:g}: must be > 0 and <= 1")
    for name in ("microbatches", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: must be at least 1")
    out = args.out or RESULTS / f"pipeline-{jax.default_backend()}.json"
    old = record_to_extend(parser, out, (out, out.with_suffix(".md")), "a pipeline record")
    model, task = preset.model, preset.task
    memory, M, b = MemoryConfig(), args.microbatches, 1
    speed = CARD_SPEEDS[REFERENCE_CARD]
    calibration = load_calibration("cpu")
    graphs = graphs_for(model)
    hw = hardware()
    counts = GraphCounts.for_model(model, graphs.grid2mesh.num_edges)
    flops = stage_flops(model, task, counts, b)
    rows = []
    for P in stages:
        costs = fit_stage_costs(model, task, memory, M, b, speed.f32_flops,
                                speed.link_bytes_per_s, graphs, P)
        on_cpu = cpu_costs(costs, flops, calibration.seconds_per_flop)
        split = even_split(model.processor_steps, P)
        plain = evaluate(costs, split, (0,) * P, M, float("inf"))
        budget = args.fraction * max(plain.memory_bytes)
        layout = ParallelConfig(pipeline=P, microbatches=M)
        choice = plan_pipeline(model, task, memory, layout, M * b, budget, speed.f32_flops,
                               speed.link_bytes_per_s, graphs, costs=costs)
        row = {"preset": args.preset, "date": hw["date"], "stages": P, "budget": budget,
               "costs": choice.costs.__dict__, "extra_bytes": choice.extra_bytes}
        for name, c, compiled in (("uniform", choice.uniform, choice.compiled_uniform),
                                  ("milp", choice.milp, choice.compiled_milp)):
            if c is None:
                row[name] = None
                continue
            lay = layout.replace(stage_steps=c.stage_steps, stage_remat=c.stage_remat)
            spec = StepSpec(model, task, memory, batch=M * b, parallel=lay)
            spmd = compile_train_step(spec, graphs)
            live = compile_train_step(spec, graphs, live=True)
            measured = median_seconds(live.run, repeats=args.repeats, warmup=1)
            held = calibration.seconds_per_held_byte * spmd.memory.temp_bytes
            ticks = M + P - 1
            work = sum(on_cpu.seconds(s, P, k, n)
                       for s, (k, n) in enumerate(zip(c.stage_steps, c.stage_remat)))
            row[name] = {**c.to_dict(), "compiled": list(compiled),
                         "recomputed_flops": M * (flops["forward"]
                                                  + c.recomputed_steps
                                                  * flops["processor_step"]),
                         "spmd_total_bytes": spmd.memory.total_bytes,
                         "spmd_collective_bytes": spmd.memory.collective_bytes,
                         "predicted_spmd_bytes": choice.predicted_step_bytes(c),
                         "cpu_predicted_seconds": evaluate(on_cpu, c.stage_steps,
                                                           c.stage_remat, M,
                                                           float("inf")).step_seconds
                         + held + calibration.overhead_seconds,
                         "cpu_shared_predicted_seconds": ticks * work + P * held
                         + calibration.overhead_seconds,
                         "measured_seconds": measured,
                         "parallel": lay.spec}
            print(json.dumps({"stages": P, "choice": name, "measured_seconds": measured,
                              "spmd_MiB": spmd.memory.total_bytes / MiB}), flush=True)
        rows.append(row)
    record = {"hardware": hw, "load_average_1min_end": round(os.getloadavg()[0], 2),
              "speeds_of": REFERENCE_CARD,
              "cpu_calibration": calibration.to_dict(),
              "args": {**vars(args), "out": str(out), "microbatch": b},
              "rows": merged(rows, old)}
    write_text_atomic(out, json.dumps(record, indent=2) + "\n")
    write_text_atomic(out.with_suffix(".md"), markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
