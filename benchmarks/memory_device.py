"""The recipe benchmark on the accelerator it finds, in stages, within a time budget.

`memory_recipes.py` records every figure in one go (about 10 minutes on 2 CPU cores); a
lent accelerator is held for minutes, so this script runs the same measurements in stages,
most wanted first, and rewrites ``memory-<backend>.json`` and ``.md`` after each stage, so
that a run cut short keeps what it finished; an earlier record at that path (unless it is
the one merged) is first moved beside it, to ``memory-<backend>.previous.json`` and ``.md``,
so that such a run cannot replace it. A stage is started only while the budget
lasts. The file has the layout of ``memory-cpu.json`` (the README and the chapters read
both), plus ``claim_live`` and ``stages``.

Stages:
  claim       the authors' recipe (`deepmind`, bfloat16, 0.25 deg, 37 levels, batch 1):
              compiled total of each change of the ladder, largest buffers at the peak
  claim-live  `deepmind` in bfloat16 at 0.25 deg run in a fresh process: the device's
              measured peak (``peak_bytes_in_use``) and the median step time
  recipes-f32, recipes-bf16
              every recipe at graphcast-small, then at graphcast (compiled); rows
              already in the merged record (--merge) are kept, not compiled again
  layer-norm  bfloat16 error against float32 by LayerNorm rule (on this device)
  step-time   median step time of `none`, `deepmind`, `lean` at cpu-16x512

    python benchmarks/memory_device.py --budget 420 --out DIR
    python benchmarks/memory_device.py --stages claim,recipes-bf16 --merge OLD.json
    python benchmarks/memory_device.py --report RECORD.json --log RUN.log  # no device work

`--report` rewrites a record's ``.md`` and, with ``--log`` (the run's printed output, XLA's
warnings included), marks the rows whose compile XLA's rematerialization pass reported: on
a GPU, XLA recomputes values by itself when a program's memory exceeds a limit it sets
from the card, so such a row is what the pass achieved, not the recipe alone.

Without an accelerator it refuses (one line, exit status 2): `memory_recipes.py` records
the CPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Optional  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

# XLA's report of its remat pass (one pattern), and the earlier record set aside.
from record_gpu import XLA_REMAT, set_aside  # noqa: E402

STAGES = ("claim", "claim-live", "recipes-f32", "recipes-bf16", "layer-norm", "step-time")
PRESETS = ("graphcast-small", "graphcast")


def fail(message: str) -> int:
    print(f"memory_device.py: error: {message}", file=sys.stderr)
    return 2


def parse_stages(text: str) -> list:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in STAGES]
    if unknown or not names:
        raise ValueError(f"--stages {text!r}: a comma-separated list of {', '.join(STAGES)}")
    return names


ROW = re.compile(r"^(\S+)\s+(f32|bf16)\s+(\S+)\s+temp\s")


def xla_remat_reports(log: str) -> dict:
    """`{(preset, precision, recipe): {...}}` from a run's output: each warning of XLA's
    rematerialization pass belongs to the next recipe row printed (printed after its
    compile)."""
    found, pending = {}, []
    for line in log.splitlines():
        m = XLA_REMAT.search(line)
        if m:
            limit, reached, start = map(int, m.groups())
            pending.append({"limit_bytes": limit, "reduced_to_bytes": reached,
                            "from_bytes": start})
            continue
        m = ROW.match(line)
        if m and pending:
            found[m.groups()] = pending[-1]
            pending = []
    return found


def report_lines(record: dict) -> list:
    """The lines `memory_recipes.markdown` has no place for: the run, XLA's own remat."""
    gib = 2**30
    hw = record["hardware"]
    lines = ["", f"gclab commit {hw.get('commit', 'unknown')}, XLA on {hw['device']}, jax "
             f"{hw['jax']}. Stages: " + "; ".join(
                 f"{name} {st.get('date', '')[:16] or 'earlier run'}"
                 + ("" if st["status"] == "done" else f" ({st['status'].splitlines()[0]})")
                 for name, st in record.get("stages", {}).items()) + "."]
    earlier = record.get("hardware_earlier")
    if earlier:
        lines[-1] += (" Stages and recipe rows without a date are kept from an earlier run "
                      f"on {earlier['device']} "
                      f"(jax {earlier['jax']}, commit {earlier.get('commit', 'unknown')}, "
                      f"{earlier['date'][:16]}).")
    live = record.get("claim_live")
    if live and live.get("peak_bytes"):
        lines += ["", f"`deepmind` in bfloat16 at {live['preset']}, run on "
                  f"{record['hardware']['device']} ({live['steps']} timed steps in a fresh "
                  f"process): measured peak {live['peak_bytes'] / gib:.2f} GiB "
                  f"(`peak_bytes_in_use`) against the compiled total of "
                  f"{live['plan_total_bytes'] / gib:.2f} GiB (ratio "
                  f"{live['measured_over_plan']:.3f}); median step "
                  f"{live['step_seconds']:.3f} s."]
    marked = [r for r in record["recipes"] if r.get("xla_remat")]
    if marked:
        lines += ["", "XLA's rematerialization pass reported that it could not bring these "
                  "programs under its limit; the temp above is what it reached (other rows "
                  "above the limit may have been reduced without a report):", "",
                  "| preset | precision | recipe | XLA's limit | before the pass | after |",
                  "|---|---|---|---:|---:|---:|"]
        for r in marked:
            x = r["xla_remat"]
            lines.append(f"| {r['preset']} | {r['precision']} | {r['recipe']} | "
                         f"{x['limit_bytes'] / gib:.2f} GiB | {x['from_bytes'] / gib:.2f} GiB | "
                         f"{x['reduced_to_bytes'] / gib:.2f} GiB |")
    return lines


