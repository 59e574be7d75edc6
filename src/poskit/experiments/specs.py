"""Parsing of the command line's small languages: encoding specs and dotted `key=value` overrides."""
from __future__ import annotations

import json

import poskit


def parse_value(text: str):
    """JSON when it parses (numbers, true/false/null, lists, dicts), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_encoding_spec(spec: str) -> tuple[str, str, dict]:
    """"pope:delta_init=uniform:base=500" -> (label "pope:delta_init=uniform:base=500", "pope", options)."""
    name, *opts = spec.strip().split(":")
    if name not in poskit.available_encodings():
        raise ValueError(f"encodings must name one of {poskit.available_encodings()}, got {name!r}")
    options = {}
    for o in opts:
        if "=" not in o:
            raise ValueError(f"encoding option must look like key=value, got {o!r} in {spec!r}")
        k, v = o.split("=", 1)
        options[k] = parse_value(v)
    return spec.strip(), name, options


def parse_encodings(text: str) -> list[tuple[str, str, dict]]:
    specs = [parse_encoding_spec(s) for s in text.split(",") if s.strip()]
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
    model keys are left for the config classes to reject with the list of allowed fields."""
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
    return config


def safe_label(label: str) -> str:
    """A directory name for an encoding label."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
