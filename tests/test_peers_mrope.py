"""M-RoPE against Hugging Face transformers' Qwen2-VL, Qwen2.5-VL and Qwen3-VL (extra `poskit[peers]`), float64 on
tiny random configs; skipped without transformers.

Matched: get_rope_index (coordinates of text, image and video tokens, left padding, rope_deltas) against
`mrope_positions`; the rotary embedding's sections (recomposition_frequencies) and apply_rotary_pos_emb against
`enc(q, k, coordinates)`; a whole Qwen2-VL attention layer against poskit's layer fed coordinates (text positions
plus offsets); the decode position of the next token (cache position + rope_deltas) against the text position
poskit's cache continues from. Differences, asserted below:
- HF's rotary embedding keeps float32 frequencies and forms its angles in float32 (`position_ids.float() *
  inv_freq`): its cos/sin equal poskit's to float32 rounding; the float64 comparisons form the angles in float64 from
  poskit's frequencies and keep HF's section logic and rotation.
"""
import pytest
import torch

import poskit
from extras import need
from poskit.encodings.mrope import coordinates_from_hf, coordinates_to_hf, mrope_positions

need("transformers", "peers")
from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig  # noqa: E402
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen25  # noqa: E402
from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2  # noqa: E402
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3  # noqa: E402

D, H, HKV, WIDTH = 16, 2, 1, 32
SECTION = [2, 3, 3]  # of the D // 2 = 8 frequencies: time, height, width
VISION = dict(depth=1, embed_dim=16, num_heads=2, hidden_size=WIDTH, spatial_merge_size=2, mlp_ratio=2)


def text_config(**rope):
    return dict(hidden_size=WIDTH, num_hidden_layers=1, num_attention_heads=H, num_key_value_heads=HKV,
                intermediate_size=64, vocab_size=64, rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                                                      "mrope_section": SECTION, **rope})


@pytest.fixture(scope="module")
def qwen2_model():
    torch.manual_seed(0)
    config = Qwen2VLConfig(text_config=text_config(), vision_config=VISION)
    return qwen2.Qwen2VLModel(config).eval()


@pytest.fixture(scope="module")
def qwen25_model():
    torch.manual_seed(0)
    config = Qwen2_5_VLConfig(text_config=text_config(), vision_config=dict(VISION, tokens_per_second=2))
    return qwen25.Qwen2_5_VLModel(config).eval()


def sequences():
    """(token types (B, T), attention mask, image grids, video grids): row 0 text / image / text / video / text,
    row 1 left-padded, text / image / text / video with a temporal grid of 3 (spatial merge 2)."""
    types = torch.tensor([[0, 0, 1, 1, 1, 0, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0],
                          [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 2, 2, 2, 2, 2, 2, 0]])
    mask = torch.ones_like(types)
    mask[1, :2] = 0
    images = torch.tensor([[1, 2, 6], [1, 4, 6]])  # (t, h, w) patches: 3 and 6 tokens after the 2 x 2 merge
    videos = torch.tensor([[2, 4, 4], [3, 2, 4]])  # 8 and 6 tokens
    return types, mask, images, videos


def test_coordinates_equal_qwen2_vl_get_rope_index(qwen2_model):
    types, mask, images, videos = sequences()
    theirs, their_deltas = qwen2_model.get_rope_index(torch.zeros_like(types), mm_token_type_ids=types,
                                                      image_grid_thw=images, video_grid_thw=videos,
                                                      attention_mask=mask)
    ours, deltas = mrope_positions(types, image_grids=images, video_grids=videos, attention_mask=mask,
                                   spatial_merge_size=2)
    assert torch.equal(coordinates_to_hf(ours), theirs) and torch.equal(coordinates_from_hf(theirs), ours)
    assert torch.equal(deltas, their_deltas)


