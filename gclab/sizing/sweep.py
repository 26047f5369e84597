"""Sweeps: many training steps (`StepSpec`s), compiled, timed and/or measured, cached.

Each row of a sweep is one `StepSpec` (model, task, techniques, batch B, rollout T):

* ``compiled``: XLA's compiled memory of one training step (`train_step_memory`, from
  shapes alone, nothing allocated);
* ``timed``: the same step compiled once for real arrays in this process, its memory
  figures and the median time of `repeats` steps (`compile_train_step(live=True)`);
* ``measured``: real steps in a fresh process (`gclab.measure.peak.measure_peak`
  running `timed_steps`): the measured peak and the step time; status ``not measured``
  (and not cached) where the device reports no peak, or where this process holds too much
  of the card for the fresh process (`gclab.measure.peak.refuse_if_held`);
* ``both``: compiled and measured.

Results are cached as JSON, one file per row, keyed by the spec, the measure kind, the
backend and the versions of jax, jaxlib, haiku and gclab, so a re-run only computes what
is new.

Shapes: B batch, L latent, S steps.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import warnings
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import haiku
import jax
import jaxlib
import pandas as pd
from tqdm.auto import tqdm

import gclab
from gclab.config import (
    ModelConfig,
    TaskConfig,
    a_kind,
    is_int,
    is_number,
    require_count,
    require_kind,
)
from gclab.files import CacheWarning, atomic_path, check_writable_folder, write_text_atomic
from gclab.measure.peak import NOT_MEASURED, measure_peak
from gclab.measure.timing import median_seconds
from gclab.memory.config import MemoryConfig
from gclab.sizing.analytical import param_count
from gclab.sizing.step import StepSpec, compile_train_step, recipe_memory, train_step_memory

MEASURES = ("compiled", "timed", "measured", "both")
BYTE_COLUMNS = ("argument_bytes", "output_bytes", "temp_bytes", "total_bytes")


def grid(model: ModelConfig, latent_sizes: Iterable[int], steps_list: Iterable[int],
         task: Optional[TaskConfig] = None, *,
         techniques: Sequence[Union[str, MemoryConfig]] = ("none",),
         precision: Optional[str] = None, batch: int = 1, rollout: int = 1) -> list[StepSpec]:
    """The specs of every (processor steps, latent size, technique) of one geometry.

    Args:
      model: geometry (and hidden layers); latent and steps are replaced.
      latent_sizes: L values.
      steps_list: S values.
      task: the task (default: 13 levels).
      techniques: `MemoryConfig`s or recipe names (`none`, `per-step`, `deepmind`, `lean`);
        a name gives the recipe as every command runs it (`gclab.sizing.step.recipe_memory`:
        with `rollout` > 1, each autoregressive step under its own checkpoint but in
        `none`).
      precision: the precision of named recipes (`f32` default, or `bf16`).
      batch: B.
      rollout: T.

    Returns:
      `StepSpec`s, steps-major, then latent, then technique; a value repeated in a list is
      swept once (at its first place).

    Raises:
      ValueError: an empty list, a value that is not an integer >= 1, or an unknown
        technique.
    """
    require_kind("model", model, ModelConfig, caller="grid:")
    latent_sizes, steps_list = list(latent_sizes), list(steps_list)
    for name, values in (("latent_sizes", latent_sizes), ("steps_list", steps_list)):
        if not values or not all(is_int(v) and v >= 1 for v in values):
            raise ValueError(f"grid: {name}={values!r} is invalid: a non-empty list of "
                             "integers >= 1")
    techniques = [techniques] if isinstance(techniques, (str, MemoryConfig)) else list(
        techniques)
    if not techniques:
        raise ValueError("grid: techniques is empty: give recipe names or MemoryConfigs")
    task = task or TaskConfig.from_levels(13)
    memories = [(t, None) if isinstance(t, MemoryConfig)
                else (recipe_memory(t, precision or "f32", rollout=rollout), t)
                for t in techniques]
    # A repeated value (checked above) would compile the same step again, a duplicate row.
    latent_sizes, steps_list = (list(dict.fromkeys(int(v) for v in values))
                                for values in (latent_sizes, steps_list))
    return [StepSpec(model.replace(latent_size=L, processor_steps=S), task, mem, batch,
                     rollout, recipe=name)
            for S in steps_list for L in latent_sizes for mem, name in dict.fromkeys(memories)]


def versions() -> dict:
    """Versions that key the cache: jax, jaxlib, haiku, gclab, and the backend."""
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "haiku": haiku.__version__, "gclab": gclab.__version__,
            "backend": jax.default_backend()}


def cache_key(spec: StepSpec, measure: str, repeats: int = 3) -> str:
    """A hex digest of the spec, the measure kind, the backend, the versions and
    ``XLA_FLAGS`` (which change what XLA compiles: its scheduler, say, `use_cpu_scheduler`)."""
    payload = {"spec": spec.to_json(), "measure": measure, "versions": versions(),
               "xla_flags": sorted(os.environ.get("XLA_FLAGS", "").split())}
    if measure != "compiled":
        payload["repeats"] = repeats
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def timed_steps(spec_json: dict, steps: int = 3, seed: int = 0) -> dict:
    """Compiles one step of a spec and times `steps` real steps on random data.

    The target of the ``measured`` sweeps (it runs in `measure_peak`'s fresh process).

    Args:
      spec_json: `StepSpec.to_json()`.
      steps: timed steps after one untimed one.
      seed: of the random state and batch.

    Returns:
      `{"step_seconds": median seconds of one step, "steps": steps}`.
    """
    run = compile_train_step(StepSpec.from_json(spec_json), live=True, seed=seed).run
    return {"step_seconds": median_seconds(run, max(1, int(steps))), "steps": max(1, int(steps))}


def _compiled(spec: StepSpec) -> dict:
    m = train_step_memory(spec)
    return {k: getattr(m, k) for k in (*BYTE_COLUMNS, "alias_bytes", "compile_seconds")}


def _timed(spec: StepSpec, repeats: int) -> dict:
    step = compile_train_step(spec, live=True)
    m = step.memory
    return {**{k: getattr(m, k) for k in (*BYTE_COLUMNS, "alias_bytes", "compile_seconds")},
            "step_seconds": median_seconds(step.run, repeats)}


def _measured(spec: StepSpec, timeout: float, repeats: int,
              plan_bytes: Optional[int] = None) -> dict:
    def plan() -> Optional[int]:  # only where this process holds some of the card
        try:
            return train_step_memory(spec).total_bytes
        except Exception:  # noqa: BLE001 - the fresh process reports what is wrong
            return None

    # The sweep's backend has started (`versions`): a fresh process is not started where
    # this one holds too much of the card for the plan (status 'not measured').
    r = measure_peak("gclab.sizing.sweep:timed_steps",
                     {"spec_json": spec.to_json(), "steps": repeats}, timeout=timeout,
                     device=jax.devices()[0], plan_bytes=plan if plan_bytes is None else plan_bytes)
    return {"peak_bytes": r.peak_bytes, "peak_rss_bytes": r.peak_rss_bytes,
            "measure_status": r.status, "measure_message": r.message[:500],
            "step_seconds": (r.result or {}).get("step_seconds")}


def _one(spec: StepSpec, measure: str, timeout: float, repeats: int) -> dict:
    row: dict = {"status": "ok", "message": ""}
    if measure in ("compiled", "timed", "both"):
        try:
            row.update(_timed(spec, repeats) if measure == "timed" else _compiled(spec))
        except Exception as e:  # noqa: BLE001 - one failing row must not stop a sweep
            row.update(status="error", message=f"{type(e).__name__}: {e}"[:500])
    if measure in ("measured", "both"):
        m = _measured(spec, timeout, repeats, row.get("total_bytes"))
        row.update(m)
        if m["measure_status"] != "ok" and row["status"] == "ok":
            row.update(status=m["measure_status"], message=m["measure_message"])
    return row


def _is_count(v) -> bool:
    return is_int(v) and v >= 0


def _is_seconds(v) -> bool:
    return is_number(v) and math.isfinite(v) and v >= 0


#: What a cached row of each measure holds: (column, check). None is allowed where
#: the row's status is not `ok`.
_ROW_COLUMNS = {
    "compiled": [(c, _is_count) for c in (*BYTE_COLUMNS, "alias_bytes")]
    + [("compile_seconds", _is_seconds)],
    "measured": [("peak_bytes", _is_count),
                 ("peak_rss_bytes", lambda v: v is None or _is_count(v)),
                 ("step_seconds", _is_seconds), ("measure_status", lambda v: isinstance(v, str)),
                 ("measure_message", lambda v: isinstance(v, str))],
}
_ROW_COLUMNS["timed"] = _ROW_COLUMNS["compiled"] + [("step_seconds", _is_seconds)]
_ROW_COLUMNS["both"] = _ROW_COLUMNS["compiled"] + _ROW_COLUMNS["measured"]


def _row_problem(row, measure: str) -> Optional[str]:
    """What is wrong with a cached row of `measure` (None if nothing)."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    if not isinstance(row.get("status"), str) or not isinstance(row.get("message"), str):
        return "no 'status' and 'message' strings"
    for column, ok in _ROW_COLUMNS[measure]:
        value = row.get(column)
        if not (ok(value) or (value is None and row["status"] != "ok")):
            return f"{column}={value!r}"
    return None


def _read_cached(path: Optional[Path], measure: str) -> Optional[dict]:
    """A cached row, or None when there is none or it is damaged (then it is recomputed,
    with a `gclab.files.CacheWarning`)."""
    if path is None or not path.exists():
        return None
    try:
        row = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        problem = f"{type(e).__name__}: {e}"
    else:
        problem = _row_problem(row, measure)
        if problem is None:
            return row
    warnings.warn(f"sweep cache row {path} is damaged ({problem}); computing it again",
                  CacheWarning, stacklevel=4)
    return None


def sweep(specs: Sequence[StepSpec], *, measure: str = "compiled",
          cache_path: Optional[Union[str, os.PathLike]] = None, progress: bool = True,
          timeout: float = 600.0, repeats: int = 3) -> pd.DataFrame:
    """Compiles, times and/or measures each spec and returns one row per spec.

    Args:
      specs: the training steps (see `grid`).
      measure: ``compiled`` (XLA's plan, no allocation), ``timed`` (compiled once for real
        arrays in this process and timed), ``measured`` (a fresh process runs real steps;
        peak heap on CPU, device peak on GPU) or ``both`` (compiled and measured).
      cache_path: a folder for one JSON file per row; rows found there are not rerun.
      progress: show a tqdm progress bar.
      timeout: seconds per measured run.
      repeats: timed steps per row (``timed``, ``measured``, ``both``).

    Returns:
      A DataFrame with every spec field (`model.*`, `task.*`, `memory.*`, `batch`,
      `rollout`), `technique`, `num_params`, `argument_bytes`, `output_bytes`,
      `temp_bytes`, `total_bytes`, `compile_seconds`, `step_seconds`, `peak_bytes`,
      `status`, `message`, `cached`, and the versions.

    Raises:
      ValueError: an unknown `measure`, `specs` holding anything but `StepSpec`s (or none),
        a `cache_path` that is not a writable folder, or a bad `timeout` / `repeats`.
      KeyboardInterrupt: re-raised with the rows completed before it as its `rows` (a
        DataFrame of the first `len(rows)` specs, as this function returns them), so
        that a caller can keep them.
    """
    if measure not in MEASURES:
        raise ValueError(f"measure={measure!r} is invalid: one of {', '.join(MEASURES)}")
    specs = list(specs)
    if not specs:
        raise ValueError("specs is empty: nothing to sweep")
    for spec in specs:
        if not isinstance(spec, StepSpec):
            raise ValueError(f"specs must be StepSpecs (see gclab.sizing.sweep.grid), got "
                             f"{type(spec).__name__}")
    if not is_number(timeout) or not 0 < timeout < math.inf:
        raise ValueError(f"timeout={timeout!r} is invalid: a finite number of seconds > 0")
    repeats = require_count("repeats", repeats, 1)
    folder = Path(cache_path) if cache_path is not None else None
    if folder is not None:
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"cache_path {folder}: not a folder")
        folder.mkdir(parents=True, exist_ok=True)
        check_writable_folder(folder)
    vers = versions()
    rows: list = []
    try:
        for spec in tqdm(specs, disable=not progress, desc="sweep"):
            rows.append(_row(spec, folder, measure, timeout, repeats, vers))
    except KeyboardInterrupt as e:  # Ctrl-C: the rows done are the caller's to keep
        e.rows = pd.DataFrame(rows)
        raise
    return pd.DataFrame(rows)


