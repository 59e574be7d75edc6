"""The contract between encodings and the engine: a new encoding defined here, in the test file alone, runs
through every path (reference, sdpa, blocked, KV cache, the model) by declaring its capabilities on
`PositionalEncoding`, without touching the package. Every output is checked in float64 against a formula
written here, independently of the toy encodings' own code."""
import math
import pathlib
import re

import pytest
import torch
from torch import nn

import poskit
from poskit.attention import KVCache, cached_attention
from poskit.attention.engine import route
from poskit.encodings import base, rope_scaling
from poskit.encodings.base import PositionalEncoding
from poskit.models import ModelConfig, Transformer
from extras import need

PREFIX = "test-contract-toy"  # registry names unlikely to clash with real encodings


def _speeds(n: int) -> torch.Tensor:
    return 1.0 / (torch.arange(n, dtype=torch.float64) + 2.0)  # angular speed of channel (pair) i


def _slopes(num_heads: int) -> torch.Tensor:
    return (torch.arange(num_heads, dtype=torch.float64) + 1.0) / num_heads


# -- toy encodings (implementations) -------------------------------------------------------------------------
class ToyRotation(PositionalEncoding):
    """kind "qk", qk_width 1: channel pairs rotated by position * speed_i, both q and k times GAIN."""

    kind = "qk"
    cache_form = "encoded"
    GAIN = 0.5

    def encode_k(self, k, k_positions):
        angle = k_positions.double()[:, None, :, None] * _speeds(self.head_dim // 2)  # (1|B, 1, T, D/2)
        c, s = (self.GAIN * angle.cos()).to(k.dtype), (self.GAIN * angle.sin()).to(k.dtype)
        k0, k1 = k[..., 0::2], k[..., 1::2]
        return torch.stack((k0 * c - k1 * s, k1 * c + k0 * s), -1).flatten(-2)

    def encode_q(self, q, q_positions, scale=1.0):
        return scale * self.encode_k(q, q_positions)


class ToyWide(PositionalEncoding):
    """kind "qk", qk_width 2: x -> [x cos(t w), x sin(t w)] per channel (2 * head_dim wide)."""

    kind = "qk"
    qk_width = 2
    cache_form = "encoded"

    def encode_k(self, k, k_positions):
        angle = k_positions.double()[:, None, :, None] * _speeds(self.head_dim)  # (1|B, 1, T, D)
        return torch.cat((k * angle.cos().to(k.dtype), k * angle.sin().to(k.dtype)), -1)

    def encode_q(self, q, q_positions, scale=1.0):
        return scale * self.encode_k(q, q_positions)


class ToyWideRawCache(ToyWide):
    cache_form = "raw"  # the cache keeps raw keys; the engine re-encodes them at every step


class ToyStaticBias(PositionalEncoding):
    """kind "bias" without parameters, of positions alone (static: the CPU sdpa backend generates it block by
    block)."""

    kind = "bias"
    bias_reads_q = False  # declared: without it the engine must assume the bias reads q and never reuse it

    def bias(self, q, q_positions, k_positions, scale):
        dist = (q_positions[:, :, None] - k_positions[:, None, :]).abs().double().sqrt()  # (1|B, Tq, Tk)
        return (-_slopes(self.num_heads)[:, None, None] * dist[:, None]).to(q.dtype)


class ToyLearnedBias(PositionalEncoding):
    """kind "bias" with a trainable per-head slope (not static: generated per block on CPU, a float mask for SDPA
    elsewhere)."""

    kind = "bias"

    def __init__(self, *, head_dim, num_heads):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        self.slopes = nn.Parameter(_slopes(num_heads).float())

    def bias(self, q, q_positions, k_positions, scale):
        dist = (q_positions[:, :, None] - k_positions[:, None, :]).abs().to(q.dtype).sqrt()
        return -self.slopes.to(q.dtype)[:, None, None] * dist[:, None]


TOYS = {"rotation": ToyRotation, "wide": ToyWide, "wide-raw-cache": ToyWideRawCache,
        "static-bias": ToyStaticBias, "learned-bias": ToyLearnedBias}
# the path backend="sdpa" takes on CPU, by the toy's declarations (qk_width 2 or a static bias: blocked; a
# learned bias: blocked-bias, its bias and gradient generated per query block)
SDPA_ROUTE = {"rotation": "sdpa", "wide": "blocked", "wide-raw-cache": "blocked", "static-bias": "blocked",
              "learned-bias": "blocked-bias"}


@pytest.fixture(scope="module", autouse=True)
def registered_toys():
    for toy, cls in TOYS.items():
        base.register(f"{PREFIX}-{toy}")(cls)
    yield
    for toy in TOYS:
        base.unregister(f"{PREFIX}-{toy}")


def build_toy(toy, head_dim=8, num_heads=4):
    return poskit.build_encoding(f"{PREFIX}-{toy}", head_dim=head_dim, num_heads=num_heads).double()


# -- the formulas (float64, written from the definitions above, not from the code) ---------------------------
def formula_logits(toy, q, k, qp, kp, scale):
    """(B, H, Tq, Tk) logits before masking; k already has one head per query head."""
    H, D = q.shape[1], q.shape[-1]
    offset = (kp[:, None, :] - qp[:, :, None]).double()[:, None]  # (1|B, 1, Tq, Tk): s - t
    if toy == "rotation":
        # q^T R((s - t) w) k per pair, times GAIN^2: (q0 k0 + q1 k1) cos + (q1 k0 - q0 k1) sin
        phi = offset[..., None] * _speeds(D // 2)  # (1|B, 1, Tq, Tk, D/2)
        q0, q1, k0, k1 = q[..., 0::2, None], q[..., 1::2, None], k[..., 0::2, None], k[..., 1::2, None]
        same = (q0 * k0.transpose(-1, -3) + q1 * k1.transpose(-1, -3)).movedim(-2, -1)  # (B, H, Tq, Tk, D/2)
        cross = (q1 * k0.transpose(-1, -3) - q0 * k1.transpose(-1, -3)).movedim(-2, -1)
        return scale * ToyRotation.GAIN ** 2 * (same * phi.cos() + cross * phi.sin()).sum(-1)
    content = scale * q @ k.transpose(-1, -2)
    if toy in ("wide", "wide-raw-cache"):  # sum_c q_c k_c cos((t - s) w_c)
        phi = offset[..., None] * _speeds(D)  # (1|B, 1, Tq, Tk, D)
        return scale * (q[..., :, None, :] * k[..., None, :, :] * phi.cos()).sum(-1)
    slopes = _slopes(H)[:, None, None]  # -m_h sqrt(|t - s|)
    return content - slopes * offset.abs().sqrt()


def formula_attention(toy, q, k, v, qp, kp):
    """softmax over the keys at or before each query's position, then @ v; kv head h // g serves query head h."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    qp, kp = torch.as_tensor(qp).reshape(-1, q.shape[2]), torch.as_tensor(kp).reshape(-1, k.shape[2])
    logits = formula_logits(toy, q, k, qp, kp, 1 / math.sqrt(q.shape[-1]))
    visible = (kp[:, None, :] <= qp[:, :, None])[:, None]
    return torch.softmax(logits.masked_fill(~visible, float("-inf")), -1) @ v


def qkv(B=2, H=4, Hkv=2, T=9, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, T, D, generator=g, dtype=torch.float64) for h in (H, Hkv, Hkv)]


# -- every path -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("toy", list(TOYS))
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_toy_attention_equals_its_formula(toy, backend):
    enc = build_toy(toy)
    q, k, v = qkv()
    qp, kp = torch.tensor([2, 3, 5, 8, 9, 11, 12, 20, 21]), torch.tensor([0, 1, 2, 4, 5, 9, 10, 12, 21])
    want = formula_attention(toy, q, k, v, qp, kp)
    got = poskit.attention(q, k, v, enc, q_positions=qp, k_positions=kp, backend=backend, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    # default positions (arange) go through SDPA's own causal flag
    torch.testing.assert_close(poskit.attention(q, k, v, enc, backend=backend, is_causal=True, enable_gqa=True),
                               formula_attention(toy, q, k, v, torch.arange(9), torch.arange(9)), atol=1e-12, rtol=0)


@pytest.mark.parametrize("toy", list(TOYS))
def test_sdpa_backend_routes_by_the_declarations(toy):
    # qk_width 2 and a parameter-free bias send the CPU sdpa backend to the blocked path; the rest stays on SDPA
    enc = build_toy(toy)
    q, k, _ = qkv()
    assert route(enc, q, k, backend="sdpa", enable_gqa=True) == SDPA_ROUTE[toy]
    assert route(enc, q, k, backend="reference", enable_gqa=True) == "reference"


@pytest.mark.parametrize("toy", ["wide", "static-bias"])
def test_blocked_path_over_several_blocks_equals_the_formula(toy, monkeypatch):
    # small blocks, so that the blocked loop crosses query and key blocks (and skips fully masked ones)
    from poskit.attention import blocked

    monkeypatch.setattr(blocked, "DEFAULT_BLOCK", 4)
    enc = build_toy(toy)
    q, k, v = qkv(T=19)
    pos = torch.arange(19) * 2
    assert route(enc, q, k, backend="sdpa", enable_gqa=True) == "blocked"
    got = poskit.attention(q, k, v, enc, q_positions=pos, k_positions=pos, backend="sdpa", is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, formula_attention(toy, q, k, v, pos, pos), atol=1e-12, rtol=0)


@pytest.mark.parametrize("toy", list(TOYS))
@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_toy_decoding_token_by_token_equals_the_formula(toy, backend):
    enc = build_toy(toy)
    q, k, v = qkv(T=8)
    pos = torch.tensor([0, 1, 3, 4, 6, 7, 9, 10])
    cache = KVCache(num_layers=1)
    outs = [cached_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], enc, cache, 0, pos[:3], backend=backend)]
    for t in range(3, 8):
        outs.append(cached_attention(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], enc, cache, 0,
                                     pos[t:t + 1], backend=backend))
    torch.testing.assert_close(torch.cat(outs, 2), formula_attention(toy, q, k, v, pos, pos), atol=1e-12, rtol=0)
    layer = cache.layer(0)
    # the cache stores what the encoding declares: its encoded keys (sdpa backend) or the raw keys
    encoded = enc.cache_form == "encoded" and backend == "sdpa"
    assert layer.encoded == encoded and layer.length == 8
    torch.testing.assert_close(layer.keys, enc.encode_k(k, pos[None]) if encoded else k, atol=0, rtol=0)


@pytest.mark.parametrize("toy", list(TOYS))
def test_toy_in_the_model_equals_the_formula_and_decodes_with_the_cache(toy):
    cfg = ModelConfig(vocab_size=13, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, encoding=f"{PREFIX}-{toy}")
    model = Transformer(cfg).double().eval()
    assert all(type(e) is TOYS[toy] for e in model.encoding_modules())
    tokens = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(tokens)
        # the same forward with the attention written from the formula
        pos = torch.arange(7)
        x = model.embed(tokens)
        for block in model.blocks:
            a = block.attn
            h = block.norm1(x)
            heads = lambda t, n: t.view(2, 7, n, a.hd).transpose(1, 2)
            out = formula_attention(toy, heads(a.q_proj(h), a.n_heads), heads(a.k_proj(h), a.n_kv),
                                    heads(a.v_proj(h), a.n_kv), pos, pos)
            x = x + a.o_proj(out.transpose(1, 2).reshape(2, 7, -1))
            x = x + block.mlp(block.norm2(x))
        torch.testing.assert_close(got, model.head(model.norm(x)), atol=1e-10, rtol=0)
        cache = KVCache(cfg.n_layers)
        steps = [model(tokens[:, :3], cache=cache)] + [model(tokens[:, t:t + 1], cache=cache) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), got, atol=1e-10, rtol=0)


# -- the declarations themselves ------------------------------------------------------------------------------
def test_defaults_declare_the_plain_paths():
    enc = build_toy("static-bias")
    assert (enc.qk_width, enc.cache_form, enc.fused_kernel, enc.needs_gate_keys) == (1, "raw", None, False)
    with pytest.raises(NotImplementedError, match="encode_q"):
        enc.encode_q(torch.zeros(1, 4, 1, 8), torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="backend='triton' serves only pope, cope and cope-alibi"):
        poskit.attention(*qkv(), enc, backend="triton", is_causal=True, enable_gqa=True)


def test_builtin_encodings_declare_what_the_engine_reads():
    from conftest import build

    assert (build("pope").qk_width, build("pope").cache_form, build("pope").fused_kernel) == (2, "magnitude", "triton_pope")
    assert build("rope").cache_form == "encoded" and build("rope-dynamic").cache_form == "raw"
    assert build("cope").fused_kernel == build("cope-alibi").fused_kernel == "triton_cope"
    assert build("cope", gates="separate").needs_gate_keys and not build("cope").needs_gate_keys
    pos_emb, slopes = build("cope").fused_operands()
    assert slopes is None and pos_emb.shape == (16, 6)
    pos_emb, slopes = build("cope-alibi").fused_operands()
    assert pos_emb is None and slopes.shape == (4,)


@pytest.mark.parametrize("attrs, match", [
    (dict(kind="qk", qk_width=0), "qk_width must be an int >= 1"),
    (dict(kind="bias", cache_form="encoded"), "cache_form must be one of"),
    (dict(kind="qk", cache_form="compressed"), "cache_form must be one of"),
    (dict(kind="sideways"), "kind must be one of"),
])
def test_register_refuses_a_wrong_declaration(attrs, match):
    cls = type("Bad", (PositionalEncoding,), attrs)
    with pytest.raises(ValueError, match=match):
        base.register(f"{PREFIX}-bad")(cls)
    assert f"{PREFIX}-bad" not in poskit.available_encodings()
    with pytest.raises(ValueError, match="name must be one of"):
        base.unregister(f"{PREFIX}-bad")


def test_engine_sdpa_and_model_never_branch_on_encoding_names():
    src = pathlib.Path(poskit.__file__).parent
    for rel in ("attention/engine.py", "attention/sdpa.py", "attention/runners.py", "models/attention.py",
                "models/decoder.py", "models/block.py"):
        text = (src / rel).read_text()
        # a name may appear as a default or in an example, never in a comparison
        assert not re.findall(r"(==|!=|\bin\b)\s*[(\[{]?\s*[\"'](pope|cope|rope|alibi|relative)[\"']", text), rel
        assert not re.findall(r"\.name\s*(==|!=|\bin\b)", text), rel
        assert not re.findall(r"getattr\((self\.)?enc", text), rel


# the options only one variant reads (rope_scaling.VARIANT_OPTIONS), at head_dim 16 (8 frequencies)
VARIANT_OPTIONS = {
    "llama3": dict(low_freq_factor=1.0, high_freq_factor=4.0),
    "longrope": dict(short_factor=[1.0 + i / 8 for i in range(8)], long_factor=[1.0 + i for i in range(8)]),
}


def test_every_rope_scaling_function_is_a_registered_encoding():
    # one function and one table entry make a variant: registered as "rope-<name>", frequencies from the table
    for scaling, variant in rope_scaling.ROPE_INIT_FUNCTIONS.items():
        name = "rope" if scaling == "none" else f"rope-{scaling}"
        opts = {} if scaling == "none" else dict(factor=4.0, original_max_positions=64, **VARIANT_OPTIONS.get(scaling, {}))
        enc = poskit.build_encoding(name, head_dim=16, num_heads=2, **opts)
        params = rope_scaling.RopeParameters(16, 10000.0, **opts)  # the options are RopeParameters' field names
        inv_freq, gain = variant.init(params, None)
        assert torch.equal(enc.inv_freq, inv_freq) and enc.attention_factor == gain
        assert enc.cache_form == ("raw" if variant.length_dependent else "encoded")
        if variant.length_dependent:  # re-evaluated at the call's length
            assert torch.equal(enc.inv_freq_for(200), variant.init(params, 200)[0])


@pytest.mark.parametrize("name, options", [
    ("pope", dict(delta_init="uniform")), ("cope", dict(p_max=6, init_std=0.5)),
    ("cope", dict(p_max=6, init_std=0.5, gates="separate")), ("cope-alibi", dict(p_max=6))])
def test_backend_triton_dispatches_on_the_declared_fused_kernel(name, options):
    # the engine's kernel table, keyed by `fused_kernel`, reaches the right kernel with the right operands
    need("triton", "triton", "triton (the fused kernels)")
    from conftest import HAS_CUDA

    device = "cuda" if HAS_CUDA else "cpu"  # CPU tensors run in the Triton interpreter (tests/conftest.py)
    if device == "cpu":
        from triton import knobs

        if not knobs.runtime.interpret:
            pytest.skip("no GPU and the Triton interpreter is off")
    enc = poskit.build_encoding(name, head_dim=16, num_heads=4, **options).to(device)
    q, k, v = (t.float().to(device) for t in qkv(T=6, D=16))
    gk = k.flip(-1) if enc.needs_gate_keys else None
    with torch.no_grad():
        got = poskit.attention(q, k, v, enc, gate_keys=gk, backend="triton", is_causal=True, enable_gqa=True)
        want = poskit.attention(q.double(), k.double(), v.double(), enc.double(), backend="reference",
                                gate_keys=None if gk is None else gk.double(), is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
