"""Fused Triton CoPE (Contextual Position Encoding) attention, forward and backward.

CoPE (Golovneva et al., 2024, "Contextual Position Encoding: Learning to Count
What's Important", section 4 and the Appendix B listing) replaces token-count
positions by a per-query, per-key *contextual* position

    g[t, s] = sigmoid(scale * q_t . gk_s)                       (0 for masked keys)
    p[t, s] = sum_{s' >= s, s' visible} g[t, s']                (suffix sum over keys)
    p       = min(p, p_max - 1)
    z_t[j]  = q_t . e[:, j]            j = 0 .. p_max - 1       (q NOT scaled)
    bias    = z_t[ceil p] * w + z_t[floor p] * (1 - w),   w = p - floor(p)
    out     = softmax(scale * q . k + bias) @ v                 (masked logits = -inf)

or, for the CoPE-ALiBi variant (paper eq. 10), ``bias = -slopes[h] * p``.

This module computes it without ever materialising a (Tq, Tk) tensor:

* ``z = q @ e`` (B, H, Tq, p_max) is computed once (a small fp32 scratch, O(T * p_max))
  and the kernel gathers ``z[t, floor p]`` / ``z[t, ceil p]`` from it with computed
  pointers (cache resident).  ``tl.gather`` on a register-resident z tile also works
  in the Triton 3.7 interpreter, but needs the whole (BLOCK_M, p_max) table in
  registers, so the pointer gather is used for every p_max.
* Forward: one program per (query block, batch*head).  Key blocks are walked from
  the last visible one (the causal diagonal) *backwards* to the first, so the gate
  sums are a running suffix sum: per-row carry + ``tl.cumsum(g, reverse=True)``
  inside a tile.  The biased logits are folded into an online softmax (running max,
  running sum, accumulator).  Saves O(T) statistics: log-sum-exp and the total gate
  sum per row.
* Backward (fused, exact, memory O(T) apart from fp32 gradient buffers): one
  program per (query block, batch*head) walks the key blocks *forwards*.  The
  per-row gate total from the forward gives the suffix sums as
  ``p = total - prefix``; the suffix-sum adjoint is a prefix sum
  ``dL/dg[t, s'] = sum_{s <= s'} dL/dp[t, s]`` carried across tiles with
  ``tl.cumsum``.  dq is accumulated in registers; dk, dv, dgate_keys (shared by the
  query blocks and by the query heads of a GQA group) and dz (scatter into the
  p_max table) are accumulated with fp32 ``tl.atomic_add`` (so gradients are not
  bit-deterministic run to run).  ``z = q @ e`` is built in torch outside the op, so
  autograd does ``dq += dz @ e^T`` and ``de = q^T dz``.  The clamp has zero gradient where it is active (``p > p_max - 1``, as
  ``torch.clamp``), floor/ceil have zero gradient, ``dbias/dp = z[ceil] - z[floor]``.

Conventions / assumptions
-------------------------
* q (B, H, Tq, D); k (B, Hkv, Tk, D); v (B, Hkv, Tk, Dv); query head h uses KV head
  ``h // (H // Hkv)`` (Hugging Face ``repeat_kv`` order).
* ``q_positions`` (Tq,) or (B, Tq) and ``k_positions`` (Tk,) or (B, Tk): a key is
  visible for a query iff ``k_pos <= q_pos`` (causal).  ``None`` defaults to
  ``arange(Tk)`` for keys and ``Tk - Tq + arange(Tq)`` for queries (new queries at
  the end, the decode / chunked-prefill layout).  **k_positions must be
  non-decreasing along the key axis**, and a ValueError (the reference's) says so
  when they are not, causal or not: the suffix sum runs along the key *index* axis,
  and the key-block range of each query block is found by ``searchsorted`` on them
  (masking inside blocks is element-wise, so any q_positions order is fine).  The
  check reads the positions (one host sync) inside the op.  Positions play no other
  part when ``causal=False``.
* ``key_padding_mask`` (B, Tk) bool, True = real key (visible), False = padding.
* Rows with no visible key return 0 (and zero gradients), never NaN.
* Supported dtypes: fp16, bf16, fp32 (q, k, v, gate_keys share one dtype).  fp32 uses
  IEEE-precision ``tl.dot`` (no TF32) because floor/ceil of p is precision sensitive.
  Under the interpreter bf16 tiles are upcast to fp32 before ``tl.dot`` (its bf16 dot
  is wrong); on CUDA they go to the tensor cores as bf16.
* Registered as the ``torch.library`` custom ops ``poskit::cope_attn_fwd`` /
  ``poskit::cope_attn_bwd`` with an autograd formula, so it works under
  ``torch.compile`` (fullgraph) as one opaque node.
* On CPU tensors the kernels only run under ``TRITON_INTERPRET=1``, which must be
  set before Triton (and this module) is imported.
"""

