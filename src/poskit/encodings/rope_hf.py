"""Hugging Face transformers' RoPE conventions, read into poskit's: HF's option names and its
``rope_parameters`` / ``rope_scaling`` dicts.

HF name                              poskit option (RotaryEncoding)
rope_theta                           base
original_max_position_embeddings     original_max_positions
partial_rotary_factor                rotary_dim = int(head_dim * partial_rotary_factor)
rope_interleave                      layout: True 'interleaved', False 'half' (HF's Llama family: half)
max_position_embeddings              read as HF reads it: rope-dynamic's original_max_positions; for yarn and
                                     longrope, factor = max_position_embeddings / original when factor is
                                     not given; for llama3, yarn and longrope, original_max_positions when that
                                     is not given; the other variants ignore it, as HF does
rope_scaling, rope_parameters        a dict of HF keys (RotaryEncoding.HF_DICT_KEYS): its rope_type (or the
                                     older `type`) must be the encoding's variant; every other key sets the
                                     option of the same meaning

`resolve_options` turns any mix of the two spellings into poskit's, with one error naming both keys when
two of them give one option different values. `from_hf` takes the dict of an HF config (Llama 3's llama3,
Qwen's yarn / dynamic, DeepSeek's yarn with mscale, Phi-3's longrope) and returns the EncodingSpec of the
poskit encoding that computes the same frequencies and attention factor, refusing a key it does not know.
"""
from __future__ import annotations

from .base import OPTION_CHECKS
from .rope_scaling import ROPE_INIT_FUNCTIONS
from .spec import EncodingSpec
from ..util.validate import check_bool, check_int, check_real

#: HF's rope_type -> poskit's scaling ("su": Phi-3's first name for longrope). poskit's "ntk" (static NTK-aware)
#: has no HF rope_type.
HF_ROPE_TYPES = {"default": "none", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3",
                 "longrope": "longrope", "su": "longrope"}

#: HF names given beside the dict (config fields, or options of build_encoding) -> the poskit option they set
HF_FIELDS = {"rope_theta": "base", "original_max_position_embeddings": "original_max_positions",
             "partial_rotary_factor": "rotary_dim", "rope_interleave": "layout"}
#: the names of an HF rope dict as an option or a config field
HF_DICTS = ("rope_parameters", "rope_scaling")
#: keys of an HF rope dict poskit reads -> the poskit option each sets (rope_type / type name the variant)
HF_DICT_KEYS = {"rope_type": None, "type": None, **{k: v for k, v in HF_FIELDS.items() if k != "rope_interleave"},
                "factor": "factor", "attention_factor": "attention_factor", "beta_fast": "beta_fast",
                "beta_slow": "beta_slow", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim",
                "truncate": "truncate", "low_freq_factor": "low_freq_factor",
                "high_freq_factor": "high_freq_factor", "short_factor": "short_factor", "long_factor": "long_factor"}
#: every HF name resolve_options reads that is not also a poskit option
HF_NAMES = (*HF_FIELDS, "max_position_embeddings", *HF_DICTS)


def encoding_name(scaling: str) -> str:
    """The registered name of the RoPE variant `scaling` ("rope" for "none")."""
    return "rope" if scaling == "none" else f"rope-{scaling}"


def encoding_scaling(name: str) -> str:
    """The scaling of the registered RoPE variant `name` (the inverse of encoding_name)."""
    scaling = "none" if name == "rope" else name.removeprefix("rope-")
    if encoding_name(scaling) != name or scaling not in ROPE_INIT_FUNCTIONS:
        names = [encoding_name(s) for s in ROPE_INIT_FUNCTIONS]
        raise ValueError(f"name must be a rope encoding ({names}), got {name!r}")
    return scaling


