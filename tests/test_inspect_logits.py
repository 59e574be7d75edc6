"""The logits-versus-distance inspector (python -m poskit.evaluate.inspect_logits) against closed forms."""
import math

import pytest
import torch

import poskit
from poskit.evaluate.inspect_logits import logits_versus_distance, main

DISTANCES = [0, 1, 2, 4, 8, 16, 64, 256, 1024]
D = 64


@pytest.fixture
def x():
    return torch.randn(D, dtype=torch.float64)


def test_alibi_logit_falls_by_slope_times_distance(x):
    # one head: slope m = 2^(-8 / 1); the content term |x|^2 / sqrt(d) is the same at every distance
    got = logits_versus_distance("alibi", DISTANCES, D, x=x)
    content = (x @ x).item() / math.sqrt(D)
    assert got == pytest.approx([content - 2**-8 * k for k in DISTANCES], abs=1e-12)


@pytest.mark.parametrize("name", ["none", "sinusoidal", "learned", "legendre"])
def test_no_position_in_attention_is_flat(name, x):
    got = logits_versus_distance(name, DISTANCES, D, x=x)
    assert got == pytest.approx([(x @ x).item() / math.sqrt(D)] * len(DISTANCES), abs=1e-12)


def test_rope_logit_is_the_cosine_sum(x):
    # pair i of x turns by k theta_i between key and query: logit = sum_i (x_2i^2 + x_2i+1^2) cos(k theta_i) / sqrt(d)
    got = logits_versus_distance("rope", DISTANCES, D, x=x)
    want = [sum((x[2 * i] ** 2 + x[2 * i + 1] ** 2).item() * math.cos(k * 10000.0 ** (-2 * i / D)) for i in range(D // 2))
            / math.sqrt(D) for k in DISTANCES]
    assert got == pytest.approx(want, abs=1e-10)
    assert got[0] == max(got)  # every pair is aligned only at distance 0


def test_rope_linear_at_four_times_the_distance_is_rope(x):
    # the inspector's rope-linear uses factor 4: position interpolation maps distance 4k onto distance k
    near = [0, 1, 2, 4, 16, 64]
    assert logits_versus_distance("rope-linear", [4 * k for k in near], D, x=x) == pytest.approx(
        logits_versus_distance("rope", near, D, x=x), abs=1e-10)


def test_main_prints_one_row_per_encoding_with_the_computed_values(capsys):
    main(["--distances", "0,3,50", "--head-dim", "16"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["encoding", "0", "3", "50"]
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in lines[1:]}
    assert sorted(rows) == poskit.available_encodings()
    alibi = rows["alibi"]
    assert alibi == pytest.approx(logits_versus_distance("alibi", [0, 3, 50], 16), abs=1e-3)
    assert alibi[0] - alibi[2] == pytest.approx(50 * 2**-8, abs=2e-3)  # printed to 3 decimals
    assert len(set(rows["none"])) == 1
