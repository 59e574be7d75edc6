"""The names of the files and directories the experiment commands write, in one place (the drivers write
them, the CLI names them in its messages)."""

# `poskit compare` and `poskit reproduce` (the translation reproduction too), in their output directory
COMPARE_JSON, COMPARE_MD, COMPARE_PLOT = "results.json", "results.md", "compare.png"
# `poskit reproduce translation`: the training-loss curves and BLEU per encoding
CONVERGENCE_PLOT = "convergence.png"
# `poskit extrapolate`
EXTRAPOLATION_JSON, EXTRAPOLATION_MD, EXTRAPOLATION_PLOT = "extrapolation.json", "extrapolation.md", "extrapolation.png"
# `poskit demo`: its summary, and the sub-directories of its language models and of its diagnostic compare
DEMO_JSON, DEMO_MD, DEMO_LM_DIR, DEMO_DIAGNOSTIC_DIR = "demo.json", "demo.md", "lm", "diagnostic"
# `poskit reproduce` of a reproduction that plots its training-loss curves (mlm)
TRAINING_LOSS_PLOT = "training_loss.png"


def safe_label(label: str) -> str:
    """A directory name for a label (an encoding spec such as "pope:delta_init=uniform", a variant "n_vars=3"):
    every character but letters, digits, '-', '_' and '.' becomes '_'."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
