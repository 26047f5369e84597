"""`python -m gclab`: the command line (see `gclab.cli`)."""

import sys

from gclab.cli import main

sys.exit(main())
