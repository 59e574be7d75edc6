"""Every experiment's settings in one place, one small module per experiment (each value commented):
the reproductions (flip_flop, selective_copy, counting, indirect_indexing), the demo (demo) and its diagnostic
(demo_diagnostic, derived from flip_flop); the real-data reproductions (jsb, maestro, genome, text, text_cope, code,
text_extrapolation, ablations) share corpus_lm.py; the masked-language-model pre-training (mlm). `poskit reproduce`,
`poskit list`, `poskit demo` and the per-task
defaults of `poskit train`/`compare` all read this registry."""
from .ablations import ABLATIONS
from .code import CODE
from .counting import COUNTING
from .demo import DEMO, LM_MODEL, LM_TRAIN
from .demo_diagnostic import DIAGNOSTIC
from .flip_flop import FLIP_FLOP
from .genome import GENOME
from .indirect_indexing import INDIRECT_INDEXING
from .indirect_indexing_study import INDIRECT_INDEXING_STUDY
from .jsb import JSB
from .maestro import MAESTRO
from .mlm import MLM
from .performer import PERFORMER
from .records import DemoSettings, Diagnostic, Reproduction, StopRule, Study, StudyRun, Variant
from .selective_copy import SELECTIVE_COPY
from .text import TEXT
from .text_cope import TEXT_COPE
from .text_extrapolation import TEXT_EXTRAPOLATION
from .translation import TRANSLATION, TranslationReproduction

# `poskit reproduce NAME`, in the order `poskit list` shows them
REPRODUCTIONS: dict[str, Reproduction] = {
    "indirect-indexing": INDIRECT_INDEXING,
    "flip-flop": FLIP_FLOP,
    "selective-copy": SELECTIVE_COPY,
    "counting": COUNTING,
    # real data (issue 13): the PoPE paper's Tables 2-4, 8 and Fig. 2, the CoPE paper's Table 5
    "jsb": JSB,
    "maestro": MAESTRO,
    "genome": GENOME,
    "text": TEXT,
    "text-cope": TEXT_COPE,
    "code": CODE,
    "text-extrapolation": TEXT_EXTRAPOLATION,
    "ablations": ABLATIONS,
    # encoder-only pre-training (issue 15): RoFormer sec. 4.2
    "mlm": MLM,
    # linear attention with and without RoPE (issue 15): RoFormer sec. 4.4
    "performer": PERFORMER,
}

# `poskit study NAME`: background studies (queues of long runs with early stops)
STUDIES: dict[str, Study] = {
    "indirect-indexing": INDIRECT_INDEXING_STUDY,
}

# encoder-decoder reproductions (their own record: experiments/translation.py runs them); the same
# `poskit reproduce NAME` entry point
SEQ2SEQ_REPRODUCTIONS: dict[str, TranslationReproduction] = {"translation": TRANSLATION}

__all__ = ["DEMO", "DIAGNOSTIC", "LM_MODEL", "LM_TRAIN", "REPRODUCTIONS", "SEQ2SEQ_REPRODUCTIONS", "STUDIES", "TRANSLATION",
           "DemoSettings", "Diagnostic", "Reproduction", "StopRule", "Study", "StudyRun", "TranslationReproduction",
           "Variant"]
