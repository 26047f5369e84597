"""Benchmark: build the 0.25 deg / 6-split GraphCast graphs from scratch, then from cache.

Each build runs in a fresh Python process (so peak RSS is that of the build alone),
against a fresh temporary cache folder. Writes ``benchmarks/results/graph_build.json``.

Usage:
  python benchmarks/graph_build.py [--resolution 0.25] [--splits 6]
  python benchmarks/graph_build.py --resolution 1 --splits 5 --output /tmp/graph-1deg.json

The recorded file and its targets are those of 0.25 deg / 6 splits: another geometry
needs its own ``--output``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from children import child_env  # noqa: E402
from fresh_clone import commit  # noqa: E402
from options import child_output  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "graph_build.json"
RECORDED = (0.25, 6)  # the geometry of `RESULTS` and of the targets it is held to
# The libraries a graph build runs on (scipy's KD-tree finds the edges, trimesh the face
# each grid point falls in).
LIBRARIES = ("gclab", "jax", "numpy", "scipy", "trimesh")


def versions() -> dict:
    """The installed versions of `LIBRARIES` (None where one is not installed), read from
    their metadata, so the builds' timing is not changed by importing them here."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found

# Runs in the child process: one build_graphs call, timed, with peak RSS.
_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from gclab.geometry import build_graphs
import_s = time.perf_counter() - t0
res, splits, cache_dir = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
t0 = time.perf_counter()
g = build_graphs(res, splits, cache_dir=cache_dir)
seconds = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
print(json.dumps({"seconds": seconds, "import_seconds": import_s,
                  "peak_rss_bytes": rss * 1024, "counts": g.counts(),
                  "query_radius": g.query_radius,
                  "normalization": {n: getattr(g, n).normalization
                                    for n in ("grid2mesh", "mesh", "mesh2grid")}}))
"""


def _run_child(resolution: float, splits: int, cache_dir: str) -> dict:
    """One build in a fresh process; a failed one ends this run with the child's own error
    (the last line of its stderr), exit status 1."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(resolution), str(splits), cache_dir],
        capture_output=True, text=True, env=child_env(), cwd=str(ROOT))
    stdout = child_output(out, "graph_build.py",
                          f"the build at {resolution:g} deg / {splits} splits")
    return json.loads(stdout.strip().splitlines()[-1])


def _check_geometry(parser: argparse.ArgumentParser, resolution: float, splits: int) -> None:
    """The geometry as gclab's `ModelConfig` allows it, or one line naming the option."""
    from gclab.config import ConfigError, ModelConfig

    try:
        ModelConfig(resolution=resolution, mesh_splits=splits)
    except ConfigError as e:
        option = {"resolution": "--resolution", "mesh_splits": "--splits"}[e.field]
        parser.error(f"{option} {e.value!r} is invalid: {e.allowed}")


def _check_writable(parser: argparse.ArgumentParser, output: Path) -> None:
    """`output`'s folder made (as the write would), and the file then checked as every
    output of gclab is (`gclab.files.check_output_path`), before any build: one line, not
    a failure after minutes of building."""
    from gclab.files import OutputPathError, check_output_path, writable_folder

    try:
        writable_folder(output.parent, missing="create", what=output)
    except OutputPathError as e:
        parser.error(f"--output {output}: its folder cannot be written ({e.reason})")
    try:
        check_output_path(output)
    except OutputPathError as e:
        parser.error(f"--output {e}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=float, default=0.25)
    parser.add_argument("--splits", type=int, default=6)
    parser.add_argument("--output", type=Path,
                        help=f"default {RESULTS.relative_to(ROOT)}, for 0.25 deg / 6 splits only")
    args = parser.parse_args(argv)
    _check_geometry(parser, args.resolution, args.splits)
    recorded = (args.resolution, args.splits) == RECORDED
    if args.output is None:
        if not recorded:
            parser.error(f"--output is required for a geometry other than {RECORDED[0]:g} deg / "
                         f"{RECORDED[1]} splits (the recorded file's)")
        args.output = RESULTS
    _check_writable(parser, args.output)

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="gclab-graph-bench-") as cache_dir:
        first = _run_child(args.resolution, args.splits, cache_dir)
        cache_files = sorted(Path(cache_dir).glob("*.npz"))
        cache_bytes = sum(p.stat().st_size for p in cache_files)
        second = _run_child(args.resolution, args.splits, cache_dir)
    assert first["counts"] == second["counts"]

    gib = 2.0**30
    result = {
        "benchmark": "graph_build",
        "resolution": args.resolution,
        "mesh_splits": args.splits,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "hardware": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "versions": versions(),
            "load_average_1min": round(load_before, 2),
            "note": "other processes share these cores; a load average above the core "
                    "count slows the builds down",
        },
        "first_build": {
            "seconds": round(first["seconds"], 3),
            "peak_rss_bytes": first["peak_rss_bytes"],
            "peak_rss_gib": round(first["peak_rss_bytes"] / gib, 3),
            "note": "fresh process, empty cache folder; includes writing the cache file",
        },
        "cached_build": {
            "seconds": round(second["seconds"], 3),
            "peak_rss_bytes": second["peak_rss_bytes"],
            "peak_rss_gib": round(second["peak_rss_bytes"] / gib, 3),
            "cache_file_bytes": cache_bytes,
        },
        "counts": first["counts"],
        "query_radius": first["query_radius"],
        "edge_normalization": first["normalization"],
    }
    if recorded:  # the targets and the official figures are those of 0.25 deg / 6 splits
        result.update({
            "targets": {"first_build_seconds": 20.0, "first_build_peak_rss_gib": 3.0},
            "official_reference": {"first_build_seconds": 42.0, "peak_rss_gib": 3.5},
            "meets_targets": bool(first["seconds"] <= 20.0
                                  and first["peak_rss_bytes"] <= 3.0 * gib),
        })
    tmp = args.output.with_name(f".{args.output.name}.tmp")  # whole, then renamed
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, args.output)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