from __future__ import annotations

from typing import Optional

import torch

try:  # pragma: no cover - import guard
    import triton
    import triton.language as tl

    _HAS_TRITON = True
except ImportError:  # pragma: no cover
    triton = None
    tl = None
    _HAS_TRITON = False

__all__ = ["cope_attention_triton"]


def _next_pow2(n: int, lo: int = 16) -> int:
    return max(lo, 1 << (max(int(n), 1) - 1).bit_length())


if _HAS_TRITON:

    @triton.jit
    def _tile_logits_and_gates(q, k_base, g_base, KPOS_b, KPM_b, qpos, offs_s, n_ok, m_ok, offs_d, d_ok,
                               skt, skd, sgt, sgd, scale,
                               CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, SEP_GATES: tl.constexpr,
                               PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr):
        """For one key tile: its keys (and gate keys), the content logits q.k * scale, which entries are
        visible (causal by position, key padding, ragged tail) and the gates sigmoid(gate logit), 0 where
        not visible."""
        kd_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + offs_s[:, None] * skt + offs_d[None, :] * skd, mask=kd_mask, other=0.0).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        vis = m_ok[:, None] & n_ok[None, :]
        if CAUSAL:
            kpos = tl.load(KPOS_b + offs_s, mask=n_ok, other=0)
            vis = vis & (kpos[None, :] <= qpos[:, None])
        if HAS_KPM:
            kpm = tl.load(KPM_b + offs_s, mask=n_ok, other=0)
            vis = vis & (kpm != 0)[None, :]
        if SEP_GATES:
            gk = tl.load(g_base + offs_s[:, None] * sgt + offs_d[None, :] * sgd, mask=kd_mask,
                         other=0.0).to(DOT_DTYPE)
            gl = tl.dot(q, tl.trans(gk), input_precision=PRECISION) * scale
        else:
            gk = k
            gl = s
        g = 1.0 / (1.0 + tl.exp(-gl))
        g = tl.where(vis, g, 0.0)
        return k, gk, s, vis, g

    @triton.jit
    def _query_positions(QPOS_b, offs_m, m_ok, CAUSAL: tl.constexpr):
        # without causal masking positions are never read (QPOS is then a stand-in pointer)
        if CAUSAL:
            qpos = tl.load(QPOS_b + offs_m, mask=m_ok, other=0)
        else:
            qpos = offs_m
        return qpos

    @triton.jit
    def _head_slope(SLOPES, h, ALIBI: tl.constexpr):
        # SLOPES is a stand-in pointer unless ALIBI
        if ALIBI:
            slope = tl.load(SLOPES + h).to(tl.float32)
        else:
            slope = 0.0
        return slope

    @triton.jit
    def _position_bias(p, z_row, vis, slope, P, ALIBI: tl.constexpr):
        """The bias of contextual positions p clamped to P - 1: -slope * p (cope-alibi) or z interpolated
        between its floor and ceiling entries of the query's row of z. Returns it with the clamped p, the
        two z values, the interpolation weight and the two indices (the backward needs them)."""
        pc = tl.minimum(p, P - 1.0)
        fl = tl.floor(pc)
        w = pc - fl
        fl_i = fl.to(tl.int32)
        ce_i = tl.ceil(pc).to(tl.int32)
        if ALIBI:
            # no z table: zf and zc only fill the return tuple (the backward reads them only without ALIBI,
            # and the compiler drops what nothing reads)
            zf = w
            zc = w
            bias = -slope * pc
        else:
            zf = tl.load(z_row[:, None] + fl_i, mask=vis, other=0.0)
            zc = tl.load(z_row[:, None] + ce_i, mask=vis, other=0.0)
            bias = zc * w + zf * (1.0 - w)
        return bias, pc, zf, zc, w, fl_i, ce_i

    @triton.jit
    def _cope_fwd_kernel(
        Q, K, V, GK, Z, SLOPES, QPOS, KPOS, KPM, KV_END,
        O, LSE, GTOT,
        sqb, sqh, sqt, sqd,
        skb, skh, skt, skd,
        svb, svh, svt, svd,
        sgb, sgh, sgt, sgd,
        sob, soh, sot, sod,
        s_qpos_b, s_kpos_b, s_kpm_b,
        H, GROUP, Tq, Tk, D, DV, P, NQB, scale,
        CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, SEP_GATES: tl.constexpr,
        ALIBI: tl.constexpr, PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        hk = h // GROUP

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        m_ok = offs_m < Tq
        d_ok = offs_d < D
        dv_ok = offs_dv < DV

        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                    mask=m_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_DTYPE)
        qpos = _query_positions(QPOS + b * s_qpos_b, offs_m, m_ok, CAUSAL)
        z_row = Z + (pid_bh.to(tl.int64) * Tq + offs_m) * P
        slope = _head_slope(SLOPES, h, ALIBI)

        k_base = K + b * skb + hk * skh
        v_base = V + b * svb + hk * svh
        g_base = GK + b * sgb + hk * sgh

        kv_end = tl.load(KV_END + b * NQB + pid_m)
        n_blocks = tl.cdiv(kv_end, BLOCK_N)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        carry = tl.zeros([BLOCK_M], tl.float32)  # sum of gates of the keys after this tile
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

        for jb in range(0, n_blocks):
            start_n = (n_blocks - 1 - jb) * BLOCK_N  # walk backwards
            offs_s = start_n + offs_n
            n_ok = offs_s < kv_end
            _, _, s, vis, g = _tile_logits_and_gates(q, k_base, g_base, KPOS + b * s_kpos_b, KPM + b * s_kpm_b,
                                                     qpos, offs_s, n_ok, m_ok, offs_d, d_ok,
                                                     skt, skd, sgt, sgd, scale,
                                                     CAUSAL, HAS_KPM, SEP_GATES, PRECISION, DOT_DTYPE)
            p = carry[:, None] + tl.cumsum(g, axis=1, reverse=True)
            carry += tl.sum(g, axis=1)
            bias, _, _, _, _, _, _ = _position_bias(p, z_row, vis, slope, P, ALIBI)
            logits = tl.where(vis, s + bias, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(logits, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            pexp = tl.exp(logits - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(pexp, axis=1)
            v = tl.load(v_base + offs_s[:, None] * svt + offs_dv[None, :] * svd,
                        mask=n_ok[:, None] & dv_ok[None, :], other=0.0).to(DOT_DTYPE)
            acc = acc * alpha[:, None] + tl.dot(pexp.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new

        has = l_i > 0.0
        l_safe = tl.where(has, l_i, 1.0)
        out = acc / l_safe[:, None]
        lse = tl.where(has, m_i + tl.log(l_safe), 0.0)
        tl.store(O + b * sob + h * soh + offs_m[:, None] * sot + offs_dv[None, :] * sod,
                 out.to(O.dtype.element_ty), mask=m_ok[:, None] & dv_ok[None, :])
        row = pid_bh.to(tl.int64) * Tq + offs_m
        tl.store(LSE + row, lse, mask=m_ok)
        tl.store(GTOT + row, carry, mask=m_ok)

    @triton.jit
    def _cope_bwd_kernel(
        Q, K, V, GK, Z, SLOPES, QPOS, KPOS, KPM, KV_END,
        DO, LSE, GTOT, DELTA,
        DQ, DK, DVG, DGK, DZ, DSLOPES,
        sqb, sqh, sqt, sqd,
        skb, skh, skt, skd,
        svb, svh, svt, svd,
        sgb, sgh, sgt, sgd,
        sdob, sdoh, sdot, sdod,
        s_qpos_b, s_kpos_b, s_kpm_b,
        H, HKV, GROUP, Tq, Tk, D, DV, P, NQB, scale,
        CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, SEP_GATES: tl.constexpr,
        ALIBI: tl.constexpr, PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    ):
        # DQ: fp32 (B, H, Tq, D) contiguous; DK, DGK: fp32 (B, Hkv, Tk, D);
        # DVG: fp32 (B, Hkv, Tk, DV); DZ: fp32 (B, H, Tq, P); DSLOPES: fp32 (H,)
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        hk = h // GROUP

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        m_ok = offs_m < Tq
        d_ok = offs_d < D
        dv_ok = offs_dv < DV

        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                    mask=m_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_DTYPE)
        do = tl.load(DO + b * sdob + h * sdoh + offs_m[:, None] * sdot + offs_dv[None, :] * sdod,
                     mask=m_ok[:, None] & dv_ok[None, :], other=0.0).to(DOT_DTYPE)
        row = pid_bh.to(tl.int64) * Tq + offs_m
        lse = tl.load(LSE + row, mask=m_ok, other=0.0)
        gtot = tl.load(GTOT + row, mask=m_ok, other=0.0)
        delta = tl.load(DELTA + row, mask=m_ok, other=0.0)
        qpos = _query_positions(QPOS + b * s_qpos_b, offs_m, m_ok, CAUSAL)
        z_row = Z + row * P
        dz_row = DZ + row * P
        slope = _head_slope(SLOPES, h, ALIBI)
        dslope = tl.zeros([BLOCK_M], tl.float32)

        k_base = K + b * skb + hk * skh
        v_base = V + b * svb + hk * svh
        g_base = GK + b * sgb + hk * sgh
        kvh = (b * HKV + hk).to(tl.int64) * Tk
        dk_base = DK + kvh * D
        dgk_base = DGK + kvh * D
        dv_base = DVG + kvh * DV

        kv_end = tl.load(KV_END + b * NQB + pid_m)
        n_blocks = tl.cdiv(kv_end, BLOCK_N)

        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        carry_g = tl.zeros([BLOCK_M], tl.float32)   # sum of gates of the keys before this tile
        carry_dp = tl.zeros([BLOCK_M], tl.float32)  # sum of dL/dp of the keys before this tile

        for jb in range(0, n_blocks):
            start_n = jb * BLOCK_N  # walk forwards
            offs_s = start_n + offs_n
            n_ok = offs_s < kv_end
            kd_mask = n_ok[:, None] & d_ok[None, :]
            k, gk, s, vis, g = _tile_logits_and_gates(q, k_base, g_base, KPOS + b * s_kpos_b, KPM + b * s_kpm_b,
                                                      qpos, offs_s, n_ok, m_ok, offs_d, d_ok,
                                                      skt, skd, sgt, sgd, scale,
                                                      CAUSAL, HAS_KPM, SEP_GATES, PRECISION, DOT_DTYPE)
            v = tl.load(v_base + offs_s[:, None] * svt + offs_dv[None, :] * svd,
                        mask=n_ok[:, None] & dv_ok[None, :], other=0.0).to(DOT_DTYPE)
            tile_sum = tl.sum(g, axis=1)
            # suffix sum = (gates after this tile) + in-tile reverse cumsum
            p = (gtot - carry_g - tile_sum)[:, None] + tl.cumsum(g, axis=1, reverse=True)
            p = tl.maximum(p, 0.0)
            carry_g += tile_sum
            clamp_ok = p <= P - 1.0
            bias, pc, zf, zc, w, fl_i, ce_i = _position_bias(p, z_row, vis, slope, P, ALIBI)
            logits = tl.where(vis, s + bias, float("-inf"))
            pr = tl.exp(logits - lse[:, None])  # attention probabilities (0 where masked)

            # dV += P^T dO
            dv_t = tl.dot(tl.trans(pr.to(do.dtype)), do, input_precision=PRECISION)
            tl.atomic_add(dv_base + offs_s[:, None] * DV + offs_dv[None, :], dv_t,
                          mask=n_ok[:, None] & dv_ok[None, :], sem="relaxed")
            dpv = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            dl = tl.where(vis, pr * (dpv - delta[:, None]), 0.0)  # dL/dlogits

            if ALIBI:
                dp = tl.where(clamp_ok, -slope * dl, 0.0)
                dslope += tl.sum(-dl * pc, axis=1)
            else:
                dp = tl.where(clamp_ok, dl * (zc - zf), 0.0)
                tl.atomic_add(dz_row[:, None] + ce_i, dl * w, mask=vis, sem="relaxed")
                tl.atomic_add(dz_row[:, None] + fl_i, dl * (1.0 - w), mask=vis, sem="relaxed")
            # adjoint of the suffix sum: prefix sum of dL/dp
            dg = carry_dp[:, None] + tl.cumsum(dp, axis=1)
            carry_dp += tl.sum(dp, axis=1)
            dgl = tl.where(vis, dg * g * (1.0 - g), 0.0)  # dL/d(gate logit)

            if SEP_GATES:
                ds = (dl * scale).to(q.dtype)
                dgs = (dgl * scale).to(q.dtype)
                dq += tl.dot(ds, k, input_precision=PRECISION)
                dq += tl.dot(dgs, gk, input_precision=PRECISION)
                dk_t = tl.dot(tl.trans(ds), q, input_precision=PRECISION)
                dgk_t = tl.dot(tl.trans(dgs), q, input_precision=PRECISION)
                tl.atomic_add(dgk_base + offs_s[:, None] * D + offs_d[None, :], dgk_t, mask=kd_mask, sem="relaxed")
            else:
                ds = ((dl + dgl) * scale).to(q.dtype)
                dq += tl.dot(ds, k, input_precision=PRECISION)
                dk_t = tl.dot(tl.trans(ds), q, input_precision=PRECISION)
            tl.atomic_add(dk_base + offs_s[:, None] * D + offs_d[None, :], dk_t, mask=kd_mask, sem="relaxed")

        tl.store(DQ + row[:, None] * D + offs_d[None, :], dq, mask=m_ok[:, None] & d_ok[None, :])
        if ALIBI:
            tl.atomic_add(DSLOPES + h, tl.sum(dslope, axis=0), sem="relaxed")


# ----------------------------------------------------------------------------------------
# host side
# ----------------------------------------------------------------------------------------

def _positions(pos, B: int, T: int, name: str, default, device) -> torch.Tensor:
    if pos is None:
        pos = default
    pos = torch.as_tensor(pos, device=device)
    if pos.dim() == 1:
        if pos.shape[0] != T:
            raise ValueError(f"{name} must have shape ({T},) or ({B}, {T}), got {tuple(pos.shape)}")
        pos = pos.unsqueeze(0).expand(B, T)
    elif pos.dim() == 2:
        if pos.shape[1] != T or pos.shape[0] not in (1, B):
            raise ValueError(f"{name} must have shape ({T},) or ({B}, {T}), got {tuple(pos.shape)}")
        pos = pos.expand(B, T)
    else:
        raise ValueError(f"{name} must be 1-D (T,) or 2-D (B, T), got {pos.dim()}-D")
    return pos


def _default_blocks(device: torch.device, D: int) -> tuple[int, int, int, int]:
    """(fwd BLOCK_M, fwd BLOCK_N, bwd BLOCK_M, bwd BLOCK_N). Untuned on GPU."""
    if device.type != "cuda":  # interpreter: few large programs are fastest; blocks >= 32
        return 32, 32, 32, 32
    if D <= 64:
        return 64, 64, 64, 32
    return 64, 32, 32, 32


def kernels_interpreted() -> bool:
    """True when the kernels were built for the Triton interpreter (TRITON_INTERPRET=1 was set when this
    module was imported), i.e. they can run on CPU tensors."""
    return _HAS_TRITON and type(_cope_fwd_kernel).__name__ == "InterpretedFunction"


def _check_device(q: torch.Tensor) -> None:
    # triton decides at decoration time whether a kernel is interpreted, so the environment variable
    # read now would not tell whether CPU tensors can run
    if q.device.type == "cpu" and not kernels_interpreted():
        raise RuntimeError("cope_attention_triton on CPU tensors needs the Triton interpreter: set "
                           "TRITON_INTERPRET=1 before poskit.attention.triton_cope is first imported")


def check_sorted_keys(k_positions: torch.Tensor) -> None:
    """Raise unless the (B, Tk) key positions are non-decreasing along the key axis.

    The gate sums run over the key *index* axis, which is "the keys at later positions" only for sorted
    keys, and the causal key range of a query block is found by searchsorted; unsorted keys would give a
    silently wrong result.  Same message as the reference (CoPEBase.check_positions).
    """
    if k_positions.shape[-1] > 1 and bool((k_positions[:, 1:] < k_positions[:, :-1]).any()):
        raise ValueError("k_positions must be non-decreasing for cope/cope-alibi (gate sums run over later keys)")


def _dot_config(dtype: torch.dtype, device: torch.device):
    """(triton dtype of the tl.dot operands, input_precision)."""
    if dtype == torch.bfloat16 and device.type != "cuda":
        # the interpreter's bf16 tl.dot is wrong: upcast the loaded tiles and multiply in fp32
        return tl.float32, "ieee"
    dot = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]
    # fp32: IEEE precision (no TF32), floor/ceil of the contextual position are precision sensitive;
    # None: the backend default for half inputs
    return dot, "ieee" if dtype == torch.float32 else None


def _stand_ins(k, gk, z, slopes, kpm, lse, kv_end):
    """Pointer arguments for the inputs a launch does not have: the constexpr flags switch their loads off,
    so any valid tensor of the same kind will do. Returns (gate keys, z, slopes, key padding mask)."""
    return (gk if gk is not None else k, z if z is not None else lse,
            slopes if slopes is not None else lse, kpm if kpm is not None else kv_end)


def _launch_fwd(q, k, v, gk, z, slopes, qpos, kpos, kpm, kv_end_f, causal, scale, p_max, blocks, num_warps):
    _check_device(q)
    B, H, Tq, D = q.shape
    Hkv, Tk, DV = k.shape[1], k.shape[2], v.shape[3]
    bm, bn = blocks[0], blocks[1]
    alibi = slopes is not None
    sep = gk is not None
    o = torch.empty(B, H, Tq, DV, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, Tq, device=q.device, dtype=torch.float32)
    gtot = torch.empty(B, H, Tq, device=q.device, dtype=torch.float32)
    gk_, z_, slopes_, kpm_ = _stand_ins(k, gk, z, slopes, kpm, lse, kv_end_f)
    dot_dtype, precision = _dot_config(q.dtype, q.device)
    nqb = triton.cdiv(Tq, bm)
    _cope_fwd_kernel[(nqb, B * H)](
        q, k, v, gk_, z_, slopes_, qpos, kpos, kpm_, kv_end_f,
        o, lse, gtot,
        *q.stride(), *k.stride(), *v.stride(), *gk_.stride(), *o.stride(),
        qpos.stride(0), kpos.stride(0), kpm_.stride(0),
        H, H // Hkv, Tq, Tk, D, DV, p_max, nqb, float(scale),
        CAUSAL=causal, HAS_KPM=kpm is not None, SEP_GATES=sep, ALIBI=alibi,
        PRECISION=precision, DOT_DTYPE=dot_dtype,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_next_pow2(D), BLOCK_DV=_next_pow2(DV),
        num_warps=num_warps,
    )
    return o, lse, gtot


def _launch_bwd(q, k, v, gk, z, slopes, qpos, kpos, kpm, kv_end_b, o, lse, gtot, do,
                causal, scale, p_max, blocks, num_warps):
    _check_device(q)
    B, H, Tq, D = q.shape
    Hkv, Tk, DV = k.shape[1], k.shape[2], v.shape[3]
    bm, bn = blocks[2], blocks[3]
    alibi = slopes is not None
    sep = gk is not None
    do = do.contiguous()
    delta = (do.float() * o.float()).sum(-1).contiguous()  # (B, H, Tq)
    f32 = dict(device=q.device, dtype=torch.float32)
    # dk, dv, dgk, dz, dslopes are shared by query blocks / GQA heads and accumulated with atomics
    dq = torch.empty(B, H, Tq, D, **f32)
    dk = torch.zeros(B, Hkv, Tk, D, **f32)
    dv = torch.zeros(B, Hkv, Tk, DV, **f32)
    dgk = torch.zeros(B, Hkv, Tk, D, **f32) if sep else dk
    dz = torch.zeros(B, H, Tq, p_max, **f32) if not alibi else dq
    dsl = torch.zeros(H, **f32) if alibi else dq
    gk_, z_, slopes_, kpm_ = _stand_ins(k, gk, z, slopes, kpm, lse, kv_end_b)
    dot_dtype, precision = _dot_config(q.dtype, q.device)
    nqb = triton.cdiv(Tq, bm)
    _cope_bwd_kernel[(nqb, B * H)](
        q, k, v, gk_, z_, slopes_, qpos, kpos, kpm_, kv_end_b,
        do, lse, gtot, delta,
        dq, dk, dv, dgk, dz, dsl,
        *q.stride(), *k.stride(), *v.stride(), *gk_.stride(), *do.stride(),
        qpos.stride(0), kpos.stride(0), kpm_.stride(0),
        H, Hkv, H // Hkv, Tq, Tk, D, DV, p_max, nqb, float(scale),
        CAUSAL=causal, HAS_KPM=kpm is not None, SEP_GATES=sep, ALIBI=alibi,
        PRECISION=precision, DOT_DTYPE=dot_dtype,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_next_pow2(D), BLOCK_DV=_next_pow2(DV),
        num_warps=num_warps,
    )
    # custom ops can neither return None nor one tensor twice: each absent input gets its own empty gradient
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
            dgk.to(gk.dtype) if sep else q.new_empty(0),
            dz if z is not None else q.new_empty(0),
            dsl.to(slopes.dtype) if alibi else q.new_empty(0))


# ----------------------------------------------------------------------------------------
# torch.library registration: an opaque op with a registered autograd formula, so that
# torch.compile (fullgraph) traces through it instead of into the Triton launch
# ----------------------------------------------------------------------------------------
@torch.library.custom_op("poskit::cope_attn_fwd", mutates_args=())
def _cope_attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate_keys: Optional[torch.Tensor],
                   z: Optional[torch.Tensor], slopes: Optional[torch.Tensor],
                   q_positions: torch.Tensor, k_positions: torch.Tensor, key_padding_mask: Optional[torch.Tensor],
                   kv_end_fwd: torch.Tensor, kv_end_bwd: torch.Tensor,
                   causal: bool, check_sorted: bool, scale: float, p_max: int, blocks: list[int],
                   num_warps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # the check needs the values (a host sync), so it runs here, at run time, not while tracing
    if check_sorted:
        check_sorted_keys(k_positions)
    return _launch_fwd(q, k, v, gate_keys, z, slopes, q_positions, k_positions, key_padding_mask, kv_end_fwd,
                       causal, scale, p_max, blocks, num_warps)


@_cope_attn_fwd.register_fake
def _(q, k, v, gate_keys, z, slopes, q_positions, k_positions, key_padding_mask, kv_end_fwd, kv_end_bwd,
      causal, check_sorted, scale, p_max, blocks, num_warps):
    B, H, Tq, _ = q.shape
    stats = q.new_empty((B, H, Tq), dtype=torch.float32)
    return q.new_empty((B, H, Tq, v.shape[3])), stats, torch.empty_like(stats)


@torch.library.custom_op("poskit::cope_attn_bwd", mutates_args=())
def _cope_attn_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate_keys: Optional[torch.Tensor],
                   z: Optional[torch.Tensor], slopes: Optional[torch.Tensor],
                   q_positions: torch.Tensor, k_positions: torch.Tensor, key_padding_mask: Optional[torch.Tensor],
                   kv_end_bwd: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, gtot: torch.Tensor,
                   dout: torch.Tensor, causal: bool, scale: float, p_max: int, blocks: list[int],
                   num_warps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                            torch.Tensor]:
    return _launch_bwd(q, k, v, gate_keys, z, slopes, q_positions, k_positions, key_padding_mask, kv_end_bwd,
                       out, lse, gtot, dout, causal, scale, p_max, blocks, num_warps)


