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
  part when ``is_causal=False``.
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

from ..encodings.cope import check_ordered_keys
from .blocks import cdiv, sorted_key_ends
from .inputs import deprecated_causal
from .triton_core import (HAS_TRITON, check_position_shape, check_qkv, is_interpreted, launch_setup, tl,
                          triton)

if HAS_TRITON:
    from .triton_core import load_tile, online_softmax_step, tile_ranges, visible_keys

__all__ = ["cope_attention_triton"]


if HAS_TRITON:

    @triton.jit
    def _tile_logits_and_gates(q, k_base, g_base, KPOS_b, KPAD_b, qpos, offs_s, n_ok, m_ok, offs_d, d_ok,
                               sk_t, sk_d, sg_t, sg_d, scale,
                               CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, SEP_GATES: tl.constexpr,
                               PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr):
        """For one key tile: its keys (and gate keys), the content logits q.k * scale, which entries are
        visible (causal by position, key padding, ragged tail) and the gates sigmoid(gate logit), 0 where
        not visible."""
        k = load_tile(k_base, offs_s, offs_d, sk_t, sk_d, n_ok, d_ok).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        # positions and the padding mask are contiguous along the keys
        vis = visible_keys(m_ok[:, None] & n_ok[None, :], qpos, KPOS_b, KPAD_b, offs_s, n_ok, 1, 1,
                           CAUSAL, HAS_PAD)
        if SEP_GATES:
            gk = load_tile(g_base, offs_s, offs_d, sg_t, sg_d, n_ok, d_ok).to(DOT_DTYPE)
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
        Q, K, V, GK, Z, SLOPES, QPOS, KPOS, KPAD, KV_END,
        O, LSE, GTOT,
        sq_b, sq_h, sq_t, sq_d,
        sk_b, sk_h, sk_t, sk_d,
        sv_b, sv_h, sv_t, sv_d,
        sg_b, sg_h, sg_t, sg_d,
        so_b, so_h, so_t, so_d,
        sqp_b, skp_b, spad_b,
        H, GROUP, Tq, Tk, D, DV, P, NQB, scale,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, SEP_GATES: tl.constexpr,
        ALIBI: tl.constexpr, PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        hk = h // GROUP

        offs_m, offs_n, offs_d, offs_dv = tile_ranges(pid_m, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
        m_ok = offs_m < Tq
        d_ok = offs_d < D
        dv_ok = offs_dv < DV

        q = load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, m_ok, d_ok).to(DOT_DTYPE)
        qpos = _query_positions(QPOS + b * sqp_b, offs_m, m_ok, CAUSAL)
        z_row = Z + (pid_bh.to(tl.int64) * Tq + offs_m) * P
        slope = _head_slope(SLOPES, h, ALIBI)

        k_base = K + b * sk_b + hk * sk_h
        v_base = V + b * sv_b + hk * sv_h
        g_base = GK + b * sg_b + hk * sg_h

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
            _, _, s, vis, g = _tile_logits_and_gates(q, k_base, g_base, KPOS + b * skp_b, KPAD + b * spad_b,
                                                     qpos, offs_s, n_ok, m_ok, offs_d, d_ok,
                                                     sk_t, sk_d, sg_t, sg_d, scale,
                                                     CAUSAL, HAS_PAD, SEP_GATES, PRECISION, DOT_DTYPE)
            p = carry[:, None] + tl.cumsum(g, axis=1, reverse=True)
            carry += tl.sum(g, axis=1)
            bias, _, _, _, _, _, _ = _position_bias(p, z_row, vis, slope, P, ALIBI)
            logits = tl.where(vis, s + bias, float("-inf"))
            pexp, alpha, l_i, m_new = online_softmax_step(m_i, l_i, logits, False)
            v = load_tile(v_base, offs_s, offs_dv, sv_t, sv_d, n_ok, dv_ok).to(DOT_DTYPE)
            acc = acc * alpha[:, None] + tl.dot(pexp.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new

        has = l_i > 0.0
        l_safe = tl.where(has, l_i, 1.0)
        out = acc / l_safe[:, None]
        lse = tl.where(has, m_i + tl.log(l_safe), 0.0)
        tl.store(O + b * so_b + h * so_h + offs_m[:, None] * so_t + offs_dv[None, :] * so_d,
                 out.to(O.dtype.element_ty), mask=m_ok[:, None] & dv_ok[None, :])
        row = pid_bh.to(tl.int64) * Tq + offs_m
        tl.store(LSE + row, lse, mask=m_ok)
        tl.store(GTOT + row, carry, mask=m_ok)

    @triton.jit
    def _position_bias_grad(dl, clamp_ok, pc, zf, zc, w, fl_i, ce_i, vis, dz_row, slope, dslope,
                            ALIBI: tl.constexpr):
        """From dL/dlogits: dL/dp (0 where the clamp is active) and the gradient of the bias parameters,
        summed into dslope (cope-alibi) or scattered into the query's row of dz."""
        if ALIBI:
            dp = tl.where(clamp_ok, -slope * dl, 0.0)
            dslope += tl.sum(-dl * pc, axis=1)
        else:
            dp = tl.where(clamp_ok, dl * (zc - zf), 0.0)
            tl.atomic_add(dz_row[:, None] + ce_i, dl * w, mask=vis, sem="relaxed")
            tl.atomic_add(dz_row[:, None] + fl_i, dl * (1.0 - w), mask=vis, sem="relaxed")
        return dp, dslope

    @triton.jit
    def _logit_grads(dq, dl, dgl, q, k, gk, dk_base, dgk_base, offs_s, n_ok, offs_d, d_ok, D, scale,
                     SEP_GATES: tl.constexpr, PRECISION: tl.constexpr):
        """Back through the content logits (dl) and the gate logits (dgl): dq accumulated in registers, dk
        and dgate_keys added to the shared fp32 buffers with atomics."""
        kd_mask = n_ok[:, None] & d_ok[None, :]
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
        return dq

    @triton.jit
    def _bwd_key_tile(dq, carry_g, carry_dp, dslope, q, do, lse, gtot, dsum, qpos, z_row, dz_row, slope,
                      k_base, v_base, g_base, KPOS_b, KPAD_b, dk_base, dgk_base, dv_base,
                      offs_s, n_ok, m_ok, offs_d, d_ok, offs_dv, dv_ok,
                      sk_t, sk_d, sv_t, sv_d, sg_t, sg_d, D, DV, P, scale,
                      CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, SEP_GATES: tl.constexpr,
                      ALIBI: tl.constexpr, PRECISION: tl.constexpr, DOT_DTYPE: tl.constexpr):
        """One key tile of the backward: adds its dv, dk, dgate_keys, dz (atomics) and returns dq, the gate
        and dL/dp carries and dslope."""
        k, gk, s, vis, g = _tile_logits_and_gates(q, k_base, g_base, KPOS_b, KPAD_b, qpos, offs_s, n_ok, m_ok,
                                                  offs_d, d_ok, sk_t, sk_d, sg_t, sg_d, scale,
                                                  CAUSAL, HAS_PAD, SEP_GATES, PRECISION, DOT_DTYPE)
        v = load_tile(v_base, offs_s, offs_dv, sv_t, sv_d, n_ok, dv_ok).to(DOT_DTYPE)
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
        dl = tl.where(vis, pr * (dpv - dsum[:, None]), 0.0)  # dL/dlogits

        dp, dslope = _position_bias_grad(dl, clamp_ok, pc, zf, zc, w, fl_i, ce_i, vis, dz_row, slope, dslope,
                                         ALIBI)
        # adjoint of the suffix sum: prefix sum of dL/dp
        dg = carry_dp[:, None] + tl.cumsum(dp, axis=1)
        carry_dp += tl.sum(dp, axis=1)
        dgl = tl.where(vis, dg * g * (1.0 - g), 0.0)  # dL/d(gate logit)
        dq = _logit_grads(dq, dl, dgl, q, k, gk, dk_base, dgk_base, offs_s, n_ok, offs_d, d_ok, D, scale,
                          SEP_GATES, PRECISION)
        return dq, carry_g, carry_dp, dslope

    @triton.jit
    def _cope_bwd_kernel(
        Q, K, V, GK, Z, SLOPES, QPOS, KPOS, KPAD, KV_END,
        DO, LSE, GTOT, DSUM,
        DQ, DK, DVG, DGK, DZ, DSLOPES,
        sq_b, sq_h, sq_t, sq_d,
        sk_b, sk_h, sk_t, sk_d,
        sv_b, sv_h, sv_t, sv_d,
        sg_b, sg_h, sg_t, sg_d,
        sdo_b, sdo_h, sdo_t, sdo_d,
        sqp_b, skp_b, spad_b,
        H, HKV, GROUP, Tq, Tk, D, DV, P, NQB, scale,
        CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, SEP_GATES: tl.constexpr,
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

        offs_m, offs_n, offs_d, offs_dv = tile_ranges(pid_m, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
        m_ok = offs_m < Tq
        d_ok = offs_d < D
        dv_ok = offs_dv < DV

        q = load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, m_ok, d_ok).to(DOT_DTYPE)
        do = load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_dv, sdo_t, sdo_d, m_ok, dv_ok).to(DOT_DTYPE)
        row = pid_bh.to(tl.int64) * Tq + offs_m
        lse = tl.load(LSE + row, mask=m_ok, other=0.0)
        gtot = tl.load(GTOT + row, mask=m_ok, other=0.0)
        dsum = tl.load(DSUM + row, mask=m_ok, other=0.0)
        qpos = _query_positions(QPOS + b * sqp_b, offs_m, m_ok, CAUSAL)
        slope = _head_slope(SLOPES, h, ALIBI)
        dslope = tl.zeros([BLOCK_M], tl.float32)

        z_row = Z + row * P
        dz_row = DZ + row * P
        k_base = K + b * sk_b + hk * sk_h
        v_base = V + b * sv_b + hk * sv_h
        g_base = GK + b * sg_b + hk * sg_h
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
            offs_s = jb * BLOCK_N + offs_n  # walk forwards
            dq, carry_g, carry_dp, dslope = _bwd_key_tile(
                dq, carry_g, carry_dp, dslope, q, do, lse, gtot, dsum, qpos, z_row, dz_row, slope,
                k_base, v_base, g_base, KPOS + b * skp_b, KPAD + b * spad_b, dk_base, dgk_base, dv_base,
                offs_s, offs_s < kv_end, m_ok, offs_d, d_ok, offs_dv, dv_ok,
                sk_t, sk_d, sv_t, sv_d, sg_t, sg_d, D, DV, P, scale,
                CAUSAL, HAS_PAD, SEP_GATES, ALIBI, PRECISION, DOT_DTYPE)

        tl.store(DQ + row[:, None] * D + offs_d[None, :], dq, mask=m_ok[:, None] & d_ok[None, :])
        if ALIBI:
            tl.atomic_add(DSLOPES + h, tl.sum(dslope, axis=0), sem="relaxed")


# ----------------------------------------------------------------------------------------
# launch set-up
# ----------------------------------------------------------------------------------------
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
    return HAS_TRITON and is_interpreted(_cope_fwd_kernel)


def _setup(q, k, v):
    return launch_setup(q, k, v, interpreted=kernels_interpreted(), op="cope_attention_triton", module=__name__)


def _stand_ins(k, gk, z, slopes, kpad, lse, kv_end):
    """Pointer arguments for the inputs a launch does not have: the constexpr flags switch their loads off,
    so any valid tensor of the same kind will do. Returns (gate keys, z, slopes, key padding mask)."""
    return (gk if gk is not None else k, z if z is not None else lse,
            slopes if slopes is not None else lse, kpad if kpad is not None else kv_end)


# The key loops run without software pipelining: on an H100 (Triton 3.6) pipelining them fails to compile
# ("'ttng.warp_group_dot' op pipeliner doesn't know how to predicate this op").
KEY_LOOP_STAGES = 1


def _launch_fwd(q, k, v, gk, z, slopes, qpos, kpos, kpad, kv_end_f, causal, scale, p_max, blocks, num_warps):
    L = _setup(q, k, v)
    bm, bn = blocks[0], blocks[1]
    o = torch.empty(L.B, L.H, L.Tq, L.Dv, device=q.device, dtype=q.dtype)
    lse = torch.empty(L.B, L.H, L.Tq, device=q.device, dtype=torch.float32)
    gtot = torch.empty(L.B, L.H, L.Tq, device=q.device, dtype=torch.float32)
    gk_, z_, slopes_, kpad_ = _stand_ins(k, gk, z, slopes, kpad, lse, kv_end_f)
    nqb = cdiv(L.Tq, bm)
    _cope_fwd_kernel[(nqb, L.B * L.H)](
        q, k, v, gk_, z_, slopes_, qpos, kpos, kpad_, kv_end_f,
        o, lse, gtot,
        *q.stride(), *k.stride(), *v.stride(), *gk_.stride(), *o.stride(),
        qpos.stride(0), kpos.stride(0), kpad_.stride(0),
        L.H, L.group, L.Tq, L.Tk, L.D, L.Dv, p_max, nqb, float(scale),
        CAUSAL=causal, HAS_PAD=kpad is not None, SEP_GATES=gk is not None, ALIBI=slopes is not None,
        PRECISION=L.precision, DOT_DTYPE=L.dot_dtype,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=L.block_d, BLOCK_DV=L.block_dv,
        num_warps=num_warps, num_stages=KEY_LOOP_STAGES,
    )
    return o, lse, gtot


def _launch_bwd(q, k, v, gk, z, slopes, qpos, kpos, kpad, kv_end_b, o, lse, gtot, do,
                causal, scale, p_max, blocks, num_warps):
    L = _setup(q, k, v)
    bm, bn = blocks[2], blocks[3]
    alibi = slopes is not None
    sep = gk is not None
    do = do.contiguous()
    dsum = (do.float() * o.float()).sum(-1).contiguous()  # rowsum(o * dO), (B, H, Tq)
    f32 = dict(device=q.device, dtype=torch.float32)
    # dk, dv, dgk, dz, dslopes are shared by query blocks / GQA heads and accumulated with atomics
    dq = torch.empty(L.B, L.H, L.Tq, L.D, **f32)
    dk = torch.zeros(L.B, L.Hkv, L.Tk, L.D, **f32)
    dv = torch.zeros(L.B, L.Hkv, L.Tk, L.Dv, **f32)
    dgk = torch.zeros(L.B, L.Hkv, L.Tk, L.D, **f32) if sep else dk
    dz = torch.zeros(L.B, L.H, L.Tq, p_max, **f32) if not alibi else dq
    dsl = torch.zeros(L.H, **f32) if alibi else dq
    gk_, z_, slopes_, kpad_ = _stand_ins(k, gk, z, slopes, kpad, lse, kv_end_b)
    nqb = cdiv(L.Tq, bm)
    _cope_bwd_kernel[(nqb, L.B * L.H)](
        q, k, v, gk_, z_, slopes_, qpos, kpos, kpad_, kv_end_b,
        do, lse, gtot, dsum,
        dq, dk, dv, dgk, dz, dsl,
        *q.stride(), *k.stride(), *v.stride(), *gk_.stride(), *do.stride(),
        qpos.stride(0), kpos.stride(0), kpad_.stride(0),
        L.H, L.Hkv, L.group, L.Tq, L.Tk, L.D, L.Dv, p_max, nqb, float(scale),
        CAUSAL=causal, HAS_PAD=kpad is not None, SEP_GATES=sep, ALIBI=alibi,
        PRECISION=L.precision, DOT_DTYPE=L.dot_dtype,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=L.block_d, BLOCK_DV=L.block_dv,
        num_warps=num_warps, num_stages=KEY_LOOP_STAGES,
    )
    # custom ops can neither return None nor one tensor twice: each absent input gets its own empty gradient
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
            dgk.to(gk.dtype) if sep else q.new_empty(0),
            dz if z is not None else q.new_empty(0),
            dsl.to(slopes.dtype) if alibi else q.new_empty(0))


