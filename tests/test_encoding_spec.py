"""EncodingSpec: one parser, one bool rule, one error format, a label that round-trips, and a build that equals
build_encoding's (the command line's flags are tested through `poskit` in test_cli.py)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import poskit
from poskit.encodings.base import (PositionalEncoding, _bool_options, _dict_options, _optional_bool_options,
                                   encoding_class, register, unregister)
from poskit.encodings.spec import BOOL_WORDS, EncodingSpec, SpecError, allowed_options


def test_parse_types_numbers_lists_objects_strings_and_bools():
    spec = EncodingSpec.parse(" cope-alibi:slopes=[0.5,0.25]:p_max=8 ")
    assert (spec.name, spec.options, spec.label) == ("cope-alibi", {"slopes": [0.5, 0.25], "p_max": 8},
                                                     "cope-alibi:slopes=[0.5,0.25]:p_max=8")
    assert EncodingSpec.parse("pope:delta_init=uniform:base=500").options == {"delta_init": "uniform", "base": 500}
    assert EncodingSpec.parse("pope:softplus=no").options == {"softplus": False}
    assert EncodingSpec.parse('rope:layout="a:b"').options == {"layout": "a:b"}  # quotes keep a colon
    assert EncodingSpec.parse("rope").options == {} and str(EncodingSpec.parse("rope")) == "rope"


def test_parse_list_keeps_brackets_whole_and_types_each_spec():
    specs = EncodingSpec.parse_list("rope,cope-alibi:slopes=[0.5,0.25]:p_max=8,pope:softplus=no")
    assert [(s.label, s.name, s.options) for s in specs] == [
        ("rope", "rope", {}), ("cope-alibi:slopes=[0.5,0.25]:p_max=8", "cope-alibi", {"slopes": [0.5, 0.25], "p_max": 8}),
        ("pope:softplus=no", "pope", {"softplus": False})]


@pytest.mark.parametrize("word", sorted(BOOL_WORDS) + ["TRUE", "No", " yes "])
def test_one_bool_rule_for_bool_options(word):
    expected = BOOL_WORDS[word.strip().lower()]
    assert EncodingSpec.parse(f"pope:softplus={word}").options["softplus"] is expected
    assert EncodingSpec.from_config("pope", {"softplus": word}).options["softplus"] is expected
    assert EncodingSpec.from_config("pope", {"softplus": expected}).options["softplus"] is expected


@pytest.mark.parametrize("value", ["maybe", "2", "", 1, 0, None])
def test_a_bool_option_refuses_anything_else(value):
    with pytest.raises(SpecError, match=r"encoding option pope:softplus must be true or false \(true/false/1/0/yes/"
                                        r"no, any case\), got"):
        EncodingSpec.from_config("pope", {"softplus": value})


def test_the_bool_rule_is_the_one_build_encoding_checks():
    """An option defaulting to a bool without a `bool` annotation is a bool option for the spec as it is for
    build_encoding: one rule, so that "yes" typed on the command line reaches the encoding as True, not as text."""

    class Toggle(PositionalEncoding):
        kind = "none"

        def __init__(self, *, head_dim, num_heads, flag=False):  # noqa: ANN001 (no annotation on purpose)
            super().__init__(head_dim=head_dim, num_heads=num_heads)
            self.flag = flag

    register("toy-toggle")(Toggle)
    try:
        spec = EncodingSpec.parse("toy-toggle:flag=yes")
        assert spec.options == {"flag": True}
        assert spec.build(head_dim=4, num_heads=1).flag is True
        with pytest.raises(ValueError, match="flag must be true or false"):  # build_encoding: a real bool only
            poskit.build_encoding("toy-toggle", head_dim=4, num_heads=1, flag="yes")
    finally:
        unregister("toy-toggle")


@pytest.mark.parametrize("text,needle", [
    ("rope:base=100:base=200", "encoding option rope:base must be given once, got ['100', '200'] "
                               "(in 'rope:base=100:base=200')"),
    ("rotary", "encoding must be one of ["),
    ("", "encoding must be one of ["),
    (":base=1", "encoding must be one of ["),
    ("rope:bogus=1", "encoding option rope:bogus must be one of rope's options ['attention_factor', 'axial_dims', "
                     "'base'"),
    ("relative-capped:cap=true", "encoding option relative-capped:cap must be one of"),  # fixed by the registration
    ("rope:head_dim=8", "encoding option rope:head_dim must be one of"),  # the model's, never the spec's
    ("rope:base", "encoding option must be key=value, got 'base' (in 'rope:base')"),
    ("rope:=3", "encoding option must be key=value, got '=3'"),
    ("cope-alibi:slopes=[0.5,0.25", "encoding spec must be free of unbalanced brackets"),
    ("cope-alibi:slopes=0.5]", "encoding spec must be free of unbalanced brackets"),
    ('rope:layout="a', "encoding spec must be free of unbalanced brackets and quotes"),
])
def test_bad_specs_are_one_line_naming_the_argument_the_option_and_what_is_allowed(text, needle):
    with pytest.raises(SpecError) as e:
        EncodingSpec.parse(text, arg="--encodings")
    message = str(e.value)
    assert message.startswith("--encodings: ") and needle in message and "\n" not in message, message


@pytest.mark.parametrize("text,needle", [("rope,rope", "the list must be distinct specs (each is one run), got "
                                                       "['rope', 'rope']"),
                                         ("pope:softplus=no,pope:softplus=false", "must be distinct specs"),
                                         (" , ", "the list must be at least one encoding")])
def test_bad_lists(text, needle):
    with pytest.raises(SpecError, match=needle.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        EncodingSpec.parse_list(text, arg="--encodings")


def test_without_an_argument_the_error_starts_with_its_subject():
    with pytest.raises(SpecError, match=r"^encoding must be one of \["):
        EncodingSpec.parse("rotary")
    with pytest.raises(SpecError, match=r"^encodings must be at least one encoding"):
        EncodingSpec.parse_list("")


def test_config_pair_round_trip_and_equality():
    spec = EncodingSpec.parse("pope:delta_init=uniform:softplus=0")
    assert spec.to_config() == ("pope", {"delta_init": "uniform", "softplus": False})
    again = EncodingSpec.from_config(*spec.to_config())
    assert again == spec and hash(again) == hash(spec) and again.label == "pope:delta_init=uniform:softplus=false"
    assert EncodingSpec.parse(again.label) == spec
    assert EncodingSpec.of("rope") == EncodingSpec("rope") and EncodingSpec.of(spec) is spec
    spec.options["base"] = 3  # the options are a copy: the spec never changes
    assert "base" not in spec.options


def test_allowed_options_are_what_build_encoding_accepts():
    for name in poskit.available_encodings():
        allowed = allowed_options(name)
        assert "head_dim" not in allowed and "dim" not in allowed
        bogus = "not_an_option"
        with pytest.raises(ValueError, match=r"allowed options: (\[.*\])") as e:
            poskit.build_encoding(name, head_dim=8, num_heads=2, dim=16, **{bogus: 1})
        assert str(sorted(allowed)) in str(e.value)


def test_build_equals_build_encoding():
    spec = EncodingSpec.parse("pope:delta_init=uniform:base=500")
    torch.manual_seed(0)
    built = spec.build(head_dim=8, num_heads=2)
    torch.manual_seed(0)
    direct = poskit.build_encoding("pope", head_dim=8, num_heads=2, delta_init="uniform", base=500)
    assert built.name == "pope" and built.base == direct.base
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(), direct.state_dict().values()))
    assert EncodingSpec.parse("learned").build(head_dim=8, num_heads=2, dim=16).kind == "absolute"


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
_VALUES = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                    st.none(), _TEXT, st.lists(st.integers(-9, 9), max_size=3),
                    st.dictionaries(st.text("abc", min_size=1, max_size=3), st.integers(0, 9), max_size=2))


def test_nan_and_infinity_in_a_spec_stay_text_and_round_trip():
    # Python's JSON reader takes NaN and Infinity; a NaN option then wrote a label no reader takes (a ValueError
    # from json.dumps instead of a spec)
    from poskit.encodings.spec import parse_value

    assert [parse_value(t) for t in ("NaN", "Infinity", "-Infinity", "[1,NaN]")] == \
        ["NaN", "Infinity", "-Infinity", "[1,NaN]"]
    spec = EncodingSpec("cope", {"gates": "NaN"})
    assert spec.options == {"gates": "NaN"} and EncodingSpec.parse(spec.label) == spec


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_property_a_label_parses_back_to_an_equal_spec(data):
    name = data.draw(st.sampled_from([n for n in poskit.available_encodings() if allowed_options(n)]))
    keys = data.draw(st.lists(st.sampled_from(allowed_options(name)), unique=True, max_size=3))
    options = {}
    for key in keys:
        cls = encoding_class(name)
        if key in _bool_options(cls):
            values = st.booleans()
        elif key in _optional_bool_options(cls):  # true, false or None (the encoding's default)
            values = st.one_of(st.booleans(), st.none())
        elif key in _dict_options(cls):  # a JSON object (or None)
            values = st.one_of(st.none(), st.dictionaries(st.text("abc", min_size=1, max_size=3), _VALUES, max_size=2))
        else:
            values = _VALUES
        options[key] = data.draw(values)
    spec = EncodingSpec(name, options)
    back = EncodingSpec.parse(spec.label)
    assert back == spec and back.options == spec.options and back.label == spec.label
    assert EncodingSpec.parse_list(f"{spec.label},none") == [spec, EncodingSpec("none")]
