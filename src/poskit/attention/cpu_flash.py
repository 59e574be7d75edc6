"""Opt-in compiled CPU attention for q/k wider than v (PoPE's 2d-wide Cartesian q/k): cpu_flash.cpp.

Enabled by the environment variable POSKIT_CPU_KERNEL=1 (read at every call; "0" or unset: off). The C++
source is compiled on first use with torch.utils.cpp_extension (g++ and ninja; cached in torch's extension
directory, TORCH_EXTENSIONS_DIR) and linked against the MKL GEMMs inside libtorch_cpu. When it cannot be built
or loaded (no compiler, no ninja, a torch without MKL), a warning says why once and every call keeps its
usual path: enabling it never turns a working call into an error. The build targets the CPU it runs on
(-march=native, for the vectorised exp): give each CPU type its own TORCH_EXTENSIONS_DIR if one cache directory
is shared between machines.

Why: CPU SDPA's flash kernel needs equal q/k and v head dims, so PoPE pays for v zero-padded to 2d (4 of its
GEMM widths instead of 3 in the forward); this kernel multiplies q/k at 2d and v at d in cache-sized tiles,
with an online softmax and a backward by recomputation (see the .cpp for the algorithm).
"""
from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import torch

from .blocks import sorted_key_ends
from .inputs import all_finite

ENV_SWITCH = "POSKIT_CPU_KERNEL"
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
SOURCE = Path(__file__).with_name("cpu_flash.cpp")

# Tile sizes (queries x keys), measured with benchmarks/attention.py at B=8, H=8, d=64 on a 2-core AMD EPYC:
# see docs/benchmarks.md "Compiled CPU kernel". A tile's logits (64 x 512 fp32 = 128 KB) stay in L2.
BLOCK_Q = 64
BLOCK_K = 512

# Where the engine routes the kernel (when switched on): fp32 calls with more than one query, at any length.
# Measured in one process each (B, H, T, d; forward + backward; time relative to RoPE + SDPA; a loaded
# machine, docs/benchmarks.md): (32, 4, 64, 32), the default LM's attention: kernel 1.19x, blocked path 1.69x,
# padded SDPA 1.80x; (8, 8, 1024, 64): kernel 1.20x, blocked 2.97x (1.25x on an idle machine), padded 2.11x;
# (8, 8, 4096, 64): kernel 1.72x / 1.50x, padded SDPA 2.21x / 1.93x (two runs). bf16 is not routed: at 4096 the kernel took 1.85x against
# padded SDPA's 1.71x, at 1024 1.30x against the blocked path's 0.95x (idle). The only GEMM reachable here with
# an fp32 output, MKL's bf16 one, widens the tiles to fp32 on this AMD CPU, while SDPA's bf16 kernels reach
# oneDNN's native bf16 GEMM. Single queries (decode) keep the blocked path (not measured with the kernel).
# Called directly, the kernel serves fp32 and bf16 at any size.
ROUTED_DTYPES = (torch.float32,)


def enabled() -> bool:
    """True when POSKIT_CPU_KERNEL asks for the compiled kernel."""
    value = os.environ.get(ENV_SWITCH, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"the environment variable {ENV_SWITCH} must be one of {list(_ON)} (use the compiled CPU kernel) "
                     f"or {[v for v in _OFF if v]} / unset (do not), got {os.environ[ENV_SWITCH]!r}")


@functools.lru_cache(maxsize=1)
def kernel():
    """The compiled extension module, or None (with one warning saying why) when it cannot be built."""
    try:
        from torch.utils.cpp_extension import load

        return load(name="poskit_cpu_flash", sources=[str(SOURCE)],
                    extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                    verbose=False)
    except Exception as err:  # any build or load failure means: keep the usual paths
        warnings.warn(f"{ENV_SWITCH}=1 but the compiled CPU attention kernel ({SOURCE.name}) could not be built or "
                      f"loaded, so the usual paths run instead: {type(err).__name__}: {str(err)[:300]}",
                      RuntimeWarning, stacklevel=3)
        return None


def available() -> bool:
    """Whether the kernel is compiled and loadable (builds it on the first call)."""
    return kernel() is not None


