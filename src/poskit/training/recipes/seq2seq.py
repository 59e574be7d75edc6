"""The translation recipe: an `EncoderDecoder` on the German-English pairs, scored with BLEU and chrF.

The recipe is the papers' (002 §4.1, after Vaswani et al.): Adam (0.9, 0.98), the learning rate rising
linearly from 1e-7 to `lr` over `warmup` steps and then falling as 1/sqrt(step), label smoothing 0.1,
batches of about `batch_tokens` target tokens, beam search with length penalty for the test translations.

One run lives in one directory (the Trainer's layout, run.py):

    config.json       the Seq2SeqConfig
    metrics.jsonl     {"step", "train_loss", "lr", "elapsed"} every log_every steps (the convergence curve),
                      {"step", "split": "validation", "loss"} every eval_every steps
    checkpoint.json   the commit record of the latest checkpoint (checkpoint_store.py, the decoder trainer's
    checkpoints/      format): model.safetensors + model_config.json (the EncoderDecoderConfig) +
                      training_state.pt (optimizer, step, epoch and batch position, RNG states, the config)
    results.json      validation and test NLL per token, test BLEU and chrF, steps, wall time
    test.hyp.txt      the test translations, one per line, in corpus order

Resume: the batch order is a function of (seed, epoch), and the checkpoint holds the position in it and the
RNG states, so a run killed and resumed ends with the numbers of an uninterrupted one. A larger max_steps (and
nothing else changed) extends a finished run, again exactly: the learning-rate schedule does not depend on
max_steps. Runs written before checkpoint.json hold a single checkpoint.pt; they resume exactly and `poskit
convert-checkpoint RUN` rewrites them.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ...util.config_check import ConfigError, check_field_types, from_known_fields
from ...models import EncoderDecoder, EncoderDecoderConfig
from ...tasks.translation import BOS, EOS, PAD, PairSet
from ..checkpoint import read_run_state
from ..config import check_seed
from ..checkpoint_store import checkpoint_path, remove_uncommitted_checkpoints, write_checkpoint
from ..files import LEGACY_CHECKPOINT_FILE, atomic_write_bytes, does_not_fit, remove_stale_temp_files
from ..rng import seed_everything
from ..step import DECAY_RULE, decay_groups
from .base import EpochStream, Loop, Recipe

__all__ = ["DIRECTIONS", "Seq2SeqConfig", "Seq2SeqRecipe", "train_seq2seq", "load_pairs", "corpus_scores",
           "read_seq2seq_checkpoint", "convert_legacy_seq2seq_checkpoint"]

DIRECTIONS = ("de-en", "en-de")
CONFIG, METRICS, RESULTS, HYPOTHESES = "config.json", "metrics.jsonl", "results.json", "test.hyp.txt"


@dataclass
class Seq2SeqConfig:
    """Every knob of a translation run (the model's are in `model`: EncoderDecoderConfig fields other than
    the vocabulary sizes, which come from `vocab_size`)."""

    model: dict = field(default_factory=dict)
    """EncoderDecoderConfig fields (d_model, n_heads, layers, encoding, ...)."""
    vocab_size: int = 8000
    """Joint BPE vocabulary of both languages (poskit.data.translation)."""
    direction: str = "de-en"
    """"de-en" (German source) or "en-de"."""
    max_steps: int = 2000
    """Optimizer steps."""
    batch_tokens: int = 1500
    """Target tokens per training batch (padding included), about."""
    lr: float = 5e-4
    """Peak learning rate (after warm-up; then 1/sqrt(step))."""
    warmup: int = 400
    """Steps of linear warm-up from 1e-7."""
    label_smoothing: float = 0.1
    """Label smoothing of the training loss."""
    clip_norm: float = 1.0
    """Gradient-norm clipping (0: none)."""
    max_len: int = 64
    """Training pairs with a side longer than this many tokens are left out (none of the test pairs is)."""
    seed: int = 0
    """Initialisation, dropout and batch order."""
    log_every: int = 10
    """Training loss logged every this many steps."""
    eval_every: int = 500
    """Validation loss every this many steps (and at the end)."""
    checkpoint_every: int = 250
    """Checkpoint every this many steps (and at the end)."""
    beam_size: int = 4
    """Beam of the test translations (1: greedy)."""
    length_penalty: float = 0.6
    """Exponent of the length normalisation of beam scores (fairseq's lenpen; RoFormer's 0.6)."""
    decode_extra: int = 10
    """Longest translation: source length * 1.5 + decode_extra tokens."""
    limit: int | None = None
    """Use only the first `limit` pairs of the corpus (a small slice for tests)."""
    test_limit: int | None = None
    """Translate only the first `test_limit` test pairs (quick checks; None: all)."""
    bleu_every: int | None = None
    """Validation BLEU and chrF (beam_size, as the test's) of the first `bleu_pairs` validation pairs at every
    evaluation whose step is a multiple of this, and at the end: the learning curve that says where BLEU
    plateaus. A multiple of eval_every; None: none (decoding costs far more than the validation loss)."""
    bleu_pairs: int = 500
    """Validation pairs translated for `bleu_every` (the first ones, the same at every evaluation)."""

    def __post_init__(self):
        check_field_types(self)
        check_seed(self.seed)
        if self.direction not in DIRECTIONS:
            raise ConfigError("direction", f"one of {list(DIRECTIONS)}", self.direction)
        for name in ("max_steps", "batch_tokens", "max_len", "log_every", "eval_every", "checkpoint_every",
                     "beam_size"):
            if getattr(self, name) < 1:
                raise ConfigError(name, "a positive int", getattr(self, name))
        for name in ("warmup", "decode_extra"):
            if getattr(self, name) < 0:
                raise ConfigError(name, "an int >= 0", getattr(self, name))
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ConfigError("lr", "a finite number > 0", self.lr)
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError("label_smoothing", "in [0, 1)", self.label_smoothing)
        if not self.clip_norm >= 0:
            raise ConfigError("clip_norm", ">= 0", self.clip_norm)
        if not self.length_penalty >= 0:
            raise ConfigError("length_penalty", ">= 0", self.length_penalty)
        for name in ("limit", "test_limit", "bleu_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(name, "a positive int or null", getattr(self, name))
        if self.bleu_every is not None and self.bleu_every % self.eval_every:
            raise ConfigError("bleu_every", f"a multiple of eval_every ({self.eval_every}) or null", self.bleu_every)
        if self.bleu_pairs < 1:
            raise ConfigError("bleu_pairs", "a positive int", self.bleu_pairs)
        for name in ("src_vocab_size", "tgt_vocab_size"):
            if name in self.model:
                raise ConfigError(f"model.{name}", "left out (set vocab_size: the vocabulary is joint)",
                                  self.model[name])
        try:
            self.model_config()
        except ConfigError as e:
            raise ConfigError(f"model.{e.field}", e.requirement, e.value) from None
        except ValueError as e:
            raise ValueError(f"model: {e}") from None

    def model_config(self) -> EncoderDecoderConfig:
        return EncoderDecoderConfig.from_dict({**self.model, "src_vocab_size": self.vocab_size,
                                               "tgt_vocab_size": self.vocab_size})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Seq2SeqConfig":
        return from_known_fields(cls, d, "translation config")


def lr_at(step: int, cfg: Seq2SeqConfig) -> float:
    """Linear warm-up from 1e-7 to lr, then lr * sqrt(warmup / step) (the inverse square root schedule)."""
    if cfg.warmup and step <= cfg.warmup:
        return 1e-7 + (cfg.lr - 1e-7) * step / cfg.warmup
    return cfg.lr * math.sqrt(max(cfg.warmup, 1) / max(step, 1))


def load_pairs(cfg: Seq2SeqConfig, quiet: bool = True):
    """(data, {split: PairSet}) in the configured direction; training pairs above max_len dropped."""
    from ...data.translation import load_translation

    data = load_translation(cfg.vocab_size, cfg.limit, quiet=quiet)
    src_lang, tgt_lang = cfg.direction.split("-")
    sets = {s: PairSet(data.ids(s, src_lang), data.ids(s, tgt_lang)) for s in ("train", "validation", "test")}
    sets["train"] = sets["train"].drop_longer_than(cfg.max_len)
    return data, sets


def _loss(model, batch, smoothing: float) -> torch.Tensor:
    logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=PAD,
                           label_smoothing=smoothing)


@torch.no_grad()
def mean_nll(model, pairs: PairSet, batch_size: int = 64) -> float:
    """Negative log-likelihood per target token (EOS included), no smoothing, no dropout."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for index in pairs.eval_batches(batch_size):
        b = pairs.batch(index)
        logits = model(b.src, b.tgt_in, b.src_mask, b.tgt_mask)
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), b.tgt_out.flatten(), ignore_index=PAD,
                                       reduction="sum"))
        count += b.n_target_tokens
    model.train(was)
    return total / count


