"""Writes the README's measured blocks from the recorded result files.

The README shows numbers only through this script: the official code's temporaries at
0.25 deg in its opening come from `benchmarks/results/official-cpu.json`
(`official_side_by_side.py`), the recipe tables from
`benchmarks/results/memory-cpu.json` (written by `memory_recipes.py`) and
`benchmarks/results/memory-gpu.json` (`memory_device.py`, on a GPU), the planner
example from `benchmarks/results/plan-example-cpu.json` (`plan_example.py`: the output of
`gclab plan --budget T4 --preset graphcast-small`), the book's build time from
`benchmarks/results/book-build-cpu.json` (written by `book_build.py`), the CI run from
`benchmarks/results/ci-run-cpu.json` (`ci_run.py`), the per-device
table from `benchmarks/results/parallel-memory-cpu-*.json` (written by `parallel_memory.py`),
the cluster plans from `benchmarks/results/cluster-plans-cpu.json` (`cluster_plans.py`),
the chapters' profiles from `benchmarks/results/chapter-profile-cpu*.json` (`chapter_profile.py`),
the test command's profile from `benchmarks/results/suite-profile-cpu.json` (`suite_profile.py`),
the chapters' runs on a card from `gclab/recordings/gpu-*.json` (`record_gpu.py`, shipped with
gclab so that the chapters read them).
`tests/test_readme.py` checks that the README matches them.

    python benchmarks/update_readme.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's gclab, for its declared JAX range
from gclab.versions import jax_in_range, supported_jax  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GIB = 2**30


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _temp_table(rows: dict, recipes: tuple, mark=lambda row: "") -> list:
    """Compiled temp per model and precision (rows) and recipe (columns), each cell followed
    by `mark(row)`."""
    lines = ["| model | " + " | ".join(f"`{r}`" for r in recipes) + " |",
             "|---|" + "---:|" * len(recipes)]
    for preset, title in (("graphcast-small", "graphcast-small (1 deg, {})"),
                          ("graphcast", "graphcast (0.25 deg, 37 levels, {})")):
        for precision in ("f32", "bf16"):
            if all((preset, precision, r) in rows for r in recipes):
                lines.append(f"| {title.format(precision)} | " + " | ".join(
                    _gib(rows[(preset, precision, r)]["temp_bytes"])
                    + mark(rows[(preset, precision, r)]) for r in recipes) + " |")
    return lines


def memory_block() -> str:
    record = json.loads((RESULTS / "memory-cpu.json").read_text())
    rows = {(r["preset"], r["precision"], r["recipe"]): r for r in record["recipes"]}
    hw = record["hardware"]
    recipes = ("none", "per-step", "deepmind", "lean")
    again = "".join(f" ({p} rows: {record[f'hardware_{p}']['date'][:10]})"
                    for p in ("f32", "bf16") if f"hardware_{p}" in record)
    lines = [f"Measured on {hw['device']} ({hw['cpu_count']} cores), jax {hw['jax']}, "
             f"{hw['date'][:10]}{again}:", "", *_temp_table(rows, recipes)]
    checks = {c["target"]: c for c in record["targets"]}
    rollout = next(c for name, c in checks.items() if name.startswith("rollout"))
    lines += ["", f"Rollouts with `rollout_remat`: 12 steps need {rollout['value']:.2f}x the "
              "temp of one. Targets met: "
              f"{sum(c['met'] for c in checks.values())} of {len(checks)} (see the full table)."]
    claim = record.get("authors_claim")
    if claim:
        steps = {r["step"]: r for r in claim["rows"]}
        peak = claim["peak"]
        lines += ["", "The authors' recipe in bfloat16 at 0.25 deg needs "
                  f"{_gib(steps['deepmind']['total_bytes'])} in all (arguments + outputs + temp) "
                  "against the 32 GB per TPU v4 chip GraphCast was trained in: "
                  f"{_gib(peak['grid_sized_bytes'])} of its "
                  f"{_gib(peak['peak_bytes'])} peak are buffers with one row per grid node. "
                  "Streaming the grid nodes through its edge blocks too brings it to "
                  f"{_gib(steps['stream-grid-nodes']['total_bytes'])}."]
        if "memory-first-schedule" in steps:
            lines[-1] += (" XLA:CPU's own instruction order costs part of it: ordered for "
                          "memory instead of concurrency "
                          "(`--xla_cpu_enable_concurrency_optimized_scheduler=false`), the "
                          "recipe as described needs "
                          f"{_gib(steps['memory-first-schedule']['total_bytes'])}.")
    return "\n".join(lines)


def official_block() -> str:
    """The official code's compiled temp at 0.25 deg (`official_side_by_side.py`'s record)."""
    record = json.loads((RESULTS / "official-cpu.json").read_text())
    temp = {r["precision"]: r["official"]["temp_bytes"] for r in record["memory"]
            if r["config"] == "graphcast"}
    return (f"GraphCast training is bound by activations on edges, not by parameters: the public\n"
            f"code, with its bfloat16 cast, plans {temp['bf16'] / GIB:.0f} GiB of temporaries "
            f"for one training step at\n0.25 deg ({temp['f32'] / GIB:.0f} GiB in float32; "
            "XLA:CPU, [`benchmarks/results/official-cpu.md`](benchmarks/results/official-cpu.md)),")


def memory_gpu_block() -> str:
    record = json.loads((RESULTS / "memory-gpu.json").read_text())
    rows = {(r["preset"], r["precision"], r["recipe"]): r for r in record["recipes"]}
    hw = record["hardware"]
    recipes = ("none", "per-step", "deepmind", "lean")
    supported = supported_jax()
    outside = (f" (newer than the range gclab declares, `jax{supported}`: the GPU machine's "
               "own JAX)" if supported and not jax_in_range(hw["jax"], supported) else "")
    lines = [f"Measured on an {hw['device']} (XLA:GPU), jax {hw['jax']}{outside}, "
             f"{hw['date'][:10]}, compiled temp:", "",
             *_temp_table(rows, recipes, lambda row: " *" if row.get("xla_remat") else "")]
    # A program XLA's pass shrank (in either precision) has the ratio that pass reached, not
    # bfloat16's: the range leaves it out, as chapters 4 and 5 do.
    pairs = [(rows[(p, "bf16", r)], rows[(p, "f32", r)]) for p in ("graphcast-small", "graphcast")
             for r in recipes if (p, "bf16", r) in rows and (p, "f32", r) in rows]
    ratios = [b["temp_bytes"] / f["temp_bytes"] for b, f in pairs
              if not (b.get("xla_remat") or f.get("xla_remat"))]
    marked = [r for r in record["recipes"] if r.get("xla_remat")]
    if marked:
        limit = marked[0]["xla_remat"]["limit_bytes"]
        lines += ["", f"\\* XLA's own rematerialization pass shrank these programs towards its "
                  f"limit on this card ({_gib(limit)}), which they still exceed."]
    claim = {r["step"]: r for r in record["authors_claim"]["rows"]}
    live = record.get("claim_live") or {}
    ran = (f" Run on the {hw['device']}, it peaked at {_gib(live['peak_bytes'])} "
           f"(`peak_bytes_in_use`, {live['measured_over_plan']:.3f} of the plan), "
           f"{live['step_seconds']:.2f} s a step." if live.get("peak_bytes") else "")
    lines += ["", "On XLA:GPU the authors' recipe in bfloat16 at 0.25 deg needs "
              f"{_gib(claim['deepmind']['total_bytes'])} in all (arguments + outputs + temp), "
              f"{'within' if claim['deepmind']['total_bytes'] <= 32e9 else 'above'} "
              f"the 32 GB per TPU v4 chip GraphCast was trained in.{ran} bfloat16 "
              f"temp is {min(ratios):.2f} to {max(ratios):.2f} of float32 temp across the rows "
              f"of the published sizes{' that the pass did not shrink' if marked else ''}."]
    return "\n".join(lines)


def gpu_chapters_block() -> str:
    """The chapters' configurations as `record_gpu.py` ran them on a card, one table per
    recording shipped in ``gclab/recordings``."""
    lines = []
    for path in sorted((ROOT / "gclab" / "recordings").glob("gpu-*.json")):
        if ".previous" in path.name:  # an earlier recording a later run set aside (record_gpu)
            continue
        record = json.loads(path.read_text())
        hw = record["hardware"]
        if lines:
            lines.append("")
        lines += [f"`{path.name}`: scale {record['scale']}, {hw['device']} (XLA:GPU), jax "
                  f"{hw['jax']}, {record['date'][:10]}, gclab commit {str(hw['commit'])[:12]}"
                  + ("" if record.get("complete", True) else " (incomplete)") + ":", "",
                  "| chapter | configuration | plan | measured peak | peak / plan | step |",
                  "|---|---|---:|---:|---:|---:|"]
        for r in record["rows"]:
            plan = _gib(r["plan_bytes"]) if r.get("plan_bytes") else "n/a"
            if r.get("xla_remat"):  # what XLA's own pass reached, not the recipe's plan
                plan += " †"
            if r.get("peak_bytes"):
                peak, ratio = _gib(r["peak_bytes"]), f"{r['measured_over_plan']:.3f}"
                step = f"{r['step_seconds']:.2f} s"
            else:
                why = ("does not fit the card" if r.get("fits") is False else
                       f"failed on the card ({r['measure_status']})"
                       if r.get("measure_status") in ("oom", "error") else
                       "not measured \\*" if r.get("fits") and r.get("measure_message") else
                       "not measured" if r.get("fits") else "failed")
                peak, ratio, step = why, "", ""
            lines.append(f"| {r['chapter']} | {r['label']} | {plan} | {peak} | {ratio} | {step} |")
        shrunk = [r for r in record["rows"] if r.get("xla_remat")]
        if shrunk:
            lines += ["", "† XLA:GPU's own rematerialization pass shrank this plan while "
                      "compiling, towards its limit on the card, which it could not reach: "
                      + "; ".join(f"{r['label']} from {_gib(r['xla_remat']['from_bytes'])}"
                                  for r in shrunk) + "."]
        unmeasured = [r["measure_message"] for r in record["rows"] if r.get("measure_message")]
        if unmeasured:  # the run's own reason, as the chapters show it
            lines += ["", f"\\* {unmeasured[0].split('; measure from')[0]}."]
    return "\n".join(lines) if lines else "No chapter has been recorded on a card yet."


def plan_block() -> str:
    record = json.loads((RESULTS / "plan-example-cpu.json").read_text())
    hw = record["hardware"]
    return (f"Recorded with `python benchmarks/plan_example.py` ({hw['cpu cores']}-core "
            f"{hw['backend']}, {hw['versions']}, {hw['date'][:10]}, commit "
            f"{record['commit']}):\n\n```\n$ {record['command']}\n{record['output']}\n```")


def book_block() -> str:
    record = json.loads((RESULTS / "book-build-cpu.json").read_text())
    hw = record["hardware"]
    chapters = ", ".join(f"{name.split('_')[0]} {seconds:.0f} s"
                         for name, seconds in record["chapter_execution_seconds"].items())
    steps = record.get("step_seconds", {})
    pip = (f" (`pip install` {steps['pip install'] / 60:.1f} of them, into a "
           f"{record['environment']})" if "pip install" in steps else "")
    at_once = record.get("chapters_at_once", 1)
    side = (f"; chapter execution times, {at_once} chapters at a time (each sharing the "
            f"machine): " if at_once > 1 else "; chapter execution times: ")
    cpu = record.get("chapter_cpu_seconds")
    cores = hw["cpu cores"]
    floor = (f" The chapters' kernels used {cpu / 60:.1f} minutes of processor time, so on "
             f"{cores} cores no schedule runs them in less than {cpu / cores / 60:.1f} minutes."
             if cpu else "")
    load = record.get("load_average_1min")  # older records have neither
    when = "".join([f", commit {record['commit']}" if "commit" in record else "",
                    f", load average {load['before']:g} before" if load else ""])
    return (f"Measured with `python benchmarks/book_build.py` on a fresh clone "
            f"({cores}-core {hw['backend']}, {hw['host memory']} RAM, {record['date']}{when}): "
            f"{record['total_seconds'] / 60:.1f} minutes in all{pip}{side}{chapters}.{floor}")


def ci_block() -> str:
    record = json.loads((RESULTS / "ci-run-cpu.json").read_text())
    if not record["passed"]:
        raise ValueError("the recorded CI run failed: it has no time to show")
    hw, phases = record["hardware"], record["phase_seconds"]
    pytest_seconds = next(v for k, v in phases.items() if k.startswith("pytest"))
    load = record["load_average_1min"]
    chapters = ", ".join(f"{s['item'].split('/')[1].split('_')[0]} {s['seconds']:.0f} s"
                         for s in record["slowest"] if s["item"].startswith("book/"))
    return (f"Measured with `python benchmarks/ci_run.py` (`bash .ci/run` on a fresh clone, "
            f"{record['environment']}; {hw['cpu cores']}-core {hw['backend']}, "
            f"{hw['host memory']} RAM, {record['date']}, commit {record['commit']}, load "
            f"average {load['before']:g} before): {record['total_seconds'] / 60:.1f} minutes in "
            f"all, the tests and chapters {pytest_seconds / 60:.1f} of them "
            f"({record['pytest_summary']}, on two workers); the slowest chapters under nbmake: "
            f"{chapters}.")


#: The chapter profiles the README compares (`chapter_profile.py`), each with the compiler
#: settings it was made under: the first is the book's own; the others were run with the
#: ``XLA_FLAGS`` they record (at an earlier commit, for the emitter everywhere).
PROFILES = {
    "chapter-profile-cpu.json": "the book's: plans with the older emitter, runs with defaults",
    "chapter-profile-cpu-elemental-emitter.json": "older emitter for every compile",
    "chapter-profile-cpu-default-emitters.json": "default emitters for every compile",
    "chapter-profile-cpu-test-flags.json": "the tests' flags (CI), every compile",
}


def profile_block() -> str:
    records = {name: json.loads((RESULTS / name).read_text()) for name in PROFILES
               if (RESULTS / name).is_file()}
    book = records["chapter-profile-cpu.json"]  # its chapters head the columns
    chapters = [c["chapter"].split("_")[0] for c in book["chapters"]]
    lines = ["| compiles | commit, date | " + " | ".join(chapters) + " | all |",
             "|---|---|" + "---:|" * (len(chapters) + 1)]
    for name, record in records.items():
        flags = f" (`XLA_FLAGS={record['xla_flags']}`)" if record.get("xla_flags") else ""
        cells = [f"{c['seconds']:.0f} ({c['compile_seconds']:.0f})" for c in record["chapters"]]
        lines.append(f"| {PROFILES[name]}{flags} | {record['commit']}, {record['date']} | "
                     + " | ".join(cells)
                     + f" | **{record['seconds']:.0f}** ({record['compile_seconds']:.0f}) |")
    hw = book["hardware"]
    return "\n".join([f"Seconds per chapter, XLA compiles in brackets, one chapter after another "
                      f"from an empty compilation cache ({hw['cpu cores']}-core {hw['backend']}, "
                      f"{hw['versions'].split(',')[0]}):", "", *lines])


def suite_block(shown: int = 8) -> str:
    """The test command's profile (`suite_profile.py`): its totals and its longest files."""
    record = json.loads((RESULTS / "suite-profile-cpu.json").read_text())
    hw = record["hardware"]
    processes = sum(record["processes_with_jax"].values())
    lines = [f"From an empty compilation cache ({hw['cpu cores']}-core {hw['backend']}, "
             f"{hw['versions'].split(',')[0]}, {record['date']}, commit {record['commit']}; "
             f"{record['pytest_summary']}): {record['wall_seconds'] / 60:.1f} minutes, in "
             f"which the items took {record['item_seconds']:.0f} s of the two workers' time, "
             f"and the {processes} processes that started JAX spent "
             f"{record['compile_seconds']:.0f} s in XLA compiles and "
             f"{record['trace_and_lower_seconds']:.0f} s tracing and lowering. The {shown} "
             "files and chapters that took longest (processes: those "
             "in which JAX traced or compiled for them):", "",
             "| file or chapter | items | seconds | compiles | tracing and lowering | "
             "processes |", "|---|---:|---:|---:|---:|---:|"]
    for row in record["files"][:shown]:
        lines.append(f"| `{row['file']}` | {row['items']} | {row['seconds']:.0f} | "
                     f"{row['compile_seconds']:.0f} | {row['trace_and_lower_seconds']:.0f} | "
                     f"{row['processes']} |")
    return "\n".join(lines)


