"""The compiled CPU attention kernel (cpu_flash.cpp): the default CPU path for q/k wider than v (PoPE), for a
logit bias computed from positions (ALiBi, T5, KERPLE, dynamic, FIRE below its threshold, relative PE) and for
CoPE's contextual positions with gates from the keys (cope, cope-alibi: cpu_flash_contextual_attention); for
equal-width q/k (the rope family) where this machine's calibration measured it faster than SDPA.

What it computes: softmax(scale q k^T + bias, causal by position, key padding) @ v, exactly (the formula of
attention/reference.py; only the rounding differs), in cache-sized tiles with an online softmax, causal tiles
skipped, grouped kv heads read in place, fp32 and bf16 (bf16 products with fp32 accumulation through oneDNN's
brgemm micro-kernel on a CPU with AVX512_BF16, on AMX tiles where it has them, `bf16_products`; otherwise widened to
fp32 per tile), and a backward by
recomputation that also returns the bias parameters' gradient. A forward with few query rows per kv head (a decode
step) takes a decode form instead of the tiles, which reads a kv head's keys and values once for all its query
heads and steps (`flash_decode_tiled_rows`). The bias comes from the encoding's declaration
(`kernel_bias`, encodings/kernel_bias.py) and is generated per tile from the positions, never as a Tq x Tk tensor.

Switch: POSKIT_CPU_KERNEL, read at every call: unset or "1" (default) uses the kernel where it serves a call;
"0" keeps the exact blocked/SDPA paths. The library is built once per machine on first use (progress and time on
stderr; `poskit kernel build` builds it ahead) and cached (attention/kernel_build.py). When it cannot be had
(no compiler, a failed build) one warning says why, once per process, and every call keeps its usual path:
the kernel never turns a working call into an error.
"""
from __future__ import annotations

import contextlib
import functools
import os
import warnings

import torch

from ..encodings import polar_pair
from ..encodings.kernel_bias import MAX_TABLE_DISTANCES, KernelBias, declared, distance_span, distances
from ..util.function_call import call
from . import kernel_build, kernel_calibration
from .env_switch import switched_on
from .inputs import AttentionInputs, all_finite

ENV_SWITCH = "POSKIT_CPU_KERNEL"

# Tile sizes (queries x keys), measured with benchmarks/attention.py at B=8, H=8, d=64 on a 2-core AMD EPYC
# (docs/benchmarks.md, "Compiled CPU kernel"): a tile's logits (64 x 512 fp32 = 128 KB) stay in L2.
BLOCK_Q = 64
BLOCK_K = 512
# The backward's query tile at long sequences. The backward recomputes each tile's logits from the saved
# logsumexp (per row), so its tiling is independent of the forward's. Per query tile it streams the head's keys
# and values and updates the head's dK and dV; from LONG_KEYS keys on that no longer stays in cache (6 MB per
# head for PoPE's 128-wide q/k at 4096 keys), and a tile twice as tall halves the traffic. On the 2-core AMD EPYC
# (512 KB L2 per core, 32 MB L3), the backward alone at B=1, H=8, causal, medians of 9 interleaved rounds: 0.87x
# the 64-row tile's time at 4096 keys with 128-wide q/k, 0.91x at 8192, 0.95x at 4096 with 64-wide; 0.98-0.99x
# at 2048 keys and 1.03x at B=8 with 1024 keys (the taller diagonal tile computes more masked logits there).
BLOCK_Q_BACKWARD = 128
LONG_KEYS = 4096
# A call with fewer query rows per kv head than this (new queries x query heads per kv head: a decode step) takes
# the kernel's decode form, which reads each cached key and value once for all of a kv head's rows, in place;
# from it on, the tiles (cpu_flash.cpp, flash_decode_kernel). A machine's calibration measures the number per dtype
# (kernel_calibration.FLASH_DECODE_ROW_COUNTS); this default was measured on the 2-core AMD EPYC (B = 8, 8 kv heads,
# 4096 cached keys, docs/benchmarks.md "The flash forms' decode").
FLASH_DECODE_TILED_ROWS = 8


def backward_block_q(keys: int) -> int:
    """The backward's query tile for calls with `keys` keys (read at call time): from LONG_KEYS on, this machine's
    calibrated tile where `poskit kernel calibrate` measured one, BLOCK_Q_BACKWARD otherwise."""
    if keys < LONG_KEYS:
        return BLOCK_Q
    measured = kernel_calibration.long_backward_block_q(_library)
    return BLOCK_Q_BACKWARD if measured is None else measured

