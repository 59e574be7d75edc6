"""Native Llama both ways (poskit.hf.llama): a poskit decoder with Llama's architecture exported as transformers'
own LlamaForCausalLM (loaded by AutoModelForCausalLM without poskit's classes) computes poskit's logits and
greedy generations, for both RoPE layouts, GQA and plain heads, tied and untied embeddings, biases and the
scaled RoPE variants; a model Llama cannot express is refused naming the field; `poskit export --format llama`
writes such a directory from a run; a random LlamaForCausalLM loads into poskit with HF's logits; its RoPE can
then be swapped (context extension), equal to the original at factor 1."""
import json

import pytest
import torch
from extras import need
from hypothesis import given, settings
from hypothesis import strategies as st

need("transformers", "hf", "transformers (poskit.hf needs it)")
pytestmark = pytest.mark.usefixtures("one_thread")

from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

from poskit.cli import build_parser, main  # noqa: E402
from poskit.hf.config import mlp_width  # noqa: E402
from poskit.hf.llama import (export_llama, from_llama, llama_config, model_config_from_llama,  # noqa: E402
                             to_llama, with_rope)
from poskit.models import ModelConfig, Transformer  # noqa: E402
from poskit.training import TrainConfig  # noqa: E402
from poskit.training.run import load_run, train  # noqa: E402
from thread_helpers import single_thread  # noqa: E402

VOCAB, T = 40, 24
# Weights drawn with std 0.2 (not the usual 0.02): attention scores then are O(1), so the softmax is far from
# uniform and a wrong RoPE frequency shows (rope-yarn at factor 3.9 instead of 4 moves the largest logit, about
# 4, by 3e-2); poskit and its Llama agree to within 1.1e-6 of the largest logit in float32 (measured over these
# cases). The bound leaves room for other summation orders and HF's float32 frequencies (poskit's are float64).
INIT_STD = 0.2
REL = 1e-5


def assert_logits_close(ours, theirs):
    err, scale = (ours - theirs).abs().max().item(), ours.abs().max().item()
    assert err <= REL * scale, f"largest difference {err:.3g} for logits up to {scale:.3g}"

LLAMA3 = {"factor": 8.0, "original_max_positions": 8, "low_freq_factor": 1.0, "high_freq_factor": 4.0}

# name -> ModelConfig fields beside the tiny Llama-compatible defaults of `poskit_model`
CASES = {
    "interleaved, plain heads, untied": dict(),
    "half, GQA, tied": dict(encoding_options={"layout": "half"}, n_kv_heads=2, tie_embeddings=True),
    "interleaved, one kv head, head_dim given": dict(n_kv_heads=1, head_dim=12),
    "biases": dict(bias=True, n_kv_heads=2),
    "rope-linear": dict(encoding="rope-linear", encoding_options={"factor": 2.0}),
    "rope-yarn": dict(encoding="rope-yarn", encoding_options={"factor": 4.0, "original_max_positions": 8},
                      n_kv_heads=2),
    "rope-llama3, half": dict(encoding="rope-llama3", encoding_options={**LLAMA3, "layout": "half"}),
    "rope base by its HF name": dict(encoding_options={"rope_theta": 500.0}),
    "rope-dynamic": dict(encoding="rope-dynamic", encoding_options={"factor": 2.0, "original_max_positions": 8}),
    "rope-longrope": dict(encoding="rope-longrope", encoding_options={
        "factor": 4.0, "original_max_positions": 8, "short_factor": [1.0, 1.1, 1.3, 1.6],
        "long_factor": [1.0, 2.0, 3.0, 4.0]}),
}
# HF caches keys rotated at the step that produced them; poskit re-rotates them when the frequencies change
# with the length (the module's docstring): cached generation past the original context may differ
LENGTH_DEPENDENT = {"rope-dynamic", "rope-longrope"}


def poskit_model(seed=0, **fields):
    torch.manual_seed(seed)
    base = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, mlp="swiglu", encoding="rope", init_std=INIT_STD)
    model = Transformer(ModelConfig(**{**base, **fields})).eval()
    with torch.no_grad():  # RMSNorm weights off 1 so that a swapped norm would show
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "norm.weight":
                p.uniform_(0.5, 1.5)
    return model


