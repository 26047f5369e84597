"""Benchmark: DeepMind's official GraphCast code and gclab, side by side, on this backend.

The official code is not part of this repository. Check it out anywhere
(github.com/google-deepmind/graphcast), install what it imports (chex, dm-tree, xarray,
trimesh, rtree, scipy, pandas besides jax, haiku and jraph), and pass its path:

    python benchmarks/official_side_by_side.py --official /path/to/graphcast
    python benchmarks/official_side_by_side.py --official PATH --skip-full   # no 0.25 deg
    python benchmarks/official_side_by_side.py --report-only   # .md again from the .json

It is imported from that path (``sys.path``), never copied. Every measurement runs in a
fresh Python process, one at a time, so that a large compile frees its memory and a
stuck one can be stopped (``--timeout``). It writes
``benchmarks/results/official-<backend>.json`` and ``.md``, naming the hardware, the
date, the library versions and the commits of both codes. A run in which nothing was
measured is written to ``official-<backend>-failed.json`` instead, the recorded files
kept, and exits with status 1.

What it measures (batch 1, one target step, 13 levels at 4 and 1 deg, 37 at 0.25 deg):

1. **Compiled memory of one loss-and-gradient step**, from shapes alone
   (``jax.ShapeDtypeStruct``; nothing is allocated), read from
   ``jax.jit(f).lower(...).compile().memory_analysis()``: ``temp_size_in_bytes``,
   ``argument_size_in_bytes`` and ``output_size_in_bytes`` (never
   ``peak_memory_in_bytes``, which on XLA:CPU leaves out temporaries).

   * official: ``GraphCast(model_config, task_config).loss(inputs, targets, forcings)``
     on xarray Datasets with the official variables and dims (batch, time, lat, lon,
     level), inside ``haiku.transform``; gradient with respect to the parameters. In
     bfloat16 the predictor is wrapped in ``casting.Bfloat16Cast``, as the official
     training demo wraps it. The demo's normalisation wrapper (a per-variable affine
     map of inputs and targets) and its autoregressive wrapper are left out: one target
     step needs no rollout, and the normalisation statistics are data.
   * gclab: the ``none`` recipe in f32 or bf16, ``gclab.sizing.loss_grad_abstract``
     (the same loss without the optimizer update), gradient with respect to the
     parameters.

   Both compile with the same XLA options (``gclab.sizing.plan_only_options`` with
   ``same_hlo``: on CPU, LLVM optimisation off; buffer assignment, hence every figure
   here, is unchanged).
   The official code holds the graphs as constants of the program; gclab takes them as
   arguments, so gclab's argument bytes include the graph arrays.

2. **Step time** of the same loss-and-gradient step on real random arrays at 4 deg /
   3 splits, 16 x 512, float32 (compiled with default options): the median of
   ``--repeats`` calls after a warm-up call, the two sides' calls interleaved.

3. **Graph build** at 0.25 deg / 6 splits, each in a fresh process: the official
   ``GraphCast`` constructor plus its graph set-up (``_maybe_init`` on the lat/lon
   coordinates, what its first call does) against ``gclab.geometry.build_graphs``
   with the cache off. Wall seconds and peak RSS (``VmHWM``), with the RSS after the
   imports, so that the build's own share can be read.

Parameter shapes of the official model do not depend on the grid or the mesh, so the
official side takes them from a cheap ``init`` on a 10 deg grid with 2 mesh splits
instead of building the large graphs twice; the parameter counts of both sides are
recorded and must agree.

This is a benchmark: it is not part of the test suite and does not run in CI.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from children import child_env

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GIB = 2.0**30

# name -> (resolution deg, mesh splits, pressure levels, latent L, processor steps S)
CONFIGS = {
    "4deg-16x512": (4.0, 3, 13, 512, 16),
    "graphcast-small": (1.0, 5, 13, 512, 16),
    "graphcast": (0.25, 6, 37, 512, 16),
}
FULL = "graphcast"  # the 0.25 deg configuration that --skip-full leaves out
TIME_CONFIG = "4deg-16x512"
TIME_PRECISIONS = ("f32",)
GRAPH_GEOMETRY = (0.25, 6)


def describe(name: str) -> str:
    res, splits, levels, latent, steps = CONFIGS[name]
    return f"{res:g} deg / {splits} splits, {levels} levels, {steps} x {latent}"


# ---------------------------------------------------------------------------- official


def import_official(path: str):
    """The official `graphcast` package, imported from the checkout at `path`."""
    sys.path.insert(0, str(Path(path).resolve()))
    from graphcast import casting, xarray_jax
    from graphcast import graphcast as model

    where = Path(model.__file__).resolve()
    if Path(path).resolve() not in where.parents:
        raise RuntimeError(f"graphcast was imported from {where}, not from {path}")
    return model, casting, xarray_jax


def official_configs(model, name: str, resolution=None, splits=None):
    """Official `ModelConfig` and `TaskConfig` of a configuration (geometry overridable)."""
    res, mesh, levels, latent, steps = CONFIGS[name]
    model_config = model.ModelConfig(
        resolution=resolution or res, mesh_size=splits or mesh, latent_size=latent,
        gnn_msg_steps=steps, hidden_layers=1, radius_query_fraction_edge_length=0.6)
    task_config = {13: model.TASK_13, 37: model.TASK}[levels]
    return model_config, task_config


def official_layout(model, task_config, resolution: float, batch: int = 1):
    """Dims, shapes and coordinates of the official inputs, targets and forcings.

    Two input frames and one target frame; statics are (lat, lon); atmospheric variables
    carry a level axis.
    """
    import numpy as np

    lat = np.linspace(-90.0, 90.0, int(round(180 / resolution)) + 1)
    lon = np.arange(0.0, 360.0, resolution)
    levels = np.asarray(task_config.pressure_levels)
    sizes = {"batch": batch, "lat": lat.size, "lon": lon.size, "level": levels.size}

    def dims(var: str) -> tuple:
        if var in model.STATIC_VARS:
            return ("lat", "lon")
        if var in model.ALL_ATMOSPHERIC_VARS:
            return ("batch", "time", "lat", "lon", "level")
        return ("batch", "time", "lat", "lon")

    parts = {"inputs": (task_config.input_variables, 2),
             "targets": (task_config.target_variables, 1),
             "forcings": (task_config.forcing_variables, 1)}
    layout = {}
    for part, (names, frames) in parts.items():
        layout[part] = {v: (dims(v), tuple({**sizes, "time": frames}[d] for d in dims(v)))
                        for v in names}
    coords = {"lat": lat, "lon": lon, "level": levels}
    return layout, coords


def official_loss_grad(official_path: str, name: str, precision: str, resolution=None,
                       splits=None):
    """`(fn, abstract args, num_params)` of the official loss-and-gradient step.

    `fn(params, inputs, targets, forcings) -> (loss, grads)`, the three data arguments
    being dicts of arrays that become xarray Datasets inside.
    """
    import haiku as hk
    import jax
    import jax.numpy as jnp
    import numpy as np

    model, casting, xarray_jax = import_official(official_path)
    model_config, task_config = official_configs(model, name, resolution, splits)

    def transformed(layout, coords, config):
        def loss(inputs, targets, forcings):
            def dataset(part, arrays):
                return xarray_jax.Dataset(
                    {v: (layout[part][v][0], a) for v, a in arrays.items()}, coords=coords)

            predictor = model.GraphCast(config, task_config)
            if precision == "bf16":
                predictor = casting.Bfloat16Cast(predictor)
            value, _ = predictor.loss(dataset("inputs", inputs), dataset("targets", targets),
                                      dataset("forcings", forcings))
            return xarray_jax.unwrap_data(value.mean(), require_jax=True)

        return hk.transform(loss)

    def shapes(layout):
        return [{v: jax.ShapeDtypeStruct(shape, jnp.float32)
                 for v, (_, shape) in layout[part].items()}
                for part in ("inputs", "targets", "forcings")]

    # Parameter shapes from a small geometry (they depend only on channels and widths).
    small_config, _ = official_configs(model, name, resolution=10.0, splits=2)
    small_layout, small_coords = official_layout(model, task_config, 10.0)
    params = jax.eval_shape(transformed(small_layout, small_coords, small_config).init,
                            jax.random.PRNGKey(0), *shapes(small_layout))
    num_params = int(sum(np.prod(p.shape) for p in jax.tree_util.tree_leaves(params)))

    layout, coords = official_layout(model, task_config, model_config.resolution)
    net = transformed(layout, coords, model_config)

    def loss_grad(params, inputs, targets, forcings):
        return jax.value_and_grad(lambda p: net.apply(p, None, inputs, targets, forcings))(
            params)

    return loss_grad, (params, *shapes(layout)), num_params


# ------------------------------------------------------------------------------- gclab


def gclab_loss_grad(name: str, precision: str):
    """`(fn, abstract args, num_params, graphs)` of gclab's loss-and-gradient step."""
    import jax

    from gclab.config import ModelConfig, TaskConfig
    from gclab.geometry import graphs_for
    from gclab.memory import get_recipe
    from gclab.sizing import StepSpec, loss_grad_abstract, param_count

    res, splits, levels, latent, steps = CONFIGS[name]
    model = ModelConfig(resolution=res, mesh_splits=splits, latent_size=latent,
                        processor_steps=steps)
    task = TaskConfig.from_levels(levels)
    spec = StepSpec(model, task, get_recipe("none", precision))
    graphs = graphs_for(model)
    loss, args = loss_grad_abstract(spec, graphs)
    return jax.value_and_grad(loss), args, param_count(model, task), graphs


