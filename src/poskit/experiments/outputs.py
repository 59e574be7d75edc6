"""The names of the files the experiment commands write, in one place (the drivers write them, the CLI names
them in its messages)."""

# `poskit compare` and `poskit reproduce`, in their output directory
COMPARE_JSON, COMPARE_MD, COMPARE_PLOT = "results.json", "results.md", "compare.png"
# `poskit extrapolate`
EXTRAPOLATION_JSON, EXTRAPOLATION_MD, EXTRAPOLATION_PLOT = "extrapolation.json", "extrapolation.md", "extrapolation.png"
# `poskit demo`: its summary, and the sub-directories of its language models and of its diagnostic compare
DEMO_JSON, DEMO_MD, DEMO_LM_DIR, DEMO_DIAGNOSTIC_DIR = "demo.json", "demo.md", "lm", "diagnostic"
# `poskit reproduce` of a reproduction that plots its training-loss curves (mlm)
TRAINING_LOSS_PLOT = "training_loss.png"
