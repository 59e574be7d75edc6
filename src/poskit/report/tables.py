"""Markdown tables of comparisons and extrapolation sweeps."""
from __future__ import annotations


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub-flavoured markdown table; floats are printed with 4 significant digits."""
    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _pm(entry: dict, percent: bool) -> str:
    k = 100.0 if percent else 1.0
    if len(entry["per_seed"]) == 1:  # one seed: no spread to report
        return f"{entry['mean'] * k:.2f}"
    return f"{entry['mean'] * k:.2f} ± {entry['std'] * k:.2f}"


def _compare_rows(results: dict, per_seed: bool) -> tuple[list[str], list[list]]:
    metric = results["metric"]
    percent = metric == "accuracy"
    encs = results["encodings"]
    first = next(iter(encs.values()))
    others = [s for s in first["splits"] if s != results["split"]]
    unit = " (%)" if percent else ""
    headers = (["encoding", f"{results['split']} {metric}{unit}"] + [f"{s}{unit}" for s in others]
               + (["per seed"] if per_seed else []) + ["steps"])
    rows = []
    for name, e in encs.items():
        seeds = ", ".join(f"{v * (100 if percent else 1):.2f}" for v in e["per_seed"])
        steps = "/".join(str(s) for s in sorted(set(e["steps"])))
        rows.append([name, _pm(e, percent)] + [_pm(e["splits"][s], percent) for s in others]
                    + ([seeds] if per_seed else []) + [steps])
    return headers, rows


def compare_table(results: dict) -> str:
    """One row per encoding: the headline split, then every other split, as mean ± std over seeds
    (accuracies in percent), then steps trained."""
    several = len(next(iter(results["encodings"].values()))["per_seed"]) > 1
    return markdown_table(*_compare_rows(results, per_seed=several))


def variants_table(name: str, results: dict) -> str:
    """Several compares of one task in one table (e.g. counting with 1, 3 and 5 variables): the first column
    (`name`) says which variant a row belongs to (the keys of `results`), and the per-seed column is always
    there, because variants may have different numbers of seeds."""
    headers, rows = None, []
    for value, res in results.items():
        h, rs = _compare_rows(res, per_seed=True)
        headers = headers or [name] + h
        rows += [[value] + row for row in rs]
    if headers is None:
        raise ValueError("results must hold at least one variant")
    return markdown_table(headers, rows)


def extrapolation_table(sweeps: dict[str, list[dict]], key: str = "perplexity") -> str:
    """One row per model (label), one column per window length: `key` (perplexity or last_perplexity)."""
    lengths = sorted({r["length"] for rows in sweeps.values() for r in rows})
    mult = {r["length"]: r["multiple"] for rows in sweeps.values() for r in rows}
    headers = ["model"] + [f"{mult[L]:g}x ({L})" for L in lengths]
    out = []
    for label, rows in sweeps.items():
        by_len = {r["length"]: r[key] for r in rows}
        out.append([label] + [f"{by_len[L]:.2f}" if L in by_len else "" for L in lengths])
    return markdown_table(headers, out)
