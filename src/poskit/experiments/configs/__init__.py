"""Every experiment's settings in one place, one small module per experiment (each value commented):
the reproductions (flip_flop, selective_copy, counting, indirect_indexing), the demo (demo) and its diagnostic
(demo_diagnostic, derived from flip_flop). `poskit reproduce`, `poskit list`, `poskit demo` and the per-task
defaults of `poskit train`/`compare` all read this registry."""
from .counting import COUNTING
from .demo import DEMO, LM_MODEL, LM_TRAIN
from .demo_diagnostic import DIAGNOSTIC
from .flip_flop import FLIP_FLOP
from .indirect_indexing import INDIRECT_INDEXING
from .records import DemoSettings, Diagnostic, Reproduction, Variant
from .selective_copy import SELECTIVE_COPY
from .translation import TRANSLATION, TranslationReproduction

# `poskit reproduce NAME`, in the order `poskit list` shows them
REPRODUCTIONS: dict[str, Reproduction] = {
    "indirect-indexing": INDIRECT_INDEXING,
    "flip-flop": FLIP_FLOP,
    "selective-copy": SELECTIVE_COPY,
    "counting": COUNTING,
}

# encoder-decoder reproductions (their own record: experiments/translation.py runs them); the same
# `poskit reproduce NAME` entry point
SEQ2SEQ_REPRODUCTIONS: dict[str, TranslationReproduction] = {"translation": TRANSLATION}

__all__ = ["SEQ2SEQ_REPRODUCTIONS", "TRANSLATION", "TranslationReproduction", "DEMO", "DIAGNOSTIC", "LM_MODEL", "LM_TRAIN", "REPRODUCTIONS", "DemoSettings", "Diagnostic",
           "Reproduction", "Variant"]
