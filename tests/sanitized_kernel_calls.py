"""Calls of every kind the compiled CPU kernel serves, for a run under AddressSanitizer and UndefinedBehaviorSanitizer
(tests/test_cpu_flash_sanitized.py runs this file against a library built with them): ragged tiles and lengths,
odd widths (a bf16 product's last pair half empty), keys and values with gaps between heads (a KV cache's
views), tiles that do and do not start on a 16-column boundary (the packed heads' column views), even and odd key
tiles (packed heads or packs per product), grouped kv heads, key padding, causal and not, decode (one query
against many keys) through the tiles and through the decode form, the long-sequence backward tile, both bias
forms, CoPE's contextual pass and PoPE's polar features, in fp32 and bf16 with and without the bf16 products.

The sanitizers check memory and arithmetic, not the numbers (test_cpu_flash.py compares them with the float64
formula); this file only requires every output and gradient to be finite. It prints one line per group and the
number of calls; any sanitizer report ends the process with a non-zero status.
"""
import random
import sys
import warnings

import torch

import poskit
from poskit.attention import cpu_flash
from poskit.attention.engine import route
from poskit.encodings.kernel_bias import KernelBias, distance_span
from poskit.encodings.registration import UntrainedEncodingWarning


def finite(label, *tensors):
    for n, t in enumerate(tensors):
        if t is not None and not torch.isfinite(t).all():
            raise AssertionError(f"{label}: tensor {n} is not finite")


def products_choices(dtype):
    if dtype == torch.bfloat16 and cpu_flash.bf16_products_available():
        return (False, True)
    return (False,)


def drawn_inputs(rng, g, B, H, Hkv, Tq, Tk, E, Dv, dtype, room):
    """q, k, v as leaves (k and v views of buffers with `room` rows after their Tk: a KV cache's layout), the
    positions of the last Tq of Tk keys, and a key padding mask (40 %: row 0's first keys, whose first queries may
    then see no key) or None."""
    q = torch.randn(B, H, Tq, E, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, Hkv, Tk + room, E, generator=g).to(dtype)[:, :, :Tk].requires_grad_()
    v = torch.randn(B, Hkv, Tk + room, Dv, generator=g).to(dtype)[:, :, :Tk].requires_grad_()
    pad = None
    if rng.random() < 0.4:
        pad = torch.ones(B, Tk, dtype=torch.bool)
        pad[0, : rng.randrange(Tk)] = False
    return q, k, v, torch.arange(Tk - Tq, Tk)[None], torch.arange(Tk)[None], pad


def direct_calls(rng, count):
    """cpu_flash_attention itself over a seeded sample of shapes, tiles, masks and dtypes, forward and backward."""
    calls = 0
    lengths = [(1, 1), (1, 48), (1, 300), (5, 37), (8, 48), (48, 48), (57, 100), (100, 100), (70, 130)]
    widths = [(1, 1), (3, 9), (7, 5), (16, 16), (17, 9), (33, 64), (64, 64), (128, 64)]
    tiles = [(8, 16), (16, 40), (8, 24), (32, 48), (7, 9), (5, 6), (64, 512), (13, 100)]
    for _ in range(count):
        Tq, Tk = rng.choice(lengths)
        E, Dv = rng.choice(widths)
        bq, bk = rng.choice(tiles)
        B, H, Hkv = rng.choice([(1, 1, 1), (2, 2, 2), (1, 4, 2), (2, 4, 1)])
        dtype = rng.choice([torch.float32, torch.bfloat16])
        products = rng.choice(products_choices(dtype))
        causal = rng.random() < 0.6
        g = torch.Generator().manual_seed(rng.randrange(10**6))
        room = rng.randrange(1, 20) if rng.random() < 0.3 else 0
        q, k, v, pos_q, pos_k, pad = drawn_inputs(rng, g, B, H, Hkv, Tq, Tk, E, Dv, dtype, room)
        out = cpu_flash.cpu_flash_attention(q, k, v, scale=E ** -0.5, q_positions=pos_q, k_positions=pos_k,
                                            causal=causal, key_padding_mask=pad, block_q=bq, block_k=bk,
                                            bf16_products=products, tiled_rows=1)
        grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        finite(f"direct {dict(T=(Tq, Tk), E=E, Dv=Dv, tiles=(bq, bk), dtype=dtype, products=products)}", out, *grads)
        calls += 1
    return calls


