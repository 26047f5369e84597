"""The layout planner's choice for the published model on three clusters.

`gclab plan --devices` (`gclab.sizing.layout_plan.plan_layout`) for GraphCast at 0.25 deg,
37 levels, 16 x 512, one target step, on

* 8 x 16 GB (V100-16GB), 8 x 40 GB (A100-40GB), and
* 32 x 32 GiB (TPU v4, the chips GraphCast was trained on),

each at a global batch of 1 (one sample split over the devices) and of one sample per
device (GraphCast's training batch was 32 on 32 chips), in float32 and bfloat16. Every
layout x recipe candidate is compiled from shapes on simulated CPU devices (set before
JAX starts), so per-device memory is XLA:CPU's compiled total (arguments + outputs +
temp); step times are the planner's ranking with the card's published speeds (TPU v4 has
no entry in `gclab.sizing.speed.CARD_SPEEDS`: it is ranked with the reference card's, and
the record says so). Where nothing fits, the record keeps every candidate with its size.

Writes `benchmarks/results/cluster-plans-cpu.json` (rewritten whole after each row, in one
rename) and the same file into `gclab/recordings/` (package data), which chapter 8 reads.
A run replaces the recorded rows of the questions (cluster, batch, precision) it asks again
and keeps the others, so a run of one cluster leaves the rest of the file as it was. One
file holds one preset: a run of another preset needs `--out` elsewhere.

    python benchmarks/cluster_plans.py                    # every cluster, batch, precision
    python benchmarks/cluster_plans.py --clusters 8xA100-40GB --precisions f32
    python benchmarks/cluster_plans.py --preset graphcast-small --out /tmp/small.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import jax

MAX_DEVICES = 32
jax.config.update("jax_num_cpu_devices", MAX_DEVICES)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fresh_clone import commit, kept_rows  # noqa: E402
from options import named, record_to_extend  # noqa: E402

from gclab.config import get_preset  # noqa: E402
from gclab.files import write_text_atomic  # noqa: E402
from gclab.measure import format_bytes, machine  # noqa: E402
from gclab.memory.config import PRECISIONS, get_recipe  # noqa: E402
from gclab.sizing.layout_plan import plan_layout  # noqa: E402
from gclab.sizing.planner import NothingFits  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAME = "cluster-plans-cpu"
OUTPUTS = (ROOT / "benchmarks" / "results" / f"{NAME}.json",
           ROOT / "gclab" / "recordings" / f"{NAME}.json")
# name: (devices, card)
CLUSTERS = {"8xV100-16GB": (8, "V100-16GB"), "8xA100-40GB": (8, "A100-40GB"),
            "32xTPU-v4": (32, "TPU-v4")}


def plan_row(cluster: str, preset: str, batch: int, precision: str,
             recipes: list[str]) -> dict:
    """One planner run: the choice, or why nothing fits, and every candidate."""
    devices, card = CLUSTERS[cluster]
    p = get_preset(preset)
    start = time.perf_counter()
    row = {"cluster": cluster, "devices": devices, "card": card, "preset": preset,
           "batch": batch, "precision": precision, "recipes": recipes}
    try:
        plan = plan_layout(card, p.model, p.task, devices, batch=batch, precision=precision,
                           recipes=recipes)
        row.update(plan.to_dict(), fits=True, explanation=plan.explain())
    except NothingFits as e:
        row.update(fits=False, explanation=str(e), candidates=e.candidates)
    row["seconds"] = round(time.perf_counter() - start, 1)
    # Each row names when and from which commit it was planned: a run keeps rows of
    # earlier runs beside new ones under one file-level hardware record.
    row["date"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    row["commit"] = commit()
    return row


def _key(row: dict) -> tuple:
    return row["cluster"], row["preset"], row["batch"], row["precision"]


def merged(rows: list, preset: str, old: dict) -> list:
    """`rows` with `old`'s rows of `preset` whose questions are not among them, in cluster
    order."""
    rows = rows + kept_rows(rows, old, _key, lambda r: r["preset"] == preset)
    order = list(CLUSTERS)
    return sorted(rows, key=lambda r: (order.index(r["cluster"]), r["precision"] != "f32",
                                       r["batch"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", default=",".join(CLUSTERS),
                        help=f"comma-separated, of {', '.join(CLUSTERS)}")
    parser.add_argument("--preset", default="graphcast")
    parser.add_argument("--precisions", default="f32,bf16")
    parser.add_argument("--recipes", default="none,per-step,deepmind,lean")
    parser.add_argument("--batches", default="1,devices",
                        help="global batches: numbers, or 'devices' (one sample each)")
    parser.add_argument("--out", type=Path, default=OUTPUTS[0],
                        help="the record to write (default benchmarks/results/"
                             f"{NAME}.json, copied into gclab/recordings)")
    # Merging is what every run does; the option stays for the command lines that name it.
    parser.add_argument("--append", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Every option is checked before the first plan, the preset first: a typo in the last
    # precision must not cost the plans before it, and an unknown preset is named as such.
    try:
        get_preset(args.preset)
    except ValueError as e:
        parser.error(f"--preset: {e}")
    clusters = [c.strip() for c in args.clusters.split(",")]
    for c in clusters:
        if c not in CLUSTERS:
            parser.error(f"--clusters: {c!r} is not one of {', '.join(CLUSTERS)}")
    precisions = args.precisions.split(",")
    for p in precisions:
        if p not in PRECISIONS:
            parser.error(f"--precisions: {p!r} is not one of {', '.join(PRECISIONS)}")
    recipes = named(parser, "--recipes", args.recipes, get_recipe)
    batches = args.batches.split(",")
    for b in batches:
        if b != "devices" and not (b.isdigit() and int(b) >= 1):
            parser.error(f"--batches: {b!r} is neither a number of at least 1 nor 'devices'")
    # The shipped copy is the results folder's record, written only with it.
    outputs = OUTPUTS if args.out.resolve() == OUTPUTS[0].resolve() else (args.out,)
    old = record_to_extend(parser, args.out, outputs, "a record of plans")
    others = sorted({r["preset"] for r in old["rows"]} - {args.preset})
    if others:
        parser.exit(2, f"{parser.prog}: error: --preset {args.preset}: {args.out} records "
                       f"{', '.join(others)}; write another preset's plans elsewhere with "
                       "--out FILE.json\n")
    record = {"hardware": machine(simulated_devices=jax.device_count()),
              "what": "gclab plan --devices: per-device compiled total on XLA:CPU; "
                      "predicted seconds rank candidates with the card's published "
                      "speeds (the reference card's where the card has none)",
              "rows": []}
    fresh = []  # this run's rows
    for cluster in clusters:
        devices = CLUSTERS[cluster][0]
        for precision in precisions:
            for b in batches:
                batch = devices if b == "devices" else int(b)
                row = plan_row(cluster, args.preset, batch, precision, recipes)
                fresh.append(row)
                record["rows"] = merged(fresh, args.preset, old)
                said = row["explanation"].splitlines()[1 if row["fits"] else 0]
                print(f"{cluster} batch {batch} {precision}: {said} ({row['seconds']} s)",
                      flush=True)
                text = json.dumps(record, indent=1, default=str)
                for out in outputs:
                    write_text_atomic(out, text)
    best = [r for r in record["rows"] if r["fits"]]
    print(f"{len(best)} of {len(record['rows'])} plans fit; largest per device "
          f"{format_bytes(max((r['per_device_bytes'] for r in best), default=0))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
