"""Training: examples, synthetic weather and its normalisation, the loss, the train step.

| module | what it is for |
|---|---|
| `examples` | the normalised `Example` and its channel layout |
| `data` | seeded synthetic weather in physical units, and its `Normalization` |
| `losses` | the official loss weights and reduction |
| `step` | AdamW, rollouts, micro-batches: `make_train_step` |
| `mse` | the network's plain mean-square loss and its shapes, for memory and precision |
| `layout` | the step over a device mesh: shardings, placement, `make_sharded_train_step` |
| `loop` | a training run on synthetic weather, on one device or a layout, resumable (`train`) |
"""

from gclab.training.data import Normalization, RawExample, SyntheticWeather
from gclab.training.examples import (
    Example,
    example_shapes,
    input_variable_channels,
    residual_channels,
)
from gclab.training.layout import (
    abstract_step_args,
    check_batch,
    make_sharded_train_step,
    place_example,
    place_step_args,
    step_shardings,
)
from gclab.training.loop import (
    CheckpointDirError,
    ModelMismatch,
    RestoreError,
    SaveError,
    ScheduleMismatch,
    StepsReached,
    Stopped,
    Terminated,
    TrainingDiverged,
    TrainResult,
    restore_state,
    save_state,
    train,
)
from gclab.training.losses import (
    channel_weights,
    latitude_weights,
    level_weights,
    loss_weights,
    node_weights,
    weighted_mse,
)
from gclab.training.mse import network_mse, network_mse_shapes, relative_error
from gclab.training.step import (
    TrainConfig,
    TrainState,
    init_state_from_params,
    loss_and_grad,
    make_optimizer,
    make_train_step,
    next_inputs,
    rollout_loss,
    train_step_fn,
)

__all__ = [
    "abstract_step_args", "check_batch", "make_sharded_train_step", "place_example",
    "place_step_args", "step_shardings", "RestoreError", "ScheduleMismatch", "TrainResult",
    "CheckpointDirError", "ModelMismatch", "SaveError", "StepsReached", "Stopped", "Terminated",
    "TrainingDiverged", "restore_state", "save_state", "train",
    "Example", "Normalization", "RawExample", "SyntheticWeather", "TrainConfig", "TrainState",
    "channel_weights", "example_shapes", "init_state_from_params", "input_variable_channels",
    "latitude_weights", "level_weights", "loss_and_grad", "loss_weights", "make_optimizer",
    "make_train_step", "network_mse", "network_mse_shapes", "next_inputs", "node_weights",
    "relative_error", "residual_channels", "rollout_loss",
    "train_step_fn", "weighted_mse",
]
