"""Loading and saving a PoskitForCausalLM strictly: a missing or unexpected tensor is an error naming it (never
uninitialised memory), initialised weights only when asked for, and save_pretrained onto a file raises."""
import json

import pytest

from extras import need
import torch

need("transformers", "hf", "transformers (for poskit.hf)")
pytestmark = pytest.mark.usefixtures("one_thread")

from safetensors.torch import load_file, save_file  # noqa: E402

from hf_helpers import VOCAB, hf_model  # noqa: E402
from poskit.hf import PoskitForCausalLM, to_poskit  # noqa: E402


def _saved(tmp_path, encoding="rope", **kw):
    model = hf_model(encoding, dtype=None, **kw)
    model.save_pretrained(tmp_path)
    return model


def _edit_weights(directory, edit):
    weights = load_file(directory / "model.safetensors")
    edit(weights)
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})


def _edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_a_missing_tensor_is_an_error_naming_it(tmp_path):
    from transformers import AutoModelForCausalLM

    _saved(tmp_path)
    _edit_weights(tmp_path, lambda w: w.pop("model.norm.weight"))
    with pytest.raises(ValueError, match=r"model\.norm\.weight.*init_missing_weights=True"):
        PoskitForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"cannot load a poskit model from .*model\.norm\.weight"):
        to_poskit(tmp_path)


def test_an_unexpected_tensor_is_an_error_naming_it(tmp_path):
    _saved(tmp_path)
    _edit_weights(tmp_path, lambda w: w.__setitem__("model.extra.weight", torch.zeros(3)))
    with pytest.raises(ValueError, match=r"unexpected.*model\.extra\.weight"):
        PoskitForCausalLM.from_pretrained(tmp_path)


def test_an_encoding_edited_in_config_json_is_refused_naming_the_tensors_it_lacks(tmp_path):
    # rope -> pope: PoPE's phase bias is in no saved tensor; it must not load as whatever memory held
    _saved(tmp_path, "rope")
    _edit_config(tmp_path, position_encoding="pope")
    with pytest.raises(ValueError, match=r"model\.blocks\.0\.attn\.encoding\.delta"):
        PoskitForCausalLM.from_pretrained(tmp_path)


def test_pope_to_rope_is_refused_naming_the_unexpected_phase_bias(tmp_path):
    _saved(tmp_path, "pope")
    _edit_config(tmp_path, position_encoding="rope", position_encoding_options={})
    with pytest.raises(ValueError, match=r"unexpected.*encoding\.delta"):
        PoskitForCausalLM.from_pretrained(tmp_path)


def test_missing_tensors_are_initialised_as_a_new_model_only_on_opt_in(tmp_path):
    from poskit.models import Transformer

    model = _saved(tmp_path, "pope")
    _edit_weights(tmp_path, lambda w: (w.pop("model.norm.weight"), w.pop("model.blocks.1.attn.encoding.delta")))
    torch.manual_seed(7)
    loaded, info = PoskitForCausalLM.from_pretrained(tmp_path, init_missing_weights=True, output_loading_info=True)
    assert info["missing_keys"] == {"model.norm.weight", "model.blocks.1.attn.encoding.delta"}
    torch.manual_seed(7)
    fresh = Transformer(model.config.to_model_config())  # what a newly built model has at that seed
    assert torch.equal(loaded.model.norm.weight, fresh.norm.weight)
    assert torch.equal(loaded.model.blocks[1].attn.encoding.delta, fresh.blocks[1].attn.encoding.delta)
    assert not torch.equal(fresh.blocks[1].attn.encoding.delta, model.model.blocks[1].attn.encoding.delta)
    # the saved tensors load unchanged
    assert torch.equal(loaded.model.blocks[0].attn.encoding.delta, model.model.blocks[0].attn.encoding.delta)
    assert torch.equal(loaded.model.head.weight, model.model.head.weight)


def test_tied_embeddings_are_not_reported_missing(tmp_path):
    model = _saved(tmp_path, "rope", tie_word_embeddings=True)
    loaded = PoskitForCausalLM.from_pretrained(tmp_path)  # strict, and the head is the embedding
    assert loaded.model.head.weight is loaded.model.embed.weight
    ids = torch.randint(1, VOCAB, (1, 5))
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_save_pretrained_onto_a_file_raises_and_writes_nothing(tmp_path):
    model = hf_model("rope", dtype=None)
    target = tmp_path / "weights.bin"
    target.write_bytes(b"keep me")
    with pytest.raises(ValueError, match=r"save_directory .*weights\.bin.* is a file"):
        model.save_pretrained(target)
    with pytest.raises(ValueError, match=r"save_directory .*weights\.bin.* is a file"):
        model.save_pretrained(target / "sub")
    assert target.read_bytes() == b"keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["weights.bin"]
