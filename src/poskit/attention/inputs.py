"""Validation and normalisation of attention inputs, shared by the reference and the fast paths."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..encodings.base import PositionalEncoding, as_position_tensor, check_real


@dataclass
class AttentionInputs:
    q: torch.Tensor  # (B, H, Tq, D)
    k: torch.Tensor  # (B, Hkv, Tk, D)
    v: torch.Tensor | None  # (B, Hkv, Tk, Dv)
    q_positions: torch.Tensor  # (1|B, Tq) int64
    k_positions: torch.Tensor  # (1|B, Tk) int64
    scale: float
    causal: bool
    key_padding_mask: torch.Tensor | None  # (B, Tk) bool, True = keep
    default_positions: bool = False  # both position tensors were omitted (arange): SDPA's is_causal is exact then

    @property
    def groups(self) -> int:
        return self.q.shape[1] // self.k.shape[1]

    @property
    def has_pairs(self) -> bool:
        """False when there is no query or no key (or no batch row): then there is nothing to encode or score,
        and the encodings' reductions over positions (max, min) would fail on the empty tensors."""
        return self.q.shape[0] > 0 and self.q.shape[2] > 0 and self.k.shape[2] > 0

    def visible(self) -> torch.Tensor:
        """(1|B, 1, Tq, Tk) bool: causal by *position* (key s visible to query t iff pos_s <= pos_t), and padding."""
        qp, kp = self.q_positions, self.k_positions
        if self.causal:
            vis = kp[:, None, None, :] <= qp[:, None, :, None]
        else:
            vis = torch.ones(1, 1, qp.shape[-1], kp.shape[-1], dtype=torch.bool, device=qp.device)
        if self.key_padding_mask is not None:
            vis = vis & self.key_padding_mask[:, None, None, :]
        return vis


# Devices the attention paths compute on. A "meta" tensor has shapes but no values: every path would return
# another meta tensor (or fail deep inside an encoding), never numbers, so it is refused up front.
SUPPORTED_DEVICES = ("cpu", "cuda")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_device(x, name: str) -> None:
    if isinstance(x, torch.Tensor) and x.device.type not in SUPPORTED_DEVICES:
        raise ValueError(f"{name} must be on one of the devices {list(SUPPORTED_DEVICES)}, got a tensor on {x.device}")


def _check4d(x, name: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a 4-d tensor (batch, heads, length, head_dim), got {shape}")
    check_device(x, name)
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating-point tensor ({', '.join(str(d)[6:] for d in FLOAT_DTYPES)}), "
                         f"got dtype {x.dtype}")


def check_scale(scale) -> float:
    """The attention scale: a positive finite number (0 would flatten every softmax row, a negative one invert
    it, and CPU SDPA turns scale=0 into NaN)."""
    return check_real(scale, "scale", minimum=0, strict=True)


def prepare(q, k, v, enc: PositionalEncoding, *, causal, q_positions, k_positions, scale, key_padding_mask=None) -> AttentionInputs:
    _check4d(q, "q")
    _check4d(k, "k")
    B, H, Tq, D = q.shape
    if k.shape[0] != B or k.shape[-1] != D:
        raise ValueError(f"k must have shape ({B}, H_kv, Tk, {D}) to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    Hkv, Tk = k.shape[1], k.shape[2]
    if Hkv == 0 or H % Hkv:  # Hkv == 0 tested first: H % 0 would be a ZeroDivisionError
        allowed = [d for d in range(1, H + 1) if H % d == 0]
        raise ValueError(f"the number of key/value heads H_kv={Hkv} must divide the query heads H={H}; allowed H_kv: {allowed}")
    if v is not None:
        _check4d(v, "v")
        if v.shape[:3] != k.shape[:3]:
            raise ValueError(f"v must have shape ({B}, {Hkv}, {Tk}, Dv) to match k, got {tuple(v.shape)}")
    if D != enc.head_dim:
        raise ValueError(f"q and k must have head_dim={enc.head_dim} channels for this encoding, got {D}")
    if H != enc.num_heads:
        raise ValueError(f"q must have num_heads={enc.num_heads} heads for this encoding, got {H}")
    if k.dtype != q.dtype or (v is not None and v.dtype != q.dtype):
        raise ValueError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {None if v is None else v.dtype}")
    for name, x in (("k", k), ("v", v)):
        if x is not None and x.device != q.device:
            raise ValueError(f"q, k and v must be on one device, got q on {q.device} and {name} on {x.device}")
    check_device(q_positions, "q_positions")
    check_device(k_positions, "k_positions")
    check_device(key_padding_mask, "key_padding_mask")
    qp = as_position_tensor(q_positions, Tq, B, q.device, "q_positions")
    kp = as_position_tensor(k_positions, Tk, B, q.device, "k_positions")
    scale = 1.0 / math.sqrt(D) if scale is None else check_scale(scale)
    if key_padding_mask is not None:
        key_padding_mask = torch.as_tensor(key_padding_mask, device=q.device)
        if key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (B, Tk):
            raise ValueError(f"key_padding_mask must be a bool tensor of shape ({B}, {Tk}) (True = keep), got "
                             f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}")
    default = q_positions is None and k_positions is None
    return AttentionInputs(q, k, v, qp, kp, float(scale), bool(causal), key_padding_mask, default)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, Hkv, T, D) -> (B, Hkv * groups, T, D); query head h reads kv head h // groups (HF repeat_kv order)."""
    if groups == 1:
        return x
    B, Hkv, T, D = x.shape
    return x[:, :, None].expand(B, Hkv, groups, T, D).reshape(B, Hkv * groups, T, D)
