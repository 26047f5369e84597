"""Memory of one training step for every recipe x precision at the presets.

Compiles one full training step (loss + gradients + AdamW update, batch 1, one target
step) from shapes alone and records XLA's compiled memory analysis; then the rollout and
step-time targets. Writes `benchmarks/results/memory-<backend>.json` and
`benchmarks/results/memory-<backend>.md` (the table the README shows), each naming the
hardware and date. `--quick` writes `memory-<backend>-quick.json` and `.md` instead: the
recording the chapters read keeps every preset.

    python benchmarks/memory_recipes.py            # everything (about 10 minutes on 2 cores)
    python benchmarks/memory_recipes.py --quick    # 4 deg presets only, its own file
    python benchmarks/memory_recipes.py --only bf16  # re-measure the bf16 rows only

Targets (GRAPHCAST.md figures are the official code's, XLA:CPU, compiled temp):
  * graphcast-small, f32: `none` <= 42.8 GiB; `deepmind` <= none / 8; `lean` <= none / 15.
  * graphcast (0.25 deg, 37 levels), f32: `lean` <= 16 GiB of temp.
  * rollout with remat, 4 deg / 3 splits, 16 x 512: temp(T=12) <= 1.5 x temp(T=1).
  * time: 4 deg / 3 splits, 16 x 512: `deepmind` step time <= 1.4 x `none` (median).
  * bfloat16: `none` <= the official code's 30.0 GiB (graphcast-small) and 230.8 GiB
    (graphcast); every recipe's bfloat16 temp <= 0.8 x its float32 temp; and the authors'
    claim, `deepmind` at 0.25 deg in 32 GiB (compiled total: arguments + outputs + temp).

The bfloat16 error against float32 of the two LayerNorm rules (gclab's float32 statistics,
and Haiku's LayerNorm computed in bfloat16 as the official code does) is recorded too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
from children import child_env

from gclab import model
from gclab.config import get_preset
from gclab.files import write_text_atomic
from gclab.measure import format_bytes, machine
from gclab.memory import RECIPES, get_recipe
from gclab.model import layers as model_layers
from gclab.sizing import StepMemory, StepSpec, make_live_step, train_step_memory

GIB = 2**30
RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]
# Chapters read the recording from the installed package (`gclab.recordings`).
SHIPPED = ROOT / "gclab" / "recordings" / "memory-cpu.json"
OFFICIAL_GIB = {("graphcast-small", "f32"): 42.8, ("graphcast-small", "bf16"): 30.0,
                ("graphcast", "bf16"): 230.8}
BF16_FRACTION = 0.8  # every recipe's bfloat16 temp <= this x its float32 temp
TPU_V4_GIB = 32.0  # the authors trained the 0.25 deg model in 32 GB per TPU v4 chip
GCLAB_LAYER_NORM = model.layer_norm


def hardware() -> dict:
    return machine()


def recipe_row(preset_name: str, precision: str, recipe: str) -> dict:
    """One training step's compiled memory (a row of the recipe table), printed as it ends."""
    preset = get_preset(preset_name)
    m = train_step_memory(StepSpec(preset.model, preset.task, get_recipe(recipe, precision)))
    print(f"{preset_name:<16} {precision:<5} {recipe:<9} temp "
          f"{format_bytes(m.temp_bytes):>11}  compile {m.compile_seconds:5.1f} s", flush=True)
    return {"preset": preset_name, "precision": precision, "recipe": recipe, **m.to_dict()}


def recipe_table(presets, precisions) -> list:
    return [recipe_row(preset_name, precision, recipe) for preset_name in presets
            for precision in precisions for recipe in RECIPES]


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


def haiku_layer_norm(x, scale, offset):
    """Haiku's `LayerNorm` as the official code runs it under bfloat16: in the input's dtype."""
    if x.dtype == jnp.float32:
        return GCLAB_LAYER_NORM(x, scale, offset)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    inv = scale.astype(x.dtype) * jax.lax.rsqrt(var + jnp.asarray(model_layers.LAYER_NORM_EPS,
                                                                   var.dtype))
    return inv * (x - mean) + offset.astype(x.dtype)


