"""T5's relative position bias against the bucketing written out for one relative position at a time (float64
loops), on the reference and the default (blocked learned-bias) paths, bidirectional and causal."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.encodings.t5 import relative_position_bucket
from pair_reference import assert_matches_reference


def bucket_of(rel: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Mesh TensorFlow's bucket of one relative position rel = key - query, in Python integers and math.log.
    Bidirectional: the upper half of the buckets is for keys after the query. Causal: keys after the query
    count as distance 0. Distances below half the buckets are exact; larger ones are binned logarithmically up
    to max_distance, and everything from there shares the last bucket."""
    n, first = num_buckets, 0
    if bidirectional:
        n //= 2
        first = n if rel > 0 else 0
        r = abs(rel)
    else:
        r = max(-rel, 0)
    exact = n // 2
    if r < exact:
        return first + r
    return first + min(n - 1, exact + int(math.log(r / exact) / math.log(max_distance / exact) * (n - exact)))


# the defaults (32 buckets, max_distance 128), by hand: bidirectional keeps 16 per direction, 8 of them exact;
# bucket 8 + floor(8 log(r / 8) / log(16)) for r >= 8, e.g. r = 16 -> 8 + 2, r = 127 -> 8 + floor(7.98) = 15
HAND_BIDIRECTIONAL = {0: 0, -1: 1, -7: 7, -8: 8, -15: 9, -16: 10, -127: 15, -128: 15, -10**9: 15, 1: 17, 7: 23, 8: 24,
                      16: 26, 127: 31, 10**9: 31}
# causal keeps all 32 for keys at or before the query, 16 exact; 16 + floor(16 log(r / 16) / log(8)), e.g.
# r = 32 -> 16 + floor(5.33) = 21; keys after the query share bucket 0
HAND_CAUSAL = {0: 0, -1: 1, -15: 15, -16: 16, -32: 21, -64: 26, -127: 31, -128: 31, -10**9: 31, 1: 0, 10**9: 0}


@pytest.mark.parametrize("bidirectional, table", [(True, HAND_BIDIRECTIONAL), (False, HAND_CAUSAL)])
def test_default_buckets_by_hand(bidirectional, table):
    rel = torch.tensor(list(table))
    got = relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=32, max_distance=128)
    assert got.tolist() == list(table.values())
    assert [bucket_of(r, bidirectional, 32, 128) for r in table] == list(table.values())


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (7, 9), (64, 1000)])
def test_buckets_equal_the_written_out_rule(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-3 * max_distance, 3 * max_distance + 1)
    got = relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    assert got.tolist() == [bucket_of(int(r), bidirectional, num_buckets, max_distance) for r in rel]
    assert 0 <= got.min() and got.max() < num_buckets


def t5_pair_logit(enc, D):
    def pair_logit(h, q_t, k_s, t, s):
        b = bucket_of(s - t, enc.bidirectional, enc.num_buckets, enc.max_distance)
        return q_t @ k_s / math.sqrt(D) + enc.table[b, h]
    return pair_logit


@settings(max_examples=12, deadline=None)
@given(options=st.sampled_from([{}, dict(bidirectional=False), dict(num_buckets=8, max_distance=12),
                                dict(num_buckets=6, max_distance=10, bidirectional=False)]),
       B=st.integers(1, 2), Hkv=st.integers(1, 2), groups=st.sampled_from([1, 2]), Tk=st.integers(1, 7),
       n_new=st.integers(1, 7), step=st.integers(1, 40), causal=st.booleans(), padding=st.booleans(),
       offset=st.integers(0, 10**6), seed=st.integers(0, 2**16))
def test_t5_bias_equals_the_bucket_table(options, B, Hkv, groups, Tk, n_new, step, causal, padding, offset, seed):
    D, H, Tq = 8, Hkv * groups, min(n_new, Tk)
    torch.manual_seed(seed)
    enc = poskit.build_encoding("t5", head_dim=D, num_heads=H, init_std=1.0, **options).double()
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64) for _ in range(2))
    kp = [offset + step * s for s in range(Tk)]  # steps up to 40: distances past max_distance
    qp = kp[Tk - Tq:]
    mask = (torch.rand(B, Tk, generator=g) > 0.3) if padding else None
    assert_matches_reference(t5_pair_logit(enc, D), enc, q, k, v, qp, kp, causal=causal, key_mask=mask,
                             params=[enc.table])


def test_the_initial_table_follows_init_std():
    torch.manual_seed(0)
    default = poskit.build_encoding("t5", head_dim=64, num_heads=8, num_buckets=512, max_distance=1024)
    assert default.table.shape == (512, 8)
    assert default.table.std().item() == pytest.approx((8 * 64) ** -0.5, rel=0.05)  # HF T5: d_model^-0.5
    assert poskit.build_encoding("t5", head_dim=64, num_heads=8, init_std=0.0).table.abs().max() == 0


@pytest.mark.parametrize("options, match", [
    (dict(num_buckets=3), r"num_buckets must be an int >= 4"),
    (dict(num_buckets=1, bidirectional=False), r"num_buckets must be an int >= 2"),
    (dict(num_buckets=32, max_distance=8), r"max_distance must be > 8"),
    (dict(num_buckets=32, max_distance=16, bidirectional=False), r"max_distance must be > 16"),
    (dict(max_distance=-1), "max_distance must be an int >= 0"),
    (dict(bidirectional="yes"), "bidirectional must be true or false"),
])
def test_bad_options_are_refused_naming_the_option(options, match):
    with pytest.raises(ValueError, match=match):
        poskit.build_encoding("t5", head_dim=8, num_heads=2, **options)
