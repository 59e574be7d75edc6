"""T5's relative position bias (Raffel et al.): a learned scalar per head for each bucket of relative
positions, the buckets exact for small distances and logarithmically wider up to max_distance.

The bucketing is Mesh TensorFlow's, which T5 checkpoints were trained with (and Hugging Face's
T5Attention._relative_position_bucket reproduces): the paper describes it in words only.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..util.validate import check_int
from .alibi import bias_dtype, distance
from .base import PositionalEncoding, register
from .kernel_bias import KernelBias, distance_span, distances


def relative_position_bucket(relative_position: torch.Tensor, *, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """The bucket in [0, num_buckets) of each relative position s - t (key minus query, an int tensor).

    bidirectional: half the buckets for keys at or before the query, half (offset by num_buckets // 2) for
    keys after it. Otherwise (causal) every key after the query shares bucket 0 with distance 0. Of the n
    buckets of one direction, distances below n // 2 have one bucket each; larger ones share
    n // 2 + floor(log(r / (n // 2)) / log(max_distance / (n // 2)) * (n - n // 2)) buckets, capped at n - 1,
    so every distance from max_distance on lands in the last one. The log is taken in float64 (Mesh
    TensorFlow and Hugging Face use float32; the buckets agree, tests/test_peers_newenc.py).
    """
    n = num_buckets
    offset = torch.zeros_like(relative_position)
    if bidirectional:
        n //= 2
        offset = (relative_position > 0).long() * n
        r = relative_position.abs()
    else:
        r = (-relative_position).clamp(min=0)
    exact = n // 2
    # (distances below `exact` take the other branch; the clamp keeps log away from 0 there)
    ratio = r.clamp(min=exact).double() / exact
    wide = exact + (torch.log(ratio) / math.log(max_distance / exact) * (n - exact)).long()
    return offset + torch.where(r < exact, r, wide.clamp(max=n - 1))


@register("t5")
class T5RelativeBias(PositionalEncoding):
    """T5 relative position bias: logit(t, s) = scale * q_t . k_s + b[h, bucket(s - t)].

    b is a learned (num_buckets, num_heads) table; bucket() is Mesh TensorFlow's log bucketing
    (`relative_position_bucket`): distances below n/2 exact, then logarithmically wider buckets up to
    max_distance, beyond which all share the last (n = num_buckets, or num_buckets / 2 per direction when
    bidirectional). bidirectional=True (T5's encoder) tells keys before and after the query apart;
    bidirectional=False (T5's decoder, causal) gives all num_buckets to the keys at or before the query.
    The bias is added unscaled, as in T5. Unlike T5, which computes the table in its first layer and shares it
    with the others, poskit's models give each layer its own table. The bias reads positions alone; a trained
    table takes the blocked learned-bias path on CPU.

    Paper: Raffel, Shazeer, Roberts, Lee, Narang, Matena, Zhou, Li, Liu, "Exploring the Limits of Transfer
    Learning with a Unified Text-to-Text Transformer" (arXiv 1910.10683, section 2.1, "Position embeddings");
    the bucketing as in Mesh TensorFlow and Hugging Face's T5Attention.

    Options (defaults):
        num_buckets=32: buckets per head (T5's 32).
        max_distance=128: the distance from which all share the last bucket (T5's 128).
        bidirectional=True: separate buckets for keys after the query (encoder); False for causal decoders.
        init_std=None: standard deviation of the normal initialisation of the table; None is
            (num_heads * head_dim)^-0.5, Hugging Face T5's d_model^-0.5 for d_model = num_heads * head_dim.
    """
    kind = "bias"
    bias_reads_q = False  # a table of positions: q is not read

    def __init__(self, *, head_dim: int, num_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True, init_std: float | None = None):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        # max_distance and init_std are range-checked by build_encoding (base.OPTION_CHECKS)
        # each direction needs at least one exact and one logarithmic bucket
        check_int(num_buckets, "num_buckets", minimum=4 if bidirectional else 2)
        exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
        if max_distance <= exact:
            raise ValueError(f"max_distance must be > {exact} (the distances with a bucket each, half of "
                             f"{'num_buckets // 2' if bidirectional else 'num_buckets'}), got {max_distance}")
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bool(bidirectional)
        std = (num_heads * head_dim) ** -0.5 if init_std is None else init_std
        self.table = nn.Parameter(torch.randn(num_buckets, num_heads) * std)  # row: bucket, column: head

    def buckets(self, q_positions, k_positions) -> torch.Tensor:
        """(1|B, Tq, Tk) bucket of every query/key pair."""
        return relative_position_bucket(-distance(q_positions, k_positions)[:, 0], bidirectional=self.bidirectional,
                                        num_buckets=self.num_buckets, max_distance=self.max_distance)

    def bias(self, q, q_positions, k_positions, scale):
        values = self.table.to(bias_dtype(q.dtype))[self.buckets(q_positions, k_positions)]  # (1|B, Tq, Tk, H)
        return values.permute(0, 3, 1, 2)

    def kernel_bias(self, q_positions, k_positions):
        """The table's column per distance t - s that occurs (encodings/kernel_bias.py): (H, R)."""
        span = distance_span(q_positions, k_positions)
        if span is None:
            return None
        d = distances(*span, q_positions.device)
        buckets = relative_position_bucket(-d, bidirectional=self.bidirectional, num_buckets=self.num_buckets,
                                           max_distance=self.max_distance)
        return KernelBias("distance_table", self.table.to(torch.float32)[buckets].T.contiguous(), span[0])

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
                f"bidirectional={self.bidirectional}")
