"""Passkey retrieval (Mohtashami & Jaggi 2023, the long-context test of Position Interpolation and YaRN), sized for
small models: prompts, training windows and the ``passkey`` task.

A prompt is exactly ``length`` tokens of a language-modelling task's own tokenization (its vocabulary or corpus
tokenizer, so that any decoder trained on that task can be probed)::

    <filler, first part>  "\\npass key 71432.\\n"  <filler, rest>  "\\npass key "

and the answer that should follow it is the key's tokens, ``"71432"``.  The key is uniform over 10000-99999.  The
filler is ONE contiguous passage of the task's text (held-out text for evaluation, the training stream for training
windows) starting at a random offset; the key line is inserted into it after ``round(depth * F)`` of its ``F``
tokens, so depth 0 puts the key line first and depth 1 directly before the question.

Why this format and not the papers' (a task description, "The pass key is N. Remember it. N is the pass key.",
filler, "What is the pass key? The pass key is"):

* it must fit SHORT training contexts: the papers' sentences are about 150 characters, more than the demo's whole
  64-character window.  Here the key line and the question take 17 + 10 characters, the answer 5, which leaves
  33 characters of filler in a training window of 64 (+ 1) characters (``min_length`` tells a task's minimum);
* the question repeats the key line's prefix, so the answer is the text that followed the earlier occurrence of
  the same words: what a small model can learn to copy, and what the papers' answer prefix asks for too;
* the newlines make the key line a line of its own in the text (both Shakespeare and Wikipedia are line-based),
  so the key is not glued onto a word of the filler, and the prompt still reads as the corpus does;
* the filler is the model's own corpus rather than the papers' repeated sentence ("The grass is green..."):
  a small LM trained on one corpus has never seen that sentence, so it would test the model on text unlike its
  training data instead of testing retrieval.

Each part is tokenized on its own (the key line is ``encode("\\npass key ") + encode(key) + encode(".\\n")``): for
character and byte tokenizers that is the text's own tokenization; for BPE it is a valid segmentation in which
the key has the same tokens in the key line and in the answer.  The corpus must be able to spell the format (the
digits, "pass key", "." and the newline), else a ValueError names the corpus.

Training: ``passkey_fraction`` of the language-modelling tasks (:mod:`.windows`) replaces that fraction of the
training windows by passkey windows (filler from the training stream, depth uniform in [0, 1], the answer at the
window's end), so that a model can retrieve at its training length before its context is extended; the
``passkey`` task trains and scores retrieval alone (loss and accuracy on the key's tokens only).

    >>> task = build_task("shakespeare")
    >>> gen = PasskeyGenerator(task, split="test")
    >>> p = gen.prompt(256, depth=0.5, rng=np.random.default_rng(0))
    >>> len(p.tokens), task.decode(p.answer) == p.key, p.key_start, p.filler   # (256, True, 115, 229)
    >>> prompts = gen.prompts(256, depth=0.25, trials=10, seed=0)  # deterministic from the seed
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..util.validate import check_bool, check_int, check_real
from .data import IGNORE_INDEX, Batch, rng_from_generator
from .metrics import evaluate_batches
from .protocol import Described

__all__ = ["KEY_PREFIX", "KEY_SUFFIX", "QUESTION", "KEY_LOW", "KEY_HIGH", "PasskeyPrompt", "PasskeyGenerator",
           "PasskeyTask", "check_passkey_fraction", "corpus_label", "mix_passkey_windows", "passkey_window_targets"]

KEY_PREFIX = "\npass key "  # the key line is KEY_PREFIX + key + KEY_SUFFIX
KEY_SUFFIX = ".\n"
QUESTION = KEY_PREFIX  # the prompt ends with the key line's own prefix: the answer is what followed it there
KEY_LOW, KEY_HIGH = 10_000, 99_999  # keys are uniform over these 5-digit numbers, both included
_SPELLED = (KEY_PREFIX, KEY_SUFFIX) + tuple("0123456789")


@dataclass(frozen=True)
class PasskeyPrompt:
    """One prompt: ``tokens`` (length,) int64 ids, the ``answer`` (the key's ids) that should follow them, the
    ``key`` ("71432"), the requested ``depth``, where the key line starts (``key_start``, a token index) and how
    many filler tokens the prompt holds (``filler``; ``key_start == round(depth * filler)``)."""

    tokens: np.ndarray
    answer: np.ndarray
    key: str
    depth: float
    key_start: int
    filler: int


def _lm_task(task):
    """The language-modelling task whose text and tokenizer passkey prompts use (the ``passkey`` task's base)."""
    return task.lm if isinstance(task, PasskeyTask) else task


def corpus_label(task) -> str:
    """How errors name a task's text: "corpus 'wiki' (tokenizer 'bytes')", "corpus 'shakespeare'"."""
    task = _lm_task(task)
    corpus = getattr(task, "corpus", None)
    if corpus is None:
        return f"corpus {getattr(task, 'name', type(task).__name__)!r}"
    tokenizer = getattr(getattr(getattr(task, "data", None), "tokenizer", None), "name", None)
    return f"corpus {corpus!r}" + (f" (tokenizer {tokenizer!r})" if tokenizer else "")


class PasskeyGenerator:
    """Passkey prompts over one text stream of a language-modelling task: ``split`` "test" or "validation" (its
    held-out text, for evaluation) or "train" (its training stream, for training windows).

    ``task`` is a language-modelling task with ``encode(text)``, ``decode(ids)``, ``region(split)`` and
    ``train_ids`` (``shakespeare``, ``lm-wiki``, ``corpus``, ...), or a ``passkey`` task (its base is used).
    """

    def __init__(self, task, split: str = "test") -> None:
        lm = _lm_task(task)
        if not all(hasattr(lm, a) for a in ("encode", "decode", "region", "train_ids")):
            raise ValueError(f"task {getattr(lm, 'name', type(lm).__name__)!r} has no text to draw passkey filler "
                             "from: passkey prompts need a language-modelling task over text (shakespeare, lm-wiki, "
                             "lm-plays, corpus, ...)")
        splits = ("train",) + tuple(lm.split_names)
        if split not in splits:
            raise ValueError(f"split must be one of {list(splits)}, got {split!r}")
        self.task, self.split, self.label = lm, split, corpus_label(lm)
        stream = lm.train_ids if split == "train" else lm.region(split)
        self.stream = stream.numpy() if isinstance(stream, torch.Tensor) else stream  # (N,) ids; may be a memmap
        self.prefix = self._spell(KEY_PREFIX)
        self.suffix = self._spell(KEY_SUFFIX)
        self.question = self._spell(QUESTION)
        for digit in "0123456789":
            self._spell(digit)

    def _spell(self, text: str) -> np.ndarray:
        """The ids of ``text``; ValueError naming the corpus when its vocabulary cannot spell it exactly."""
        try:
            ids = np.asarray(self.task.encode(text), dtype=np.int64)
            back = self.task.decode(ids.tolist())
        except ValueError as e:
            raise ValueError(f"the passkey format needs {text!r}, which the vocabulary of {self.label} cannot spell "
                             f"({e}); it needs the digits 0-9 and the characters of "
                             f"{KEY_PREFIX + KEY_SUFFIX!r}") from None
        if back != text:
            raise ValueError(f"the passkey format needs {text!r}, which the vocabulary of {self.label} cannot spell "
                             f"(it decodes to {back!r}); it needs the digits 0-9 and the characters of "
                             f"{KEY_PREFIX + KEY_SUFFIX!r}")
        return ids

    def decode(self, ids) -> str:
        return self.task.decode([int(i) for i in ids])

    def key_ids(self, key: str) -> np.ndarray:
        """The answer's ids for ``key`` (a 5-digit string)."""
        return np.asarray(self.task.encode(key), dtype=np.int64)

    def fixed_length(self, answer_len: int) -> int:
        """Prompt tokens that are not filler, for a key of ``answer_len`` tokens."""
        return len(self.prefix) + answer_len + len(self.suffix) + len(self.question)

    @property
    def min_length(self) -> int:
        """The shortest prompt: the format with one filler token (for a character or byte tokenizer, whose keys
        are always 5 tokens; a BPE key may take fewer, so this bound is safe for every key)."""
        return self.fixed_length(5) + 1

    def draw_key(self, rng: np.random.Generator) -> str:
        return str(int(rng.integers(KEY_LOW, KEY_HIGH + 1)))

    def _build(self, key: str, length: int, depth: float, rng: np.random.Generator) -> PasskeyPrompt:
        """The prompt of exactly ``length`` tokens holding ``key`` at ``depth``; the filler's offset is drawn
        from ``rng``."""
        answer = self.key_ids(key)
        filler = length - self.fixed_length(len(answer))
        if filler < 1:
            raise ValueError(f"length must be at least {self.fixed_length(len(answer)) + 1} tokens of {self.label} "
                             f"for the passkey format (key line, question and one filler token), got {length}")
        if filler > len(self.stream):
            raise ValueError(f"length={length} needs {filler} filler tokens, but the {self.split!r} text of "
                             f"{self.label} has only {len(self.stream)}")
        before = int(np.floor(depth * filler + 0.5))  # round half up (numpy's round would go to the even side)
        start = int(rng.integers(0, len(self.stream) - filler + 1))
        text = np.asarray(self.stream[start: start + filler], dtype=np.int64)
        tokens = np.concatenate((text[:before], self.prefix, answer, self.suffix, text[before:], self.question))
        return PasskeyPrompt(tokens, answer, key, float(depth), before, filler)

    def prompt(self, length: int, depth: float, rng: np.random.Generator) -> PasskeyPrompt:
        """A prompt of exactly ``length`` tokens with a random key at ``depth`` (0 = start, 1 = end)."""
        length = check_int(length, "length", minimum=1)
        depth = check_real(depth, "depth", minimum=0.0, maximum=1.0)
        return self._build(self.draw_key(rng), length, depth, rng)

    def prompts(self, length: int, depth: float, trials: int, seed: int, *,
                answer_in_length: bool = False) -> list[PasskeyPrompt]:
        """``trials`` prompts at one (length, depth), a deterministic function of ``seed``, ``length`` and ``depth``
        (each cell of a grid has its own random stream, so adding a length or a depth changes no other cell).

        ``answer_in_length``: ``length`` counts the positions the model reads while it answers, the prompt and the
        key's tokens but the last (a training window of context ``length`` holds exactly that), so each prompt is
        ``length + 1 - len(answer)`` tokens; otherwise every prompt is ``length`` tokens."""
        length = check_int(length, "length", minimum=1)
        depth = check_real(depth, "depth", minimum=0.0, maximum=1.0)
        trials = check_int(trials, "trials", minimum=1)
        seed = check_int(seed, "seed", minimum=0)
        check_bool(answer_in_length, "answer_in_length")
        minimum = self.min_length + (4 if answer_in_length else 0)  # a 5-token key is the longest
        if length < minimum:
            raise ValueError(f"length must be at least {minimum} tokens of {self.label} for the passkey format "
                             f"(key line, question and one filler token{', key' if answer_in_length else ''}), "
                             f"got {length}")
        rng = np.random.default_rng([seed, length, int(round(depth * 10**9))])
        out = []
        for _ in range(trials):
            key = self.draw_key(rng)
            size = length + 1 - len(self.key_ids(key)) if answer_in_length else length
            out.append(self._build(key, size, depth, rng))
        return out

    def window(self, context: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """A training window of ``context + 1`` tokens (inputs and next-token targets, like an LM window): a
        prompt at a uniform random depth followed by its answer; returns (tokens, answer length)."""
        key = self.draw_key(rng)
        answer_len = len(self.key_ids(key))
        p = self._build(key, context + 1 - answer_len, float(rng.random()), rng)
        return np.concatenate((p.tokens, p.answer)), answer_len

    def check_window(self, context: int, what: str) -> None:
        """ValueError naming ``what`` when windows of ``context`` cannot hold the format."""
        if context + 1 - 5 < self.min_length:
            raise ValueError(f"{what} needs context >= {self.min_length + 4} tokens of {self.label} to hold a passkey "
                             f"window (prompt and key), got context={context}")


def check_passkey_fraction(task, value) -> float:
    """Validate the ``passkey_fraction`` option of a language-modelling task (after its text is loaded): a fraction
    in [0, 1]; above 0 the corpus must spell the format and the context hold a window."""
    fraction = check_real(value, "passkey_fraction", minimum=0.0, maximum=1.0)
    if fraction > 0:
        try:
            PasskeyGenerator(task, "train").check_window(task.context, f"passkey_fraction={fraction}")
        except ValueError as e:
            message = str(e)
            raise ValueError(message if message.startswith("passkey_fraction") else
                             f"passkey_fraction={fraction}: {message}") from None
    return fraction


def mix_passkey_windows(task, seq: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Replace each window of ``seq`` ((B, context + 1) ids) by a passkey window with probability
    ``task.passkey_fraction``, drawing from ``generator`` (the rows, then one seed for the windows)."""
    chosen = (torch.rand(seq.shape[0], generator=generator) < task.passkey_fraction).nonzero().flatten().tolist()
    rng = rng_from_generator(generator)
    if not chosen:
        return seq
    gen = PasskeyGenerator(task, "train")
    seq = seq.clone()
    for row in chosen:
        seq[row] = torch.from_numpy(gen.window(task.context, rng)[0])
    return seq


def passkey_window_targets(windows: np.ndarray, answer_lens: list[int]) -> Batch:
    """(B, context + 1) windows -> a Batch whose targets are the answers' tokens only (-100 elsewhere)."""
    seq = torch.from_numpy(np.asarray(windows, dtype=np.int64))
    inputs, targets = seq[:, :-1].contiguous(), seq[:, 1:].clone()
    width = targets.shape[1]
    for row, n in enumerate(answer_lens):
        targets[row, : width - n] = IGNORE_INDEX
    return Batch(inputs, targets)


def _stable_hash(s: str) -> int:
    return zlib.crc32(s.encode("utf-8"))


class PasskeyTask(Described):
    """Passkey retrieval as a task: windows of ``context`` tokens, each a prompt (filler of the language-modelling
    task ``base`` at a uniform random depth) followed by its key, with the loss and the accuracy on the key's tokens
    only.  ``accuracy`` is sequence-level: a window counts when every key token is the argmax under teacher forcing,
    which is exactly when greedy decoding reproduces the key.  ``tokenizer`` goes to a corpus task's constructor
    (e.g. base="lm-wiki", tokenizer="bytes").  Evaluation splits: ``eval_size`` windows over the base's held-out
    text of that split, from seeds ``(eval_seed, "passkey", split)``.

    Scoring a trained decoder at other lengths and depths (greedy decoding through the KV cache): see
    :func:`poskit.evaluate.passkey.passkey_grid`."""

    name = "passkey"
    metric = "accuracy"
    accuracy_level = "sequence"
    split_names = ("validation", "test")

    def __init__(self, base: str = "shakespeare", tokenizer: str | None = None, context: int = 64,
                 eval_size: int = 200, eval_seed: int = 0, eval_batch_size: int = 100) -> None:
        from . import build_task, task_parameters  # the registry imports this module

        self.context = check_int(context, "context", minimum=1)
        self.eval_size = check_int(eval_size, "eval_size", minimum=1)
        self.eval_seed = check_int(eval_seed, "eval_seed", minimum=0)
        self.eval_batch_size = check_int(eval_batch_size, "eval_batch_size", minimum=1)
        if not isinstance(base, str) or base == self.name or "context" not in task_parameters(base):
            raise ValueError(f"base must be the name of a language-modelling task (shakespeare, lm-wiki, ...), "
                             f"got {base!r}")
        if tokenizer is not None and (not isinstance(tokenizer, str) or "tokenizer" not in task_parameters(base)):
            raise ValueError(f"tokenizer must be None or a tokenizer name for a base task that takes one, got "
                             f"{tokenizer!r} for base {base!r}")
        self.base, self.tokenizer = base, tokenizer
        self.lm = build_task(base, context=self.context, **({"tokenizer": tokenizer} if tokenizer else {}))
        self._train = PasskeyGenerator(self.lm, "train")  # validates the base (text, spelling) before the context
        self._train.check_window(self.context, f"task {self.name!r}")
        self.vocab = self.lm.vocab
        self._split_cache: dict[str, tuple[np.ndarray, list[int]]] = {}

    @property
    def max_input_len(self) -> int:
        return self.context

    def encode(self, text: str) -> list[int]:
        return self.lm.encode(text)

    def decode(self, ids) -> str:
        return self.lm.decode(ids)

    def _windows(self, gen: PasskeyGenerator, n: int, rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
        rows = [gen.window(self.context, rng) for _ in range(n)]
        return np.stack([r[0] for r in rows]), [r[1] for r in rows]

    def train_batch(self, batch_size: int, generator: torch.Generator, step: int | None = None) -> Batch:
        """Fresh passkey windows over the base's training text, a deterministic function of ``generator``."""
        batch_size = check_int(batch_size, "batch_size", minimum=1)
        if step is not None:
            check_int(step, "step", minimum=0)
        return passkey_window_targets(*self._windows(self._train, batch_size, rng_from_generator(generator)))

    def split(self, name: str, batch_size: int | None = None) -> list[Batch]:
        if name not in self.split_names:
            raise ValueError(f"split must be one of {list(self.split_names)}, got {name!r}")
        bs = self.eval_batch_size if batch_size is None else check_int(batch_size, "batch_size", minimum=1)
        if name not in self._split_cache:
            rng = np.random.default_rng([self.eval_seed, _stable_hash(self.name), _stable_hash(name)])
            self._split_cache[name] = self._windows(PasskeyGenerator(self.lm, name), self.eval_size, rng)
        windows, lens = self._split_cache[name]
        return [passkey_window_targets(windows[i: i + bs], lens[i: i + bs]) for i in range(0, len(lens), bs)]

    def evaluate(self, model: Callable[[torch.Tensor], torch.Tensor], split: str = "validation",
                 batch_size: int | None = None) -> dict[str, float]:
        return evaluate_batches(model, self.split(split, batch_size), self.accuracy_level)
