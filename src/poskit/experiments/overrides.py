"""Dotted `key=value` overrides of a config dict: the trailing arguments of `poskit train`, `compare` and
`reproduce`, and how a reproduction applies its variants."""
from __future__ import annotations

from poskit.encodings.spec import parse_value, typed_option

ENCODING_OPTIONS_KEY = "model.encoding_options."


def apply_overrides(config: dict, overrides: list[str]) -> dict:
    """Apply `a.b.c=value` overrides to a nested config dict (in place; returns it). Values are JSON where they
    parse, else text. Unknown top-level or model keys are left for the config classes to reject with the list
    of allowed fields. Encoding options are typed for the encoding the config ends up with, by the encoding
    spec's rule (a bool option's true/false/1/0/yes/no becomes a bool)."""
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
            config["model"]["encoding_options"][option] = typed_option(encoding, option, text)
    return config
