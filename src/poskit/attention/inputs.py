"""Validation and normalisation of attention inputs, shared by the reference and the fast paths."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from ..encodings.base import PositionalEncoding, as_position_tensor, check_real


@dataclass
class AttentionInputs:
    q: torch.Tensor  # (B, H, Tq, D)
    k: torch.Tensor  # (B, Hkv, Tk, D)
    v: torch.Tensor | None  # (B, Hkv, Tk, Dv)
    q_positions: torch.Tensor  # (1|B, Tq) int64; (1|B, Tq, n) for an axial encoding (never causal then)
    k_positions: torch.Tensor  # (1|B, Tk) int64; (1|B, Tk, n) likewise
    scale: float
    causal: bool
    # (B, Tk) bool, True = a real key (attend), False = padding. Internal only: the public API takes SDPA's
    # `attn_mask`; a mask that varies only along the keys is turned into this, which every fast path serves.
    key_padding_mask: torch.Tensor | None
    default_positions: bool = False  # both position tensors were omitted (arange): SDPA's is_causal is exact then
    # any other `attn_mask`, broadcast to 4-d (1|B, 1|H, 1|Tq, 1|Tk): bool (True = attend) or float (added to
    # the logits; -inf hides the pair). Served by the reference and by SDPA with a merged mask only.
    attn_mask: torch.Tensor | None = None
    # k holds no NaN or infinity, checked already: a KV cache checks each append, so that a decode step need not
    # read the whole cache again for it (keys_to_check)
    keys_finite: bool = False

    def keys_to_check(self, k: torch.Tensor | None = None) -> torch.Tensor | None:
        """`k` (default: this call's keys) for a finiteness check, or None where it is this call's keys and they
        are known finite."""
        k = self.k if k is None else k
        return None if self.keys_finite and k is self.k else k

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
            vis = torch.ones(1, 1, qp.shape[1], kp.shape[1], dtype=torch.bool, device=qp.device)  # axial: (., T, n)
        if self.key_padding_mask is not None:
            vis = vis & self.key_padding_mask[:, None, None, :]
        if self.attn_mask is not None:
            vis = vis & (self.attn_mask if self.attn_mask.dtype == torch.bool else self.attn_mask != float("-inf"))
        return vis

    def additive_mask(self) -> torch.Tensor | None:
        """The float `attn_mask` to add to the logits (broadcastable to (B, H, Tq, Tk)), or None."""
        m = self.attn_mask
        return None if m is None or m.dtype == torch.bool else m


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
    if torch._C._functorch.is_batchedtensor(x):
        # torch's own error comes later, from a check that branches on a tensor's value, and names neither
        raise ValueError(f"{name} is batched by torch.func.vmap, which poskit's attention does not run under (it "
                         "checks positions and finite keys by their values): fold the mapped dimension into the "
                         "batch instead, (V * B, heads, length, head_dim)")
    check_device(x, name)
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating-point tensor ({', '.join(str(d)[6:] for d in FLOAT_DTYPES)}), "
                         f"got dtype {x.dtype}")


def check_scale(scale) -> float:
    """The attention scale: a positive finite number (0 would flatten every softmax row, a negative one invert
    it, and CPU SDPA turns scale=0 into NaN)."""
    return check_real(scale, "scale", minimum=0, strict=True)


def prepare(q, k, v, enc: PositionalEncoding, *, causal, q_positions, k_positions, scale, attn_mask=None,
            enable_gqa: bool = True, key_padding_mask=None, keys_finite: bool = False) -> AttentionInputs:
    """Validate and normalise one attention call. `attn_mask` is the public SDPA-style mask (split here into
    a key-padding part and a general part); `key_padding_mask` (B, Tk) bool, True = real key, is the internal
    form the KV cache passes, and `keys_finite` what it knows of its keys. `enable_gqa` False refuses H != H_kv,
    as SDPA does."""
    refuse_absolute(enc)
    _check4d(q, "q")
    _check4d(k, "k")
    B, H, Tq, D = q.shape
    if k.shape[0] != B or k.shape[-1] != D:
        raise ValueError(f"k must have shape ({B}, H_kv, Tk, {D}) to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    Hkv, Tk = k.shape[1], k.shape[2]
    if Hkv == 0 or H % Hkv:  # Hkv == 0 tested first: H % 0 would be a ZeroDivisionError
        allowed = [d for d in range(1, H + 1) if H % d == 0]
        raise ValueError(f"the number of key/value heads H_kv={Hkv} must divide the query heads H={H}; allowed H_kv: {allowed}")
    if Hkv != H and not enable_gqa:
        raise ValueError(f"k and v have H_kv={Hkv} heads and q has H={H}: pass enable_gqa=True for grouped-query "
                         "attention (as F.scaled_dot_product_attention, which otherwise refuses H != H_kv)")
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
    check_device(attn_mask, "attn_mask")
    coords = enc.position_coords  # axial encodings: positions (1|B, T, n)
    if coords and causal:
        raise ValueError(f"is_causal must be False with axial positions (the encoding has {coords} coordinates per "
                         "position, which have no order to be causal by); pass attn_mask for a custom visibility")
    qp = as_position_tensor(q_positions, Tq, B, q.device, "q_positions", coords=coords)
    # one tensor where both are the same (both omitted, or the same tensor given twice, as a decode step does):
    # an encoding then looks its angles up once for q and k (transform_qk), and no second arange is made
    same = k_positions is q_positions and Tk == Tq
    kp = qp if same else as_position_tensor(k_positions, Tk, B, q.device, "k_positions", coords=coords)
    scale = 1.0 / math.sqrt(D) if scale is None else check_scale(scale)
    if key_padding_mask is not None and (not isinstance(key_padding_mask, torch.Tensor)
                                         or key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (B, Tk)):
        raise ValueError(f"the key padding mask must be a bool tensor of shape ({B}, {Tk}) (True = real key), got "
                         f"{getattr(key_padding_mask, 'dtype', type(key_padding_mask).__name__)} "
                         f"{tuple(getattr(key_padding_mask, 'shape', ()))}")
    check_device(key_padding_mask, "key padding mask")
    general = None
    if attn_mask is not None:
        padding, general = split_attn_mask(attn_mask, (B, H, Tq, Tk), q.dtype, q.device)
        if padding is not None:  # both hide keys: a key is real when both say so
            key_padding_mask = padding if key_padding_mask is None else key_padding_mask & padding
    default = q_positions is None and k_positions is None
    return AttentionInputs(q, k, v, qp, kp, float(scale), bool(causal), key_padding_mask, default, general,
                           keys_finite)


def refuse_absolute(enc: PositionalEncoding) -> None:
    """ValueError for an absolute encoding: it enters the model as vectors added to the token embeddings, so
    inside attention it would add nothing, silently."""
    if isinstance(enc, PositionalEncoding) and enc.kind == "absolute":
        name = enc.name or type(enc).__name__
        raise ValueError(f"enc: the absolute encoding {name!r} is added to the token embeddings "
                         "(x + enc.embed(positions)), not inside attention; use the encoding 'none' inside attention "
                         "(poskit.build_encoding('none', head_dim=..., num_heads=...))")


def all_finite(*tensors) -> bool:
    """True when no tensor holds a NaN or an infinity: one sum per tensor (NaN and inf survive a sum), about
    0.2 ms for a 16 MB q on 2 CPU cores, against ~100 ms for the attention itself. A finite sum that overflows
    only sends the call to the slower exact path, never to a wrong answer. Summed in their own dtype where that
    has fp32's exponent range (fp32, fp64, bf16: torch accumulates bf16 in fp32), in fp32 otherwise (fp16 would
    overflow at 65504); an fp32 result asked of a bf16 tensor would first copy it whole. Summed over the last two
    dimensions first: a KV cache's keys are a view with gaps between heads, which torch's whole-tensor bf16 sum
    copies to fp32 first (134 MB and 42 ms at B=8, H=8, 8192 keys, against 1.8 ms this way); a tensor of at most
    SMALL_SUM elements is summed whole, one operation instead of two (a decode step's query, a short call's q).
    The totals are added to each other without a leading 0: every operation costs a few microseconds, which is a
    visible part of a small call's time."""
    def total_of(t: torch.Tensor) -> torch.Tensor:
        if t.dim() >= 2 and t.numel() > SMALL_SUM:
            t = t.sum(dim=(-2, -1)) if t.dtype != torch.float16 else t.sum(dim=(-2, -1), dtype=torch.float32)
        return t.sum() if t.dtype in (torch.float32, torch.float64, torch.bfloat16) else t.sum(dtype=torch.float32)

    total = None
    for t in tensors:
        if t is not None:
            total = total_of(t) if total is None else total + total_of(t)
    return total is None or bool(torch.isfinite(total))


