"""Exact CoPE attention on CPU in query blocks, forward and backward, without a T x T tensor.

CoPE's bias needs, per query t and key s, the suffix sum p_ts of the gates over keys s..t (eq. 5-6), so the
materialised reference keeps several (B, H, T, T) tensors alive (8.9 GB at B=1, H=8, T=4096 forward and
backward). Here the queries are split into blocks of `block` rows and each block sees its visible keys
[0, key_end) at once: memory O(block * Tk) per head, batch rows chunked so that one block's logits stay
in cache (blocked.CHUNK_BYTES). (The Triton kernel walks key tiles backwards with a carried gate sum and an online softmax; on CPU one
GEMM against the block's whole key row is faster than key tiles and needs neither.)

Once a row's gate sum passes p_max - 1, every farther key sits at the clamped position p_max - 1: a bias
that is constant along the row, and no gradient into those keys' gates. So the gates, positions and
interpolation run only on a window of the nearest keys (see _Setup.recompute), widened to the whole row
when some row has not saturated by its end; the far keys get the constant. This is what brings CoPE near
plain attention's cost at long T, and it is exact whatever the gates are.

z = q @ e (B, H, Tq, p_max) is computed outside the autograd Function, as the Triton kernel does
(attention/triton_cope.py): autograd then turns dz into dq and de. The backward recomputes the block
(gates, positions, bias, probabilities) instead of storing it, like FlashAttention:

    dA   = P * (dO v^T - rowsum(dO * O))          gradient of the biased logits
    dz   = dA scattered at floor p, and dA w into the step table z[j + 1] - z[j]           (cope)
    dp   = dA (z[floor p + 1] - z[floor p])  or  -m_h dA (cope-alibi), 0 where the clamp is active
    dg   = prefix sum of dp over keys (the adjoint of the suffix sum), dgate logit = dg g (1 - g)
"""
from __future__ import annotations

import torch

from ..encodings.cope import check_ordered_keys
from ..util.function_call import call
from .blocked import _batch_chunks, _batch_rows, _block_plan, _flat, _partial_mask
from .grouped import kv_rows, per_head, to_kv_heads
from .inputs import all_finite

DEFAULT_BLOCK = 64
# The gate machinery covers the masked keys plus this many keys per position before a block's rows are
# expected to have saturated (gates average 1/2 for content logits near 0): see _Setup.recompute.
NEAR_KEYS_PER_POSITION = 4


class _Step:
    """One (query block, batch chunk) of the blocked CoPE computation: queries [i, j) against keys [0, ke)."""

    def __init__(self, fn, b0, b1, step):
        i, j, full_end, ke = step
        H = fn.H
        self.rows = slice(b0 * H, b1 * H)
        self.kv_rows = kv_rows(self.rows, fn.groups)
        self.i, self.j, self.ke = i, j, ke
        self.shape = (b1 - b0, H, j - i, ke)
        self.n_masked = ke - full_end  # keys [full_end, ke), the last columns, need a mask
        self.vis = None
        if self.n_masked:
            self.vis = _partial_mask(_batch_rows(fn.q_positions, b0, b1), _batch_rows(fn.k_positions, b0, b1),
                                     None if fn.pad is None else fn.pad[b0:b1], fn.causal, i, j, full_end, ke)

    def masked(self, x):
        """The masked (last) columns of a (rows, bq, width) tensor as a (b, H, bq, n_masked) view."""
        return x.view(*self.shape[:3], x.shape[-1])[..., x.shape[-1] - self.n_masked:]


class BlockedCoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, gk, z, slopes, scale, p_max, q_positions, k_positions, causal, key_padding_mask,
                block):
        # q (B, H, Tq, D); k, v, gk (B, H_kv, Tk, .) (grouped.py); gk None: gates from k;
        # z (B, H, Tq, p_max) for cope or slopes (H,) for cope-alibi
        fn = _Setup(q, k, v, gk, z, slopes, scale, p_max, q_positions, k_positions, causal, key_padding_mask,
                    block)
        out = q.new_zeros(fn.B, fn.H, fn.Tq, v.shape[-1])
        out3 = out.view(fn.B * fn.H, fn.Tq, -1)
        for st in fn.steps():
            probs = fn.recompute(st).probs
            out3[st.rows, st.i:st.j] = per_head(probs.to(v.dtype), fn.v3[st.kv_rows, :st.ke], fn.groups)
        pad = key_padding_mask if key_padding_mask is not None else torch.empty(0)
        ctx.save_for_backward(q, k, v, gk, z, slopes, out, q_positions, k_positions, pad)
        ctx.args = (scale, p_max, causal, key_padding_mask is not None, block)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, gk, z, slopes, out, q_positions, k_positions, pad = ctx.saved_tensors
        scale, p_max, causal, has_pad, block = ctx.args
        fn = _Setup(q, k, v, gk, z, slopes, scale, p_max, q_positions, k_positions, causal,
                    pad if has_pad else None, block)
        acc = fn.stat
        zeros = lambda x: None if x is None else torch.zeros(x.shape, dtype=acc, device=x.device)  # noqa: E731
        dq3, dk3, dv3, dg3 = zeros(fn.q3), zeros(fn.k3), zeros(fn.v3), zeros(fn.g3)
        dz3 = zeros(fn.z3)
        dslope_rows = None if slopes is None else torch.zeros(fn.B * fn.H, dtype=acc, device=q.device)
        do3 = _flat(grad_out.contiguous())
        row_dot = (do3.to(acc) * _flat(out).to(acc)).sum(-1, keepdim=True)  # D_t = rowsum(dO * O)
        for st in fn.steps():
            r, kv, g, i, j, ke = st.rows, st.kv_rows, fn.groups, st.i, st.j, st.ke
            keys = slice(0, ke)
            blk = fn.recompute(st)
            p, do = blk.probs, do3[r, i:j]
            dv3[kv, keys] += to_kv_heads(p.to(v.dtype), do, g).to(acc)
            da = per_head(do, fn.v3[kv, keys].transpose(1, 2), g).to(acc).sub_(row_dot[r, i:j]).mul_(p)
            n = ke - blk.width  # keys [n, ke) are the near window, [0, n) the far (saturated) keys
            near = da[..., n:]
            if z is not None:
                # bias = z[lo] + w (z[lo + 1] - z[lo]): scatter dA at lo and dA w into the step table
                dz = torch.zeros_like(blk.zrow).scatter_add_(-1, blk.lo, near)
                dstep = torch.zeros_like(blk.zrow).scatter_add_(-1, blk.lo, near * blk.w)[..., :-1]
                dz[..., 1:] += dstep
                dz[..., :-1] -= dstep
                dz[..., -1] += da[..., :n].sum(-1)  # the far keys' constant z[p_max - 1]
                dz3[r, i:j] = dz
                dpos = near * blk.zstep  # 0 where the clamp is active: the step table ends with a 0
            else:
                dslope_rows[r] -= (near * blk.pos).sum((1, 2)) + (p_max - 1) * da[..., :n].sum((1, 2))
                dpos = near * (-blk.slope)
                dpos.masked_fill_(blk.clamped, 0.0)
            # adjoint of the suffix sum: dg_s' = sum of dpos over keys s <= s', a prefix sum (the far keys
            # before the window have dpos 0: clamped)
            dlogit = dpos.cumsum_(-1).mul_(blk.gates).mul_(1 - blk.gates)  # gates are 0 at masked keys
            q_blk = fn.q3[r, i:j]
            if gk is None:
                near.add_(dlogit)
            else:
                gkeys = slice(n, ke)
                dq3[r, i:j] += per_head(dlogit.to(q.dtype), fn.g3[kv, gkeys], g).to(acc)
                dg3[kv, gkeys] += to_kv_heads(dlogit.to(q.dtype), q_blk, g).to(acc)
            dq3[r, i:j] += per_head(da.to(q.dtype), fn.k3[kv, keys], g).to(acc)
            dk3[kv, keys] += to_kv_heads(da.to(q.dtype), q_blk, g).to(acc)
        dq = (dq3 * scale).view(q.shape).to(q.dtype)  # (q3 carries the scale, so dk3 and dg3 have it already)
        dk = dk3.view(k.shape).to(k.dtype)
        dv = dv3.view(v.shape).to(v.dtype)
        dgk = None if gk is None else dg3.view(gk.shape).to(gk.dtype)
        dz = None if z is None else dz3.view(z.shape).to(z.dtype)
        dslopes = None if slopes is None else dslope_rows.view(fn.B, fn.H).sum(0).to(slopes.dtype)
        return dq, dk, dv, dgk, dz, dslopes, None, None, None, None, None, None, None


