"""Every registered encoding class documents itself: what it computes, the paper it comes from, and each of
its options with the default build_encoding uses."""
import inspect

import pytest

import poskit
from poskit.encodings.base import _REGISTRY, encoding_class


def _own_doc(cls) -> str:
    return inspect.cleandoc(cls.__dict__.get("__doc__") or "")  # its own, not the base class's


@pytest.mark.parametrize("name", poskit.available_encodings())
def test_class_docstring_names_its_paper_and_every_option_with_its_default(name):
    cls, fixed = _REGISTRY[name]
    doc = _own_doc(cls)
    assert len(doc.splitlines()) >= 3, f"{cls.__name__} has no docstring beyond a line"
    paper = [line for line in doc.splitlines() if line.startswith("Paper:")]
    assert paper and len(paper[0]) > len("Paper: ") + 10, f"{cls.__name__}'s docstring names no paper"
    assert "Options (defaults)" in doc
    params = inspect.signature(cls.__init__).parameters
    for option, p in params.items():
        if p.kind != p.KEYWORD_ONLY or option in ("head_dim", "num_heads") or option in fixed:
            continue
        expected = f"{option} (required)" if p.default is inspect.Parameter.empty else f"{option}={p.default!r}"
        assert expected in doc, f"{cls.__name__}'s docstring does not document {expected}"


def test_the_rope_variants_share_one_documented_class():
    assert {encoding_class(n) for n in poskit.available_encodings() if n.startswith("rope")} == {
        encoding_class("rope")}
