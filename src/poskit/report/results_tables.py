"""Markdown tables made from results records (report/record.py), the tables `poskit report` puts into README.md
and docs/ between markers (report/markers.py):

    summary        one row per encoding (and group): mean ± std over seeds of the metric on every split, the
                   headline split's per-seed values, the steps, and the paper's numbers beside them
    seeds          one row per run: encoding, seed, steps, training time and the metric on every split
    values         one row per encoding (and group), one column per value of one split: every number an
                   analysis recorded (mean ± std when several runs share a row)
    extrapolation  one row per model, one column per evaluation length (the record's extrapolation sweep)
    curves         one row per encoding, one column per periodic evaluation step of one split (the learning
                   curves a compare keeps, experiments/compare.py), and the first step whose mean reaches `reach`
    compact        one row per record (README's list of reproductions): headline split and metric, each
                   encoding's mean ± std, seeds, when and on which code it was measured

Every table comes with its provenance line (`provenance`): the command, code version, date, machine and wall
time of the record it was made from.
"""
from __future__ import annotations

import os
from pathlib import Path

from .aggregate import mean_std
from .record import ResultsRecord, code_label
from .tables import markdown_table

TABLE_KINDS = ("summary", "seeds", "values", "extrapolation", "curves", "compact")


def fmt(metric: str, value) -> str:
    """A metric value as the tables print it: accuracies in percent, NLLs to 4 decimals, others to 2-4."""
    if value is None:
        return "—"
    if metric == "accuracy":
        return f"{100 * value:.2f}"
    if metric in ("loss", "nll") or metric.endswith("_nll"):
        return f"{value:.4f}"
    if metric in ("bleu", "chrf", "perplexity"):
        return f"{value:.2f}" if metric != "perplexity" else f"{value:.3f}"
    return f"{value:.4g}"


