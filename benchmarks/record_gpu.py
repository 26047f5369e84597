"""Records the book on the GPU it finds: each chapter's live configurations and the recipes.

Every configuration is compiled from shapes first, in a fresh process; one whose plan fits
the card's usable memory (`gclab.devices`) runs in another fresh process that reads the
device's peak (``peak_bytes_in_use``) and times real steps; one that does not fit is
recorded with its plan and ``"fits": false``. The plans are compiled away from this process
because XLA:GPU autotunes a program as it compiles it, on buffers drawn from JAX's pool,
which keeps every byte it took: on an H100, compiling the 0.25 deg step of recipe `none`
left this process holding 59 GiB, and the next two measurements were refused. The work is
cut into parts that each finish within 10 minutes on an 80 GB card; each part writes one
recording (hardware, date, jax version, gclab commit inside), saved after every
configuration (an earlier recording at that path is first moved to ``<name>.previous.json``
beside it, so that a run cut short cannot replace it), into
`gclab.recordings.output_dir()`: ``$GCLAB_RECORDINGS``, else the repository's
``gclab-recordings`` (whatever the working directory), which the chapters read
(`gclab.notebook.recorded`) from ``book/``.

    python benchmarks/record_gpu.py --list              # the parts at this device's scale
    python benchmarks/record_gpu.py --part 1            # one part (on a GPU)
    python benchmarks/record_gpu.py --part 1 --dry-run  # what part 1 would run, no device work
    GCLAB_SCALE=80GB python benchmarks/record_gpu.py --list  # the parts of another scale
    python benchmarks/record_gpu.py --report REC.json --log RUN.log  # mark XLA-shrunk plans

On a machine without a GPU it refuses to record (one line, exit status 2): CPU figures are
recorded by `memory_recipes.py`. On the same card, ``python benchmarks/planner_calibration.py
--presets graphcast-small`` times the planner's candidates and writes the calibration that
`gclab plan` then uses for that card instead of its data sheet.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, Optional  # noqa: E402

from children import child_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# XLA's warning when its rematerialization pass cannot bring a program under its limit.
XLA_REMAT = re.compile(r"hlo_rematerialization\.cc.*Can't reduce memory use below .*?\((\d+) "
                       r"bytes\).*only reduced to .*?\((\d+) bytes\), down from .*?\((\d+) "
                       r"bytes\)")


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of the recording: a name and the configurations it runs."""

    name: str
    description: str
    configs: Callable[[object], list]  # scale -> [LiveConfig]


def _recipes(scale) -> list:
    from gclab.config import get_preset
    from gclab.memory import RECIPES, get_recipe
    from gclab.notebook import LiveConfig
    from gclab.sizing import StepSpec

    preset = get_preset("graphcast" if scale == "big" else "graphcast-small")
    return [LiveConfig("recipes", f"{preset.name} {name} {p}",
                       StepSpec(preset.model, preset.task, get_recipe(name, p)), guarded=True)
            for p in ("f32", "bf16") for name in RECIPES]


def _chapter(*chapters: str) -> Callable[[object], list]:
    def configs(scale) -> list:
        from gclab.notebook import live_configs

        return [c for ch in chapters for c in live_configs(ch, scale)]

    return configs


#: The parts, in order; each is sized to finish within 10 minutes on an 80 GB card.
PARTS = (
    Part("chapter-03", "chapter 3: the remat recipes of the compiled model, then the live "
         "model", _chapter("03")),
    Part("chapters-01-05-07", "chapters 1, 5 and 7: the live network, the precision "
         "comparison, the 0.25 deg lean step", _chapter("01", "05", "07")),
    Part("chapter-06", "chapter 6: the (steps, latent) grid at 4 deg", _chapter("06")),
    Part("recipes", "the recipe benchmark: every recipe x precision at the scale's preset",
         _recipes),
)


def fail(message: str) -> int:
    print(f"record_gpu.py: error: {message}", file=sys.stderr)
    return 2