# The dtypes the kernel serves (bf16: products of bf16 operands where the CPU has AVX512_BF16, see bf16_products;
# otherwise widened to fp32 per tile, which on CPUs without native bf16 arithmetic every bf16 GEMM does inside);
# float16 and float64 keep their exact paths.
DTYPES = (torch.float32, torch.bfloat16)
_BIAS_CODES = {None: 0, "distance_table": 1, "offset_embeddings": 2}


def flash_decode_tiled_rows(dtype: torch.dtype) -> int:
    """The rows per kv head from which calls of `dtype` take the tiles rather than the decode form: this machine's
    calibration, else FLASH_DECODE_TILED_ROWS."""
    measured = kernel_calibration.flash_decode_tiled_rows(_library, dtype)
    return FLASH_DECODE_TILED_ROWS if measured is None else measured


def enabled() -> bool:
    """False only when POSKIT_CPU_KERNEL turns the kernel off ("0"); the default is on."""
    return switched_on(ENV_SWITCH, "use the compiled CPU kernel", "do not")


@contextlib.contextmanager
def switched(value: str):
    """POSKIT_CPU_KERNEL set to `value` inside the block, restored after (the engine reads it at every call): to
    time or test a call with the kernel on ("1") and off ("0") in one process."""
    saved = os.environ.get(ENV_SWITCH)
    os.environ[ENV_SWITCH] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[ENV_SWITCH]
        else:
            os.environ[ENV_SWITCH] = saved


@functools.lru_cache(maxsize=1)
def kernel():
    """torch.ops.poskit_cpu_flash once the library is built and loaded, or None (with one warning saying why)."""
    global _library
    try:
        _library = kernel_build.load()
    except kernel_build.KernelUnavailable as err:
        warnings.warn(f"poskit: the compiled CPU attention kernel is unavailable ({err}); attention keeps its exact "
                      f"blocked/SDPA paths, which are slower (`poskit kernel info` says more; {ENV_SWITCH}=0 silences "
                      "this)", RuntimeWarning, stacklevel=3)
        return None
    return torch.ops.poskit_cpu_flash


_library = None  # the loaded library's path (its directory holds this machine's calibration)


def available() -> bool:
    """Whether the kernel is loadable (builds it on the first call)."""
    return kernel() is not None


def _loaded_or_built() -> bool:
    """Whether the library is loaded in this process or already built in the cache, never building it: the forms
    the kernel takes only where this machine measured it faster (their calibration lives beside a built library)
    must not make a call that would stay on SDPA compile the kernel first."""
    if kernel.cache_info().currsize:  # loaded, or found unavailable, already
        return kernel() is not None
    try:
        return kernel_build.cached_library() is not None
    except kernel_build.KernelUnavailable:
        return False


def bf16_products_available() -> bool:
    """Whether the kernel can multiply bf16 operands natively here: a CPU with AVX512_BF16, a library built for
    AVX-512, and torch's oneDNN micro-kernels (brgemm) enabled (torch.backends.mkldnn.enabled, read per call). The
    products accumulate in fp32, P and dS rounded to bf16 first, as bf16 flash kernels do; they run on the AMX tiles
    of a CPU that has them."""
    ops = kernel()
    return ops is not None and bool(ops.bf16_products_available())


def uses_bf16_products(dtype: torch.dtype, requested: bool | None = None) -> bool:
    """Whether a call in `dtype` takes bf16 products: `requested` when given (True refused, by name, where they
    cannot be had), else for bf16 wherever available and not measured slower by this machine's calibration."""
    if requested is None:
        return (dtype == torch.bfloat16 and bf16_products_available()
                and kernel_calibration.bf16_products_win(_library))
    if not isinstance(requested, bool):
        raise ValueError(f"bf16_products must be True, False or None (this machine's default), got {requested!r}")
    if requested and (dtype != torch.bfloat16 or not bf16_products_available()):
        raise ValueError(f"bf16_products=True needs bf16 inputs (got {dtype}), a CPU with AVX512_BF16 under an "
                         f"AVX-512 build of the kernel and torch.backends.mkldnn enabled "
                         f"(here: {bf16_products_available()})")
    return requested