def decode_form_calls(rng, count):
    """cpu_flash_attention's decode form (few query rows per kv head): key counts across and inside its 512-key
    blocks and the threads' splits, widths in and past its register forms (odd ones too), grouped kv heads, a KV
    cache's layout, padding, causal by position, both bias forms; forward and backward (the tiles')."""
    calls = 0
    for _ in range(count):
        B, H, Hkv = rng.choice([(1, 1, 1), (2, 4, 2), (1, 4, 1), (2, 2, 2)])
        Tq, Tk = rng.choice([1, 2, 3]), rng.choice([1, 17, 511, 513, 1100])
        E, Dv = rng.choice([(1, 1), (7, 5), (16, 16), (64, 64), (128, 64), (129, 17), (144, 136)])
        dtype = rng.choice([torch.float32, torch.bfloat16])
        g = torch.Generator().manual_seed(rng.randrange(10**6))
        q, k, v, pos_q, pos_k, pad = drawn_inputs(rng, g, B, H, Hkv, Tq, Tk, E, Dv, dtype, rng.choice([0, 7]))
        bias = rng.choice([None, "distance_table", "offset_embeddings"])
        if bias == "distance_table":
            lo, hi = distance_span(pos_q, pos_k)
            bias = KernelBias(bias, torch.randn(H, hi - lo + 1, generator=g).requires_grad_(), lo)
        elif bias == "offset_embeddings":
            bias = KernelBias(bias, torch.randn(2 * 5 + 1, E, generator=g).requires_grad_(), 5)
        out = cpu_flash.cpu_flash_attention(q, k, v, scale=E ** -0.5, q_positions=pos_q, k_positions=pos_k,
                                            causal=rng.random() < 0.7, key_padding_mask=pad, bias=bias,
                                            tiled_rows=10**9)
        leaves = (q, k, v) + (() if bias is None else (bias.values,))
        grads = torch.autograd.grad(out, leaves, torch.randn_like(out))
        finite(f"decode form {dict(T=(Tq, Tk), E=E, Dv=Dv, heads=(H, Hkv), dtype=dtype)}", out, *grads)
        calls += 1
    return calls


def encodings_through_attention(tiles):
    """Every bias form, CoPE and PoPE through poskit.attention (the kernel's tiles set to `tiles`)."""
    calls = 0
    cases = {"pope": dict(delta_init="uniform"), "alibi": {}, "t5": dict(num_buckets=8, max_distance=20),
             "relative-capped": dict(max_distance=5, init_std=0.5), "cope": dict(p_max=8, init_std=0.5),
             "cope-alibi": dict(p_max=8)}
    cpu_flash.BLOCK_Q, cpu_flash.BLOCK_K = tiles
    for name, options in cases.items():
        for dtype in (torch.float32, torch.bfloat16):
            for T, Hkv, padded in ((37, 4, False), (61, 2, True)):
                enc = poskit.build_encoding(name, head_dim=8, num_heads=4, **options).to(dtype)
                g = torch.Generator().manual_seed(T)
                q = torch.randn(2, 4, T, 8, generator=g).to(dtype).requires_grad_()
                k, v = (torch.randn(2, Hkv, T, 8, generator=g).to(dtype).requires_grad_() for _ in range(2))
                kw = dict(is_causal=True, enable_gqa=Hkv != 4)
                if padded:
                    keep = torch.ones(2, 1, 1, T, dtype=torch.bool)
                    keep[0, ..., :5] = False
                    kw["attn_mask"] = keep
                assert route(enc, q, k, v=v, **kw) == "cpu-flash", name
                out = poskit.attention(q, k, v, enc, **kw)
                params = [p for p in enc.parameters() if p.requires_grad]
                grads = torch.autograd.grad(out, [q, k, v, *params], torch.randn_like(out), allow_unused=True)
                finite(f"{name} {dtype} T={T}", out, *grads)
                calls += 1
    return calls


