"""Former home of the HLO reading of collectives, kept so that code importing it still runs.

The reading moved to `gclab.parallel.collectives` (the training layer refuses layouts by it,
and sits below `gclab.measure`); `gclab.measure.collective_bytes` is the same function. This
module names the public functions of the new one and warns once where it is imported.
"""

import warnings

from gclab.parallel.collectives import (  # noqa: F401
    COLLECTIVES,
    branch_collectives,
    collective_bytes,
)

warnings.warn("gclab.measure.collectives moved to gclab.parallel.collectives "
              "(gclab.measure.collective_bytes is the same function)", DeprecationWarning,
              stacklevel=2)
