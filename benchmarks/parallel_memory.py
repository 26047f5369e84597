"""Per-device compiled memory of one training step against device count, per layout.

Compiles one full training step (loss + gradients + AdamW update, one target step) from
shapes alone on simulated CPU devices (`jax_num_cpu_devices`, set before JAX starts), for
each layout: `spatial:D` (grid and edges split D ways, batch 1) and `data:D` (batch D, one
sample per device). XLA's memory figures of a partitioned program are per device; the
collective bytes come from its optimised HLO. Writes, per preset, once its rows are all
compiled, `benchmarks/results/parallel-memory-<backend>-<name>.json` (`1deg` for
graphcast-small, `025deg` for graphcast, the preset's name for others: `FILE_NAMES`) and a
Markdown table beside it, with the hardware and date, each whole or not at all (a run cut
short leaves the earlier record); the README and chapter 8 read these files, and the copy
in `gclab/recordings` of a file shipped there is refreshed. Each row also carries the step time
`gclab plan --devices` predicts for it with an H100's published speeds
(`gclab.sizing.layout_plan.predicted_seconds`: analytical FLOPs and bytes over the card's
peak FLOP/s and memory bandwidth, split over the devices, plus the compiled collective bytes
over the link): simulated CPU devices share two cores, so a
timed step here would measure nothing about devices. `--annotate FILE.json` adds that
prediction to rows recorded before it existed, without compiling again.

    python benchmarks/parallel_memory.py                       # 1 deg and 0.25 deg, lean
    python benchmarks/parallel_memory.py --presets graphcast-small --recipes none,lean
    python benchmarks/parallel_memory.py --devices 1,8 --layouts spatial

Target: the 0.25 deg `lean` step split 8 ways spatially needs at most a quarter of the
single-device temp per device.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import jax

MAX_DEVICES = 8
jax.config.update("jax_num_cpu_devices", MAX_DEVICES)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fresh_clone import kept_rows  # noqa: E402
from options import integers, named  # noqa: E402

from gclab.config import get_preset  # noqa: E402
from gclab.files import OutputPathError, writable_folder, write_text_atomic  # noqa: E402
from gclab.measure import format_bytes, machine  # noqa: E402
from gclab.memory import get_recipe  # noqa: E402
from gclab.parallel import ParallelConfig, parse_parallel_spec  # noqa: E402
from gclab.sizing import StepSpec, compile_train_step  # noqa: E402
from gclab.sizing.analytical import GraphCounts  # noqa: E402
from gclab.sizing.layout_plan import (  # noqa: E402
    CARD_SPEEDS,
    REFERENCE_CARD,
    predicted_seconds,
)

RESULTS = Path(__file__).parent / "results"
SHIPPED = Path(__file__).resolve().parents[1] / "gclab" / "recordings"
# A preset's file is named by its grid, as update_readme.py and chapter 8 read them.
FILE_NAMES = {"graphcast-small": "1deg", "graphcast": "025deg"}


def record_path(folder: Path, backend: str, preset: str) -> Path:
    """``<folder>/parallel-memory-<backend>-<name>.json`` of a preset (`FILE_NAMES`)."""
    return Path(folder) / f"parallel-memory-{backend}-{FILE_NAMES.get(preset, preset)}.json"


def write(path: Path, record: dict) -> None:
    """The record and its .md, each replaced in one rename; the shipped copy too where the
    package ships a file of that name and `path` is in the results folder."""
    text = json.dumps(record, indent=2) + "\n"
    write_text_atomic(path, text)
    write_text_atomic(path.with_suffix(".md"), markdown(record["rows"], record["hardware"]))
    # Chapter 8 reads the recordings that ship with the package (`gclab.recordings`).
    shipped = SHIPPED / path.name
    if path.parent.resolve() == RESULTS.resolve() and shipped.is_file():
        write_text_atomic(shipped, text)


def hardware() -> dict:
    return machine(simulated_devices=jax.device_count())


LAYOUTS = ("spatial", "spatial-replicated", "data")


def _key(row: dict) -> tuple:
    """What a row measures: the same key in two runs is the same compile."""
    return row["preset"], row["recipe"], row["parallel"], row["batch"]


def merged(rows: list, path: Path) -> list:
    """`rows` with the rows already recorded at `path` that this run did not compile again,
    ordered by recipe, device count and layout: a run of a few devices or layouts adds to a
    preset's record instead of replacing it. Rows recorded before rows carried their own date
    keep the date of their file."""
    old = json.loads(path.read_text()) if path.is_file() else {"rows": []}
    return sorted(rows + kept_rows(rows, old, _key),
                  key=lambda r: (r["recipe"], r["devices"], r["parallel"]))


def layout_of(kind: str, devices: int) -> tuple[ParallelConfig, int]:
    """(layout, global batch): spatial keeps batch 1, data gives each device one sample.

    `spatial` splits mesh nodes too (the default); `spatial-replicated` keeps them whole on
    every device (`ParallelConfig.mesh_nodes`).
    """
    if kind == "spatial":
        return ParallelConfig(spatial=devices), 1
    if kind == "spatial-replicated":
        return ParallelConfig(spatial=devices, mesh_nodes="replicated"), 1
    return ParallelConfig(data=devices), devices


def markdown(rows: list, hw: dict) -> str:
    lines = [f"Per-device compiled memory of one training step ({hw['backend']}, "
             f"{hw['simulated_devices']} simulated devices, jax {hw['jax']}, {hw['date']}).",
             "", "| preset | recipe | layout | batch | devices | temp / device | args / device "
             f"| temp vs 1 device | collectives / step | predicted step ({REFERENCE_CARD}) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    base = {(r["preset"], r["recipe"]): r["temp_bytes"] for r in rows if r["devices"] == 1}
    for r in rows:
        ratio = r["temp_bytes"] / base.get((r["preset"], r["recipe"]), float("nan"))
        lines.append(f"| {r['preset']} | {r['recipe']} | {r['parallel']} | {r['batch']} | "
                     f"{r['devices']} | {format_bytes(r['temp_bytes'])} | "
                     f"{format_bytes(r['argument_bytes'])} | {ratio:.3f} | "
                     f"{format_bytes(r['collective_bytes'])} | "
                     f"{r['predicted_seconds'] * 1e3:.1f} ms |")
    return "\n".join(lines) + "\n"


def spec_of(row: dict) -> StepSpec:
    preset = get_preset(row["preset"])
    return StepSpec(preset.model, preset.task, get_recipe(row["recipe"]), batch=row["batch"],
                    parallel=parse_parallel_spec(row["parallel"]))


@functools.lru_cache(maxsize=None)
def graph_counts(preset: str) -> GraphCounts:
    """A preset's graph sizes, read once (rows of one preset share them)."""
    return GraphCounts.for_model(get_preset(preset).model)