def magnitude_decodes(rng, count):
    """PoPE's decode against cached magnitudes (cpu_flash.magnitude_decode): fused loops and products of tiles,
    key counts across and inside the 512-key blocks, odd widths, padding, several new tokens by position."""
    calls = 0
    for _ in range(count):
        B, Hkv, R = rng.choice([(1, 1, 1), (2, 2, 3), (1, 1, 16), (2, 1, 20)])
        L, d, Dv = rng.choice([1, 17, 64, 65, 511, 513, 1100]), rng.choice([4, 20, 64]), rng.choice([3, 16, 64])
        dtype = rng.choice([torch.float32, torch.bfloat16])
        g = torch.Generator().manual_seed(rng.randrange(10**6))
        q_rows = torch.randn(B, Hkv, R, 2 * d, generator=g) / d
        mu = torch.rand(B, Hkv, L, d, generator=g).to(dtype)
        v = torch.randn(B, Hkv, L, Dv, generator=g).to(dtype)
        angles = torch.rand(1, L, 2 * d, generator=g) * 2 - 1
        pad = None
        if rng.random() < 0.3:
            pad = torch.ones(B, L, dtype=torch.bool)
            pad[0, : rng.randrange(L)] = False
        positions = {}
        if rng.random() < 0.3 and L > R:  # several new tokens (R of them), causal among the cached keys
            positions = dict(q_positions=torch.arange(L - R, L)[None], k_positions=torch.arange(L)[None])
        products = rng.choice(products_choices(dtype))
        out = cpu_flash.magnitude_decode(q_rows, mu, v, angles, pad, **positions, bf16_products=products,
                                         tiled_rows=rng.choice([1, 4, 100]))
        finite(f"magnitude decode {dict(B=B, Hkv=Hkv, R=R, L=L, d=d, Dv=Dv, dtype=dtype)}", out)
        calls += 1
    return calls


def long_sequence(dtype):
    """A causal call past cpu_flash.LONG_KEYS keys (the backward's taller query tile), PoPE-wide q/k."""
    T = cpu_flash.LONG_KEYS + 37
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, T, 33, generator=g).to(dtype).requires_grad_()
    k = torch.randn(1, 1, T, 33, generator=g).to(dtype).requires_grad_()
    v = torch.randn(1, 1, T, 9, generator=g).to(dtype).requires_grad_()
    pos = torch.arange(T)[None]
    out = cpu_flash.cpu_flash_attention(q, k, v, scale=0.2, q_positions=pos, k_positions=pos, causal=True)
    finite(f"long {dtype}", out, *torch.autograd.grad(out, (q, k, v), torch.randn_like(out)))
    return 1


def main():
    if not cpu_flash.available():
        sys.exit("the kernel did not load")
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    rng = random.Random(0)
    warnings.simplefilter("ignore", UntrainedEncodingWarning)  # (encodings built here, outside any module)
    direct = direct_calls(rng, count)
    print(f"direct calls: {direct}", flush=True)
    encoded = sum(encodings_through_attention(tiles) for tiles in ((8, 16), (16, 40), (7, 9)))
    print(f"through attention: {encoded}", flush=True)
    long = sum(long_sequence(dtype) for dtype in (torch.float32, torch.bfloat16))
    decodes = magnitude_decodes(rng, max(1, count // 4)) + decode_form_calls(rng, max(1, count // 4))
    print(f"calls: {direct + encoded + long + decodes}, bf16 products: {cpu_flash.bf16_products_available()}",
          flush=True)


if __name__ == "__main__":
    main()