def _dict_scaling(table: dict, label: str) -> str | None:
    """The poskit scaling a rope dict names (None: it names none), or ValueError naming the key."""
    rope_type, old = table.get("rope_type"), table.get("type")
    if rope_type is not None and old is not None and rope_type != old:
        raise ValueError(f"{label}['rope_type']={rope_type!r} and {label}['type']={old!r} disagree: give one of them")
    rope_type = rope_type if rope_type is not None else old
    if rope_type is None:
        return None
    if rope_type not in HF_ROPE_TYPES:
        raise ValueError(f"{label}['rope_type'] must be one of {sorted(HF_ROPE_TYPES)} (the HF rope types poskit "
                         f"computes), got {rope_type!r}")
    return HF_ROPE_TYPES[rope_type]


def _rope_dict(options: dict) -> tuple[dict, str] | None:
    """The HF rope dict among `options` (rope_parameters or rope_scaling) and the name it was given under."""
    given = [(options[name], name) for name in HF_DICTS if options.get(name) is not None]
    for table, name in given:
        if not isinstance(table, dict):
            raise ValueError(f"{name} must be a dict of HF rope keys (e.g. {{'rope_type': 'yarn', 'factor': 4.0, "
                             f"'original_max_position_embeddings': 2048}}), got {type(table).__name__}")
        unknown = sorted(set(table) - set(HF_DICT_KEYS))
        if unknown:
            raise ValueError(f"{name}: unknown key(s) {unknown}; poskit reads {sorted(HF_DICT_KEYS)}")
    if len(given) == 2 and given[0][0] != given[1][0]:
        raise ValueError("rope_parameters and rope_scaling (HF's older name for it) disagree: give one of them")
    return given[0] if given else None


def _to_poskit(key: str, value, head_dim: int | None, label: str):
    """The poskit value of HF `key` (validated, the error naming `label`)."""
    if key == "rope_theta":
        return check_real(value, label, minimum=1, strict=True)
    if key == "original_max_position_embeddings":
        return check_int(value, label, minimum=1)
    if key == "rope_interleave":
        return "interleaved" if check_bool(value, label) else "half"
    if key == "partial_rotary_factor":
        fraction = check_real(value, label, minimum=0, maximum=1, strict=True)
        if head_dim is None:  # only presence matters here (required_options)
            return fraction
        rotary_dim = int(head_dim * fraction)  # HF's rounding
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"{label}={value!r} rotates int(head_dim * {value!r}) = {rotary_dim} channels at head_dim "
                             f"{head_dim}; rope rotates pairs: choose a fraction that gives an even number >= 2")
        return rotary_dim
    return value


def resolve_options(scaling: str, head_dim: int | None, options: dict) -> dict:
    """`options` of RotaryEncoding for variant `scaling`, with HF names (HF_NAMES, and the keys of a rope dict)
    turned into poskit's; None values count as not given. Two names that set one option to different values
    raise one ValueError naming both; a rope dict whose rope_type is another variant, or that holds a key
    poskit does not read, raises naming it. head_dim None: partial_rotary_factor is not turned into rotary_dim
    (enough to know which options are given)."""
    options = {k: v for k, v in options.items() if v is not None}
    # option -> [(value, the key it came from, the value as given)]
    given: dict[str, list] = {k: [(v, k, v)] for k, v in options.items() if k not in HF_NAMES}

    def add(option, value, key, raw):
        given.setdefault(option, []).append((value, key, raw))

    found = _rope_dict(options)
    if found is not None:
        table, name = found
        named = _dict_scaling(table, name)
        if named is not None and named != scaling:
            raise ValueError(f"{name}['rope_type'] names poskit's encoding {encoding_name(named)!r}, not "
                             f"{encoding_name(scaling)!r}: build that one (rope_hf.from_hf gives the EncodingSpec of "
                             f"any HF rope dict)")
        for key, raw in table.items():
            if HF_DICT_KEYS[key] is not None and raw is not None:
                label = f"{name}[{key!r}]"
                add(HF_DICT_KEYS[key], _to_poskit(key, raw, head_dim, label), label, raw)
    for key, option in HF_FIELDS.items():
        if key in options:
            add(option, _to_poskit(key, options[key], head_dim, key), key, options[key])
    max_positions = options.get("max_position_embeddings")
    if max_positions is not None:
        max_positions = check_int(max_positions, "max_position_embeddings", minimum=1)
        if scaling == "dynamic":  # HF's dynamic NTK grows the base past max_position_embeddings
            add("original_max_positions", max_positions, "max_position_embeddings", max_positions)
    resolved = {}
    for option, values in given.items():
        value, key, raw = values[0]
        for other_value, other_key, other_raw in values[1:]:
            if other_value != value:
                raise ValueError(f"{key}={raw!r} and {other_key}={other_raw!r} both set {option} and disagree: "
                                 "give one of them")
        if key != option and option in OPTION_CHECKS:  # the poskit spelling was checked by build_encoding
            try:
                OPTION_CHECKS[option](value)
            except ValueError as e:
                raise ValueError(f"{key}{str(e)[len(option):]}" if str(e).startswith(option) else str(e)) from None
        resolved[option] = value
    if max_positions is not None and scaling in ("llama3", "yarn", "longrope"):
        # as HF's standardize_rope_params and its yarn / longrope functions do
        resolved.setdefault("original_max_positions", max_positions)
        if scaling in ("yarn", "longrope") and "factor" not in resolved:
            resolved["factor"] = max_positions / resolved["original_max_positions"]
    return resolved


