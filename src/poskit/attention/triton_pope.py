"""Fused PoPE flash attention (forward + backward) in Triton.

PoPE (Polar Coordinate Positional Embedding, eq. 2-9 of the paper) scores a
query ``q_t`` against a key ``k_s`` as

    logit[t, s] = scale * sum_c mu_q[t, c] * mu_k[s, c] * cos(a_k[s, c] - a_q[t, c] + delta[h, c])

with ``mu = softplus(x)`` (or ``x`` itself when ``softplus=False``) and angles
``a_q[t, c] = q_pos[t] * theta_c``, ``a_k[s, c] = k_pos[s] * theta_c``.  In
Cartesian form (eq. 9) this is ``scale * (q'_x . k'_x + q'_y . k'_y)`` with

    q'_x = mu_q * cos(a_q - delta),  q'_y = mu_q * sin(a_q - delta)
    k'_x = mu_k * cos(a_k),          k'_y = mu_k * sin(a_k)

(the phase bias sits on the query side so that GQA keys stay shared).

The kernels read ``q``/``k``/``v`` plus the d-wide ``cos``/``sin`` tables of
the angles (computed by the caller in float64 and cast to fp32, so that large
positions keep their precision), build ``q'``/``k'`` in registers and never
write the 2d-wide Cartesian tensors to global memory.  The backward pass is
FlashAttention-2 style: the forward saves the row logsumexp, the backward
recomputes P; one kernel computes dk/dv (looping over the query heads of a GQA
group, so no atomics), another computes dq and per-block partials of
d delta, which are reduced in torch.

Masking is by *position*: with ``causal=True`` key ``s`` is visible to query
``t`` iff ``k_positions[s] <= q_positions[t]`` (so a block of new queries
against a KV cache works).  Whole key/query blocks are skipped using per-block
min/max positions computed on the host side with a few tiny torch ops (no
device sync); skipping is exact for any ordering and most effective when
queries and keys are sorted ascending by position, which is what all callers
do.  Masking inside the remaining blocks is always element-wise.  Rows with
no visible key produce 0 output and zero gradients.

On CPU the kernels run under the Triton interpreter (``TRITON_INTERPRET=1``
must be set before ``triton`` is imported).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

try:  # triton is an optional dependency
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None
    HAS_TRITON = False

__all__ = ["pope_attention_triton", "kernels_interpreted", "HAS_TRITON", "BLOCK_CONFIG_OVERRIDE", "GQA_DKDV_MODE"]

_LOG2E = 1.4426950408889634

# Optional overrides of the launch configuration, e.g. from a benchmark sweep:
#   BLOCK_CONFIG_OVERRIDE["fwd"] = (BLOCK_M, BLOCK_N, num_warps, num_stages)
# keys: "fwd", "bwd_dkdv", "bwd_dq".
BLOCK_CONFIG_OVERRIDE: dict = {}
# GQA dk/dv strategy: "loop" (each program loops over the query heads of its kv group,
# no extra memory), "split" (one program per query head writing fp32 partials summed in
# torch: G x more programs, for small B * Hkv * Tk), "auto" (split when looping would
# launch fewer than 2 programs per SM).
GQA_DKDV_MODE: str = "auto"

_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------
if HAS_TRITON:

    @triton.jit
    def _softplus(x):
        # stable softplus without libdevice: max(x,0) + log(1 + exp(-|x|)),
        # with a series for log1p when exp(-|x|) is tiny.
        e = tl.exp(-tl.abs(x))
        lp = tl.where(e < 1e-4, e * (1.0 - 0.5 * e), tl.log(1.0 + e))
        return tl.maximum(x, 0.0) + lp

    @triton.jit
    def _dsoftplus(x):
        # d softplus / dx = sigmoid(x)
        return 1.0 / (1.0 + tl.exp(-x))

    @triton.jit
    def _mm(a, b, acc, DOT_IEEE: tl.constexpr):
        if DOT_IEEE:
            return tl.dot(a, b, acc, input_precision="ieee")
        else:
            return tl.dot(a, b, acc)

    @triton.jit
    def _load_polar(X, C, S, offs_t, t_mask, offs_d, stride_t, stride_d, cs_t, cs_d,
                    HEAD_D: tl.constexpr, SOFTPLUS: tl.constexpr):
        """Load raw x (fp32), its magnitude mu and the angle tables cos/sin."""
        d_mask = offs_d < HEAD_D
        m2 = t_mask[:, None] & d_mask[None, :]
        x = tl.load(X + offs_t[:, None] * stride_t + offs_d[None, :] * stride_d, mask=m2, other=0.0)
        x = x.to(tl.float32)
        c = tl.load(C + offs_t[:, None] * cs_t + offs_d[None, :] * cs_d, mask=m2, other=0.0)
        s = tl.load(S + offs_t[:, None] * cs_t + offs_d[None, :] * cs_d, mask=m2, other=0.0)
        if SOFTPLUS:
            mu = _softplus(x)
        else:
            mu = x
        return x, mu, c, s

    @triton.jit
    def _load_delta(DCOS, DSIN, h, offs_d, HEAD_D: tl.constexpr):
        """cos and sin of head h's phase bias delta (fp32, one per channel)."""
        d_mask = offs_d < HEAD_D
        dc = tl.load(DCOS + h * HEAD_D + offs_d, mask=d_mask, other=0.0)
        ds = tl.load(DSIN + h * HEAD_D + offs_d, mask=d_mask, other=0.0)
        return dc, ds

    @triton.jit
    def _load_query(Q, QC, QS, dc, ds, offs_m, m_mask, offs_d, sq_t, sq_d, sqc_t, sqc_d,
                    HEAD_D: tl.constexpr, SOFTPLUS: tl.constexpr):
        """Raw q, its magnitude and cos/sin of its angle minus the phase bias: the query's polar form."""
        q_raw, mu_q, qc, qs = _load_polar(Q, QC, QS, offs_m, m_mask, offs_d, sq_t, sq_d, sqc_t, sqc_d,
                                          HEAD_D, SOFTPLUS)
        cq = qc * dc[None, :] + qs * ds[None, :]  # cos(a_q - delta)
        sq = qs * dc[None, :] - qc * ds[None, :]  # sin(a_q - delta)
        return q_raw, mu_q, cq, sq

    @triton.jit
    def _key_block_scores(qx, qy, qpos, K, KC, KS, KPOS, KPAD, offs_n, n_mask, offs_d,
                          stride_kt, stride_kd, kcs_t, kcs_d, stride_kpt, stride_padt,
                          MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                          SOFTPLUS: tl.constexpr, HEAD_D: tl.constexpr,
                          DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr):
        """Logits of a query block against one key block (masked entries -inf) and the block's Cartesian
        keys; MASKED=False skips the element mask for blocks every query sees whole."""
        _, mu_k, kc, ks = _load_polar(K, KC, KS, offs_n, n_mask, offs_d, stride_kt, stride_kd,
                                      kcs_t, kcs_d, HEAD_D, SOFTPLUS)
        kx = (mu_k * kc).to(DOT_DTYPE)
        ky = (mu_k * ks).to(DOT_DTYPE)
        s = _mm(qx, tl.trans(kx), None, DOT_IEEE)
        s = _mm(qy, tl.trans(ky), s, DOT_IEEE)
        if MASKED:
            valid = n_mask[None, :]
            if CAUSAL:
                kpos = tl.load(KPOS + offs_n * stride_kpt, mask=n_mask, other=0)
                valid = valid & (kpos[None, :] <= qpos[:, None])
            if HAS_PAD:
                pad = tl.load(KPAD + offs_n * stride_padt, mask=n_mask, other=0)
                valid = valid & (pad != 0)[None, :]
            s = tl.where(valid, s, float("-inf"))
        elif HAS_PAD:
            pad = tl.load(KPAD + offs_n * stride_padt, mask=n_mask, other=0)
            s = tl.where((pad != 0)[None, :], s, float("-inf"))
        return s, kx, ky

    @triton.jit
    def _key_block_range(BOUNDS, b, sbd_b, pid_m, sbd_m, Tk, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
        """Key blocks of query block pid_m: [0, n_full) seen whole by every query, [n_lo, n_hi) in part
        (causal boundary, ragged tail); under causal masking the host precomputed them from positions."""
        if CAUSAL:
            bp = BOUNDS + b * sbd_b + pid_m * sbd_m
            n_full = tl.load(bp)
            n_lo = tl.load(bp + 1)
            n_hi = tl.load(bp + 2)
        else:
            n_full = Tk // BLOCK_N
            n_lo = n_full
            n_hi = tl.cdiv(Tk, BLOCK_N)
        return n_full, n_lo, n_hi

    @triton.jit
    def _fwd_inner(acc, l_i, m_i, qx, qy, qpos, K, V, KC, KS, KPOS, KPAD,
                   lo, hi, Tk, offs_n0, offs_d, offs_dv,
                   stride_kt, stride_kd, stride_vt, stride_vd, kcs_t, kcs_d, stride_kpt, stride_padt,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                   SOFTPLUS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                   BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr):
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + offs_n0
            n_mask = offs_n < Tk
            s, _, _ = _key_block_scores(qx, qy, qpos, K, KC, KS, KPOS, KPAD, offs_n, n_mask, offs_d,
                                        stride_kt, stride_kd, kcs_t, kcs_d, stride_kpt, stride_padt,
                                        MASKED, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, DOT_DTYPE, DOT_IEEE)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + offs_n[:, None] * stride_vt + offs_dv[None, :] * stride_vd,
                        mask=n_mask[:, None] & (offs_dv < HEAD_DV)[None, :], other=0.0)
            acc = acc * alpha[:, None]
            acc = _mm(p.to(DOT_DTYPE), v.to(DOT_DTYPE), acc, DOT_IEEE)
            m_i = m_new
        return acc, l_i, m_i

    @triton.jit
    def _pope_fwd_kernel(
        Q, K, V, DCOS, DSIN, QC, QS, KC, KS, QPOS, KPOS, KPAD, BOUNDS, O, LSE,
        sq_b, sq_h, sq_t, sq_d,
        sk_b, sk_h, sk_t, sk_d,
        sv_b, sv_h, sv_t, sv_d,
        so_b, so_h, so_t, so_d,
        sqc_b, sqc_t, sqc_d,
        skc_b, skc_t, skc_d,
        sqp_b, sqp_t, skp_b, skp_t, spad_b, spad_t,
        sbd_b, sbd_m,
        H, G, Tq, Tk, qk_scale,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, SOFTPLUS: tl.constexpr,
        HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr,
    ):
        # heaviest (last) query blocks first under causal masking
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        hk = h // G

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n0 = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        m_mask = offs_m < Tq

        dc, ds = _load_delta(DCOS, DSIN, h, offs_d, HEAD_D)
        _, mu_q, cq, sq = _load_query(Q + b * sq_b + h * sq_h, QC + b * sqc_b, QS + b * sqc_b, dc, ds,
                                      offs_m, m_mask, offs_d, sq_t, sq_d, sqc_t, sqc_d, HEAD_D, SOFTPLUS)
        # fold scale * log2(e) into the query
        qx = (mu_q * cq * qk_scale).to(DOT_DTYPE)
        qy = (mu_q * sq * qk_scale).to(DOT_DTYPE)

        qpos = tl.load(QPOS + b * sqp_b + offs_m * sqp_t, mask=m_mask, other=0)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

        Kb = K + b * sk_b + hk * sk_h
        Vb = V + b * sv_b + hk * sv_h
        KCb = KC + b * skc_b
        KSb = KS + b * skc_b
        KPOSb = KPOS + b * skp_b
        KPADb = KPAD + b * spad_b

        n_full, n_lo, n_hi = _key_block_range(BOUNDS, b, sbd_b, pid_m, sbd_m, Tk, CAUSAL, BLOCK_N)
        # blocks fully visible to every query of this block: no element mask
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qx, qy, qpos, Kb, Vb, KCb, KSb, KPOSb, KPADb,
                                   0, n_full * BLOCK_N, Tk, offs_n0, offs_d, offs_dv,
                                   sk_t, sk_d, sv_t, sv_d, skc_t, skc_d, skp_t, spad_t,
                                   False, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, HEAD_DV,
                                   BLOCK_N, DOT_DTYPE, DOT_IEEE)
        # partially visible blocks (causal boundary, ragged tail)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qx, qy, qpos, Kb, Vb, KCb, KSb, KPOSb, KPADb,
                                   n_lo * BLOCK_N, n_hi * BLOCK_N, Tk, offs_n0, offs_d, offs_dv,
                                   sk_t, sk_d, sv_t, sv_d, skc_t, skc_d, skp_t, spad_t,
                                   True, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, HEAD_DV,
                                   BLOCK_N, DOT_DTYPE, DOT_IEEE)

        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        Ob = O + b * so_b + h * so_h
        tl.store(Ob + offs_m[:, None] * so_t + offs_dv[None, :] * so_d, out.to(O.dtype.element_ty),
                 mask=m_mask[:, None] & (offs_dv < HEAD_DV)[None, :])
        tl.store(LSE + (b * H + h) * Tq + offs_m, lse, mask=m_mask)

    @triton.jit
    def _pope_bwd_preprocess(O, DO, DSUM,
                             so_b, so_h, so_t, so_d, sdo_b, sdo_h, sdo_t, sdo_d,
                             H, Tq, HEAD_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
        pid_m = tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_dv = tl.arange(0, BLOCK_DV)
        msk = (offs_m < Tq)[:, None] & (offs_dv < HEAD_DV)[None, :]
        o = tl.load(O + b * so_b + h * so_h + offs_m[:, None] * so_t + offs_dv[None, :] * so_d,
                    mask=msk, other=0.0).to(tl.float32)
        do = tl.load(DO + b * sdo_b + h * sdo_h + offs_m[:, None] * sdo_t + offs_dv[None, :] * sdo_d,
                     mask=msk, other=0.0).to(tl.float32)
        tl.store(DSUM + (b * H + h) * Tq + offs_m, tl.sum(o * do, 1), mask=offs_m < Tq)

    @triton.jit
    def _bwd_dkdv_inner(dkx, dky, dv, kx_l, ky_l, v, kpos, kpad_ok,
                        Q, DO, QC, QS, LSE, DSUM, dc, ds,
                        lo, hi, Tq, offs_m0, offs_d, offs_dv, scale,
                        sq_t, sq_d, sdo_t, sdo_d, sqc_t, sqc_d, QPOS, sqp_t,
                        MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                        SOFTPLUS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                        BLOCK_M: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr):
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + offs_m0
            m_mask = offs_m < Tq
            _, mu_q, cq, sq = _load_query(Q, QC, QS, dc, ds, offs_m, m_mask, offs_d, sq_t, sq_d,
                                          sqc_t, sqc_d, HEAD_D, SOFTPLUS)
            qx = (mu_q * cq * scale).to(DOT_DTYPE)
            qy = (mu_q * sq * scale).to(DOT_DTYPE)
            # out-of-range rows get lse=+inf -> P = 0
            lse = tl.load(LSE + offs_m, mask=m_mask, other=float("inf"))
            dsum = tl.load(DSUM + offs_m, mask=m_mask, other=0.0)
            do = tl.load(DO + offs_m[:, None] * sdo_t + offs_dv[None, :] * sdo_d,
                         mask=m_mask[:, None] & (offs_dv < HEAD_DV)[None, :], other=0.0)
            sT = _mm(kx_l, tl.trans(qx), None, DOT_IEEE)
            sT = _mm(ky_l, tl.trans(qy), sT, DOT_IEEE)  # (BLOCK_N, BLOCK_M), log2 units
            if MASKED and CAUSAL:
                qpos = tl.load(QPOS + offs_m * sqp_t, mask=m_mask, other=0)
                valid = kpos[:, None] <= qpos[None, :]
                if HAS_PAD:
                    valid = valid & kpad_ok[:, None]
                sT = tl.where(valid, sT, float("-inf"))
            elif HAS_PAD:
                sT = tl.where(kpad_ok[:, None], sT, float("-inf"))
            pT = tl.exp2(sT - lse[None, :])
            dv = _mm(pT.to(DOT_DTYPE), do.to(DOT_DTYPE), dv, DOT_IEEE)
            dpT = _mm(v, tl.trans(do.to(DOT_DTYPE)), None, DOT_IEEE)
            dsT = (pT * (dpT - dsum[None, :])).to(DOT_DTYPE)
            dkx = _mm(dsT, qx, dkx, DOT_IEEE)
            dky = _mm(dsT, qy, dky, DOT_IEEE)
        return dkx, dky, dv

    @triton.jit
    def _pope_bwd_dkdv_kernel(
        Q, K, V, DCOS, DSIN, QC, QS, KC, KS, QPOS, KPOS, KPAD, BOUNDS, DO, LSE, DSUM, DK, DV,
        sq_b, sq_h, sq_t, sq_d,
        sk_b, sk_h, sk_t, sk_d,
        sv_b, sv_h, sv_t, sv_d,
        sdo_b, sdo_h, sdo_t, sdo_d,
        sdk_b, sdk_h, sdk_t, sdk_d,
        sdv_b, sdv_h, sdv_t, sdv_d,
        sqc_b, sqc_t, sqc_d,
        skc_b, skc_t, skc_d,
        sqp_b, sqp_t, skp_b, skp_t, spad_b, spad_t,
        sbd_b, sbd_n,
        H, G, Tq, Tk, scale,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, SOFTPLUS: tl.constexpr,
        HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr, HEAD_SPLIT: tl.constexpr,
    ):
        # HEAD_SPLIT=False: one program per (key block, kv head) looping over the G query
        #   heads of its group; writes dk/dv directly.
        # HEAD_SPLIT=True: one program per (key block, query head); writes per-query-head
        #   partials (B, H, Tk, .) that the host sums over each group (more parallelism).
        pid_n = tl.program_id(0)
        b = tl.program_id(2).to(tl.int64)
        if HEAD_SPLIT:
            h0 = tl.program_id(1)
            hk = h0 // G
            n_heads = 1
            h_out = h0
        else:
            hk = tl.program_id(1)
            h0 = hk * G
            n_heads = G
            h_out = hk

        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m0 = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        n_mask = offs_n < Tk
        d_mask = offs_d < HEAD_D
        dv_mask = offs_dv < HEAD_DV

        Kb = K + b * sk_b + hk * sk_h
        k_raw, mu_k, kc, ks = _load_polar(Kb, KC + b * skc_b, KS + b * skc_b, offs_n, n_mask, offs_d,
                                          sk_t, sk_d, skc_t, skc_d, HEAD_D, SOFTPLUS)
        kx_l = (mu_k * kc * 1.4426950408889634).to(DOT_DTYPE)
        ky_l = (mu_k * ks * 1.4426950408889634).to(DOT_DTYPE)
        v = tl.load(V + b * sv_b + hk * sv_h + offs_n[:, None] * sv_t + offs_dv[None, :] * sv_d,
                    mask=n_mask[:, None] & dv_mask[None, :], other=0.0).to(DOT_DTYPE)
        kpos = tl.load(KPOS + b * skp_b + offs_n * skp_t, mask=n_mask, other=0)
        if HAS_PAD:
            kpad_ok = tl.load(KPAD + b * spad_b + offs_n * spad_t, mask=n_mask, other=0) != 0
        else:
            kpad_ok = n_mask

        dkx = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dky = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

        if CAUSAL:
            bp = BOUNDS + b * sbd_b + pid_n * sbd_n
            m_lo = tl.load(bp)
            m_mid = tl.load(bp + 1)
            m_hi = tl.load(bp + 2)
        else:
            m_lo = 0
            m_mid = 0
            m_hi = tl.cdiv(Tq, BLOCK_M)

        for i in range(n_heads):
            h = h0 + i
            Qb = Q + b * sq_b + h * sq_h
            DOb = DO + b * sdo_b + h * sdo_h
            LSEb = LSE + (b * H + h) * Tq
            DSUMb = DSUM + (b * H + h) * Tq
            dc, ds = _load_delta(DCOS, DSIN, h, offs_d, HEAD_D)
            # query blocks that see only part of this key block
            dkx, dky, dv = _bwd_dkdv_inner(dkx, dky, dv, kx_l, ky_l, v, kpos, kpad_ok,
                                           Qb, DOb, QC + b * sqc_b, QS + b * sqc_b, LSEb, DSUMb, dc, ds,
                                           m_lo * BLOCK_M, m_mid * BLOCK_M, Tq, offs_m0, offs_d, offs_dv,
                                           scale, sq_t, sq_d, sdo_t, sdo_d, sqc_t, sqc_d,
                                           QPOS + b * sqp_b, sqp_t,
                                           True, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, HEAD_DV,
                                           BLOCK_M, DOT_DTYPE, DOT_IEEE)
            # query blocks that see all of it
            dkx, dky, dv = _bwd_dkdv_inner(dkx, dky, dv, kx_l, ky_l, v, kpos, kpad_ok,
                                           Qb, DOb, QC + b * sqc_b, QS + b * sqc_b, LSEb, DSUMb, dc, ds,
                                           m_mid * BLOCK_M, m_hi * BLOCK_M, Tq, offs_m0, offs_d, offs_dv,
                                           scale, sq_t, sq_d, sdo_t, sdo_d, sqc_t, sqc_d,
                                           QPOS + b * sqp_b, sqp_t,
                                           False, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, HEAD_DV,
                                           BLOCK_M, DOT_DTYPE, DOT_IEEE)

        # through k' = mu_k * (cos a_k, sin a_k) and mu_k = softplus(k)
        dmu = dkx * kc + dky * ks
        if SOFTPLUS:
            dmu = dmu * _dsoftplus(k_raw)
        tl.store(DK + b * sdk_b + h_out * sdk_h + offs_n[:, None] * sdk_t + offs_d[None, :] * sdk_d,
                 dmu.to(DK.dtype.element_ty), mask=n_mask[:, None] & d_mask[None, :])
        tl.store(DV + b * sdv_b + h_out * sdv_h + offs_n[:, None] * sdv_t + offs_dv[None, :] * sdv_d,
                 dv.to(DV.dtype.element_ty), mask=n_mask[:, None] & dv_mask[None, :])

    @triton.jit
    def _bwd_dq_inner(dqx, dqy, qx_l, qy_l, do, lse, dsum, qpos,
                      K, V, KC, KS, KPOS, KPAD,
                      lo, hi, Tk, offs_n0, offs_d, offs_dv,
                      sk_t, sk_d, sv_t, sv_d, skc_t, skc_d, skp_t, spad_t,
                      MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                      SOFTPLUS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                      BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr):
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + offs_n0
            n_mask = offs_n < Tk
            s, kx, ky = _key_block_scores(qx_l, qy_l, qpos, K, KC, KS, KPOS, KPAD, offs_n, n_mask, offs_d,
                                          sk_t, sk_d, skc_t, skc_d, skp_t, spad_t,
                                          MASKED, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, DOT_DTYPE, DOT_IEEE)
            p = tl.exp2(s - lse[:, None])
            v = tl.load(V + offs_n[:, None] * sv_t + offs_dv[None, :] * sv_d,
                        mask=n_mask[:, None] & (offs_dv < HEAD_DV)[None, :], other=0.0)
            dp = _mm(do, tl.trans(v.to(DOT_DTYPE)), None, DOT_IEEE)
            dsc = (p * (dp - dsum[:, None])).to(DOT_DTYPE)
            dqx = _mm(dsc, kx, dqx, DOT_IEEE)
            dqy = _mm(dsc, ky, dqy, DOT_IEEE)
        return dqx, dqy

    @triton.jit
    def _pope_bwd_dq_kernel(
        Q, K, V, DCOS, DSIN, QC, QS, KC, KS, QPOS, KPOS, KPAD, BOUNDS, DO, LSE, DSUM, DQ, DDELTA,
        sq_b, sq_h, sq_t, sq_d,
        sk_b, sk_h, sk_t, sk_d,
        sv_b, sv_h, sv_t, sv_d,
        sdo_b, sdo_h, sdo_t, sdo_d,
        sdq_b, sdq_h, sdq_t, sdq_d,
        sqc_b, sqc_t, sqc_d,
        skc_b, skc_t, skc_d,
        sqp_b, sqp_t, skp_b, skp_t, spad_b, spad_t,
        sbd_b, sbd_m,
        H, G, Tq, Tk, scale,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, SOFTPLUS: tl.constexpr,
        HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        DOT_DTYPE: tl.constexpr, DOT_IEEE: tl.constexpr,
    ):
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        hk = h // G
        n_mblocks = tl.num_programs(0)

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n0 = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        m_mask = offs_m < Tq
        d_mask = offs_d < HEAD_D

        dc, ds = _load_delta(DCOS, DSIN, h, offs_d, HEAD_D)
        q_raw, mu_q, cq, sq = _load_query(Q + b * sq_b + h * sq_h, QC + b * sqc_b, QS + b * sqc_b, dc, ds,
                                          offs_m, m_mask, offs_d, sq_t, sq_d, sqc_t, sqc_d, HEAD_D, SOFTPLUS)
        qk_scale = scale * 1.4426950408889634
        qx_l = (mu_q * cq * qk_scale).to(DOT_DTYPE)
        qy_l = (mu_q * sq * qk_scale).to(DOT_DTYPE)
        do = tl.load(DO + b * sdo_b + h * sdo_h + offs_m[:, None] * sdo_t + offs_dv[None, :] * sdo_d,
                     mask=m_mask[:, None] & (offs_dv < HEAD_DV)[None, :], other=0.0).to(DOT_DTYPE)
        lse = tl.load(LSE + (b * H + h) * Tq + offs_m, mask=m_mask, other=float("inf"))
        dsum = tl.load(DSUM + (b * H + h) * Tq + offs_m, mask=m_mask, other=0.0)
        qpos = tl.load(QPOS + b * sqp_b + offs_m * sqp_t, mask=m_mask, other=0)

        dqx = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        dqy = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        Kb = K + b * sk_b + hk * sk_h
        Vb = V + b * sv_b + hk * sv_h
        KCb = KC + b * skc_b
        KSb = KS + b * skc_b
        KPOSb = KPOS + b * skp_b
        KPADb = KPAD + b * spad_b
        n_full, n_lo, n_hi = _key_block_range(BOUNDS, b, sbd_b, pid_m, sbd_m, Tk, CAUSAL, BLOCK_N)
        dqx, dqy = _bwd_dq_inner(dqx, dqy, qx_l, qy_l, do, lse, dsum, qpos, Kb, Vb, KCb, KSb, KPOSb, KPADb,
                                 0, n_full * BLOCK_N, Tk, offs_n0, offs_d, offs_dv,
                                 sk_t, sk_d, sv_t, sv_d, skc_t, skc_d, skp_t, spad_t,
                                 False, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, HEAD_DV,
                                 BLOCK_N, DOT_DTYPE, DOT_IEEE)
        dqx, dqy = _bwd_dq_inner(dqx, dqy, qx_l, qy_l, do, lse, dsum, qpos, Kb, Vb, KCb, KSb, KPOSb, KPADb,
                                 n_lo * BLOCK_N, n_hi * BLOCK_N, Tk, offs_n0, offs_d, offs_dv,
                                 sk_t, sk_d, sv_t, sv_d, skc_t, skc_d, skp_t, spad_t,
                                 True, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, HEAD_DV,
                                 BLOCK_N, DOT_DTYPE, DOT_IEEE)
        # gradients w.r.t. the unscaled Cartesian query q' = (qx, qy)
        dqx = dqx * scale
        dqy = dqy * scale
        dmu = dqx * cq + dqy * sq
        if SOFTPLUS:
            dq = dmu * _dsoftplus(q_raw)
        else:
            dq = dmu
        tl.store(DQ + b * sdq_b + h * sdq_h + offs_m[:, None] * sdq_t + offs_d[None, :] * sdq_d,
                 dq.to(DQ.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])
        # d qx / d delta = mu sin(a - delta) = qy ; d qy / d delta = -mu cos(a - delta) = -qx
        g = tl.sum(dqx * (mu_q * sq) - dqy * (mu_q * cq), 0)
        tl.store(DDELTA + ((b * H + h) * n_mblocks + pid_m) * HEAD_D + offs_d, g, mask=d_mask)


# ---------------------------------------------------------------------------
# host-side helpers
# ---------------------------------------------------------------------------
def _next_pow2(x: int) -> int:
    return 1 << (max(int(x), 1) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _config(kind: str, block_d: int, device: torch.device, tq: int):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a kernel.

    BLOCK_M indexes queries and BLOCK_N keys in every kernel.  Chosen by the
    padded head dim; untuned guesses for H100-class GPUs (sweep with
    benchmarks/triton_pope.py and set BLOCK_CONFIG_OVERRIDE)."""
    if kind in BLOCK_CONFIG_OVERRIDE:
        return tuple(BLOCK_CONFIG_OVERRIDE[kind])
    if device.type != "cuda":  # interpreter: small blocks are fastest
        return (32, 32, 4, 1)
    bm, bn, warps, stages = _gpu_config(kind, block_d)
    if kind != "bwd_dkdv":  # few queries (decode): don't waste a 128-row tile
        bm = min(bm, max(16, _next_pow2(tq)))
    return bm, bn, warps, stages


def _gpu_config(kind: str, block_d: int):
    if kind == "fwd":
        if block_d <= 64:
            return (128, 64, 4, 3)
        if block_d <= 128:
            return (128, 64, 8, 2)
        return (64, 32, 4, 2)
    if kind == "bwd_dkdv":
        if block_d <= 64:
            return (32, 64, 4, 3)
        if block_d <= 128:
            return (32, 64, 8, 2)
        return (32, 32, 8, 1)
    if kind == "bwd_dq":
        if block_d <= 64:
            return (64, 64, 4, 3)
        if block_d <= 128:
            return (64, 32, 8, 2)
        return (32, 32, 8, 1)
    raise KeyError(kind)


def _gqa_head_split(G: int, n_programs: int, device: torch.device) -> bool:
    """Whether the dk/dv kernel should split GQA groups across programs."""
    mode = GQA_DKDV_MODE
    if mode not in ("auto", "loop", "split"):
        raise ValueError(f"GQA_DKDV_MODE must be 'auto', 'loop' or 'split', got {mode!r}")
    if G == 1 or mode == "loop":
        return False
    if mode == "split":
        return True
    if device.type != "cuda":
        return False
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return n_programs < 2 * sms


def _dot_dtype(dtype: torch.dtype, device: torch.device):
    """(triton dtype for tl.dot operands, use ieee fp32 precision)."""
    if dtype == torch.float16:
        return tl.float16, False
    if dtype == torch.bfloat16:
        if device.type == "cuda":
            return tl.bfloat16, False
        return tl.float32, True  # interpreter's bf16 dot is unreliable
    allow_tf32 = device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32
    return tl.float32, not allow_tf32


def _block_minmax(pos: torch.Tensor, block: int):
    """Per-block (min, max) of positions (Bp, T) over valid entries -> (Bp, nblocks)."""
    bp, t = pos.shape
    n = _cdiv(t, block)
    pad = n * block - t
    pos = pos.to(torch.int64)
    info = torch.iinfo(torch.int64)
    if pad:
        pmax = torch.cat([pos, pos.new_full((bp, pad), info.min)], 1)
        pmin = torch.cat([pos, pos.new_full((bp, pad), info.max)], 1)
    else:
        pmax = pmin = pos
    return pmin.view(bp, n, block).amin(-1), pmax.view(bp, n, block).amax(-1)


def _kv_bounds(qpos, kpos, tk: int, block_m: int, block_n: int):
    """For each (batch, query block): [n_full, n_lo, n_hi] in key blocks.

    Key blocks [0, n_full) are visible to every query of the block (no causal
    mask needed); blocks [n_lo, n_hi) need element-wise masking; the rest are
    skipped."""
    qmin, qmax = _block_minmax(qpos, block_m)
    kmin, kmax = _block_minmax(kpos, block_n)
    n_n = kmin.shape[1]
    vis = kmin[:, None, :] <= qmax[:, :, None]  # (Bp, nM, nN)
    full = kmax[:, None, :] <= qmin[:, :, None]
    if tk % block_n:
        full[..., -1] = False  # ragged tail always goes through the masked path
    ar = torch.arange(n_n, device=vis.device)
    hi = torch.where(vis, ar + 1, 0).amax(-1)
    lo = torch.minimum(torch.where(vis, ar, n_n).amin(-1), hi)
    n_full = full.to(torch.int32).cumprod(-1).sum(-1)
    lo = torch.maximum(lo, n_full)
    return torch.stack([n_full, lo, hi], -1).to(torch.int32).contiguous()


def _q_bounds(qpos, kpos, block_m: int, block_n: int):
    """For each (batch, key block): [m_lo, m_mid, m_hi] in query blocks.

    Query blocks [m_lo, m_mid) see part of the key block (masked path),
    [m_mid, m_hi) see all of it; the rest are skipped."""
    qmin, qmax = _block_minmax(qpos, block_m)
    kmin, kmax = _block_minmax(kpos, block_n)
    n_m = qmin.shape[1]
    rel = qmax[:, None, :] >= kmin[:, :, None]  # (Bp, nN, nM)
    fullq = qmin[:, None, :] >= kmax[:, :, None]
    ar = torch.arange(n_m, device=rel.device)
    hi = torch.where(rel, ar + 1, 0).amax(-1)
    lo = torch.minimum(torch.where(rel, ar, n_m).amin(-1), hi)
    suffix = fullq.flip(-1).to(torch.int32).cumprod(-1).sum(-1)
    mid = torch.maximum(torch.minimum(n_m - suffix, hi), lo)
    return torch.stack([lo, mid, hi], -1).to(torch.int32).contiguous()


def _pos2d(pos: torch.Tensor) -> torch.Tensor:
    return pos.unsqueeze(0) if pos.dim() == 1 else pos


def _bstride(x: torch.Tensor, batched_ndim: int) -> int:
    """Batch stride of an optionally-batched tensor (0 when unbatched)."""
    return x.stride(0) if x.dim() == batched_ndim else 0


def _tab_strides(t: torch.Tensor):
    # batch stride 0 for an unbatched or size-1 leading dim: every sequence reads the same rows
    if t.dim() == 3:
        return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1), t.stride(2)
    return 0, t.stride(0), t.stride(1)


def _pos_strides(p: torch.Tensor):
    if p.dim() == 2:
        return (p.stride(0) if p.shape[0] > 1 else 0), p.stride(1)
    return 0, p.stride(0)


def kernels_interpreted() -> bool:
    """True when the kernels were built for the Triton interpreter (TRITON_INTERPRET=1
    was set when this module was imported), i.e. they can run on CPU tensors."""
    return HAS_TRITON and type(_pope_fwd_kernel).__name__ == "InterpretedFunction"


def _check_device(q: torch.Tensor):
    if not HAS_TRITON:
        raise ImportError("pope_attention_triton requires triton (pip install poskit[triton])")
    if q.device.type == "cpu" and not kernels_interpreted():
        raise RuntimeError(
            "pope_attention_triton on CPU tensors needs the Triton interpreter: set "
            "TRITON_INTERPRET=1 before poskit.attention.triton_pope is first imported"
        )


def _launch_fwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                key_padding_mask, causal, scale, softplus):
    _check_device(q)
    B, H, Tq, D = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = H // Hkv
    BD, BDV = max(16, _next_pow2(D)), max(16, _next_pow2(Dv))
    BM, BN, warps, stages = _config("fwd", BD, q.device, Tq)
    dot_dtype, dot_ieee = _dot_dtype(q.dtype, q.device)

    dtf = delta.detach().to(torch.float32)
    dcos, dsin = torch.cos(dtf).contiguous(), torch.sin(dtf).contiguous()
    out = torch.empty((B, H, Tq, Dv), device=q.device, dtype=q.dtype)
    lse = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    qpos2, kpos2 = _pos2d(q_positions), _pos2d(k_positions)
    if causal:
        bounds = _kv_bounds(qpos2, kpos2, Tk, BM, BN)
        sbd = (bounds.stride(0) if bounds.shape[0] > 1 else 0, bounds.stride(1))
    else:
        bounds, sbd = dcos, (0, 0)  # unused
    has_pad = key_padding_mask is not None
    pad = key_padding_mask.view(torch.uint8) if has_pad else dcos
    spad = (pad.stride(0), pad.stride(1)) if has_pad else (0, 0)

    grid = (_cdiv(Tq, BM), H, B)
    _pope_fwd_kernel[grid](
        q, k, v, dcos, dsin, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, pad, bounds, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *_tab_strides(q_cos), *_tab_strides(k_cos),
        *_pos_strides(q_positions), *_pos_strides(k_positions), *spad, *sbd,
        H, G, Tq, Tk, float(scale) * _LOG2E,
        CAUSAL=bool(causal), HAS_PAD=has_pad, SOFTPLUS=bool(softplus), HEAD_D=D, HEAD_DV=Dv,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=BD, BLOCK_DV=BDV, DOT_DTYPE=dot_dtype, DOT_IEEE=dot_ieee,
        num_warps=warps, num_stages=stages,
    )
    return out, lse


def _launch_bwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                key_padding_mask, causal, scale, softplus, out, lse, dout):
    _check_device(q)
    B, H, Tq, D = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = H // Hkv
    BD, BDV = max(16, _next_pow2(D)), max(16, _next_pow2(Dv))
    dot_dtype, dot_ieee = _dot_dtype(q.dtype, q.device)
    dtf = delta.detach().to(torch.float32)
    dcos, dsin = torch.cos(dtf).contiguous(), torch.sin(dtf).contiguous()
    qpos2, kpos2 = _pos2d(q_positions), _pos2d(k_positions)
    has_pad = key_padding_mask is not None
    pad = key_padding_mask.view(torch.uint8) if has_pad else dcos
    spad = (pad.stride(0), pad.stride(1)) if has_pad else (0, 0)
    tabs = (*_tab_strides(q_cos), *_tab_strides(k_cos))
    poss = (*_pos_strides(q_positions), *_pos_strides(k_positions), *spad)
    flags = dict(CAUSAL=bool(causal), HAS_PAD=has_pad, SOFTPLUS=bool(softplus), HEAD_D=D, HEAD_DV=Dv,
                 BLOCK_D=BD, BLOCK_DV=BDV, DOT_DTYPE=dot_dtype, DOT_IEEE=dot_ieee)

    # rowwise sum(o * do)
    dsum = torch.empty((B, H, Tq), device=q.device, dtype=torch.float32)
    pm = 32 if q.device.type != "cuda" else 64
    _pope_bwd_preprocess[(_cdiv(Tq, pm), H, B)](
        out, dout, dsum, *out.stride(), *dout.stride(), H, Tq,
        HEAD_DV=Dv, BLOCK_M=pm, BLOCK_DV=BDV,
    )

    # dk, dv: one program per (key block, kv head) looping over the group's query heads,
    # or, when that leaves the GPU idle, per (key block, query head) + a sum over groups
    BM, BN, warps, stages = _config("bwd_dkdv", BD, q.device, Tq)
    n_n = _cdiv(Tk, BN)
    head_split = _gqa_head_split(G, B * Hkv * n_n, q.device)
    if head_split:
        dk = torch.empty((B, H, Tk, D), device=q.device, dtype=torch.float32)
        dv = torch.empty((B, H, Tk, Dv), device=q.device, dtype=torch.float32)
    else:
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
    if causal:
        bounds = _q_bounds(qpos2, kpos2, BM, BN)
        sbd = (bounds.stride(0) if bounds.shape[0] > 1 else 0, bounds.stride(1))
    else:
        bounds, sbd = dcos, (0, 0)
    _pope_bwd_dkdv_kernel[(n_n, H if head_split else Hkv, B)](
        q, k, v, dcos, dsin, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, pad, bounds,
        dout, lse, dsum, dk, dv,
        *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(),
        *tabs, *poss, *sbd, H, G, Tq, Tk, float(scale),
        BLOCK_M=BM, BLOCK_N=BN, HEAD_SPLIT=head_split, num_warps=warps, num_stages=stages, **flags,
    )
    if head_split:
        dk = dk.view(B, Hkv, G, Tk, D).sum(2).to(k.dtype)
        dv = dv.view(B, Hkv, G, Tk, Dv).sum(2).to(v.dtype)

    # dq and per-block partials of d delta
    BM, BN, warps, stages = _config("bwd_dq", BD, q.device, Tq)
    n_m = _cdiv(Tq, BM)
    dq = torch.empty_like(q)
    ddelta_part = torch.empty((B, H, n_m, D), device=q.device, dtype=torch.float32)
    if causal:
        bounds = _kv_bounds(qpos2, kpos2, Tk, BM, BN)
        sbd = (bounds.stride(0) if bounds.shape[0] > 1 else 0, bounds.stride(1))
    else:
        bounds, sbd = dcos, (0, 0)
    _pope_bwd_dq_kernel[(n_m, H, B)](
        q, k, v, dcos, dsin, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, pad, bounds,
        dout, lse, dsum, dq, ddelta_part,
        *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq.stride(),
        *tabs, *poss, *sbd, H, G, Tq, Tk, float(scale),
        BLOCK_M=BM, BLOCK_N=BN, num_warps=warps, num_stages=stages, **flags,
    )
    ddelta = ddelta_part.sum(dim=(0, 2)).to(delta.dtype)
    return dq, dk, dv, ddelta


# ---------------------------------------------------------------------------
# torch.library registration (works under torch.compile as an opaque op)
# ---------------------------------------------------------------------------
@torch.library.custom_op("poskit::pope_attn_fwd", mutates_args=())
def _pope_attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, delta: torch.Tensor,
                   q_cos: torch.Tensor, q_sin: torch.Tensor, k_cos: torch.Tensor, k_sin: torch.Tensor,
                   q_positions: torch.Tensor, k_positions: torch.Tensor,
                   key_padding_mask: Optional[torch.Tensor],
                   causal: bool, scale: float, softplus: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch_fwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                       key_padding_mask, causal, scale, softplus)


@_pope_attn_fwd.register_fake
def _(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, key_padding_mask,
      causal, scale, softplus):
    B, H, Tq, _ = q.shape
    out = q.new_empty((B, H, Tq, v.shape[3]))
    lse = q.new_empty((B, H, Tq), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("poskit::pope_attn_bwd", mutates_args=())
def _pope_attn_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, delta: torch.Tensor,
                   q_cos: torch.Tensor, q_sin: torch.Tensor, k_cos: torch.Tensor, k_sin: torch.Tensor,
                   q_positions: torch.Tensor, k_positions: torch.Tensor,
                   key_padding_mask: Optional[torch.Tensor],
                   causal: bool, scale: float, softplus: bool,
                   out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _launch_bwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                       key_padding_mask, causal, scale, softplus, out, lse, dout)


@_pope_attn_bwd.register_fake
def _(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, key_padding_mask,
      causal, scale, softplus, out, lse, dout):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(delta)


def _setup_context(ctx, inputs, output):
    (q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, key_padding_mask,
     causal, scale, softplus) = inputs
    out, lse = output
    ctx.has_pad = key_padding_mask is not None
    saved = [q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, out, lse]
    if ctx.has_pad:
        saved.append(key_padding_mask)
    ctx.save_for_backward(*saved)
    ctx.causal, ctx.scale, ctx.softplus = causal, scale, softplus


def _backward(ctx, dout, dlse):
    saved = ctx.saved_tensors
    (q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, out, lse) = saved[:12]
    key_padding_mask = saved[12] if ctx.has_pad else None
    dq, dk, dv, ddelta = _pope_attn_bwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin,
                                        q_positions, k_positions, key_padding_mask,
                                        ctx.causal, ctx.scale, ctx.softplus, out, lse,
                                        dout.contiguous())
    return dq, dk, dv, ddelta, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("poskit::pope_attn_fwd", _backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------
def _check_table(name, t, T, D, B):
    # a leading 1 broadcasts over the batch (the engine's positions are (1|B, T)); its stride is read as 0
    allowed = f"({T}, {D}), (1, {T}, {D}) or ({B}, {T}, {D})"
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor of shape {allowed}")
    if tuple(t.shape) not in ((T, D), (1, T, D), (B, T, D)):
        raise ValueError(f"{name} must have shape {allowed} (T, D of the matching q/k), got {tuple(t.shape)}")


def _check_positions(name, p, T, B):
    allowed = f"({T},), (1, {T}) or ({B}, {T})"
    if not isinstance(p, torch.Tensor) or p.dtype.is_floating_point or p.dtype.is_complex or p.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of shape {allowed}")
    if tuple(p.shape) not in ((T,), (1, T), (B, T)):
        raise ValueError(f"{name} must have shape {allowed}, got {tuple(p.shape)}")


def pope_attention_triton(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, *, causal: bool, scale: float,
                          q_positions, k_positions, softplus: bool = True,
                          key_padding_mask=None) -> torch.Tensor:
    """Fused PoPE attention (Triton, forward + backward).

    Args:
        q: (B, H, Tq, D) queries; k: (B, Hkv, Tk, D) keys; v: (B, Hkv, Tk, Dv) values.
            H % Hkv == 0 (GQA, HF ``repeat_kv`` order: query head h uses kv head h // (H // Hkv)).
            16 <= D <= 256, 1 <= Dv <= 256; dtype float32, float16 or bfloat16 (all equal).
        delta: (H, D) phase bias, already clamped (zeros for no phase bias); may require grad.
            Used in fp32 whatever the input dtype (phases of half-precision deltas would be off by up
            to ~3e-3 rad), and its gradient is accumulated and returned in fp32 (cast back to delta's
            dtype by autograd).
        q_cos, q_sin: cos/sin of the query angles q_pos * theta, (Tq, D), (1, Tq, D) or (B, Tq, D), fp32.
        k_cos, k_sin: same for keys, (Tk, D), (1, Tk, D) or (B, Tk, D).
        causal: mask by position: key s visible to query t iff k_positions[s] <= q_positions[t].
        scale: logit scale (e.g. 1/sqrt(D)).
        q_positions, k_positions: integer (Tq,)/(1, Tq)/(B, Tq) and (Tk,)/(1, Tk)/(B, Tk); used for the
            causal mask.
            Block skipping is exact for any order but only effective for ascending positions.
        softplus: magnitudes are softplus(x) (paper) or x itself.
        key_padding_mask: optional (B, Tk) bool, True = keep.

    Returns (B, H, Tq, Dv) in q's dtype.  Rows with no visible key are 0.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (B, heads, T, dim), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t)}")
        if t.dtype not in _SUPPORTED_DTYPES:
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
    if not 16 <= D <= 256:
        raise ValueError(f"head dim D must be in [16, 256], got {D}")
    Dv = v.shape[3]
    if not 1 <= Dv <= 256:
        raise ValueError(f"value head dim Dv must be in [1, 256], got {Dv}")
    if Tq < 1 or Tk < 1:
        raise ValueError(f"sequence lengths must be >= 1, got Tq={Tq}, Tk={Tk}")
    if not isinstance(delta, torch.Tensor) or not delta.is_floating_point() or tuple(delta.shape) != (H, D):
        raise ValueError(f"delta must be a floating-point tensor of shape (H={H}, D={D}), got "
                         f"{tuple(delta.shape) if isinstance(delta, torch.Tensor) else type(delta)}")
    _check_table("q_cos", q_cos, Tq, D, B)
    _check_table("q_sin", q_sin, Tq, D, B)
    _check_table("k_cos", k_cos, Tk, D, B)
    _check_table("k_sin", k_sin, Tk, D, B)
    if q_cos.shape != q_sin.shape:
        raise ValueError(f"q_cos and q_sin shapes differ: {tuple(q_cos.shape)} vs {tuple(q_sin.shape)}")
    if k_cos.shape != k_sin.shape:
        raise ValueError(f"k_cos and k_sin shapes differ: {tuple(k_cos.shape)} vs {tuple(k_sin.shape)}")
    _check_positions("q_positions", q_positions, Tq, B)
    _check_positions("k_positions", k_positions, Tk, B)
    if key_padding_mask is not None:
        if (not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool
                or tuple(key_padding_mask.shape) != (B, Tk)):
            raise ValueError(f"key_padding_mask must be a bool tensor of shape (B={B}, Tk={Tk}) (True = keep)")
        key_padding_mask = key_padding_mask.contiguous()
    dev = q.device
    for name, t in (("k", k), ("v", v), ("delta", delta), ("q_cos", q_cos), ("q_sin", q_sin),
                    ("k_cos", k_cos), ("k_sin", k_sin), ("q_positions", q_positions),
                    ("k_positions", k_positions)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but q is on {dev}; all inputs must share a device")

    q_cos, q_sin, k_cos, k_sin = (t.to(torch.float32) for t in (q_cos, q_sin, k_cos, k_sin))
    # phases and the delta gradient in fp32 (a no-op for the fp32 delta the engine passes)
    delta = delta.to(torch.float32)
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be a finite float, got {scale}")
    out, _ = _pope_attn_fwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                            key_padding_mask, bool(causal), float(scale), bool(softplus))
    return out


def pope_attention_for(enc, q, k, v, *, q_positions, k_positions, scale: float, causal: bool,
                       softplus: bool, key_padding_mask=None) -> torch.Tensor:
    """`pope_attention_triton` with the tables and the fp32 phase bias taken from a pope encoding.

    positions are (1|B, T), so the tables are (1|B, T, d); the kernel broadcasts a leading 1.
    softplus=False feeds magnitudes (a KV cache of softplus(k)) straight to the kernel.
    """
    qc, qs = enc.cos_sin(q_positions, torch.float32)
    kc, ks = enc.cos_sin(k_positions, torch.float32)
    return pope_attention_triton(q, k, v, enc.clamped_delta_fp32(q.device), qc, qs, kc, ks, causal=causal,
                                 scale=scale, q_positions=q_positions, k_positions=k_positions, softplus=softplus,
                                 key_padding_mask=key_padding_mask)
