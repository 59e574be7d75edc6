"""Scoring passkey retrieval (prompts of :mod:`poskit.tasks.passkey`) on a decoder: per prompt, the key decoded
greedily after the prompt, exact match, per-digit accuracy and the key's log-probability under teacher forcing;
over a grid of prompt lengths and key depths, accuracy per cell (the needle-in-a-haystack heat map of
:func:`poskit.report.passkey.plot_passkey`).

    >>> from poskit.training import load_run                      # any decoder run on a text LM task
    >>> model, task, cfg = load_run("runs/demo-rope")
    >>> result = passkey_grid(model, task, lengths=[64, 128, 256], depths=[0, 0.25, 0.5, 0.75, 1], trials=20)
    >>> result["accuracy"][1][2]                                # exact-match accuracy at length 128, depth 0.5
    >>> plot_passkey(result, "passkey.png", context=64)         # from poskit.report.passkey
    >>> json.dump(result, open("results.json", "w"))            # every value is JSON-able

Definitions:

* ``length`` (of a grid cell) counts the positions the model reads while it answers: the prompt and the key's tokens
  but the last, as in a training window of that context, so a model trained at context C is scored at 1x with
  ``length = C`` without reading a position it was not trained on (the prompt is ``length + 1 - len(key tokens)``
  tokens).  ``answer_in_length=False`` makes ``length`` the prompt's own length instead (the papers' convention at
  thousands of tokens, where the 4 extra positions do not matter; at a 64-token context they are 6 %);
* greedy decoding: the argmax token, as many tokens as the key has, through the model's KV cache for a poskit
  decoder (the prompt is encoded once; teacher forcing then runs beside greedy decoding as extra batch rows of the
  same cache), or by re-running the whole sequence for any other ``model(tokens) -> logits`` callable;
* ``exact``: the generated tokens are the key's tokens; ``digit_accuracy``: the fraction of the 5 key digits that
  the decoded generation has at the same place;
* ``key_logprob``: log p(key | prompt) in nats, the sum over the key's tokens under teacher forcing.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from poskit.attention import KVCache
from poskit.models import Transformer
from poskit.tasks.passkey import KEY_PREFIX, KEY_SUFFIX, QUESTION, PasskeyGenerator, PasskeyPrompt, corpus_label
from poskit.util.validate import check_bool, check_int, check_real

__all__ = ["score_passkeys", "passkey_grid", "summarize_trials"]


def _device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


def _cacheable(model) -> bool:
    return isinstance(model, Transformer) and model.config.causal


def _masked(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # a shorter key's padding scores 0, even where its stand-in token has probability 0 (-inf * 0 would be nan)
    return torch.where(mask.bool(), scores, torch.zeros_like(scores))


@torch.no_grad()
def _decode_cached(model: Transformer, prompts: torch.Tensor, answers: torch.Tensor, mask: torch.Tensor):
    """Greedy tokens (B, n) and teacher-forced log-probabilities (B, n) of `answers`, with one prefill of the
    prompts: after it the cache is duplicated, rows B.. follow the answers while rows ..B follow greedy tokens."""
    B, n = answers.shape
    cache = KVCache(len(model.blocks), max_length=prompts.shape[1] + n)
    logp = torch.log_softmax(model(prompts, cache=cache)[:, -1].float(), -1)  # (B, V)
    greedy, scores = [logp.argmax(-1)], [logp.gather(1, answers[:, :1]).squeeze(1)]
    if n > 1:
        cache.select_batch(torch.cat((torch.arange(B), torch.arange(B))))
    for i in range(1, n):
        step = torch.cat((greedy[-1], answers[:, i - 1]))[:, None]  # (2B, 1)
        logp = torch.log_softmax(model(step, cache=cache)[:, -1].float(), -1)  # (2B, V)
        greedy.append(logp[:B].argmax(-1))
        scores.append(logp[B:].gather(1, answers[:, i: i + 1]).squeeze(1))
    return torch.stack(greedy, 1), _masked(torch.stack(scores, 1), mask)


@torch.no_grad()
def _decode_full(model: Callable, prompts: torch.Tensor, answers: torch.Tensor, mask: torch.Tensor):
    """The same as `_decode_cached` by whole-sequence forward passes: one teacher-forced pass, n greedy ones."""
    B, n = answers.shape
    L = prompts.shape[1]
    logits = model(torch.cat((prompts, answers[:, :-1]), 1))[:, L - 1:].float()  # (B, n, V)
    scores = _masked(torch.log_softmax(logits, -1).gather(2, answers[:, :, None]).squeeze(2), mask)
    out = prompts
    for _ in range(n):
        out = torch.cat((out, model(out)[:, -1].float().argmax(-1, keepdim=True)), 1)
    return out[:, L:], scores


def score_passkeys(model, prompts: Sequence[PasskeyPrompt], decode: Callable, *, batch_size: int = 16,
                   use_cache: bool | None = None) -> list[dict]:
    """Score each prompt: ``{"key", "generated", "exact", "digits_correct", "digit_accuracy", "key_logprob"}``.

    ``model`` is a poskit decoder or any ``model(tokens (B, T)) -> logits (B, T, V)``; ``decode(ids) -> str`` is the
    task's (``task.decode`` or :class:`PasskeyGenerator`'s); ``use_cache`` None: the KV cache when the model is a
    causal poskit decoder.  Prompts of equal length are batched together, ``batch_size`` at a time."""
    batch_size = check_int(batch_size, "batch_size", minimum=1)
    if use_cache is None:
        use_cache = _cacheable(model)
    elif check_bool(use_cache, "use_cache") and not _cacheable(model):
        raise ValueError("use_cache=True needs a causal poskit decoder (a Transformer with causal=True); other models "
                         "are scored with use_cache=False (whole-sequence passes)")
    device = _device(model)
    was_training = getattr(model, "training", False)
    if isinstance(model, torch.nn.Module):
        model.eval()
    out: list[dict | None] = [None] * len(prompts)
    try:
        by_length: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            by_length.setdefault(len(p.tokens), []).append(i)
        for rows in by_length.values():
            for start in range(0, len(rows), batch_size):
                chunk = rows[start: start + batch_size]
                n = max(len(prompts[i].answer) for i in chunk)
                answers = torch.zeros(len(chunk), n, dtype=torch.long)
                mask = torch.zeros(len(chunk), n)
                for r, i in enumerate(chunk):
                    a = prompts[i].answer
                    answers[r, : len(a)] = torch.from_numpy(a)
                    mask[r, : len(a)] = 1
                tokens = torch.from_numpy(np.stack([prompts[i].tokens for i in chunk])).to(device)
                decoder = _decode_cached if use_cache else _decode_full
                greedy, scores = decoder(model, tokens, answers.to(device), mask.to(device))
                greedy, scores = greedy.cpu(), scores.double().sum(1).cpu()
                for r, i in enumerate(chunk):
                    p, k = prompts[i], len(prompts[i].answer)
                    text = decode(greedy[r, :k].tolist())
                    digits = sum(a == b for a, b in zip(text, p.key))
                    out[i] = {"key": p.key, "generated": text, "exact": bool(torch.equal(greedy[r, :k],
                                                                                            answers[r, :k])),
                              "digits_correct": digits, "digit_accuracy": digits / len(p.key),
                              "key_logprob": float(scores[r])}
    finally:
        if isinstance(model, torch.nn.Module):
            model.train(was_training)
    return out  # type: ignore[return-value]


def summarize_trials(scores: Sequence[dict]) -> dict:
    """Accuracy (exact match), per-digit accuracy and mean key log-probability over scored prompts."""
    n = len(scores)
    return {"accuracy": sum(s["exact"] for s in scores) / n,
            "digit_accuracy": sum(s["digit_accuracy"] for s in scores) / n,
            "key_logprob": sum(s["key_logprob"] for s in scores) / n, "trials": n}


def _check_list(values, name: str, check) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, np.ndarray)) or len(values) == 0:
        raise ValueError(f"{name} must be a non-empty list, got {values!r}")
    out = [check(v) for v in values]
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must not repeat a value, got {list(values)!r}")
    return out


def passkey_grid(model, task, lengths: Sequence[int], depths: Sequence[float], trials: int = 10, seed: int = 0, *,
                 split: str = "test", batch_size: int = 16, use_cache: bool | None = None,
                 answer_in_length: bool = True, record_trials: bool = False) -> dict:
    """Passkey accuracy of ``model`` per (prompt length, key depth): ``trials`` prompts per cell over the held-out
    ``split`` of ``task`` (a language-modelling task over text, or the ``passkey`` task), the same prompts for every
    model given the same ``seed``.  ``lengths`` count the key's tokens but the last (see the module docstring;
    ``answer_in_length=False``: the prompts' own lengths).  Everything is validated before any prompt is scored.

    Returns a JSON-able dict: ``lengths``, ``depths``, ``trials``, ``seed``, ``split``, ``corpus``, ``format``,
    ``answer_in_length``;
    ``accuracy``, ``digit_accuracy`` and ``key_logprob`` as [length][depth] matrices; ``by_length`` (rows with the
    means over depths); ``mean_accuracy``; ``cells`` (one row per cell, with each trial's scores under ``scores``
    when ``record_trials``)."""
    lengths = _check_list(lengths, "lengths", lambda v: check_int(v, "lengths", minimum=1))
    depths = _check_list(depths, "depths", lambda v: check_real(v, "depths", minimum=0.0, maximum=1.0))
    trials = check_int(trials, "trials", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    check_int(batch_size, "batch_size", minimum=1)
    check_bool(record_trials, "record_trials")
    check_bool(answer_in_length, "answer_in_length")
    if use_cache is not None:
        check_bool(use_cache, "use_cache")
    gen = PasskeyGenerator(task, split)
    minimum = gen.min_length + (4 if answer_in_length else 0)  # + the key's tokens the model reads (prompts checks)
    short = [L for L in lengths if L < minimum]
    if short:
        raise ValueError(f"lengths must be at least {minimum} tokens of {gen.label} for the passkey format, "
                         f"got {short}")
    prompts = {(L, d): gen.prompts(L, d, trials, seed, answer_in_length=answer_in_length)
               for L in lengths for d in depths}  # all built (and checked), then scored
    cells = []
    for (L, d), ps in prompts.items():
        scored = score_passkeys(model, ps, gen.decode, batch_size=batch_size, use_cache=use_cache)
        cell = {"length": L, "depth": d, **summarize_trials(scored)}
        if record_trials:
            cell["scores"] = [dict(s, key_start=p.key_start) for s, p in zip(scored, ps)]
        cells.append(cell)
    matrix = {k: [[c[k] for c in cells[i * len(depths): (i + 1) * len(depths)]] for i in range(len(lengths))]
              for k in ("accuracy", "digit_accuracy", "key_logprob")}
    return {
        "corpus": corpus_label(task), "split": split, "seed": seed, "trials": trials,
        "answer_in_length": answer_in_length,
        "format": {"key_line": KEY_PREFIX + "{key}" + KEY_SUFFIX, "question": QUESTION},
        "lengths": lengths, "depths": depths, **matrix,
        "by_length": [{"length": L, **{k: float(np.mean(matrix[k][i])) for k in matrix}}
                      for i, L in enumerate(lengths)],
        "mean_accuracy": float(np.mean(matrix["accuracy"])),
        "cells": cells,
    }
