"""PoPE's Cartesian features [mu * c, mu * s] with mu = softplus(x), as one autograd node.

Written through autograd op by op, the Cartesian query costs five (B, H, T, d) temporaries in the forward
and as many again in the backward. Here the forward writes the 2d-wide output once and the backward
computes dx = (g_c * c + g_s * s) * sigmoid(x) directly (softplus' = sigmoid). Measured 49 -> 38 ms for q and
k forward+backward at B=8, H=8, T=1024, d=64.

The query's angles are a - delta (a per position, the phase bias delta per head), so its tables c, s are
(1|B, H, T, d): at B=1 each is as large as q itself. They are therefore passed factored, as the position
tables cos a, sin a (1|B, 1, T, d) and the per-head rotation cos delta, sin delta (1, H, 1, d), and rebuilt in
the backward; mu is recomputed there too. The node then keeps nothing larger than its input x, which the
caller holds anyway: at B=1, T=4096 this is three q-sized tensors fewer alive through attention's backward
(benchmarks/attention.py reports the peak). Small inputs (below KEEP_MU_BELOW elements) keep mu instead of
recomputing it: softplus is the costliest op here (about 1 ms per (32, 4, 64, 32) call on one core, some 2 % of
the demo LM's training step for its two layers), and at that size the memory it holds is negligible.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..util.function_call import call

KEEP_MU_BELOW = 1 << 20  # elements of x (4 MB in fp32): smaller inputs keep softplus(x) for the backward

# The compiled CPU kernel's library has the common case as two single-pass ops (fp32 or bf16 x (B, H, T, d),
# position tables (1|B, 1, T, d), the rotation (1, H, 1, d) or none, no gradient to the position tables): one
# read of x and the tables, one write of the output, where the ops below make several passes. attention/cpu_flash.py
# registers a provider of the ops (None when the kernel is switched off or cannot load): the encodings do not
# depend on the attention package, and without it this module keeps its own path.
_fused_provider = None


def use_fused(provider) -> None:
    """Register `provider()`, which returns the compiled library's ops (polar_forward, polar_backward) or None."""
    global _fused_provider
    _fused_provider = provider


_FUSED_DTYPES = (torch.float32, torch.bfloat16)


def _fused_ops(x, ca, sa, cd, sd, needs_input_grad):
    """The compiled ops when they serve this call, else None. x in fp32 or bf16 (computed in fp32 and rounded
    once, where the op-by-op path rounds after every op); the tables in either, read as fp32."""
    if _fused_provider is None or x.device.type != "cpu" or x.dtype not in _FUSED_DTYPES or x.dim() != 4:
        return None
    B, H, T, d = x.shape
    if any(needs_input_grad[1:3]) or ca.dtype not in _FUSED_DTYPES or sa.dtype not in _FUSED_DTYPES:
        return None
    if ca.shape != sa.shape or ca.shape not in ((1, 1, T, d), (B, 1, T, d)):
        return None
    if cd is not None and (cd.shape != (1, H, 1, d) or sd.shape != cd.shape or cd.dtype not in _FUSED_DTYPES
                           or sd.dtype not in _FUSED_DTYPES):
        return None
    return _fused_provider()


def _fp32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).contiguous()


def _rotation_rows(cd, sd):
    """The rotation as the compiled ops take it: (H, d) contiguous fp32 tables, or empty ones."""
    if cd is None:
        empty = torch.empty(0)
        return empty, empty
    return _fp32(cd.reshape(cd.shape[1], cd.shape[3])), _fp32(sd.reshape(sd.shape[1], sd.shape[3]))


