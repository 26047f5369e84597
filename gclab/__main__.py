"""`python -m gclab`: the command line (see `gclab.cli`).

The command line measures peaks in fresh processes on the same card (`gclab sweep
--measure measured`, say), and JAX's pool never gives memory back: by default JAX takes
75% of a GPU for it as soon as its backend starts. So, unless the environment says
otherwise, this process takes from the card only what it allocates
(``XLA_PYTHON_CLIENT_PREALLOCATE=false``). JAX reads the variable when its GPU backend
starts, not when it is imported, but it is set here before anything imports JAX
(``gclab/__init__.py`` imports nothing).
"""

import os
import sys

PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"


def main(argv=None) -> int:
    """Runs `gclab.cli.main` with JAX's preallocation off unless the environment sets it."""
    os.environ.setdefault(PREALLOCATE_ENV, "false")
    from gclab.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
