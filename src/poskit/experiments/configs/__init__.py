"""Every experiment's settings, one small commented module per experiment: the reproductions (flip_flop,
selective_copy, counting, indirect_indexing; the real-data ones jsb, maestro, genome, text, text_cope, code,
text_extrapolation and ablations, which share corpus_lm.py; mlm, performer; translation), the study
(indirect_indexing_study), the demos (demo with its diagnostic demo_diagnostic, derived from flip_flop; digits).
experiments/registry.py names them and says which runner runs each."""
from .demo import LM_MODEL, LM_TRAIN
from .records import DemoSettings, Diagnostic, Reproduction, StopRule, Study, StudyRun, Variant, derive
from .translation import TranslationReproduction

__all__ = ["LM_MODEL", "LM_TRAIN", "DemoSettings", "Diagnostic", "Reproduction", "StopRule", "Study", "StudyRun",
           "TranslationReproduction", "Variant", "derive"]