def layer_norm_errors(preset_name: str = "cpu-4x32", recipes=("none", "deepmind")) -> list:
    """bfloat16 against float32 (outputs, loss gradients) under each LayerNorm rule.

    Random parameters (biases and norms away from their initial values), inputs and
    targets; relative L2 errors of the outputs and of the whole gradient, the worst
    parameter's, and the gradient's cosine with the float32 one.
    """
    from gclab.geometry import graphs_for
    from gclab.model import graph_inputs, make_network

    preset = get_preset(preset_name)
    graph = graph_inputs(graphs_for(preset.model))
    c, o = preset.task.data_channels, preset.task.output_channels
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    inputs = jax.random.normal(keys[0], (graph.grid_nodes.shape[0], 1, c))
    targets = jax.random.normal(keys[1], (graph.grid_nodes.shape[0], 1, o))
    params = make_network(preset.model, c, o).init(keys[2], graph, inputs)
    leaves, tree = jax.tree_util.tree_flatten(params)
    params = jax.tree_util.tree_unflatten(tree, [
        a + 0.2 * jax.random.normal(k, a.shape)
        for a, k in zip(leaves, jax.random.split(keys[3], len(leaves)))])

    def run(recipe, precision):
        net = make_network(preset.model, c, o, get_recipe(recipe, precision))

        def loss(p):
            out = net.apply(p, graph, inputs)
            return jnp.mean((out - targets) ** 2), out

        (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        return out, jax.tree_util.tree_leaves(grads)

    rows = []
    rules = {"float32 statistics (gclab)": GCLAB_LAYER_NORM,
             "bfloat16, as Haiku (official code)": haiku_layer_norm}
    for recipe in recipes:
        out32, g32 = run(recipe, "f32")
        flat32 = jnp.concatenate([g.ravel() for g in g32])
        for rule, fn in rules.items():
            # The network's MLPs call `layers.layer_norm` (the package re-exports it too).
            with mock.patch.object(model_layers, "layer_norm", fn):
                out16, g16 = run(recipe, "bf16")
            flat16 = jnp.concatenate([g.ravel() for g in g16])
            worst = max(float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
                        for a, b in zip(g16, g32)
                        if float(jnp.linalg.norm(b)) > 1e-3 * float(jnp.linalg.norm(flat32)))
            row = {"preset": preset_name, "recipe": recipe, "layer_norm": rule,
                   "output_rel": float(jnp.linalg.norm(out16 - out32) / jnp.linalg.norm(out32)),
                   "grad_rel": float(jnp.linalg.norm(flat16 - flat32) / jnp.linalg.norm(flat32)),
                   "worst_param_grad_rel": worst,
                   "grad_cosine": float(flat16 @ flat32 / (jnp.linalg.norm(flat16)
                                                           * jnp.linalg.norm(flat32)))}
            rows.append(row)
            print(f"layer norm {rule:<36} {recipe:<9} output {row['output_rel']:.4f} "
                  f"gradient {row['grad_rel']:.4f}", flush=True)
    return rows


# From the authors' recipe towards 32 GiB (bfloat16, 0.25 deg): each row names what it
# changes from `deepmind`. `haiku-layer-norm` is a numerics choice, not a gclab switch:
# LayerNorm computed in bfloat16, as the official code runs Haiku's.
#: XLA:CPU orders a program's instructions for concurrency by default, which keeps more
#: buffers live at once; this flag has it order them with XLA's memory-minimising
#: heuristics instead: lower for this step, not for every program (`deepmind` in float32
#: at graphcast-small: 10.47 -> 11.77 GiB of temp, XLA:CPU, jax 0.10.2, 2 cores).
#: XLA:CPU reads it from XLA_FLAGS when JAX starts (as a per-compile option it is taken
#: and ignored), so its row is compiled in a fresh process.
MEMORY_FIRST_OPTION = "--xla_cpu_enable_concurrency_optimized_scheduler"
MEMORY_FIRST_FLAG = f"{MEMORY_FIRST_OPTION}=false"
CLAIM_LADDER = (
    ("deepmind", "the authors' recipe as described", {}),
    ("haiku-layer-norm", "deepmind, LayerNorm in bfloat16 (the official numerics)", "haiku"),
    ("memory-first-schedule", "deepmind, XLA:CPU ordering the program for memory instead of "
     f"concurrency ({MEMORY_FIRST_FLAG}; XLA:CPU only)", "schedule"),
    ("stream-grid-nodes", "deepmind + grid nodes streamed through the edge blocks",
     {"stream_grid_nodes": True}),
    ("processor-edge-blocks", "deepmind + streamed grid nodes + processor edges in blocks",
     {"stream_grid_nodes": True, "processor_edge_blocks": True}),
    ("lean", "gclab's lean recipe (nested remat 4, blocks of 8192, gather after matmul)",
     "lean"),
)


def memory_with_flags(spec: StepSpec, flags: str) -> StepMemory:
    """`train_step_memory(spec)` in a fresh process whose ``XLA_FLAGS`` end with `flags`
    (flags XLA reads once, when JAX starts)."""
    code = ("import json, sys\n"
            "from gclab.sizing import StepSpec, train_step_memory\n"
            "spec = StepSpec.from_json(json.loads(sys.argv[1]))\n"
            "print(json.dumps(train_step_memory(spec).to_dict()))\n")
    env = child_env(XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip())
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec.to_json())], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the step compiled with {flags} failed: {proc.stderr[-2000:]}")
    return StepMemory(**json.loads(proc.stdout.strip().splitlines()[-1]))