def _row(spec: StepSpec, folder: Optional[Path], measure: str, timeout: float, repeats: int,
         vers: dict) -> dict:
    """One row of `sweep`: cached, or computed (and cached where it may be)."""
    path = folder / f"{cache_key(spec, measure, repeats)}.json" if folder else None
    result = _read_cached(path, measure)
    if result is not None:
        result["cached"] = True
    else:
        result = _one(spec, measure, timeout, repeats)
        result["cached"] = False
        # Not cached: a failure, or a peak not measured (this process held too much
        # of the card then, or the device reports none).
        if path is not None and result["status"] not in ("error", NOT_MEASURED):
            try:
                write_text_atomic(path, json.dumps(result, default=str))
            except OSError as e:  # the row is computed; only its cache is lost
                warnings.warn(f"sweep cache row {path} could not be written "
                              f"({e.strerror or e}); going on", CacheWarning, stacklevel=3)
    row = {**spec.describe(), "technique": spec.technique(),
           "num_params": param_count(spec.model, spec.task)}
    for col in (*BYTE_COLUMNS, "compile_seconds", "step_seconds", "peak_bytes"):
        row[col] = None
    row.update(result)
    row.update(vers)
    return row


def save_sweep(df: pd.DataFrame, path: Union[str, os.PathLike]) -> Path:
    """Writes a sweep as CSV (`.csv`) or JSON records (any other name), atomically.

    The folder is created if missing; the file appears only once complete
    (`gclab.files.atomic_path`).
    """
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"save_sweep needs a DataFrame (see sweep), not {a_kind(df)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        if path.suffix.lower() == ".csv":
            df.to_csv(tmp, index=False)
        else:
            tmp.write_text(df.to_json(orient="records", indent=1), encoding="utf-8")
    return path


