"""Pipeline stages' memory: one remat ratio for all stages against the MILP's per-stage choice.

For P stages over a preset's S processor steps with M micro-batches, fits the stage-memory
model of `gclab.sizing.pipeline_plan` from compiled stage programs (shapes only, XLA:CPU),
sets a per-stage budget (a fraction of the largest stage of the even split without
remat), and compares one ratio for all stages (`uniform`) with the MILP's split and
per-stage checkpointed steps: each stage's compiled memory (its own GPipe program: forward
and backward of its M micro-batches, whole parameters and gradients), the recomputed
forward FLOPs per step, the bubble, and the predicted step time with an H100's published
speeds. It also compiles the whole training step of both layouts on P simulated CPU
devices: in the SPMD program every device runs the same code, so its per-device figure
is one number for all stages. Simulated devices share the CPU's cores, so no step time
is measured. Writes `benchmarks/results/pipeline-<backend>.json` and `.md` with the
hardware and date.

    python benchmarks/pipeline_memory.py                  # cpu-8x128, P = 2 and 4, M = 4
    python benchmarks/pipeline_memory.py --preset cpu-4x32 --stages 2 --fraction 0.6
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax

MAX_DEVICES = 4
jax.config.update("jax_num_cpu_devices", MAX_DEVICES)

from gclab.config import get_preset  # noqa: E402
from gclab.geometry.graphs import graphs_for  # noqa: E402
from gclab.measure import machine  # noqa: E402
from gclab.memory import MemoryConfig  # noqa: E402
from gclab.parallel import ParallelConfig  # noqa: E402
from gclab.sizing import StepSpec, compile_train_step  # noqa: E402
from gclab.sizing.analytical import GraphCounts, stage_flops  # noqa: E402
from gclab.sizing.layout_plan import CARD_SPEEDS, REFERENCE_CARD  # noqa: E402
from gclab.sizing.pipeline_plan import (  # noqa: E402
    evaluate,
    even_split,
    fit_stage_costs,
    plan_pipeline,
)

RESULTS = Path(__file__).parent / "results"
MiB = 2**20


def hardware() -> dict:
    return machine(simulated_devices=jax.device_count())


def markdown(record: dict) -> str:
    hw, a = record["hardware"], record["args"]
    lines = [f"Pipeline stages of `{a['preset']}` (M = {a['microbatches']} micro-batches of "
             f"{a['microbatch']} sample(s), no other memory technique), compiled on "
             f"{hw['backend']} ({hw['cpu_count']} cores, {hw['simulated_devices']} simulated "
             f"devices), jax {hw['jax']}, {hw['date']}. Stage memory: each stage's own "
             "program (compiled); SPMD: the whole step compiled on the layout, per device. "
             f"Predicted times use {record['speeds_of']}'s published speeds. Budget per "
             f"stage: {a['fraction']:g} x the largest stage of the even split without remat "
             "(predicted); predicted / compiled max: the stage model's largest stage over the "
             "compiled one.", "",
             "| P | choice | budget / stage | steps | checkpointed | memory per stage "
             "(compiled) | predicted / compiled max | recomputed GFLOP / step | bubble | "
             "predicted step | SPMD per device |",
             "|---:|---|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for r in record["rows"]:
        for name in ("uniform", "milp"):
            c = r[name]
            if c is None:
                lines.append(f"| {r['stages']} | {name} | {r['budget'] / MiB:.1f} MiB | "
                             "nothing fits | | | | | | | |")
                continue
            mem = " / ".join(f"{m / MiB:.1f}" for m in c["compiled"])
            lines.append(
                f"| {r['stages']} | {'one ratio' if name == 'uniform' else 'per stage (MILP)'}"
                f" | {r['budget'] / MiB:.1f} MiB | {'/'.join(map(str, c['stage_steps']))} | "
                f"{'/'.join(map(str, c['stage_remat']))} | {mem} MiB | "
                f"{max(c['memory_bytes']) / max(c['compiled']):.2f} | "
                f"{c['recomputed_flops'] / 1e9:.3g} | {c['bubble']:.0%} | "
                f"{c['step_seconds'] * 1e3:.3g} ms | "
                f"{c['spmd_total_bytes'] / MiB:.1f} MiB |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-8x128")
    parser.add_argument("--stages", default="2,4")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--fraction", type=float, default=0.7,
                        help="per-stage budget: this fraction of the largest stage of the "
                        "even split without remat")
    args = parser.parse_args()
    preset = get_preset(args.preset)
    model, task = preset.model, preset.task
    memory, M, b = MemoryConfig(), args.microbatches, 1
    speed = CARD_SPEEDS[REFERENCE_CARD]
    graphs = graphs_for(model)
    costs = fit_stage_costs(model, task, memory, M, b, speed.f32_flops,
                            speed.link_bytes_per_s, graphs)
    counts = GraphCounts.for_model(model, graphs.grid2mesh.num_edges)
    step_flops = stage_flops(model, task, counts, b)["processor_step"]
    hw, rows = hardware(), []
    for P in (int(p) for p in args.stages.split(",")):
        split = even_split(model.processor_steps, P)
        plain = evaluate(costs, split, (0,) * P, M, float("inf"))
        budget = args.fraction * max(plain.memory_bytes)
        layout = ParallelConfig(pipeline=P, microbatches=M)
        choice = plan_pipeline(model, task, memory, layout, M * b, budget, speed.f32_flops,
                               speed.link_bytes_per_s, graphs, costs=costs)
        row = {"stages": P, "budget": budget, "costs": choice.costs.__dict__}
        for name, c, compiled in (("uniform", choice.uniform, choice.compiled_uniform),
                                  ("milp", choice.milp, choice.compiled_milp)):
            if c is None:
                row[name] = None
                continue
            lay = layout.replace(stage_steps=c.stage_steps, stage_remat=c.stage_remat)
            spmd = compile_train_step(StepSpec(model, task, memory, batch=M * b, parallel=lay),
                                      graphs)
            row[name] = {**c.to_dict(), "compiled": list(compiled),
                         "recomputed_flops": c.recomputed_steps * step_flops * M,
                         "spmd_total_bytes": spmd.memory.total_bytes,
                         "spmd_collective_bytes": spmd.memory.collective_bytes,
                         "parallel": lay.spec}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("stages", "budget")}), flush=True)
    record = {"hardware": hw, "speeds_of": REFERENCE_CARD,
              "args": {**vars(args), "microbatch": b}, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"pipeline-{hw['backend']}.json"
    for path, text in ((out, json.dumps(record, indent=2) + "\n"),
                       (out.with_suffix(".md"), markdown(record))):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    print(markdown(record))


if __name__ == "__main__":
    main()
