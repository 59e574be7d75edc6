"""`poskit.analyze`: each analysis against a slow float64 computation written here from the papers' formulas,
the encodings' declared frequency hooks, refusals of what an analysis cannot read, and the CLI's outputs."""
from __future__ import annotations

import cmath
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.analyze import correlation, decay, frequency
from poskit.cli import main
from poskit.models import ModelConfig, Transformer


# -- the declared hooks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_rope_component_magnitudes_are_pair_norms(layout, rotary_dim):
    enc = poskit.build_encoding("rope", head_dim=12, num_heads=2, layout=layout, rotary_dim=rotary_dim)
    x = torch.randn(3, 2, 5, 12, dtype=torch.float64)
    got = enc.component_magnitudes(x)
    rd = rotary_dim or 12
    pairs = [(2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + rd // 2) for i in range(rd // 2)]
    want = torch.empty(3, 2, 5, rd // 2, dtype=torch.float64)
    for idx in np.ndindex(3, 2, 5):
        for c, (a, b) in enumerate(pairs):
            want[idx + (c,)] = math.hypot(float(x[idx + (a,)]), float(x[idx + (b,)]))
    torch.testing.assert_close(got, want)
    # RoFormer's theta_i = base^(-2i/d) over the rotated dims
    torch.testing.assert_close(enc.component_frequencies(),
                               torch.tensor([10000.0 ** (-2 * i / rd) for i in range(rd // 2)], dtype=torch.float64))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["rope", "pope"]), st.integers(0, 2**31 - 1))
def test_position_never_changes_a_component_magnitude(position, name, seed):
    """The magnitudes are content alone: the encoded q at any position holds them (RoPE: each rotated pair's
    norm; PoPE: each (cos, sin) pair of the Cartesian form, channel c and c + d)."""
    g = torch.Generator().manual_seed(seed)
    enc = poskit.build_encoding(name, head_dim=8, num_heads=1).double()
    q = torch.randn(1, 1, 1, 8, dtype=torch.float64, generator=g)
    encoded = enc.encode_q(q, torch.tensor([[position]]))[0, 0, 0]
    if enc.qk_width == 2:
        moduli = torch.hypot(encoded[:8], encoded[8:])
    else:
        moduli = torch.hypot(encoded[0::2], encoded[1::2])
    torch.testing.assert_close(moduli, enc.component_magnitudes(q)[0, 0, 0])


def test_pope_magnitudes_follow_its_softplus_option():
    x = torch.randn(2, 4, 3, 6, dtype=torch.float64)
    on = poskit.build_encoding("pope", head_dim=6, num_heads=4)
    off = poskit.build_encoding("pope", head_dim=6, num_heads=4, softplus=False)
    torch.testing.assert_close(on.component_magnitudes(x), torch.log1p(torch.exp(x)))
    torch.testing.assert_close(off.component_magnitudes(x), x.abs())
    torch.testing.assert_close(on.component_frequencies(), torch.tensor([10000.0 ** (-c / 6) for c in range(6)],
                                                                        dtype=torch.float64))


@pytest.mark.parametrize("name", ["alibi", "none", "cope", "relative"])
def test_encodings_without_frequencies_declare_none(name):
    opts = {"max_distance": 8} if name == "relative" else {}
    assert poskit.build_encoding(name, head_dim=8, num_heads=2, **opts).component_frequencies() is None


# -- frequency usage of a model --------------------------------------------------------------------------------
def _slow_magnitudes(enc, x: torch.Tensor) -> torch.Tensor:
    """(H, T, hd) float64 -> (H, C): the mean over positions of each component's magnitude, one at a time."""
    freqs = enc.component_frequencies()
    H, T, hd = x.shape
    out = torch.zeros(H, len(freqs), dtype=torch.float64)
    for h in range(H):
        for t in range(T):
            v = x[h, t].tolist()
            for c in range(len(freqs)):
                if enc.kind == "qk" and enc.qk_width == 2:  # pope: softplus of channel c
                    out[h, c] += math.log1p(math.exp(v[c]))
                else:  # rope, interleaved pairs
                    out[h, c] += math.hypot(v[2 * c], v[2 * c + 1])
    return out / T


class _Windows:
    def __init__(self, inputs):
        self.inputs = inputs


@pytest.mark.parametrize("name", ["rope", "pope"])
def test_model_frequency_usage_matches_a_slow_computation_at_every_layer(name):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=20, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, encoding=name)
    model = Transformer(cfg).double().eval()
    tokens = torch.randint(0, 20, (1, 7))
    usage = frequency.model_frequency_usage(model, [_Windows(tokens)])
    assert usage["tokens"] == 7
    # the inputs of each attention layer, computed by running the blocks by hand (no hooks)
    positions = torch.arange(7)[None]
    x = model.embed(tokens)
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            h = block.norm1(x)[0]  # (T, d_model)
            for side, proj, heads in (("q", block.attn.q_proj, 2), ("k", block.attn.k_proj, 1)):
                raw = proj(h).view(7, heads, 8).transpose(0, 1)  # (heads, T, hd)
                want = _slow_magnitudes(block.attn.encoding, raw)
                torch.testing.assert_close(torch.tensor(usage["layers"][i][side], dtype=torch.float64), want)
            x = block(x, positions)


def test_frequency_usage_stops_at_max_tokens_and_refuses_an_encoding_without_frequencies():
    model = Transformer(ModelConfig(vocab_size=10, d_model=16, n_layers=1, n_heads=2, encoding="rope")).eval()
    batches = [_Windows(torch.randint(0, 10, (4, 8))) for _ in range(3)]
    assert frequency.model_frequency_usage(model, batches, max_tokens=10)["tokens"] == 16  # two rows of 8
    alibi = Transformer(ModelConfig(vocab_size=10, d_model=16, n_layers=1, n_heads=2, encoding="alibi")).eval()
    with pytest.raises(ValueError, match="'alibi' of layer 0 declares no frequency components"):
        frequency.model_frequency_usage(alibi, batches)


# -- decay ----------------------------------------------------------------------------------------------------
def test_relative_upper_bound_matches_the_abel_sum_written_out():
    theta = [10000.0 ** (-2 * i / 16) for i in range(8)]
    distances = [0, 1, 5, 37, 200]
    got = decay.relative_upper_bound(torch.tensor(theta, dtype=torch.float64), torch.tensor(distances))
    for r, value in zip(distances, got.tolist()):
        partial, total = 0j, 0.0
        for t in theta:  # S_j = sum_{i<j} e^{i r theta_i}; the bound is the mean of |S_1| .. |S_C|
            partial += cmath.exp(1j * r * t)
            total += abs(partial)
        assert value == pytest.approx(total / len(theta), rel=1e-12)


def test_measured_logits_match_the_rotary_formula():
    """With q = k = x, RoPE's logit at distance r is scale * sum_i |x_pair_i|^2 cos(r theta_i) (RoFormer eq. 35)."""
    distances = torch.tensor([0, 1, 3, 10, 64])
    got = decay.measured_logits("rope", distances, head_dim=8, samples=5, seed=3)
    x = torch.randn(5, 1, 1, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))[:, 0, 0]
    theta = [10000.0 ** (-2 * i / 8) for i in range(4)]
    for j, r in enumerate(distances.tolist()):
        per_sample = [abs(sum((float(v[2 * i]) ** 2 + float(v[2 * i + 1]) ** 2) * math.cos(r * theta[i])
                              for i in range(4)) / math.sqrt(8)) for v in x]
        assert float(got[j]) == pytest.approx(sum(per_sample) / 5, rel=1e-9)


def test_decay_refuses_absolute_encodings_and_bad_sizes():
    with pytest.raises(ValueError, match="'sinusoidal' is 'absolute'"):
        decay.decay_curves(["sinusoidal"], head_dim=8, max_distance=4, samples=2)
    with pytest.raises(ValueError, match="max_distance must be"):
        decay.decay_curves(["rope"], head_dim=8, max_distance=0)
    with pytest.raises(ValueError, match="encodings must name"):
        decay.decay_curves(["ropey"], head_dim=8)


# -- correlation ----------------------------------------------------------------------------------------------
def test_correlation_matrix_matches_pearson_written_out():
    v = torch.randn(5, 9, dtype=torch.float64)
    got = correlation.correlation_matrix(v)
    for a in range(5):
        for b in range(5):
            xa, xb = v[a].tolist(), v[b].tolist()
            ma, mb = sum(xa) / 9, sum(xb) / 9
            cov = sum((p - ma) * (q - mb) for p, q in zip(xa, xb))
            want = cov / math.sqrt(sum((p - ma) ** 2 for p in xa) * sum((q - mb) ** 2 for q in xb))
            assert float(got[a, b]) == pytest.approx(want, abs=1e-12)


def test_position_correlation_of_sinusoidal_pe_from_its_formula():
    result = correlation.position_correlation(["sinusoidal"], dim=16, positions=6, high_from=10, anchors=(1, 5))
    pe = [[math.sin(p / 10000 ** (2 * (i // 2) / 16)) if i % 2 == 0 else math.cos(p / 10000 ** (2 * (i // 2) / 16))
           for i in range(16)] for p in range(6)]
    want = np.corrcoef(np.array(pe)[:, 10:])
    np.testing.assert_allclose(np.array(result["encodings"]["sinusoidal"]["corr_high"]), want, atol=1e-6)
    np.testing.assert_allclose(result["encodings"]["sinusoidal"]["curves_high"]["5"], want[5], atol=1e-6)


def test_correlation_refuses_non_absolute_encodings_and_bad_anchors():
    with pytest.raises(ValueError, match="'rope' is 'qk'"):
        correlation.position_correlation(["rope"], dim=8, positions=4, high_from=2, anchors=(1,))
    with pytest.raises(ValueError, match=r"anchors must be positions in \[0, positions=4\)"):
        correlation.position_correlation(["sinusoidal"], dim=8, positions=4, high_from=2, anchors=(4,))
    with pytest.raises(ValueError, match="high_from must be"):
        correlation.position_correlation(["sinusoidal"], dim=8, positions=4, high_from=7, anchors=(1,))


# -- the command line: files written, numbers finite -------------------------------------------------------------
def _finite(values) -> bool:
    arr = np.asarray(values, dtype=float)
    return arr.size > 0 and bool(np.isfinite(arr).all())


def test_cli_decay_and_correlation_write_json_and_png(tmp_path, capsys):
    assert main(["analyze", "decay", "--out", str(tmp_path / "d"), "--head-dim", "16", "--max-distance", "32",
                 "--samples", "4", "--encodings", "rope,pope,alibi"]) == 0
    d = json.loads((tmp_path / "d" / "decay.json").read_text())
    assert set(d["curves"]) == {"rope", "pope", "alibi"} and "upper_bound" not in d["curves"]["alibi"]
    assert _finite(d["curves"]["rope"]["upper_bound"]) and _finite(d["curves"]["pope"]["mean_abs_logit"])
    assert (tmp_path / "d" / "decay.png").stat().st_size > 0
    assert main(["analyze", "correlation", "--out", str(tmp_path / "c"), "--dim", "32", "--positions", "20",
                 "--high-from", "20", "--anchors", "1,19"]) == 0
    c = json.loads((tmp_path / "c" / "correlation.json").read_text())
    assert set(c["encodings"]) == {"sinusoidal", "legendre"}
    # Legendre's position 0 is P_0 = 1 in every dimension: no variance, so no correlation (NaN) for it alone
    assert _finite(np.asarray(c["encodings"]["legendre"]["corr_high"], dtype=float)[1:, 1:])
    assert (tmp_path / "c" / "correlation.png").stat().st_size > 0
    assert "mean |corr|" in capsys.readouterr().out


def test_cli_frequency_on_trained_runs(tmp_path):
    runs = []
    for name in ("rope", "pope"):
        run = tmp_path / name
        assert main(["train", "--task", "flip-flop", "--encoding", name, "--steps", "2", "--run-dir", str(run),
                     "--quiet", "task_options.length=16", "task_options.eval_size=8", "model.d_model=16",
                     "model.n_layers=2", "model.n_heads=2", "eval_every=100"]) == 0
        runs.append(str(run))
    out = tmp_path / "freq"
    assert main(["analyze", "frequency", *runs, "--out", str(out), "--max-tokens", "64"]) == 0
    report = json.loads((out / "frequency.json").read_text())
    assert [r["encoding"] for r in report["runs"]] == ["rope", "pope"]
    rope, pope = report["runs"]
    assert len(rope["frequencies"]) == 4 and len(pope["frequencies"]) == 8  # d/2 chunks vs d complex features
    assert len(rope["layers"]) == 2 and len(rope["layers"][0]["q"]) == 2
    assert _finite(pope["layers"][1]["k"]) and (out / "frequency.png").stat().st_size > 0


def test_cli_analyze_bad_input(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["analyze", "frequency", "--out", str(tmp_path)])
    assert "needs at least one RUN" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["analyze", "decay", str(tmp_path), "--out", str(tmp_path)])
    assert "RUN directories are read by `analyze frequency`, `phase-bias` and `cope-gates` only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["analyze", "frequency", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert "missing" in capsys.readouterr().err


def _tiny_flip_flop_run(run_dir, encoding, options):
    from poskit.training import TrainConfig, train

    cfg = TrainConfig(task="flip-flop", task_options={"length": 16, "eval_size": 8}, batch_size=4, max_steps=6,
                      eval_every=2, eval_batches=1, final_eval_batches=1, lr=0.05,
                      model=ModelConfig(d_model=16, n_layers=2, n_heads=2, encoding=encoding, encoding_options=options))
    train(cfg, run_dir, quiet=True)


def test_phase_bias_analysis_reads_the_trainers_statistics(tmp_path, capsys):
    from poskit.analyze import phase_bias

    _tiny_flip_flop_run(tmp_path / "clamp", "pope", {})
    _tiny_flip_flop_run(tmp_path / "projected", "pope", {"delta_projection": True})
    assert main(["analyze", "phase-bias", str(tmp_path / "clamp"), str(tmp_path / "projected"), "--out",
                 str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / phase_bias.PHASE_BIAS_JSON).read_text())
    assert (tmp_path / "out" / phase_bias.PHASE_BIAS_PNG).stat().st_size > 0
    assert sorted(result["groups"]) == ["pope", "pope:delta_projection=true"]
    clamp, projected = result["groups"]["pope"][0], result["groups"]["pope:delta_projection=true"][0]
    assert clamp["steps"] == projected["steps"] == [2, 4, 6] and len(clamp["accuracy"]) == 3
    # the layer mean of the share at 0, recomputed from the log by hand
    log = [json.loads(line) for line in (tmp_path / "clamp" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in log if "encoding" in r][-1]["encoding"].values()
    assert clamp["delta_at_zero"][-1] == pytest.approx(sum(s["delta_at_zero"] for s in last) / 2)
    assert "final accuracy per run" in capsys.readouterr().out
    # the held-out result of each finished run, from its results.json, and the table over seeds
    results = json.loads((tmp_path / "clamp" / "results.json").read_text())
    assert clamp["final"]["test"] == results["splits"]["test"]["accuracy"]
    summary = result["summary"]["pope"]
    assert summary["seeds"] == [0] and summary["accuracy"] == [clamp["final"]["test"]] and summary["std"] is None
    table = (tmp_path / "out" / phase_bias.PHASE_BIAS_MD).read_text()
    assert f"| pope | 1 | {100 * clamp['final']['test']:.2f} |" in table
    assert "| pope:delta_projection=true | 1 |" in table

    # the results record: each run's last evaluation beside where its phase bias ended, no machine path
    from poskit.report.record import absolute_paths, read_record

    record = read_record(tmp_path / "out" / "results.json")
    assert (record.kind, record.name, record.measurements["metric"]) == ("analysis", "phase-bias", "accuracy")
    run = record.measurements["groups"][""]["pope"][0]
    assert run["steps"] == 6 and run["splits"]["analysis"]["accuracy"] == clamp["accuracy"][-1]
    assert run["splits"]["analysis"]["delta_at_zero"] == clamp["delta_at_zero"][-1]
    assert run["splits"]["test"]["accuracy"] == clamp["final"]["test"]  # the held-out result beside them
    assert absolute_paths(record.to_dict()) == []


def test_phase_bias_summary_over_seeds():
    from poskit.analyze import phase_bias

    def run(seed, acc, at_zero):
        return {"seed": seed, "final": {"test": acc}, "delta_at_zero": [1.0, at_zero]}

    groups = {"pope": [run(1, 0.5, 0.9), run(0, 1.0, 0.8)], "pope:phase_bias=false": [{"seed": 0, "final": {},
                                                                                      "delta_at_zero": [0.0]}]}
    summary = phase_bias.summarize(groups, "accuracy")
    assert summary["pope"]["seeds"] == [0, 1] and summary["pope"]["accuracy"] == [1.0, 0.5]
    assert summary["pope"]["mean"] == 0.75 and summary["pope"]["std"] == pytest.approx(0.3535534)
    assert summary["pope"]["delta_at_zero"] == [0.8, 0.9]
    assert summary["pope:phase_bias=false"]["seeds"] == []  # unfinished runs are left out of the table
    table = phase_bias.summary_table({"metric": "accuracy", "summary": summary})
    assert "| pope | 2 | 75.00 ± 35.36 | 0: 100.0, 1: 50.0 | 0.80, 0.90 |" in table and "phase_bias=false" not in table


def test_phase_bias_analysis_refuses_a_run_without_statistics(tmp_path, capsys):
    from poskit.analyze import phase_bias

    _tiny_flip_flop_run(tmp_path / "rope", "rope", {})
    with pytest.raises(ValueError, match="logged no phase-bias statistics"):
        phase_bias.phase_bias_curves([tmp_path / "rope"])
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", "phase-bias", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "at least one RUN" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