# ----------------------------------------------------------------------------------------
# torch.library ops: opaque to torch.compile (fullgraph), which traces through them instead of into
# the Triton launch
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
        check_ordered_keys(k_positions)  # (encodings/cope.py: the reference's check and message)
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


# The autograd layer is registered on the op (see triton_pope.py for why not an autograd.Function).
def _setup_context(ctx, inputs, output):
    (q, k, v, gk, z, slopes, qpos, kpos, kpad, kv_end_f, kv_end_b,
     causal, check_sorted, scale, p_max, blocks, num_warps) = inputs
    o, lse, gtot = output
    ctx.save_for_backward(q, k, v, gk, z, slopes, qpos, kpos, kpad, kv_end_b, o, lse, gtot)
    ctx.cfg = (causal, scale, p_max, list(blocks), num_warps)


def _backward(ctx, dout, dlse, dgtot):
    q, k, v, gk, z, slopes, qpos, kpos, kpad, kv_end_b, o, lse, gtot = ctx.saved_tensors
    causal, scale, p_max, blocks, num_warps = ctx.cfg
    dq, dk, dv, dgk, dz, dsl = _cope_attn_bwd(q, k, v, gk, z, slopes, qpos, kpos, kpad, kv_end_b, o, lse, gtot,
                                              dout, causal, scale, p_max, blocks, num_warps)
    return (dq, dk, dv,
            dgk if gk is not None else None,
            dz if z is not None else None,
            dsl if slopes is not None else None,
            None, None, None, None, None, None, None, None, None, None, None)


