"""`python -m fdl` runs the same entry point as the `fdl` console script."""

import sys

from fdl.cli.main import main

sys.exit(main())