def translate_pairs(model, pairs: PairSet, cfg: Seq2SeqConfig, batch_size: int = 32) -> list[list[int]]:
    """Beam-search (or greedy) translations of every source, in PairSet order."""
    out: list = [None] * len(pairs)
    for index in pairs.eval_batches(batch_size):
        b = pairs.batch(index)
        max_len = int(b.src.shape[1] * 1.5) + cfg.decode_extra
        hyps = model.translate(b.src, b.src_mask, bos=BOS, eos=EOS, max_len=max_len, beam_size=cfg.beam_size,
                               length_penalty=cfg.length_penalty)
        for i, h in zip(index, hyps):
            out[i] = h
    return out


def require_scorer():
    """The sacrebleu module, checked before any training (a run would otherwise fail only at its end)."""
    try:
        import sacrebleu
    except ModuleNotFoundError:
        from ...data.sources.base import CorpusNotPresent

        raise CorpusNotPresent("BLEU and chrF need sacrebleu: pip install -c constraints.txt 'poskit[data]'") from None
    return sacrebleu


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
    """sacreBLEU's corpus BLEU (13a tokenisation) and chrF of detokenised text."""
    sacrebleu = require_scorer()
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    return {"bleu": bleu.corpus_score(hypotheses, [references]).score,
            "chrf": chrf.corpus_score(hypotheses, [references]).score,
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature())}