def _polar_ops():
    """The library's ops for PoPE's Cartesian features (encodings/polar_pair.py), where attention would use the
    kernel: switched on and loadable."""
    return kernel() if enabled() else None


polar_pair.use_fused(_polar_ops)


def _scalar_positions(inp: AttentionInputs) -> bool:
    return inp.q_positions.dim() == 2 and inp.k_positions.dim() == 2


def qk_served(enc) -> bool:
    """A q/k transform the kernel takes encoded: q/k wider than v (qk_width > 1: CPU SDPA would pad v). Equal widths
    (the QK_EQUAL form) only where this machine's calibration measured the kernel faster than SDPA's own flash
    kernel (kernel_calibration.MEASURED_ONLY)."""
    return enc.kind == "qk" and enc.qk_width > 1


def kernel_bias_for(inp: AttentionInputs, enc) -> KernelBias | None:
    """The bias an encoding of kind "bias" declares for this call's positions, as the kernel takes it ("slopes"
    turned into a distance table), or None."""
    if enc.kind != "bias" or not _scalar_positions(inp):
        return None
    found = declared(enc, inp.q_positions, inp.k_positions)
    return None if found is None else as_table(found, inp.q_positions, inp.k_positions)


def as_table(bias: KernelBias, q_positions, k_positions) -> KernelBias | None:
    """ALiBi's slopes as a distance table over the call's distances (-m_h |t - s|, computed as ALiBi's bias is);
    other forms as they are. None when the distances span more than a table should (kernel_bias.distance_span)."""
    if bias.form != "slopes":
        return bias
    span = distance_span(q_positions, k_positions)
    if span is None:
        return None
    d = distances(*span, q_positions.device).abs().to(torch.float32)
    return KernelBias("distance_table", (-bias.values.to(torch.float32)[:, None] * d).contiguous(), span[0])


QK = "qk"  # what `serves` returns for a q/k encoding with q/k wider than v (the kernel takes its encoded q/k)
QK_EQUAL = "qk_equal"  # ... and for equal widths (the kernel takes transform_qk's q/k)


def serves(inp: AttentionInputs, enc):
    """How the kernel serves a call: None (it does not), QK (a q/k encoding with q/k wider than v: encoded q/k,
    no bias), QK_EQUAL (equal widths, where measured faster than SDPA) or the KernelBias of a bias encoding
    (as_table's form).

    It does for: the switch on, CPU tensors of a DTYPES dtype, no general attn_mask (a key padding mask is fine),
    an encoding it serves (`qk_served`, or a kernel bias declared for these positions), scalar positions where they
    matter (causal, or a bias), finite q/k (NaN rows stay NaN on the materialised path), not while torch.compile
    traces, a kernel that builds (checked then: the build happens at most once per process), and no calibration
    of this machine that measured the path without the kernel faster for the call's form and dtype
    (attention/kernel_calibration.py)."""
    q, k = inp.q, inp.k
    if not _call_served(inp):
        return None
    if enc.kind == "qk":
        if inp.causal and not _scalar_positions(inp):
            return None
        found = QK if qk_served(enc) else QK_EQUAL
        if found == QK_EQUAL and not (_loaded_or_built() and available() and _equal_widths_kernel_wins(inp)):
            return None  # (decided before the finiteness check, which would read q and k for nothing)
    else:
        found = kernel_bias_for(inp, enc)
        if found is None:
            return None
    if inp.v is not None and not all_finite(q, inp.keys_to_check()):
        return None
    if not available():
        return None
    if found == QK_EQUAL:
        return found  # (measured above)
    # a calibration of this machine may have measured the path without the kernel faster for this form and dtype
    form = found if isinstance(found, str) else found.form
    return found if kernel_calibration.kernel_wins(_library, form, q.dtype) else None


def _equal_widths_kernel_wins(inp: AttentionInputs) -> bool:
    """This machine's decision for equal-width q/k: fewer queries than keys (a step against a KV cache, whose raw
    keys rope-dynamic and xPos re-encode every step) take the decision measured for that many new queries, as
    calls against cached encoded keys do; the rest the full-sequence one."""
    queries = inp.q.shape[2]
    if queries < inp.k.shape[2]:
        return kernel_calibration.cached_keys_kernel_wins(_library, queries, inp.q.dtype)
    return kernel_calibration.kernel_wins(_library, QK_EQUAL, inp.q.dtype)