# ----------------------------------------------------------------------- child processes


def _random_like(tree, seed: int):
    """Arrays of the shapes of `tree`: 0.1 x standard normal (floats), zeros (ints)."""
    import jax
    import jax.numpy as jnp

    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(jax.random.PRNGKey(seed), max(len(leaves), 1))
    out = [0.1 * jax.random.normal(k, s.shape, s.dtype)
           if jnp.issubdtype(s.dtype, jnp.floating) else jnp.zeros(s.shape, s.dtype)
           for k, s in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(treedef, out)


def _status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (`VmRSS` now, `VmHWM` peak), in bytes.

    Not `ru_maxrss`: on Linux it survives exec, so a child started by a larger parent
    would report the parent's size.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def child_memory(official: str, side: str, name: str, precision: str) -> dict:
    """Compiled memory of one loss-and-gradient step of one side."""
    from gclab.measure import compile_timed, memory_of_compiled
    from gclab.sizing import plan_only_options

    if side == "official":
        fn, args, num_params = official_loss_grad(official, name, precision)
    else:
        fn, args, num_params, _ = gclab_loss_grad(name, precision)
    compiled, seconds = compile_timed(fn, args, {},
                                      compiler_options=plan_only_options(same_hlo=True))
    m = memory_of_compiled(compiled, seconds)
    return {"temp_bytes": m.temp_bytes, "argument_bytes": m.argument_bytes,
            "output_bytes": m.output_bytes, "alias_bytes": m.alias_bytes,
            "compile_seconds": round(seconds, 2), "num_params": num_params,
            "compile_peak_rss_bytes": _status_bytes("VmHWM")}


def child_time(official: str, name: str, precision: str, repeats: int) -> dict:
    """Median seconds of one real loss-and-gradient step of each side, interleaved.

    Both steps are compiled and called once untimed; then each round times one call of
    each, so that a change in the machine's load falls on both sides alike.
    """
    import jax

    from gclab.model import graph_inputs

    fn, args, _ = official_loss_grad(official, name, precision)
    official_args = _random_like(args, seed=0)
    official_step = jax.jit(fn).lower(*official_args).compile()

    fn, (params, _, example), _, graphs = gclab_loss_grad(name, precision)
    gclab_args = (_random_like(params, seed=0), graph_inputs(graphs),
                  _random_like(example, seed=1))
    gclab_step = jax.jit(fn).lower(*gclab_args).compile()

    calls = {"official": lambda: jax.block_until_ready(official_step(*official_args)),
             "gclab": lambda: jax.block_until_ready(gclab_step(*gclab_args))}
    for call in calls.values():
        call()  # warm-up
    load = {"before": os.getloadavg()[0]}
    seconds = {side: [] for side in calls}
    for _ in range(repeats):
        for side, call in calls.items():
            t0 = time.perf_counter()
            call()
            seconds[side].append(time.perf_counter() - t0)
    load["after"] = os.getloadavg()[0]
    return {"median_seconds": {side: statistics.median(v) for side, v in seconds.items()},
            "all_seconds": seconds, "repeats": repeats, "load_average_1min": load}


def child_graph(official: str, side: str, resolution: float, splits: int) -> dict:
    """Seconds and peak RSS of building the three graphs from scratch."""
    import numpy as np

    t0 = time.perf_counter()
    if side == "official":
        import haiku as hk
        import xarray

        model, _, _ = import_official(official)
        model_config, task_config = official_configs(model, "graphcast", resolution, splits)
        coords = {"lat": np.linspace(-90.0, 90.0, int(round(180 / resolution)) + 1),
                  "lon": np.arange(0.0, 360.0, resolution)}
    else:
        from gclab.geometry import build_graphs
    import_seconds = time.perf_counter() - t0
    rss_after_imports = _status_bytes("VmRSS")

    t0 = time.perf_counter()
    if side == "official":
        def build():
            predictor = model.GraphCast(model_config, task_config)
            predictor._maybe_init(xarray.Dataset(coords=coords))
            g2m = predictor._grid2mesh_graph_structure
            m2g = predictor._mesh2grid_graph_structure
            mesh = predictor._mesh_graph_structure
            edges = {n: int(next(iter(g.edges.values())).n_edge[0])
                     for n, g in (("grid2mesh", g2m), ("mesh", mesh), ("mesh2grid", m2g))}
            return {"grid_nodes": int(predictor._num_grid_nodes),
                    "mesh_nodes": int(predictor._num_mesh_nodes),
                    **{f"{n}_edges": e for n, e in edges.items()}}

        counts = hk.transform(build).apply({}, None)
    else:
        counts = build_graphs(resolution, splits, cache=False).counts()
    seconds = time.perf_counter() - t0
    return {"seconds": round(seconds, 3), "import_seconds": round(import_seconds, 3),
            "peak_rss_bytes": _status_bytes("VmHWM"), "rss_after_imports_bytes": rss_after_imports,
            "counts": counts}


CHILDREN = {"memory": child_memory, "time": child_time, "graph": child_graph}


def run_child(official: str, kind: str, timeout: float, env: dict, **kwargs) -> dict:
    """Runs one measurement in a fresh process; a failure becomes a `not measured` row."""
    payload = json.dumps({"kind": kind, "official": official, **kwargs})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", payload]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return {"status": "not measured",
                "reason": f"did not finish within the {timeout:.0f} s limit"}
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        why = "killed (out of memory?)" if proc.returncode in (-9, 137) else " | ".join(tail)
        return {"status": "not measured", "reason": f"exit {proc.returncode}: {why}"[:500]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"status": "ok", "wall_seconds": round(wall, 1), **result}