def from_hf(rope_parameters: dict | None = None, *, head_dim: int, rope_theta: float | None = None,
            partial_rotary_factor: float | None = None, max_position_embeddings: int | None = None,
            original_max_position_embeddings: int | None = None, layout: str = "half") -> EncodingSpec:
    """The EncodingSpec of the poskit RoPE that computes what HF computes for this rope dict (a config's
    `rope_parameters`, or its older `rope_scaling`), with the config fields HF reads beside it: head_dim (the
    attention head width), rope_theta, partial_rotary_factor, max_position_embeddings and
    original_max_position_embeddings (Phi-3 keeps it outside the dict). Its options use poskit's names only,
    base and layout included; build it with `spec.build(head_dim=..., num_heads=...)`, or take the (name,
    options) pair with `spec.to_config()`.

    layout: 'half' (HF's Llama family rotates channel i with i + d/2; default) or 'interleaved' (the layout of
    checkpoints whose config sets rope_interleave, e.g. DeepSeek-V3's). A key poskit does not read, a rope_type
    it does not compute ("proportional", multimodal ones) and two values for one option raise ValueError naming
    them. Shapes: Llama 3.1 {rope_type: llama3, factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings}; Qwen2.5 {type: yarn, factor, original_max_position_embeddings}; DeepSeek
    {type: yarn, factor, beta_fast, beta_slow, mscale, mscale_all_dim, original_max_position_embeddings} (its
    multi-head latent attention also scales the softmax by mscale(factor, mscale_all_dim)^2: a model-level
    factor, not part of the encoding); Phi-3 {type: longrope or su, short_factor, long_factor} with the two
    lengths beside it."""
    check_int(head_dim, "head_dim", minimum=1)
    table = {} if rope_parameters is None else rope_parameters
    if not isinstance(table, dict):
        raise ValueError(f"rope_parameters must be a dict of HF rope keys or None, got {type(table).__name__}")
    _rope_dict({"rope_parameters": table})  # unknown keys first, named
    scaling = _dict_scaling(table, "rope_parameters") or "none"
    options = resolve_options(scaling, head_dim, {
        "rope_parameters": table or None, "rope_theta": rope_theta, "partial_rotary_factor": partial_rotary_factor,
        "max_position_embeddings": max_position_embeddings,
        "original_max_position_embeddings": original_max_position_embeddings, "layout": layout})
    options.setdefault("base", 10000.0)  # HF's default_theta
    if scaling == "dynamic" and "original_max_positions" not in options:
        raise ValueError("rope_parameters of rope_type 'dynamic' need max_position_embeddings (HF grows the base "
                         "past it)")
    return EncodingSpec(encoding_name(scaling), options)
