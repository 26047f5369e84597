"""Command line: `python -m gclab COMMAND ...` (or `gclab COMMAND ...`).

Commands:
  graph      node and edge counts of a grid + multimesh (built and cached)
  reference  check gclab against a fixture produced by the official code
  memory     XLA's compiled memory of one training step, from shapes alone
  timeline   the memory timeline of one training step, as a picture
  sweep      a grid of configs x techniques, compiled and/or measured
  plan       the technique settings that fit a memory budget
  train      train on synthetic weather, on one device or a layout over several

Every error in what you type is reported in one line naming the problem, with exit
status 2; a failed check exits with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from typing import Optional, Sequence

import jax
import tqdm

from gclab.config import resolve_model
from gclab.geometry.graphs import build_graphs
from gclab.measure.compiled import format_bytes
from gclab.memory.config import RECIPES, REMAT_SPEC_HELP, get_recipe, parse_remat_spec
from gclab.model.reference import load_fixture, run_checks
from gclab.parallel import (
    PARALLEL_SPEC_HELP,
    ParallelConfig,
    initialize_processes,
    parse_parallel_spec,
    use_cpu_devices,
)
from gclab.plots import plot_sweep, plot_timeline
from gclab.sizing.planner import NothingFits, plan
from gclab.sizing.step import StepSpec, compile_train_step, train_step_timeline
from gclab.sizing.sweep import MEASURES, save_sweep, sweep
from gclab.sizing.sweep import grid as sweep_grid
from gclab.training.loop import DEFAULT_SCHEDULE_STEPS, train


class UsageError(ValueError):
    """Bad command-line input; printed without a traceback."""


def _add_model_args(p: argparse.ArgumentParser, *, network: bool = True) -> None:
    g = p.add_argument_group("model (a preset, or a grid and mesh)")
    g.add_argument("--preset", help="a named preset (e.g. graphcast, graphcast-small, cpu-4x32)")
    g.add_argument("--resolution", type=float, help="grid spacing in degrees (divides 180)")
    g.add_argument("--mesh-splits", type=int, help="icosahedron refinements, 0..7")
    g.add_argument("--radius-fraction", type=float,
                   help="grid2mesh radius as a fraction of the longest finest edge (0.6)")
    if network:
        g.add_argument("--latent", type=int, help="latent width L")
        g.add_argument("--steps", type=int, help="processor steps S")
        g.add_argument("--levels", type=int, choices=(13, 37), help="pressure levels")


def _resolve_model(args):
    """(ModelConfig, TaskConfig) from --preset or --resolution/--mesh-splits (+ overrides)."""
    return resolve_model(args.preset, resolution=args.resolution, mesh_splits=args.mesh_splits,
                         radius_fraction=args.radius_fraction,
                         latent=getattr(args, "latent", None), steps=getattr(args, "steps", None),
                         levels=getattr(args, "levels", None))


def _resolve_memory(args):
    mem = get_recipe(args.recipe, args.precision)
    changes = {}
    if args.remat is not None:
        changes.update(parse_remat_spec(args.remat))
    if args.edge_block is not None:
        changes["edge_block_size"] = args.edge_block if args.edge_block > 0 else None
        if changes["edge_block_size"] is None:
            changes["processor_edge_blocks"] = False
    if getattr(args, "rollout", 1) > 1 and args.recipe != "none":
        changes["rollout_remat"] = True
    return mem.replace(**changes) if changes else mem


def _add_memory_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("memory techniques")
    g.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    g.add_argument("--rollout", type=int, default=1, help="autoregressive steps T (default 1)")
    g.add_argument("--recipe", default="none",
                   help="named recipe: " + ", ".join(RECIPES) + " (default none)")
    g.add_argument("--remat", help="processor remat: " + REMAT_SPEC_HELP)
    g.add_argument("--edge-block", type=int, help="edges per block (0: no blocks)")
    g.add_argument("--precision", default="f32", help="f32 or bf16 (default f32)")


def _spec(args):
    model, task = _resolve_model(args)
    for name in ("batch", "rollout"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    return StepSpec(model, task, _resolve_memory(args), batch=args.batch, rollout=args.rollout)


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


# ----------------------------------------------------------------------------------------


def cmd_graph(args) -> int:
    model, _ = _resolve_model(args)
    t0 = time.perf_counter()
    graphs = build_graphs(model.resolution, model.mesh_splits,
                          model.radius_query_fraction_edge_length,
                          model.mesh2grid_edge_normalization_factor)
    seconds = time.perf_counter() - t0
    counts = graphs.counts()
    if args.json:
        _print_json({**counts, "resolution": model.resolution, "mesh_splits": model.mesh_splits,
                     "radius_query_fraction_edge_length":
                         model.radius_query_fraction_edge_length,
                     "build_seconds": round(seconds, 3)})
    else:
        print(f"grid {model.resolution:g} deg ({graphs.n_lat} x {graphs.n_lon}), "
              f"{model.mesh_splits} mesh splits, radius fraction "
              f"{model.radius_query_fraction_edge_length:g}")
        for key, value in counts.items():
            print(f"  {key:<16} {value:>12,}")
        print(f"  built in {seconds:.2f} s (cached on disk for the next run)")
    return 0


def cmd_reference(args) -> int:
    if not args.tolerance > 0:
        raise UsageError(f"--tolerance must be > 0, got {args.tolerance}")
    status = 0
    for path in args.fixtures:
        fx = load_fixture(path)
        c = fx.config
        print(f"{path}: {c.resolution:g} deg, {c.mesh_splits} splits, {c.processor_steps} x "
              f"{c.latent_size}, C_in {fx.data_channels}, C_out {fx.output_channels}, "
              f"batch {fx.batch}")
        for check in run_checks(fx, args.tolerance):
            mark = "PASS" if check.passed else "FAIL"
            print(f"  {mark}  {check.name}: max abs error {check.max_abs_error:.3g} "
                  f"({check.detail})")
            status |= not check.passed
    print(f"{'all checks passed' if not status else 'some checks FAILED'} "
          f"(tolerance {args.tolerance:g} absolute)")
    return int(status)


def cmd_memory(args) -> int:
    layout = _resolve_parallel(args)
    spec = _spec(args)
    start_devices(layout)
    compiled = compile_train_step(dataclasses.replace(spec, parallel=layout))
    spec = compiled.spec
    record = {**compiled.memory.to_dict(), **spec.describe(),
              "collectives": compiled.collectives}
    if args.json:
        _print_json(record)
        return 0
    print(f"one training step of {spec.title()}")
    print(f"  parameters       {record['num_params']:>14,}")
    keys = ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "total_bytes")
    if layout.devices > 1:
        print(f"  per device ({layout.devices} devices, {layout.spec}):")
        keys += ("collective_bytes",)
    for key in keys:
        print(f"  {key:<16} {format_bytes(record[key]):>14}")
    print(f"  backend {record['backend']}, compiled in {record['compile_seconds']:.1f} s")
    return 0


def cmd_timeline(args) -> int:
    timelines, labels = [], []
    for recipe in args.recipe.split(","):  # several recipes: overlaid in one picture
        args.recipe = recipe.strip()
        spec = _spec(args)
        tl = train_step_timeline(spec)
        print(f"{spec.title()}: peak {format_bytes(tl.peak_bytes)} at {tl.peak_stage} "
              f"(compiled temp {format_bytes(tl.temp_bytes)})")
        timelines.append(tl)
        labels.append(spec.memory_label())
    if args.plot:
        fig = plot_timeline(timelines if len(timelines) > 1 else timelines[0], labels=labels)
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")
        print(f"wrote {args.plot}")
    return 0


def cmd_sweep(args) -> int:
    model, task = _resolve_model(args)
    latents = _int_list(args.latents, "--latents") if args.latents else [model.latent_size]
    steps = (_int_list(args.steps_list, "--steps-list") if args.steps_list
             else [model.processor_steps])
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    specs = sweep_grid(model, latents, steps, task, techniques=recipes,
                       precision=args.precision, batch=args.batch, rollout=args.rollout)
    df = sweep(specs, measure=args.measure, cache_path=os.environ.get("GCLAB_SWEEP_CACHE"))
    save_sweep(df, args.out)
    for _, r in df.iterrows():
        print(f"{r['model.processor_steps']:>3} x {r['model.latent_size']:<5} "
              f"{r['technique']:<10} total {format_bytes(r['total_bytes'])} "
              f"temp {format_bytes(r['temp_bytes'])} {r['status']}")
    print(f"wrote {args.out}")
    if args.plot:
        plot_sweep(df).savefig(args.plot, dpi=120, bbox_inches="tight")
        print(f"wrote {args.plot}")
    return 0 if (df["status"] == "ok").all() else 1


def _int_list(text: str, option: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"{option} {text}: comma-separated integers") from None


def cmd_plan(args) -> int:
    model, task = _resolve_model(args)
    try:
        result = plan(args.budget, model, task, batch=args.batch, rollout=args.rollout,
                      precision=args.precision,
                      use_compiled={"auto": "auto", "yes": True, "no": False}[args.compiled])
    except NothingFits as e:
        print(f"gclab plan: {e}", file=sys.stderr)
        return 1
    if args.json:
        _print_json(result.to_dict())
    else:
        print(result.explain())
    return 0


# ---------------------------------------------------------------------------------------
# Devices, layouts and training.


def _add_parallel_args(p: argparse.ArgumentParser, processes: bool = False) -> None:
    g = p.add_argument_group("devices (a layout over several devices)")
    g.add_argument("--devices", type=int,
                   help="devices of the layout (simulated CPU devices on a CPU; default: the "
                   "layout's)")
    g.add_argument("--parallel", metavar="SPEC",
                   help=f"layout: {PARALLEL_SPEC_HELP} (default data:DEVICES)")
    if processes:
        g.add_argument("--coordinator", metavar="HOST:PORT",
                       help="process 0's address in a multi-process run "
                       "(default $JAX_COORDINATOR_ADDRESS)")
        g.add_argument("--num-processes", type=int,
                       help="processes in the run (default $JAX_NUM_PROCESSES)")
        g.add_argument("--process-id", type=int,
                       help="this process's index (default $JAX_PROCESS_ID)")


def _resolve_parallel(args) -> ParallelConfig:
    """The layout of --parallel and --devices (which must agree)."""
    devices = args.devices
    if devices is not None and devices < 1:
        raise UsageError(f"--devices {devices}: an integer >= 1")
    if args.parallel is None:
        return ParallelConfig(data=devices or 1)
    try:
        layout = parse_parallel_spec(args.parallel)
    except ValueError:
        raise UsageError(f"--parallel {args.parallel}: {PARALLEL_SPEC_HELP}; pipeline must "
                         f"be 1 for now") from None
    if devices is not None and layout.devices != devices:
        raise UsageError(f"--parallel {args.parallel}: its axis sizes must multiply to "
                         f"--devices {devices}, not {layout.devices}")
    return layout


def start_devices(layout: ParallelConfig, processes: int = 1) -> None:
    """Asks JAX for the layout's devices on CPU (simulated), before its first operation.

    JAX starts its backends lazily, at the first array or device query, and nothing in
    gclab makes one at import; so the CPU device count is set here, after the options
    are parsed and before any JAX operation, with no need to re-execute the process. On
    an accelerator the setting only concerns the CPU and the layout uses the accelerators.
    """
    if layout.devices > 1:
        use_cpu_devices(max(1, layout.devices // processes))


def _check_train_args(args) -> None:
    for option, value, low in (("--train-steps", args.train_steps, 1), ("--batch", args.batch, 1),
                               ("--schedule-steps", args.schedule_steps, 1),
                               ("--rollout", args.rollout, 1), ("--seed", args.seed, 0)):
        if value < low:
            raise UsageError(f"{option} {value}: an integer >= {low}")
    if not args.learning_rate >= 0:
        raise UsageError(f"--learning-rate {args.learning_rate}: a number >= 0")
    if args.num_processes is not None and args.num_processes < 1:
        raise UsageError(f"--num-processes {args.num_processes}: an integer >= 1")
    if args.process_id is not None and not (
            0 <= args.process_id < (args.num_processes or 1)):
        raise UsageError(f"--process-id {args.process_id}: an integer in 0..num-processes - 1")
    if args.coordinator is not None and not _is_host_port(args.coordinator):
        raise UsageError(f"--coordinator {args.coordinator}: HOST:PORT with PORT in 1..65535")
    if args.checkpoint_dir is not None and os.path.exists(args.checkpoint_dir) and not (
            os.path.isdir(args.checkpoint_dir)):
        raise UsageError(f"--checkpoint-dir {args.checkpoint_dir}: a directory (this is a file)")


def _is_host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 1 <= int(port) <= 65535


def cmd_train(args) -> int:
    _check_train_args(args)
    layout = _resolve_parallel(args)
    model, task = _resolve_model(args)
    memory = _resolve_memory(args)
    processes = args.num_processes or int(os.environ.get("JAX_NUM_PROCESSES", "1") or 1)
    multiple = layout.data * memory.microbatches
    if args.batch % multiple:
        raise UsageError(f"--batch {args.batch}: a multiple of {multiple} (the data axis "
                         f"times micro-batches)")
    start_devices(layout, processes)
    initialize_processes(args.coordinator, args.num_processes, args.process_id)
    lead = jax.process_index() == 0
    progress = functools.partial(tqdm.tqdm, desc="gclab train", unit="step", file=sys.stderr,
                                 disable=not lead or None)
    result = train(model, task, args.train_steps, batch=args.batch, rollout=args.rollout,
                   memory=memory, parallel=layout, seed=args.seed,
                   learning_rate=args.learning_rate, schedule_steps=args.schedule_steps,
                   checkpoint_dir=args.checkpoint_dir,
                   progress=progress)
    if not lead:
        return 0
    record = {"losses": result.losses, "grad_norms": result.grad_norms,
              "first_step": result.first_step, "steps": result.steps,
              "checkpoint_step": result.checkpoint, "devices": layout.devices,
              "parallel": layout.spec, "processes": jax.process_count(),
              "backend": jax.default_backend(), "model": dataclasses.asdict(model),
              "levels": task.num_levels, "memory": dataclasses.asdict(memory),
              "batch": args.batch, "rollout": args.rollout, "seed": args.seed}
    if args.json:
        _print_json(record)
        return 0
    for k, loss in enumerate(result.losses, start=result.first_step + 1):
        print(f"  step {k:>5}  loss {loss:.6f}")
    where = f", saved step {result.checkpoint} to {args.checkpoint_dir}" if (
        result.checkpoint is not None) else ""
    print(f"trained to step {result.steps} on {layout.devices} {jax.default_backend()} "
          f"device(s) ({layout.spec}){where}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gclab", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("graph", help="node and edge counts of a grid and multimesh")
    _add_model_args(p, network=False)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("reference", help="check gclab against official fixtures")
    p.add_argument("fixtures", nargs="+", metavar="PATH.npz")
    p.add_argument("--tolerance", type=float, default=1e-5, help="max abs error (1e-5)")
    p.set_defaults(func=cmd_reference)

    p = sub.add_parser("memory", help="compiled memory of one training step (no allocation)")
    _add_model_args(p)
    _add_memory_args(p)
    _add_parallel_args(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_memory)

    p = sub.add_parser("timeline", help="memory timeline of one training step "
                       "(--recipe A,B overlays several)")
    _add_model_args(p)
    _add_memory_args(p)
    p.add_argument("--plot", metavar="FILE.png", help="save the timeline picture")
    p.set_defaults(func=cmd_timeline)

    p = sub.add_parser("sweep", help="configs x techniques, compiled and/or measured")
    _add_model_args(p)
    p.add_argument("--latents", default=None, help="comma-separated latent widths")
    p.add_argument("--steps-list", default=None, help="comma-separated processor steps")
    p.add_argument("--recipes", default="none,per-step,deepmind,lean",
                   help="comma-separated recipes")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rollout", type=int, default=1)
    p.add_argument("--precision", default="f32")
    p.add_argument("--measure", default="compiled", choices=MEASURES,
                   help="compiled (no allocation), timed, measured (fresh process) or both")
    p.add_argument("--out", required=True, metavar="FILE.json")
    p.add_argument("--plot", metavar="FILE.png")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("plan", help="technique settings that fit a memory budget")
    p.add_argument("--budget", required=True,
                   help="bytes (16GiB, 12GB, 500MiB) or a card: T4, L4, A100-40GB, A100-80GB, H100")
    _add_model_args(p)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rollout", type=int, default=1)
    p.add_argument("--precision", default="f32")
    p.add_argument("--compiled", default="auto", choices=("auto", "yes", "no"),
                   help="verify with compiled figures (auto: where compiling is quick)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("train", help="train on synthetic weather (one device or a layout)")
    _add_model_args(p)
    _add_memory_args(p)
    p.add_argument("--train-steps", type=int, required=True, metavar="K",
                   help="the step count to reach (a resumed run continues up to it)")
    p.add_argument("--seed", type=int, default=0, help="seeds the weather and parameters (0)")
    p.add_argument("--learning-rate", type=float, default=1e-3,
                   help="peak learning rate (1e-3)")
    p.add_argument("--schedule-steps", type=int, default=DEFAULT_SCHEDULE_STEPS,
                   help=f"length of the learning-rate schedule: warm-up over its first tenth, "
                   f"then cosine decay ({DEFAULT_SCHEDULE_STEPS}; keep it when resuming)")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="resume from the latest checkpoint in DIR, and save there at the end")
    _add_parallel_args(p, processes=True)
    p.add_argument("--json", action="store_true", help="print JSON ({\"losses\": [...], ...})")
    p.set_defaults(func=cmd_train)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except ValueError as e:  # UsageError, config/fixture errors: one clear line
        print(f"gclab {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
