"""Greedy and beam-search decoding over any incremental scorer.

A scorer ("state") has two methods:

    log_probs(tokens)  tokens (N, 1): the token just appended to each of the N hypotheses -> (N, V) log-probs
                       of the next token (the state remembers the prefixes, e.g. in a KV cache);
    select(index)      keep the hypotheses `index` (N',) int64, in that order (repeats allowed).

`EncoderDecoder.decoder_state` gives one for a model; tests give toy ones. The hypothesis score is
fairseq's length-normalised log-probability, sum(log p) / n ** length_penalty, where n counts the tokens
including EOS (RoFormer, Su et al., arXiv:2104.09864, §4.1, decodes with beam 4 and length penalty 0.6 in
fairseq). A hypothesis that reaches `max_len` tokens without EOS is kept as it is (the length limit ends it).
"""
from __future__ import annotations

import torch

from ..util.validate import check_int, check_real

__all__ = ["beam_search", "greedy_search"]


def _check(batch_size, bos, eos, max_len):
    check_int(batch_size, "batch_size", minimum=1)
    check_int(bos, "bos", minimum=0)
    check_int(eos, "eos", minimum=0)
    check_int(max_len, "max_len", minimum=1)


def greedy_search(state, batch_size: int, *, bos: int, eos: int, max_len: int) -> list[list[int]]:
    """The most likely next token at every step, until EOS or max_len; returns each row's tokens without
    BOS and EOS."""
    _check(batch_size, bos, eos, max_len)
    tokens = torch.full((batch_size, 1), bos, dtype=torch.long)
    finished = torch.zeros(batch_size, dtype=torch.bool)
    out = []
    for _ in range(max_len):
        nxt = state.log_probs(tokens).argmax(-1).cpu()
        nxt = torch.where(finished, torch.full_like(nxt, eos), nxt)  # finished rows only wait for the others
        out.append(nxt)
        finished |= nxt == eos
        if bool(finished.all()):
            break
        tokens = nxt[:, None]
    rows = torch.stack(out, 1).tolist()
    return [r[:r.index(eos)] if eos in r else r for r in rows]


def beam_search(state, batch_size: int, *, bos: int, eos: int, max_len: int, beam_size: int = 4,
                length_penalty: float = 0.6) -> list[list[int]]:
    """The best hypothesis per row (tokens without BOS and EOS) found by a beam of `beam_size`.

    The state starts with `batch_size` rows and is expanded here to batch_size * beam_size. At each step
    every beam's EOS continuation is scored as a finished hypothesis, and the best `beam_size` non-EOS
    continuations of each row stay alive. A row stops once its best finished score is at least the best
    score any live beam could still reach (its log-probability can only fall, and the length divisor is at
    most max_len ** length_penalty), so with a beam as wide as all prefixes the result is the exhaustive
    optimum (tests/test_beam.py)."""
    _check(batch_size, bos, eos, max_len)
    check_int(beam_size, "beam_size", minimum=1)
    alpha = check_real(length_penalty, "length_penalty", minimum=0)
    B, K = batch_size, beam_size
    state.select(torch.arange(B).repeat_interleave(K))
    tokens = torch.full((B * K, 1), bos, dtype=torch.long)
    scores = torch.full((B, K), float("-inf"), dtype=torch.float64)
    scores[:, 0] = 0.0  # one live beam per row at first: the others would duplicate it
    history = torch.zeros(B * K, 0, dtype=torch.long)
    best_score = torch.full((B,), float("-inf"), dtype=torch.float64)
    best: list[list[int]] = [[] for _ in range(B)]
    for t in range(1, max_len + 1):
        lp = state.log_probs(tokens).detach().to("cpu", torch.float64)
        V = lp.shape[-1]
        cand = scores[:, :, None] + lp.view(B, K, V)  # (B, K, V) summed log-probabilities
        if t < max_len:
            ends, last = cand[:, :, eos] / t ** alpha, torch.full((B, K), eos)  # finishing now: t tokens with EOS
        else:  # the length limit ends every hypothesis, with EOS or with its best other token
            ends, last = cand.max(-1)
            ends = ends / t ** alpha
        top, k_best = ends.max(-1)
        for b in (top > best_score).nonzero().flatten().tolist():
            k = int(k_best[b])
            tail = [] if int(last[b, k]) == eos else [int(last[b, k])]
            best_score[b], best[b] = top[b], history[b * K + k].tolist() + tail
        if t == max_len:
            break
        cand[:, :, eos] = float("-inf")
        new_scores, flat = cand.view(B, K * V).topk(K, dim=-1)  # (B, K)
        bound = new_scores.amax(-1) / max_len ** alpha  # the best normalised score a live beam can still reach
        if bool((best_score >= bound).all()):
            break
        origin = (torch.arange(B)[:, None] * K + flat // V).flatten()
        history = torch.cat((history[origin], (flat % V).reshape(-1, 1)), 1)
        state.select(origin)
        tokens, scores = (flat % V).reshape(-1, 1), new_scores
    return best