# ------------------------------------------------------------------------------ report


def _git(path: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True)
    return out.stdout.strip()


def provenance(official: Path) -> dict:
    import haiku
    import jax
    import jaxlib
    import numpy
    import scipy

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), platform.processor())
    mem_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text()
                   .splitlines() if line.startswith("MemTotal"))
    versions = {"python": platform.python_version(), "jax": jax.__version__,
                "jaxlib": jaxlib.__version__, "dm-haiku": haiku.__version__,
                "numpy": numpy.__version__, "scipy": scipy.__version__}
    for module in ("xarray", "chex", "jraph", "trimesh"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hardware": {"backend": jax.default_backend(), "cpu_model": cpu,
                     "cores": os.cpu_count(), "ram_bytes": mem_kib * 1024,
                     "platform": platform.platform()},
        "versions": versions,
        "official": {"repository": "github.com/google-deepmind/graphcast",
                     "commit": _git(official, "rev-parse", "HEAD"),
                     "commit_date": _git(official, "log", "-1", "--format=%cI"),
                     "modified_files": bool(_git(official, "status", "--porcelain",
                                                 "--untracked-files=no"))},
        "gclab": {"commit": _git(ROOT, "rev-parse", "HEAD"),
                  "modified_files": bool(_git(ROOT, "status", "--porcelain",
                                              "--untracked-files=no"))},
    }