SMALL_SUM = 1 << 14  # elements: a whole-tensor sum of this many copies at most 64 KB where it copies at all


def split_attn_mask(attn_mask, shape: tuple, dtype: torch.dtype, device) -> tuple:
    """Check an SDPA-style `attn_mask` against the logits' `shape` (B, H, Tq, Tk) and split it into
    (key padding mask (B, Tk) bool or None, general 4-d mask or None), exactly one of them set.

    bool: True = attend; float (of q's dtype, as SDPA requires): added to the logits, -inf hides a pair.
    A mask that varies only along the keys (shape (B|1, 1, 1, Tk) once broadcast to 4-d; a float one holding
    only 0 and -inf) is a key padding mask, which every fast path (blocked, Triton) serves; any other mask
    goes to the paths that are exact with it (SDPA with a merged mask, or the reference).
    """
    B, H, Tq, Tk = shape
    if not isinstance(attn_mask, torch.Tensor):
        raise ValueError(f"attn_mask must be a tensor (bool: True = attend; or float: added to the logits), got "
                         f"{type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and attn_mask.dtype != dtype:
        raise ValueError(f"attn_mask must be bool (True = attend) or float of q's dtype {dtype} (added to the "
                         f"logits), as in F.scaled_dot_product_attention; got {attn_mask.dtype}")
    try:
        fits = attn_mask.dim() <= 4 and torch.broadcast_shapes(attn_mask.shape, shape) == torch.Size(shape)
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"attn_mask must be broadcastable to (B, H, Tq, Tk) = {shape}, got {tuple(attn_mask.shape)}")
    mask = attn_mask.to(device).reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    if mask.shape[1] == 1 and mask.shape[2] == 1:
        keys = mask[:, 0, 0, :].expand(B, Tk).contiguous()  # the Triton kernels read it with strides (B, Tk)
        if keys.dtype == torch.bool:
            return keys, None
        hidden = keys == float("-inf")
        # a float padding mask (0 = keep, -inf = pad); not looked for under torch.compile, where reading the
        # values is a graph break: the mask then stays general, which the traced path (traced.py) adds exactly
        if not torch.compiler.is_compiling() and bool(((keys == 0) | hidden).all()):
            return ~hidden, None
    return None, mask


