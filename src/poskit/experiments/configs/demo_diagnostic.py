"""The demo's short diagnostic: the flip-flop reproduction (CoPE paper Sec. 5.1) at length 64, shortened to
fit in about a minute on 2 cores; the encodings still learn at visibly different speeds and generalise
differently to the sparse out-of-distribution split."""
from .flip_flop import FLIP_FLOP
from .records import Diagnostic, derive

DIAGNOSTIC = Diagnostic(
    config=derive(FLIP_FLOP.config, {
        "task_options.eval_size": 500,  # half the reproduction's evaluation examples: evaluation takes time
        "curve_splits": [],  # the validation curve only (the reproduction's other splits would triple evaluation)
        "max_steps": 600,  # instead of 1000 (the demo's --diagnostic-steps replaces it)
        "log_every": 25,  # twice as many loss lines as the reproduction: the curves of a shorter run
        "checkpoint_every": 600,  # one checkpoint, at the end: the demo always starts afresh
    }),
    what="flip-flop (length 64; OOD sparse = 98 % ignore instructions)",
)
