"""M-RoPE (encodings/mrope.py): the float64 formula written pair by pair, relative invariance along each axis, text
positions as RoPE, the sections, `mrope_positions`' rule, and a decoder fed coordinates: its text positions and
offsets, decoding after a multimodal prompt, padding, and the refusals. Hugging Face's Qwen2-VL is the peer
(tests/test_peers_mrope.py)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.attention import KVCache
from poskit.encodings.mrope import (
    coordinates_from_hf,
    coordinates_to_hf,
    default_sections,
    frequency_axes,
    mrope_positions,
    text_positions,
)
from poskit.models import ModelConfig, Transformer

D, H = 16, 2


def build(**options):
    return poskit.build_encoding("mrope", head_dim=D, num_heads=H, **options).double()


def formula_logits(q, k, qc, kc, base, sections, interleaved=False):
    """scale * sum_i (R(c_t[a_i] theta_i) q_i) . (R(c_s[a_i] theta_i) k_i) with half-layout pairs (i, i + d/2),
    theta_i = base^(-2i/d), a_i the section of frequency i, in float64 loops."""
    B, _, Tq, _ = q.shape
    half = D // 2
    if interleaved:
        axes = [1 if i % 3 == 1 and i < 3 * sections[1] else 2 if i % 3 == 2 and i < 3 * sections[2] else 0
                for i in range(half)]
    else:
        axes = [a for a, n in enumerate(sections) for _ in range(n)]
    out = torch.zeros(B, H, Tq, k.shape[2], dtype=torch.float64)
    for b in range(B):
        for t in range(Tq):
            for s in range(k.shape[2]):
                for i in range(half):
                    theta = base ** (-2 * i / D)
                    ang = (int(kc[b, s, axes[i]]) - int(qc[b, t, axes[i]])) * theta
                    qa, qb, ka, kb = q[b, :, t, i], q[b, :, t, i + half], k[b, :, s, i], k[b, :, s, i + half]
                    out[b, :, t, s] += qa * (math.cos(ang) * ka - math.sin(ang) * kb) + qb * (
                        math.sin(ang) * ka + math.cos(ang) * kb)
    return out * D ** -0.5


def qkv(B=2, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(3)]


def random_coordinates(B, T, seed, high=50):
    return torch.randint(0, high, (B, T, 3), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("interleaved", [False, True])
def test_coordinates_give_the_formula(interleaved):
    enc = build(base=100.0, mrope_section=[2, 3, 3], mrope_interleaved=interleaved)
    q, k, _ = qkv()
    c = random_coordinates(2, 7, 1)
    qe, ke = enc(q, k, c)
    got = (qe @ ke.transpose(-1, -2)) * D ** -0.5
    want = formula_logits(q, k, c, c, 100.0, [2, 3, 3], interleaved)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@settings(max_examples=15, deadline=None)
@given(shift=st.lists(st.integers(-10**5, 10**5), min_size=3, max_size=3), seed=st.integers(0, 2**16))
def test_logits_depend_only_on_the_offsets_along_each_axis(shift, seed):
    enc = build(mrope_section=[4, 2, 2])
    q, k, _ = qkv(seed=seed)
    c = random_coordinates(2, 7, seed)
    a = enc(q, k, c)
    b = enc(q, k, c + torch.tensor(shift))
    torch.testing.assert_close(a[0] @ a[1].transpose(-1, -2), b[0] @ b[1].transpose(-1, -2), atol=1e-9, rtol=0)


def test_text_positions_are_rope_with_the_same_base_and_layout():
    q, k, v = qkv(T=9)
    mrope, rope = build(base=500.0), poskit.build_encoding("rope", head_dim=D, num_heads=H, base=500.0,
                                                           layout="half").double()
    pos = torch.arange(100, 109)
    for causal in (True, False):
        got = poskit.attention(q, k, v, mrope, q_positions=pos, k_positions=pos, is_causal=causal)
        want = poskit.attention(q, k, v, rope, q_positions=pos, k_positions=pos, is_causal=causal)
        torch.testing.assert_close(got, want, atol=1e-13, rtol=0)
    # and coordinates (p, p, p) are the text position p
    three = pos[None, :, None].expand(2, 9, 3)
    for got, want in zip(mrope(q, k, three), mrope(q, k, pos)):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_offsets_from_text_positions_compose_to_the_coordinates():
    # what a model does: rotate q and k by (coordinates - text position), attend at the text positions
    enc = build()
    q, k, v = qkv(T=9, seed=3)
    c = random_coordinates(2, 9, 4)
    p = text_positions(c, torch.arange(9)[None])
    off = c - p.unsqueeze(-1)
    qe, ke = enc(q, k, c)
    want = torch.nn.functional.scaled_dot_product_attention(qe, ke, v, is_causal=True)
    got = poskit.attention(enc.encode(q, off), enc.encode(k, off), v, enc, is_causal=True, q_positions=p, k_positions=p)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_sections_default_to_qwen2_vls_proportions_and_map_each_frequency():
    assert default_sections(64) == [16, 24, 24] and default_sections(8) == [2, 3, 3]
    assert frequency_axes([2, 3, 3], 8, False).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    assert frequency_axes([24, 20, 20], 64, True)[:9].tolist() == [0, 1, 2] * 3  # Qwen3-VL's interleaving
    assert frequency_axes([24, 20, 20], 64, True)[60:].tolist() == [0, 0, 0, 0]
    for bad in ([2, 3], [2, 3, 2], [2, -1, 7], [2.0, 3, 3]):
        with pytest.raises(ValueError, match="mrope_section must be 3 ints"):
            build(mrope_section=bad)


def test_positions_rule_for_text_images_and_videos():
    # text 2, an image of 2 x 3 merged patches, text 1, a video of 2 frames of 1 x 2, text 1
    types = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 0, 2, 2, 2, 2, 0]])
    c, deltas = mrope_positions(types, image_grids=[[1, 2, 3]], video_grids=[[2, 1, 2]], video_time_intervals=[3])
    want = [[0, 0, 0], [1, 1, 1],
            [2, 2, 2], [2, 2, 3], [2, 2, 4], [2, 3, 2], [2, 3, 3], [2, 3, 4],  # starts at 2: (2, 2 + row, 2 + col)
            [5, 5, 5],  # text continues at start + max(h, w) = 2 + 3
            [6, 6, 6], [6, 6, 7], [9, 6, 6], [9, 6, 7],  # frame f at 6 + 3 f
            [8, 8, 8]]  # after the video: 6 + max(1, 2)
    assert c[0].tolist() == want
    assert deltas.tolist() == [[9 + 1 - 14]]
    assert torch.equal(coordinates_from_hf(coordinates_to_hf(c)), c)
    assert coordinates_from_hf(torch.arange(4)[None]).tolist() == [[[i] * 3 for i in range(4)]]


def test_positions_rule_refuses_mismatched_grids_naming_them():
    types = torch.tensor([[0, 1, 1, 1, 0]])
    with pytest.raises(ValueError, match=r"image_grids\[0\] = \[1, 2, 2\] has 4 tokens .* has 3"):
        mrope_positions(types, image_grids=[[1, 2, 2]])
    with pytest.raises(ValueError, match="fewer than the runs of image tokens"):
        mrope_positions(types)
    with pytest.raises(ValueError, match="video_grids has 1 grid"):
        mrope_positions(types, image_grids=[[1, 1, 3]], video_grids=[[1, 1, 1]])
    with pytest.raises(ValueError, match="token_types must hold 0"):
        mrope_positions(torch.tensor([[0, 3]]))
    with pytest.raises(ValueError, match="position_ids must be an integer tensor of shape"):
        coordinates_from_hf(torch.zeros(2, 1, 4, dtype=torch.long))


def model(n_layers=2, schedule=None, seed=0):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=40, d_model=32, n_layers=n_layers, n_heads=H, n_kv_heads=1,
                                   encoding="mrope", layer_encodings=schedule)).double().eval()


def multimodal_prompt():
    types = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 0, 0],
                          [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]])
    mask = torch.ones_like(types, dtype=torch.bool)
    mask[1, :2] = False  # left padding
    c, deltas = mrope_positions(types, image_grids=[[1, 2, 3], [1, 2, 2]], attention_mask=mask)
    return c, deltas, mask


@pytest.mark.parametrize("schedule", [None, ["*", "none"]])
def test_decoding_after_a_multimodal_prompt_equals_the_full_forward(schedule):
    m = model(schedule=schedule)
    c, deltas, mask = multimodal_prompt()
    B, T = mask.shape
    tokens = torch.randint(0, 40, (B, T + 4), generator=torch.Generator().manual_seed(1))
    n_real = mask.sum(-1, keepdim=True)
    text = (n_real + torch.arange(4) + deltas).unsqueeze(-1).expand(B, 4, 3)  # HF: cache position + rope_deltas
    full_mask = torch.cat([mask, torch.ones(B, 4, dtype=torch.bool)], 1)
    full = m(tokens, positions=torch.cat([c, text], 1), attention_mask=full_mask)
    cache = KVCache(2)
    steps = [m(tokens[:, :T], positions=c, cache=cache, attention_mask=mask)]
    steps += [m(tokens[:, t:t + 1], cache=cache) for t in range(T, T + 4)]  # default positions: the text rule
    got = torch.cat(steps, 1)
    torch.testing.assert_close(got[full_mask], full[full_mask], atol=1e-12, rtol=0)


def test_a_padded_row_computes_what_it_computes_alone():
    m = model()
    c, _, mask = multimodal_prompt()
    tokens = torch.randint(0, 40, mask.shape, generator=torch.Generator().manual_seed(2))
    both = m(tokens, positions=c, attention_mask=mask)
    alone = m(tokens[1:, 2:], positions=mrope_positions(torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0]]),
                                                        image_grids=[[1, 2, 2]])[0])
    torch.testing.assert_close(both[1, 2:], alone[0], atol=1e-12, rtol=0)


def test_model_with_coordinates_equals_the_layer_formula():
    # one layer, checked against encode-by-coordinates and a causal-by-index SDPA on the layer's own projections
    m = model(n_layers=1)
    c = random_coordinates(1, 6, 5, high=9)
    x = torch.randn(1, 6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    attn = m.blocks[0].attn
    heads = lambda y, n: y.view(1, 6, n, D).transpose(1, 2)  # noqa: E731
    q, k = attn.encoding(heads(attn.q_proj(x), H), heads(attn.k_proj(x), 1), c)
    out = torch.nn.functional.scaled_dot_product_attention(q, k.repeat(1, H, 1, 1),
                                                           heads(attn.v_proj(x), 1).repeat(1, H, 1, 1), is_causal=True)
    want = attn.o_proj(out.transpose(1, 2).reshape(1, 6, H * D))
    p = text_positions(c, torch.arange(6)[None])
    torch.testing.assert_close(attn(x, p, offsets=c - p.unsqueeze(-1)), want, atol=1e-12, rtol=0)


def test_coordinates_are_refused_where_a_layer_cannot_take_them():
    c = random_coordinates(1, 5, 0)
    tokens = torch.zeros(1, 5, dtype=torch.long)
    rope = Transformer(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=H))
    with pytest.raises(ValueError, match=r"positions of shape \(1, 5, 3\) are coordinates.*\['rope'\]"):
        rope(tokens, positions=c)
    mixed = Transformer(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=H, encoding="mrope",
                                    layer_encodings=["*", "rope"]))
    with pytest.raises(ValueError, match=r"\['mrope', 'rope'\]"):
        mixed(tokens, positions=c)
    with pytest.raises(ValueError, match=r"positions must have shape \(5, 3\) or \(1, 5, 3\)"):
        model()(tokens, positions=torch.zeros(1, 5, 2, dtype=torch.long))
    linear = Transformer(ModelConfig(vocab_size=40, d_model=32, n_layers=1, n_heads=H, encoding="mrope",
                                     attention="linear"))
    with pytest.raises(ValueError, match="not supported with attention='linear'"):
        linear(tokens, positions=c)


# -- the HF bridge: Qwen2-VL's (3, B, T) position_ids ------------------------------------------------------------
V = 29


def test_hf_model_takes_qwen2_vl_position_ids_and_decodes_after_them():
    from extras import need

    need("transformers", "hf", "transformers (poskit.hf needs it)")
    from poskit.hf import PoskitCache, PoskitConfig, PoskitForCausalLM

    torch.manual_seed(5)
    hf = PoskitForCausalLM(PoskitConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=V,
                                        position_encoding="mrope")).double().eval()
    types = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 0, 0]])
    coords, deltas = mrope_positions(types, image_grids=[[1, 2, 3]])
    ids = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(2))
    want = hf.model(ids[:, :10], positions=coords)
    got = hf(ids[:, :10], position_ids=coordinates_to_hf(coords)).logits
    assert torch.equal(got, want)
    assert not torch.allclose(got, hf(ids[:, :10]).logits)  # the coordinates change the logits

    # a prompt with coordinates, then text decoded without positions: the full forward of the same sequence
    cache = PoskitCache(2)
    first = hf(ids[:, :10], position_ids=coordinates_to_hf(coords), past_key_values=cache, use_cache=True)
    step = hf(ids[:, 10:], past_key_values=first.past_key_values, use_cache=True).logits
    text = torch.arange(10, 12) + deltas  # HF's cache position + rope_deltas
    full = hf.model(ids, positions=torch.cat([coords, text[..., None].expand(1, 2, 3)], 1))
    torch.testing.assert_close(step, full[:, 10:], atol=1e-12, rtol=0)


def test_hf_model_refuses_coordinate_position_ids_it_cannot_take():
    from extras import need

    need("transformers", "hf", "transformers (poskit.hf needs it)")
    from poskit.hf import PoskitConfig, PoskitForCausalLM

    small = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=V)
    rope, mrope = (PoskitForCausalLM(PoskitConfig(**small, position_encoding=e)) for e in ("rope", "mrope"))
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"when the encoding of every attention layer takes them \(mrope\)"):
        rope(ids, position_ids=torch.zeros(3, 2, 5, dtype=torch.long))
    for bad, message in [(torch.zeros(4, 2, 5, dtype=torch.long), r"shape \(3, B, T\)"),
                         (torch.zeros(3, 2, 4, dtype=torch.long), r"position_ids must have shape \(3, 2, 5\)"),
                         (torch.full((3, 2, 5), -1), "position_ids must be >= 0")]:
        with pytest.raises(ValueError, match=message):
            mrope(ids, position_ids=bad)