def serves_encoded_keys(inp: AttentionInputs, enc) -> bool:
    """Whether the kernel serves an equal-width q/k encoding's call against keys cached already encoded (a KV
    cache's decode or prefill): serves()'s conditions, under this machine's decision for that many new queries
    (kernel_calibration.cached_keys_kernel_wins). (Wider q/k against encoded keys keep the blocked path.)"""
    if enc.kind != "qk" or qk_served(enc) or not _call_served(inp):
        return False
    if inp.causal and not _scalar_positions(inp):
        return False
    if not (_loaded_or_built() and available()
            and kernel_calibration.cached_keys_kernel_wins(_library, inp.q.shape[2], inp.q.dtype)):
        return False
    return all_finite(inp.q, inp.keys_to_check())


def _call_served(inp: AttentionInputs) -> bool:
    """The conditions on the call itself: the switch on, CPU tensors of a DTYPES dtype, no general attn_mask,
    not while torch.compile traces."""
    q = inp.q
    return (q.device.type == "cpu" and inp.attn_mask is None and q.dtype in DTYPES and enabled()
            and not torch.compiler.is_compiling())


CONTEXTUAL = "contextual"  # the calibration's name for CoPE's form
# the kernel saves each query's last clamped key index as a float (exact below 2^24; cpu_flash.cpp checks it too)
MAX_CONTEXTUAL_KEYS = 2**24 - 1


def serves_contextual(inp: AttentionInputs, enc) -> bool:
    """Whether the kernel serves a contextual encoding's call (CoPE, cope-alibi): gates from the keys themselves
    (the encoding's gate source is k; value gates and separate gate keys keep the blocked path), scalar positions,
    finite q/k, and serves()'s conditions on the call, the build and the calibration."""
    if (enc.kind != "contextual" or not _call_served(inp) or not _scalar_positions(inp)
            or inp.k.shape[2] > MAX_CONTEXTUAL_KEYS):
        return False
    try:
        if enc.gate_source(inp.k, inp.v, None) is not inp.k:
            return False
    except ValueError:  # separate gate keys, which a call without them cannot give
        return False
    if not all_finite(inp.q, inp.keys_to_check()) or not available():
        return False
    return kernel_calibration.kernel_wins(_library, CONTEXTUAL, inp.q.dtype)


def _positions(inp: AttentionInputs, needed: bool):
    """(q_positions, k_positions) with one row count (1 or B), contiguous int64; empty when not needed."""
    if not needed:
        empty = torch.empty(0, 0, dtype=torch.int64)
        return empty, empty
    return _position_rows(inp.q_positions, inp.k_positions)


def _position_rows(qp: torch.Tensor, kp: torch.Tensor):
    """(1|B, Tq) and (1|B, Tk) positions with one row count, contiguous int64, as the kernel reads them."""
    rows = max(qp.shape[0], kp.shape[0])
    return (qp.expand(rows, -1).to(torch.int64).contiguous(), kp.expand(rows, -1).to(torch.int64).contiguous())


def rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    """k or v as the kernel reads them: `x` itself where each head's rows lie one after another (a KV cache's view
    into a buffer with room to grow: its heads lie `capacity` rows apart, and copying them would cost a decode step
    more than the attention), else a contiguous copy."""
    rows_ok = x.shape[-1] <= 1 or x.stride(-1) == 1
    heads_ok = x.shape[-2] <= 1 or x.stride(-2) == x.shape[-1]
    return x if rows_ok and heads_ok else x.contiguous()


class CpuFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias_values, scale, q_positions, k_positions, pad, causal, bias_form, bias_offset,
                block_q, block_k, block_q_backward, products, tiled_rows):
        ops = kernel()
        args = _kernel_args(bias_values, bias_form, bias_offset, scale)
        q, k, v = q.contiguous(), rows_contiguous(k), rows_contiguous(v)
        if q.shape[2] * (q.shape[1] // k.shape[1]) < tiled_rows:  # query rows per kv head
            out, lse = ops.decode(q, k, v, float(scale), causal, q_positions, k_positions, pad, *args)
        else:
            out, lse = ops.forward(q, k, v, float(scale), causal, q_positions, k_positions, pad, *args, block_q,
                                   block_k, products)
        ctx.products = products
        ctx.save_for_backward(q, k, v, out, lse, q_positions, k_positions, pad, bias_values)
        ctx.scale, ctx.causal, ctx.bias = float(scale), causal, (bias_form, bias_offset)
        ctx.blocks = (backward_block_q(k.shape[2]) if block_q_backward is None else block_q_backward, block_k)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, q_positions, k_positions, pad, bias_values = ctx.saved_tensors
        do = grad_out.to(out.dtype).contiguous()
        delta = kernel().row_dot(do, out.contiguous())  # rowsum(dO * O) in fp32, FlashAttention's D
        args = _kernel_args(bias_values, *ctx.bias, ctx.scale)
        dq, dk, dv, dbias = kernel().backward(q, k, v, do, lse, delta, ctx.scale, ctx.causal, q_positions,
                                              k_positions, pad, *args, *ctx.blocks, ctx.products)
        B, Hkv, Tk = k.shape[:3]
        g = q.shape[1] // Hkv
        if g > 1:  # per query head -> per kv head
            dk, dv = (x.view(B, Hkv, g, Tk, x.shape[-1]).sum(2) for x in (dk, dv))
        dvalues = None
        if ctx.needs_input_grad[3]:
            # per thread, reversed along the distances (the kernel's layout): summed and put back in order
            dvalues = dbias.sum(0).flip(-1 if ctx.bias[0] == "distance_table" else 0).to(bias_values.dtype)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dvalues, *(None,) * 12)


def _kernel_args(bias_values, form, offset, scale):
    """(bias code, values, hi, M, bias scale) as the C++ operator takes them."""
    if form == "distance_table":
        return _BIAS_CODES[form], bias_values, offset + bias_values.shape[1] - 1, 0, 0.0
    if form == "offset_embeddings":
        return _BIAS_CODES[form], bias_values, 0, offset, float(scale)
    return 0, bias_values, 0, 0, 0.0