def parallel_block() -> str:
    records = [json.loads((RESULTS / f"parallel-memory-cpu-{name}.json").read_text())
               for name in ("1deg", "025deg")]
    hw = records[0]["hardware"]
    lines = [f"Compiled per device on {hw['simulated_devices']} simulated CPU devices "
             f"({hw['cpu_count']}-core {hw['backend']}, jax {hw['jax']}, "
             + ", ".join(sorted({r["hardware"]["date"][:10] for r in records})) + "), "
             "`lean`, batch 1, spatial layouts:", "",
             "| model | mesh nodes | " + " | ".join(f"{d} device{'s' * (d > 1)}"
                                                  for d in (1, 2, 4, 8))
             + " | collectives / step at 8 | predicted step at 1 / 8 |",
             "|---|---|" + "---:|" * 6]
    for record in records:
        rows = record["rows"]
        one = next(r for r in rows if r["devices"] == 1)
        for kind in ("split", "replicated"):
            layouts = {r["devices"]: r for r in rows if r["batch"] == 1 and r["devices"] > 1
                       and ("mesh-nodes:replicated" in r["parallel"]) == (kind == "replicated")}
            if 8 not in layouts:
                continue
            base = one["temp_bytes"]
            cells = [_gib(base)] + [
                f"{_gib(layouts[d]['temp_bytes'])} ({layouts[d]['temp_bytes'] / base:.2f})"
                if d in layouts else "" for d in (2, 4, 8)]
            lines.append(f"| {one['preset']} | {kind} | " + " | ".join(cells)
                         + f" | {_gib(layouts[8]['collective_bytes'])} | "
                         f"{one['predicted_seconds'] * 1e3:.0f} / "
                         f"{layouts[8]['predicted_seconds'] * 1e3:.0f} ms |")
    rows = records[1]["rows"]
    one = next(r for r in rows if r["devices"] == 1)
    eight = next(r for r in rows if r["parallel"] == "data:1,spatial:8")
    ratio = eight["temp_bytes"] / one["temp_bytes"]
    lines += ["", f"Target: the 0.25 deg `lean` step over 8 devices needs at most a quarter of "
              f"one device's temp per device: {ratio:.2f}, {'met' if ratio <= 0.25 else 'missed'}. "
              f"Predicted step times use {records[1].get('predicted_with', 'H100')}'s published "
              "speeds (`gclab plan --devices`' model: FLOPs over peak FLOP/s and bytes over "
              "memory bandwidth, split over the devices, plus the compiled collective bytes "
              "over the link)."]
    return "\n".join(lines)


