"""GLUE (Wang et al. 2018) for fine-tuning an MLM-pretrained encoder (RoFormer, paper 002, sec. 4.3 / Table 2).

Read with the ``datasets`` package (the data extra): ``data`` is a directory written by
``DatasetDict.save_to_disk`` (no network) or a hub name, by default ``nyu-mll/glue`` with the task as its
configuration (the user's network and Hugging Face cache), or ``word-order``: an offline stand-in in CoLA's
format built from the Wikipedia extract (tasks/word_order.py). Each task's text columns, label count, evaluation
split and metrics are in :data:`GLUE_TASKS`. A sentence pair is joined with the pretrained task's
end-of-document token between the two texts (the encoder has no [SEP]); texts longer than ``max_length`` tokens
are cut to it and counted (``truncated`` in the results), as BERT's fine-tuning cuts at 512.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..util.validate import check_choice, check_int

__all__ = ["GlueSpec", "GLUE_TASKS", "DEFAULT_GLUE_SOURCE", "EncodedSplit", "load_glue", "encode_split",
           "glue_metrics"]

DEFAULT_GLUE_SOURCE = "nyu-mll/glue"


@dataclass(frozen=True)
class GlueSpec:
    columns: tuple  # one text column, or two (a sentence pair)
    num_labels: int  # 1: regression (STS-B)
    eval_split: str  # the split the paper reports (GLUE's test labels are hidden)
    metrics: tuple  # what glue_metrics reports; the first is the headline


# the six tasks of RoFormer's Table 2, and the other GLUE classification tasks
GLUE_TASKS: dict[str, GlueSpec] = {
    "sst2": GlueSpec(("sentence",), 2, "validation", ("accuracy",)),
    "mrpc": GlueSpec(("sentence1", "sentence2"), 2, "validation", ("f1", "accuracy")),
    "qnli": GlueSpec(("question", "sentence"), 2, "validation", ("accuracy",)),
    "stsb": GlueSpec(("sentence1", "sentence2"), 1, "validation", ("spearman", "pearson")),
    "qqp": GlueSpec(("question1", "question2"), 2, "validation", ("f1", "accuracy")),
    "mnli": GlueSpec(("premise", "hypothesis"), 3, "validation_matched", ("accuracy",)),
    "cola": GlueSpec(("sentence",), 2, "validation", ("matthews", "accuracy")),
    "rte": GlueSpec(("sentence1", "sentence2"), 2, "validation", ("accuracy",)),
    "wnli": GlueSpec(("sentence1", "sentence2"), 2, "validation", ("accuracy",)),
}


def load_glue(task: str, data: str | None = None):
    """The DatasetDict of GLUE ``task``: from the saved directory ``data`` (``hf:`` prefix allowed), or the hub
    dataset ``data`` (default nyu-mll/glue) with configuration ``task``."""
    check_choice(task, "task", list(GLUE_TASKS))
    from .word_order import WORD_ORDER, word_order_dataset

    if data == WORD_ORDER:  # the offline stand-in, in CoLA's format
        if task != "cola":
            raise ValueError(f"data {WORD_ORDER!r} is a single-sentence acceptability task in CoLA's format: use it "
                             f"with --task cola, not {task!r}")
        return word_order_dataset()
    try:
        import datasets
    except ModuleNotFoundError:
        raise ValueError("GLUE is read with the datasets package: pip install -c constraints.txt -e '.[data]'") \
            from None
    name = (data or DEFAULT_GLUE_SOURCE).removeprefix("hf:")
    local = Path(name)
    try:
        if local.is_dir():
            loaded = datasets.load_from_disk(str(local))
        elif name.startswith(("/", ".")) or local.exists():
            raise ValueError(f"data {name!r} is not a directory written by DatasetDict.save_to_disk")
        else:
            loaded = datasets.load_dataset(name, task)
    except ValueError:
        raise
    except Exception as e:  # whatever datasets raises (missing files, network, format): name the source
        raise ValueError(f"cannot read GLUE {task!r} from data {name!r}: {type(e).__name__}: {e}") from None
    spec = GLUE_TASKS[task]
    for split in ("train", spec.eval_split):
        if split not in loaded:
            raise ValueError(f"data {name!r} has no {split!r} split for GLUE {task!r} (splits: {list(loaded)})")
        missing = [c for c in (*spec.columns, "label") if c not in loaded[split].column_names]
        if missing:
            raise ValueError(f"data {name!r} split {split!r} lacks the columns {missing} of GLUE {task!r} "
                             f"(columns: {loaded[split].column_names})")
    return loaded


@dataclass
class EncodedSplit:
    """Token ids per example (a list of int64 arrays), labels (N,) and how many examples were cut."""

    ids: list
    labels: torch.Tensor
    truncated: int

    def batches(self, batch_size: int, pad_id: int = 0, order: np.ndarray | None = None):
        """(tokens (B, T), attention_mask (B, T) bool, labels (B,)) batches, right-padded to each batch's longest."""
        order = np.arange(len(self.ids)) if order is None else order
        for i in range(0, len(order), batch_size):
            rows = order[i: i + batch_size]
            width = max(len(self.ids[r]) for r in rows)
            tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
            mask = torch.zeros(len(rows), width, dtype=torch.bool)
            for j, r in enumerate(rows):
                tokens[j, : len(self.ids[r])] = torch.from_numpy(self.ids[r])
                mask[j, : len(self.ids[r])] = True
            yield tokens, mask, self.labels[torch.as_tensor(rows)]


def encode_split(rows, spec: GlueSpec, encode_text, separator: int, max_length: int) -> EncodedSplit:
    """Encode the examples of one split with ``encode_text(str) -> int64 ids``; pairs are joined by ``separator``."""
    max_length = check_int(max_length, "max_length", minimum=2)
    ids, truncated = [], 0
    columns = [rows[c] for c in spec.columns]
    for texts in zip(*columns):
        parts = [encode_text(t) for t in texts]
        joined = parts[0] if len(parts) == 1 else np.concatenate([parts[0], [separator], parts[1]])
        if len(joined) > max_length:
            truncated += 1
            joined = joined[:max_length]
        if len(joined) == 0:  # an empty text still needs one token for the pooled representation
            joined = np.array([separator])
        ids.append(np.asarray(joined, dtype=np.int64))
    dtype = torch.float32 if spec.num_labels == 1 else torch.long
    return EncodedSplit(ids, torch.tensor(list(rows["label"]), dtype=dtype), truncated)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, tied values sharing their mean rank (Spearman's convention)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for value in np.unique(x):
        tied = x == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def glue_metrics(spec: GlueSpec, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Predicted classes (or scores for STS-B) against labels: the task's metrics, as GLUE defines them."""
    out: dict[str, float] = {}
    if spec.num_labels == 1:
        out["pearson"] = float(np.corrcoef(predictions, labels)[0, 1])
        out["spearman"] = float(np.corrcoef(_ranks(predictions), _ranks(labels))[0, 1])
        return out
    out["accuracy"] = float((predictions == labels).mean())
    tp = float(((predictions == 1) & (labels == 1)).sum())
    fp = float(((predictions == 1) & (labels != 1)).sum())
    fn = float(((predictions != 1) & (labels == 1)).sum())
    tn = float(((predictions != 1) & (labels != 1)).sum())
    if "f1" in spec.metrics:
        out["f1"] = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
    if "matthews" in spec.metrics:
        denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
        out["matthews"] = float((tp * tn - fp * fn) / denominator) if denominator else 0.0
    return out
