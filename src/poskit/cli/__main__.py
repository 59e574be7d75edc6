"""`python -m poskit.cli ...`: the `poskit` command."""
import sys

from . import main

sys.exit(main())
