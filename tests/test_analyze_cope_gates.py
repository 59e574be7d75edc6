"""`poskit analyze cope-gates` (CoPE paper Figs. 4 and 6): the gate statistics of a model whose gates are set by
hand to fire on newlines only, against the count those gates must give; the token classes; the command's files and
refusals."""
import json
from types import SimpleNamespace

import pytest
import torch

from poskit.analyze.cope_gates import CLASSES, class_table, model_cope_gates, token_class
from poskit.models.decoder import ModelConfig, Transformer

NEWLINE, LETTER = 1, 2  # token ids of the hand-set model: 1 decodes to "\n", every other id to a letter


def _decode(ids):
    return "".join("\n" if i == NEWLINE else "a" for i in ids)


def _newline_counting_model(big: float = 40.0) -> Transformer:
    """One CoPE layer whose gate logit is +big on a newline key and -big on any other, for every query: the query
    reads a dimension every token shares, the key a dimension whose sign says newline or not."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=4, d_model=8, n_layers=1, n_heads=2, encoding="cope"))
    with torch.no_grad():
        emb = torch.zeros(4, 8)
        emb[:, 0] = 1.0  # shared by every token
        emb[:, 1] = -1.0
        emb[NEWLINE, 1] = 1.0  # newline's sign
        model.embed.weight.copy_(emb)
        attn = model.blocks[0].attn
        hd = attn.head_dim
        attn.q_proj.weight.zero_()
        attn.k_proj.weight.zero_()
        for h in range(attn.num_heads):
            attn.q_proj.weight[h * hd, 0] = big  # q = big * e0 (after the norm's positive scaling)
            attn.k_proj.weight[h * hd, 1] = big  # k = +-big * e0
    return model.eval()


def test_gates_set_to_fire_on_newlines_count_the_newlines():
    model = _newline_counting_model()
    T = 40
    g = torch.Generator().manual_seed(1)
    x = torch.full((3, T), LETTER)
    where = torch.rand(3, T, generator=g) < 0.2
    x[where] = NEWLINE
    x[:, -5] = NEWLINE  # at least one newline near the end of every window
    classes = class_table(_decode, 4)
    result = model_cope_gates(model, [SimpleNamespace(inputs=x)], classes)
    layer = result["layers"][0]
    newline, letter = CLASSES.index("newline"), CLASSES.index("letter")
    for h in range(2):
        assert layer["mean_gate"][h][newline] == pytest.approx(1.0, abs=1e-6)
        assert layer["mean_gate"][h][letter] == pytest.approx(0.0, abs=1e-6)
        # the last query's count over its whole window is the window's number of newlines, averaged over windows
        assert layer["window_count"][h] == pytest.approx(float((x == NEWLINE).sum(1).double().mean()), abs=1e-4)
        assert layer["newline_ratio"][h] > 1.0
    # pairs: a key at index s is seen by the T - s queries at or after it
    seen = torch.arange(T, 0, -1).double()
    assert result["pairs_per_class"][newline] == pytest.approx(float(((x == NEWLINE).double() * seen).sum()))
    assert result["tokens"] == x.numel() and result["windows"] == 3
    example = result["example"]
    assert example["newline"] == [j for j, t in enumerate(example["tokens"]) if t == NEWLINE]
    gates = torch.tensor(example["layers"][0]["gates"][0])
    assert gates.shape == (T, T) and torch.all(gates.triu(1) == 0)  # no gate on a future key
    weights = torch.tensor(example["layers"][0]["position_attention"][1])
    assert torch.allclose(weights.amax(-1), torch.ones(T))  # each query's largest weight is 1, as in Fig. 4


@pytest.mark.parametrize("text, kind", [("\n", "newline"), (" ", "space"), ("\t", "space"), (",", "punctuation"),
                                        ("7", "digit"), ("a", "letter"), (" the", "letter"), ("", "other"),
                                        ("é", "letter")])
def test_token_class(text, kind):
    assert token_class(text) == kind


def test_a_model_without_a_contextual_encoding_is_refused_by_name():
    model = Transformer(ModelConfig(vocab_size=4, d_model=8, n_layers=1, n_heads=2, encoding="rope"))
    with pytest.raises(ValueError, match="'rope' of layer 0 is not contextual"):
        model_cope_gates(model, [SimpleNamespace(inputs=torch.ones(1, 5, dtype=torch.long))], class_table(_decode, 4))


def test_the_command_writes_its_files_and_record(tmp_path, capsys):
    from poskit.cli import main

    run = tmp_path / "run"
    assert main(["train", "--task", "shakespeare", "--encoding", "cope", "--steps", "2", "--run-dir", str(run),
                 "--quiet", "task_options.context=32", "model.d_model=16", "model.n_layers=1", "model.n_heads=2",
                 "batch_size=2", "eval_every=100", "eval_batches=1", "final_eval_batches=1"]) == 0
    out = tmp_path / "gates"
    assert main(["analyze", "cope-gates", str(run), "--out", str(out), "--max-tokens", "256", "--quiet"]) == 0
    data = json.loads((out / "cope_gates.json").read_text())
    assert data["runs"][0]["encoding"] == "cope" and len(data["runs"][0]["layers"]) == 1
    assert (out / "cope_gates.png").stat().st_size > 0
    record = json.loads((out / "results.json").read_text())
    assert record["name"] == "cope-gates" and "newline_ratio" in json.dumps(record["measurements"])
    with pytest.raises(SystemExit) as refused:  # no RUN: one line naming what is missing, nothing written
        main(["analyze", "cope-gates", "--out", str(tmp_path / "none")])
    assert refused.value.code == 2
    assert not (tmp_path / "none").exists()
    assert "needs at least one RUN directory" in capsys.readouterr().err
