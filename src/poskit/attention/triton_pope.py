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

Layers, as in FlashAttention: ``pope_attention_triton`` (argument checks) ->
the ``torch.library`` op ``poskit::pope_attn_fwd`` with its registered autograd
formula (``poskit::pope_attn_bwd``; both opaque to ``torch.compile``) ->
``_launch_fwd`` / ``_launch_bwd`` (launch set-up) -> the kernels.  What the CoPE kernels share with these (checks,
launch set-up, the online softmax step, block ranges) lives in triton_core.py and
blocks.py, with the naming scheme described there.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .blocks import cdiv, key_block_bounds, query_block_bounds
from .triton_core import (HAS_TRITON, LOG2E, check_position_shape, check_qkv, is_interpreted, launch_setup,
                          next_pow2, tl, triton)

if HAS_TRITON:
    from .triton_core import LOG2E_JIT, load_tile, online_softmax_step, tile_ranges, visible_keys

__all__ = ["pope_attention_triton", "pope_attention_for", "kernels_interpreted", "HAS_TRITON",
           "BLOCK_CONFIG_OVERRIDE", "GQA_DKDV_MODE"]

# Optional overrides of the launch configuration, e.g. from a benchmark sweep:
#   BLOCK_CONFIG_OVERRIDE["fwd"] = (BLOCK_M, BLOCK_N, num_warps, num_stages)
# keys: "fwd", "bwd_dkdv", "bwd_dq".
BLOCK_CONFIG_OVERRIDE: dict = {}
# GQA dk/dv strategy: "loop" (each program loops over the query heads of its kv group,
# no extra memory), "split" (one program per query head writing fp32 partials summed in
# torch: GROUP x more programs, for small B * Hkv * Tk), "auto" (split when looping would
# launch fewer than 2 programs per SM).
GQA_DKDV_MODE: str = "auto"


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
    def _load_polar(X, C, S, offs_t, t_mask, offs_d, stride_t, stride_d, cs_t, cs_d,
                    HEAD_D: tl.constexpr, SOFTPLUS: tl.constexpr):
        """Load raw x (fp32), its magnitude mu and the angle tables cos/sin."""
        d_mask = offs_d < HEAD_D
        x = load_tile(X, offs_t, offs_d, stride_t, stride_d, t_mask, d_mask).to(tl.float32)
        c = load_tile(C, offs_t, offs_d, cs_t, cs_d, t_mask, d_mask)
        s = load_tile(S, offs_t, offs_d, cs_t, cs_d, t_mask, d_mask)
        if SOFTPLUS:
            mu = _softplus(x)
        else:
            mu = x
        return x, mu, c, s

    @triton.jit
    def _load_phase(PCOS, PSIN, h, offs_d, HEAD_D: tl.constexpr):
        """cos and sin of head h's phase bias delta (fp32, one per channel)."""
        d_mask = offs_d < HEAD_D
        pc = tl.load(PCOS + h * HEAD_D + offs_d, mask=d_mask, other=0.0)
        ps = tl.load(PSIN + h * HEAD_D + offs_d, mask=d_mask, other=0.0)
        return pc, ps

    @triton.jit
    def _load_query(Q, QC, QS, pc, ps, offs_m, m_mask, offs_d, sq_t, sq_d, sqc_t, sqc_d,
                    HEAD_D: tl.constexpr, SOFTPLUS: tl.constexpr):
        """Raw q, its magnitude and cos/sin of its angle minus the phase bias: the query's polar form."""
        q_raw, mu_q, qc, qs = _load_polar(Q, QC, QS, offs_m, m_mask, offs_d, sq_t, sq_d, sqc_t, sqc_d,
                                          HEAD_D, SOFTPLUS)
        cq = qc * pc[None, :] + qs * ps[None, :]  # cos(a_q - delta)
        sq = qs * pc[None, :] - qc * ps[None, :]  # sin(a_q - delta)
        return q_raw, mu_q, cq, sq

    @triton.jit
    def _key_block_scores(qx, qy, qpos, K, KC, KS, KPOS, KPAD, offs_n, n_mask, offs_d,
                          sk_t, sk_d, skc_t, skc_d, skp_t, spad_t,
                          MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                          SOFTPLUS: tl.constexpr, HEAD_D: tl.constexpr,
                          DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
        """Logits of a query block against one key block (masked entries -inf) and the block's Cartesian
        keys; MASKED=False skips the element mask for blocks every query sees whole."""
        _, mu_k, kc, ks = _load_polar(K, KC, KS, offs_n, n_mask, offs_d, sk_t, sk_d,
                                      skc_t, skc_d, HEAD_D, SOFTPLUS)
        kx = (mu_k * kc).to(DOT_DTYPE)
        ky = (mu_k * ks).to(DOT_DTYPE)
        s = tl.dot(qx, tl.trans(kx), None, input_precision=PRECISION)
        s = tl.dot(qy, tl.trans(ky), s, input_precision=PRECISION)
        if MASKED:
            valid = visible_keys(n_mask[None, :], qpos, KPOS, KPAD, offs_n, n_mask, skp_t, spad_t,
                                 CAUSAL, HAS_PAD)
            s = tl.where(valid, s, float("-inf"))
        elif HAS_PAD:
            pad = tl.load(KPAD + offs_n * spad_t, mask=n_mask, other=0)
            s = tl.where((pad != 0)[None, :], s, float("-inf"))
        return s, kx, ky

    @triton.jit
    def _load_bounds(BOUNDS, b, sbd_b, pid, sbd_blk):
        """The three block indices the host computed from the positions for block pid of sequence b."""
        bp = BOUNDS + b * sbd_b + pid * sbd_blk
        return tl.load(bp), tl.load(bp + 1), tl.load(bp + 2)

    @triton.jit
    def _key_block_range(BOUNDS, b, sbd_b, pid_m, sbd_m, Tk, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
        """Key blocks of query block pid_m: [0, n_full) seen whole by every query, [n_lo, n_hi) in part
        (causal boundary, ragged tail); under causal masking the host precomputed them from positions."""
        if CAUSAL:
            n_full, n_lo, n_hi = _load_bounds(BOUNDS, b, sbd_b, pid_m, sbd_m)
        else:
            n_full = Tk // BLOCK_N
            n_lo = n_full
            n_hi = tl.cdiv(Tk, BLOCK_N)
        return n_full, n_lo, n_hi

    @triton.jit
    def _query_block_range(BOUNDS, b, sbd_b, pid_n, sbd_n, Tq, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
        """Query blocks of key block pid_n: [m_lo, m_mid) see it in part, [m_mid, m_hi) whole."""
        if CAUSAL:
            m_lo, m_mid, m_hi = _load_bounds(BOUNDS, b, sbd_b, pid_n, sbd_n)
        else:
            m_lo = 0
            m_mid = 0
            m_hi = tl.cdiv(Tq, BLOCK_M)
        return m_lo, m_mid, m_hi

    @triton.jit
    def _fwd_inner(acc, l_i, m_i, qx, qy, qpos, K, V, KC, KS, KPOS, KPAD,
                   lo, hi, Tk, offs_n0, offs_d, offs_dv,
                   sk_t, sk_d, sv_t, sv_d, skc_t, skc_d, skp_t, spad_t,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                   SOFTPLUS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                   BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + offs_n0
            n_mask = offs_n < Tk
            s, _, _ = _key_block_scores(qx, qy, qpos, K, KC, KS, KPOS, KPAD, offs_n, n_mask, offs_d,
                                        sk_t, sk_d, skc_t, skc_d, skp_t, spad_t,
                                        MASKED, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, DOT_DTYPE, PRECISION)
            p, alpha, l_i, m_new = online_softmax_step(m_i, l_i, s, True)
            v = load_tile(V, offs_n, offs_dv, sv_t, sv_d, n_mask, offs_dv < HEAD_DV)
            acc = acc * alpha[:, None]
            acc = tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), acc, input_precision=PRECISION)
            m_i = m_new
        return acc, l_i, m_i

    @triton.jit
    def _pope_fwd_kernel(
        Q, K, V, PCOS, PSIN, QC, QS, KC, KS, QPOS, KPOS, KPAD, BOUNDS, O, LSE,
        sq_b, sq_h, sq_t, sq_d,
        sk_b, sk_h, sk_t, sk_d,
        sv_b, sv_h, sv_t, sv_d,
        so_b, so_h, so_t, so_d,
        sqc_b, sqc_t, sqc_d,
        skc_b, skc_t, skc_d,
        sqp_b, sqp_t, skp_b, skp_t, spad_b, spad_t,
        sbd_b, sbd_m,
        H, GROUP, Tq, Tk, qk_scale,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, SOFTPLUS: tl.constexpr,
        HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    ):
        # heaviest (last) query blocks first under causal masking
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        hk = h // GROUP

        offs_m, offs_n0, offs_d, offs_dv = tile_ranges(pid_m, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
        m_mask = offs_m < Tq

        pc, ps = _load_phase(PCOS, PSIN, h, offs_d, HEAD_D)
        _, mu_q, cq, sq = _load_query(Q + b * sq_b + h * sq_h, QC + b * sqc_b, QS + b * sqc_b, pc, ps,
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
                                   BLOCK_N, DOT_DTYPE, PRECISION)
        # partially visible blocks (causal boundary, ragged tail)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, qx, qy, qpos, Kb, Vb, KCb, KSb, KPOSb, KPADb,
                                   n_lo * BLOCK_N, n_hi * BLOCK_N, Tk, offs_n0, offs_d, offs_dv,
                                   sk_t, sk_d, sv_t, sv_d, skc_t, skc_d, skp_t, spad_t,
                                   True, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, HEAD_DV,
                                   BLOCK_N, DOT_DTYPE, PRECISION)

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
        m_ok = offs_m < Tq
        dv_ok = offs_dv < HEAD_DV
        o = load_tile(O + b * so_b + h * so_h, offs_m, offs_dv, so_t, so_d, m_ok, dv_ok).to(tl.float32)
        do = load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_dv, sdo_t, sdo_d, m_ok, dv_ok).to(tl.float32)
        tl.store(DSUM + (b * H + h) * Tq + offs_m, tl.sum(o * do, 1), mask=m_ok)

    @triton.jit
    def _bwd_dkdv_inner(dkx, dky, dv, kx_l, ky_l, v, kpos, kpad_ok,
                        Q, DO, QC, QS, LSE, DSUM, pc, ps,
                        lo, hi, Tq, offs_m0, offs_d, offs_dv, scale,
                        sq_t, sq_d, sdo_t, sdo_d, sqc_t, sqc_d, QPOS, sqp_t,
                        MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                        SOFTPLUS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                        BLOCK_M: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + offs_m0
            m_mask = offs_m < Tq
            _, mu_q, cq, sq = _load_query(Q, QC, QS, pc, ps, offs_m, m_mask, offs_d, sq_t, sq_d,
                                          sqc_t, sqc_d, HEAD_D, SOFTPLUS)
            qx = (mu_q * cq * scale).to(DOT_DTYPE)
            qy = (mu_q * sq * scale).to(DOT_DTYPE)
            # out-of-range rows get lse=+inf -> P = 0
            lse = tl.load(LSE + offs_m, mask=m_mask, other=float("inf"))
            dsum = tl.load(DSUM + offs_m, mask=m_mask, other=0.0)
            do = load_tile(DO, offs_m, offs_dv, sdo_t, sdo_d, m_mask, offs_dv < HEAD_DV)
            sT = tl.dot(kx_l, tl.trans(qx), None, input_precision=PRECISION)
            sT = tl.dot(ky_l, tl.trans(qy), sT, input_precision=PRECISION)  # (BLOCK_N, BLOCK_M), log2 units
            if MASKED and CAUSAL:
                qpos = tl.load(QPOS + offs_m * sqp_t, mask=m_mask, other=0)
                valid = kpos[:, None] <= qpos[None, :]
                if HAS_PAD:
                    valid = valid & kpad_ok[:, None]
                sT = tl.where(valid, sT, float("-inf"))
            elif HAS_PAD:
                sT = tl.where(kpad_ok[:, None], sT, float("-inf"))
            pT = tl.exp2(sT - lse[None, :])
            dv = tl.dot(pT.to(DOT_DTYPE), do.to(DOT_DTYPE), dv, input_precision=PRECISION)
            dpT = tl.dot(v, tl.trans(do.to(DOT_DTYPE)), None, input_precision=PRECISION)
            dsT = (pT * (dpT - dsum[None, :])).to(DOT_DTYPE)
            dkx = tl.dot(dsT, qx, dkx, input_precision=PRECISION)
            dky = tl.dot(dsT, qy, dky, input_precision=PRECISION)
        return dkx, dky, dv

    @triton.jit
    def _load_key_block(K, KC, KS, V, KPOS, KPAD, offs_n, n_mask, offs_d, offs_dv,
                        sk_t, sk_d, skc_t, skc_d, sv_t, sv_d, skp_t, spad_t,
                        HAS_PAD: tl.constexpr, SOFTPLUS: tl.constexpr, HEAD_D: tl.constexpr,
                        HEAD_DV: tl.constexpr, DOT_DTYPE: tl.constexpr):
        """What the dk/dv kernel keeps of its key block: raw k, the angle tables, the Cartesian keys in
        log2 units, v, the key positions and which keys are not padding."""
        k_raw, mu_k, kc, ks = _load_polar(K, KC, KS, offs_n, n_mask, offs_d, sk_t, sk_d, skc_t, skc_d,
                                          HEAD_D, SOFTPLUS)
        kx_l = (mu_k * kc * LOG2E_JIT).to(DOT_DTYPE)
        ky_l = (mu_k * ks * LOG2E_JIT).to(DOT_DTYPE)
        v = load_tile(V, offs_n, offs_dv, sv_t, sv_d, n_mask, offs_dv < HEAD_DV).to(DOT_DTYPE)
        kpos = tl.load(KPOS + offs_n * skp_t, mask=n_mask, other=0)
        if HAS_PAD:
            kpad_ok = tl.load(KPAD + offs_n * spad_t, mask=n_mask, other=0) != 0
        else:
            kpad_ok = n_mask
        return k_raw, kc, ks, kx_l, ky_l, v, kpos, kpad_ok

    @triton.jit
    def _pope_bwd_dkdv_kernel(
        Q, K, V, PCOS, PSIN, QC, QS, KC, KS, QPOS, KPOS, KPAD, BOUNDS, DO, LSE, DSUM, DK, DV,
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
        H, GROUP, Tq, Tk, scale,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, SOFTPLUS: tl.constexpr,
        HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, HEAD_SPLIT: tl.constexpr,
    ):
        # HEAD_SPLIT=False: one program per (key block, kv head) looping over the GROUP query
        #   heads of its group; writes dk/dv directly.
        # HEAD_SPLIT=True: one program per (key block, query head); writes per-query-head
        #   partials (B, H, Tk, .) that the host sums over each group (more parallelism).
        pid_n = tl.program_id(0)
        b = tl.program_id(2).to(tl.int64)
        if HEAD_SPLIT:
            h0 = tl.program_id(1)
            hk = h0 // GROUP
            n_heads = 1
            h_out = h0
        else:
            hk = tl.program_id(1)
            h0 = hk * GROUP
            n_heads = GROUP
            h_out = hk

        offs_n, offs_m0, offs_d, offs_dv = tile_ranges(pid_n, BLOCK_N, BLOCK_M, BLOCK_D, BLOCK_DV)
        n_mask = offs_n < Tk

        k_raw, kc, ks, kx_l, ky_l, v, kpos, kpad_ok = _load_key_block(
            K + b * sk_b + hk * sk_h, KC + b * skc_b, KS + b * skc_b, V + b * sv_b + hk * sv_h,
            KPOS + b * skp_b, KPAD + b * spad_b, offs_n, n_mask, offs_d, offs_dv,
            sk_t, sk_d, skc_t, skc_d, sv_t, sv_d, skp_t, spad_t, HAS_PAD, SOFTPLUS, HEAD_D, HEAD_DV, DOT_DTYPE)

        dkx = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dky = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
        m_lo, m_mid, m_hi = _query_block_range(BOUNDS, b, sbd_b, pid_n, sbd_n, Tq, CAUSAL, BLOCK_M)

        for i in range(n_heads):
            h = h0 + i
            Qb = Q + b * sq_b + h * sq_h
            DOb = DO + b * sdo_b + h * sdo_h
            LSEb = LSE + (b * H + h) * Tq
            DSUMb = DSUM + (b * H + h) * Tq
            pc, ps = _load_phase(PCOS, PSIN, h, offs_d, HEAD_D)
            # query blocks that see only part of this key block
            dkx, dky, dv = _bwd_dkdv_inner(dkx, dky, dv, kx_l, ky_l, v, kpos, kpad_ok,
                                           Qb, DOb, QC + b * sqc_b, QS + b * sqc_b, LSEb, DSUMb, pc, ps,
                                           m_lo * BLOCK_M, m_mid * BLOCK_M, Tq, offs_m0, offs_d, offs_dv,
                                           scale, sq_t, sq_d, sdo_t, sdo_d, sqc_t, sqc_d,
                                           QPOS + b * sqp_b, sqp_t,
                                           True, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, HEAD_DV,
                                           BLOCK_M, DOT_DTYPE, PRECISION)
            # query blocks that see all of it
            dkx, dky, dv = _bwd_dkdv_inner(dkx, dky, dv, kx_l, ky_l, v, kpos, kpad_ok,
                                           Qb, DOb, QC + b * sqc_b, QS + b * sqc_b, LSEb, DSUMb, pc, ps,
                                           m_mid * BLOCK_M, m_hi * BLOCK_M, Tq, offs_m0, offs_d, offs_dv,
                                           scale, sq_t, sq_d, sdo_t, sdo_d, sqc_t, sqc_d,
                                           QPOS + b * sqp_b, sqp_t,
                                           False, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, HEAD_DV,
                                           BLOCK_M, DOT_DTYPE, PRECISION)

        # through k' = mu_k * (cos a_k, sin a_k) and mu_k = softplus(k)
        dmu = dkx * kc + dky * ks
        if SOFTPLUS:
            dmu = dmu * _dsoftplus(k_raw)
        tl.store(DK + b * sdk_b + h_out * sdk_h + offs_n[:, None] * sdk_t + offs_d[None, :] * sdk_d,
                 dmu.to(DK.dtype.element_ty), mask=n_mask[:, None] & (offs_d < HEAD_D)[None, :])
        tl.store(DV + b * sdv_b + h_out * sdv_h + offs_n[:, None] * sdv_t + offs_dv[None, :] * sdv_d,
                 dv.to(DV.dtype.element_ty), mask=n_mask[:, None] & (offs_dv < HEAD_DV)[None, :])

    @triton.jit
    def _bwd_dq_inner(dqx, dqy, qx_l, qy_l, do, lse, dsum, qpos,
                      K, V, KC, KS, KPOS, KPAD,
                      lo, hi, Tk, offs_n0, offs_d, offs_dv,
                      sk_t, sk_d, sv_t, sv_d, skc_t, skc_d, skp_t, spad_t,
                      MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr,
                      SOFTPLUS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
                      BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + offs_n0
            n_mask = offs_n < Tk
            s, kx, ky = _key_block_scores(qx_l, qy_l, qpos, K, KC, KS, KPOS, KPAD, offs_n, n_mask, offs_d,
                                          sk_t, sk_d, skc_t, skc_d, skp_t, spad_t,
                                          MASKED, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, DOT_DTYPE, PRECISION)
            p = tl.exp2(s - lse[:, None])
            v = load_tile(V, offs_n, offs_dv, sv_t, sv_d, n_mask, offs_dv < HEAD_DV)
            dp = tl.dot(do, tl.trans(v.to(DOT_DTYPE)), None, input_precision=PRECISION)
            dsc = (p * (dp - dsum[:, None])).to(DOT_DTYPE)
            dqx = tl.dot(dsc, kx, dqx, input_precision=PRECISION)
            dqy = tl.dot(dsc, ky, dqy, input_precision=PRECISION)
        return dqx, dqy

    @triton.jit
    def _store_dq_ddelta(DQ, DDELTA, dqx, dqy, q_raw, mu_q, cq, sq, offs_m, m_mask, offs_d,
                         sdq_t, sdq_d, scale, SOFTPLUS: tl.constexpr, HEAD_D: tl.constexpr):
        """dq through q' = mu_q * (cos, sin)(a_q - delta) and mu_q = softplus(q), and this query block's
        partial of d delta (summed over blocks by the host)."""
        # gradients w.r.t. the unscaled Cartesian query q' = (qx, qy)
        dqx = dqx * scale
        dqy = dqy * scale
        dmu = dqx * cq + dqy * sq
        if SOFTPLUS:
            dq = dmu * _dsoftplus(q_raw)
        else:
            dq = dmu
        d_mask = offs_d < HEAD_D
        tl.store(DQ + offs_m[:, None] * sdq_t + offs_d[None, :] * sdq_d,
                 dq.to(DQ.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])
        # d qx / d delta = mu sin(a - delta) = qy ; d qy / d delta = -mu cos(a - delta) = -qx
        g = tl.sum(dqx * (mu_q * sq) - dqy * (mu_q * cq), 0)
        tl.store(DDELTA + offs_d, g, mask=d_mask)

    @triton.jit
    def _pope_bwd_dq_kernel(
        Q, K, V, PCOS, PSIN, QC, QS, KC, KS, QPOS, KPOS, KPAD, BOUNDS, DO, LSE, DSUM, DQ, DDELTA,
        sq_b, sq_h, sq_t, sq_d,
        sk_b, sk_h, sk_t, sk_d,
        sv_b, sv_h, sv_t, sv_d,
        sdo_b, sdo_h, sdo_t, sdo_d,
        sdq_b, sdq_h, sdq_t, sdq_d,
        sqc_b, sqc_t, sqc_d,
        skc_b, skc_t, skc_d,
        sqp_b, sqp_t, skp_b, skp_t, spad_b, spad_t,
        sbd_b, sbd_m,
        H, GROUP, Tq, Tk, scale,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, SOFTPLUS: tl.constexpr,
        HEAD_D: tl.constexpr, HEAD_DV: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
        DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    ):
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
        h = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        hk = h // GROUP
        n_mblocks = tl.num_programs(0)

        offs_m, offs_n0, offs_d, offs_dv = tile_ranges(pid_m, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
        m_mask = offs_m < Tq

        pc, ps = _load_phase(PCOS, PSIN, h, offs_d, HEAD_D)
        q_raw, mu_q, cq, sq = _load_query(Q + b * sq_b + h * sq_h, QC + b * sqc_b, QS + b * sqc_b, pc, ps,
                                          offs_m, m_mask, offs_d, sq_t, sq_d, sqc_t, sqc_d, HEAD_D, SOFTPLUS)
        qk_scale = scale * LOG2E_JIT
        qx_l = (mu_q * cq * qk_scale).to(DOT_DTYPE)
        qy_l = (mu_q * sq * qk_scale).to(DOT_DTYPE)
        do = load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_dv, sdo_t, sdo_d, m_mask,
                       offs_dv < HEAD_DV).to(DOT_DTYPE)
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
                                 BLOCK_N, DOT_DTYPE, PRECISION)
        dqx, dqy = _bwd_dq_inner(dqx, dqy, qx_l, qy_l, do, lse, dsum, qpos, Kb, Vb, KCb, KSb, KPOSb, KPADb,
                                 n_lo * BLOCK_N, n_hi * BLOCK_N, Tk, offs_n0, offs_d, offs_dv,
                                 sk_t, sk_d, sv_t, sv_d, skc_t, skc_d, skp_t, spad_t,
                                 True, CAUSAL, HAS_PAD, SOFTPLUS, HEAD_D, HEAD_DV,
                                 BLOCK_N, DOT_DTYPE, PRECISION)
        _store_dq_ddelta(DQ + b * sdq_b + h * sdq_h, DDELTA + ((b * H + h) * n_mblocks + pid_m) * HEAD_D,
                         dqx, dqy, q_raw, mu_q, cq, sq, offs_m, m_mask, offs_d, sdq_t, sdq_d, scale,
                         SOFTPLUS, HEAD_D)


# ---------------------------------------------------------------------------
# launch set-up
# ---------------------------------------------------------------------------
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
        bm = min(bm, next_pow2(tq))
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


def _gqa_head_split(group: int, n_programs: int, device: torch.device) -> bool:
    """Whether the dk/dv kernel should split GQA groups across programs."""
    mode = GQA_DKDV_MODE
    if mode not in ("auto", "loop", "split"):
        raise ValueError(f"GQA_DKDV_MODE must be 'auto', 'loop' or 'split', got {mode!r}")
    if group == 1 or mode == "loop":
        return False
    if mode == "split":
        return True
    if device.type != "cuda":
        return False
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return n_programs < 2 * sms


def _pos2d(pos: torch.Tensor) -> torch.Tensor:
    return pos.unsqueeze(0) if pos.dim() == 1 else pos


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
    return HAS_TRITON and is_interpreted(_pope_fwd_kernel)


def _setup(q, k, v):
    return launch_setup(q, k, v, interpreted=kernels_interpreted(), op="pope_attention_triton", module=__name__,
                        tf32=torch.backends.cuda.matmul.allow_tf32)


def _phase_tables(delta):
    """cos and sin of the phase bias, fp32 (H, D)."""
    dtf = delta.detach().to(torch.float32)
    return torch.cos(dtf).contiguous(), torch.sin(dtf).contiguous()


def _padding(key_padding_mask, stand_in):
    """(pointer argument, (batch stride, key stride)) of the key padding mask; stand_in when there is none
    (HAS_PAD=False switches its loads off)."""
    if key_padding_mask is None:
        return stand_in, (0, 0)
    pad = key_padding_mask.view(torch.uint8)
    return pad, (pad.stride(0), pad.stride(1))


def _causal_bounds(bounds_fn, causal, q_positions, k_positions, stand_in, *blocks):
    """(pointer argument, (batch stride, block stride)) of the block ranges bounds_fn computes from the
    positions; without causal masking the kernels derive them from the lengths and never read it."""
    if not causal:
        return stand_in, (0, 0)
    bounds = bounds_fn(_pos2d(q_positions), _pos2d(k_positions), *blocks)
    return bounds, (bounds.stride(0) if bounds.shape[0] > 1 else 0, bounds.stride(1))


def _launch_fwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                key_padding_mask, causal, scale, softplus):
    L = _setup(q, k, v)
    BM, BN, warps, stages = _config("fwd", L.block_d, q.device, L.Tq)
    pcos, psin = _phase_tables(delta)
    out = torch.empty((L.B, L.H, L.Tq, L.Dv), device=q.device, dtype=q.dtype)
    lse = torch.empty((L.B, L.H, L.Tq), device=q.device, dtype=torch.float32)
    bounds, bound_strides = _causal_bounds(key_block_bounds, causal, q_positions, k_positions, pcos, L.Tk, BM, BN)
    pad, pad_strides = _padding(key_padding_mask, pcos)
    _pope_fwd_kernel[(cdiv(L.Tq, BM), L.H, L.B)](
        q, k, v, pcos, psin, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, pad, bounds, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *_tab_strides(q_cos), *_tab_strides(k_cos),
        *_pos_strides(q_positions), *_pos_strides(k_positions), *pad_strides, *bound_strides,
        L.H, L.group, L.Tq, L.Tk, float(scale) * LOG2E,
        CAUSAL=bool(causal), HAS_PAD=key_padding_mask is not None, SOFTPLUS=bool(softplus),
        HEAD_D=L.D, HEAD_DV=L.Dv, BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=L.block_d, BLOCK_DV=L.block_dv,
        DOT_DTYPE=L.dot_dtype, PRECISION=L.precision, num_warps=warps, num_stages=stages,
    )
    return out, lse


def _launch_bwd(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions,
                key_padding_mask, causal, scale, softplus, out, lse, dout):
    L = _setup(q, k, v)
    pcos, psin = _phase_tables(delta)
    pad, pad_strides = _padding(key_padding_mask, pcos)
    # arguments every backward kernel takes the same way
    inputs = (q, k, v, pcos, psin, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, pad)
    table_strides = (*_tab_strides(q_cos), *_tab_strides(k_cos))
    pos_strides = (*_pos_strides(q_positions), *_pos_strides(k_positions))
    flags = dict(CAUSAL=bool(causal), HAS_PAD=key_padding_mask is not None, SOFTPLUS=bool(softplus),
                 HEAD_D=L.D, HEAD_DV=L.Dv, BLOCK_D=L.block_d, BLOCK_DV=L.block_dv,
                 DOT_DTYPE=L.dot_dtype, PRECISION=L.precision)

    # rowwise sum(o * do)
    dsum = torch.empty((L.B, L.H, L.Tq), device=q.device, dtype=torch.float32)
    pm = 32 if q.device.type != "cuda" else 64
    _pope_bwd_preprocess[(cdiv(L.Tq, pm), L.H, L.B)](
        out, dout, dsum, *out.stride(), *dout.stride(), L.H, L.Tq,
        HEAD_DV=L.Dv, BLOCK_M=pm, BLOCK_DV=L.block_dv,
    )

    # dk, dv: one program per (key block, kv head) looping over the group's query heads,
    # or, when that leaves the GPU idle, per (key block, query head) + a sum over groups
    BM, BN, warps, stages = _config("bwd_dkdv", L.block_d, q.device, L.Tq)
    n_n = cdiv(L.Tk, BN)
    head_split = _gqa_head_split(L.group, L.B * L.Hkv * n_n, q.device)
    if head_split:
        dk = torch.empty((L.B, L.H, L.Tk, L.D), device=q.device, dtype=torch.float32)
        dv = torch.empty((L.B, L.H, L.Tk, L.Dv), device=q.device, dtype=torch.float32)
    else:
        dk = torch.empty_like(k)
        dv = torch.empty_like(v)
    bounds, bound_strides = _causal_bounds(query_block_bounds, causal, q_positions, k_positions, pcos, BM, BN)
    _pope_bwd_dkdv_kernel[(n_n, L.H if head_split else L.Hkv, L.B)](
        *inputs, bounds, dout, lse, dsum, dk, dv,
        *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dk.stride(), *dv.stride(),
        *table_strides, *pos_strides, *pad_strides, *bound_strides, L.H, L.group, L.Tq, L.Tk, float(scale),
        BLOCK_M=BM, BLOCK_N=BN, HEAD_SPLIT=head_split, num_warps=warps, num_stages=stages, **flags,
    )
    if head_split:
        dk = dk.view(L.B, L.Hkv, L.group, L.Tk, L.D).sum(2).to(k.dtype)
        dv = dv.view(L.B, L.Hkv, L.group, L.Tk, L.Dv).sum(2).to(v.dtype)

    # dq and per-block partials of d delta
    BM, BN, warps, stages = _config("bwd_dq", L.block_d, q.device, L.Tq)
    n_m = cdiv(L.Tq, BM)
    dq = torch.empty_like(q)
    ddelta_part = torch.empty((L.B, L.H, n_m, L.D), device=q.device, dtype=torch.float32)
    bounds, bound_strides = _causal_bounds(key_block_bounds, causal, q_positions, k_positions, pcos, L.Tk, BM, BN)
    _pope_bwd_dq_kernel[(n_m, L.H, L.B)](
        *inputs, bounds, dout, lse, dsum, dq, ddelta_part,
        *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq.stride(),
        *table_strides, *pos_strides, *pad_strides, *bound_strides, L.H, L.group, L.Tq, L.Tk, float(scale),
        BLOCK_M=BM, BLOCK_N=BN, num_warps=warps, num_stages=stages, **flags,
    )
    ddelta = ddelta_part.sum(dim=(0, 2)).to(delta.dtype)
    return dq, dk, dv, ddelta


# ---------------------------------------------------------------------------
# torch.library ops (opaque to torch.compile) and their autograd
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


# The autograd layer (FlashAttention's autograd.Function) is registered on the op itself: dynamo cannot trace
# autograd.Function.apply when one tensor is passed twice (the same tables or positions for queries and keys,
# as self-attention passes them), while a registered formula keeps torch.compile fullgraph working.
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
    # the forward saved the row log-sum-exp; the backward kernels recompute the probabilities from it
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
    if not isinstance(p, torch.Tensor) or p.dtype.is_floating_point or p.dtype.is_complex or p.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of shape ({T},), (1, {T}) or ({B}, {T})")
    check_position_shape(name, p, T, B)


def _check_inputs(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, key_padding_mask,
                  scale):
    """Raise ValueError naming the first argument that pope_attention_triton cannot take."""
    check_qkv(q, k, v)
    B, H, Tq, D = q.shape
    Tk, Dv = k.shape[2], v.shape[3]
    if not 16 <= D <= 256:
        raise ValueError(f"head dim D must be in [16, 256], got {D}")
    if not 1 <= Dv <= 256:
        raise ValueError(f"value head dim Dv must be in [1, 256], got {Dv}")
    if not isinstance(delta, torch.Tensor) or not delta.is_floating_point() or tuple(delta.shape) != (H, D):
        raise ValueError(f"delta must be a floating-point tensor of shape (H={H}, D={D}), got "
                         f"{tuple(delta.shape) if isinstance(delta, torch.Tensor) else type(delta)}")
    for name, t, T in (("q_cos", q_cos, Tq), ("q_sin", q_sin, Tq), ("k_cos", k_cos, Tk), ("k_sin", k_sin, Tk)):
        _check_table(name, t, T, D, B)
    if q_cos.shape != q_sin.shape:
        raise ValueError(f"q_cos and q_sin shapes differ: {tuple(q_cos.shape)} vs {tuple(q_sin.shape)}")
    if k_cos.shape != k_sin.shape:
        raise ValueError(f"k_cos and k_sin shapes differ: {tuple(k_cos.shape)} vs {tuple(k_sin.shape)}")
    _check_positions("q_positions", q_positions, Tq, B)
    _check_positions("k_positions", k_positions, Tk, B)
    if key_padding_mask is not None and (not isinstance(key_padding_mask, torch.Tensor)
                                         or key_padding_mask.dtype != torch.bool
                                         or tuple(key_padding_mask.shape) != (B, Tk)):
        raise ValueError(f"key_padding_mask must be a bool tensor of shape (B={B}, Tk={Tk}) (True = keep)")
    for name, t in (("k", k), ("v", v), ("delta", delta), ("q_cos", q_cos), ("q_sin", q_sin),
                    ("k_cos", k_cos), ("k_sin", k_sin), ("q_positions", q_positions),
                    ("k_positions", k_positions)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all inputs must share a device")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be a finite float, got {scale}")


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
    _check_inputs(q, k, v, delta, q_cos, q_sin, k_cos, k_sin, q_positions, k_positions, key_padding_mask, scale)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.contiguous()
    q_cos, q_sin, k_cos, k_sin = (t.to(torch.float32) for t in (q_cos, q_sin, k_cos, k_sin))
    # phases and the delta gradient in fp32 (a no-op for the fp32 delta the engine passes)
    delta = delta.to(torch.float32)
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