def _pm(metric: str, values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    mean, std = mean_std(values)
    return fmt(metric, mean) if len(values) == 1 else f"{fmt(metric, mean)} ± {fmt(metric, std)}"


def _unit(metric: str) -> str:
    return f"{metric} (%)" if metric == "accuracy" else metric


def provenance(record: ResultsRecord, link: str | None = None) -> str:
    """One line: command, code version, date, machine, wall time (and where the record is)."""
    m = record.machine
    minutes = record.wall_seconds / 60
    wall = f"{record.wall_seconds:.0f} s" if minutes < 2 else f"{minutes:.1f} min"
    date = record.date.replace("T", " ").replace("Z", " UTC")
    source = f" · [results]({link})" if link else ""
    end = record.details.get("code_at_end")
    code = code_label(record.code) + (f", code at the end {code_label(end)}" if isinstance(end, dict) else "")
    return (f"*Measured by `{record.command}` · poskit {code} · {date} · {m.get('cpu')}, "
            f"{m.get('cores')} cores, torch {m.get('torch')}, {m.get('os')} · wall time {wall}{source}*")


def _groups(record: ResultsRecord, group: str | None) -> dict:
    groups = record.measurements["groups"]
    if group is None:
        return groups
    if group not in groups:
        raise ValueError(f"group must be one of {list(groups)} for {record.name}, got {group!r}")
    return {group: groups[group]}


def _splits(runs_by_label: dict, headline: str | None) -> list[str]:
    seen = []
    for runs in runs_by_label.values():
        for run in runs:
            for s in run["splits"]:
                if s not in seen:
                    seen.append(s)
    return ([headline] if headline in seen else []) + [s for s in seen if s != headline]


def _paper_value(rows: dict, label: str, labels: list[str]):
    """The paper's numbers for a row: by its spec label, else by its encoding name when no other row of the
    table has that name (jsb's pope:delta_init=uniform is the paper's PoPE; ablations' pope variants are not)."""
    if label in rows:
        return rows[label]
    name = label.split(":")[0].split(" ")[0]
    if name in rows and sum(lb.split(":")[0].split(" ")[0] == name for lb in labels) == 1:
        return rows[name]
    return None


def _paper_columns(record: ResultsRecord) -> list[dict]:
    return list((record.paper or {}).get("numbers") or [])


def _paper_cell(block: dict, label: str, labels: list[str]) -> str:
    values = _paper_value(block["rows"], label, labels)
    if values is None:
        return "—"
    return " / ".join("—" if v is None else f"{v:g}" for v in values)


def _paper_header(block: dict) -> str:
    cols = block["columns"]
    return f"paper: {block['metric']}" + (f" ({' / '.join(cols)})" if len(cols) > 1 else "")


def summary_table(record: ResultsRecord, *, group: str | None = None, metric: str | None = None,
                  split: str | None = None) -> str:
    """One row per (group,) encoding: mean ± std over seeds per split, the per-seed values of the headline
    split, steps, and the paper's numbers."""
    metric = metric or record.measurements["metric"]
    split = split or record.measurements["split"]
    groups = _groups(record, group)
    several = len(groups) > 1 or (group is None and next(iter(groups), "") != "")
    all_labels = [lb for g in groups.values() for lb in g]
    splits = []
    for g in groups.values():
        splits += [s for s in _splits(g, split) if s not in splits]
    splits = [s for s in splits if any(metric in r["splits"].get(s, {}) for g in groups.values()
                                       for runs in g.values() for r in runs)]
    if not splits:
        raise ValueError(f"metric must be one the record of {record.name} holds, got {metric!r}")
    papers = _paper_columns(record)
    field = record.measurements.get("variant_field") or "group"
    headers = (([field.rsplit(".", 1)[-1]] if several else []) + ["encoding", "seeds"]
               + [f"{s} {_unit(metric)}" for s in splits] + [f"{splits[0]} per seed", "steps"]
               + [_paper_header(p) for p in papers])
    rows = []
    for gname, labels in groups.items():
        for label, runs in labels.items():
            per_split = [_pm(metric, [r["splits"].get(s, {}).get(metric) for r in runs]) for s in splits]
            seeds = ", ".join(fmt(metric, r["splits"].get(splits[0], {}).get(metric)) for r in runs)
            steps = "/".join(str(s) for s in sorted({r.get("steps") for r in runs if r.get("steps") is not None}))
            rows.append(([gname] if several else []) + [label, str(len(runs))] + per_split + [seeds, steps or "—"]
                        + [_paper_cell(p, label, all_labels) for p in papers])
    return markdown_table(headers, rows)


def seeds_table(record: ResultsRecord, *, group: str | None = None, metric: str | None = None) -> str:
    """One row per run: its encoding, seed, directory, steps, training time and the metric on every split."""
    metric = metric or record.measurements["metric"]
    groups = _groups(record, group)
    several = len(groups) > 1 or (group is None and next(iter(groups), "") != "")
    splits = []
    for g in groups.values():
        splits += [s for s in _splits(g, record.measurements["split"]) if s not in splits]
    headers = (["group"] if several else []) + ["encoding", "seed", "run", "steps", "train s"] + \
        [f"{s} {_unit(metric)}" for s in splits]
    rows = []
    for gname, labels in groups.items():
        for label, runs in labels.items():
            for r in runs:
                secs = r.get("train_seconds")
                rows.append(([gname] if several else []) + [label, str(r.get("seed")), f"`{r.get('run')}`",
                                                             str(r.get("steps")),
                                                             "—" if secs is None else f"{secs:.0f}"]
                            + [fmt(metric, r["splits"].get(s, {}).get(metric)) for s in splits])
    return markdown_table(headers, rows)


def values_table(record: ResultsRecord, *, group: str | None = None, split: str | None = None) -> str:
    """One row per (group,) encoding, one column per value recorded on `split` (default: the headline split):
    an analysis keeps several numbers per encoding where a training run keeps one metric per split."""
    split = split or record.measurements["split"]
    groups = _groups(record, group)
    held = {s for g in groups.values() for runs in g.values() for r in runs for s in r["splits"]}
    if split not in held:
        raise ValueError(f"split must be one of {sorted(held)} for {record.name}, got {split!r}")
    several = len(groups) > 1 or (group is None and next(iter(groups), "") != "")
    keys = []
    for g in groups.values():
        for runs in g.values():
            for r in runs:
                keys += [k for k in r["splits"].get(split, {}) if k not in keys]
    rows = []
    for gname, labels in groups.items():
        for label, runs in labels.items():
            rows.append(([gname] if several else []) + [label]
                        + [_pm(k, [r["splits"].get(split, {}).get(k) for r in runs]) for k in keys])
    return markdown_table((["group"] if several else []) + ["encoding"] + keys, rows)


def extrapolation_table_of(record: ResultsRecord, *, key: str = "perplexity") -> str:
    """One row per model, one column per window length (Nx = N times the training context)."""
    sweep = record.details.get("extrapolation")
    if not isinstance(sweep, dict) or not sweep.get("sweeps"):
        raise ValueError(f"table=extrapolation needs a record with an extrapolation sweep; {record.name} has none")
    sweeps = sweep["sweeps"]
    lengths = sorted({r["length"] for rows in sweeps.values() for r in rows})
    mult = {r["length"]: r.get("multiple") for rows in sweeps.values() for r in rows}
    headers = ["model"] + [f"{mult[L]:g}x ({L})" if mult[L] is not None else str(L) for L in lengths]
    out = []
    for label, rows in sweeps.items():
        by_len = {r["length"]: r.get(key) for r in rows}
        out.append([label] + [f"{by_len[L]:.2f}" if by_len.get(L) is not None else "—" for L in lengths])
    return markdown_table(headers, out)


def curves_table(record: ResultsRecord, *, split: str | None = None, reach: float | None = None) -> str:
    """One row per encoding: the mean ± std over seeds of the metric on `split` (default: the periodic
    evaluation's) at every evaluation step, and, with `reach`, the first step whose mean is at least `reach`."""
    curves = record.details.get("curves")
    if not isinstance(curves, dict) or not curves:
        raise ValueError(f"table=curves needs a record with learning curves; {record.name} has none")
    split = split or next(iter(curves))
    if split not in curves:
        raise ValueError(f"split must be one of {list(curves)} for {record.name}, got {split!r}")
    metric = record.measurements["metric"]
    steps = sorted({s for c in curves[split].values() for s in c["steps"]})
    headers = ["encoding"] + [str(s) for s in steps] + ([f"first step at >= {fmt(metric, reach)}"] if reach else [])
    rows = []
    for label, c in curves[split].items():
        at = {s: (m, sd) for s, m, sd in zip(c["steps"], c["mean"], c["std"])}
        cells = [("—" if s not in at else fmt(metric, at[s][0]) if not at[s][1] else
                  f"{fmt(metric, at[s][0])} ± {fmt(metric, at[s][1])}") for s in steps]
        if reach:
            cells.append(next((str(s) for s in c["steps"] if at[s][0] >= reach), "not reached"))
        rows.append([label] + cells)
    return markdown_table(headers, rows)


def compact_row(name: str, record: ResultsRecord | None, stale: str | None) -> list[str]:
    if record is None:
        return [name, "—", "—", "not backed: no results file committed", "—", "—"]
    metric, split = record.measurements["metric"], record.measurements["split"]
    parts = []
    for gname, labels in record.measurements["groups"].items():
        cells = ", ".join(f"{label} {_pm(metric, [r['splits'].get(split, {}).get(metric) for r in runs])}"
                          for label, runs in labels.items())
        parts.append(f"{gname}: {cells}" if gname else cells)
    seeds = sorted({len(runs) for labels in record.measurements["groups"].values() for runs in labels.values()})
    source = (record.paper or {}).get("source") or "—"
    measured = f"{record.date[:10]}, {code_label(record.code)}" + (" **(stale)**" if stale else "")
    return [name, source, f"{split} {_unit(metric)}", "; ".join(parts) or "—", "/".join(map(str, seeds)) or "—",
            measured]


def compact_table(entries: list[tuple[str, ResultsRecord | None, str | None]]) -> str:
    """One row per (name, record or None when not backed, stale label or None)."""
    return markdown_table(["reproduction", "paper", "headline", "result (mean ± std over seeds)", "seeds",
                           "measured"], [compact_row(*e) for e in entries])


def link(from_file: Path, target: Path) -> str:
    """`target` relative to the directory of the markdown file that links to it (POSIX separators)."""
    return Path(os.path.relpath(Path(target).resolve(), Path(from_file).resolve().parent)).as_posix()
