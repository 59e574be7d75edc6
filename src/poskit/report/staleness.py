"""Whether a results record still describes what its command runs: its recorded resolved configuration against
the one the same arguments resolve to today (experiments/evidence.py resolves it; this module only compares).

A difference in a setting both configurations have means the command would now run something else (an
encoding's constructor default changed, a reproduction's config changed): the tables made from the record
are labelled "stale: measured with X=a, today's default is b" until the experiment is rerun. A setting that
exists only today (a field added since) is not compared: a new option's default keeps the old behaviour, or it
would be a change of behaviour the house rules forbid; a setting that no longer exists is not compared either
(a rename would otherwise read as a change).
"""
from __future__ import annotations

import json

from .record import _json_safe


def differences(recorded, today, path: tuple = ()) -> list[tuple[tuple, object, object]]:
    """(path, recorded value, today's value) for every leaf that both have and that differs; lists of the same
    length are compared item by item (a variant's config), others as a whole; the list of encodings (the keys
    of an "encodings" mapping) is compared as a value too."""
    if isinstance(recorded, dict) and isinstance(today, dict):
        out = []
        # which encodings a command runs is a setting of its own (a reproduction's default list may change)
        if path[-1:] == ("encodings",) and list(recorded) != list(today):
            out.append((path, list(recorded), list(today)))
        for key in recorded:
            if key in today:
                out += differences(recorded[key], today[key], path + (key,))
        return out
    if isinstance(recorded, list) and isinstance(today, list) and len(recorded) == len(today) \
            and any(isinstance(v, (dict, list)) for v in recorded):
        out = []
        for i, (a, b) in enumerate(zip(recorded, today)):
            out += differences(a, b, path + (i,))
        return out
    return [] if recorded == today else [(path, recorded, today)]


def _value(v) -> str:
    text = json.dumps(v, separators=(",", ":"))
    return text if len(text) <= 60 else text[:57] + "..."


def setting_name(path: tuple) -> str:
    """A setting's name as a reader writes it: an encoding option as a spec ("pope:delta_projection"), a
    config field dotted ("lr", "model.d_model"; the "base" of a comparison left out)."""
    if len(path) >= 4 and path[-4] == "encodings" and path[-2] == "options":
        return f"{path[-3]}:{path[-1]}"
    parts = [p for p in path if p != "base"]
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text or "configuration"


def stale_reasons(recorded: dict, today: dict) -> list[str]:
    """"X=a, today's default is b" for every setting whose value differs (both sides as JSON holds them)."""
    found = differences(_json_safe(recorded), _json_safe(today))
    reasons = []
    for path, a, b in found:
        # an encoding option reads as in a spec (pope:delta_projection=true), a field as an override (lr=0.001)
        reasons.append(f"{setting_name(path)}={_value(a)}, today's default is {_value(b)}")
    return reasons


def stale_label(record, resolve_today) -> str | None:
    """The label of a table made from `record` when its command would run something else today (None when
    it would not). `resolve_today(record)` gives today's resolved configuration; when it fails (the experiment
    or one of its arguments no longer exists) the label says so."""
    try:
        today = resolve_today(record)
    except Exception as e:  # any failure to resolve means the command no longer runs as recorded
        return f"stale: its command no longer resolves on today's code ({type(e).__name__}: {str(e)[:120]})"
    reasons = stale_reasons(record.resolved, today)
    if not reasons:
        return None
    shown = reasons[:4] + ([f"and {len(reasons) - 4} more"] if len(reasons) > 4 else [])
    return "stale: measured with " + "; ".join(shown)
