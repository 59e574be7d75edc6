"""`poskit convert-checkpoint`: rewrite a run's legacy checkpoint.pt in the current format, whichever recipe
wrote the run (the language model's or the translation model's). The run's config.json says which: a
translation run's is a Seq2SeqConfig, any other is read as a TrainConfig (and refused naming config.json when
it is neither)."""
from __future__ import annotations

from pathlib import Path

from . import run_dir as run_dirs
from .files import CONFIG_FILE, read_json


def convert_checkpoint(run_dir) -> Path:
    """Convert `run_dir`'s checkpoint.pt (run.convert_legacy_checkpoint or
    recipes.seq2seq.convert_legacy_seq2seq_checkpoint, which check everything before changing anything), holding
    the run directory's lock; returns the new checkpoint.json."""
    from .recipes.seq2seq import Seq2SeqConfig, convert_legacy_seq2seq_checkpoint
    from .run import convert_legacy_checkpoint

    run_dirs.check(run_dir, "run")
    config = read_json(Path(run_dir) / CONFIG_FILE, "a run's config")
    with run_dirs.locked(run_dir):
        try:
            Seq2SeqConfig.from_dict(config)
        except (ValueError, TypeError):  # not a translation run: the decoder trainer's checks name what is wrong
            return convert_legacy_checkpoint(run_dir)
        return convert_legacy_seq2seq_checkpoint(run_dir)