def read_seq2seq_checkpoint(run_dir) -> tuple[dict, Path]:
    """(state, the file to name in errors about it) of a translation run's checkpoint, current or legacy; every
    file and entry checked (a RunFileError naming the file), nothing loaded anywhere."""
    return read_run_state(checkpoint_path(run_dir), "cpu", Seq2SeqRecipe)


def _fresh_model(cfg: Seq2SeqConfig):
    model = EncoderDecoder(cfg.model_config())
    return model, torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)


def convert_legacy_seq2seq_checkpoint(run_dir) -> Path:
    """Rewrite the checkpoint.pt of a translation run written before checkpoint.json in the current format,
    then remove checkpoint.pt; returns the new checkpoint.json. The old file is read, checked and fitted to
    the run's model and optimizer first: a bad one is a RunFileError and nothing changes."""
    run_dir = Path(run_dir)
    legacy = run_dir / LEGACY_CHECKPOINT_FILE
    if not legacy.exists():
        raise ValueError(f"run_dir {str(run_dir)!r} has no {LEGACY_CHECKPOINT_FILE} to convert")
    cfg = Seq2SeqRecipe.load_config(run_dir)
    state, path = read_seq2seq_checkpoint(run_dir)
    with torch.random.fork_rng(devices=[]):  # building the check model must not move the caller's RNG
        model, opt = _fresh_model(cfg)
    try:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
        raise does_not_fit(path, e) from None
    remove_stale_temp_files(run_dir)
    remove_uncommitted_checkpoints(run_dir)
    # the state is written as read (weights, optimizer, RNG), so a resume after the conversion is exact
    write_checkpoint(run_dir, {"config": cfg.to_dict(), "world_size": 1, **state}, model.config.to_dict())
    return run_dir / "checkpoint.json"