def set_aside(path: Path, prog: str, *companions: str) -> Optional[Path]:
    """Moves a file already at `path` (and its companions, the same name with these
    suffixes) to the first free ``<stem>.previous[-N]<suffix>`` beside it, and says so in
    one line on stderr; returns where it went, or None where `path` held nothing.

    A run saves its rows after each configuration, so that a lease that ends keeps them;
    called before its first save, this keeps an earlier recording at the same path from
    being replaced by a run cut short."""
    if not os.path.lexists(path):
        return None
    suffixes = (path.suffix, *[s for s in companions if s != path.suffix])
    n = 1
    while True:
        stem = f"{path.stem}.previous" + ("" if n == 1 else f"-{n}")
        if not any(os.path.lexists(path.with_name(stem + s)) for s in suffixes):
            break
        n += 1
    for suffix in suffixes:
        if os.path.lexists(path.with_suffix(suffix)):
            path.with_suffix(suffix).rename(path.with_name(stem + suffix))
    moved = path.with_name(stem + path.suffix)
    print(f"{prog}: moved the earlier {path} to {moved}, so that this run does not replace it",
          file=sys.stderr, flush=True)
    return moved


def commit() -> str:
    """The gclab commit recorded: ``$GCLAB_COMMIT`` where set (a copy of the tree without
    its ``.git``), else git's HEAD, else ``unknown``."""
    if os.environ.get("GCLAB_COMMIT"):
        return os.environ["GCLAB_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def hardware() -> dict:
    import jax

    from gclab.devices import usable_bytes

    device = jax.devices()[0]
    return {"backend": jax.default_backend(), "device": device.device_kind,
            "device_count": jax.device_count(), "usable_bytes": usable_bytes(device),
            "jax": jax.__version__, "commit": commit()}


class PlanFailed(Exception):
    """A configuration's plan could not be made; the message is its error's first line."""


def plan_row(spec_json: dict, usable: int) -> dict:
    """A configuration's plan and verdict, compiled in this process: ``plan_bytes``,
    ``temp_bytes``, ``fits`` and ``status``, as the chapters compile them
    (`gclab.notebook.run_if_fits`: one guarded compile, whose plan on a GPU is the step's
    own, XLA's rematerialization pass left out)."""
    from gclab.notebook import run_if_fits
    from gclab.sizing import StepSpec

    run = run_if_fits(StepSpec.from_json(spec_json), usable=usable, measure=False)
    return {"plan_bytes": run.plan_bytes, "temp_bytes": run.temp_bytes, "fits": run.fits,
            "status": run.status()}


_PLAN_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from record_gpu import plan_row
try:
    row = plan_row(json.loads(sys.argv[2]), int(sys.argv[3]))
except Exception as e:
    first = (str(e).strip().splitlines() or [""])[0][:300]
    row = {"error": f"{type(e).__name__}: {first}"}
print("PLAN " + json.dumps(row))
"""


def xla_remat(log: str) -> Optional[dict]:
    """XLA:GPU's report, in a compile's output, that its rematerialization pass shrank the
    program towards the card's limit and could not reach it: ``limit_bytes``,
    ``reduced_to_bytes``, ``from_bytes`` (the last report), or None. Such a plan is what
    the pass reached, not the recipe's own."""
    found = [m.groups() for m in map(XLA_REMAT.search, log.splitlines()) if m]
    if not found:
        return None
    limit, reached, start = map(int, found[-1])
    return {"limit_bytes": limit, "reduced_to_bytes": reached, "from_bytes": start}


def mark_xla_remat(recording: dict, log: str) -> int:
    """Marks the rows of a recording made before plans were compiled in a fresh process:
    each report of XLA's rematerialization pass in the run's printed output (`log`) belongs
    to the next row printed (``  <label>: <status>``). Returns how many rows were marked."""
    labels = {row["label"]: row for row in recording["rows"]}
    pending, marked = [], 0
    for line in log.splitlines():
        shrunk = xla_remat(line)
        if shrunk:
            pending.append(shrunk)
            continue
        label = line.strip().split(": ", 1)[0]
        if line.startswith("  ") and label in labels and pending:
            labels[label]["xla_remat"] = pending[-1]
            pending, marked = [], marked + 1
    return marked


def plan_in_fresh_process(spec_json: dict, usable: int, timeout: float = 900.0) -> dict:
    """`plan_row` run in a fresh Python process, so that what XLA's autotuning takes of
    JAX's pool while compiling stays out of this one (see the module's docstring).

    Raises:
      PlanFailed: the plan raised (its type and first line), or the process died or
        printed no plan (its last line of output).
    """
    # A plain subprocess, not `measure_peak`: nothing of this process is measured; the
    # fresh process is what matters, and its one line of JSON is the whole answer.
    env = child_env(XLA_PYTHON_CLIENT_PREALLOCATE="false")
    try:
        proc = subprocess.run([sys.executable, "-c", _PLAN_CHILD, str(ROOT / "benchmarks"),
                               json.dumps(spec_json), str(int(usable))], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PlanFailed(f"the plan took over {timeout:.0f} s") from None
    lines = [line[5:] for line in proc.stdout.splitlines() if line.startswith("PLAN ")]
    try:
        row = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        row = None
    if not isinstance(row, dict):
        code = proc.returncode
        how = (f"was killed by signal {-code}" if code < 0 else f"exited with status {code}")
        last = (proc.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise PlanFailed(f"the planning process {how} and printed no plan; its last line: "
                         f"{last[:300]}")
    if "error" in row:
        raise PlanFailed(row["error"])
    shrunk = xla_remat(proc.stderr)
    return {**row, "xla_remat": shrunk} if shrunk else row


def record_part(part: Part, scale, dry_run: bool, repeats: int = 3,
                save: Optional[Callable[[dict], None]] = None,
                plan: Callable[[dict, int], dict] = plan_in_fresh_process) -> dict:
    """Runs (or, dry, lists) one part; returns the recording.

    A configuration that fails, in its plan or in its measured run on the card
    (``measure_status`` ``oom`` or ``error``), is recorded as failed (its error's first
    line) and the next one still runs; `save`, if given, receives the recording so far
    after every configuration, so that a run cut short keeps the rows it measured. `plan`
    makes a configuration's plan and verdict (`plan_row`'s keys) from its spec's JSON and
    the usable bytes: in a fresh process unless told otherwise.
    """
    from gclab.limits import format_bytes
    from gclab.notebook import usable_here

    usable = scale.device_class.usable_bytes if dry_run else usable_here()
    rows = []
    for config in part.configs(scale):
        row = {"chapter": config.chapter, "label": config.label, "spec": config.spec.to_json(),
               "guarded": config.guarded}
        if dry_run:
            print(f"  {config.chapter}  {config.label}: {config.spec.title()}")
            rows.append(row)
            continue
        try:
            planned = plan(config.spec.to_json(), usable)
            plan_bytes = planned["plan_bytes"]
            row.update(planned)
            if planned["fits"]:
                import jax

                from gclab.measure import measure_peak

                # Not measured (one line) where this process holds too much of the card.
                r = measure_peak("gclab.sizing.sweep:timed_steps",
                                 {"spec_json": config.spec.to_json(), "steps": repeats},
                                 device=jax.devices()[0], plan_bytes=plan_bytes)
                row.update(measure_status=r.status, peak_bytes=r.peak_bytes,
                           step_seconds=(r.result or {}).get("step_seconds"),
                           measured_over_plan=(r.peak_bytes / plan_bytes
                                               if r.peak_bytes else None))
                first = (str(r.message).strip().splitlines() or [""])[0][:300]
                if r.status in ("oom", "error"):  # the plan fits, yet the run on the card failed
                    row["status"] = (f"failed on the card ({r.status}, plan "
                                     f"{format_bytes(plan_bytes)}): {first}")
                elif not r.ok:  # never started, or no peak reported: the plan's verdict stays
                    row["measure_message"] = first
        except PlanFailed as e:  # the planning process said why, in one line
            row.update(plan_bytes=None, fits=None, status=f"failed: {e}")
        except Exception as e:  # noqa: BLE001 - recorded; the lease goes on to the next one
            first = (str(e).strip().splitlines() or [""])[0][:300]
            row.setdefault("plan_bytes", None)  # a plan made before the failure is kept
            row.update(fits=None, status=f"failed: {type(e).__name__}: {first}")
        print(f"  {config.label}: {row['status']}"
              + (f", measured peak {row['peak_bytes']}" if row.get("peak_bytes") is not None
                 else ""),
              flush=True)
        rows.append(row)
        if save is not None:
            save({"part": part.name, "scale": scale.name, "rows": rows})
    return {"part": part.name, "scale": scale.name, "rows": rows}


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the parts and exit")
    parser.add_argument("--part", help=f"the part to record: 1 to {len(PARTS)}")
    parser.add_argument("--dry-run", action="store_true",
                        help="list what the part would run; nothing runs on the device")
    parser.add_argument("--report", type=Path, metavar="RECORDING.json",
                        help="with --log: mark the rows of RECORDING.json whose plan XLA's "
                        "rematerialization pass shrank, from the run's printed output; no "
                        "device work")
    parser.add_argument("--log", type=Path, metavar="RUN.log",
                        help="the printed output of the run that wrote --report's recording")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder of the recordings (default: $GCLAB_RECORDINGS, else "
                             "the repository's gclab-recordings, where the chapters look)")
    args = parser.parse_args(argv)
    if args.report is not None or args.log is not None:
        return report(args.report, args.log)
    part = None
    if args.part is not None:
        if not args.part.isdigit() or not 1 <= int(args.part) <= len(PARTS):
            return fail(f"--part {args.part}: an integer from 1 to {len(PARTS)}")
        part = PARTS[int(args.part) - 1]
    elif not args.list:
        return fail(f"give --list or --part N (N from 1 to {len(PARTS)})")

    import jax

    from gclab.notebook import SettingError, choose_scale

    try:
        scale = choose_scale()
    except SettingError as e:
        return fail(str(e))
    on_gpu = jax.default_backend() != "cpu"
    if scale == "cpu" and (args.list or args.dry_run):
        scale = choose_scale() if os.environ.get("GCLAB_SCALE") else _scale("16GB")
    if args.list:
        print(f"Parts at scale {scale.name} (set GCLAB_SCALE to list another):")
        for i, p in enumerate(PARTS, 1):
            print(f"  {i}. {p.name}: {p.description} ({len(p.configs(scale))} configurations)")
        return 0
    if not on_gpu and not args.dry_run:
        return fail(f"no GPU found (JAX backend {jax.default_backend()!r}): GPU recordings "
                    "need one; use --list or --dry-run here")
    if args.dry_run:
        print(f"Part {args.part} ({part.name}) at scale {scale.name} would run:")
        record_part(part, scale, dry_run=True)
        return 0
    from gclab.files import write_text_atomic
    from gclab.recordings import output_dir

    out = args.out or output_dir()
    out.mkdir(parents=True, exist_ok=True)
    head = {"hardware": hardware(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    path = out / f"gpu-{scale.name}-{part.name}.json"

    earlier = []  # set aside once, at this run's first save: later ones rewrite its own file

    def save(recording: dict, complete: bool = False) -> None:
        if not earlier:
            earlier.append(set_aside(path, "record_gpu.py"))
        write_text_atomic(path, json.dumps({**head, **recording, "complete": complete},
                                           indent=1, default=str))

    save(record_part(part, scale, dry_run=False, save=save), complete=True)
    print(f"wrote {path}")
    return 0


def report(recording_path: Optional[Path], log_path: Optional[Path]) -> int:
    """``--report RECORDING --log LOG``: marks the recording's rows from the run's output."""
    if recording_path is None or log_path is None:
        return fail("--report and --log go together: the recording and its run's output")
    try:
        recording = json.loads(recording_path.read_text())
        log = log_path.read_text()
    except OSError as e:
        return fail(f"cannot read {e.filename}: {e.strerror}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return fail(f"--report {recording_path} or --log {log_path}: not text of a recording "
                    f"and a run's output ({type(e).__name__})")
    if not isinstance(recording, dict) or not isinstance(recording.get("rows"), list):
        return fail(f"--report {recording_path}: not a recording of this script (no rows)")
    if not all(isinstance(row, dict) and isinstance(row.get("label"), str)
               for row in recording["rows"]):
        return fail(f"--report {recording_path}: not a recording of this script (a row is not "
                    "an object with a label)")
    marked = mark_xla_remat(recording, log)
    from gclab.files import write_text_atomic

    write_text_atomic(recording_path, json.dumps(recording, indent=1, default=str))
    print(f"{recording_path}: {marked} row(s) marked as shrunk by XLA's rematerialization pass")
    return 0


def _scale(name: str):
    from gclab.notebook import scale_named

    return scale_named(name)


if __name__ == "__main__":
    sys.exit(main())