def ids(seed=1, batch=2, length=T):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def saved_and_loaded(hf, tmp_path):
    hf.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)  # transformers' own classes, no trust_remote_code
    assert type(loaded) is LlamaForCausalLM
    return loaded.eval()


# -- export ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_the_exported_llama_computes_poskit_s_logits_and_greedy_generations(case, tmp_path):
    model = poskit_model(**CASES[case])
    llama = saved_and_loaded(to_llama(model), tmp_path)
    x = ids()
    with torch.no_grad():
        assert_logits_close(model(x), llama(x).logits)
    if case in LENGTH_DEPENDENT:
        return
    prompt = x[:, :6]
    assert torch.equal(model.generate(prompt, 12),
                       llama.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0))


def test_a_left_padded_batch_generates_alike(tmp_path):
    model = poskit_model(n_kv_heads=2)
    llama = saved_and_loaded(to_llama(model), tmp_path)
    prompt = ids(batch=3, length=7)
    mask = torch.ones_like(prompt)
    mask[0, :3] = 0
    mask[1, :1] = 0
    prompt = prompt.masked_fill(mask == 0, 0)
    ours = model.generate(prompt, 8, attention_mask=mask)
    theirs = llama.generate(prompt, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_the_interleaved_layout_is_permuted_into_llama_s_half_layout_and_nothing_else_is():
    model = poskit_model(n_kv_heads=2)
    state = to_llama(model).state_dict()
    attn = model.blocks[0].attn
    hd = model.config.dim_head
    q = state["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(q, attn.q_proj.weight)
    # head h's half-layout channel i (< hd/2) is its interleaved channel 2i, channel hd/2 + i is 2i + 1
    for h in range(model.config.n_heads):
        assert torch.equal(q[h * hd: h * hd + hd // 2], attn.q_proj.weight[h * hd: (h + 1) * hd: 2])
        assert torch.equal(q[h * hd + hd // 2: (h + 1) * hd], attn.q_proj.weight[h * hd + 1: (h + 1) * hd: 2])
    assert torch.equal(state["model.layers.0.self_attn.v_proj.weight"], attn.v_proj.weight)
    assert torch.equal(state["model.layers.0.self_attn.o_proj.weight"], attn.o_proj.weight)
    half = poskit_model(encoding_options={"layout": "half"})
    assert torch.equal(to_llama(half).state_dict()["model.layers.1.self_attn.k_proj.weight"],
                       half.blocks[1].attn.k_proj.weight)


def test_the_llama_config_says_what_the_model_is():
    cfg = ModelConfig(vocab_size=VOCAB, d_model=48, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16, mlp="swiglu",
                      mlp_ratio=3.0, norm_eps=1e-5, tie_embeddings=True, encoding="rope-yarn",
                      encoding_options={"base": 500.0, "factor": 4.0, "original_max_positions": 16, "beta_fast": 16})
    config = llama_config(cfg)
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (VOCAB, 48, 3)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert config.intermediate_size == mlp_width(cfg) == 96 and config.hidden_act == "silu"
    assert config.rms_norm_eps == 1e-5 and config.tie_word_embeddings is True
    assert config.attention_bias is False and config.mlp_bias is False
    assert config.rope_parameters == {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                                      "original_max_position_embeddings": 16, "beta_fast": 16}
    assert config.max_position_embeddings == 64  # the extended context: 16 x 4
    # Llama's bos/eos defaults (1, 2) would stop generation at those ids of a poskit vocabulary
    assert config.bos_token_id is None and config.eos_token_id is None
    assert llama_config(cfg, max_position_embeddings=32, eos_token_id=3).eos_token_id == 3


def test_rope_dynamic_s_original_context_is_llama_s_max_position_embeddings():
    cfg = ModelConfig(vocab_size=VOCAB, d_model=32, n_heads=4, mlp="swiglu", encoding="rope-dynamic",
                      encoding_options={"factor": 2.0, "original_max_positions": 8})
    config = llama_config(cfg)
    assert config.max_position_embeddings == 8 and config.rope_parameters["rope_type"] == "dynamic"
    assert "original_max_position_embeddings" not in config.rope_parameters
    with pytest.raises(ValueError, match=r"max_position_embeddings=16: for rope-dynamic .* \(8\)"):
        llama_config(cfg, max_position_embeddings=16)


@pytest.mark.parametrize("fields, field, need", [
    (dict(mlp="gelu"), "mlp", "'swiglu'"),
    (dict(encoding="pope"), "encoding", "one of ['rope', 'rope-linear'"),
    (dict(encoding="alibi"), "encoding", "rope-llama3"),
    (dict(encoding="rope-ntk", encoding_options={"factor": 2.0}), "encoding", "rope-ntk has no Hugging Face"),
    (dict(causal=False), "causal", "True"),
    (dict(attention="linear"), "attention", "'softmax'"),
    (dict(encoding_options={"rotary_dim": 4}), "encoding_options", "rotary_dim = head_dim = 8"),
    (dict(encoding_options={"partial_rotary_factor": 0.5}), "encoding_options", "Llama has no partial rotary"),
    (dict(d_model=30, head_dim=8), "d_model", "a multiple of n_heads=4"),
    (dict(mlp="gelu", encoding="pope"), "mlp", "'swiglu'"),  # the first field that differs
])
def test_a_model_llama_cannot_express_is_refused_naming_the_field(fields, field, need):
    cfg = ModelConfig(**{**dict(vocab_size=VOCAB, d_model=32, n_heads=4, mlp="swiglu", encoding="rope"), **fields})
    with pytest.raises(ValueError) as e:
        llama_config(cfg)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{field} must be ") and need in message, message
    assert "LlamaForCausalLM" in message


def test_a_model_whose_layers_do_not_share_one_rope_is_refused():
    model = poskit_model(n_layers=3)
    other = poskit_model(n_layers=3, encoding_options={"base": 500.0})
    model.blocks[2].attn.encoding = other.blocks[2].attn.encoding
    with pytest.raises(ValueError, match=r"layer 2's encoding is 'rope' \(.*base=500.0.*\), not the model's 'rope'"):
        to_llama(model)


def test_architecture_fields_come_from_the_model_only():
    with pytest.raises(ValueError, match=r"\['hidden_size'\] come from the poskit model"):
        to_llama(poskit_model(), hidden_size=64)
    with pytest.raises(ValueError, match="model must be a poskit.models.Transformer"):
        to_llama(LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                              num_attention_heads=2)))


def test_export_consumes_nothing_of_the_caller_s_random_stream():
    model = poskit_model()
    torch.manual_seed(5)
    to_llama(model)
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))


# -- the command -------------------------------------------------------------------------------------------

def _train(root, name, **model_fields):
    d = root / "runs" / name
    cfg = TrainConfig.from_dict(dict(
        task="flip-flop", task_options={"length": 16, "eval_size": 16, "eval_batch_size": 16},
        model={"d_model": 16, "n_layers": 1, "n_heads": 2, "encoding": "rope", **model_fields},
        batch_size=4, max_steps=2, warmup_steps=1, eval_every=2, log_every=2, checkpoint_every=2))
    with single_thread():
        train(cfg, d, quiet=True)
    return d


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("project")
    return {"llama": _train(root, "llama", mlp="swiglu", n_kv_heads=1, encoding_options={"base": 500.0}),
            "gelu": _train(root, "gelu")}


def test_poskit_export_format_llama_writes_a_native_llama_of_the_run(runs, tmp_path, capsys):
    out = tmp_path / "llama"
    assert main(["export", str(runs["llama"]), "--hf", str(out), "--format", "llama"]) == 0
    assert "native LlamaForCausalLM" in capsys.readouterr().out
    model, task, _ = load_run(runs["llama"])
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["max_position_embeddings"] == task.max_input_len and config["pad_token_id"] == task.vocab.pad_id
    assert "auto_map" not in config and not (out / "poskit_auto.py").exists()
    info = json.loads((out / "poskit_run.json").read_text())
    assert info["vocab"]["tokens"] == list(task.vocab.tokens) and info["task"] == task.name
    llama = AutoModelForCausalLM.from_pretrained(out).eval()
    x = torch.randint(0, model.config.vocab_size, (2, task.max_input_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_logits_close(model(x), llama(x).logits)


def test_export_llama_refuses_a_run_llama_cannot_express_in_one_line_writing_nothing(runs, tmp_path, capsys):
    out = tmp_path / "llama"
    with pytest.raises(SystemExit) as e:
        main(["export", str(runs["gelu"]), "--hf", str(out), "--format", "llama", "--quiet"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.mlp must be 'swiglu'" in err[0] and "got 'gelu'" in err[0], err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_export_llama_keeps_export_s_destination_guards(runs, capsys):
    with pytest.raises(ValueError, match="--hf directory .* is inside the run"):
        export_llama(runs["llama"], runs["llama"] / "hf")
    assert not (runs["llama"] / "hf").exists()


def test_the_default_format_is_still_poskit():
    assert build_parser().parse_args(["export", "RUN", "--hf", "DIR"]).format == "poskit"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["export", "RUN", "--hf", "DIR", "--format", "gguf"])


# -- import ------------------------------------------------------------------------------------------------

def llama_dir(tmp_path, seed=0, **fields):
    """A tiny random LlamaForCausalLM saved with save_pretrained (biases and norms off their initial values)."""
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=44, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
                initializer_range=INIT_STD)
    torch.manual_seed(seed)
    llama = LlamaForCausalLM(LlamaConfig(**{**base, **fields})).eval()
    with torch.no_grad():
        for name, p in llama.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.uniform_(0.5, 1.5)
    llama.save_pretrained(tmp_path)
    return tmp_path, llama


IMPORTS = {
    "default rope": dict(),
    "tied, plain heads": dict(tie_word_embeddings=True, num_key_value_heads=4),
    "biases": dict(attention_bias=True, mlp_bias=True),
    "llama3": dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8}),
    "yarn": dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 16}),
    "older rope_scaling": dict(rope_scaling={"type": "linear", "factor": 2.0}),
    "head_dim given": dict(head_dim=16),
}


