"""M-RoPE (Qwen2-VL's multimodal rotary position embedding): RoPE whose frequencies are split into sections read
by the three coordinates (time, height, width) of a token's position, so that text and image patches share one
sequence.

Positions. A token has coordinates (t, h, w): a text token (p, p, p), an image patch (s, s + row, s + column)
from the position s where its image starts (videos step t by frame), `mrope_positions` below (Hugging Face's
get_rope_index). poskit writes them with a trailing coordinate axis, (1, T, 3) or (B, T, 3), as its axial
encodings do; Hugging Face's (3, B, T) `position_ids` convert with `coordinates_from_hf`.

With equal coordinates M-RoPE is RoPE: every frequency reads the same number. So inside attention (the engine,
the KV cache, the fused paths) the encoding takes scalar positions, the *text positions*, and is 1-D RoPE there;
what the vision coordinates add is, per token, a rotation by its offsets (t - p, h - p, w - p) from its text
position p, applied to q and k before attention (`encode` of the offsets: rotations of one channel pair
compose, R(p) R(c - p) = R(c)). A model picks the text positions so that attention stays causal by sequence
order and decoding continues where Hugging Face's does (`text_positions`: the sequence order plus
rope_deltas), so a decode step after a multimodal prompt is a text token whose offsets are zero.

Angles are formed in float64 from integer coordinates and only cos/sin are cast, as for RoPE.
"""
from __future__ import annotations

import torch

from ..util.validate import check_bool, check_int
from .angles import AngleTables
from .axial import axial_cos_sin
from .base import PositionalEncoding, as_position_tensor, register
from .rotary import LAYOUTS, rotate

AXES = ("time", "height", "width")
#: Hugging Face's mm_token_type_ids: the kind of each token
TEXT, IMAGE, VIDEO = 0, 1, 2


def default_sections(pairs: int) -> list[int]:
    """Qwen2-VL's split of `pairs` frequencies (its [16, 24, 24] at head_dim 128): 3/8 each to height and width,
    the rest to time."""
    spatial = 3 * pairs // 8
    return [pairs - 2 * spatial, spatial, spatial]


def frequency_axes(sections, pairs: int, interleaved: bool) -> torch.Tensor:
    """(pairs,) int64: the coordinate (0 time, 1 height, 2 width) each frequency reads.

    Consecutive sections (Qwen2-VL, Qwen2.5-VL): the first sections[0] frequencies read time, the next sections[1]
    height, the last sections[2] width. Interleaved (Qwen3-VL's mrope_interleaved): frequency j reads height when
    j % 3 == 1 and j < 3 * sections[1], width when j % 3 == 2 and j < 3 * sections[2], time otherwise."""
    if not interleaved:
        return torch.cat([torch.full((n,), a, dtype=torch.long) for a, n in enumerate(sections)])
    axes = torch.zeros(pairs, dtype=torch.long)
    for a in (1, 2):
        axes[a:3 * sections[a]:3] = a
    return axes


def _check_sections(sections, pairs: int) -> list[int]:
    ok = (isinstance(sections, (list, tuple)) and len(sections) == 3
          and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sections))
    if not ok or sum(sections) != pairs:
        raise ValueError(f"mrope_section must be 3 ints >= 0 (frequencies of time, height and width) summing to "
                         f"head_dim // 2 = {pairs}, got {sections!r}")
    return list(sections)


