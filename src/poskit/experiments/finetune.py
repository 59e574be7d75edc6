"""`poskit finetune-glue RUN --task T`: fine-tune a masked-language-model run (`poskit reproduce mlm`, or
`poskit train --task mlm-wiki`) on a GLUE task, as RoFormer (paper 002, sec. 4.3) fine-tunes its pretrained
encoder (the recipe: poskit.training.recipes.glue). The output directory is a run directory of the Trainer:
checkpoints every epoch, finetune.json when it finishes; running the same command again returns it, or
continues an interrupted fine-tune.
"""
from __future__ import annotations

from pathlib import Path

from poskit.tasks.glue import GLUE_TASKS
from poskit.training import check_writable_dir, load_config
from poskit.training.recipes.glue import GlueConfig, GlueRecipe, SequenceClassifier
from poskit.training.run import run
from poskit.util.validate import check_choice, check_int, check_real

__all__ = ["SequenceClassifier", "finetune_glue", "FINETUNE_JSON"]

FINETUNE_JSON = GlueRecipe.results_file


def finetune_glue(run_dir, task: str, *, data: str | None = None, out_dir=None, epochs: int = 3, lr: float = 5e-5,
                  batch_size: int = 32, max_length: int = 128, seed: int = 0, max_train_examples: int | None = None,
                  quiet: bool = False) -> dict:
    """Fine-tune the encoder of MLM run `run_dir` on GLUE `task`; writes `out_dir`/finetune.json and returns it."""
    check_choice(task, "task", list(GLUE_TASKS))
    cfg = GlueConfig(run=str(run_dir), task=task, data=data, epochs=check_int(epochs, "epochs", minimum=1),
                     lr=check_real(lr, "lr", minimum=0.0, strict=True),
                     batch_size=check_int(batch_size, "batch_size", minimum=1),
                     max_length=check_int(max_length, "max_length", minimum=2), seed=check_int(seed, "seed", minimum=0),
                     max_train_examples=None if max_train_examples is None else
                     check_int(max_train_examples, "max_train_examples", minimum=1))
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / f"glue-{task}"
    check_writable_dir(out, "out")
    cfg.model = {"encoding": load_config(run_dir).model.encoding}
    return run(GlueRecipe(cfg), out, resume=True, quiet=quiet, label=f"finetune {task}")