# keywords of poskit.attention that F.scaled_dot_product_attention spells otherwise: refused with the SDPA spelling
_RENAMED = {
    "causal": "causal= is spelt is_causal= (F.scaled_dot_product_attention's name), whose default is False as in "
              "SDPA: pass is_causal=True for causal attention",
    "key_padding_mask": "key_padding_mask= is removed: pass attn_mask=keep[:, None, None, :] with a (B, Tk) bool "
                        "`keep`, True = attend (the opposite of nn.MultiheadAttention's key_padding_mask, "
                        "True = pad: use attn_mask=~key_padding_mask[:, None, None, :] for one of those)",
}


def refuse_renamed(function: str, kwargs: dict) -> None:
    """TypeError for keywords that `function` does not take, naming the replacement of a renamed one."""
    for name in kwargs:
        if name in _RENAMED:
            raise TypeError(f"{function}(): {_RENAMED[name]}")
    if kwargs:
        raise TypeError(f"{function}() got an unexpected keyword argument {next(iter(kwargs))!r}")


def deprecated_causal(function: str, is_causal, kwargs: dict, default: bool | None = None):
    """`is_causal` once the deprecated spelling `causal=` in `kwargs` (popped) is folded in: the old keyword
    still works, with a DeprecationWarning naming the new one. Giving both with different values is refused.
    `default`: is_causal's default (None: is_causal is required, and one of the two must be given)."""
    if "causal" not in kwargs:
        if is_causal is None and default is None:
            raise TypeError(f"{function}() missing the keyword argument 'is_causal'")
        return default if is_causal is None else is_causal
    causal = kwargs.pop("causal")
    warnings.warn(f"{function}(): causal= is deprecated, use is_causal= (F.scaled_dot_product_attention's name)",
                  DeprecationWarning, stacklevel=3)
    if is_causal is not None and is_causal != default and is_causal != causal:
        raise TypeError(f"{function}() got is_causal={is_causal!r} and its deprecated spelling causal={causal!r}: "
                        "give is_causal= only")
    return causal


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, Hkv, T, D) -> (B, Hkv * groups, T, D); query head h reads kv head h // groups (HF repeat_kv order)."""
    if groups == 1:
        return x
    B, Hkv, T, D = x.shape
    return x[:, :, None].expand(B, Hkv, groups, T, D).reshape(B, Hkv * groups, T, D)