class _Block:
    """The recomputed quantities of one step: probabilities and what the backward needs of the bias."""


class _Setup:
    """The flattened, key-reversed inputs of one call and the recomputation of one block."""

    def __init__(self, q, k, v, gk, z, slopes, scale, p_max, q_positions, k_positions, causal, pad, block):
        self.B, self.H, self.Tq, _ = q.shape
        self.Tk = k.shape[2]
        self.groups = self.H // k.shape[1]
        self.stat = torch.promote_types(q.dtype, torch.float32)  # gates, sums and softmax in fp32 for half
        self.scale, self.p_max, self.causal, self.pad = scale, p_max, causal, pad
        self.q_positions, self.k_positions = q_positions, k_positions
        self.finite = all_finite(q, k, gk)
        self.q3 = _flat(q if scale == 1.0 else q * scale)  # the scale folded into q once: s = q3 k3^T
        self.k3, self.v3 = _flat(k), _flat(v)
        self.g3 = None if gk is None else _flat(gk)
        self.z3 = None if z is None else _flat(z).to(self.stat)
        # z[j + 1] - z[j], ending with 0: the interpolation step, and no slope past the clamp at p_max - 1
        self.zstep3 = None
        if z is not None:
            self.zstep3 = torch.zeros_like(self.z3)
            torch.sub(self.z3[..., 1:], self.z3[..., :-1], out=self.zstep3[..., :-1])
        self.slope_rows = None if slopes is None else slopes.to(self.stat).repeat(self.B)
        self.plan = _block_plan(q_positions, k_positions, pad, causal, self.Tq, self.Tk, block)
        elem = torch.empty(0, dtype=self.stat).element_size()
        self.chunks = _batch_chunks(self.B, self.H, block, self.Tk, elem)

    def steps(self):
        for step in self.plan:
            if step[3] == 0:
                continue  # no key visible to any query of the block: output 0, no gradient
            for b0, b1 in self.chunks:
                yield _Step(self, b0, b1, step)

    def gates(self, st: _Step, s: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Gates of the `width` nearest keys [ke - width, ke) (0 at masked ones) and their suffix sums
        (unclamped), exact: a cumulative sum over the reversed window, as the reference's over the row."""
        r, i, j, ke = st.rows, st.i, st.j, st.ke
        if self.g3 is None:
            logits = s[..., ke - width:]
        else:
            logits = per_head(self.q3[r, i:j], self.g3[st.kv_rows, ke - width:ke].transpose(1, 2),
                              self.groups).to(self.stat)
        gates = torch.sigmoid(logits)  # key gates: the masked logits are -inf already, their gates 0
        if st.n_masked and self.g3 is not None:
            st.masked(gates).masked_fill_(~st.vis, 0.0)
        return gates, gates.flip(-1).cumsum_(-1).flip(-1)

    def recompute(self, st: _Step) -> _Block:
        r, i, j, ke, P = st.rows, st.i, st.j, st.ke, self.p_max
        q_blk = self.q3[r, i:j]
        s = per_head(q_blk, self.k3[st.kv_rows, :ke].transpose(1, 2), self.groups).to(self.stat)
        if st.n_masked:
            st.masked(s).masked_fill_(~st.vis, float("-inf"))
        # Once a row's gate sum passes p_max - 1, every farther key has the clamped position p_max - 1: a
        # constant bias per row and no gradient into its gates. So the gate machinery runs on a window of the
        # nearest keys (the masked ones plus a few per position), grown to the whole row if some row of the
        # block has not saturated by its end; the far keys get the row's constant. Exact either way.
        width = min(st.ke, st.n_masked + NEAR_KEYS_PER_POSITION * P)
        gates, total = self.gates(st, s, width)
        if width < ke and not bool((total[..., 0] > P - 1).all()):  # the window's farthest key, largest sum
            width = st.ke
            gates, total = self.gates(st, s, width)
        blk = _Block()
        blk.width, blk.gates = width, gates
        if self.z3 is None:
            blk.clamped = total > P - 1  # (cope's step table gives 0 there by itself)
        pos = total.clamp_(max=P - 1)
        far, near = s[..., :ke - width], s[..., ke - width:]
        if self.z3 is not None:
            zrow = self.z3[r, i:j]
            # p >= 0, so truncation is the floor; z[lo] + w (z[lo + 1] - z[lo]) is the reference's
            # z[ceil] w + z[floor] (1 - w). Its derivative in p at an integer p is the right-hand one
            # (the reference's ceil == floor gives 0 there): a set of measure zero; at the clamp both are 0.
            # a NaN position (NaN in q or a key) must not become an index (NaN.long() is INT64_MIN): it reads
            # row 0 and its weight w stays NaN, carrying the NaN into the row as in the reference
            blk.lo = (pos if self.finite else pos.nan_to_num(0.0)).long()
            w = pos - blk.lo
            blk.zstep = self.zstep3[r, i:j].gather(-1, blk.lo)
            near.add_(zrow.gather(-1, blk.lo)).addcmul_(w, blk.zstep)
            far.add_(zrow[..., P - 1:])
            blk.zrow, blk.w = zrow, w
        else:
            blk.slope = self.slope_rows[r, None, None]
            near.sub_(pos * blk.slope)
            far.sub_((P - 1) * blk.slope)
            blk.pos = pos
        probs = torch.softmax(s, dim=-1)
        if st.n_masked == ke:  # every key masked somewhere: a query that sees none gets weights 0, not NaN
            has_key = st.vis.any(-1, keepdim=True)
            if not bool(has_key.all()):
                probs.view(st.shape).masked_fill_(~has_key, 0.0)
        blk.probs = probs
        return blk


def blocked_cope_attention(q, k, v, *, scale, q_positions, k_positions, causal, p_max, pos_emb=None, slopes=None,
                           gate_keys=None, key_padding_mask=None, block=None):
    """CoPE attention (B, H, Tq, Dv) in query blocks, exact, memory O(block * Tk) per head.

    q (B, H, Tq, D); k, v, gate_keys (B, H_kv, Tk, .) (query head h reads kv head h // (H // H_kv));
    positions (1|B, T) int64 with non-decreasing keys; key_padding_mask (B, Tk) bool, True = keep.
    Exactly one of pos_emb (D, p_max), CoPE's interpolated embeddings, or slopes (H,), cope-alibi's
    per-head slopes (bias -m_h p). gate_keys None: the gates dot q with k (pass v for value gates).
    """
    if (pos_emb is None) == (slopes is None):
        raise ValueError("pass exactly one of pos_emb (cope) and slopes (cope-alibi)")
    if isinstance(p_max, bool) or not isinstance(p_max, int) or p_max < 1:
        raise ValueError(f"p_max must be an int >= 1, got {p_max!r}")
    if pos_emb is not None and tuple(pos_emb.shape) != (q.shape[-1], p_max):
        raise ValueError(f"pos_emb must have shape ({q.shape[-1]}, {p_max}), got {tuple(pos_emb.shape)}")
    if slopes is not None and tuple(slopes.shape) != (q.shape[1],):
        raise ValueError(f"slopes must have shape ({q.shape[1]},) (one per query head), got {tuple(slopes.shape)}")
    check_ordered_keys(k_positions)
    z = None if pos_emb is None else q @ pos_emb.to(q.dtype)  # z_t[j] = q_t . e[j], unscaled as in the listing
    return call(BlockedCoPE, q, k, v, gate_keys, z, slopes, scale, p_max, q_positions,
                             k_positions, causal, key_padding_mask, block or DEFAULT_BLOCK)