def positions_served(q_positions: torch.Tensor, k_positions: torch.Tensor, causal: bool) -> bool:
    """Scalar positions shared by the batch, keys ascending when causal (the kernel's tile skipping)."""
    if q_positions.dim() != 2 or k_positions.dim() != 2 or q_positions.shape[0] != 1 or k_positions.shape[0] != 1:
        return False
    if not causal:
        return True
    kp = k_positions[0]
    return kp.numel() < 2 or bool((kp[1:] >= kp[:-1]).all())


def serves(inp, enc) -> bool:
    """Whether a call (AttentionInputs `inp`, encoding `enc`) takes this kernel: switched on, an encoding that
    declares q/k wider than v (qk_width > 1: the case CPU SDPA cannot run unpadded), a dtype in ROUTED_DTYPES,
    more than one query (decode keeps the blocked path), no mask beyond causal-by-position, finite q/k, and a
    kernel that builds. Cheap checks first; the build happens at most once per process."""
    q, k = inp.q, inp.k
    if enc.qk_width == 1 or q.device.type != "cpu" or inp.attn_mask is not None or inp.key_padding_mask is not None:
        return False
    if q.shape[2] < 2 or not enabled() or torch.compiler.is_compiling():
        return False
    if q.dtype not in ROUTED_DTYPES or k.dtype != q.dtype or (inp.v is not None and inp.v.dtype != q.dtype):
        return False
    if inp.q_positions is not None and not positions_served(inp.q_positions, inp.k_positions, inp.causal):
        return False
    if inp.v is not None:  # (route() asks without values or data)
        if not all_finite(q, k):  # NaN rows stay NaN on the exact materialised path (sdpa.py)
            return False
    return available()


def _plan(q_positions, k_positions, causal: bool, block_q: int):
    """Per query tile: (key_end, full_end) int64, as the kernel expects; empty tensors when not causal."""
    if not causal:
        empty = torch.empty(0, dtype=torch.int64)
        return empty, empty, empty, empty
    qp = q_positions.to(torch.int64).contiguous()
    kp = k_positions.to(torch.int64).contiguous()
    key_end = sorted_key_ends(qp, kp, block_q)[0].contiguous()
    full_end = sorted_key_ends(qp, kp, block_q, whole_block=True)[0].contiguous()
    return qp[0], kp[0], key_end, full_end


class CpuFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, q_positions, k_positions, causal, block_q, block_k):
        B, H, Tq, E = q.shape
        flat = [t.reshape(B * H, t.shape[2], t.shape[3]).contiguous() for t in (q, k, v)]
        plan = _plan(q_positions, k_positions, causal, block_q)
        out, lse = kernel().forward(*flat, float(scale), causal, *plan, block_q, block_k)
        ctx.save_for_backward(*flat, out, lse, *plan)
        ctx.scale, ctx.causal, ctx.blocks, ctx.shapes = float(scale), causal, (block_q, block_k), (q.shape, k.shape, v.shape)
        return out.view(B, H, Tq, v.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):
        q3, k3, v3, out, lse, *plan = ctx.saved_tensors
        do3 = grad_out.reshape(out.shape).to(out.dtype).contiguous()
        delta = (do3.float() * out.float()).sum(-1)  # rowsum(dO * O), FlashAttention's D
        dq, dk, dv = kernel().backward(q3, k3, v3, do3, lse, delta.contiguous(), ctx.scale, ctx.causal, *plan,
                                       *ctx.blocks)
        qs, ks, vs = ctx.shapes
        return dq.view(qs), dk.view(ks), dv.view(vs), None, None, None, None, None, None


def cpu_flash_attention(q, k, v, *, scale: float, q_positions, k_positions, causal: bool,
                        block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> torch.Tensor:
    """softmax(scale q k^T, causal by position) @ v for q, k (B, H, T, E) and v (B, H, Tk, Dv) with any E, Dv.

    kv heads must already match the query heads (repeat_kv). Positions are (1, T) int tensors, keys ascending
    when causal; a query that sees no key outputs zeros. Callers check `available()` and the served shapes first.
    """
    for name, value in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q (B, H, Tq, E), k (B, H, Tk, E) and v (B, H, Tk, Dv) disagree: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    return CpuFlashAttention.apply(q, k, v, scale, q_positions, k_positions, causal, block_q, block_k)
