"""`poskit.train`: the trainer's public names, kept importable from here; the code lives in `poskit.training`
(config, files, rng, step, loop, run)."""
from poskit.training import *  # noqa: F401,F403
from poskit.training import __all__  # noqa: F401