def _reduce_to(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a broadcast gradient back to `shape` (same rank)."""
    dims = [i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1]
    return grad.sum(dims, keepdim=True) if dims else grad


def _tables(ca, sa, cd, sd, scale):
    """c = scale cos(a - delta), s = scale sin(a - delta) from the factors (cd, sd None: no rotation)."""
    if cd is not None:
        # cos(a - delta) = cos a cos delta + sin a sin delta; sin(a - delta) = sin a cos delta - cos a sin delta
        ca, sa = torch.addcmul(ca * cd, sa, sd), torch.addcmul(sa * cd, ca, sd, value=-1.0)
    if scale != 1.0:
        ca, sa = ca * scale, sa * scale
    return ca, sa


def _magnitude(x, kept_mu, softplus: bool):
    """mu as the forward computed it: the kept softplus(x), else recomputed (x itself without softplus)."""
    if kept_mu is not None:
        return kept_mu
    return F.softplus(x) if softplus else x


def _grad_x(dmu, x, scale: float, softplus: bool):
    """dL/dx from dL/dmu before the scale (multiplied in here, in place), times softplus' = sigmoid(x)."""
    if scale != 1.0:
        dmu.mul_(scale)
    return _reduce_to(dmu.mul_(torch.sigmoid(x)) if softplus else dmu, x.shape)


class PolarPair(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ca, sa, cd, sd, scale: float, softplus: bool):
        # x: (B, H, T, d); ca, sa: broadcastable to x, same rank; cd, sd: (1, H, 1, d) or None -> (B, H, T, 2d)
        ctx.scale, ctx.softplus = scale, softplus
        ops = _fused_ops(x, ca, sa, cd, sd, ctx.needs_input_grad)
        ctx.fused = ops
        if ops is not None:
            x, ca, sa = x.contiguous(), _fp32(ca), _fp32(sa)
            ctx.save_for_backward(x, ca, sa, cd, sd, None)
            return ops.polar_forward(x, ca, sa, *_rotation_rows(cd, sd), float(scale), bool(softplus))
        mu = F.softplus(x) if softplus else x
        c, s = _tables(ca, sa, cd, sd, scale)
        d = x.shape[-1]
        out = x.new_empty(*torch.broadcast_shapes(x.shape, c.shape)[:-1], 2 * d)
        torch.mul(mu, c, out=out[..., :d])
        torch.mul(mu, s, out=out[..., d:])
        needs_mu = any(ctx.needs_input_grad[1:5])  # only the tables' gradients read mu itself
        keep_mu = softplus and needs_mu and x.numel() < KEEP_MU_BELOW
        ctx.save_for_backward(x, ca, sa, cd, sd, mu if keep_mu else None)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, ca, sa, cd, sd, kept_mu = ctx.saved_tensors
        scale, softplus = ctx.scale, ctx.softplus
        if ctx.fused is not None:
            need_rotation = cd is not None and any(ctx.needs_input_grad[3:5])
            dx, drot = ctx.fused.polar_backward(grad.to(x.dtype).contiguous(), x, ca, sa, *_rotation_rows(cd, sd),
                                                float(scale), bool(softplus), need_rotation)
            dcd = dsd = None
            if need_rotation:  # per thread -> summed in fp32; (2, H, d) -> each table's (1, H, 1, d) and dtype
                dcd, dsd = (r.reshape(cd.shape).to(t.dtype) for r, t in zip(drot.sum(0), (cd, sd)))
            return (dx if ctx.needs_input_grad[0] else None, None, None,
                    dcd if ctx.needs_input_grad[3] else None, dsd if ctx.needs_input_grad[4] else None, None, None)
        d = x.shape[-1]
        g_c, g_s = grad[..., :d], grad[..., d:]
        need_x, need_ca, need_sa, need_cd, need_sd = ctx.needs_input_grad[:5]
        dx = dca = dsa = dcd = dsd = None
        if need_ca or need_sa:  # position tables with a gradient (not poskit's own angle tables): plainly
            mu = _magnitude(x, kept_mu, softplus)
            gc, gs = g_c * mu * scale, g_s * mu * scale
            if cd is None:
                dca, dsa = _reduce_to(gc, ca.shape), _reduce_to(gs, sa.shape)
            else:  # c = ca cd + sa sd, s = sa cd - ca sd
                dca = _reduce_to(torch.addcmul(gc * cd, gs, sd, value=-1.0), ca.shape) if need_ca else None
                dsa = _reduce_to(torch.addcmul(gc * sd, gs, cd), sa.shape) if need_sa else None
            del mu, gc, gs
        if cd is None:
            if need_x:
                dx = _grad_x(torch.addcmul(g_c * ca, g_s, sa), x, scale, softplus)
            return dx, dca, dsa, None, None, None, None
        if x.shape[0] >= 2 * ca.shape[0]:
            # tables shared by a batch: the rotated ones are a fraction of x's size, so they are rebuilt and the
            # gradient is taken through them (fewer x-sized operations than the factored form below)
            c, s = _tables(ca, sa, cd, sd, 1.0)
            if need_cd or need_sd:
                mu = _magnitude(x, kept_mu, softplus)
                gc, gs = _reduce_to(g_c * mu, c.shape), _reduce_to(g_s * mu, s.shape)
                del mu
                if need_cd:
                    dcd = _reduce_to(torch.addcmul(gc * ca, gs, sa), cd.shape).mul_(scale)
                if need_sd:
                    dsd = _reduce_to(torch.addcmul(gc * sa, gs, ca, value=-1.0), sd.shape).mul_(scale)
            if need_x:
                dx = _grad_x(torch.addcmul(g_c * c, g_s, s), x, scale, softplus)
            return dx, dca, dsa, dcd, dsd, None, None
        # One table per batch row (B = 1, or per-row positions): the rotated tables would be as large as x, so the
        # gradient is taken in terms of the unrotated ones: p = g_c ca + g_s sa and r = g_c sa - g_s ca give
        # dL/dmu = scale (cd p + sd r), dL/dcd = scale sum mu p and dL/dsd = scale sum mu r (sums over batch and
        # time). Buffers are reused: at most three x-sized tensors are alive at once.
        p = torch.addcmul(g_c * ca, g_s, sa)
        r = torch.addcmul(g_c * sa, g_s, ca, value=-1.0)
        if need_cd or need_sd:
            mu = _magnitude(x, kept_mu, softplus)
            if mu is x or mu is kept_mu:  # written in place below: a copy of a tensor that is not fresh
                mu = mu.clone()
            if need_cd:
                dcd = _reduce_to(p * mu, cd.shape).mul_(scale)
            if need_sd:
                dsd = _reduce_to(mu.mul_(r), sd.shape).mul_(scale)
            del mu
        if need_x:
            dmu = p.mul_(cd).addcmul_(r, sd)
            del r
            dx = _grad_x(dmu, x, scale, softplus)
        return dx, dca, dsa, dcd, dsd, None, None


def polar_pair(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, softplus: bool = True, *,
               rotation: tuple[torch.Tensor, torch.Tensor] | None = None, scale: float = 1.0) -> torch.Tensor:
    """cat(mu * c', mu * s', dim=-1), mu = softplus(x) if softplus else x, where c' = scale c, s' = scale s, or
    with `rotation` = (cos delta, sin delta) broadcastable to x: c' = scale cos(a - delta), s' = scale sin(a -
    delta) for c = cos a, s = sin a. Differentiable in x, c, s and the rotation."""
    if c.dim() != x.dim():
        raise ValueError(f"c and s must have the rank of x ({x.dim()}), got {c.dim()}")
    cd, sd = (None, None) if rotation is None else rotation
    if cd is not None and (cd.dim() != x.dim() or sd.shape != cd.shape):
        raise ValueError(f"rotation's tables must have the rank of x ({x.dim()}) and one shape, got "
                         f"{tuple(cd.shape)} and {tuple(sd.shape)}")
    if torch.compiler.is_compiling():  # Dynamo cannot trace the out= writes; inductor fuses these ops anyway
        mu = F.softplus(x) if softplus else x
        c, s = _tables(c, s, cd, sd, scale)
        return torch.cat((mu * c, mu * s), dim=-1)
    return call(PolarPair, x, c, s, cd, sd, float(scale), softplus)
