"""Official GraphCast parameter names <-> gclab's parameter tree, losslessly.

The official code names every block of every step separately:
`mesh_gnn/~_networks_builder/processor_edges_{i}_mesh_mlp/~/linear_0` (`w`, `b`). gclab
keeps the same names without `~_networks_builder/`, and stacks the processor's S steps on a
leading axis: `mesh_gnn/processor_edges_mesh_mlp/~/linear_0` with `w` [S, 3L, L]. Both
trees are flat Haiku dicts `{module: {name: array}}`; `to_official` inverts `from_official`
exactly (same arrays, same dtypes).

Shapes: S processor steps; a stacked leaf `[S, ...]` is S official leaves `[...]`.
"""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from gclab.config import WrongType, a_kind, require_kind

BUILDER = "~_networks_builder/"
_STEP = re.compile(r"^mesh_gnn/processor_(edges|nodes)_(\d+)_(mesh|mesh_nodes)_(mlp|layer_norm)"
                   r"(/~/linear_\d+)?$")
_GNNS = ("grid2mesh_gnn/", "mesh_gnn/", "mesh2grid_gnn/")


def from_official(official: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
    """Converts an official parameter dict to gclab's tree (processor steps stacked).

    Args:
      official: `{module_path: {param_name: array}}` with official module paths.

    Returns:
      gclab's `{module_path: {param_name: array}}`.

    Raises:
      TypeError: `official` or one of its modules is not a mapping (`WrongType`, a
        ValueError too).
      ValueError: an unknown module path, or processor steps that are missing or whose
        shapes differ.
    """
    require_kind("official", official, Mapping, "a {module: {name: array}} mapping")
    out: dict = {}
    steps: dict = {}
    for module, leaves in official.items():
        if not isinstance(module, str) or not module.startswith(_GNNS) or BUILDER not in module:
            raise ValueError(f"not an official GraphCast parameter path: {module!r}")
        if not isinstance(leaves, Mapping):
            raise WrongType(f"official is invalid: {module} is {a_kind(leaves)}, not a "
                            f"{{name: array}} mapping")
        name = module.replace(BUILDER, "", 1)
        m = _STEP.match(name)
        if m:
            kind, step, nodes, part, layer = m.groups()
            key = f"mesh_gnn/processor_{kind}_{nodes}_{part}{layer or ''}"
            steps.setdefault(key, {})[int(step)] = leaves
        else:
            out[name] = {k: np.asarray(v) for k, v in leaves.items()}
    counts = {len(v) for v in steps.values()}
    if len(counts) > 1:
        raise ValueError(f"processor blocks have different step counts: {sorted(counts)}")
    for key, by_step in steps.items():
        n = len(by_step)
        if sorted(by_step) != list(range(n)):
            raise ValueError(f"{key}: processor steps must be 0..{n - 1}, got {sorted(by_step)}")
        names = set(by_step[0])
        for i in range(n):
            if set(by_step[i]) != names:
                raise ValueError(f"{key}: step {i} has parameters {sorted(by_step[i])}, "
                                 f"step 0 has {sorted(names)}")
        leaves = {}
        for pname in names:
            arrays = [np.asarray(by_step[i][pname]) for i in range(n)]
            if len({a.shape for a in arrays}) != 1:
                raise ValueError(f"{key}::{pname}: shapes differ between steps")
            leaves[pname] = np.stack(arrays)
        out[key] = leaves
    return out


def to_official(params: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
    """Inverse of `from_official`: unstacks the processor steps, restores official paths.

    Args:
      params: gclab's `{module_path: {param_name: array}}`.

    Returns:
      The official `{module_path: {param_name: array}}`.

    Raises:
      TypeError: `params` or one of its modules is not a mapping.
      ValueError: a module path that is not gclab's (another model's, or already an
        official one), or a processor module without parameters or whose parameters lack
        a common leading step axis.
    """
    require_kind("params", params, Mapping, "a {module: {name: array}} mapping")
    out: dict = {}
    for module, leaves in params.items():
        if not isinstance(module, str) or not module.startswith(_GNNS) or BUILDER in module:
            raise ValueError(f"params is invalid: {module!r} is not a module path of gclab's "
                             f"GraphCast tree (grid2mesh_gnn/..., mesh_gnn/... or "
                             f"mesh2grid_gnn/..., without {BUILDER!r})")
        if not isinstance(leaves, Mapping):
            raise WrongType(f"params is invalid: {module} is {a_kind(leaves)}, not a "
                            f"{{name: array}} mapping")
        m = re.match(r"^mesh_gnn/processor_(edges|nodes)_(mesh|mesh_nodes)_(mlp|layer_norm)"
                     r"(/~/linear_\d+)?$", module)
        gnn, rest = module.split("/", 1)
        if m:
            kind, nodes, part, layer = m.groups()
            steps = {np.shape(v)[0] if np.ndim(v) else None for v in leaves.values()}
            if len(steps) != 1 or None in steps:
                raise ValueError(f"params is invalid: {module} is stacked over the processor "
                                 f"steps: its parameters need one leading step axis, got "
                                 f"shapes {[np.shape(v) for v in leaves.values()]}")
            n = steps.pop()
            for i in range(n):
                path = f"{gnn}/{BUILDER}processor_{kind}_{i}_{nodes}_{part}{layer or ''}"
                out[path] = {k: np.asarray(v)[i] for k, v in leaves.items()}
        else:
            out[f"{gnn}/{BUILDER}{rest}"] = {k: np.asarray(v) for k, v in leaves.items()}
    return out


def flat_to_nested(flat: Mapping[str, np.ndarray], prefix: str = "") -> dict:
    """`{'module::name': array}` (optionally with a key prefix such as 'param::') -> nested."""
    nested: dict = {}
    for key, value in flat.items():
        if not key.startswith(prefix):
            continue
        module, sep, name = key[len(prefix):].rpartition("::")
        if not sep:
            raise ValueError(f"parameter key {key!r} is not of the form "
                             f"'{prefix}<module>::<name>'")
        nested.setdefault(module, {})[name] = np.asarray(value)
    return nested
