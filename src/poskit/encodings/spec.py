"""`EncodingSpec`: an encoding's name plus its typed options, written "name:key=value:key=value".

    EncodingSpec.parse("pope:delta_init=uniform:base=500")
    EncodingSpec.parse("cope-alibi:slopes=[0.5,0.25]:p_max=8")   # list and object values in brackets
    EncodingSpec.parse_list("rope,pope:softplus=no")              # a comma-separated list of specs

Every command-line flag and config field that names an encoding goes through this one parser, so that each
accepts the same text, types an option the same way and refuses bad input with the same one-line error
(`SpecError`: the argument, the option, what is allowed, what was given, and the spec it was in).

Values are JSON where they parse (numbers, true/false/null, lists, objects), else the text itself. An
option that the encoding declares bool (annotated `bool`, or defaulting to True/False: the rule that
`build_encoding` checks) takes true/false/1/0/yes/no in any case, and becomes a real bool: a word like "no"
must never reach the encoding as a truthy string; one annotated `bool | None` (RoPE's truncate,
rope_interleave) takes null as well. An option annotated `dict` (RoPE's HF dicts rope_scaling,
rope_parameters) is a JSON object in braces: rope:rope_scaling={"rope_type":"linear","factor":2.0}.
A value that must keep `:` or `,` is written in double quotes ("a:b"). A spec's `label` is the text it was parsed from (run directories and result tables are named
by it); a spec made from a name and options gets a canonical label that parses back to an equal spec.
"""
from __future__ import annotations

import json
from typing import Mapping

from ..util.config_check import ConfigError
from . import base
from .base import _REGISTRY, _bool_options, _dict_options, _optional_bool_options, available_encodings, build_encoding

__all__ = ["BOOL_WORDS", "EncodingSpec", "SpecError", "allowed_options", "parse_value", "split_top_level",
           "typed_option"]

# the words a bool option accepts on the command line (any case)
BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
BOOL_REQUIREMENT = "true or false (true/false/1/0/yes/no, any case)"
DICT_REQUIREMENT = 'a JSON object in braces, e.g. {"rope_type":"yarn","factor":4.0}'


class SpecError(ValueError):
    """A bad encoding spec, in one format: "[ARG: ]SUBJECT must be REQUIREMENT, got VALUE[ (in 'SPEC')]"."""

    def __init__(self, subject: str, requirement: str, value, *, spec: str | None = None, arg: str | None = None,
                 option: str | None = None):
        # option: the option key the error is about (None: the name or the spec as a whole), so that a config
        # can name its own field for it ("encoding_options.<option>")
        self.subject, self.requirement, self.value, self.spec, self.arg = subject, requirement, value, spec, arg
        self.option = option
        where = f" (in {spec!r})" if spec is not None and spec != str(value) else ""
        super().__init__(f"{arg + ': ' if arg else ''}{subject} must be {requirement}, got {value!r}{where}")


def _not_json(constant: str):
    raise ValueError(constant)


def parse_value(text: str):
    """JSON when it parses (numbers, true/false/null, lists, objects, quoted strings), else the text itself.
    NaN and Infinity are not JSON (Python's reader takes them by default): they stay text, which the option's
    own check then refuses by name, where a NaN would have been written back as a label no reader takes."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except ValueError:  # json.JSONDecodeError too
        return text


def split_top_level(text: str, sep: str, *, arg: str | None = None) -> list[str]:
    """`text` split at `sep` outside brackets and double quotes, so that a list or object value
    ("slopes=[0.5,0.25]") or a quoted string ("a:b") stays whole."""
    parts, current, depth, quoted, escaped = [], [], 0, False, False
    for ch in text:
        if quoted:
            quoted = escaped or ch != '"'
            escaped = not escaped and ch == "\\"
        elif ch == '"':
            quoted = True
        else:
            depth += (ch in "[{") - (ch in "]}")
            if depth < 0:
                break
            if ch == sep and depth == 0:
                parts.append("".join(current))
                current = []
                continue
        current.append(ch)
    if depth != 0 or quoted:
        raise SpecError("encoding spec", 'free of unbalanced brackets and quotes ([...], {...}, "...")', text,
                        arg=arg)
    return parts + ["".join(current)]


def _check_name(name, spec: str | None, arg: str | None) -> str:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise SpecError("encoding", f"one of {available_encodings()}", name, spec=spec,
                        arg=arg)
    return name


def allowed_options(name: str) -> list[str]:
    """The options a spec of encoding `name` may set: build_encoding's (encodings/base.py), for a known name."""
    return base.allowed_options(_check_name(name, None, None))


def typed_option(name: str, key: str, value, *, spec: str | None = None, arg: str | None = None):
    """The value of option `key` of encoding `name`: text is parsed (`parse_value`, or a bool word for an option
    the encoding declares bool); a bool option accepts only a real bool or one of BOOL_WORDS (and null where it
    is annotated `bool | None`), a dict option only a JSON object. An unknown encoding leaves the value as
    parsed (the name is refused, with the list, where it is checked)."""
    entry = _REGISTRY.get(name)
    cls = entry[0] if entry is not None else None
    optional = cls is not None and key in _optional_bool_options(cls)
    if cls is None or not (key in _bool_options(cls) or optional):
        value = parse_value(value) if isinstance(value, str) else value
        if cls is not None and key in _dict_options(cls) and not isinstance(value, dict) and value is not None:
            raise SpecError(f"encoding option {name}:{key}", DICT_REQUIREMENT, value, spec=spec, arg=arg, option=key)
        return value
    if isinstance(value, bool) or (optional and value is None):
        return value
    word = value.strip().lower() if isinstance(value, str) else None
    if optional and word in ("null", "none"):
        return None
    if word not in BOOL_WORDS:
        requirement = BOOL_REQUIREMENT + (", or null (the encoding's default)" if optional else "")
        raise SpecError(f"encoding option {name}:{key}", requirement, value, spec=spec, arg=arg, option=key)
    return BOOL_WORDS[word]