def test_coordinates_equal_qwen2_5_vl_get_rope_index_with_video_time_steps(qwen25_model):
    types, mask, images, videos = sequences()
    seconds = torch.tensor([0.5, 1.5])  # second_per_grid_ts: time steps of int(f * 2 * seconds) per frame
    theirs, their_deltas = qwen25_model.get_rope_index(torch.zeros_like(types), mm_token_type_ids=types,
                                                       image_grid_thw=images, video_grid_thw=videos,
                                                       second_per_grid_ts=seconds, attention_mask=mask)
    ours, deltas = mrope_positions(types, image_grids=images, video_grids=videos, attention_mask=mask,
                                   spatial_merge_size=2, video_time_intervals=2 * seconds)
    assert torch.equal(coordinates_to_hf(ours), theirs) and torch.equal(deltas, their_deltas)


def rotary(kind):
    """(HF's text rotary embedding, the poskit encoding with the same sections and base)."""
    if kind == "qwen3":
        config = Qwen3VLConfig(text_config=dict(text_config(mrope_interleaved=True), head_dim=D)).text_config
        peer, interleaved = qwen3.Qwen3VLTextRotaryEmbedding(config), True
    else:
        module = qwen2 if kind == "qwen2" else qwen25
        config = (Qwen2VLConfig if kind == "qwen2" else Qwen2_5_VLConfig)(text_config=text_config()).text_config
        peer = (module.Qwen2VLRotaryEmbedding if kind == "qwen2" else module.Qwen2_5_VLRotaryEmbedding)(config)
        interleaved = False
    enc = poskit.build_encoding("mrope", head_dim=D, num_heads=H, base=1000.0, mrope_section=SECTION,
                                mrope_interleaved=interleaved).double()
    return peer, enc


def coordinates(B=2, T=18, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 40, (B, T, 3), generator=g)


@pytest.mark.parametrize("kind", ["qwen2", "qwen2.5", "qwen3"])
def test_rotation_equals_hf_multimodal_rotary_in_float64(kind):
    peer, enc = rotary(kind)
    pos = coordinates()
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, H, 18, D, generator=g, dtype=torch.float64) for _ in range(2))
    # HF's section logic and rotation on angles formed in float64 from poskit's frequencies (HF's are float32)
    freqs = coordinates_to_hf(pos)[..., None].double() * enc.inv_freq
    cos, sin = peer.recomposition_frequencies(freqs.cos()), peer.recomposition_frequencies(freqs.sin())
    want_q, want_k = qwen2.apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = enc(q, k, pos)
    torch.testing.assert_close(got_q, want_q, atol=1e-12, rtol=0)
    torch.testing.assert_close(got_k, want_k, atol=1e-12, rtol=0)
    torch.testing.assert_close(enc.inv_freq, peer.inv_freq.double(), rtol=1e-6, atol=0)  # HF's are float32
    # HF's own forward (float32 angles) agrees to float32 rounding
    hf_cos, hf_sin = peer(q.float(), coordinates_to_hf(pos))
    ours_cos, ours_sin = enc.cos_sin(pos, torch.float64)
    half = D // 2
    torch.testing.assert_close(hf_cos[..., :half].double(), ours_cos, atol=2e-5, rtol=0)
    torch.testing.assert_close(hf_sin[..., half:].double(), ours_sin, atol=2e-5, rtol=0)


def test_text_positions_make_mrope_equal_to_hf_text_rotary():
    # text alone: HF broadcasts (B, T) position_ids to the three axes; poskit's scalar positions are the same
    peer, enc = rotary("qwen2")
    pos = torch.arange(30, 48)[None].expand(2, -1)
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(2, H, 18, D, generator=g, dtype=torch.float64) for _ in range(2))
    freqs = coordinates_to_hf(coordinates_from_hf(pos))[..., None].double() * enc.inv_freq
    cos, sin = peer.recomposition_frequencies(freqs.cos()), peer.recomposition_frequencies(freqs.sin())
    want = qwen2.apply_rotary_pos_emb(q, k, cos, sin)
    for got, theirs in zip(enc(q, k, pos), want):
        torch.testing.assert_close(got, theirs, atol=1e-12, rtol=0)