def authors_claim(preset_name: str = "graphcast", top: int = 12) -> dict:
    """`deepmind` in bfloat16 against the authors' 32 GB: what holds memory, what frees it.

    Compiled total (arguments + outputs + temp) of one training step for each change of
    `CLAIM_LADDER`, and the largest buffers live at the peak of `deepmind` (XLA's buffer
    assignment, `gclab.measure.Timeline.peak_table`), with how many of the peak's bytes
    are float32 although the step computes in bfloat16.
    """
    from gclab.sizing.step import train_step_timeline

    preset = get_preset(preset_name)
    deepmind = get_recipe("deepmind", "bf16")
    rows = []
    for name, change, fields in CLAIM_LADDER:
        if fields == "schedule":  # a flag of XLA:CPU's: no row on another backend
            if jax.default_backend() == "cpu":
                m = memory_with_flags(StepSpec(preset.model, preset.task, deepmind),
                                      MEMORY_FIRST_FLAG)
                rows.append({"step": name, "change": change, **m.to_dict(),
                             "fits_tpu_v4": m.total_bytes <= TPU_V4_GIB * GIB})
                print(f"claim {name:<22} total {format_bytes(m.total_bytes):>11}", flush=True)
            continue
        if fields == "lean":
            mem, patch = get_recipe("lean", "bf16"), None
        elif fields == "haiku":
            mem, patch = deepmind, haiku_layer_norm
        else:
            mem, patch = deepmind.replace(**fields), None
        spec = StepSpec(preset.model, preset.task, mem)
        if patch is None:
            m = train_step_memory(spec)
        else:
            with mock.patch.object(model_layers, "layer_norm", patch):
                m = train_step_memory(spec)
        rows.append({"step": name, "change": change, **m.to_dict(),
                     "fits_tpu_v4": m.total_bytes <= TPU_V4_GIB * GIB})
        print(f"claim {name:<22} total {format_bytes(m.total_bytes):>11}", flush=True)
    timeline = train_step_timeline(StepSpec(preset.model, preset.task, deepmind))
    table = timeline.peak_table(top=top)
    f32 = sum(v.bytes for v in timeline.peak_values if v.shape.startswith("f32"))
    # Buffers with one row per grid node, e.g. f32[1038240,1,512].
    grid = [v.bytes for v in timeline.peak_values
            if f"[{preset.model.num_grid_nodes}," in v.shape]
    return {"preset": preset_name, "rows": rows,
            "peak": {"peak_bytes": timeline.peak_bytes, "float32_bytes": f32,
                     "grid_sized_buffers": len(grid), "grid_sized_bytes": sum(grid),
                     "stage": timeline.peak_stage,
                     "buffers": table[["instruction", "shape", "bytes", "stage"]]
                     .to_dict("records")}}


def claim_markdown(claim) -> list:
    peak = claim["peak"]
    lines = ["", f"The authors' claim: `deepmind` in bfloat16 at {claim['preset']} (0.25 deg, "
             f"37 levels, batch 1) against {TPU_V4_GIB:g} GiB per TPU v4 chip. Compiled "
             "total = arguments + outputs + temp; each row names what it changes from "
             "`deepmind` (`lean` is gclab's whole recipe):", "",
             "| step | change | temp | total | fits 32 GiB |", "|---|---|---:|---:|---|"]
    for r in claim["rows"]:
        lines.append(f"| {r['step']} | {r['change']} | {format_bytes(r['temp_bytes'])} | "
                     f"{format_bytes(r['total_bytes'])} | {'yes' if r['fits_tpu_v4'] else 'no'} |")
    lines += ["", f"Largest buffers live at the peak of `deepmind` in bfloat16 "
              f"({format_bytes(peak['peak_bytes'])} in '{peak['stage']}'; "
              f"{format_bytes(peak['float32_bytes'])} of it float32; "
              f"{peak['grid_sized_buffers']} buffers with one row per grid node hold "
              f"{format_bytes(peak['grid_sized_bytes'])}):", "",
              "| buffer | HLO type | bytes | made in |", "|---|---|---:|---|"]
    for b in peak["buffers"]:
        lines.append(f"| {b['instruction']} | {b['shape']} | {format_bytes(b['bytes'])} | "
                     f"{b['stage']} |")
    return lines


