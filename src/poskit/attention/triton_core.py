"""What the fused PoPE and CoPE Triton kernels share.

Host side: the optional triton import, the q/k/v argument checks, the interpreter/device check and the launch
set-up (dimensions, padded block widths, tl.dot operand dtype and precision). Device side: the @triton.jit
pieces of a FlashAttention-style loop over key tiles (tile loads, the visibility mask of a tile, the online
softmax update).

Names used by both kernel modules:
  B, H, Hkv, Tq, Tk   batch, query heads, kv heads, query and key lengths; GROUP = H // Hkv query heads per
                      kv head (Hugging Face repeat_kv order: query head h reads kv head h // GROUP)
  BLOCK_M, BLOCK_N    query rows and key rows of a tile; BLOCK_D / BLOCK_DV the padded head dims
  s<x>_<axis>         strides, e.g. sq_b, sq_h, sq_t, sq_d: q's batch, head, time and channel strides;
                      sqp_* / skp_* query / key positions, spad_* the key padding mask
  HAS_PAD, KPAD       a key padding mask is given (nonzero = keep)
  LSE                 per-row log-sum-exp saved by the forward
  DSUM                rowsum(o * dO), the backward's per-row correction of dP (FlashAttention's D_i)
  PRECISION           tl.dot input_precision: "ieee", or None for the backend default
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

try:  # triton is an optional dependency
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None
    HAS_TRITON = False

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# log2(e): kernels that run their softmax in base 2 (tl.exp2) fold it into the logit scale
LOG2E = 1.4426950408889634


def next_pow2(n: int, lo: int = 16) -> int:
    """The smallest power of two >= n, at least lo (tl.arange and tl.dot need power-of-two widths >= 16)."""
    return max(lo, 1 << (max(int(n), 1) - 1).bit_length())


# ---------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------
def check_qkv(q, k, v) -> None:
    """q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv) of one supported dtype, H % Hkv == 0."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (B, heads, T, dim), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}.dtype must be one of float32, float16, bfloat16, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, Tq, D = q.shape
    Bk, Hkv, Tk, Dk = k.shape
    if Bk != B or v.shape[0] != B:
        raise ValueError(f"batch sizes of q, k, v must match, got {B}, {Bk}, {v.shape[0]}")
    if Dk != D:
        raise ValueError(f"k head dim must equal q head dim D={D}, got {Dk}")
    if tuple(v.shape[1:3]) != (Hkv, Tk):
        raise ValueError(f"v must have shape (B, Hkv={Hkv}, Tk={Tk}, Dv), got {tuple(v.shape)}")
    if Hkv < 1 or H % Hkv != 0:
        raise ValueError(f"number of query heads H={H} must be divisible by number of kv heads Hkv={Hkv}")
    if Tq < 1 or Tk < 1:
        raise ValueError(f"sequence lengths must be >= 1, got Tq={Tq}, Tk={Tk}")


def check_position_shape(name: str, p, T: int, B: int) -> None:
    """Positions are (T,) (shared), (1, T) (shared, the engine's layout) or (B, T)."""
    if tuple(p.shape) not in ((T,), (1, T), (B, T)):
        raise ValueError(f"{name} must have shape ({T},) or (1, {T}) or ({B}, {T}), got {tuple(p.shape)}")


def is_interpreted(kernel) -> bool:
    """Whether `kernel` was built for the Triton interpreter (TRITON_INTERPRET=1 was set when its module was
    imported), i.e. whether it can run on CPU tensors. Triton decides this when it decorates the kernel, so
    the environment variable read later would not tell."""
    return HAS_TRITON and type(kernel).__name__ == "InterpretedFunction"


def check_runnable(q: torch.Tensor, interpreted: bool, op: str, module: str) -> None:
    if not HAS_TRITON:
        raise ImportError(f"{op} requires triton (pip install 'poskit[triton]')")
    if q.device.type == "cpu" and not interpreted:
        raise RuntimeError(f"{op} on CPU tensors needs the Triton interpreter: set TRITON_INTERPRET=1 before "
                           f"{module} is first imported")


