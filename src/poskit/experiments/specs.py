"""Parsing of the command line's small languages: encoding specs and dotted `key=value` overrides."""
from __future__ import annotations

import inspect
import json

import poskit

# the command line's words for a boolean encoding option (any case)
BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
ENCODING_OPTIONS_KEY = "model.encoding_options."


def parse_value(text: str):
    """JSON when it parses (numbers, true/false/null, lists, dicts), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def is_bool_option(encoding: str, key: str) -> bool:
    """Whether option `key` of encoding `encoding` is declared bool by its constructor (the registry's class;
    with postponed annotations the annotation is the string "bool")."""
    from poskit.encodings.base import _REGISTRY

    if encoding not in _REGISTRY:
        return False  # an unknown encoding is refused, with the list of names, where the config is checked
    param = inspect.signature(_REGISTRY[encoding][0].__init__).parameters.get(key)
    return param is not None and param.annotation in (bool, "bool")


def parse_encoding_option(encoding: str, key: str, text: str):
    """The value of encoding option `key` typed on the command line: a real bool for a bool option (from
    true/false/1/0/yes/no, any case; anything else is refused naming the option), else `parse_value`."""
    if not is_bool_option(encoding, key):
        return parse_value(text)
    word = text.strip().lower()
    if word not in BOOL_WORDS:
        raise ValueError(f"encoding option {encoding}:{key} must be true or false (true/false/1/0/yes/no, any "
                         f"case), got {text!r}")
    return BOOL_WORDS[word]


def split_top_level(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside brackets, so that a list or object value ("slopes=[0.5,0.25]") stays whole."""
    parts, depth, current = [], 0, []
    for ch in text:
        depth += (ch in "[{") - (ch in "]}")
        if depth < 0:
            raise ValueError(f"encodings: unbalanced brackets in {text!r}")
        if ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ValueError(f"encodings: unbalanced brackets in {text!r}")
    return parts + ["".join(current)]


def parse_encoding_spec(spec: str) -> tuple[str, str, dict]:
    """"pope:delta_init=uniform:base=500" -> (label "pope:delta_init=uniform:base=500", "pope", options)."""
    name, *opts = split_top_level(spec.strip(), ":")
    if name not in poskit.available_encodings():
        raise ValueError(f"encodings must name one of {poskit.available_encodings()}, got {name!r}")
    options = {}
    for o in opts:
        if "=" not in o:
            raise ValueError(f"encoding option must look like key=value, got {o!r} in {spec!r}")
        k, v = o.split("=", 1)
        options[k] = parse_encoding_option(name, k, v)
    return spec.strip(), name, options


def parse_encodings(text: str) -> list[tuple[str, str, dict]]:
    specs = [parse_encoding_spec(s) for s in split_top_level(text, ",") if s.strip()]
    if not specs:
        raise ValueError("encodings must list at least one encoding, e.g. rope,pope")
    labels = [s[0] for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"encodings must not repeat, got {labels}")
    return specs


def parse_ints(text: str, name: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"{name} must be a comma-separated list of integers, got {text!r}") from None
    if not values:
        raise ValueError(f"{name} must list at least one integer, got {text!r}")
    return values


def apply_overrides(config: dict, overrides: list[str]) -> dict:
    """Apply `a.b.c=value` overrides to a nested config dict (in place; returns it). Unknown top-level or
    model keys are left for the config classes to reject with the list of allowed fields. Encoding options
    are typed for the encoding the config ends up with (`parse_encoding_option`: bool options become bools)."""
    typed_later = {}  # encoding option -> its text, typed once the encoding is known
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"overrides must look like key=value (e.g. model.d_model=64 or lr=1e-3), got {item!r}")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = config
        for p in parts[:-1]:
            if node.get(p) is None:
                node[p] = {}
            if not isinstance(node[p], dict):
                raise ValueError(f"override {key!r}: {p!r} is not a group of settings")
            node = node[p]
        node[parts[-1]] = parse_value(value)
        if key.strip().startswith(ENCODING_OPTIONS_KEY) and len(parts) == 3:
            typed_later[parts[-1]] = value
    if typed_later:
        from poskit.models import ModelConfig

        encoding = (config.get("model") or {}).get("encoding", ModelConfig.__dataclass_fields__["encoding"].default)
        for option, text in typed_later.items():
            config["model"]["encoding_options"][option] = parse_encoding_option(encoding, option, text)
    return config


def safe_label(label: str) -> str:
    """A directory name for an encoding label."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