def load_sweep(path: Union[str, os.PathLike]) -> pd.DataFrame:
    """Reads a sweep written by `save_sweep`: CSV (`.csv`) or JSON records (any other name).

    Raises:
      FileNotFoundError: no file at `path`.
      ValueError: a folder, or a file that is not a CSV table (`.csv`) or not a JSON list
        of row objects (any other name), naming the path.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"load_sweep {path}: a folder, not a sweep file (save_sweep writes "
                         "one .csv or JSON file)")
    if path.suffix.lower() == ".csv":
        try:
            return pd.read_csv(path)
        except ValueError as e:  # pandas' parser and empty-file errors, a binary file's decoding
            raise ValueError(f"load_sweep {path}: not a CSV table ({e})") from None
    raw = path.read_bytes()
    try:
        rows = json.loads(raw)
    except ValueError as e:  # a JSONDecodeError or a binary file's UnicodeDecodeError
        raise ValueError(f"load_sweep {path}: not JSON ({e}); a sweep is a JSON list of row "
                         "objects (save_sweep) or a .csv file") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        what = "a list of other things than objects" if isinstance(rows, list) else "not a list"
        raise ValueError(f"load_sweep {path}: JSON of the wrong shape ({what}); a sweep is a "
                         "JSON list of row objects (save_sweep)")
    # pandas parses the text itself, so column types are pandas' own inference, as for a CSV
    return pd.read_json(io.BytesIO(raw), orient="records")