def cpu_flash_attention(q, k, v, *, scale: float, q_positions=None, k_positions=None, causal: bool = False,
                        key_padding_mask=None, bias: KernelBias | None = None, block_q: int | None = None,
                        block_k: int | None = None, block_q_backward: int | None = None,
                        bf16_products: bool | None = None, tiled_rows: int | None = None) -> torch.Tensor:
    """softmax(scale q k^T + bias, causal by position, key padding) @ v through the compiled kernel.

    q (B, H, Tq, E), k (B, Hkv, Tk, E), v (B, Hkv, Tk, Dv), Hkv dividing H (query head h reads kv head
    h // (H // Hkv)), any E and Dv, fp32 or bf16. Positions (1|B, T) int tensors (needed when causal or with a
    bias); key_padding_mask (B, Tk) bool, True = real key; bias: a KernelBias (encodings/kernel_bias.py). A
    query that sees no key outputs zeros. block_q, block_k: the tile of both passes (default: BLOCK_Q x BLOCK_K
    in the forward, backward_block_q(Tk) x BLOCK_K in the backward, read at call time); block_q_backward: the
    backward's query tile alone (default block_q where given). bf16_products: see `uses_bf16_products` (None: this
    machine's default). tiled_rows: from this many query rows per kv head (Tq x H / Hkv) the forward takes the
    tiles, below it the decode form (None: `flash_decode_tiled_rows`; 1: the tiles always); the backward takes
    the tiles either way. Callers check `available()` first.
    """
    products = uses_bf16_products(q.dtype, bf16_products)
    if tiled_rows is None:
        tiled_rows = flash_decode_tiled_rows(q.dtype)
    elif isinstance(tiled_rows, bool) or not isinstance(tiled_rows, int) or tiled_rows < 1:
        raise ValueError(f"tiled_rows must be a positive int or None (this machine's), got {tiled_rows!r}")
    if block_q_backward is None:
        block_q_backward = block_q  # None: backward_block_q's, read when the forward runs
    block_q = BLOCK_Q if block_q is None else block_q
    block_k = BLOCK_K if block_k is None else block_k
    tiles = (("block_q", block_q), ("block_k", block_k), ("block_q_backward", block_q_backward))
    for label, value in (t for t in tiles if t[1] is not None):  # block_q_backward None: read when the forward runs
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive int, got {value!r}")
    B, H, Tq, E = q.shape
    if k.shape[0] != B or k.shape[-1] != E or k.shape[:3] != v.shape[:3] or k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(f"q (B, H, Tq, E), k (B, Hkv, Tk, E) and v (B, Hkv, Tk, Dv) disagree: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if bias is not None:
        table = as_table(bias, q_positions, k_positions)
        if table is None:
            raise ValueError("bias: the positions' distances span more than a distance table may "
                             f"({MAX_TABLE_DISTANCES} per head); use the blocked path")
        bias = table
    form, values, offset = (None, torch.empty(0), 0) if bias is None else bias
    if form is not None and values.dtype != torch.float32:
        values = values.to(torch.float32)  # (differentiable: the gradient goes back to the parameter's dtype)
    inp = AttentionInputs(q, k, v, q_positions, k_positions, scale, causal, key_padding_mask)
    qp, kp = _positions(inp, causal or form is not None)
    pad = torch.empty(0, dtype=torch.bool) if key_padding_mask is None else key_padding_mask.contiguous()
    return call(CpuFlashAttention, q, k, v, values if form is not None else torch.empty(0), float(scale), qp, kp, pad,
                bool(causal), form, offset, block_q, block_k, block_q_backward, products, tiled_rows)


class CpuFlashContextual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, pos_emb, slopes, scale, q_positions, k_positions, pad, causal, p_max, block_q, block_k,
                products):
        q, k, v = q.contiguous(), rows_contiguous(k), rows_contiguous(v)
        emb = pos_emb.to(torch.float32).contiguous() if pos_emb is not None else torch.empty(0)
        sl = slopes.to(torch.float32).contiguous() if slopes is not None else torch.empty(0)
        out, lse, gtot = kernel().contextual_forward(q, k, v, float(scale), causal, q_positions, k_positions, pad,
                                                     emb, sl, p_max, block_q, block_k, products)
        ctx.save_for_backward(q, k, v, out, lse, gtot, q_positions, k_positions, pad, emb, sl)
        ctx.cfg = (float(scale), causal, p_max, block_q, block_k, products)
        ctx.param = (pos_emb, slopes)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, gtot, q_positions, k_positions, pad, emb, sl = ctx.saved_tensors
        scale, causal, p_max, block_q, block_k, products = ctx.cfg
        do = grad_out.to(out.dtype).contiguous()
        delta = kernel().row_dot(do, out.contiguous())
        dq, dk, dv, dparam = kernel().contextual_backward(q, k, v, do, lse, delta, gtot, scale, causal, q_positions,
                                                          k_positions, pad, emb, sl, p_max, block_q, block_k,
                                                          products)
        B, Hkv, Tk = k.shape[:3]
        g = q.shape[1] // Hkv
        if g > 1:  # per query head -> per kv head
            dk, dv = (x.view(B, Hkv, g, Tk, x.shape[-1]).sum(2) for x in (dk, dv))
        pos_emb, slopes = ctx.param
        d_emb = dparam.sum(0).to(pos_emb.dtype) if pos_emb is not None and ctx.needs_input_grad[3] else None
        d_slopes = dparam.sum(0).to(slopes.dtype) if slopes is not None and ctx.needs_input_grad[4] else None
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_emb, d_slopes, *(None,) * 9)


def cpu_flash_contextual_attention(q, k, v, *, scale: float, p_max: int, pos_emb=None, slopes=None, q_positions=None,
                                   k_positions=None, causal: bool = False, key_padding_mask=None,
                                   block_q: int | None = None, block_k: int | None = None,
                                   bf16_products: bool | None = None) -> torch.Tensor:
    """CoPE attention through the compiled kernel, gates from the keys: exactly one of pos_emb (D, p_max) (cope:
    the bias interpolates q . e at the contextual position) or slopes (H,) (cope-alibi: -slope_h p). Shapes,
    positions, masks, blocks and bf16_products as cpu_flash_attention's; keys non-decreasing in position (the
    caller checks).
    Callers check `available()` first."""
    if (pos_emb is None) == (slopes is None):
        raise ValueError("pass exactly one of pos_emb (cope) and slopes (cope-alibi)")
    products = uses_bf16_products(q.dtype, bf16_products)
    block_q = BLOCK_Q if block_q is None else block_q
    block_k = BLOCK_K if block_k is None else block_k
    inp = AttentionInputs(q, k, v, q_positions, k_positions, scale, causal, key_padding_mask)
    qp, kp = _positions(inp, causal)
    pad = torch.empty(0, dtype=torch.bool) if key_padding_mask is None else key_padding_mask.contiguous()
    return call(CpuFlashContextual, q, k, v, pos_emb, slopes, float(scale), qp, kp, pad, bool(causal), int(p_max),
                                    block_q, block_k, products)


