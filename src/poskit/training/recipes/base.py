"""`Recipe`: what differs between kinds of training runs, and nothing else. The Trainer (loop.py) and the run
lifecycle (run.py) own everything the kinds share: the loop, the run directory, checkpoints, the optimizer's
parameter groups, distributed training, logging and the evaluation cadence. A recipe builds the model and
its data, gives the loss of a batch, the learning rate of a step, an evaluation and the final results.

A recipe is made from its config (a dataclass with to_dict/from_dict saved as config.json); `Recipe(None)` is
a recipe that resumes with the config saved in the run directory.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ...util.config_check import from_known_fields
from ..config import config_difference
from ..files import CONFIG_FILE, RESULTS_FILE, RunFileError, read_json


@dataclass(frozen=True)
class Loop:
    """The settings of the training loop that a recipe's config fixes."""

    max_steps: int
    seed: int
    log_every: int
    eval_every: int
    checkpoint_every: int
    grad_clip: float = 0.0
    """Global gradient-norm clipping (0: none)."""
    train_seconds: float | None = None
    parallel: str = "ddp"
    compile: bool = False
    tensorboard: bool = False


class Recipe:
    """A kind of run. Besides the defaults below, a recipe provides:

        loop() -> Loop                   the loop's settings (called once the model is built)
        identity() -> dict               task, encoding and seed: what its results and checkpoint record must
                                         agree on with config.json
        build_model() -> nn.Module       the run's data and model, seeded here (all randomness flows from the
                                         config's seed)
        optimizer(model, rule)           the optimizer over step.decay_groups(model, its weight decay, rule)
        lr_at(step) -> float             the learning rate of step `step` (0 for the first)
        next_batch(step, procs)          the step's batch (this rank's rows of it under several processes)
        data_state() / load_data_state(state)
                                         the data stream's position, saved in checkpoints (`state_entries`)
        loss(net, batch, procs)          (the loss to backpropagate, its value as every rank reports it)
        final_results(trainer) -> dict   the results file's content
    """

    config_type: type
    writer: str  # in errors about its checkpoints: "not a checkpoint written by <writer>"
    results_file: str = RESULTS_FILE
    kind: str = "run"  # the kind its run directory's marker records (run_dir.KINDS)
    state_entries: dict = {}  # the entries its checkpoints hold besides model, optimizer, step and rng
    resume_free_fields: tuple = ()  # config fields a resume may change without changing the run's numbers
    device: str = "cpu"

    def __init__(self, config):
        if config is not None and not isinstance(config, self.config_type):
            raise ValueError(f"cfg must be a {self.config_type.__name__}, got {type(config).__name__}")
        self.config = config

    @classmethod
    def load_config(cls, run_dir):
        """The config saved in `run_dir` (a RunFileError naming config.json when it is not a valid one)."""
        path = Path(run_dir) / CONFIG_FILE
        try:
            return cls.config_type.from_dict(read_json(path, f"a {cls.config_type.__name__}"))
        except RunFileError:
            raise
        except (ValueError, TypeError) as e:
            raise RunFileError(path, f"is not a valid {cls.config_type.__name__}: {e}") from None

    def resume_config(self, saved, where: str):
        """The config a resumed run continues with: the saved one, which the requested one (None: whatever was
        saved) may change only by a larger max_steps, the extension of a run."""
        if self.config is None:
            return saved
        difference = config_difference(saved, self.config, self.resume_free_fields)
        if difference is not None:
            key, a, b = difference
            raise ValueError(f"--resume continues the run saved in {where}, where {key} is {a}; got {b}. A resumed "
                             "run keeps its saved config; only max_steps (--steps) may change, and only upwards "
                             "(to extend the run)")
        return self.config

    def same_run(self, saved) -> bool:
        """Whether this recipe's config is `saved` but for the fields a resume may change freely."""
        free = {f: getattr(saved, f) for f in self.resume_free_fields}
        return dataclasses.replace(self.config, **free).to_dict() == saved.to_dict()

    def launch(self, procs) -> None:
        """Checks of the launch (device, processes, optional packages) before anything is built or written; a
        recipe that records the launch in its config (the LM's world_size) does it here."""

    def model_config(self, model) -> dict:
        """What the checkpoint's model_config.json records."""
        return model.config.to_dict()

    def evaluate(self, trainer) -> tuple[str, dict] | None:
        """(split, metrics) of the periodic evaluation, or None (nothing to evaluate during training)."""
        return None

    def curve_evaluations(self, trainer) -> list[tuple[str, dict]]:
        """(split, metrics) of further splits evaluated beside `evaluate`'s, logged for their learning curves."""
        return []

    def write_outputs(self, run_dir: Path, results: dict) -> None:
        """Files besides the results (written before them, so that finished results imply the outputs)."""


def config_dict(cls):
    """Give config dataclass `cls` the to_dict / from_dict of the trainer's configs (unknown keys refused)."""
    cls.to_dict = lambda self: dataclasses.asdict(self)
    cls.from_dict = classmethod(lambda c, d: from_known_fields(c, d, f"{c.__name__} config"))
    return cls


class EpochStream:
    """Training batches in epochs: `epoch_batches(epoch)` lists the batches of an epoch (a function of the epoch
    alone, so that a checkpoint's (epoch, position) continues the very same stream)."""

    def __init__(self, epoch_batches):
        self.epoch_batches, self.epoch, self.position, self.batches = epoch_batches, 0, 0, None

    def next(self):
        if self.batches is None:
            self.batches = self.epoch_batches(self.epoch)
        if self.position >= len(self.batches):
            self.epoch, self.position, self.batches = self.epoch + 1, 0, self.epoch_batches(self.epoch + 1)
        self.position += 1
        return self.batches[self.position - 1]

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load(self, state: dict) -> None:
        self.epoch, self.position, self.batches = int(state["epoch"]), int(state["position"]), None


class Draws:
    """The n-th draw of a seeded generator as a function of n: `draw(generator)` once per call, in order, and
    the generator restarted (`make()`) only when asked for an earlier draw (a resume)."""

    def __init__(self, make, draw):
        self.make, self.draw, self.generator, self.count = make, draw, None, 0

    def __call__(self, n: int):
        if self.generator is None or n < self.count:
            self.generator, self.count = self.make(), 0
        while True:
            value, self.count = self.draw(self.generator), self.count + 1
            if self.count > n:
                return value


def slices(order, size: int) -> list:
    """`order` cut into consecutive batches of `size` (the last one shorter)."""
    return [order[i:i + size] for i in range(0, len(order), size)]