@pytest.mark.parametrize("case", list(IMPORTS))
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_a_llama_directory_loads_into_poskit_with_its_logits(case, layout, tmp_path):
    directory, llama = llama_dir(tmp_path, **IMPORTS[case])
    model = from_llama(directory, layout=layout)
    assert isinstance(model, Transformer) and not model.training
    assert model.blocks[0].attn.encoding.layout == layout
    x = ids()
    with torch.no_grad():
        assert_logits_close(model(x), llama(x).logits)


def test_the_imported_rope_is_read_from_the_rope_dict():
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=44, num_hidden_layers=1,
                         num_attention_heads=4, **IMPORTS["llama3"])
    cfg = model_config_from_llama(config)
    assert cfg.encoding == "rope-llama3"
    assert cfg.encoding_options == {"layout": "half", "base": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_positions": 8}
    assert (cfg.mlp, cfg.n_kv_heads, cfg.dim_head, mlp_width(cfg)) == ("swiglu", 4, 8, 44)


@settings(max_examples=40, deadline=None)
@given(hidden=st.integers(1, 40).map(lambda n: 8 * n), width=st.integers(1, 5000))
def test_every_llama_mlp_width_is_reached_exactly(hidden, width):
    config = LlamaConfig(vocab_size=8, hidden_size=hidden, intermediate_size=width, num_hidden_layers=1,
                         num_attention_heads=4)
    assert mlp_width(model_config_from_llama(config)) == width


def test_a_loaded_model_exports_back_to_the_same_weights(tmp_path):
    directory, llama = llama_dir(tmp_path, attention_bias=True, mlp_bias=True)
    for layout in ("half", "interleaved"):
        again = to_llama(from_llama(directory, layout=layout)).state_dict()
        assert sorted(again) == sorted(llama.state_dict())
        assert all(torch.equal(again[k], v) for k, v in llama.state_dict().items())


@settings(max_examples=12, deadline=None)
@given(heads=st.sampled_from([(4, 4), (4, 2), (4, 1), (2, 2)]), head_dim=st.sampled_from([2, 4, 8]),
       layout=st.sampled_from(["interleaved", "half"]), tied=st.booleans(), seed=st.integers(0, 2**16))
def test_poskit_to_llama_and_back_is_the_identity_on_the_weights(heads, head_dim, layout, tied, seed):
    model = poskit_model(seed, n_heads=heads[0], n_kv_heads=heads[1], head_dim=head_dim, d_model=8, n_layers=1,
                         tie_embeddings=tied, encoding_options={"layout": layout})
    back = from_llama(to_llama(model), layout=layout)
    assert back.config.tie_embeddings == tied
    mine, theirs = model.state_dict(), back.state_dict()
    assert sorted(mine) == sorted(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize("fields, key", [
    (dict(attention_bias=True), "attention_bias must be equal to mlp_bias"),
    (dict(mlp_bias=True), "mlp_bias must be equal to attention_bias"),
    (dict(hidden_act="gelu"), "hidden_act must be 'silu'"),
    (dict(rope_parameters={"rope_type": "proportional", "rope_theta": 1e4}), "rope_parameters['rope_type'] must be"),
    (dict(partial_rotary_factor=0.5, rope_theta=1e4), "rope_parameters['partial_rotary_factor'] must be 1.0"),
])
def test_a_llama_config_poskit_cannot_compute_is_refused_naming_the_key_before_reading_weights(fields, key,
                                                                                               tmp_path):
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=44, num_hidden_layers=1,
                         num_attention_heads=4, **fields)
    config.save_pretrained(tmp_path)  # no weights: the refusal comes first
    with pytest.raises(ValueError) as e:
        from_llama(tmp_path)
    assert str(e.value).startswith(key) and "\n" not in str(e.value), str(e.value)


def test_a_directory_of_another_model_or_none_is_refused_naming_it(tmp_path):
    from transformers import MistralConfig

    with pytest.raises(ValueError, match="must hold a saved LlamaForCausalLM"):
        from_llama(tmp_path / "absent")
    MistralConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                  num_attention_heads=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"LlamaConfig \(model_type 'llama'\), got MistralConfig"):
        from_llama(tmp_path)
    with pytest.raises(ValueError, match="layout must be 'half' or 'interleaved'"):
        from_llama(tmp_path, layout="paired")


