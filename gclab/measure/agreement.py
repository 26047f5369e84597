"""Does a layout keep the function? Loss and gradients on a layout against one device.

Splitting a step over devices (`gclab.parallel`) must not change what it computes: the
loss and every gradient must equal one device's up to the order of float32 sums.
`LayoutCheck` builds one model, one seeded batch of synthetic weather and one set of
parameters, computes the loss and gradients on one device once, and then on any layout
(`against`), and reports the largest differences. The test suite checks every layout with
it (`tests/measure/test_agreement.py`, `tests/parallel/`); chapter 8 shows it live.

Compiles are those of a plan that is only read (`plan_only_options`: on XLA:CPU, LLVM's
optimisation off and the older fusion emitter), in about half the time. The one-device
reference and every layout are compiled alike, so a check compares like with like. Its
values are not bit for bit those of a step compiled with XLA's defaults: the machine code
differs (multiply-adds fused or not), and in bfloat16 a last-bit change upstream flips
later roundings. Measured on XLA:CPU (jax 0.10.2), the loss and gradients of cpu-4x32's
network against the same program compiled with XLA's defaults: float32 gradients within
4e-7 of the largest element, bfloat16 ones up to 1.2e-2 (the loss 1e-5 relative), while
the bfloat16 forward output and its error against float32 were the same to four digits.
So compare a check's values with another check's, not with a step compiled to run.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import jax
import numpy as np

from gclab import training
from gclab.config import ModelConfig, TaskConfig, WrongType, a_kind
from gclab.geometry.graphs import graphs_for
from gclab.measure.compiled import plan_only_options
from gclab.memory.config import MemoryConfig
from gclab.model.graphcast import graph_inputs, make_network
from gclab.parallel.config import ParallelConfig
from gclab.parallel.sharding import make_mesh, use_layout

#: How far a memory technique or a layout may move the loss and each gradient array from
#: one device's float32 baseline in float32: the order of float32 sums (relative to the
#: largest value of the baseline's array; the loss relative to the loss).
FLOAT32_TOLERANCE = 1e-5


@dataclasses.dataclass(frozen=True)
class Bfloat16Tolerances:
    """How far a bfloat16 step may be from float32 (every bound relative, against one
    device's float32 baseline unless said).

    Attributes:
      output: L2 error of the network's outputs.
      loss: error of the loss.
      grad: L2 error of the gradient: of each parameter's on one device (those above 1e-3
        of the whole gradient's norm: a tiny gradient's relative error is rounding noise),
        and of the whole gradient on layouts and pipelines.
      cosine: the least cosine of the whole gradient with float32's.
      layout_grad_norm: L2 error of the whole gradient of a layout against the same
        bfloat16 step on one device (a layout changes the order of sums, so roundings
        differ a little).
    """
    output: float = 3e-2
    loss: float = 1e-2
    grad: float = 1e-1
    cosine: float = 0.995
    layout_grad_norm: float = 2e-2


#: The bfloat16 bounds every recipe, layout and pipeline is tested against.
BFLOAT16_TOLERANCES = Bfloat16Tolerances()


@dataclasses.dataclass(frozen=True)
class Agreement:
    """One layout's loss and gradients against one device's.

    Attributes:
      layout: the layout (`ParallelConfig.spec`).
      loss, reference_loss: the layout's loss and one device's.
      loss_rel: |loss - reference| / |reference|.
      grad_rel: the largest, over the parameter arrays, of max |g - g_ref| / max |g_ref|.
      grad_norm_rel: |g - g_ref| / |g_ref| over all gradients as one vector.
    """
    layout: str
    loss: float
    reference_loss: float
    loss_rel: float
    grad_rel: float
    grad_norm_rel: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _flat(leaves) -> np.ndarray:
    return np.concatenate([np.ravel(a) for a in leaves])


def _paired(caller: str, leaves: Sequence, reference: Sequence) -> tuple[list, list]:
    """The leaves of both gradients as float64 arrays, if they pair one to one.

    Leaves of different shapes would be broadcast against each other (a (5,) leaf against
    a (1,) one can agree exactly), and flattened ones compared element by element across
    leaf boundaries, so each pair must have one shape.

    Raises:
      ValueError: in one line that starts with `caller`: no leaves, different numbers of
        leaves, or a pair of different shapes (naming its index).
    """
    for name, value in (("leaves", leaves), ("reference", reference)):
        if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
            raise WrongType(f"{caller} {name} is invalid: a sequence of gradient arrays, not "
                            f"{a_kind(value)}")
    if len(leaves) != len(reference):
        raise ValueError(f"{caller} leaves is invalid: as many gradient arrays as reference, "
                         f"and it has {len(leaves)} against {len(reference)}")
    if not len(leaves):
        raise ValueError(f"{caller} leaves is invalid: at least one gradient array, not none")
    a = [np.asarray(x, np.float64) for x in leaves]
    b = [np.asarray(x, np.float64) for x in reference]
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape:
            raise ValueError(f"{caller} leaves[{i}] is invalid: the shape of reference[{i}], "
                             f"{y.shape}, not {x.shape}")
    return a, b


def compare_leaves(leaves: Sequence, reference: Sequence) -> tuple[float, float]:
    """`(grad_rel, grad_norm_rel)` of gradient leaves against reference leaves.

    Raises:
      ValueError: no leaves, different numbers of leaves, or a pair of leaves of different
        shapes.
    """
    a, b = _paired("compare_leaves", leaves, reference)
    worst = max(float(np.max(np.abs(x - y), initial=0.0)
                      / (np.max(np.abs(y), initial=0.0) + 1e-30))
                for x, y in zip(a, b))
    fa, fb = _flat(a), _flat(b)
    return worst, float(np.linalg.norm(fa - fb) / np.linalg.norm(fb))


def gradient_cosine(leaves: Sequence, reference: Sequence) -> float:
    """The cosine of the angle between two gradients, their leaves as one vector each (how
    a bfloat16 gradient's direction compares with float32's).

    Raises:
      ValueError: no leaves, different numbers of leaves, or a pair of leaves of different
        shapes.
    """
    a, b = _paired("gradient_cosine", leaves, reference)
    fa, fb = _flat(a), _flat(b)
    return float(fa @ fb / (np.linalg.norm(fa) * np.linalg.norm(fb)))


class LayoutCheck:
    """Loss and gradients of one model and batch on layouts, against one device.

    Args:
      model, task: the model (small ones: every check runs the step for real).
      memory: memory techniques (default none); the same on one device and on layouts.
      batch: the global batch (a layout's data axis and micro-batches must divide it).
      seed: seed of the parameters and of the synthetic weather.
      devices: the devices layouts run on (default `jax.devices()`); the reference runs
        on the first of them.
    """

    def __init__(self, model: ModelConfig, task: TaskConfig,
                 memory: Optional[MemoryConfig] = None, batch: int = 4, seed: int = 0,
                 devices: Optional[Sequence] = None):
        self.model, self.task = model, task
        self.memory = memory or MemoryConfig()
        self.devices = list(devices if devices is not None else jax.devices())
        graphs = graphs_for(model)
        self.graph = graph_inputs(graphs)
        self.example = training.SyntheticWeather(task, model.resolution,
                                                 seed=seed).make_batch(batch, 1)
        self.weights = training.loss_weights(task, graphs.grid_lat, graphs.n_lon)
        net = make_network(model, task.data_channels, task.output_channels, self.memory)
        with jax.default_device(self.devices[0]):
            self.params = net.init(jax.random.PRNGKey(seed), self.graph, self.example.inputs)
        self._fn = functools.partial(training.loss_and_grad, memory=self.memory, net=net,
                                     task=task, rollout=1, weights=self.weights)
        self._reference: Optional[tuple] = None

    def _run(self, args) -> tuple[float, list]:
        # Traced and compiled for the devices given (simulated CPU devices beside a GPU get
        # XLA:CPU's options and the network's CPU choices), not for the default backend.
        with jax.default_device(self.devices[0]):
            lowered = jax.jit(self._fn).lower(*args)
        compiled = lowered.compile(plan_only_options(platform=self.devices[0].platform))
        loss, grads = jax.device_get(compiled(*args))
        return float(loss), jax.tree_util.tree_leaves(grads)

    def reference(self) -> tuple[float, list]:
        """One device's loss and gradient leaves (computed once)."""
        if self._reference is None:
            args = jax.device_put((self.params, self.graph, self.example), self.devices[0])
            self._reference = self._run(args)
        return self._reference

    def against(self, layout: ParallelConfig) -> Agreement:
        """The loss and gradients on `layout` against one device's.

        Raises:
          ValueError: the layout needs more devices than given, or does not divide the
            batch.
        """
        ref_loss, ref_leaves = self.reference()
        mesh = make_mesh(layout, self.devices)
        training.check_batch(mesh, self.example.inputs.shape[1], self.memory, layout)
        with use_layout(mesh, layout):
            loss, leaves = self._run(training.place_step_args(mesh, self.params, self.graph,
                                                              self.example))
        grad_rel, norm_rel = compare_leaves(leaves, ref_leaves)
        return Agreement(layout.spec, loss, ref_loss, abs(loss - ref_loss) / abs(ref_loss),
                         grad_rel, norm_rel)