def cluster_block() -> str:
    record = json.loads((RESULTS / "cluster-plans-cpu.json").read_text())
    hw = record["hardware"]
    lines = [f"`gclab plan --devices` for the published model (0.25 deg, 37 levels), compiled on "
             f"{hw['simulated_devices']} simulated CPU devices ({hw['cpu_count']}-core "
             f"{hw['backend']}, jax {hw['jax']}; "
             "`python benchmarks/cluster_plans.py`, each row on the date it names):", "",
             "| cluster | batch | precision | layout | recipe | per device | predicted step "
             "| recorded |",
             "|---|---:|---|---|---|---:|---:|---|"]
    for r in record["rows"]:
        when = r.get("date", hw["date"])[:10]  # rows re-planned later (merged) carry their own
        if r["fits"]:
            lines.append(f"| {r['cluster']} | {r['batch']} | {r['precision']} | "
                         f"`{r['parallel']}` | `{r['recipe']}` | {_gib(r['per_device_bytes'])} | "
                         f"{r['predicted_seconds'] * 1e3:.0f} ms | {when} |")
        else:
            sized = [c for c in r["candidates"] if "per_device_bytes" in c]
            least = min(sized, key=lambda c: c["per_device_bytes"])
            lines.append(f"| {r['cluster']} | {r['batch']} | {r['precision']} | nothing fits "
                         f"| (smallest: `{least['parallel']}`, `{least['recipe']}`) | "
                         f"{_gib(least['per_device_bytes'])} | | {when} |")
    lines += ["", "Per-device figures are XLA:CPU's compiled totals (arguments, outputs and "
              "temp); a plan fits within 90% of the card's usable memory. Predicted times rank "
              "candidates with each card's published speeds (TPU v4, which has no entry, with "
              "the reference card's, `gclab.sizing.speed.REFERENCE_CARD`). Chapter 8 reads the "
              "same recording."]
    return "\n".join(lines)


BLOCKS = {"official-claim": official_block, "memory-table": memory_block,
          "memory-gpu": memory_gpu_block, "gpu-chapters": gpu_chapters_block,
          "plan-example": plan_block, "book-build": book_block,
          "ci-run": ci_block, "parallel-table": parallel_block, "cluster-plans": cluster_block,
          "chapter-profiles": profile_block, "suite-profile": suite_block}


def render(readme: str) -> str:
    for name, make in BLOCKS.items():
        pattern = re.compile(rf"(<!-- {name}:start -->).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(readme):
            raise ValueError(f"README has no <!-- {name}:start/end --> block")
        block = make()
        readme = pattern.sub(lambda m, b=block: f"{m.group(1)}\n{b}\n{m.group(2)}", readme)
    return readme


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    path = ROOT / "README.md"
    tmp = path.with_name(f".{path.name}.tmp")  # written whole, then renamed into place
    tmp.write_text(render(path.read_text()))
    os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
