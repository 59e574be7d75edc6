"""BERT's masked-language-model corruption (Devlin et al. 2019, sec. 3.1 and App. A.1), as one function.

Of each row's eligible positions, ``max(1, round(select_prob * n))`` are chosen uniformly without replacement
(BERT's ``create_pretraining_data`` picks an exact count per sequence rather than a Bernoulli draw per token, so
no row is left without a target). A chosen token becomes ``[MASK]`` with probability ``mask_prob``, a uniformly
random ordinary token with probability ``random_prob``, and stays itself otherwise (80/10/10 by default; a random
token may happen to equal the original one, as in BERT). The loss is taken only at the chosen positions: the
targets are the original tokens there and ``IGNORE_INDEX`` everywhere else.

Every random number comes from the ``generator`` passed in, and the same number of them is drawn whatever the
tokens are, so a batch depends only on the tokens and the generator's state.
"""
from __future__ import annotations

import torch

from ..util.validate import check_real
from .data import IGNORE_INDEX, Batch

__all__ = ["bert_mask", "check_mask_probabilities"]


def check_mask_probabilities(select_prob: float, mask_prob: float, random_prob: float) -> tuple[float, float, float]:
    select_prob = check_real(select_prob, "select_prob", minimum=0.0, maximum=1.0, strict=True)
    mask_prob = check_real(mask_prob, "mask_prob", minimum=0.0, maximum=1.0)
    random_prob = check_real(random_prob, "random_prob", minimum=0.0, maximum=1.0)
    if mask_prob + random_prob > 1.0:
        raise ValueError(f"mask_prob + random_prob must be <= 1 (the rest keeps the token), got "
                         f"{mask_prob} + {random_prob}")
    return select_prob, mask_prob, random_prob


def bert_mask(tokens: torch.Tensor, generator: torch.Generator, *, mask_id: int, ordinary_ids: torch.Tensor,
              eligible: torch.Tensor | None = None, select_prob: float = 0.15, mask_prob: float = 0.8,
              random_prob: float = 0.1) -> Batch:
    """tokens (B, T) int64 -> Batch(inputs = the corrupted tokens, targets = the originals at the chosen positions).

    ordinary_ids: (N,) the ids a random replacement draws from, uniformly. eligible: (B, T) bool, the positions
    that may be chosen (default all; e.g. not document separators); a row with none gets no target."""
    select_prob, mask_prob, random_prob = check_mask_probabilities(select_prob, mask_prob, random_prob)
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise ValueError(f"tokens must be a (B, T) integer tensor, got {getattr(tokens, 'shape', type(tokens).__name__)}")
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if ordinary_ids.dim() != 1 or len(ordinary_ids) == 0:
        raise ValueError(f"ordinary_ids must be a non-empty (N,) tensor of ids, got shape {tuple(ordinary_ids.shape)}")
    B, T = tokens.shape
    if eligible is None:
        eligible = torch.ones(B, T, dtype=torch.bool)
    elif eligible.shape != tokens.shape or eligible.dtype != torch.bool:
        raise ValueError(f"eligible must be a bool tensor of the tokens' shape {(B, T)}, got "
                         f"{eligible.dtype} {tuple(eligible.shape)}")
    # three draws of fixed size, in a fixed order: the selection keys, the replacement kind, the random tokens
    keys = torch.rand(B, T, generator=generator)
    kind = torch.rand(B, T, generator=generator)
    random_tokens = ordinary_ids[torch.randint(len(ordinary_ids), (B, T), generator=generator)]

    n_eligible = eligible.sum(1)
    n_select = torch.where(n_eligible > 0, torch.clamp((n_eligible * select_prob).round().long(), min=1), 0)
    # rank the eligible positions by their key (ineligible ones last); the n_select lowest ranks are chosen
    keys = keys.masked_fill(~eligible, 2.0)
    rank = keys.argsort(1).argsort(1)
    selected = (rank < n_select[:, None]) & eligible

    to_mask = selected & (kind < mask_prob)
    to_random = selected & (kind >= mask_prob) & (kind < mask_prob + random_prob)
    inputs = torch.where(to_mask, torch.full_like(tokens, mask_id), tokens)
    inputs = torch.where(to_random, random_tokens.to(tokens.dtype), inputs)
    targets = torch.where(selected, tokens, torch.full_like(tokens, IGNORE_INDEX))
    return Batch(inputs, targets)