@_cope_attn_bwd.register_fake
def _(q, k, v, gate_keys, z, slopes, q_positions, k_positions, key_padding_mask, kv_end_bwd, out, lse, gtot,
      dout, causal, scale, p_max, blocks, num_warps):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            torch.empty_like(gate_keys) if gate_keys is not None else q.new_empty(0),
            torch.empty_like(z) if z is not None else q.new_empty(0),
            torch.empty_like(slopes) if slopes is not None else q.new_empty(0))


def _setup_context(ctx, inputs, output):
    (q, k, v, gk, z, slopes, qpos, kpos, kpm, kv_end_f, kv_end_b,
     causal, check_sorted, scale, p_max, blocks, num_warps) = inputs
    o, lse, gtot = output
    ctx.save_for_backward(q, k, v, gk, z, slopes, qpos, kpos, kpm, kv_end_b, o, lse, gtot)
    ctx.cfg = (causal, scale, p_max, list(blocks), num_warps)


def _backward(ctx, dout, dlse, dgtot):
    q, k, v, gk, z, slopes, qpos, kpos, kpm, kv_end_b, o, lse, gtot = ctx.saved_tensors
    causal, scale, p_max, blocks, num_warps = ctx.cfg
    dq, dk, dv, dgk, dz, dsl = _cope_attn_bwd(q, k, v, gk, z, slopes, qpos, kpos, kpm, kv_end_b, o, lse, gtot,
                                              dout, causal, scale, p_max, blocks, num_warps)
    return (dq, dk, dv,
            dgk if gk is not None else None,
            dz if z is not None else None,
            dsl if slopes is not None else None,
            None, None, None, None, None, None, None, None, None, None, None)