def _format_value(value) -> str:
    """A value as spec text that `parse_value` reads back as the same value."""
    if isinstance(value, str):
        plain = value == value.strip() and not any(c in value for c in ':,[]{}"') and parse_value(value) == value
        return value if plain and value else json.dumps(value)
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


class EncodingSpec:
    """An encoding name plus options, checked against what the encoding declares: a known name, known option
    keys (each given once), bool options typed by the one bool rule. Values other than bools are checked when
    the encoding is built (`build`), where head_dim and the model's width are known."""

    __slots__ = ("name", "_options", "label")

    def __init__(self, name: str, options: Mapping | None = None, *, label: str | None = None,
                 arg: str | None = None):
        spec = label
        self.name = _check_name(name, spec, arg)
        options = dict(options or {})
        allowed = allowed_options(name)
        typed = {}
        for key, value in options.items():
            if key not in allowed:
                raise SpecError(f"encoding option {name}:{key}", f"one of {name}'s options {allowed}", key,
                                spec=spec, arg=arg, option=key)
            typed[key] = typed_option(name, key, value, spec=spec, arg=arg)
        self._options = typed
        self.label = label if label is not None else name + "".join(f":{k}={_format_value(v)}"
                                                                     for k, v in typed.items())

    @classmethod
    def parse(cls, text: str, *, arg: str | None = None) -> "EncodingSpec":
        """"pope:delta_init=uniform:base=500" -> EncodingSpec; `arg` (e.g. "--encoding") names where the text
        came from in an error."""
        if not isinstance(text, str):
            raise SpecError("encoding spec", "a string like pope:delta_init=uniform", text, arg=arg)
        spec = text.strip()
        name, *items = split_top_level(spec, ":", arg=arg)
        _check_name(name, spec, arg)
        texts: dict[str, list[str]] = {}
        for item in items:
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise SpecError("encoding option", "key=value", item, spec=spec, arg=arg)
            texts.setdefault(key, []).append(value)
        for key, values in texts.items():
            if len(values) > 1:  # the last would silently win
                raise SpecError(f"encoding option {name}:{key}", "given once", values, spec=spec, arg=arg,
                                option=key)
        return cls(name, {k: v[0] for k, v in texts.items()}, label=spec, arg=arg)

    @classmethod
    def parse_list(cls, text: str, *, arg: str | None = None) -> list["EncodingSpec"]:
        """"rope,pope:softplus=no" -> [EncodingSpec, ...]: at least one, none twice (each is one run)."""
        subject = "the list" if arg else "encodings"  # "--encodings: the list must be ..."
        if not isinstance(text, str):
            raise SpecError(subject, "comma-separated encoding specs", text, arg=arg)
        specs = [cls.parse(s, arg=arg) for s in split_top_level(text, ",", arg=arg) if s.strip()]
        if not specs:
            raise SpecError(subject, "at least one encoding, e.g. rope,pope:delta_init=uniform", text, arg=arg)
        if any(s in specs[:i] for i, s in enumerate(specs)):
            raise SpecError(subject, "distinct specs (each is one run)", [s.label for s in specs], arg=arg)
        return specs

    @classmethod
    def of(cls, value) -> "EncodingSpec":
        """`value` itself if it is a spec, else the spec its text parses to."""
        return value if isinstance(value, cls) else cls.parse(value)

    @classmethod
    def from_config(cls, encoding: str, encoding_options: Mapping | None = None, *,
                    fields: tuple[str, str] | None = None) -> "EncodingSpec":
        """The spec of the (encoding, encoding_options) pair a model config stores. fields: the config's names
        for the two, e.g. ("encoding", "encoding_options"): a bad value is then a ConfigError naming the field
        ("encoding_options.base must be ..."), in the one format of both error types."""
        try:
            return cls(encoding, encoding_options)
        except SpecError as e:
            if fields is None:
                raise
            field = fields[0] if e.option is None else f"{fields[1]}.{e.option}"
            raise ConfigError(field, e.requirement, e.value) from None

    def to_config(self) -> tuple[str, dict]:
        """The (encoding, encoding_options) pair a model config stores."""
        return self.name, self.options

    @property
    def options(self) -> dict:
        """The typed options (a fresh dict: the spec itself never changes)."""
        return dict(self._options)

    def build(self, *, head_dim: int, num_heads: int, dim: int | None = None):
        """The encoding module (`poskit.build_encoding` with these options)."""
        return build_encoding(self.name, head_dim=head_dim, num_heads=num_heads, dim=dim, **self._options)

    def __str__(self) -> str:
        return self.label

    def __repr__(self) -> str:
        return f"EncodingSpec({self.label!r})"

    def __eq__(self, other) -> bool:
        if not isinstance(other, EncodingSpec):
            return NotImplemented
        return self.name == other.name and self._options == other._options

    def __hash__(self) -> int:
        return hash((self.name, json.dumps(self._options, sort_keys=True, default=repr)))
