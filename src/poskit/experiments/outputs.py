"""The names of the files and directories the experiment commands write, in one place (the drivers write
them, the CLI names them in its messages), and how an output directory written before directory markers is
recognised (training/run_dir.py adopts such a directory instead of refusing it)."""
import re
from pathlib import Path

# `poskit compare` and `poskit reproduce` (the translation reproduction too), in their output directory
COMPARE_JSON, COMPARE_MD, COMPARE_PLOT = "results.json", "results.md", "compare.png"
# a compare that evaluates further splits periodically (its curve_splits): every split's learning curves
CURVES_PLOT = "curves.png"
# `poskit reproduce translation`: the training-loss curves and BLEU per encoding
CONVERGENCE_PLOT = "convergence.png"
# `poskit extrapolate`
EXTRAPOLATION_JSON, EXTRAPOLATION_MD, EXTRAPOLATION_PLOT = "extrapolation.json", "extrapolation.md", "extrapolation.png"
# `poskit demo`: its summary, and the sub-directories of its language models and of its diagnostic compare
DEMO_JSON, DEMO_MD, DEMO_LM_DIR, DEMO_DIAGNOSTIC_DIR = "demo.json", "demo.md", "lm", "diagnostic"
# `poskit reproduce` of a reproduction that plots its training-loss curves (mlm)
TRAINING_LOSS_PLOT = "training_loss.png"
# a language-model reproduction's extrapolation sweep (a sub-directory of its output)
EXTRAPOLATION_DIR = "extrapolation"
# a study's directory: its spec, the workers' logs, the table and plot, the lock of the runner before markers
STUDY_FILES = ("study_spec.json", "study.md", "study.png", "results.json", ".study.lock")
STUDY_DIRS = ("logs",)

# what older compare and reproduce commands left in their output directory besides the runs
_COMPARE_FILES = {COMPARE_JSON, COMPARE_MD, COMPARE_PLOT, TRAINING_LOSS_PLOT, CONVERGENCE_PLOT, ".poskit.lock"}
_SEED_DIR = re.compile(r"seed\d+")


def _is_temp(name: str) -> bool:
    return name.startswith(".") and ".tmp" in name  # a killed atomic write's temporary file


def is_legacy_compare(directory: Path) -> bool:
    """An output directory of `poskit compare` or `poskit reproduce` written before markers: only its report
    files and its runs (an encoding's seed<s> run directories, a translation run, a variant's compare directory,
    the extrapolation sweep). Anything else in it means it is not one."""
    for p in Path(directory).iterdir():
        if not p.is_dir():
            if p.name not in _COMPARE_FILES and not _is_temp(p.name):
                return False
        elif p.name == EXTRAPOLATION_DIR or (p / "config.json").exists() or (p / ".poskit.json").exists():
            continue
        elif all(c.is_dir() and _SEED_DIR.fullmatch(c.name) for c in p.iterdir()):
            continue
        elif not is_legacy_compare(p):
            return False
    return True


def is_legacy_study(directory: Path) -> bool:
    """A `poskit study` directory written before markers: its spec, logs, report and run directories."""
    for p in Path(directory).iterdir():
        if p.is_dir():
            if p.name in STUDY_DIRS or p.name.startswith("attention-") or (p / "config.json").exists() \
                    or (p / "study.json").exists() \
                    or (p / ".poskit.json").exists():
                continue
            return False
        if p.name not in STUDY_FILES and not (p.name.startswith(".") and p.name.endswith(".lock")) \
                and not _is_temp(p.name):
            return False
    return True


def safe_label(label: str) -> str:
    """A directory name for a label (an encoding spec such as "pope:delta_init=uniform", a variant "n_vars=3"):
    every character but letters, digits, '-', '_' and '.' becomes '_'."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