# -- swapping the encoding (context extension) -------------------------------------------------------------

@pytest.fixture
def imported(tmp_path):
    directory, _ = llama_dir(tmp_path, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    return from_llama(directory)


def test_at_factor_one_a_scaled_rope_computes_what_the_original_does(imported):
    x = ids(length=40)
    with torch.no_grad():
        original = imported(x)
        assert torch.equal(with_rope(imported, "rope-linear:factor=1")(x), original)
        yarn = with_rope(imported, "rope-yarn:factor=1:original_max_positions=16")
        assert_logits_close(original, yarn(x))
        # another layout permutes q/k to match: the same logits up to the order of float32 operations
        interleaved = with_rope(imported, "rope-linear:factor=1:layout=interleaved")
        assert interleaved.blocks[0].attn.encoding.layout == "interleaved"
        assert not torch.equal(interleaved.blocks[0].attn.q_proj.weight, imported.blocks[0].attn.q_proj.weight)
        assert_logits_close(original, interleaved(x))


def test_a_swapped_rope_keeps_the_weights_base_and_layout_and_extends(imported):
    x = ids(length=40)
    extended = with_rope(imported, "rope-yarn:factor=4:original_max_positions=16")
    enc = extended.blocks[0].attn.encoding
    assert (extended.config.encoding, enc.base, enc.layout, enc.factor) == ("rope-yarn", 500.0, "half", 4.0)
    assert not extended.training
    mine, theirs = imported.state_dict(), extended.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    with torch.no_grad():
        out = extended(x)
        assert torch.isfinite(out).all() and not torch.allclose(out, imported(x))
    assert torch.equal(extended.generate(x[:1, :5], 4)[:, :5], x[:1, :5])
    # the exported form of the extended model is a Llama with the yarn rope dict, computing the same logits
    llama = to_llama(extended)
    assert llama.config.rope_parameters["rope_type"] == "yarn"
    with torch.no_grad():
        assert_logits_close(out, llama(x).logits)


def test_with_rope_refuses_what_is_not_a_rope_variant(imported):
    with pytest.raises(ValueError, match="spec must name a RoPE variant .* got 'pope'"):
        with_rope(imported, "pope")
    with pytest.raises(ValueError, match="original_max_positions"):
        with_rope(imported, "rope-yarn:factor=4")
    with pytest.raises(ValueError, match="model's encoding is 'alibi'"):
        with_rope(Transformer(ModelConfig(encoding="alibi")), "rope-linear:factor=2")
