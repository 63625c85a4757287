"""`python -m triarch.cli`: the same entry point as the `triarch` script (the review workflow and bench run it so)."""

import sys

from triarch.cli import main

sys.exit(main())
