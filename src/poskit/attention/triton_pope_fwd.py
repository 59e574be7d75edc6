"""PoPE's fused forward kernel in Triton, and the device helpers its backward kernels share.

The math (the logit in polar and Cartesian form), the masking by position and the layers around these kernels
are described in triton_pope.py, which launches them; the backward kernels are in triton_pope_bwd.py. The
helpers here load a query or key tile in polar form (raw values, magnitudes, the cos/sin tables, the phase
bias on the query side), score a key block against a query block, and read the per-block ranges of keys or
queries that the host computed (blocks.py).
"""
from __future__ import annotations

from .triton_core import HAS_TRITON, tl, triton

if HAS_TRITON:
    from .triton_core import load_tile, online_softmax_step, tile_ranges, visible_keys

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