def targets(rows, rollouts, timing) -> list:
    def temp(preset, precision, recipe, key="temp_bytes"):
        for r in rows:
            if (r["preset"], r["precision"], r["recipe"]) == (preset, precision, recipe):
                return r[key]
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
    for preset, title in (("cpu-16x512", "cpu-16x512 (4 deg)"),
                          ("graphcast-small", "graphcast-small"),
                          ("graphcast", "graphcast (0.25 deg, 37 levels)")):
        none16 = temp(preset, "bf16", "none")
        if none16 is not None and (preset, "bf16") in OFFICIAL_GIB:
            official = OFFICIAL_GIB[(preset, "bf16")]
            add(f"{title} bf16 none <= official {official} GiB", none16 / GIB, official)
        for recipe in RECIPES:
            t32, t16 = temp(preset, "f32", recipe), temp(preset, "bf16", recipe)
            if t32 and t16:
                add(f"{title} {recipe}: bf16 temp <= {BF16_FRACTION} x f32", t16 / t32,
                    BF16_FRACTION, "ratio")
    deepmind16 = temp("graphcast", "bf16", "deepmind", "total_bytes")
    if deepmind16 is not None:
        add(f"graphcast (0.25 deg, 37 levels) bf16 deepmind total <= {TPU_V4_GIB:g} GiB "
            "(TPU v4, as published)", deepmind16 / GIB, TPU_V4_GIB)
    if rollouts:
        by = {(r["rollout"], r["rollout_remat"]): r["temp_bytes"] for r in rollouts}
        add("rollout remat: temp(T=12) <= 1.5 x temp(T=1)", by[(12, True)] / by[(1, True)], 1.5,
            "ratio")
    if timing:
        med = timing["median_seconds"]
        add("deepmind step time <= 1.4 x none", med["deepmind"] / med["none"], 1.4, "ratio")
    return out


