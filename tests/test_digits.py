"""The digits ViT demo: the split, the image transforms, the model's positions, and a resumable tiny run."""
import json

import pytest
import torch
from extras import need

need("sklearn", "vision", "scikit-learn (the digits demo)")

from poskit.data.digits import load_digits_splits, on_canvas, upsample  # noqa: E402
from poskit.models.vit import ViT, patch_positions  # noqa: E402


@pytest.fixture(scope="module")
def digits():
    return load_digits_splits()


def test_split_is_disjoint_complete_stratified_and_fixed(digits):
    from sklearn.datasets import load_digits

    raw = load_digits()
    n = {s: len(y) for s, y in digits.labels.items()}
    assert sum(n.values()) == len(raw.target)
    # every image lands in exactly one split: compare the flattened images as a multiset
    seen = sorted(tuple(img.flatten().tolist()) for x in digits.images.values() for img in (x * 16).round().long())
    want = sorted(tuple(img.flatten().astype(int).tolist()) for img in raw.images)
    assert seen == want
    for c in range(10):
        total = int((torch.tensor(raw.target) == c).sum())
        assert abs(int((digits.labels["train"] == c).sum()) - 0.6 * total) <= 1
    again = load_digits_splits()
    assert torch.equal(again.labels["test"], digits.labels["test"])


def test_upsample_and_canvas(digits):
    x = digits.images["test"][:3]
    assert upsample(x, 16).shape == (3, 1, 16, 16) and torch.equal(upsample(x, 8), x)
    c = on_canvas(x, 16)
    assert torch.equal(c[:, :, 4:12, 4:12], x)
    assert c.sum() == x.sum()  # nothing outside the digit


def test_patch_positions_are_row_column_in_raster_order():
    pos = patch_positions(3)
    assert pos.tolist() == [[r, c] for r in range(3) for c in range(3)]


@pytest.mark.parametrize("encoding", ["none", "learned", "rope", "pope"])
def test_vit_takes_larger_images(encoding, digits):
    model = ViT(encoding=encoding, dim=16, heads=2)
    for size in (8, 16):
        assert model(upsample(digits.images["test"][:4], size)).shape == (4, 10)


def test_learned_table_is_used_unchanged_at_the_training_grid():
    model = ViT(encoding="learned", dim=16, heads=2)
    assert torch.equal(model.position_table(4), model.table.reshape(16, 16))
    big = model.position_table(8)
    assert big.shape == (64, 16)


@pytest.mark.parametrize("encoding", ["rope", "pope"])
def test_axial_positions_reach_attention(encoding):
    # moving a patch to another place changes the logits with axial positions; without positions (mean pooling
    # of a bag of patches) a permutation of the patches changes nothing
    torch.manual_seed(0)
    x = torch.rand(2, 1, 8, 8)
    moved = x.clone()
    moved[:, :, 0:2, 0:2], moved[:, :, 6:8, 6:8] = x[:, :, 6:8, 6:8], x[:, :, 0:2, 0:2]  # swap two patches
    model = ViT(encoding=encoding, dim=16, heads=2).double()
    assert model.blocks[0].attn.encoding.position_coords == 2
    assert not torch.allclose(model(x.double()), model(moved.double()), atol=1e-6)
    bag = ViT(encoding="none", dim=16, heads=2).double()
    assert torch.allclose(bag(x.double()), bag(moved.double()), atol=1e-12)


def test_bad_arguments():
    with pytest.raises(ValueError, match="encoding must be one of"):
        ViT(encoding="alibi")
    with pytest.raises(ValueError, match="dim must be a multiple of 4 \\* heads"):
        ViT(encoding="rope", dim=12, heads=2)
    with pytest.raises(ValueError, match="images must be \\(B, 1, S, S\\)"):
        ViT(encoding="rope", dim=16, heads=2)(torch.zeros(1, 1, 7, 7))


@pytest.mark.slow
def test_tiny_run_is_resumable(tmp_path, monkeypatch):
    import poskit.experiments.digits as demo

    settings = demo.DigitsSettings(encodings=("none", "rope"), seeds=(0,), epochs=1, dim=16, heads=2,
                                   eval_sizes=(8, 16))
    first = demo.run_digits(settings, tmp_path, quiet=True)
    assert set(first["encodings"]) == {"none", "rope"}
    assert 0.0 <= first["encodings"]["rope"]["test@16"]["mean"] <= 1.0
    assert (tmp_path / "digits_vit.png").exists() and "rope" in (tmp_path / "results.md").read_text()
    from poskit.report.record import read_record

    record = read_record(tmp_path / "results.json")  # the results record, beside the summary's fields
    assert (record.kind, record.name) == ("demo", "digits") and record.details["encodings"] == first["encodings"]
    run = record.measurements["groups"][""]["rope"][0]
    assert run["run"] == "rope/seed0" and run["splits"]["test@16"]["accuracy"] == first["encodings"]["rope"]["test@16"]["mean"]
    assert record.arguments == {"encodings": ["none", "rope"], "seeds": [0], "epochs": 1, "dim": 16, "heads": 2,
                                "eval_sizes": [8, 16]}

    def no_training(*a, **k):
        raise AssertionError("a finished run was trained again")

    from poskit.training.loop import Trainer

    monkeypatch.setattr(Trainer, "run", no_training)  # a finished run returns its result.json
    again = demo.run_digits(settings, tmp_path, quiet=True)
    assert again["encodings"]["rope"]["test@8"] == first["encodings"]["rope"]["test@8"]
    result = tmp_path / "rope" / "seed0" / "result.json"
    data = json.loads(result.read_text())
    data["settings"]["epochs"] = 99
    result.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="written with other settings"):
        demo.run_digits(settings, tmp_path, quiet=True)


def test_bad_settings_name_the_setting(tmp_path):
    import poskit.experiments.digits as demo

    with pytest.raises(ValueError, match="encodings must be among"):
        demo.run_digits(demo.DigitsSettings(encodings=("alibi",)), tmp_path)
    with pytest.raises(ValueError, match="eval_sizes must be multiples of patch=2"):
        demo.run_digits(demo.DigitsSettings(eval_sizes=(8, 11)), tmp_path)
    assert not any(tmp_path.iterdir())  # refused before writing anything
