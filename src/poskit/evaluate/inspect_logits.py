"""Print, for every encoding, the logit a fixed query/key pair gets at growing relative distance.

It is the quickest way to see how each encoding shapes attention: decaying (alibi, rope's long-term decay),
oscillating (rope, pope), or flat (none, absolute ones, which act on the embeddings instead).
Run: python -m poskit.evaluate.inspect_logits
"""
from __future__ import annotations

import argparse

import torch

from ..attention import attention_scores
from ..encodings import available_encodings, build_encoding

DEFAULT_OPTIONS = {
    "rope-linear": dict(factor=4.0),
    "rope-ntk": dict(factor=4.0),
    "rope-dynamic": dict(factor=4.0, original_max_positions=256),
    "rope-yarn": dict(factor=4.0, original_max_positions=256),
    "rope-llama3": dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=256),
    # longrope's factors are one per rotated pair: rotary_dim=4 keeps them valid for every --head-dim
    "rope-longrope": dict(rotary_dim=4, short_factor=[1.0, 1.0], long_factor=[1.0, 4.0], factor=4.0, original_max_positions=256),
    "relative": dict(max_distance=1024),
    "relative-capped": dict(max_distance=64),
    "learned": dict(max_positions=1024),
}


def logits_versus_distance(name: str, distances: list[int], head_dim: int = 64, seed: int = 0,
                           x: torch.Tensor | None = None) -> list[float]:
    """The logit (default scale 1/sqrt(head_dim), one head) between a query and a key that both hold the content
    `x` (head_dim,), default randn from `seed`, at each relative distance t - s in `distances`."""
    if x is None:
        x = torch.randn(head_dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    x = torch.as_tensor(x, dtype=torch.float64).reshape(1, 1, 1, head_dim)
    torch.manual_seed(seed)  # the initial values of learned parameters (relative embeddings, pope's delta)
    enc = build_encoding(name, head_dim=head_dim, num_heads=1, dim=head_dim, **DEFAULT_OPTIONS.get(name, {})).double()
    if enc.kind == "absolute":  # added to the embeddings, not inside attention, where a model uses "none"
        enc = build_encoding("none", head_dim=head_dim, num_heads=1).double()
    # the same content at every key and at the query: only position changes the logit
    far = max(distances)
    order = sorted(range(len(distances)), key=lambda i: -distances[i])  # keys in increasing position
    keys = torch.tensor([far - distances[i] for i in order])
    k_all = x.expand(1, 1, len(distances), head_dim)
    row = attention_scores(x, k_all, enc, q_positions=torch.tensor([far]), k_positions=keys,
                           is_causal=True)[0, 0, 0].tolist()
    by_key = dict(zip(order, row))
    return [by_key[i] for i in range(len(distances))]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--distances", default="0,1,2,4,8,16,64,256,1024", help="comma-separated t - s values")
    p.add_argument("--head-dim", type=int, default=64)
    args = p.parse_args(argv)
    distances = [int(d) for d in args.distances.split(",")]
    print(f"{'encoding':16s}" + "".join(f"{d:>9d}" for d in distances))
    for name in available_encodings():
        values = logits_versus_distance(name, distances, args.head_dim)
        print(f"{name:16s}" + "".join(f"{v:9.3f}" for v in values))


if __name__ == "__main__":
    main()
