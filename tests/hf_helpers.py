"""Shared builders for the tests of poskit.hf (tests/test_hf_*.py)."""
from __future__ import annotations

import torch

from conftest import ENCODING_OPTIONS

VOCAB = 40


def hf_config(encoding="pope", **kw):
    from poskit.hf import PoskitConfig

    base = dict(position_encoding=encoding, position_encoding_options=dict(ENCODING_OPTIONS.get(encoding, {})),
                hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=VOCAB,
                pad_token_id=0)
    base.update(kw)
    return PoskitConfig(**base)


def hf_model(encoding="pope", dtype=torch.float64, seed=0, **kw):
    """dtype None: as built (fp32 weights; some encodings keep float64 frequency buffers, which .to() would cast)."""
    from poskit.hf import PoskitForCausalLM

    torch.manual_seed(seed)
    model = PoskitForCausalLM(hf_config(encoding, **kw))
    return (model if dtype is None else model.to(dtype)).eval()


def left_padded(prompts, pad_id=0):
    """(ids, mask) of 1-D prompts left-padded to the longest."""
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), L, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = p
        mask[i, L - len(p):] = 1
    return ids, mask
