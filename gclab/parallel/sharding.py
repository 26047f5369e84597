"""The device mesh, and where node and edge arrays live on it.

Everything here is JAX's own SPMD machinery: a `jax.sharding.Mesh` with the axes of
`gclab.parallel.config.MESH_AXES`, `NamedSharding`s for the arguments of a jitted step, and
`jax.lax.with_sharding_constraint` inside the network. The compiler (GSPMD / Shardy)
partitions the program from these annotations and inserts the collectives itself; nothing
here communicates.

The network marks its arrays with two helpers and never learns how they are laid out:

* `split_rows`: grid nodes and edges (`[Ng, B, L]`, `[E, B, L]`, or one edge block
  `[bs, B, L]`): rows in contiguous blocks over the `spatial` axis, batch over `data`.
  Grid2mesh edges are sorted by their grid sender and mesh2grid edges grouped by their grid
  receiver, so a device's edges touch mostly its own grid nodes.
* `full_rows`: mesh nodes (`[Nm, B, L]`): every device holds all rows, batch over `data`.
  Sums of messages into mesh nodes become an all-reduce over `spatial`.

Both are the identity unless a mesh with these axes is active (`jax.set_mesh`), so the
single-device program is unchanged. Rows that do not divide evenly are padded by the
compiler inside the program (never visible to the model, so results do not change);
jit arguments must divide evenly, so `rows_sharding` splits an argument's rows only when
they do and keeps them whole otherwise.

Shapes: N rows (nodes or edges), B batch, L latent.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional, Sequence, Union

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from gclab.parallel.config import DATA_AXIS, MESH_AXES, SPATIAL_AXIS, ParallelConfig
from gclab.parallel.pipeline import use_pipeline

# How mesh-node arrays are laid out while a layout is in use (`use_layout`).
_MESH_NODES = contextvars.ContextVar("gclab_mesh_nodes", default="replicated")


def make_mesh(parallel: ParallelConfig, devices: Optional[Sequence] = None) -> Mesh:
    """The device mesh of a layout, on the first `parallel.devices` devices.

    Args:
      parallel: the layout.
      devices: devices to use (default: `jax.devices()`, every process's devices).

    Raises:
      ValueError: fewer devices than the layout needs.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = parallel.devices
    if len(devices) < n:
        raise ValueError(f"layout {parallel.spec} needs {n} devices, JAX has {len(devices)}")
    return jax.make_mesh(parallel.axis_sizes, MESH_AXES,
                         axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices[:n])


@contextlib.contextmanager
def use_layout(mesh: Mesh, layout: Union[str, ParallelConfig] = "split") -> Iterator[Mesh]:
    """Sets `mesh` (`jax.set_mesh`), the mesh-node rule and the pipeline while a step is traced.

    Everything the network marks (`split_rows`, `full_rows`, `mesh_rows`) and its pipeline
    (`gclab.parallel.pipeline.active_pipeline`) read these, so a step must be traced inside
    this context; running a compiled step needs only the mesh.

    One of this process's devices of the mesh is JAX's default device meanwhile
    (`jax.default_device`): what the network decides by the platform it compiles for
    (`gclab.memory.remat.scan_steps` keeps bfloat16 residuals as bits for XLA:CPU alone)
    follows the mesh, also where it is simulated CPU devices beside a GPU.

    Args:
      mesh: from `make_mesh`.
      layout: the layout (`ParallelConfig`: its mesh-node rule and pipeline stages), or
        only its `ParallelConfig.mesh_nodes` (no pipeline).
    """
    mesh_nodes = layout if isinstance(layout, str) else layout.mesh_nodes
    token = _MESH_NODES.set(mesh_nodes)
    try:
        with (jax.set_mesh(mesh), jax.default_device(mesh.local_devices[0]),
              use_pipeline(None if isinstance(layout, str) else layout)):
            yield mesh
    finally:
        _MESH_NODES.reset(token)


def active_axes() -> tuple[str, ...]:
    """Names of the axes of the mesh set by `jax.set_mesh` (empty when none is)."""
    mesh = jax.sharding.get_abstract_mesh()
    return () if mesh.empty else tuple(mesh.axis_names)


def spatial_shards() -> int:
    """The size of the active mesh's `spatial` axis (1 when no gclab mesh is active).

    Edge blocks use it to give each device blocks of its own rows
    (`gclab.memory.blocks.split_blocks(..., shards=...)`).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or SPATIAL_AXIS not in mesh.axis_names:
        return 1
    return dict(zip(mesh.axis_names, mesh.axis_sizes))[SPATIAL_AXIS]


def split_shards(x: jax.Array) -> jax.Array:
    """Marks `[D, N, B, L]` partial sums: shard d on the d-th device of `spatial`."""
    return split_rows(x, axis=0, batch_axis=2)


def _spec(ndim: int, rows_axis: Optional[int], rows: Optional[str],
          batch_axis: Optional[int]) -> PartitionSpec:
    spec: list = [None] * ndim
    if rows_axis is not None:
        spec[rows_axis] = rows
    if batch_axis is not None and batch_axis < ndim:
        spec[batch_axis] = DATA_AXIS
    return PartitionSpec(*spec)


def split_rows(x: jax.Array, axis: int = 0, batch_axis: Optional[int] = 1) -> jax.Array:
    """Marks `x`'s rows (axis `axis`) as split over `spatial`, its batch over `data`.

    Args:
      x: grid-node or edge array, e.g. `[N, B, L]` (an index or feature array has no
        batch axis: pass `batch_axis=None`).
      axis: the rows axis.
      batch_axis: the batch axis, or None.

    Returns:
      `x`, constrained when a mesh with the gclab axes is active, else unchanged.
    """
    if SPATIAL_AXIS not in active_axes():
        return x
    return jax.lax.with_sharding_constraint(x, _spec(x.ndim, axis, SPATIAL_AXIS, batch_axis))


def full_rows(x: jax.Array, batch_axis: Optional[int] = 1) -> jax.Array:
    """Marks `x`'s rows as held whole on every device, its batch split over `data`.

    For mesh-node arrays `[Nm, B, L]`; the identity when no gclab mesh is active.
    """
    if SPATIAL_AXIS not in active_axes():
        return x
    return jax.lax.with_sharding_constraint(x, _spec(x.ndim, None, None, batch_axis))


def mesh_rows(x: jax.Array, batch_axis: Optional[int] = 1) -> jax.Array:
    """Marks a mesh-node array `[Nm, B, L]` by the layout's rule (`ParallelConfig.mesh_nodes`).

    `split`: rows split over `spatial` like grid nodes; sums of messages into them become a
    reduce-scatter and the edge gathers read them through an all-gather, so each device
    keeps 1/D of every mesh-node latent the backward pass saves. `replicated`: whole on
    every device (`full_rows`); sums become an all-reduce, gathers need no communication.
    """
    if _MESH_NODES.get() == "split":
        return split_rows(x, batch_axis=batch_axis)
    return full_rows(x, batch_axis=batch_axis)


def rows_sharding(mesh: Mesh, shape: Sequence[int], rows_axis: Optional[int] = None,
                  batch_axis: Optional[int] = None) -> NamedSharding:
    """The sharding of a jit argument: rows over `spatial`, batch over `data`, where even.

    Args:
      mesh: from `make_mesh`.
      shape: the argument's shape.
      rows_axis: its node or edge axis (None: rows whole on every device).
      batch_axis: its batch axis (None: no batch axis).

    Returns:
      A `NamedSharding`. An axis that its mesh axis does not divide is left whole
      (`split_rows` inside the network splits it).
    """
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
    rows = None
    if rows_axis is not None and shape[rows_axis] % sizes[SPATIAL_AXIS] == 0:
        rows = SPATIAL_AXIS
    if batch_axis is not None and shape[batch_axis] % sizes[DATA_AXIS]:
        batch_axis = None
    return NamedSharding(mesh, _spec(len(shape), rows_axis, rows, batch_axis))


def replicated(mesh: Mesh) -> NamedSharding:
    """Whole on every device (parameters, optimizer state, scalars)."""
    return NamedSharding(mesh, PartitionSpec())


def global_array(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A global `jax.Array` from a host array that every process holds whole.

    Each process places only the shards of its own devices, so this is how host data
    enters a multi-process run (and it works the same in one process).
    """
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