def predicted(row: dict) -> float:
    """`gclab plan --devices`'s predicted step time of a row, with REFERENCE_CARD's speeds."""
    return predicted_seconds(spec_of(row), row["collective_bytes"],
                             CARD_SPEEDS[REFERENCE_CARD], graph_counts(row["preset"]))


def annotated(path: Path) -> tuple[str, str]:
    """(JSON, Markdown) of the record at `path` with its rows' predicted step times, made in
    full before anything is written.

    Raises:
      ValueError: `path` cannot be read, or is not a record of this script (the message
        says why).
    """
    try:
        record = json.loads(path.read_text())
        if not isinstance(record["rows"], list):
            raise TypeError("its rows are not a list")
        for row in record["rows"]:
            row["predicted_seconds"] = predicted(row)
        record["predicted_with"] = REFERENCE_CARD
        return json.dumps(record, indent=2) + "\n", markdown(record["rows"], record["hardware"])
    except OSError as e:
        raise ValueError(f"cannot be read ({e.strerror})") from None
    except (ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as e:
        raise ValueError(f"not a parallel-memory record of this script ({e!r})") from None


def annotate(path: Path, rendered: tuple[str, str] | None = None) -> None:
    text, md = rendered or annotated(path)
    write_text_atomic(path, text)
    write_text_atomic(path.with_suffix(".md"), md)
    print(f"annotated {path} and {path.with_suffix('.md')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="graphcast-small,graphcast")
    ap.add_argument("--recipes", default="lean")
    ap.add_argument("--devices", default="1,2,4,8")
    ap.add_argument("--layouts", default="spatial,spatial-replicated,data",
                    help="comma-separated, each one of " + ", ".join(LAYOUTS))
    ap.add_argument("--annotate", metavar="FILE.json",
                    help="add predicted step times to a recorded file, compile nothing")
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help="folder of the results (default benchmarks/results)")
    args = ap.parse_args(argv)
    # Every option is checked before anything compiles: a typo in the last preset must not
    # cost the compiles of the first.
    for kind in args.layouts.split(","):
        if kind not in LAYOUTS:
            ap.error(f"--layouts {args.layouts}: each one of {', '.join(LAYOUTS)}")
    if args.annotate:
        if not Path(args.annotate).is_file():
            ap.error(f"--annotate {args.annotate}: no such file; name a recorded "
                     "parallel-memory-*.json")
        try:
            rendered = annotated(Path(args.annotate))
        except ValueError as e:
            ap.error(f"--annotate {args.annotate}: {e}")
        annotate(Path(args.annotate), rendered)
        return 0
    presets = named(ap, "--presets", args.presets, get_preset)
    recipes = named(ap, "--recipes", args.recipes, get_recipe)
    device_counts = integers(ap, "--devices", args.devices, 1, MAX_DEVICES, "device counts",
                             "the simulated CPU devices")
    try:
        writable_folder(args.out, missing="parent")  # made below, once the options pass
    except OutputPathError as e:
        ap.error(f"--out: {e}")
    hw = hardware()
    args.out.mkdir(parents=True, exist_ok=True)
    for preset_name in presets:
        preset = get_preset(preset_name)
        rows: list = []
        for recipe in recipes:
            done = set()
            for devices in device_counts:
                for kind in args.layouts.split(","):
                    layout, batch = layout_of(kind, devices)
                    if devices == 1:
                        layout = ParallelConfig()
                    if (layout, batch) in done:
                        continue  # one device: every layout is the same
                    done.add((layout, batch))
                    spec = StepSpec(preset.model, preset.task, get_recipe(recipe), batch=batch,
                                    parallel=layout)
                    start = time.perf_counter()
                    step = compile_train_step(spec)
                    row = {"preset": preset_name, "recipe": recipe, "parallel": layout.spec,
                           "devices": layout.devices, "batch": batch,
                           **step.memory.to_dict(), "collectives": step.collectives,
                           "seconds": round(time.perf_counter() - start, 1),
                           "date": hw["date"]}
                    row["predicted_seconds"] = predicted(row)
                    rows.append(row)
                    print(f"{preset_name:<16} {recipe:<6} {layout.spec:<18} batch {batch} "
                          f"temp {format_bytes(row['temp_bytes'])} "
                          f"collectives {format_bytes(row['collective_bytes'])}", flush=True)
        out = record_path(args.out, hw["backend"], preset_name)
        write(out, {"hardware": hw, "rows": merged(rows, out),
                    "predicted_with": REFERENCE_CARD})
        print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