torch.library.register_autograd("poskit::cope_attn_fwd", _backward, setup_context=_setup_context)


def cope_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos_emb: torch.Tensor | None,
    *,
    causal: bool,
    scale: float,
    q_positions=None,
    k_positions=None,
    p_max: int,
    gate_keys: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    slopes: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Fused CoPE attention (Triton forward + fused Triton backward), a torch.library custom op.

    Args:
        q: (B, H, Tq, D) queries.
        k: (B, Hkv, Tk, D) keys, ``H % Hkv == 0`` (GQA in HF ``repeat_kv`` order).
        v: (B, Hkv, Tk, Dv) values.
        pos_emb: (D, p_max) integer-position embeddings ``e`` shared across heads
            (the paper's ``pos_emb[0]``), or None when ``slopes`` is given.
        causal: mask keys with ``k_positions > q_positions``.
        scale: logit scale (e.g. ``D ** -0.5``); applied to q.k and to the gate logits,
            not to ``q @ e``.
        q_positions: (Tq,) or (B, Tq); default ``Tk - Tq + arange(Tq)``.
        k_positions: (Tk,) or (B, Tk), non-decreasing along keys (ValueError otherwise, also when
            ``causal=False``: the gate sums run over later keys); default ``arange(Tk)``.
        p_max: number of integer positions; positions are clamped to ``p_max - 1``.
        gate_keys: (B, Hkv, Tk, D) keys for the gates ("sep-keys"); None = use ``k``.
            Pass ``v`` for the paper's "val-gates" (needs Dv == D).
        key_padding_mask: (B, Tk) bool, True = visible key.
        slopes: (H,) CoPE-ALiBi slopes (paper eq. 10): ``bias = -slopes[h] * p``
            instead of the embedding interpolation; requires ``pos_emb=None``.
        block_m, block_n: optional forward tile sizes (powers of two, >= 16).

    Returns:
        (B, H, Tq, Dv) in q's dtype.  Differentiable w.r.t. q, k, v, gate_keys,
        pos_emb and slopes (fused Triton backward, O(T) extra memory besides fp32
        gradient buffers and the (B, H, Tq, p_max) z / dz tables).
    """
    if not _HAS_TRITON:
        raise ImportError("cope_attention_triton requires the 'triton' package")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-D: q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv)")
    B, H, Tq, D = q.shape
    Bk, Hkv, Tk, Dk = k.shape
    if Bk != B or Dk != D:
        raise ValueError(f"k must have shape ({B}, Hkv, Tk, {D}), got {tuple(k.shape)}")
    if Hkv < 1 or H % Hkv != 0:
        raise ValueError(f"number of query heads H={H} must be a multiple of KV heads Hkv={Hkv} (H % Hkv == 0)")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must have shape ({B}, {Hkv}, {Tk}, Dv), got {tuple(v.shape)}")
    if Tq < 1 or Tk < 1:
        raise ValueError(f"sequence lengths must be >= 1, got Tq={Tq}, Tk={Tk}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q dtype must be one of float16, bfloat16, float32, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not isinstance(p_max, int) or isinstance(p_max, bool) or p_max < 1:
        raise ValueError(f"p_max must be an int >= 1, got {p_max!r}")
    if slopes is not None:
        if pos_emb is not None:
            raise ValueError("pass exactly one of pos_emb (embedding CoPE) or slopes (CoPE-ALiBi), got both")
        if slopes.shape != (H,):
            raise ValueError(f"slopes must have shape (H,) = ({H},), got {tuple(slopes.shape)}")
        slopes = slopes.to(device=q.device)
        if not slopes.is_floating_point():
            slopes = slopes.float()
    else:
        if pos_emb is None:
            raise ValueError("pos_emb must be a (D, p_max) tensor unless slopes (H,) is given")
        if pos_emb.dim() == 3 and pos_emb.shape[0] == 1:
            pos_emb = pos_emb[0]  # the paper's (1, head_dim, npos_max) parameter
        if tuple(pos_emb.shape) != (D, p_max):
            raise ValueError(f"pos_emb must have shape (D, p_max) = ({D}, {p_max}), got {tuple(pos_emb.shape)}")
    if gate_keys is not None:
        if tuple(gate_keys.shape) != tuple(k.shape):
            raise ValueError(
                f"gate_keys must have the shape of k {tuple(k.shape)} (for value gates Dv must equal D), "
                f"got {tuple(gate_keys.shape)}")
        if gate_keys.dtype != q.dtype:
            raise ValueError(f"gate_keys dtype must be {q.dtype}, got {gate_keys.dtype}")
        if gate_keys is k:
            gate_keys = None
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (B, Tk):
            raise ValueError(f"key_padding_mask must have shape (B, Tk) = ({B}, {Tk}), got "
                             f"{tuple(key_padding_mask.shape)}")
        key_padding_mask = key_padding_mask.to(device=q.device, dtype=torch.int8).contiguous()

    dev = q.device
    fm, fn, bm, bn = _default_blocks(dev, max(D, v.shape[-1]))
    if block_m is not None:
        fm = block_m
    if block_n is not None:
        fn = block_n
    for name, val in (("block_m", fm), ("block_n", fn)):
        if val < 16 or val & (val - 1):
            raise ValueError(f"block_m and block_n must be powers of two >= 16, got {name}={val}")

    # z[t, j] = q_t . e[:, j] is a small fp32 table (B, H, Tq, p_max) built outside the op, so autograd
    # turns its gradient dz (from the kernel) into dq += dz e^T and de = q^T dz
    z = None if slopes is not None else torch.matmul(q.float(), pos_emb.float())
    check_sorted = k_positions is not None
    if causal or check_sorted:
        kpos = _positions(k_positions, B, Tk, "k_positions", torch.arange(Tk, device=dev), dev)
        kpos = kpos.double() if kpos.is_floating_point() else kpos.long()
        kpos = kpos.contiguous()
    if causal:
        qpos = _positions(q_positions, B, Tq, "q_positions", torch.arange(Tk - Tq, Tk, device=dev), dev)
        if kpos.is_floating_point() or qpos.is_floating_point():
            kpos, qpos = kpos.double(), qpos.double()
        else:
            qpos = qpos.long()
        qpos = qpos.contiguous()

        def kv_end(bsz: int) -> torch.Tensor:
            # per query block: one past the last key visible to its latest query (keys are sorted)
            nqb = -(-Tq // bsz)
            pad = nqb * bsz - Tq
            qp = qpos
            if pad:
                qp = torch.cat([qp, qp[:, -1:].expand(B, pad)], dim=1)
            qmax = qp.view(B, nqb, bsz).amax(-1).contiguous()
            return torch.searchsorted(kpos, qmax, right=True).to(torch.int32).contiguous()

        kv_end_f = kv_end(fm)
        kv_end_b = kv_end_f if bm == fm else kv_end(bm)
        if kpos.dtype == torch.float64:  # kernel compares in fp32 for float positions
            kpos, qpos = kpos.float(), qpos.float()
    else:
        qpos = torch.zeros(1, 1, device=dev, dtype=torch.int32)  # unused without the causal mask
        if not check_sorted:
            kpos = qpos
        kv_end_f = torch.full((B, -(-Tq // fm)), Tk, device=dev, dtype=torch.int32)
        kv_end_b = kv_end_f if bm == fm else torch.full((B, -(-Tq // bm)), Tk, device=dev, dtype=torch.int32)

    num_warps = 4 if max(D, v.shape[-1]) <= 64 else 8
    out, _, _ = _cope_attn_fwd(q, k, v, gate_keys, z, slopes, qpos, kpos, key_padding_mask, kv_end_f, kv_end_b,
                               bool(causal), check_sorted, float(scale), int(p_max), [fm, fn, bm, bn], num_warps)
    return out