# ---------------------------------------------------------------------------
# launch set-up
# ---------------------------------------------------------------------------
def dot_operands(dtype: torch.dtype, device: torch.device, *, tf32: bool = False):
    """(triton dtype the tiles are cast to before tl.dot, its input_precision).

    The interpreter's bf16 tl.dot is wrong, so bf16 tiles are upcast to fp32 off CUDA and multiplied in IEEE
    precision. fp32 multiplies in IEEE precision unless tf32 is allowed (and the tensors are on CUDA); half
    inputs use the backend default (None)."""
    if dtype == torch.bfloat16 and device.type != "cuda":
        return tl.float32, "ieee"
    dot = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]
    if dtype == torch.float32 and not (tf32 and device.type == "cuda"):
        return dot, "ieee"
    return dot, None


@dataclass(frozen=True)
class Launch:
    """Dimensions and tl.dot settings of one kernel launch."""
    B: int
    H: int
    Hkv: int
    Tq: int
    Tk: int
    D: int
    Dv: int
    dot_dtype: object
    precision: object

    @property
    def group(self) -> int:
        return self.H // self.Hkv

    @property
    def block_d(self) -> int:
        return next_pow2(self.D)

    @property
    def block_dv(self) -> int:
        return next_pow2(self.Dv)


def launch_setup(q, k, v, *, interpreted: bool, op: str, module: str, tf32: bool = False) -> Launch:
    """Checks that the kernels can run on q's device and collects what every launch needs."""
    check_runnable(q, interpreted, op, module)
    B, H, Tq, D = q.shape
    dot_dtype, precision = dot_operands(q.dtype, q.device, tf32=tf32)
    return Launch(B, H, k.shape[1], Tq, k.shape[2], D, v.shape[3], dot_dtype, precision)


# ---------------------------------------------------------------------------
# @triton.jit helpers
# ---------------------------------------------------------------------------
if HAS_TRITON:
    # the same log2(e) inside kernels: Triton reads a module-level constant only as a constexpr
    LOG2E_JIT = tl.constexpr(LOG2E)

    @triton.jit
    def tile_ranges(pid, BLOCK_OWN: tl.constexpr, BLOCK_WALK: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_DV: tl.constexpr):
        """Index ranges of a program: the BLOCK_OWN rows it owns (block pid), the rows of one of the tiles it
        walks over (offsets from the tile's start), and the channels of q/k and of v."""
        return (pid * BLOCK_OWN + tl.arange(0, BLOCK_OWN), tl.arange(0, BLOCK_WALK), tl.arange(0, BLOCK_D),
                tl.arange(0, BLOCK_DV))

    @triton.jit
    def load_tile(ptr, offs_r, offs_c, s_r, s_c, r_ok, c_ok):
        """The (rows, cols) tile at ptr with the given strides; 0 outside r_ok x c_ok."""
        return tl.load(ptr + offs_r[:, None] * s_r + offs_c[None, :] * s_c,
                       mask=r_ok[:, None] & c_ok[None, :], other=0.0)

    @triton.jit
    def visible_keys(valid, qpos, KPOS, KPAD, offs_n, n_ok, skp_t, spad_t,
                     CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr):
        """valid narrowed to the (query, key) entries where the key is visible: at a position <= the query's
        (causal) and not padding."""
        if CAUSAL:
            kpos = tl.load(KPOS + offs_n * skp_t, mask=n_ok, other=0)
            valid = valid & (kpos[None, :] <= qpos[:, None])
        if HAS_PAD:
            pad = tl.load(KPAD + offs_n * spad_t, mask=n_ok, other=0)
            valid = valid & (pad != 0)[None, :]
        return valid

    @triton.jit
    def online_softmax_step(m_i, l_i, s, EXP2: tl.constexpr):
        """One key tile of the online softmax: from the running row max m_i and sum l_i and the tile's logits
        s (-inf where masked), the tile's unnormalised probabilities p, the factor alpha that rescales what
        was accumulated so far, and the new sum and max. A row with no visible key yet keeps max -inf and
        p = 0 (exp of -inf against 0, not NaN). EXP2: the logits are in base 2 (scaled by log2(e))."""
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        if EXP2:
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
        else:
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        return p, alpha, l_i, m_new