def claim_live(repeats: int = 3, timeout: float = 400.0) -> dict:
    """`deepmind` in bfloat16 at 0.25 deg, run: measured device peak against the plan.

    Raises:
      RuntimeError: the measurement did not finish (`measure_peak`'s status ``oom`` or
        ``error``): the stage fails, and a measurement merged from an earlier run stays.
    """
    from gclab.config import get_preset
    from gclab.measure import measure_peak
    from gclab.memory import get_recipe
    from gclab.sizing import StepSpec, train_step_memory

    preset = get_preset("graphcast")
    spec = StepSpec(preset.model, preset.task, get_recipe("deepmind", "bf16"))
    plan = train_step_memory(spec)
    r = measure_peak("gclab.sizing.sweep:timed_steps",
                     {"spec_json": spec.to_json(), "steps": repeats}, timeout=timeout)
    if r.status != "ok":
        why = (r.message or "").strip().splitlines()
        raise RuntimeError(f"claim-live: the measured step ended with status {r.status!r}"
                           + (f": {why[0][:500]}" if why else ""))
    return {"preset": preset.name, "recipe": "deepmind", "precision": "bf16",
            "plan_total_bytes": plan.total_bytes, "plan_temp_bytes": plan.temp_bytes,
            "measure_status": r.status, "measure_message": r.message[:2000],
            "peak_bytes": r.peak_bytes,
            "measured_over_plan": (r.peak_bytes / plan.total_bytes) if r.peak_bytes else None,
            "step_seconds": (r.result or {}).get("step_seconds"), "steps": repeats}


def render(record: dict) -> tuple:
    """(JSON, Markdown) of the record, its targets checked again."""
    import memory_recipes as mr

    record["targets"] = mr.targets(record["recipes"], record["rollout"], record["step_time"])
    return json.dumps(record, indent=1, default=str), markdown(record)


def write(path: Path, record: dict, rendered: Optional[tuple] = None) -> None:
    """The record, its targets checked again, and its .md (`rendered`, where already made);
    the record into the package too where it is the results folder's (the chapters read it
    from there, `gclab.recordings`)."""
    import memory_recipes as mr

    from gclab.files import write_text_atomic

    text, md = rendered or render(record)
    write_text_atomic(path, text)
    write_text_atomic(path.with_suffix(".md"), md)
    if path.parent.resolve() == mr.RESULTS.resolve():
        write_text_atomic(mr.SHIPPED.parent / path.name, text)


def markdown(record: dict) -> str:
    import memory_recipes as mr

    return mr.markdown(record["hardware"], record["recipes"], record["rollout"],
                       record["step_time"], record["targets"], record["layer_norm_bf16_error"],
                       record.get("authors_claim")) + "\n".join(report_lines(record)) + "\n"


