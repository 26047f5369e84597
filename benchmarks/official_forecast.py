"""Benchmark: `gclab forecast` against the official GraphCast code, on the same files.

The official code is not part of this repository: check it out anywhere
(github.com/google-deepmind/graphcast) and pass its path; it is imported from there
(``sys.path``), never copied.

    python benchmarks/official_forecast.py --official /path/to/graphcast

What it does, at a tiny configuration (10 deg grid, 1 mesh split, 2 x 16 network, levels
500 and 850 hPa, batch 2, ``--steps`` autoregressive steps), all in a temporary folder:

1. writes synthetic weather in the official layout (netCDF), statistics computed from a
   longer stretch of it (the three official files), and a checkpoint of random weights
   in the published format, all with gclab;
2. official side: reads the checkpoint with the official ``checkpoint.load``, extracts
   inputs, targets and forcings with ``data_utils.extract_inputs_targets_forcings``, and
   runs ``GraphCast`` inside ``normalization.InputsAndResiduals`` and
   ``autoregressive.Predictor`` (the demo's predictor, without its bfloat16 cast, so
   both sides compute in float32). ``rollout.chunked_prediction`` at the pinned commit
   calls ``xarray.Dataset(ds)`` on a Dataset, which current xarray refuses, so the
   autoregressive predictor is called directly over the whole horizon (what the rollout
   does for a horizon of one chunk);
3. gclab side: ``gclab.weather.forecast`` on the same files;
4. checks the checkpoint: the official ``checkpoint.dump`` of what ``checkpoint.load``
   read from gclab's file has the same keys, dtypes and bytes;
5. compares every variable (max abs difference, and that difference over the variable's
   standard deviation; the difference itself where the official field is constant), the
   variable order, dims and coordinates.

It writes ``benchmarks/results/official-forecast-<backend>.json`` (and the copy in
``gclab/recordings`` that chapter 1 reads) with the hardware, the date, the library
versions, both commits and ``agrees``: every variable within `TOLERANCE` of the official
one (a NaN anywhere does not agree), the same variables and dims, and the same checkpoint.
A run that does not agree is written to ``official-forecast-<backend>-failed.json`` instead
and exits with status 1. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from official_side_by_side import provenance  # noqa: E402

from gclab.files import write_text_atomic  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SHIPPED = ROOT / "gclab" / "recordings"  # chapter 1 reads the installed package's copy
#: Largest |gclab - official| / std (or |gclab - official| for a constant field) that
#: agrees: both sides compute in float32, whose rounding differs by order of operations.
TOLERANCE = 1e-4


def variable_row(ours: np.ndarray, theirs: np.ndarray) -> dict:
    """One variable's comparison: max abs difference, the official field's std, and the
    difference over the std (the difference itself where the std is 0). A NaN on either
    side makes the difference NaN."""
    diff = float(np.max(np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64))))
    spread = float(np.std(np.asarray(theirs, np.float64)))
    constant = spread == 0.0
    return {"max_abs_diff": diff, "std": spread,
            "max_abs_diff_over_std": diff if constant else diff / spread,
            "scale": "absolute (constant field)" if constant else "std"}


def agreement(rows: dict, same_layout: bool, same_checkpoint: bool) -> dict:
    """The worst scaled difference (NaN if any variable's is) and whether the run agrees."""
    scaled = [r["max_abs_diff_over_std"] for r in rows.values()]
    worst = (math.nan if any(math.isnan(v) for v in scaled) else max(scaled, default=math.nan))
    return {"worst_max_abs_diff_over_std": worst,
            "tolerance": {"max_abs_diff_over_std": TOLERANCE,
                          "also": "same variables and dims; checkpoint identical after the "
                                  "official load and dump"},
            "agrees": bool(worst <= TOLERANCE and same_layout and same_checkpoint)}


def is_checkout(official: Path) -> bool:
    """Whether `official` is a checkout of google-deepmind/graphcast (its package's model
    module is there). `official_side_by_side.py` makes the same check inline in its `main`,
    with no function of its own to import, so it is written here once for this script."""
    return (official / "graphcast" / "graphcast.py").is_file()


def run(official: Path, steps: int) -> dict:
    import haiku as hk
    import jax
    import xarray

    from gclab.config import ModelConfig, TaskConfig
    from gclab.model import param_shapes
    from gclab.training.data import SyntheticWeather
    from gclab.weather import (
        Checkpoint,
        compute_stats,
        load_stats,
        open_dataset,
        read_checkpoint,
        read_flat,
        synthetic_dataset,
        write_checkpoint,
        write_dataset,
        write_stats,
    )
    from gclab.weather.forecast import forecast

    sys.path.insert(0, str(official.resolve()))
    from graphcast import autoregressive, checkpoint, data_utils, normalization
    from graphcast import graphcast as official_model

    task = TaskConfig(pressure_levels=(500, 850))
    model = ModelConfig(resolution=10.0, mesh_splits=1, latent_size=16, processor_steps=2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        weather = SyntheticWeather(task, model.resolution, seed=0)
        write_dataset(synthetic_dataset(weather, frames=steps + 2, batch_starts=(0, 13)),
                      tmp / "data.nc")
        (tmp / "stats").mkdir()
        write_stats(compute_stats(synthetic_dataset(weather, frames=64, start=200)),
                    tmp / "stats")
        rng = np.random.default_rng(0)
        shapes = param_shapes(model, task.data_channels, task.output_channels)
        params = {m: {n: (0.3 * rng.standard_normal(s.shape)).astype(np.float32)
                      for n, s in leaves.items()} for m, leaves in shapes.items()}
        write_checkpoint(tmp / "ckpt.npz", Checkpoint.from_gclab(params, model, task, "bench"))

        # gclab.
        ours = forecast(read_checkpoint(tmp / "ckpt.npz"), open_dataset(tmp / "data.nc"),
                        load_stats(tmp / "stats"), steps)

        # Official.
        with open(tmp / "ckpt.npz", "rb") as f:
            ckpt = checkpoint.load(f, official_model.CheckPoint)
        # The official writer, on what the official reader made of gclab's file, writes
        # the same keys and the same bytes in every array.
        with open(tmp / "official.npz", "wb") as f:
            checkpoint.dump(f, ckpt)
        ours_flat, theirs_flat = read_flat(tmp / "ckpt.npz"), read_flat(tmp / "official.npz")
        same_checkpoint = sorted(ours_flat) == sorted(theirs_flat) and all(
            ours_flat[k].dtype == theirs_flat[k].dtype
            and ours_flat[k].tobytes() == theirs_flat[k].tobytes() for k in ours_flat)
        example = xarray.load_dataset(tmp / "data.nc").compute()
        inputs, targets, forcings = data_utils.extract_inputs_targets_forcings(
            example, target_lead_times=slice("6h", f"{steps * 6}h"),
            **dataclasses.asdict(ckpt.task_config))
        stats = {name: xarray.load_dataset(tmp / "stats" / f"{name}.nc")
                 for name in ("mean_by_level", "stddev_by_level", "diffs_stddev_by_level")}

        @hk.transform_with_state
        def run_forward(inputs, targets_template, forcings):
            predictor = official_model.GraphCast(ckpt.model_config, ckpt.task_config)
            predictor = normalization.InputsAndResiduals(
                predictor, diffs_stddev_by_level=stats["diffs_stddev_by_level"],
                mean_by_level=stats["mean_by_level"], stddev_by_level=stats["stddev_by_level"])
            predictor = autoregressive.Predictor(predictor, gradient_checkpointing=True)
            return predictor(inputs, targets_template=targets_template, forcings=forcings)

        template = targets * np.nan
        theirs, _ = jax.jit(run_forward.apply)(ckpt.params, {}, jax.random.PRNGKey(0),
                                                inputs, template, forcings)
        theirs = theirs.compute() if hasattr(theirs, "compute") else theirs

    rows = {name: variable_row(ours[name].values,
                               theirs[name].transpose(*ours[name].dims).values)
            for name in ours.data_vars if name in theirs.data_vars}
    dims = {"gclab": {k: list(v.dims) for k, v in ours.data_vars.items()},
            "official": {k: list(v.dims) for k, v in theirs.data_vars.items()}}
    same_layout = (list(ours.data_vars) == list(theirs.data_vars)
                   and dims["gclab"] == dims["official"])
    return {
        "config": {"resolution": model.resolution, "mesh_splits": model.mesh_splits,
                   "latent_size": model.latent_size, "processor_steps": model.processor_steps,
                   "pressure_levels": list(task.pressure_levels), "batch": 2,
                   "steps": steps, "precision": "float32"},
        "variables": {"gclab": list(ours.data_vars), "official": list(theirs.data_vars)},
        "dims": dims,
        "coords": {"gclab": sorted(ours.coords), "official": sorted(theirs.coords)},
        "time": {"gclab": [str(t) for t in ours.time.values],
                 "official": [str(t) for t in theirs.time.values]},
        "checkpoint_keys": len(ours_flat),
        "checkpoint_identical_after_official_load_and_dump": same_checkpoint,
        "comparison": rows,
        **agreement(rows, same_layout, same_checkpoint),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, required=True,
                        help="path of a checkout of github.com/google-deepmind/graphcast")
    parser.add_argument("--steps", type=int, default=4, help="forecast steps (4)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: an integer >= 1")
    if not is_checkout(args.official):
        parser.error(f"--official must name a checkout of google-deepmind/graphcast "
                     f"({args.official} has no graphcast/graphcast.py)")
    import jax

    result = {**provenance(args.official), **run(args.official, args.steps)}
    backend = jax.default_backend()
    text = json.dumps(result, indent=1) + "\n"
    print(json.dumps({k: result[k] for k in ("variables", "worst_max_abs_diff_over_std",
                                             "agrees")}, indent=1))
    if not result["agrees"]:
        # The recorded agreement stays what chapter 1 shows; this run is kept beside it.
        out = write_text_atomic(RESULTS / f"official-forecast-{backend}-failed.json", text)
        print(f"does not agree within {TOLERANCE:g}: wrote {out}")
        return 1
    out = write_text_atomic(RESULTS / f"official-forecast-{backend}.json", text)
    write_text_atomic(SHIPPED / out.name, text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
