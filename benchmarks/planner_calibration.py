"""Measures real training-step times of the planner's candidates and fits its speed model.

The planner (`gclab.sizing.plan`) ranks the settings that fit by predicted step time,
from the FLOPs, bytes moved and activation bytes held of one training step (analytical
counts; `gclab.sizing.speed`). This script times real jitted
steps of the planner's candidate settings on the device it finds (interleaved rounds,
median of each), fits the coefficients by non-negative least squares
(`gclab.sizing.speed.fit_calibration`), and writes

* ``benchmarks/results/planner-calibration-<backend>.json`` (hardware, date, jax version,
  every measurement, the fit and its errors), and
* the same file into ``gclab/recordings/`` (package data), where the planner reads it
  (`gclab.sizing.speed.load_calibration`).

    python benchmarks/planner_calibration.py            # measure, fit, write
    python benchmarks/planner_calibration.py --refit    # fit the recorded measurements again

By default it times every candidate at ``cpu-8x128`` and six at ``cpu-16x512`` (about ten
minutes on 2 cores); ``--presets A,B`` times every candidate at A and the six at the others
(on a GPU, presets large enough to keep it busy, e.g. ``graphcast-small``). The recording is
named after the device (``cpu``, or the card: ``planner-calibration-h100``), the name
`gclab.sizing.speed.speed_for` looks for. A candidate whose compiled plan does not fit the
device's usable memory (`gclab.devices.fits`; e.g. ``none`` of ``graphcast-small`` on a
16 GB card) is not run: one line says so, and the recording lists it under ``skipped``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Optional

from gclab import devices
from gclab.config import get_preset
from gclab.files import write_text_atomic
from gclab.limits import TooLarge, format_bytes
from gclab.measure import machine
from gclab.measure.peak import memory_stats
from gclab.memory.config import MemoryConfig
from gclab.sizing.planner import ladder
from gclab.sizing.speed import calibration_name, fit_calibration, present_device
from gclab.sizing.step import StepSpec, compile_train_step

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SHIPPED = ROOT / "gclab" / "recordings"
#: Candidates timed at the larger CPU preset (each step takes seconds there).
LARGE_LABELS = ("none", "gam", "per-step", "per-step+all-blocks", "deepmind", "lean")
DEFAULT_PRESETS = "cpu-8x128,cpu-16x512"


def hardware() -> dict:
    return machine()


def in_use_bytes() -> int:
    """Bytes this process's arrays hold on its device now (``bytes_in_use``; 0 where the
    device reports none, as a CPU): the warmed candidates keep their state there."""
    import jax

    stats = memory_stats(jax.devices()[0])
    value = stats.get("bytes_in_use") if stats is not None else None
    return int(value) if isinstance(value, int) and value > 0 else 0


def live_step(spec: StepSpec, usable: Optional[int]):
    """A warmed runnable step of `spec` (`gclab.sizing.make_live_step`), or why it is not
    run: its compiled plan does not fit `usable` bytes less what the candidates warmed
    before it hold on the device (`in_use_bytes`; `gclab.devices.fits`; None: no allocator
    limit, as on a CPU), or it was refused as too large (`gclab.limits.TooLarge`).
    """
    planned, held = [], in_use_bytes() if usable is not None else 0

    def run_if(memory) -> bool:
        planned.append(memory.total_bytes)
        return usable is None or devices.fits(memory.total_bytes, usable - held)

    try:
        step = compile_train_step(spec, live=True, run_if=run_if)
    except TooLarge as e:
        return None, (str(e).strip().splitlines() or [""])[0]
    if step.run is None:
        kept = (f" less {format_bytes(held)} the candidates warmed before it hold"
                if held else "")
        return None, (f"plan {format_bytes(planned[-1])} does not fit this device's "
                      f"{format_bytes(usable)} usable{kept} (plans up to "
                      f"{devices.FIT_MARGIN:.0%} of it)")
    step.run()  # compiled and run once, so that timed calls measure the step alone
    return step.run, ""


def measure(preset_name: str, labels, repeats: int) -> tuple[list[dict], list[dict]]:
    """Median step seconds of each candidate, timed in interleaved rounds.

    Returns:
      `(rows, skipped)`: a row per timed candidate; a row (with the reason) per candidate
      not run because its plan does not fit the device (`live_step`).
    """
    preset = get_preset(preset_name)
    usable = devices.usable_bytes()
    cands = [(label, mem) for label, mem in ladder(preset.model.processor_steps)
             if labels is None or label in labels]
    steps, skipped = {}, []
    for label, mem in cands:
        t0 = time.perf_counter()
        run, why = live_step(StepSpec(preset.model, preset.task, mem), usable)
        if run is None:
            print(f"{preset_name} {label}: skipped, {why}", flush=True)
            skipped.append({"preset": preset_name, "label": label, "batch": 1, "rollout": 1,
                            "memory": dataclasses.asdict(mem), "skipped": why})
            continue
        steps[label] = run
        print(f"{preset_name} {label}: compiled and warmed in {time.perf_counter() - t0:.1f} s",
              flush=True)
    seconds = {label: [] for label in steps}
    for _ in range(repeats):  # interleaved, so a busy moment hits every candidate alike
        for label, run in steps.items():
            t0 = time.perf_counter()
            run()
            seconds[label].append(time.perf_counter() - t0)
    rows = []
    for label, mem in cands:
        if label not in steps:
            continue
        v = sorted(seconds[label])
        rows.append({"preset": preset_name, "label": label, "batch": 1, "rollout": 1,
                     "memory": dataclasses.asdict(mem), "median_seconds": v[len(v) // 2],
                     "all_seconds": seconds[label]})
        print(f"{preset_name} {label}: {1e3 * rows[-1]['median_seconds']:.0f} ms", flush=True)
    return rows, skipped


def finish(record: dict) -> dict:
    """Adds the fit (and each measurement's prediction) to a record of measurements."""
    rows = record["measurements"]
    specs = [StepSpec(get_preset(r["preset"]).model, get_preset(r["preset"]).task,
                      MemoryConfig(**r["memory"]), r["batch"], r["rollout"]) for r in rows]
    fit = fit_calibration(specs, [r["median_seconds"] for r in rows])
    record["fit"] = fit.to_dict()
    for r, s in zip(rows, specs):
        r["flops"], r["bytes"], r["held_bytes"] = fit.work(s)
        r["predicted_seconds"] = fit.seconds(s)
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refit", action="store_true",
                        help="fit the recorded measurements again without timing")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--presets", default=DEFAULT_PRESETS,
                        help="comma-separated presets: every candidate at the first, "
                        + ", ".join(LARGE_LABELS) + " at the others")
    args = parser.parse_args(argv)
    presets = args.presets.split(",")
    for preset_name in presets:
        try:
            get_preset(preset_name)
        except ValueError as e:
            parser.error(f"--presets {args.presets}: {e}")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: an integer >= 1")
    name = calibration_name(present_device())
    out = RESULTS / f"{name}.json"
    if args.refit:
        if not out.exists():
            parser.error(f"--refit: no recorded {out.name} for this device; run without "
                         f"--refit first")
        record = finish(json.loads(out.read_text()))
    else:
        rows, skipped = [], []
        for i, preset_name in enumerate(presets):
            labels = None if i == 0 else LARGE_LABELS
            repeats = args.repeats if i == 0 else max(2, args.repeats - 2)
            timed, left_out = measure(preset_name, labels, repeats)
            rows += timed
            skipped += left_out
        record = {"hardware": hardware(), "measurements": rows, "skipped": skipped}
        # The measurements are kept even if the fit fails, but never over a fitted record:
        # beside it, where one is there already.
        kept = out if not out.exists() else out.with_name(f"{name}-failed.json")
        measured = json.dumps(record, indent=1)
        if len(rows) < 3:
            write_text_atomic(kept, measured)
            print(f"planner_calibration.py: error: --presets {args.presets}: {len(rows)} "
                  f"candidate(s) fit this device's memory and were timed; the fit needs at "
                  f"least 3 (choose smaller presets); measurements kept in {kept}",
                  file=sys.stderr)
            return 2
        try:
            record = finish(record)
        except Exception:
            write_text_atomic(kept, measured)
            raise
    text = json.dumps(record, indent=1)
    write_text_atomic(out, text)
    write_text_atomic(SHIPPED / f"{name}.json", text)
    fit = record["fit"]
    print(f"fit: {fit['seconds_per_gflop'] * 1e3:.3g} ms/GFLOP, "
          f"{fit['seconds_per_gib'] * 1e3:.3g} ms/GiB moved, "
          f"{fit['seconds_per_held_gib'] * 1e3:.3g} ms/GiB held, "
          f"overhead {fit['overhead_seconds'] * 1e3:.3g} ms; "
          f"median relative error {fit['median_relative_error']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
