"""A table that sets two values of one encoding option against each other over several results records: PoPE's
phase-bias rule (`delta_projection` false = the forward clamp alone, true = the projection after each step)
measured beside each reproduction's other encodings.

Two rows of a record form a pair when their encodings are the same encoding with the same resolved options
except `option` (their constructor options with defaults, as the record resolved them; never their labels,
so `pope` and `pope:delta_projection=false` are one rule). Each pair gives one row: the headline metric of
both rules (mean ± std over seeds), the per-seed difference on the seeds both ran, and in how many of those
seeds each rule was better (a difference within `TIE` of the value is a tie). Which direction is better comes
from the metric (`higher_is_better`).
"""
from __future__ import annotations

from .aggregate import mean_std
from .record import ResultsRecord
from .results_tables import _pm, _unit, fmt
from .tables import markdown_table

TIE = 1e-3
"""Two values of one seed within this fraction of the larger are a tie (rounding and run-to-run noise of
identical trainings), counted apart from the wins."""
_HIGHER = ("accuracy", "token_accuracy", "sequence_accuracy", "bleu", "chrf")
_LOWER = ("loss", "nll", "perplexity", "last_perplexity")


def higher_is_better(metric: str) -> bool:
    """Whether a larger `metric` is the better result (accuracies, BLEU, chrF) or a smaller one (losses,
    NLLs, perplexities); an unknown metric is refused by name rather than guessed."""
    if metric in _HIGHER:
        return True
    if metric in _LOWER or metric.endswith("_nll"):
        return False
    raise ValueError(f"metric must be one whose better direction is known ({sorted(_HIGHER + _LOWER)} or "
                     f"*_nll), got {metric!r}")


def _other_options(entry: dict, option: str) -> tuple:
    return (entry.get("name"), tuple(sorted((k, repr(v)) for k, v in entry.get("options", {}).items()
                                            if k != option)), repr(sorted(entry.get("fixed", {}).items())))


def pairs(record: ResultsRecord, option: str) -> list[tuple[str, str]]:
    """(label a, label b) of every two encodings of `record` that differ only in `option`, `a` holding the
    smaller value (false before true)."""
    encodings = record.resolved.get("encodings", {})
    held = {label: e for label, e in encodings.items() if option in e.get("options", {})}
    out = []
    labels = list(held)
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            ea, eb = held[a], held[b]
            if ea["options"][option] == eb["options"][option]:
                continue
            if _other_options(ea, option) != _other_options(eb, option):
                continue
            out.append((a, b) if repr(ea["options"][option]) <= repr(eb["options"][option]) else (b, a))
    return out


def _by_seed(runs: list, split: str, metric: str) -> dict:
    return {r.get("seed"): r["splits"].get(split, {}).get(metric) for r in runs
            if r["splits"].get(split, {}).get(metric) is not None}


def contrast_rows(name: str, record: ResultsRecord, option: str) -> list[list[str]]:
    metric, split = record.measurements["metric"], record.measurements["split"]
    higher = higher_is_better(metric)
    encodings = record.resolved["encodings"]
    rows = []
    for a, b in pairs(record, option):
        va, vb = (repr(encodings[x]["options"][option]).lower() for x in (a, b))
        for group, labels in record.measurements["groups"].items():
            if a not in labels or b not in labels:
                continue
            sa, sb = _by_seed(labels[a], split, metric), _by_seed(labels[b], split, metric)
            common = sorted(set(sa) & set(sb), key=str)
            diffs = [sb[s] - sa[s] for s in common]
            scale = 100.0 if metric == "accuracy" else 1.0
            # a seed whose two values differ by at most TIE (relative) is a tie, not a win
            decided = [d for s, d in zip(common, diffs) if abs(d) > TIE * max(abs(sa[s]), abs(sb[s]))]
            wins_b = sum((d > 0) == higher for d in decided)
            wins_a = len(decided) - wins_b
            mean_diff = mean_std(diffs)[0] * scale if diffs else None
            rows.append([name + (f" ({group})" if group else ""), f"{split} {_unit(metric)}",
                         f"{a} / {b}", f"{va} / {vb}",
                         _pm(metric, list(sa.values())), _pm(metric, list(sb.values())),
                         ", ".join(f"{fmt(metric, sa[s])} / {fmt(metric, sb[s])}" for s in common) or "—",
                         "—" if mean_diff is None else f"{mean_diff:+.2f}" if metric == "accuracy"
                         else f"{mean_diff:+.4f}",
                         f"{wins_a} / {wins_b} / {len(common) - len(decided)} of {len(common)}"])
    return rows


def contrast_table(entries: list[tuple[str, ResultsRecord | None]], option: str) -> str:
    """One row per pair of encodings differing in `option`, per record and group; a record not committed, or
    one without such a pair, gets a row that says so (a reader sees what is missing, not a shorter table)."""
    rows = []
    for name, record in entries:
        found = contrast_rows(name, record, option) if record is not None else []
        if found:
            rows += found
        else:
            why = "not backed: no results file committed" if record is None else f"no pair differing in {option}"
            rows.append([name, "—", "—", "—", "—", "—", why, "—", "—"])
    return markdown_table(["results", "headline", "encodings (a / b)", f"{option} (a / b)", "a: mean ± std",
                           "b: mean ± std", "per seed (a / b)", "b − a (mean)", "better: a / b"], rows)