def markdown(hw, rows, rollouts, timing, checks, norms=(), claim=None) -> str:
    lines = [f"# Compiled memory of one training step ({hw['backend']})", "",
             f"Hardware: {hw['device']} ({hw['platform']}, {hw['cpu_count']} cores); "
             f"jax {hw['jax']}; gclab {hw['gclab']}; {hw['date']}.",
             "XLA compiled memory analysis of one training step (loss + gradients + AdamW "
             "update), batch 1, one target step."
             + (" XLA:CPU computes bfloat16 in float32 inside its kernels, so bfloat16 halves "
                "what is kept, not every temporary." if hw["backend"] == "cpu" else ""), "",
             "| preset | precision | recipe | temp | total | official code |",
             "|---|---|---|---:|---:|---:|"]
    for r in rows:
        official = (OFFICIAL_GIB.get((r["preset"], r["precision"]))
                    if r["recipe"] == "none" else None)
        lines.append(f"| {r['preset']} | {r['precision']} | {r['recipe']} | "
                     f"{format_bytes(r['temp_bytes'])} | {format_bytes(r['total_bytes'])} | "
                     f"{f'{official} GiB' if official else ''} |")
    by_key = {(r["preset"], r["precision"], r["recipe"]): r for r in rows}
    pairs = [(by_key[(p, "f32", r)], by_key[(p, "bf16", r)]) for p, prec, r in by_key
             if prec == "f32" and (p, "bf16", r) in by_key]
    if pairs:
        lines += ["", "bfloat16 against float32 (compiled temp; total = arguments + outputs + "
                  "temp):", "", "| preset | recipe | f32 temp | bf16 temp | bf16 / f32 | "
                  "bf16 total |", "|---|---|---:|---:|---:|---:|"]
        for a, b in pairs:
            lines.append(f"| {a['preset']} | {a['recipe']} | {format_bytes(a['temp_bytes'])} | "
                         f"{format_bytes(b['temp_bytes'])} | "
                         f"{b['temp_bytes'] / a['temp_bytes']:.2f} | "
                         f"{format_bytes(b['total_bytes'])} |")
    if norms:
        lines += ["", f"bfloat16 error against float32 by LayerNorm rule ({norms[0]['preset']}, "
                  "random parameters and data; relative L2):", "",
                  "| recipe | LayerNorm | outputs | gradient | worst parameter | cosine |",
                  "|---|---|---:|---:|---:|---:|"]
        for n in norms:
            lines.append(f"| {n['recipe']} | {n['layer_norm']} | {n['output_rel']:.4f} | "
                         f"{n['grad_rel']:.4f} | {n['worst_param_grad_rel']:.4f} | "
                         f"{n['grad_cosine']:.5f} |")
    if claim:
        lines += claim_markdown(claim)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="4 deg presets only, written to memory-<backend>-quick.json")
    parser.add_argument("--only", choices=["f32", "bf16", "claim"],
                        help="re-measure this precision's rows (and, for bf16, the LayerNorm "
                             "errors), or only the authors' claim; keep everything else of "
                             "the recorded file")
    parser.add_argument("--report-only", action="store_true",
                        help="check the targets and write the .md again from the recorded "
                             ".json, measuring nothing")
    args = parser.parse_args(argv)
    if MEMORY_FIRST_OPTION in os.environ.get("XLA_FLAGS", ""):
        # Every row would be compiled in that order, and the claim's row compared with itself.
        parser.error(f"XLA_FLAGS sets {MEMORY_FIRST_OPTION}: the recorded figures are XLA's "
                     "default order (the authors'-claim row sets it in a process of its own); "
                     "run without it")
    hw = hardware()
    presets = ["cpu-16x512"] if args.quick else ["cpu-16x512", "graphcast-small", "graphcast"]
    # A quick run lacks the 1 deg and 0.25 deg rows the chapters and README read: it has a
    # file of its own (with --only and --report-only too, which then read that file).
    path = RESULTS / f"memory-{hw['backend']}{'-quick' if args.quick else ''}.json"
    if (args.report_only or args.only) and not path.exists():
        # They read the recorded file: without one there is nothing to keep or report.
        option = "--report-only" if args.report_only else f"--only {args.only}"
        first = "--quick" if args.quick else "without --only or --report-only"
        parser.error(f"{option}: no recorded {path.name}; run {first} first")
    if args.report_only or args.only == "claim":
        record = json.loads(path.read_text())
        rows, rollouts, timing = record["recipes"], record["rollout"], record["step_time"]
        norms = record.get("layer_norm_bf16_error", [])
        if args.only == "claim":
            record["authors_claim"] = authors_claim()
            record["hardware_claim"] = hw
    elif args.only:
        record = json.loads(path.read_text())
        order = {p: i for i, p in enumerate(presets)}
        rows = [r for r in record["recipes"] if r["precision"] != args.only]
        rows += recipe_table(presets, [args.only])
        rows.sort(key=lambda r: (order.get(r["preset"], len(order)),
                                 r["precision"] != "f32", list(RECIPES).index(r["recipe"])))
        rollouts, timing = record["rollout"], record["step_time"]
        norms = (layer_norm_errors() if args.only == "bf16"
                 else record.get("layer_norm_bf16_error", []))
        record.update(recipes=rows, layer_norm_bf16_error=norms)
        record[f"hardware_{args.only}"] = hw
    else:
        rows = recipe_table(presets, ["f32", "bf16"])
        rollouts = rollout_rows("cpu-16x512")
        timing = step_times("cpu-16x512")
        norms = layer_norm_errors()
        record = {"hardware": hw, "recipes": rows, "rollout": rollouts, "step_time": timing,
                  "layer_norm_bf16_error": norms}
        if not args.quick:
            record["authors_claim"] = authors_claim()
    record["targets"] = checks = targets(rows, rollouts, timing)
    text = markdown(record["hardware"], rows, rollouts, timing, checks, norms,
                    record.get("authors_claim"))
    for precision in ("f32", "bf16", "claim"):
        if f"hardware_{precision}" in record:
            again = record[f"hardware_{precision}"]
            what = "authors' claim" if precision == "claim" else f"{precision} rows"
            text = text.replace("\n\n", f"\n\nThe {what} were measured again on "
                                f"{again['device']} ({again['cpu_count']} cores), jax "
                                f"{again['jax']}, {again['date']}.\n", 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(record, indent=1))
    write_text_atomic(path.with_suffix(".md"), text)
    if path == RESULTS / "memory-cpu.json":  # the copy that travels with the package
        write_text_atomic(SHIPPED, json.dumps(record, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
