"""PoPE's fused backward kernels in Triton (FlashAttention-2 style).

The forward saved the row log-sum-exp; these kernels recompute the probabilities from it. One kernel
computes dk/dv (looping over the query heads of a GQA group, so no atomics), another dq and per-block
partials of d delta, which the host reduces in torch; a small kernel first forms rowsum(dO * O). The shared
device helpers (polar loads, key-block scores, block ranges) are in triton_pope_fwd.py; the launches and the
autograd formula in triton_pope.py.
"""
from __future__ import annotations

from .triton_core import HAS_TRITON, tl, triton

if HAS_TRITON:
    from .triton_core import LOG2E_JIT, load_tile, tile_ranges
    from .triton_pope_fwd import (_dsoftplus, _key_block_range, _key_block_scores, _load_phase, _load_polar,
                                  _load_query, _query_block_range)

if HAS_TRITON:

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