def report(path: Path, log_path) -> int:
    """Writes `path`'s .md again, first marking the rows XLA's remat pass reported."""
    try:
        record = json.loads(path.read_text())
        record["recipes"], record["hardware"]["device"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return fail(f"--report {path}: not a record of this script ({e!r})")
    try:
        log = log_path.read_text(errors="replace") if log_path else ""
    except OSError as e:
        return fail(f"--log {log_path}: cannot be read ({e.strerror})")
    try:  # made in full before anything is written: a record of another shape stays as it was
        if log_path:
            found = xla_remat_reports(log)
            for r in record.get("recipes", []):
                key = (r["preset"], r["precision"], r["recipe"])
                r.pop("xla_remat", None)
                if key in found:
                    r["xla_remat"] = found[key]
        rendered = render(record)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as e:
        return fail(f"--report {path}: not a record of this script ({e!r})")
    write(path, record, rendered)
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default=None,
                        help="seconds: start no stage after this many have passed")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help=f"comma-separated, in the order run (default: {','.join(STAGES)})")
    parser.add_argument("--report", type=Path, default=None,
                        help="a record to write again as .md (with --log), measuring nothing")
    parser.add_argument("--log", type=Path, default=None,
                        help="with --report: the run's output, read for XLA's remat warnings")
    parser.add_argument("--merge", type=Path, default=None,
                        help="a record of an earlier run on the same kind of device: its "
                             "figures are kept where this run does not measure them again")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder of the results (default: benchmarks/results)")
    args = parser.parse_args(argv)
    try:
        stages = parse_stages(args.stages)
    except ValueError as e:
        return fail(str(e))
    if args.budget is not None:
        try:
            budget = float(args.budget)
        except ValueError:
            budget = -1.0
        if not budget > 0:
            return fail(f"--budget {args.budget}: a positive number of seconds")
        args.budget = budget
    if args.log and not args.report:
        return fail("--log: only with --report")
    if args.report:
        return report(args.report, args.log)

    import jax

    if jax.default_backend() == "cpu":
        return fail("no accelerator found (JAX backend 'cpu'): memory_recipes.py records the "
                    "CPU")
    import memory_recipes as mr
    from record_gpu import commit

    start = time.monotonic()
    hw = mr.hardware()
    hw["device_kind"] = jax.devices()[0].device_kind
    hw["commit"] = commit()
    out = args.out or mr.RESULTS
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"memory-{hw['backend']}.json"
    record = {"hardware": hw, "recipes": [], "rollout": [], "step_time": None,
              "layer_norm_bf16_error": [], "stages": {}}
    if args.merge:
        try:
            earlier = json.loads(args.merge.read_text())
            earlier_kind = earlier["hardware"].get("device_kind")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return fail(f"--merge {args.merge}: not a record of this script ({e!r})")
        if earlier_kind != hw["device_kind"]:
            return fail(f"--merge {args.merge}: recorded on "
                        f"{earlier_kind}, not {hw['device_kind']}")
        record.update({k: v for k, v in earlier.items() if k not in ("hardware", "targets")})
        record["hardware_earlier"] = earlier["hardware"]

    # Set aside once, at this run's first save: later ones rewrite its own file. A record
    # merged from the same path is carried whole into this one, so nothing needs keeping.
    earlier = [] if not args.merge or args.merge.resolve() != path.resolve() else [None]

    def save():
        if not earlier:
            earlier.append(set_aside(path, "memory_device.py", ".md"))
        write(path, record)

    def recipes(precision):
        for preset_name in PRESETS:
            for recipe in mr.RECIPES:
                if any((r["preset"], r["precision"], r["recipe"]) ==
                       (preset_name, precision, recipe) for r in record["recipes"]):
                    continue
                record["recipes"].append({**mr.recipe_row(preset_name, precision, recipe),
                                          "date": mr.hardware()["date"]})
                save()

    runs = {
        "claim": lambda: record.update(authors_claim=mr.authors_claim()),
        "claim-live": lambda: record.update(claim_live=claim_live()),
        "recipes-f32": lambda: recipes("f32"),
        "recipes-bf16": lambda: recipes("bf16"),
        "layer-norm": lambda: record.update(layer_norm_bf16_error=mr.layer_norm_errors()),
        "step-time": lambda: record.update(step_time=mr.step_times("cpu-16x512")),
    }
    for name in stages:
        elapsed = time.monotonic() - start
        if args.budget is not None and elapsed > args.budget:
            record["stages"][name] = {"status": "not started: budget spent",
                                      "started_after_seconds": None}
            continue
        t0 = time.monotonic()
        print(f"== stage {name} ({elapsed:.0f} s in)", flush=True)
        try:
            runs[name]()
            status = "done"
        except Exception:  # a stage that breaks is recorded; the next one still runs
            status = "failed: " + traceback.format_exc()[-3000:]
            print(status, flush=True)
        record["stages"][name] = {"status": status, "date": mr.hardware()["date"],
                                  "started_after_seconds": round(elapsed, 1),
                                  "seconds": round(time.monotonic() - t0, 1)}
        save()
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
