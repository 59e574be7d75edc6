"""Linear attention with a positional encoding (RoFormer eq. 17-19), parallel and recurrent.

    out_t = sum_s (M_t phi(q_t)) . (M_s phi(k_s)) v_s  /  (sum_s phi(q_t) . phi(k_s) + eps)

phi is a non-negative feature map (Katharopoulos et al.'s elu(x) + 1 by default), M_t the encoding's
position-dependent map, applied after the feature map and in the numerator only: RoFormer keeps the
denominator without rotation so that it stays positive (its eq. 19). The sums run over every key (is_causal=False)
or the keys s <= t by sequence index (is_causal=True). How an encoding enters is what it declares in
`linear_form` (encodings/base.py), never its name:

- "identity": M = I (none; absolute encodings act on the embeddings, and attention refuses them).
- "rotation": M_t phi(q_t) = enc.encode_q(phi(q_t), t) (the rope family: a rotation by t * theta).
- "polar": the encoding's own magnitudes are the features, phi = enc.magnitude (PoPE: softplus), and
  M_t phi(q_t) is its Cartesian form enc.encode_q(q_t, t): the numerator is then the real part of PoPE's
  complex inner product, sum_c mu_q mu_k cos((s - t) theta_c + delta_c), and the normaliser
  sum_c mu_q mu_k. feature_map must be None for these.

Encodings that declare None (biases, CoPE) are refused: they change softmax logits, which this has not.

Cost: the causal form runs over chunks of `chunk_size` tokens with a running state S = sum_s (M_s phi(k_s))^T v_s
(E x Dv per head, E = the encoded width) and z = sum_s phi(k_s) (D per head): inside a chunk the pairs are
multiplied directly (chunk x chunk), across chunks through the state. Time O(T (chunk + E) Dv) per head and
memory O(T (E + Dv) + E Dv + chunk^2): never the T x E x Dv prefix sums a cumsum would materialise.
`LinearAttentionState` / `linear_attention_step` are the recurrent form for decoding, one token at a time.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..encodings.base import PositionalEncoding
from ..encodings.registration import warn_if_untrained
from ..util.validate import check_bool, check_int, check_real
from .inputs import deprecated_causal, prepare, refuse_renamed, repeat_kv

FEATURE_MAPS = {
    "elu1": lambda x: F.elu(x) + 1.0,  # Katharopoulos et al. 2020, the map RoFormer names (strictly positive)
    "relu": F.relu,  # non-negative; a query or key of all negative channels gets zero weight (eps then guards)
}
DEFAULT_FEATURE_MAP = "elu1"
DEFAULT_CHUNK = 64  # pairs inside a chunk are multiplied directly: 64 x 64 blocks are cheap GEMMs on CPU
DEFAULT_EPS = 1e-6


def _form(enc: PositionalEncoding) -> str:
    form = enc.linear_form
    if form is None:
        raise ValueError(f"enc: the {enc.kind} encoding {enc.name or type(enc).__name__!r} cannot be used in linear "
                         "attention (it declares no linear_form: biases and contextual encodings change softmax "
                         "logits, which linear attention does not have); use a rope or pope encoding, 'none', or "
                         "softmax attention")
    return form


def _check_feature_map(feature_map, form: str, enc: PositionalEncoding):
    if form == "polar":
        if feature_map is not None:
            raise ValueError(f"feature_map must be None for the polar encoding {enc.name or type(enc).__name__!r}: its "
                             f"own non-negative magnitudes are the features, got {feature_map!r}")
        return enc.magnitude
    name = DEFAULT_FEATURE_MAP if feature_map is None else feature_map
    if name not in FEATURE_MAPS:
        raise ValueError(f"feature_map must be one of {sorted(FEATURE_MAPS)} or None ({DEFAULT_FEATURE_MAP}), "
                         f"got {feature_map!r}")
    return FEATURE_MAPS[name]


def features(q, k, enc, q_positions, k_positions, feature_map=None):
    """(fq, fk, mq, mk): the features phi(q), phi(k) (normaliser) and the mapped features M phi(q), M phi(k)
    (numerator). q (B, H, T, D) -> fq (B, H, T, D), mq (B, H, T, E); k likewise with its own heads."""
    form = _form(enc)
    phi = _check_feature_map(feature_map, form, enc)
    fq, fk = phi(q), phi(k)
    if form == "identity":
        return fq, fk, fq, fk
    if form == "rotation":
        return fq, fk, enc.encode_q(fq, q_positions), enc.encode_k(fk, k_positions)
    return fq, fk, enc.encode_q(q, q_positions), enc.encode_k(k, k_positions)  # polar: Cartesian form of q, k


def _check_options(causal, chunk_size, eps):
    check_bool(causal, "is_causal")
    check_int(chunk_size, "chunk_size", minimum=1)
    check_real(eps, "eps", minimum=0)


def linear_attention(q, k, v, enc: PositionalEncoding, *, feature_map: str | None = None, is_causal: bool = True,
                     q_positions=None, k_positions=None, eps: float = DEFAULT_EPS,
                     chunk_size: int = DEFAULT_CHUNK, **renamed) -> torch.Tensor:
    """(B, H, Tq, Dv): RoFormer's linear attention (eq. 19) with the encoding `enc` (module docstring).

    q (B, H, Tq, D); k, v (B, H_kv, Tk, .) with H_kv dividing H (query head h reads kv head h // (H // H_kv)).
    feature_map: "elu1" (elu(x) + 1, the default when None) or "relu"; None for polar encodings (PoPE), whose
        softplus magnitudes are the features.
    is_causal: key s is visible to query t iff s <= t, by sequence index (needs Tq == Tk); positions enter only
        through the encoding. False: every key. (The former spelling causal= still works, with a
        DeprecationWarning.)
    q_positions, k_positions: as in `poskit.attention` ((T,) or (B, T) ints, default arange; axial encodings:
        (T, n) or (B, T, n)).
    eps: added to the normaliser (> 0 guards a query whose features are all zero, e.g. with relu).
    chunk_size: tokens per chunk of the causal form (a speed knob; the result does not depend on it).
    """
    causal = deprecated_causal("linear_attention", is_causal, renamed, default=True)
    refuse_renamed("linear_attention", renamed)
    _check_options(causal, chunk_size, eps)
    inp = prepare(q, k, v, enc, causal=False, q_positions=q_positions, k_positions=k_positions, scale=None,
                  enable_gqa=True)
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"is_causal=True needs as many queries as keys (the prefix of query t is keys 0..t), got "
                         f"{q.shape[2]} and {k.shape[2]}; decode with linear_attention_step")
    fq, fk, mq, mk = features(q, k, enc, inp.q_positions, inp.k_positions, feature_map)
    warn_if_untrained(enc)
    g = inp.groups
    fk, mk, v = repeat_kv(fk, g), repeat_kv(mk, g), repeat_kv(v, g)
    if not causal:
        num = mq @ (mk.transpose(-1, -2) @ v)  # (B, H, Tq, Dv) through the E x Dv state
        den = fq @ fk.sum(-2).unsqueeze(-1)  # (B, H, Tq, 1)
        return num / (den + eps)
    return _causal_chunks(fq, fk, mq, mk, v, eps, chunk_size)


def _causal_chunks(fq, fk, mq, mk, v, eps, chunk):
    B, H, T, _ = fq.shape
    state = mk.new_zeros(B, H, mk.shape[-1], v.shape[-1])  # sum of (M_s phi(k_s))^T v_s over earlier chunks
    z = fk.new_zeros(B, H, 1, fk.shape[-1])  # sum of phi(k_s) over earlier chunks
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=fq.device).triu(1)  # key after query in a chunk
    outs = []
    # split once rather than slicing per chunk: the backward of a slice writes its gradient into a zero tensor
    # as large as the whole input, which would make the backward O(T^2 / chunk); split's backward is one cat
    pieces = (t.split(chunk, dim=2) for t in (mq, mk, v, fq, fk))
    for mqc, mkc, vc, fqc, fkc in zip(*pieces):
        n = mqc.shape[2]
        pairs = (mqc @ mkc.transpose(-1, -2)).masked_fill(later[:n, :n], 0.0)  # within the chunk
        num = pairs @ vc + mqc @ state
        den = (fqc * (z + fkc.cumsum(-2))).sum(-1, keepdim=True)  # prefix of phi(k) up to each query
        outs.append(num / (den + eps))
        state = state + mkc.transpose(-1, -2) @ vc
        z = z + fkc.sum(-2, keepdim=True)
    return torch.cat(outs, dim=2) if outs else v.new_zeros(B, H, 0, v.shape[-1])


@dataclass
class LinearAttentionState:
    """The recurrent state of causal linear attention after `length` tokens, per (batch, head):
    numerator (B, H, E, Dv) = sum_s (M_s phi(k_s))^T v_s and normaliser (B, H, D) = sum_s phi(k_s). Its size
    does not grow with the length (decoding costs O(E Dv) per token)."""

    numerator: torch.Tensor
    normaliser: torch.Tensor
    length: int = 0


def linear_attention_step(q, k, v, enc: PositionalEncoding, state: LinearAttentionState | None = None, *,
                          positions=None, feature_map: str | None = None, eps: float = DEFAULT_EPS):
    """Decode Tn new tokens causally, one at a time through the recurrent state: returns (out (B, H, Tn, Dv),
    the new state). Equals the rows of `linear_attention(..., is_causal=True)` for the same tokens.

    q (B, H, Tn, D); k, v (B, H_kv, Tn, .); state: from the previous call, None to start; positions: of the
    new tokens ((Tn,) or (B, Tn); axial (Tn, n) or (B, Tn, n)), default state.length + arange(Tn) (required
    for axial encodings). The state passed in is not modified.
    """
    check_real(eps, "eps", minimum=0)
    if state is not None and not isinstance(state, LinearAttentionState):
        raise ValueError(f"state must be a LinearAttentionState or None, got {type(state).__name__}")
    start = 0 if state is None else state.length
    if positions is None and enc.position_coords:
        raise ValueError(f"positions must be given for an encoding with axial_dims: (Tn, {enc.position_coords}) or "
                         f"(B, Tn, {enc.position_coords}) ints, the coordinates of the new tokens")
    if positions is None and isinstance(q, torch.Tensor) and q.dim() == 4:
        positions = torch.arange(start, start + q.shape[2], device=q.device)
    inp = prepare(q, k, v, enc, causal=False, q_positions=positions, k_positions=positions, scale=None,
                  enable_gqa=True)
    fq, fk, mq, mk = features(q, k, enc, inp.q_positions, inp.k_positions, feature_map)
    g = inp.groups
    fk, mk, v = repeat_kv(fk, g), repeat_kv(mk, g), repeat_kv(v, g)
    B, H = q.shape[:2]
    if state is None:
        numerator = mk.new_zeros(B, H, mk.shape[-1], v.shape[-1])
        normaliser = fk.new_zeros(B, H, fk.shape[-1])
    else:
        numerator, normaliser = state.numerator, state.normaliser
        if numerator.shape != (B, H, mk.shape[-1], v.shape[-1]) or normaliser.shape != (B, H, fk.shape[-1]):
            raise ValueError(f"state must come from the same batch, heads and widths: it holds numerator "
                             f"{tuple(numerator.shape)} and normaliser {tuple(normaliser.shape)}, this call needs "
                             f"{(B, H, mk.shape[-1], v.shape[-1])} and {(B, H, fk.shape[-1])}")
    warn_if_untrained(enc)
    outs = []
    for t in range(q.shape[2]):  # the recurrence: add key t to the state, then read it with query t
        numerator = numerator + mk[:, :, t, :, None] * v[:, :, t, None, :]
        normaliser = normaliser + fk[:, :, t]
        num = (mq[:, :, t, None, :] @ numerator).squeeze(-2)  # (B, H, Dv)
        den = (fq[:, :, t] * normaliser).sum(-1, keepdim=True)
        outs.append(num / (den + eps))
    out = torch.stack(outs, dim=2) if outs else v.new_zeros(B, H, 0, v.shape[-1])
    return out, LinearAttentionState(numerator, normaliser, start + q.shape[2])
