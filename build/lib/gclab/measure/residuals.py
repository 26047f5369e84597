"""What the forward pass saves for the backward pass, grouped by module, in bytes.

Reverse-mode differentiation keeps *residuals*: values computed in the forward pass
that the backward pass needs. They are what gradient checkpointing (remat) trades
for recomputation, so knowing which module saves what is the first step of fitting
a model in memory.

`saved_residuals_df` traces ``jax.vjp(f, *args)`` to a jaxpr (no compilation, no
allocation: arguments may be `jax.ShapeDtypeStruct`) and, for every residual, reads
the equation that produced it, including its *name stack*: Haiku module names
(``grid2mesh_gnn``, ``mesh_gnn``, ``mesh2grid_gnn``) and `jax.named_scope` names.
This is the same analysis as `jax.ad_checkpoint.print_saved_residuals`, which only
prints and leaves the name stack out. If JAX internals change, it falls back to
``jax._src.ad_checkpoint.saved_residuals`` and then to parsing the printed output;
in the fallbacks the module is guessed from the description.

Residuals that are arguments (parameters, inputs) are grouped as ``'inputs/params'``:
they cost no extra memory (the arguments are alive anyway) but are listed.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import pandas as pd

__all__ = [
    "ARGUMENTS_GROUP",
    "NOT_A_GRAPH_SET",
    "bytes_by_graph_set",
    "indexed_by",
    "module_of_scope",
    "saved_residuals_df",
    "summarize_residuals",
]

ARGUMENTS_GROUP = "inputs/params"
#: `indexed_by` of a shape with no axis of a graph set's size.
NOT_A_GRAPH_SET = "other (parameters, scalars)"
COLUMNS = ("module", "shape", "dtype", "bytes", "description", "scope")

# Name-stack components that say how, not where (transformations, control flow).
_GENERIC = {
    "", "~", "while", "body", "cond", "closed_call", "checkpoint", "remat",
    "rematted_computation", "scan", "branch", "pjit", "jit", "custom_jvp_call",
    "custom_vjp_call",
}
_WRAPPER_RE = re.compile(r"\b[A-Za-z_]\w*\(")


def module_of_scope(scope: str, depth: int = 1) -> str:
    """Module path of a name stack, without transformation wrappers.

    ``'jvp(mesh_gnn/~/layer_stack)'`` gives ``'mesh_gnn'`` at depth 1 and
    ``'mesh_gnn/layer_stack'`` at depth 2.

    Args:
      scope: a name stack / op_name such as ``'transpose(jvp(encoder))/dot'``.
      depth: how many module components to keep.

    Returns:
      The module path, or ``'(top level)'`` when the stack names no module.
    """
    text = _WRAPPER_RE.sub("/", scope).replace(")", "/")
    parts = [p for p in text.split("/") if p.strip() not in _GENERIC]
    return "/".join(parts[:depth]) if parts else "(top level)"


def _nbytes(aval: Any) -> tuple[tuple[int, ...], str, int]:
    shape = tuple(int(d) for d in getattr(aval, "shape", ()))
    dtype = getattr(aval, "dtype", None)
    if dtype is None:
        return shape, str(aval), 0
    itemsize = np.dtype(dtype).itemsize
    return shape, str(np.dtype(dtype)), int(np.prod(shape, dtype=np.int64)) * itemsize


def _leaf_names(args: Sequence[Any], kwargs: dict[str, Any]) -> list[str]:
    leaves = jax.tree_util.tree_flatten_with_path((tuple(args), kwargs))[0]
    names = []
    for path, _ in leaves:
        text = jax.tree_util.keystr(path)
        # ((args...), {kwargs}): drop the outer tuple index of the pair.
        text = re.sub(r"^\[0\]", "args", text)
        text = re.sub(r"^\[1\]", "kwargs", text)
        names.append(text)
    return names


def _from_jaxpr(f: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]):
    from jax._src import core as jax_core
    from jax._src import source_info_util

    leaves, tree = jax.tree_util.tree_flatten((tuple(args), kwargs))

    def flat_f(*flat):
        a, k = jax.tree_util.tree_unflatten(tree, flat)
        return f(*a, **k)

    closed, shapes = jax.make_jaxpr(
        lambda *flat: jax.vjp(flat_f, *flat), return_shape=True
    )(*leaves)
    jaxpr = closed.jaxpr
    num_res = len(jax.tree_util.tree_leaves(shapes[1]))
    outs = jaxpr.outvars[len(jaxpr.outvars) - num_res:]
    names = _leaf_names(args, kwargs)

    # Look through reduce_precision, as JAX's own report does.
    through = {
        e.outvars[0]: e.invars[0] for e in jaxpr.eqns if e.primitive.name == "reduce_precision"
    }
    producer = {}
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            producer[v] = eqn
    invar_index = {v: i for i, v in enumerate(jaxpr.invars)}
    constvars = set(jaxpr.constvars)

    rows = []
    seen: set[Any] = set()
    for out in outs:
        if isinstance(out, jax_core.Literal):
            rows.append((out.aval, "from a literal", "", "(literal)"))
            continue
        var = through.get(out, out)
        if var in seen:  # one buffer saved once, even if referenced twice
            continue
        seen.add(var)
        if var in invar_index:
            i = invar_index[var]
            label = names[i] if i < len(names) else f"flat[{i}]"
            rows.append((var.aval, f"from the argument {label}", "", ARGUMENTS_GROUP))
        elif var in constvars:
            rows.append((var.aval, "from a constant", "", "(constant)"))
        elif var in producer:
            eqn = producer[var]
            scope = str(eqn.source_info.name_stack)
            where = source_info_util.summarize(eqn.source_info)
            what = eqn.primitive.name
            if what in ("pjit", "jit") and "name" in eqn.params:
                what = f"jitted function '{eqn.params['name']}'"
            if what == "name":
                desc = f"named '{eqn.params.get('name')}' from {where}"
            else:
                desc = f"output of {what} from {where}"
            rows.append((var.aval, desc, scope, None))
        else:
            rows.append((var.aval, "unknown", "", "(unknown)"))
    return rows


_KNOWN_MODULES = ("grid2mesh_gnn", "mesh2grid_gnn", "mesh_gnn", "encoder", "processor", "decoder")


def _guess_module(description: str) -> str:
    if description.startswith("from the argument"):
        return ARGUMENTS_GROUP
    for name in _KNOWN_MODULES:
        if name in description:
            return name
    return "(unknown)"


def _from_public(f: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]):
    try:
        from jax._src.ad_checkpoint import saved_residuals

        pairs = saved_residuals(f, *args, **kwargs)
        return [(aval, desc, "", _guess_module(desc)) for aval, desc in pairs]
    except ImportError:
        pass
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        jax.ad_checkpoint.print_saved_residuals(f, *args, **kwargs)
    rows = []
    for line in buffer.getvalue().splitlines():
        m = re.match(r"^\s*([a-z]+\d*)\[([\d,\s]*)\]\s+(.*)$", line)
        if not m:
            continue
        shape = tuple(int(d) for d in m.group(2).split(",") if d.strip())
        dtype = jax.numpy.dtype(_short_dtype(m.group(1)))
        aval = jax.ShapeDtypeStruct(shape, dtype)
        rows.append((aval, m.group(3), "", _guess_module(m.group(3))))
    return rows


def _short_dtype(short: str) -> str:
    table = {"f": "float", "bf": "bfloat", "i": "int", "u": "uint", "c": "complex"}
    m = re.match(r"^([a-z]+)(\d+)$", short)
    if short == "bool" or not m:
        return "bool"
    return table.get(m.group(1), m.group(1)) + m.group(2)


def saved_residuals_df(
    f: Callable[..., Any], *args: Any, depth: int = 1, **kwargs: Any
) -> pd.DataFrame:
    """Residuals that the forward pass of `f` saves for its backward pass.

    Args:
      f: the function to differentiate (e.g. a loss of ``params, batch``); with remat
        policies applied (``jax.checkpoint``) only the saved values appear.
      *args: arrays or `jax.ShapeDtypeStruct` pytrees.
      depth: module path components kept in the ``module`` column.
      **kwargs: keyword arguments of `f` (differentiated too).

    Returns:
      A DataFrame with columns ``module, shape, dtype, bytes, description, scope``
      (``scope`` is the raw name stack, empty in the fallbacks), one row per residual.
    """
    try:
        raw = _from_jaxpr(f, args, kwargs)
    except Exception:  # noqa: BLE001 - JAX internals moved: use the public report
        raw = _from_public(f, args, kwargs)
    rows = []
    for aval, desc, scope, module in raw:
        shape, dtype, nbytes = _nbytes(aval)
        if module is None:
            module = module_of_scope(scope, depth)
        rows.append((module, shape, dtype, nbytes, desc, scope))
    return pd.DataFrame(rows, columns=list(COLUMNS)).astype({"bytes": "int64"})


def summarize_residuals(df: pd.DataFrame, *, include_arguments: bool = True) -> pd.DataFrame:
    """Residual bytes per module, largest first.

    Args:
      df: output of `saved_residuals_df`.
      include_arguments: keep the ``'inputs/params'`` group (free: alive anyway).

    Returns:
      A DataFrame with columns ``module, count, bytes, fraction``.
    """
    if not include_arguments:
        df = df[df["module"] != ARGUMENTS_GROUP]
    out = (
        df.groupby("module", sort=False)["bytes"]
        .agg(count="size", bytes="sum")
        .reset_index()
        .sort_values("bytes", ascending=False, kind="stable")
        .reset_index(drop=True)
    )
    total = float(out["bytes"].sum())
    out["fraction"] = out["bytes"] / total if total else 0.0
    return out


def indexed_by(shape: Sequence[int], counts: dict[str, int]) -> str:
    """The node or edge set a residual of `shape` runs over, matched by axis length.

    The first axis whose length is one of the counts names the set (sets of equal size
    are named together, ``'a or b'``); a shape with no such axis is `NOT_A_GRAPH_SET`.

    Args:
      shape: a residual's shape, e.g. ``(S, E, B, L)``.
      counts: set name -> size, e.g. `gclab.geometry.Graphs.counts()`.
    """
    names: dict[int, list[str]] = {}
    for name, n in counts.items():
        names.setdefault(int(n), []).append(name)
    for d in shape:
        if int(d) in names:
            return " or ".join(names[int(d)])
    return NOT_A_GRAPH_SET


def bytes_by_graph_set(df: pd.DataFrame, counts: dict[str, int]) -> pd.Series:
    """Residual bytes per node or edge set (`indexed_by`), largest first.

    Args:
      df: `saved_residuals_df` output.
      counts: set name -> size.

    Returns:
      A Series of bytes indexed by set name (and `NOT_A_GRAPH_SET`).
    """
    sets = df["shape"].map(lambda shape: indexed_by(shape, counts))
    return df.groupby(sets)["bytes"].sum().sort_values(ascending=False)