class Seq2SeqRecipe(Recipe):
    """Adam (0.9, 0.98), the inverse square root schedule, label-smoothed cross-entropy on batches of about
    batch_tokens target tokens; the validation NLL every eval_every steps; test BLEU and chrF of beam search."""

    config_type = Seq2SeqConfig
    writer = "poskit's translation trainer"
    state_entries = {"epoch": int, "position": int}

    def __init__(self, config, label: str = ""):
        super().__init__(config)
        self.label = label

    def loop(self) -> Loop:
        c = self.config
        return Loop(c.max_steps, c.seed, c.log_every, c.eval_every, c.checkpoint_every, c.clip_norm)

    def identity(self) -> dict:
        return {"task": "translation", "encoding": self.config.model.get("encoding", "sinusoidal"),
                "seed": self.config.seed}

    def launch(self, procs) -> None:
        require_scorer()

    def build_model(self):
        cfg = self.config
        self.t_start = time.perf_counter()
        self.data, self.sets = load_pairs(cfg)
        self.stream = EpochStream(lambda epoch: self.sets["train"].epoch_batches(cfg.batch_tokens, cfg.seed, epoch))
        seed_everything(cfg.seed)
        return EncoderDecoder(cfg.model_config())

    def optimizer(self, model, rule: str = DECAY_RULE):
        # no weight decay, so one group whatever the rule (as every translation checkpoint holds)
        return torch.optim.Adam(decay_groups(model, 0.0), lr=self.config.lr, betas=(0.9, 0.98), eps=1e-9)

    def lr_at(self, step: int) -> float:
        return lr_at(step + 1, self.config)  # the schedule counts steps from 1

    def next_batch(self, step: int, procs):
        return self.sets["train"].batch(self.stream.next())

    def data_state(self) -> dict:
        return self.stream.state()

    def load_data_state(self, state: dict) -> None:
        self.stream.load(state)

    def loss(self, net, batch, procs):
        loss = _loss(net, batch, self.config.label_smoothing)
        return loss, float(loss.detach())

    def evaluate(self, trainer):
        metrics = {"loss": mean_nll(trainer.model, self.sets["validation"])}
        every = self.config.bleu_every
        if every is not None and (trainer.step % every == 0 or trainer.step == self.config.max_steps):
            metrics.update(validation_scores(trainer.model, self.data, self.sets, self.config))
        return "validation", metrics

    def final_results(self, trainer) -> dict:
        results = evaluate_run(trainer.model, self.data, self.sets, self.config)
        self.hypotheses = results.pop("hypotheses")
        return {**results, "steps": trainer.step, "train_seconds": trainer.elapsed, **self.identity(),
                "parameters": trainer.model.num_parameters(), "session_seconds": time.perf_counter() - self.t_start}

    def write_outputs(self, run_dir: Path, results: dict) -> None:
        atomic_write_bytes(run_dir / HYPOTHESES, lambda f: f.write("".join(h + "\n" for h in self.hypotheses).encode()))


def train_seq2seq(cfg: Seq2SeqConfig, run_dir, *, resume: bool = True, quiet: bool = False,
                  label: str = "") -> dict:
    """Train (or continue, or just return the results of) the translation run in `run_dir` (`run` with the
    translation recipe); returns results.json's dict. An existing run directory must hold the same config
    but for a larger max_steps (a RunFileError naming config.json otherwise)."""
    from ..run import run

    if not isinstance(cfg, Seq2SeqConfig):
        raise ValueError(f"cfg must be a Seq2SeqConfig, got {type(cfg).__name__}")
    require_scorer()
    return run(Seq2SeqRecipe(cfg, label), run_dir, resume=resume, quiet=quiet, label=label)


def translate_and_score(model, data, sets, cfg: Seq2SeqConfig, split: str, limit: int | None) -> tuple[list, dict]:
    """(detokenised translations, sacreBLEU scores) of the first `limit` pairs of `split` (None: all), by
    beam search (cfg.beam_size); the model's training mode is kept."""
    refs_lang = 1 if cfg.direction == "de-en" else 0
    pairs = sets[split]
    references = [p[refs_lang] for p in data.pairs[split]]
    if limit is not None:
        pairs = PairSet(pairs.src[:limit], pairs.tgt[:limit])
        references = references[:limit]
    was = model.training
    model.eval()
    try:
        hyps = [data.tokenizer.decode(h) for h in translate_pairs(model, pairs, cfg)]
    finally:
        model.train(was)
    return hyps, corpus_scores(hyps, references)


@torch.no_grad()
def validation_scores(model, data, sets, cfg: Seq2SeqConfig) -> dict:
    """BLEU and chrF of the first cfg.bleu_pairs validation pairs (the learning curve's points)."""
    _, scores = translate_and_score(model, data, sets, cfg, "validation", cfg.bleu_pairs)
    return {"bleu": scores["bleu"], "chrf": scores["chrf"]}


def evaluate_run(model, data, sets, cfg: Seq2SeqConfig) -> dict:
    """Validation and test NLL, and test BLEU/chrF of beam-search translations (returned as "hypotheses")."""
    t0 = time.perf_counter()
    test = sets["test"]
    if cfg.test_limit is not None:
        test = PairSet(test.src[:cfg.test_limit], test.tgt[:cfg.test_limit])
    model.eval()
    hyps, scores = translate_and_score(model, data, sets, cfg, "test", cfg.test_limit)
    out = {"validation_nll": mean_nll(model, sets["validation"]), "test_nll": mean_nll(model, test),
           **scores, "test_pairs": len(test), "decode_seconds": time.perf_counter() - t0,
           "hypotheses": hyps}
    return out