@register("mrope")
class MultimodalRoPE(PositionalEncoding):
    """M-RoPE: RoPE with theta_i = base^(-2i/d) on every channel pair, frequency i rotated by the coordinate of
    its section: logit(t, s) = scale * sum_i (R(c_t[a_i] theta_i) q_i) . (R(c_s[a_i] theta_i) k_i), c = (t, h, w)
    the coordinates of each token and a_i the axis of frequency i (`frequency_axes`). The logit depends on the
    positions only through c_s - c_t, axis by axis.

    Scalar positions p are text positions, coordinates (p, p, p): there M-RoPE equals RoPE with the same base and
    layout. Coordinates (1|B, T, 3) are taken by `encode`, by `enc(q, k, positions)` and by
    poskit.models.Transformer (positions (B, T, 3): the model splits them into text positions for attention
    and per-token offsets applied before it, module docstring); `mrope_positions` computes them for a sequence
    of text, images and videos, as Hugging Face's get_rope_index does.

    Paper: Wang, Bai, Tan, Wang, Fan, Bai, Chen, Liu, Wang, Ge, Fan, Dang, Du, Ren, Men, Liu, Zhou, Zhou, Lin,
    "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any Resolution" (arXiv 2409.12191,
    section 2.1, Multimodal Rotary Position Embedding). Hugging Face's Qwen2-VL / Qwen2.5-VL rotary embedding
    and get_rope_index compute the same (tests/test_peers_mrope.py); mrope_interleaved is Qwen3-VL's layout of
    the sections.

    Options (defaults):
        base=10000.0: the RoPE frequency base (HF's rope_theta; Qwen2-VL uses 1000000).
        mrope_section=None: frequencies per axis [time, height, width], summing to head_dim // 2 (HF's
            mrope_section, Qwen2-VL's [16, 24, 24] at head_dim 128); None is Qwen2-VL's proportions at any head_dim
            (3/8 of the frequencies to height and to width, the rest to time).
        mrope_interleaved=False: Qwen3-VL's interleaved sections (height and width every third frequency) instead
            of consecutive ones.
        layout='half': channel pairs (x_i, x_i+d/2) as in Hugging Face's Qwen models, or 'interleaved':
            (x_2i, x_2i+1).
    """
    kind = "qk"
    cache_form = "encoded"  # a key's rotation depends on its own position alone
    linear_form = "rotation"
    #: coordinates per position a model may give (time, height, width); inside attention, text positions
    coordinate_axes = len(AXES)

    def __init__(self, *, head_dim: int, num_heads: int, base: float = 10000.0, mrope_section: list[int] | None = None,
                 mrope_interleaved: bool = False, layout: str = "half"):
        super().__init__(head_dim=head_dim, num_heads=num_heads)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for mrope (channels are rotated in pairs), got {head_dim}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
        pairs = head_dim // 2
        # base's range is checked by build_encoding (base.OPTION_CHECKS)
        self.base, self.layout = float(base), layout
        self.mrope_interleaved = check_bool(mrope_interleaved, "mrope_interleaved")
        self.mrope_section = _check_sections(default_sections(pairs) if mrope_section is None else mrope_section,
                                             pairs)
        inv_freq = self.base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # float64 (d/2,)
        self.register_buffer("axis", frequency_axes(self.mrope_section, pairs, self.mrope_interleaved),
                             persistent=False)  # which coordinate each frequency reads
        self._angles = AngleTables()

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos and sin of each frequency's angle: scalar positions (..., T) or coordinates (..., T, 3) ->
        each (..., T, d/2)."""
        if positions.shape[-1:] == (len(AXES),) and positions.dim() == 3:
            return axial_cos_sin(positions, self.inv_freq, self.axis, dtype)
        return self._angles.lookup(positions, self.inv_freq, dtype)

    def encode_k(self, k, k_positions):
        c, s = self.cos_sin(k_positions, k.dtype)
        return rotate(k, c.unsqueeze(1), s.unsqueeze(1), self.layout)

    def encode_q(self, q, q_positions, scale: float = 1.0):
        out = self.encode_k(q, q_positions)
        return out * scale if scale != 1.0 else out

    def encode(self, x: torch.Tensor, positions) -> torch.Tensor:
        """x (B, heads, T, head_dim) rotated to `positions`: (T,) / (B, T) text positions or (1|B, T, 3)
        coordinates (time, height, width). Rotating q and k by their coordinates gives the logits of M-RoPE
        (what Hugging Face's apply_multimodal_rotary_pos_emb returns); rotating them by their offsets from the
        text positions, and then attending with this encoding at those text positions, gives the same logits."""
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[-1] != self.head_dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be a (B, heads, T, {self.head_dim}) tensor, got {shape}")
        return self.encode_k(x, self.positions_of(positions, x.shape[2], x.shape[0], x.device))

    def positions_of(self, positions, length: int, batch: int, device, argname: str = "positions") -> torch.Tensor:
        """`positions` validated as (1|B, T) text positions ((T,) or (B, T) given) or (1|B, T, 3) coordinates
        (always given 3-d: a 2-d (T, 3) would read as (B, T) text positions when B = T = 3); default arange(T)."""
        if positions is not None and torch.as_tensor(positions).dim() == 3:
            return as_position_tensor(positions, length, batch, device, argname, coords=len(AXES))
        return as_position_tensor(positions, length, batch, device, argname)

    def forward(self, q, k, positions=None, *, q_positions=None, k_positions=None):
        """`q_enc, k_enc = enc(q, k, positions)` as for every encoding (see PositionalEncoding.forward), and also
        with coordinates: positions (B, T, 3) or (1, T, 3) (time, height, width)."""
        given = [p for p in (positions, q_positions, k_positions) if p is not None]
        if not any(torch.as_tensor(p).dim() == 3 for p in given):
            return super().forward(q, k, positions, q_positions=q_positions, k_positions=k_positions)
        if positions is not None and (q_positions is not None or k_positions is not None):
            raise ValueError("give either positions (shared by q and k) or q_positions/k_positions, not both")
        if positions is not None:
            if q.shape[2] != k.shape[2]:
                raise ValueError(f"positions is shared by q and k, which have {q.shape[2]} and {k.shape[2]} tokens: "
                                 "give q_positions and k_positions instead")
            q_positions = k_positions = positions
        return (self.encode_k(q, self.positions_of(q_positions, q.shape[2], q.shape[0], q.device, "q_positions")),
                self.encode_k(k, self.positions_of(k_positions, k.shape[2], k.shape[0], k.device, "k_positions")))

    def component_frequencies(self) -> torch.Tensor:
        """theta_i of each rotated pair, float64 (d/2,) (each read by the coordinate of its section)."""
        return self.inv_freq.detach().to(torch.float64).cpu()

    def component_magnitudes(self, x: torch.Tensor) -> torch.Tensor:
        """The 2-norm of each rotated pair of x (..., head_dim) -> (..., d/2), the pairs of `layout`."""
        d = self.head_dim
        x0, x1 = (x[..., 0::2], x[..., 1::2]) if self.layout == "interleaved" else (x[..., : d // 2], x[..., d // 2:])
        return torch.sqrt(x0 * x0 + x1 * x1)

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", base={self.base}, mrope_section={self.mrope_section}, "
                f"mrope_interleaved={self.mrope_interleaved}, layout={self.layout!r}")


# -- positions ----------------------------------------------------------------------------------------------------
def coordinates_from_hf(position_ids: torch.Tensor) -> torch.Tensor:
    """Hugging Face's position_ids (3, B, T) (time, height, width), or text positions (B, T), as poskit's
    coordinates (B, T, 3)."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.is_floating_point() or position_ids.is_complex() \
            or position_ids.dtype == torch.bool or position_ids.dim() not in (2, 3) \
            or (position_ids.dim() == 3 and position_ids.shape[0] != len(AXES)):
        shape = tuple(position_ids.shape) if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise ValueError(f"position_ids must be an integer tensor of shape (3, B, T) (time, height, width) or (B, T), "
                         f"got {shape}")
    if position_ids.dim() == 2:
        return position_ids.long().unsqueeze(-1).expand(*position_ids.shape, len(AXES))
    return position_ids.long().permute(1, 2, 0)


def coordinates_to_hf(coordinates: torch.Tensor) -> torch.Tensor:
    """poskit's coordinates (B, T, 3) as Hugging Face's position_ids (3, B, T)."""
    if not isinstance(coordinates, torch.Tensor) or coordinates.dim() != 3 or coordinates.shape[-1] != len(AXES):
        shape = tuple(coordinates.shape) if isinstance(coordinates, torch.Tensor) else type(coordinates).__name__
        raise ValueError(f"coordinates must be a (B, T, 3) tensor, got {shape}")
    return coordinates.permute(2, 0, 1)


def text_positions(coordinates: torch.Tensor, order: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) int64: the text positions of a sequence with `coordinates` (1|B, T, 3), given its order (1|B, T)
    (0, 1, 2, ... over the real tokens): order plus, per row, the largest coordinate of its real tokens minus
    their largest order. The last real token then sits at the largest coordinate, so that text after it continues
    at largest + 1, as Hugging Face decodes (cache position plus rope_deltas = largest + 1 - real tokens); for
    text alone (coordinates (p, p, p) at p = order) it is the order itself. Strictly increasing with the order,
    so attention causal by text position is causal by sequence order. real: (B, T) bool, True = a real token."""
    B = max(coordinates.shape[0], order.shape[0], 1 if real is None else real.shape[0])
    coords = coordinates.expand(B, *coordinates.shape[1:]).amax(-1)  # (B, T) largest coordinate of each token
    order = order.expand(B, order.shape[-1])
    if real is not None:
        coords, masked = coords.masked_fill(~real, torch.iinfo(torch.long).min), order.masked_fill(~real, 0)
    else:
        masked = order
    delta = coords.amax(-1, keepdim=True) - masked.amax(-1, keepdim=True)  # (B, 1)
    if real is not None:
        delta = torch.where(real.any(-1, keepdim=True), delta, torch.zeros_like(delta))
    return order + delta


def mrope_positions(token_types: torch.Tensor, *, image_grids: torch.Tensor | None = None,
                    video_grids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                    spatial_merge_size: int = 1, video_time_intervals=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The M-RoPE coordinates of sequences of text, images and videos, as Hugging Face's get_rope_index computes
    them: (coordinates (B, T, 3) int64, rope_deltas (B, 1) int64).

    token_types: (B, T) ints, 0 text, 1 image, 2 video (HF's mm_token_type_ids); each run of image (video)
    tokens is one image (video), in order. image_grids / video_grids: (N, 3) (t, h, w) patch grids of the images
    and videos in order of appearance (HF's image_grid_thw / video_grid_thw); each one's tokens number
    t * (h // m) * (w // m) with m = spatial_merge_size. video_time_intervals: per video, the step of the time
    coordinate between its frames (Qwen2.5-VL: tokens_per_second * second_per_grid_t; default 1, Qwen2-VL).
    attention_mask: (B, T) 1 = real token; pads get coordinates 0 and count in nothing.

    Text continues from where the previous item left: a text token after a text token one position on; after an
    image or video starting at s, the text starts at s + max(h, w) // m. An image patch at (row, column) of its
    grid is (s, s + row, s + column); a video frame f adds int(f * interval) to the time. rope_deltas per row
    is the largest coordinate + 1 - the number of real tokens: text decoded after the sequence is at cache
    position + rope_deltas (`text_positions`)."""
    if (not isinstance(token_types, torch.Tensor) or token_types.dim() != 2 or token_types.is_floating_point()
            or token_types.dtype == torch.bool):
        shape = tuple(token_types.shape) if isinstance(token_types, torch.Tensor) else type(token_types).__name__
        raise ValueError(f"token_types must be a (B, T) integer tensor (0 text, 1 image, 2 video), got {shape}")
    if token_types.numel() and not bool(((token_types >= TEXT) & (token_types <= VIDEO)).all()):
        raise ValueError(f"token_types must hold 0 (text), 1 (image) or 2 (video), got values "
                         f"{sorted(set(token_types.unique().tolist()) - {0, 1, 2})}")
    check_int(spatial_merge_size, "spatial_merge_size", minimum=1)
    B, T = token_types.shape
    real = (torch.ones(B, T, dtype=torch.bool) if attention_mask is None
            else torch.as_tensor(attention_mask).to(torch.bool).cpu())
    if real.shape != (B, T):
        raise ValueError(f"attention_mask must have shape ({B}, {T}) as token_types, got {tuple(real.shape)}")
    grids = {IMAGE: _grids(image_grids, "image_grids"), VIDEO: _grids(video_grids, "video_grids")}
    intervals = _intervals(video_time_intervals, len(grids[VIDEO]))
    used = {IMAGE: 0, VIDEO: 0}
    coordinates = torch.zeros(B, T, len(AXES), dtype=torch.long)
    deltas = torch.zeros(B, 1, dtype=torch.long)
    types = token_types.cpu()
    for b in range(B):
        kinds = types[b][real[b]].tolist()
        pieces, start, i = [], 0, 0
        while i < len(kinds):
            j = i
            while j < len(kinds) and kinds[j] == kinds[i]:
                j += 1
            if kinds[i] == TEXT:
                pieces.append(torch.arange(start, start + j - i).unsqueeze(-1).expand(-1, len(AXES)))
                start += j - i
            else:
                kind, name = kinds[i], "image_grids" if kinds[i] == IMAGE else "video_grids"
                if used[kind] >= len(grids[kind]):
                    raise ValueError(f"{name} has {len(grids[kind])} grid(s), fewer than the runs of "
                                     f"{'image' if kind == IMAGE else 'video'} tokens in token_types")
                t, h, w = grids[kind][used[kind]]
                interval = intervals[used[kind]] if kind == VIDEO else 1
                used[kind] += 1
                h, w = h // spatial_merge_size, w // spatial_merge_size
                if j - i != t * h * w:
                    raise ValueError(f"{name}[{used[kind] - 1}] = {[t, h * spatial_merge_size, w * spatial_merge_size]} "
                                     f"has {t * h * w} tokens at spatial_merge_size {spatial_merge_size}, but its run in "
                                     f"token_types row {b} has {j - i}")
                frames = (torch.arange(t) * interval).long()
                grid = torch.stack(torch.meshgrid(frames, torch.arange(h), torch.arange(w), indexing="ij"), -1)
                pieces.append(grid.reshape(-1, len(AXES)) + start)
                start += max(h, w)
            i = j
        row = torch.cat(pieces) if pieces else torch.zeros(0, len(AXES), dtype=torch.long)
        coordinates[b, real[b]] = row
        deltas[b, 0] = (int(row.max()) + 1 - len(kinds)) if len(kinds) else 0
    for kind, name in ((IMAGE, "image_grids"), (VIDEO, "video_grids")):
        if used[kind] != len(grids[kind]):
            raise ValueError(f"{name} has {len(grids[kind])} grid(s), but token_types holds {used[kind]} run(s) of "
                             f"{'image' if kind == IMAGE else 'video'} tokens")
    return coordinates.to(token_types.device), deltas.to(token_types.device)


def _grids(grids, name: str) -> list[list[int]]:
    if grids is None:
        return []
    grids = torch.as_tensor(grids)
    if grids.dim() != 2 or grids.shape[-1] != 3 or grids.is_floating_point() or (grids.numel() and grids.min() < 1):
        raise ValueError(f"{name} must be an (N, 3) integer tensor of (t, h, w) grids, each >= 1, got "
                         f"{tuple(grids.shape)}")
    return grids.tolist()


def _intervals(intervals, videos: int) -> list[float]:
    if intervals is None:
        return [1.0] * videos
    values = torch.as_tensor(intervals, dtype=torch.float64).flatten().tolist()
    if len(values) != videos or not all(v >= 0 for v in values):
        raise ValueError(f"video_time_intervals must give one number >= 0 per video ({videos}), got {intervals!r}")
    return values