def serves_magnitude_decode(mu_k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernel serves PoPE's attention against cached key magnitudes (attention/pope_decode.py): the
    switch on, CPU tensors of one DTYPES dtype, not while torch.compile traces, a kernel that builds. The caller
    checks the rest (no gradient wanted; a causal mask, if any, by positions of shape (1|B, T))."""
    return (mu_k.device.type == "cpu" and mu_k.dtype in DTYPES and v.dtype == mu_k.dtype and enabled()
            and not torch.compiler.is_compiling() and available())


MAGNITUDE_DECODE = "magnitude_decode"  # the calibration's name for PoPE's decode against cached magnitudes


def magnitude_decode_kernel_wins(dtype: torch.dtype) -> bool:
    """Whether PoPE's one-token decode step takes the kernel rather than the torch.compile'd loops on this machine
    (kernel_calibration: the kernel unless measured slower by its margin)."""
    return kernel_calibration.kernel_wins(_library, MAGNITUDE_DECODE, dtype)


def magnitude_decode(q_rows: torch.Tensor, mu_k: torch.Tensor, v: torch.Tensor, k_angles: torch.Tensor,
                     key_padding_mask: torch.Tensor | None = None, q_positions: torch.Tensor | None = None,
                     k_positions: torch.Tensor | None = None, bf16_products: bool | None = None,
                     tiled_rows: int | None = None) -> torch.Tensor:
    """softmax over the keys of sum_c mu_k[s, c] (a[r, c] cos(s theta_c) + b[r, c] sin(s theta_c)), times v:
    PoPE's attention against a KV cache of key magnitudes, one fused pass that reads the cache once (cpu_flash.cpp,
    "PoPE's attention against a KV cache of key magnitudes").

    q_rows (B, Hkv, R, 2d) = [a | b], the Cartesian query rows of each kv head (scale and phase bias folded in;
    taken in fp32), R = groups * Tq with row r step r % Tq of its query head (q.reshape(B, Hkv, -1, 2d) of a
    (B, H, Tq, 2d) query); mu_k (B, Hkv, L, d) and v (B, Hkv, L, Dv) of one DTYPES dtype (a KV cache's views are
    read where they lie); k_angles (1|B, L, 2d) = [cos | sin] of the key positions; key_padding_mask (B, L) bool,
    True = real key; q_positions (1|B, Tq) and k_positions (1|B, L): causal by position (a key later than the
    query is hidden), or None (every key visible). A row that sees no key outputs zeros. bf16_products: whether
    the products form (from `tiled_rows` rows per kv head) multiplies a bf16 cache's blocks in bf16, as
    `uses_bf16_products` (None: this machine's default). tiled_rows: from this many rows R the products form
    (None: this machine's calibration, else the library's default). Returns (B, Hkv, R, Dv) fp32. Callers
    check `serves_magnitude_decode` first; no gradient flows through it."""
    if (q_positions is None) != (k_positions is None):
        raise ValueError("magnitude_decode: pass both q_positions and k_positions (a causal mask) or neither")
    pad = torch.empty(0, dtype=torch.bool) if key_padding_mask is None else key_padding_mask.contiguous()
    if q_positions is None:
        qp = kp = torch.empty(0, 0, dtype=torch.int64)
    else:
        qp, kp = _position_rows(q_positions, k_positions)
    products = uses_bf16_products(mu_k.dtype, bf16_products)
    if tiled_rows is None:
        tiled_rows = kernel_calibration.decode_tiled_rows(_library, mu_k.dtype) or kernel().decode_tiled_rows()
    elif isinstance(tiled_rows, bool) or not isinstance(tiled_rows, int) or tiled_rows < 1:
        raise ValueError(f"tiled_rows must be a positive int or None (this machine's), got {tiled_rows!r}")
    return kernel().magnitude_decode(q_rows.float().contiguous(), rows_contiguous(mu_k), rows_contiguous(v),
                                     k_angles.float().contiguous(), pad, qp, kp, products, tiled_rows)