def _ratio(a, b):
    return round(a / b, 3) if a and b else None


def _gib(n) -> str:
    return f"{n / GIB:.2f} GiB" if n is not None else "n/a"


def markdown(record: dict) -> str:
    p, hw, v = record["provenance"], record["provenance"]["hardware"], \
        record["provenance"]["versions"]
    lines = [
        f"# DeepMind's official GraphCast code and gclab, side by side ({hw['backend']})", "",
        f"Measured {p['date']} with `python benchmarks/official_side_by_side.py` on "
        f"{hw['cpu_model']}, {hw['cores']} cores, {hw['ram_bytes'] / GIB:.1f} GiB RAM "
        f"({hw['platform']}).",
        f"Official code: {p['official']['repository']} at commit "
        f"`{p['official']['commit']}` ({p['official']['commit_date']}); gclab at commit "
        f"`{p['gclab']['commit']}`.",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".", "",
        *[f"Measured again: {r['what']}, {r['provenance']['date']}, gclab at commit "
          f"`{r['provenance']['gclab']['commit']}`, official at "
          f"`{r['provenance']['official']['commit']}`, jax {r['provenance']['versions']['jax']}, "
          f"on {r['provenance']['hardware']['cpu_model']}.\n"
          for r in record.get("remeasured", [])],
        "Ratios are gclab / official (below 1: gclab needs less).", "",
        "## Compiled memory of one loss-and-gradient step (batch 1, one target step)", "",
        "| configuration | precision | official temp | gclab temp | ratio | "
        "official args + out | gclab args + out | compile s (official / gclab) |",
        "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in record["memory"]:
        o, g = r["official"], r["gclab"]
        if o["status"] != "ok" or g["status"] != "ok":
            why = "; ".join(f"{s}: {x['reason']}" for s, x in (("official", o), ("gclab", g))
                            if x["status"] != "ok")
            lines.append(f"| {r['label']} | {r['precision']} | "
                         f"{_gib(o.get('temp_bytes'))} | {_gib(g.get('temp_bytes'))} | "
                         f"not measured ({why}) | | | |")
            continue
        lines.append(
            f"| {r['label']} | {r['precision']} | {_gib(o['temp_bytes'])} | "
            f"{_gib(g['temp_bytes'])} | {r['ratio_temp']:.3f} | "
            f"{_gib(o['argument_bytes'] + o['output_bytes'])} | "
            f"{_gib(g['argument_bytes'] + g['output_bytes'])} | "
            f"{o['compile_seconds']:.0f} / {g['compile_seconds']:.0f} |")
    t = record["step_time"]
    lines += ["", "## Step time of one loss-and-gradient step (real random arrays)", "",
              "| configuration | precision | official | gclab | ratio | load average |",
              "|---|---|---:|---:|---:|---:|"]
    for r in t:
        if r["status"] != "ok":
            lines.append(f"| {r['label']} | {r['precision']} | not measured: {r['reason']} "
                         "| | | |")
            continue
        med, load = r["median_seconds"], r["load_average_1min"]
        lines.append(f"| {r['label']} | {r['precision']} | {med['official']:.2f} s | "
                     f"{med['gclab']:.2f} s | {r['ratio']:.3f} | "
                     f"{load['before']:.1f} -> {load['after']:.1f} |")
    lines += ["", "## Graph build from scratch, fresh process", "",
              "| geometry | measure | official | gclab | ratio |", "|---|---|---:|---:|---:|"]
    gb = record["graph_build"]
    o, g = gb["official"], gb["gclab"]
    if o["status"] == "ok" and g["status"] == "ok":
        lines += [
            f"| {gb['label']} | seconds | {o['seconds']:.1f} s | {g['seconds']:.1f} s | "
            f"{gb['ratio_seconds']:.3f} |",
            f"| {gb['label']} | peak RSS | {_gib(o['peak_rss_bytes'])} | "
            f"{_gib(g['peak_rss_bytes'])} | {gb['ratio_peak_rss']:.3f} |",
            f"| {gb['label']} | peak RSS above imports | "
            f"{_gib(o['peak_rss_bytes'] - o['rss_after_imports_bytes'])} | "
            f"{_gib(g['peak_rss_bytes'] - g['rss_after_imports_bytes'])} | "
            f"{gb['ratio_peak_rss_above_imports']:.3f} |",
            "", "Edge counts (official / gclab): " + ", ".join(
                f"{k} {o['counts'][k]:,} / {g['counts'][k]:,}" for k in o["counts"]) + "."]
    else:
        for side, x in (("official", o), ("gclab", g)):
            if x["status"] != "ok":
                lines.append(f"| {gb['label']} | | {side} not measured: {x['reason']} | | |")
    lines += ["", "## What each row is", "", *EXPLANATION]
    return "\n".join(lines) + "\n"


EXPLANATION = [
    "- **Compiled memory.** Each side's loss and its gradient with respect to the "
    "parameters is jitted, lowered from `jax.ShapeDtypeStruct`s (nothing allocated) and "
    "compiled, each in a fresh process with the same XLA options (on CPU, LLVM "
    "optimisation off; buffer assignment does not change). *temp* is "
    "`temp_size_in_bytes`: every activation, residual kept for the backward pass and "
    "gradient in flight. *args + out* is `argument_size_in_bytes + "
    "output_size_in_bytes` (parameters and data in; loss and gradients out). "
    "`peak_memory_in_bytes` is not used: on XLA:CPU it leaves out temp.",
    "- **official** is `graphcast.GraphCast.loss` on xarray Datasets with the official "
    "variables, dims (batch, time, lat, lon, level) and coordinates; bf16 wraps it in "
    "`casting.Bfloat16Cast` as the official training demo does (inputs and activations "
    "bfloat16, parameters float32 and cast when read). The demo's normalisation and "
    "autoregressive wrappers are left out (one target step).",
    "- **gclab** is the `none` recipe (no memory technique) of "
    "`gclab.sizing.loss_grad_abstract`: the same loss and gradient without the AdamW "
    "update, in f32 or bf16 (`MemoryConfig.precision`).",
    "- The official program holds the graphs (indices and static features) as "
    "constants, which count in neither column; gclab passes them as arguments, so "
    "gclab's *args + out* include them. *temp* compares like with like.",
    "- **Step time** is the median of several calls of the compiled loss-and-gradient "
    "step on random arrays, after one untimed call, both sides in one process with "
    "their calls interleaved, at 4 deg / 3 splits, 16 x 512, float32. The "
    "machine may be shared: *load average* is the 1-minute load before and after the "
    "timed calls; above the core count, other work slowed both sides.",
    "- **Graph build** builds the 0.25 deg / 6-split grid2mesh, mesh and mesh2grid "
    "graphs with all static features from scratch, each side in a fresh process: the "
    "official `GraphCast` constructor and its graph set-up on the grid's lat/lon "
    "coordinates (what its first call does) against `gclab.geometry.build_graphs` with "
    "its disk cache off. Seconds leave out the imports; *peak RSS* is the process's "
    "high-water mark (`VmHWM`); *above imports* subtracts the RSS once the imports "
    "are done (the official side imports jax, haiku and xarray; gclab's geometry only "
    "numpy and scipy).",
]


def _write(path: Path, text: str) -> None:
    """Writes a result file whole: a temporary file in its folder, then renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _positive(text: str) -> float:
    """`--timeout`: seconds, a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: a number of seconds > 0")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official", help="path of a checkout of the official code")
    parser.add_argument("--skip-full", action="store_true",
                        help="leave out the 0.25 deg compiles (recorded as not measured)")
    parser.add_argument("--timeout", type=_positive, default=3600.0,
                        help="seconds for each measurement's process")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per step time")
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument("--only-memory", choices=["f32", "bf16"],
                        help="measure again only the compiled-memory rows of this precision "
                             "(both sides) and keep the rest of the recorded file")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the .md from the .json of an earlier run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        request = json.loads(args.child)
        kind = request.pop("kind")
        print(json.dumps(CHILDREN[kind](**request)), flush=True)
        return 0
    # Before any measurement: a folder that cannot take the files is said now, not after
    # hours of compiles.
    from gclab.files import OutputPathError, writable_folder

    try:
        writable_folder(args.output_dir)  # an existing one, written to once
    except OutputPathError as e:
        parser.error(f"--output-dir {args.output_dir}: {e.reason}; an existing folder that "
                     "can be written is allowed")

    if args.report_only:
        written = 0
        for path in sorted(args.output_dir.glob("official-*.json")):
            record = json.loads(path.read_text())
            if record.get("benchmark") == "official_side_by_side":  # not the forecast's
                _write(path.with_suffix(".md"), markdown(record))
                written += 1
        if not written:
            parser.error(f"--report-only: no official-<backend>.json of this benchmark in "
                         f"{args.output_dir}")
        return 0
    if not args.official or not (Path(args.official) / "graphcast" / "graphcast.py").is_file():
        parser.error("--official must name a checkout of google-deepmind/graphcast")
    official = str(Path(args.official).resolve())

    import jax

    record = {"benchmark": "official_side_by_side", "provenance": provenance(Path(official))}
    path = args.output_dir / f"official-{jax.default_backend()}.json"
    if args.only_memory:
        if not path.is_file():
            parser.error(f"--only-memory: no recorded {path} to keep the rest of")
        again = record["provenance"]
        record = json.loads(path.read_text())
        record["memory"] = [r for r in record["memory"] if r["precision"] != args.only_memory]
        what = f"compiled memory, {args.only_memory}"
        # An earlier re-measure of the same rows names a commit whose figures are gone.
        record["remeasured"] = [r for r in record.get("remeasured", []) if r["what"] != what]
        record["remeasured"].append({"what": what, "provenance": again})
    precisions = (args.only_memory,) if args.only_memory else ("f32", "bf16")
    measured = []  # this run's results (not the rows an --only-memory run keeps)

    def measure(*args, **kwargs) -> dict:
        measured.append(run_child(*args, **kwargs))
        return measured[-1]

    with tempfile.TemporaryDirectory(prefix="gclab-official-bench-") as cache:
        env = child_env(GCLAB_CACHE_DIR=cache)
        if not args.only_memory:
            record["memory"] = []
        for name in CONFIGS:
            for precision in precisions:
                row = {"config": name, "label": describe(name), "precision": precision}
                for side in ("official", "gclab"):
                    if name == FULL and args.skip_full:
                        row[side] = {"status": "not measured", "reason": "--skip-full"}
                    else:
                        row[side] = measure(official, "memory", args.timeout, env,
                                              side=side, name=name, precision=precision)
                    print(name, precision, side, json.dumps(row[side]), flush=True)
                if row["official"]["status"] == "ok" and row["gclab"]["status"] == "ok":
                    row["ratio_temp"] = _ratio(row["gclab"]["temp_bytes"],
                                               row["official"]["temp_bytes"])
                record["memory"].append(row)
        order = {name: i for i, name in enumerate(CONFIGS)}
        record["memory"].sort(key=lambda r: (order[r["config"]], r["precision"] != "f32"))
        if args.only_memory:
            return _save(record, args.output_dir, jax.default_backend(), measured)

        record["step_time"] = []
        for precision in TIME_PRECISIONS:
            row = {"config": TIME_CONFIG, "label": describe(TIME_CONFIG),
                   "precision": precision,
                   **measure(official, "time", args.timeout, env, name=TIME_CONFIG,
                               precision=precision, repeats=args.repeats)}
            if row["status"] == "ok":
                med = row["median_seconds"]
                row["ratio"] = _ratio(med["gclab"], med["official"])
            print("step time", precision, json.dumps(row), flush=True)
            record["step_time"].append(row)

        res, splits = GRAPH_GEOMETRY
        gb = {"resolution": res, "mesh_splits": splits,
              "label": f"{res:g} deg / {splits} splits"}
        for side in ("official", "gclab"):
            gb[side] = measure(official, "graph", args.timeout, env, side=side,
                                 resolution=res, splits=splits)
            print("graph build", side, json.dumps(gb[side]), flush=True)
        o, g = gb["official"], gb["gclab"]
        if o["status"] == "ok" and g["status"] == "ok":
            gb["ratio_seconds"] = _ratio(g["seconds"], o["seconds"])
            gb["ratio_peak_rss"] = _ratio(g["peak_rss_bytes"], o["peak_rss_bytes"])
            gb["ratio_peak_rss_above_imports"] = _ratio(
                g["peak_rss_bytes"] - g["rss_after_imports_bytes"],
                o["peak_rss_bytes"] - o["rss_after_imports_bytes"])
        record["graph_build"] = gb
    return _save(record, args.output_dir, jax.default_backend(), measured)


def _save(record: dict, output_dir: Path, backend: str, measured: list) -> int:
    if not any(r["status"] == "ok" for r in measured):
        # The recorded comparison stays what it was; this run is kept beside it.
        path = output_dir / f"official-{backend}-failed.json"
        _write(path, json.dumps(record, indent=1) + "\n")
        first = measured[0]["reason"] if measured else "no measurement ran"
        print(f"official_side_by_side.py: nothing was measured (first: {first}); wrote {path}, "
              f"official-{backend}.json is kept", file=sys.stderr)
        return 1
    _write(output_dir / f"official-{backend}.json", json.dumps(record, indent=1) + "\n")
    text = markdown(record)
    _write(output_dir / f"official-{backend}.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
