"""KERPLE's log and power kernels against the paper's formulas evaluated pair by pair (float64 loops), on the
reference and the default (blocked learned-bias) paths; the positivity constraints on r1 and r2."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from pair_reference import assert_matches_reference


def kerple_pair_logit(enc, D):
    """logit = q . k / sqrt(d) - r1 log(1 + r2 |m - n|) (log) or - r1 |m - n|^r2 (power), per head."""
    def pair_logit(h, q_t, k_s, m, n):
        r1, r2, d = enc.r1[h], enc.r2[h], abs(m - n)
        kernel = -r1 * torch.log(1 + r2 * d) if enc.kernel == "log" else -r1 * d ** r2
        return q_t @ k_s / math.sqrt(D) + kernel
    return pair_logit


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(["kerple-log", "kerple-power"]), B=st.integers(1, 2), Hkv=st.integers(1, 2),
       groups=st.sampled_from([1, 2]), Tk=st.integers(1, 7), n_new=st.integers(1, 7), step=st.integers(1, 30),
       causal=st.booleans(), padding=st.booleans(), offset=st.integers(0, 10**6), seed=st.integers(0, 2**16))
def test_kerple_equals_the_papers_kernels(name, B, Hkv, groups, Tk, n_new, step, causal, padding, offset, seed):
    D, H, Tq = 8, Hkv * groups, min(n_new, Tk)
    torch.manual_seed(seed)
    enc = poskit.build_encoding(name, head_dim=D, num_heads=H).double()
    enc.project_parameters_()  # a float32 eps widened to float64 lies just below the float64 eps
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, Tk, D, generator=g, dtype=torch.float64) for _ in range(2))
    kp = [offset + step * s for s in range(Tk)]
    qp = kp[Tk - Tq:]
    mask = (torch.rand(B, Tk, generator=g) > 0.3) if padding else None
    # (the power kernel's exponent has a gradient of 0 * log 0 at distance 0: torch gives 0 on both sides)
    assert_matches_reference(kerple_pair_logit(enc, D), enc, q, k, v, qp, kp, causal=causal, key_mask=mask,
                             params=[enc.r1, enc.r2])


def test_initial_parameters_follow_the_released_code_and_lie_in_the_set():
    torch.manual_seed(0)
    log = poskit.build_encoding("kerple-log", head_dim=8, num_heads=4096)
    power = poskit.build_encoding("kerple-power", head_dim=8, num_heads=4096)
    for enc, r1_max, r2_max in ((log, 2.0, 1.0), (power, 1.0, 2.0)):  # U(0, span), then at least eps
        assert enc.r1.min() >= 0.01 and enc.r2.min() >= 0.01
        assert enc.r1.max() <= r1_max and enc.r2.max() <= r2_max
        assert enc.r1.mean().item() == pytest.approx(r1_max / 2, rel=0.05)
        assert enc.r2.mean().item() == pytest.approx(r2_max / 2, rel=0.05)


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power"])
def test_an_optimizer_step_is_followed_by_the_projection(name):
    enc = poskit.build_encoding(name, head_dim=8, num_heads=3).double()
    opt = torch.optim.SGD(enc.parameters(), lr=1.0)
    with torch.no_grad():
        enc.r1.copy_(torch.tensor([0.5, 0.02, 1.0]))
        enc.r2.copy_(torch.tensor([0.5, 0.02, 1.9]))
    enc.r1.grad = torch.tensor([0.0, 5.0, 0.0], dtype=torch.float64)  # pushes r1[1] to -4.98
    enc.r2.grad = torch.tensor([0.0, 5.0, -5.0], dtype=torch.float64)  # r2[1] to -4.98, r2[2] to 6.9
    opt.step()
    assert enc.r1.tolist() == pytest.approx([0.5, 0.01, 1.0], rel=1e-6)  # (0.02 went in as a float32)
    assert enc.r2.tolist() == pytest.approx([0.5, 0.01, 2.0 if name == "kerple-power" else 6.9], rel=1e-6)


def test_the_forward_pass_clamps_parameters_set_outside_the_set():
    enc = poskit.build_encoding("kerple-power", head_dim=4, num_heads=1).double()
    with torch.no_grad():  # no optimizer step: only the forward clamp applies
        enc.r1.fill_(-3.0)
        enc.r2.fill_(5.0)
    b = enc.bias(torch.zeros(1, 1, 1, 4, dtype=torch.float64), torch.tensor([[10]]), torch.tensor([[0, 7]]), 1.0)
    torch.testing.assert_close(b[0, 0, 0], torch.tensor([-0.01 * 10**2, -0.01 * 3**2], dtype=torch.float64))


@pytest.mark.parametrize("name, options, match", [
    ("kerple-log", dict(eps=0.0), "eps must be a finite number > 0"),
    ("kerple-power", dict(eps=2.5), r"eps must be <= 2.0 for the power kernel"),
    ("kerple-log", dict(kernel="power"), "unknown option"),  # the kernel is the registered name's
])
def test_bad_options_are_refused_naming_the_option(name, options, match):
    with pytest.raises(ValueError, match=match):
        poskit.build_encoding(name, head_dim=8, num_heads=2, **options)
