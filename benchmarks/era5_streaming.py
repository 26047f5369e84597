"""Benchmark: host memory of streaming training examples from a WeatherBench2-style zarr store.

Writes synthetic weather as a WeatherBench2-style ERA5 store (latitude north to south,
`time` as datetimes, one chunk per time step, zarr v2) in a temporary folder, opens it
lazily with `gclab.weather.era5.open_era5`, and records with memray
(`gclab.measure.hostmem`) the host-memory profile of building one training example
(`DatasetWeather.make_batch`, batch 1) for each ``--rollouts``, next to the bytes of one
time step and of the whole store. Writes ``benchmarks/results/era5-streaming-cpu.json``
with the hardware, date and versions.

    python benchmarks/era5_streaming.py [--resolution 2] [--levels 13] [--steps 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from official_side_by_side import provenance  # noqa: E402

from gclab.files import write_text_atomic  # noqa: E402


def rollout_list(text: str) -> list[int]:
    """The ``--rollouts`` value as integers, each >= 1 (argparse's `type`)."""
    try:
        rollouts = [int(r) for r in text.split(",")]
    except ValueError:
        rollouts = []
    if not rollouts or min(rollouts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers >= 1")
    return rollouts


def main(argv: list[str] | None = None) -> None:
    from gclab.config import ConfigError, ModelConfig, TaskConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolution", type=float, default=2.0)
    parser.add_argument("--levels", type=int, default=13, choices=(13, 37))
    parser.add_argument("--steps", type=int, default=32, help="time steps in the store")
    parser.add_argument("--rollouts", type=rollout_list, default="1,4",
                        help="comma-separated rollouts")
    args = parser.parse_args(argv)
    try:
        model = ModelConfig(resolution=args.resolution)
    except ConfigError as e:
        parser.error(f"--resolution {args.resolution:g}: {e.allowed}")
    # An example of rollout T reads two input frames and T targets from the store.
    least = max(args.rollouts) + 2
    if args.steps < least:
        parser.error(f"--steps {args.steps}: an integer >= {least} (two input frames and "
                     f"the {max(args.rollouts)} target(s) of the longest --rollouts)")

    from gclab.measure.hostmem import track_host_memory
    from gclab.training.data import SAMPLE_SPACING, SyntheticWeather
    from gclab.weather import DatasetWeather, compute_stats, synthetic_dataset
    from gclab.weather.era5 import open_era5, weatherbench_dataset

    task = TaskConfig.from_levels(args.levels)
    weather = SyntheticWeather(task, model.resolution)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "era5.zarr"
        official = synthetic_dataset(weather, frames=args.steps)
        store_bytes = int(sum(v.nbytes for v in official.data_vars.values()))
        weatherbench_dataset(official).chunk({"time": 1}).to_zarr(path, zarr_format=2)
        stats = compute_stats(official.isel(time=slice(0, 8)))
        del official
        lat = np.linspace(-90, 90, model.n_lat)
        lon = np.arange(model.n_lon) * model.resolution
        source = DatasetWeather(open_era5(path), task, stats, lat, lon)
        step_bytes = (store_bytes - 2 * 4 * model.num_grid_nodes) / args.steps
        source.make_batch(1, rollout=1, start=1)  # imports and caches
        for rollout in args.rollouts:
            with track_host_memory() as host:
                example = source.make_batch(1, rollout=rollout, start=1 + SAMPLE_SPACING * 3)
            example_bytes = int(sum(np.asarray(a).nbytes for a in example))
            rows.append({"rollout": rollout, "peak_heap_bytes": int(host.peak_bytes),
                         "example_bytes": example_bytes,
                         "peak_over_time_step": host.peak_bytes / step_bytes,
                         "duration_s": host.duration_s,
                         "snapshots": host.snapshots[["time_s", "heap_bytes"]]
                         .to_dict("list")})
    result = {**provenance(ROOT), "resolution": args.resolution, "levels": args.levels,
              "store_time_steps": args.steps, "store_bytes": store_bytes,
              "time_step_bytes": step_bytes, "examples": rows}
    result.pop("official", None)
    out = ROOT / "benchmarks" / "results" / "era5-streaming-cpu.json"
    write_text_atomic(out, json.dumps(result, indent=1) + "\n")  # whole, or the old one
    for r in rows:
        print(f"rollout {r['rollout']}: peak {r['peak_heap_bytes'] / 2**20:.1f} MiB, "
              f"example {r['example_bytes'] / 2**20:.1f} MiB, "
              f"{r['peak_over_time_step']:.1f} time steps; store {store_bytes / 2**20:.0f} MiB")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