def test_attention_layer_with_coordinates_equals_qwen2_vl_attention(qwen2_model):
    from poskit.encodings.mrope import text_positions
    from poskit.models.block import SelfAttention

    types, mask, images, videos = sequences()
    pos, _ = mrope_positions(types, image_grids=images, video_grids=videos, attention_mask=mask, spatial_merge_size=2)
    B, T = types.shape
    config = qwen2_model.config.text_config
    config._attn_implementation = "sdpa"  # (eager takes its softmax in float32)
    torch.manual_seed(3)
    theirs = qwen2.Qwen2VLAttention(config, layer_idx=0).double().eval()
    peer_rotary = qwen2.Qwen2VLRotaryEmbedding(config)
    ours = SelfAttention(WIDTH, H, HKV, poskit.build_encoding("mrope", head_dim=D, num_heads=H, base=1000.0,
                                                              mrope_section=SECTION),
                         bias=True, causal=True).double().eval()
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(ours, name).weight.copy_(getattr(theirs, name).weight)
            bias = getattr(theirs, name).bias
            getattr(ours, name).bias.copy_(bias if bias is not None else torch.zeros_like(getattr(ours, name).bias))
    x = torch.randn(B, T, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    real = mask.bool()
    freqs = coordinates_to_hf(pos)[..., None].double() * ours.encoding.inv_freq
    cos, sin = peer_rotary.recomposition_frequencies(freqs.cos()), peer_rotary.recomposition_frequencies(freqs.sin())
    visible = torch.ones(T, T, dtype=torch.bool).tril()[None] & real[:, None, :]  # causal by index, pads hidden
    additive = torch.zeros(B, 1, T, T, dtype=torch.float64).masked_fill(~visible[:, None], float("-inf"))
    with torch.no_grad():
        want = theirs(x, attention_mask=additive, position_embeddings=(cos, sin))[0]
        order = real.long().cumsum(-1) - 1  # poskit's positions of a padded row: its real tokens count
        p = text_positions(pos, order, real)
        got = ours(x, p, real=real, offsets=pos - p.unsqueeze(-1))
    torch.testing.assert_close(got[real], want[real], atol=1e-12, rtol=0)  # (a pad query's row is not compared)


def test_decode_continues_at_hf_cache_position_plus_rope_deltas(qwen2_model):
    from poskit.attention import KVCache
    from poskit.models import ModelConfig, Transformer

    types, _, images, videos = sequences()
    types, images, videos = types[:1], images[:1], videos[:1]
    pos, deltas = mrope_positions(types, image_grids=images, video_grids=videos, spatial_merge_size=2)
    torch.manual_seed(5)
    model = Transformer(ModelConfig(vocab_size=64, d_model=WIDTH, n_layers=2, n_heads=H, n_kv_heads=HKV,
                                    encoding="mrope", encoding_options={"mrope_section": SECTION})).double().eval()
    T = types.shape[1]
    cache = KVCache(2)
    tokens = torch.randint(0, 64, (1, T + 3))
    model(tokens[:, :T], positions=pos, cache=cache)

    class Seen:  # what compute_3d_position_ids reads of a cache
        def get_seq_length(self):
            return T

    qwen2_model.rope_deltas = deltas
    hf_next = qwen2_model.compute_3d_position_ids(input_ids=tokens[:, T:T + 1], inputs_embeds=torch.zeros(1, 1, WIDTH),
                                                  past_key_values=Seen())
    assert torch.equal(coordinates_from_hf(hf_next)[..., 0], cache.next_positions()[:, None])
    # and decoding from there equals the full forward at HF's positions for the new text tokens
    steps = [model(tokens[:, t:t + 1], cache=cache) for t in range(T, T + 3)]
    text = (torch.arange(T, T + 3) + deltas).unsqueeze(-1).expand(1, 3, 3)
    full = model(tokens, positions=torch.cat([pos, text], 1))
    torch.testing.assert_close(torch.cat(steps, 1), full[:, T:], atol=1e-12, rtol=0)