torch.library.register_autograd("poskit::cope_attn_fwd", _backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------------------
# public API: argument checks, tile sizes, positions and key ranges
# ----------------------------------------------------------------------------------------
def _check_args(q, k, v, pos_emb, p_max, gate_keys, key_padding_mask, slopes):
    """Raise ValueError naming the first argument cope_attention_triton cannot take; returns pos_emb, gate_keys,
    key_padding_mask and slopes as the launch takes them ((D, p_max); None for gate_keys that are k; int8
    mask; float slopes on q's device)."""
    check_qkv(q, k, v)
    B, H, _, D = q.shape
    Tk = k.shape[2]
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
    return pos_emb, gate_keys, key_padding_mask, slopes


def _tile_sizes(device, width: int, block_m, block_n) -> list[int]:
    """[fwd BLOCK_M, fwd BLOCK_N, bwd BLOCK_M, bwd BLOCK_N]; block_m / block_n override the forward's."""
    fm, fn, bm, bn = _default_blocks(device, width)
    if block_m is not None:
        fm = block_m
    if block_n is not None:
        fn = block_n
    for name, val in (("block_m", fm), ("block_n", fn)):
        if val < 16 or val & (val - 1):
            raise ValueError(f"block_m and block_n must be powers of two >= 16, got {name}={val}")
    return [fm, fn, bm, bn]


def _positions(pos, B: int, T: int, name: str, default, device) -> torch.Tensor:
    if pos is None:
        pos = default
    pos = torch.as_tensor(pos, device=device)
    check_position_shape(name, pos, T, B)
    return pos.expand(B, T)


def _positions_and_key_ends(q_positions, k_positions, causal, B, Tq, Tk, fwd_block, bwd_block, dev):
    """(q positions, k positions, key end per forward query block, per backward query block) as the kernels
    take them. The key end of a query block is one past the last key its latest query sees (keys are sorted);
    without the causal mask it is Tk and the query positions are a stand-in."""
    if causal or k_positions is not None:
        kpos = _positions(k_positions, B, Tk, "k_positions", torch.arange(Tk, device=dev), dev)
        kpos = kpos.double() if kpos.is_floating_point() else kpos.long()
        kpos = kpos.contiguous()
    if not causal:
        qpos = torch.zeros(1, 1, device=dev, dtype=torch.int32)  # unused without the causal mask
        if k_positions is None:
            kpos = qpos

        def key_ends(block):
            return torch.full((B, cdiv(Tq, block)), Tk, device=dev, dtype=torch.int32)
    else:
        qpos = _positions(q_positions, B, Tq, "q_positions", torch.arange(Tk - Tq, Tk, device=dev), dev)
        if kpos.is_floating_point() or qpos.is_floating_point():
            kpos, qpos = kpos.double(), qpos.double()
        else:
            qpos = qpos.long()
        qpos = qpos.contiguous()

        def key_ends(block):
            return sorted_key_ends(qpos, kpos, block).to(torch.int32).contiguous()
    kv_end_f = key_ends(fwd_block)
    kv_end_b = kv_end_f if bwd_block == fwd_block else key_ends(bwd_block)
    if causal and kpos.dtype == torch.float64:  # kernel compares in fp32 for float positions
        kpos, qpos = kpos.float(), qpos.float()
    return qpos, kpos, kv_end_f, kv_end_b


def cope_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos_emb: torch.Tensor | None,
    *,
    is_causal: bool | None = None,
    scale: float,
    q_positions=None,
    k_positions=None,
    p_max: int,
    gate_keys: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    slopes: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    **renamed,
) -> torch.Tensor:
    """Fused CoPE attention (Triton forward + fused Triton backward), a torch.library custom op.

    Args:
        q: (B, H, Tq, D) queries.
        k: (B, Hkv, Tk, D) keys, ``H % Hkv == 0`` (GQA in HF ``repeat_kv`` order).
        v: (B, Hkv, Tk, Dv) values.
        pos_emb: (D, p_max) integer-position embeddings ``e`` shared across heads
            (the paper's ``pos_emb[0]``), or None when ``slopes`` is given.
        is_causal: mask keys with ``k_positions > q_positions`` (required; the former spelling
            causal= still works, with a DeprecationWarning).
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
    causal = deprecated_causal("cope_attention_triton", is_causal, renamed)
    if renamed:
        raise TypeError(f"cope_attention_triton() got an unexpected keyword argument {next(iter(renamed))!r}")
    if not HAS_TRITON:
        raise ImportError("cope_attention_triton requires the 'triton' package")
    pos_emb, gate_keys, key_padding_mask, slopes = _check_args(q, k, v, pos_emb, p_max, gate_keys,
                                                               key_padding_mask, slopes)
    B, H, Tq, D = q.shape
    Tk, width = k.shape[2], max(D, v.shape[-1])
    blocks = _tile_sizes(q.device, width, block_m, block_n)
    # z[t, j] = q_t . e[:, j] is a small fp32 table (B, H, Tq, p_max) built outside the op, so autograd
    # turns its gradient dz (from the kernel) into dq += dz e^T and de = q^T dz
    z = None if slopes is not None else torch.matmul(q.float(), pos_emb.float())
    qpos, kpos, kv_end_f, kv_end_b = _positions_and_key_ends(q_positions, k_positions, causal, B, Tq, Tk,
                                                             blocks[0], blocks[2], q.device)
    num_warps = 4 if width <= 64 else 8
    out, _, _ = _cope_attn_fwd(q, k, v, gate_keys, z, slopes, qpos, kpos, key_padding_mask, kv_end_f, kv_end_b,
                               bool(causal), k_positions is not None, float(scale), int(p_max), blocks, num_warps)
    return out
