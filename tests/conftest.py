import os

import pytest
import torch

# Triton kernels are tested on CPU through the interpreter; must be set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def make_qkv(B=2, H=4, Hkv=2, Tq=7, Tk=7, D=16, Dv=None, dtype=torch.float64, requires_grad=False, gen_seed=0):
    g = torch.Generator().manual_seed(gen_seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=dtype)
    k = torch.randn(B, Hkv, Tk, D, generator=g, dtype=dtype)
    v = torch.randn(B, Hkv, Tk, Dv or D, generator=g, dtype=dtype)
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


# options that make every registered encoding buildable at small sizes
ENCODING_OPTIONS = {
    "rope-linear": dict(factor=2.0),
    "rope-ntk": dict(factor=2.0),
    "rope-dynamic": dict(factor=2.0, original_max_positions=4),
    "rope-yarn": dict(factor=4.0, original_max_positions=8),
    "relative": dict(max_distance=64),
    "relative-capped": dict(max_distance=3),
    "learned": dict(max_positions=64),
    "cope": dict(p_max=6, init_std=0.5),
    "pope": dict(delta_init="uniform"),
}


def build(name, head_dim=16, num_heads=4, dim=32, dtype=torch.float64, **extra):
    import poskit

    opts = dict(ENCODING_OPTIONS.get(name, {}), **extra)
    enc = poskit.build_encoding(name, head_dim=head_dim, num_heads=num_heads, dim=dim, **opts)
    return enc.to(dtype)
