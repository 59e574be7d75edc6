"""Optional TensorBoard logging: the records of metrics.jsonl, also as TensorBoard scalars (TrainConfig
tensorboard / `poskit train --tensorboard`). metrics.jsonl stays the run's record; this is a view of it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from poskit.util.config_check import ConfigError

TENSORBOARD_DIR = "tensorboard"
EXTRA_HINT = 'pip install -c constraints.txt -e ".[tensorboard]"'


def check_tensorboard_available() -> None:
    """Refuse tensorboard=True up front when the `tensorboard` package (the extra) is not installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("tensorboard", f"false, or the \"tensorboard\" extra installed ({EXTRA_HINT}): the "
                                         "tensorboard package is missing", True)


class TensorBoardLog:
    """Writes each metrics record as scalars: training records under "train/<key>" (train_loss, lr), an
    evaluation of split S under "S/<metric>", all at the record's step."""

    def __init__(self, run_dir, start_step: int):
        check_tensorboard_available()
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run drops the events a killed invocation wrote after its checkpoint, as
        # metrics.jsonl is cut back to it (they are written again)
        self.writer = SummaryWriter(str(Path(run_dir) / TENSORBOARD_DIR), purge_step=start_step or None)

    def write(self, record: dict) -> None:
        step, group = record["step"], record.get("split", "train")
        for key, value in record.items():
            if key in ("step", "split", "elapsed") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            self.writer.add_scalar(f"{group}/{key}", value, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
