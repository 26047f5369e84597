"""Sweeps: a grid of configurations x memory techniques, compiled and/or measured.

Each row of a sweep is one `StepSpec` (model, task, techniques, batch B, rollout T):
XLA's compiled memory of one training step (`gclab.footprint.train_step_memory`, from
shapes alone) and/or a measured run in a fresh process (`gclab.measure.measure_peak`
with the target `gclab.sweep:_measure_target`). Results are cached as JSON, one file
per row, keyed by the config, the technique, the backend and the versions of jax,
jaxlib, haiku and gclab, so a re-run only computes what is new.

Shapes: B batch, Ng grid nodes, C data channels, O outputs, L latent, S steps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

import pandas as pd

from gclab.config import ModelConfig, TaskConfig
from gclab.techniques import RECIPES, MemoryConfig

MEASURES = ("compiled", "measured", "both")
BYTE_COLUMNS = ("argument_bytes", "output_bytes", "temp_bytes", "total_bytes")


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """A configuration without techniques: model, task, batch, rollout."""

    model: ModelConfig
    task: TaskConfig
    batch: int = 1
    rollout: int = 1


def grid(model: ModelConfig, latent_sizes: Iterable[int], steps_list: Iterable[int],
         task: Optional[TaskConfig] = None, *, batch: int = 1,
         rollout: int = 1) -> list[SweepConfig]:
    """Configs for every (processor steps, latent size) pair of one geometry.

    Args:
      model: geometry (and hidden layers); latent and steps are replaced.
      latent_sizes: L values.
      steps_list: S values.
      task: the task (default: 13 levels).
      batch: B.
      rollout: T.

    Returns:
      `SweepConfig`s, steps-major.
    """
    task = task or TaskConfig.from_levels(13)
    return [SweepConfig(model.replace(latent_size=int(L), processor_steps=int(S)), task,
                        batch, rollout)
            for S in steps_list for L in latent_sizes]


def _technique(t: Union[str, MemoryConfig], precision: Optional[str] = None
               ) -> tuple[str, MemoryConfig]:
    if isinstance(t, MemoryConfig):
        return _label(t), t
    if isinstance(t, str) and t in RECIPES:
        mem = RECIPES[t]
        return t, mem if precision is None else mem.replace(precision=precision)
    raise ValueError(f"unknown technique {t!r}; accepted: a MemoryConfig or one of "
                     + ", ".join(RECIPES))


def _label(mem: MemoryConfig) -> str:
    for name, recipe in RECIPES.items():
        if recipe.replace(precision=mem.precision) == mem:
            return name if mem.precision == "f32" else f"{name}/{mem.precision}"
    return "custom"


def _spec(config: Any, memory: MemoryConfig):
    from gclab.footprint import StepSpec

    return StepSpec(config.model, config.task, memory, getattr(config, "batch", 1),
                    getattr(config, "rollout", 1))


def versions() -> dict:
    """Versions that key the cache: jax, jaxlib, haiku, gclab, and the backend."""
    import haiku
    import jax
    import jaxlib

    import gclab

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "haiku": haiku.__version__, "gclab": gclab.__version__,
            "backend": jax.default_backend()}


def _describe(config: Any, memory: MemoryConfig) -> dict:
    m = dataclasses.asdict(config.model)
    return {**{f"model.{k}": v for k, v in m.items()},
            "task.levels": config.task.num_levels,
            "task.precipitation_input": config.task.precipitation_input,
            **{f"memory.{k}": v for k, v in dataclasses.asdict(memory).items()},
            "batch": getattr(config, "batch", 1), "rollout": getattr(config, "rollout", 1)}


def cache_key(config: Any, memory: MemoryConfig, measure: str) -> str:
    """A hex digest of the config, technique, measure kind, backend and versions."""
    payload = {"config": _describe(config, memory),
               "pressure_levels": list(config.task.pressure_levels),
               "measure": measure, "versions": versions()}
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def compile_spec(spec) -> dict:
    """Compiled memory of one training step of `spec` (a `StepSpec`) as a dict.

    Uses `gclab.footprint.train_step_memory` (loss + gradients + AdamW update; `figure`
    is `train_step`).
    """
    from gclab import footprint

    return {**footprint.train_step_memory(spec).to_dict(), "figure": "train_step"}


def _measure_target(spec_json: dict, steps: int = 3, seed: int = 0) -> dict:
    """Runs `steps` real training steps on synthetic inputs (in `measure_peak`'s child).

    Args:
      spec_json: `{"model": {...}, "levels": int, "precipitation_input": bool,
        "memory": {...}, "batch": int, "rollout": int}`.
      steps: timed steps after the compiling one.
      seed: for the synthetic state and inputs.

    Returns:
      `{"step_seconds": median seconds of one step, "steps": steps}`.
    """
    from gclab.footprint import StepSpec

    spec = StepSpec(ModelConfig(**spec_json["model"]),
                    TaskConfig.from_levels(spec_json["levels"],
                                           spec_json["precipitation_input"]),
                    MemoryConfig(**spec_json["memory"]), spec_json["batch"],
                    spec_json["rollout"])
    from gclab.footprint import make_live_step

    run = make_live_step(spec, seed=seed)  # compiles and runs one step
    times = []
    for _ in range(max(1, int(steps))):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"step_seconds": times[len(times) // 2], "steps": len(times)}


def _measure(config: Any, memory: MemoryConfig, timeout: float) -> dict:
    from gclab.measure import measure_peak

    levels = config.task.num_levels
    spec_json = {"model": dataclasses.asdict(config.model), "levels": levels,
                 "precipitation_input": config.task.precipitation_input,
                 "memory": dataclasses.asdict(memory),
                 "batch": getattr(config, "batch", 1), "rollout": getattr(config, "rollout", 1)}
    r = measure_peak("gclab.sweep:_measure_target", {"spec_json": spec_json},
                     timeout=timeout)
    out = {"peak_bytes": r.peak_bytes, "peak_rss_bytes": r.peak_rss_bytes,
           "measure_status": r.status, "measure_message": r.message[:500],
           "step_seconds": (r.result or {}).get("step_seconds")}
    return out


def _one(config: Any, memory: MemoryConfig, measure: str, timeout: float) -> dict:
    row: dict = {"status": "ok", "message": ""}
    if measure in ("compiled", "both"):
        try:
            c = compile_spec(_spec(config, memory))
            row.update({k: c.get(k) for k in (*BYTE_COLUMNS, "alias_bytes",
                                              "compile_seconds", "num_params", "figure")})
        except Exception as e:  # noqa: BLE001 - one failing row must not stop a sweep
            row.update(status="error", message=f"{type(e).__name__}: {e}"[:500])
    if measure in ("measured", "both"):
        m = _measure(config, memory, timeout)
        row.update(m)
        if m["measure_status"] != "ok" and row["status"] == "ok":
            row.update(status=m["measure_status"], message=m["measure_message"])
    return row


def sweep(configs: Sequence[Any], techniques: Sequence[Union[str, MemoryConfig]], *,
          measure: str = "compiled", cache_path: Optional[Union[str, os.PathLike]] = None,
          progress: bool = True, precision: Optional[str] = None,
          timeout: float = 600.0) -> pd.DataFrame:
    """Runs configs x techniques and returns one row per pair.

    Args:
      configs: `SweepConfig`s or `StepSpec`s (their `memory` is ignored: techniques
        come from `techniques`).
      techniques: `MemoryConfig`s or recipe names (`none`, `per-step`, `deepmind`, `lean`).
      measure: `compiled` (XLA's plan, no allocation), `measured` (a fresh process runs
        real steps; peak heap on CPU, device peak on GPU) or `both`.
      cache_path: a folder for one JSON file per row; rows found there are not rerun.
      progress: show a tqdm progress bar.
      precision: overrides the precision of named recipes (`f32` / `bf16`).
      timeout: seconds per measured run.

    Returns:
      A DataFrame with every config and technique field (`model.*`, `task.*`,
      `memory.*`, `batch`, `rollout`), `technique`, `num_params`, `argument_bytes`,
      `output_bytes`, `temp_bytes`, `total_bytes`, `compile_seconds`, `step_seconds`,
      `peak_bytes`, `status`, `message`, `cached`, and the versions.
    """
    if measure not in MEASURES:
        raise ValueError(f"measure={measure!r} is invalid: one of {', '.join(MEASURES)}")
    from tqdm.auto import tqdm

    from gclab.analytical import param_count

    techs = [_technique(t, precision) for t in techniques]
    folder = Path(cache_path) if cache_path is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    vers = versions()
    pairs = [(c, t) for c in configs for t in techs]
    rows = []
    for config, (label, mem) in tqdm(pairs, disable=not progress, desc="sweep"):
        key = cache_key(config, mem, measure)
        path = folder / f"{key}.json" if folder is not None else None
        result = None
        if path is not None and path.exists():
            try:
                result = json.loads(path.read_text())
                result["cached"] = True
            except (OSError, json.JSONDecodeError):
                result = None
        if result is None:
            result = _one(config, mem, measure, timeout)
            result["cached"] = False
            if path is not None and result["status"] != "error":
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(result, default=str))
                os.replace(tmp, path)
        row = {**_describe(config, mem), "technique": label,
               "num_params": param_count(config.model, config.task)}
        for col in (*BYTE_COLUMNS, "compile_seconds", "step_seconds", "peak_bytes"):
            row[col] = None
        row.update({k: v for k, v in result.items() if k != "num_params"})
        row.update(vers)
        rows.append(row)
    return pd.DataFrame(rows)


def save_sweep(df: pd.DataFrame, path: Union[str, os.PathLike]) -> Path:
    """Writes a sweep as JSON records (`.json`) or CSV (`.csv`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    else:
        path.write_text(df.to_json(orient="records", indent=1))
    return path


def load_sweep(path: Union[str, os.PathLike]) -> pd.DataFrame:
    """Reads a sweep written by `save_sweep`."""
    path = Path(path)
    return pd.read_csv(path) if path.suffix == ".csv" else pd.read_json(path, orient="records")


def run_sweep_cli(args) -> int:
    """`gclab sweep`: the grid of the command-line arguments; writes `--out`."""
    from gclab.cli import _resolve_model
    from gclab.measure import format_bytes

    model, task = _resolve_model(args)
    latents = [int(x) for x in args.latents.split(",")] if args.latents else [model.latent_size]
    steps = ([int(x) for x in args.steps_list.split(",")] if args.steps_list
             else [model.processor_steps])
    configs = grid(model, latents, steps, task, batch=args.batch, rollout=args.rollout)
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    df = sweep(configs, recipes, measure=args.measure, precision=args.precision,
               cache_path=os.environ.get("GCLAB_SWEEP_CACHE"))
    save_sweep(df, args.out)
    for _, r in df.iterrows():
        print(f"{r['model.processor_steps']:>3} x {r['model.latent_size']:<5} "
              f"{r['technique']:<10} total {format_bytes(r['total_bytes'])} "
              f"temp {format_bytes(r['temp_bytes'])} {r['status']}")
    print(f"wrote {args.out}")
    if getattr(args, "plot", None):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for label, part in df.groupby("technique"):
            ax.plot(part["model.latent_size"] * part["model.processor_steps"],
                    part["total_bytes"] / 2**30, "o-", label=label)
        ax.set_xlabel("latent x steps")
        ax.set_ylabel("compiled total (GiB)")
        ax.legend()
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")
    return 0 if (df["status"] == "ok").all() else 1
