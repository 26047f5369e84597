"""Real GraphCast files: published checkpoints (and, later, weather data in the official layout).

| module | what it is for |
|---|---|
| `checkpoint` | published `.npz` checkpoints <-> `ModelConfig`, `TaskConfig`, parameters |
"""

from gclab.weather.checkpoint import (
    Checkpoint,
    CheckpointError,
    OfficialTask,
    from_flat,
    read_checkpoint,
    read_flat,
    to_flat,
    write_checkpoint,
)

__all__ = [
    "Checkpoint", "CheckpointError", "OfficialTask", "from_flat", "read_checkpoint",
    "read_flat", "to_flat", "write_checkpoint",
]
