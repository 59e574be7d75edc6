"""`poskit reproduce NAME`: CPU-scale versions of the papers' diagnostic tasks.

Each reproduction is a `compare` with fixed settings: the paper's task scaled down until one model trains on
one CPU core in minutes to hours. A reproduction with variants (counting: 1, 3 and 5 variables, as the CoPE
paper's Table 3) runs one compare per variant under <out>/<field>_<value>/ and writes one results.json and one
table with a column naming the variant of each row. Run times in the summaries are wall-clock on an idle 2-core
CPU with two single-thread workers; the outcomes are in docs/reproductions.md. The settings of each
reproduction are in experiments/configs/, and experiments/registry.py names them.
"""
from __future__ import annotations

import copy
import time
from pathlib import Path

from poskit.report import variants_table
from poskit.training import TrainConfig, atomic_write_json

from poskit.training.run_dir import check

from .compare import compare_dir, plan_compare, train_and_report
from .configs import Reproduction, Variant
from .evidence import measurements_of, reproduction_paper, write_record
from .outputs import (COMPARE_JSON, COMPARE_MD, COMPARE_PLOT, CURVES_PLOT, EXTRAPOLATION_DIR, EXTRAPOLATION_PLOT,
                      TRAINING_LOSS_PLOT, is_legacy_compare, safe_label)
from .overrides import apply_overrides
from .realdata import add_nll, plan_sweep, run_sweep
from .registry import experiment
from .resolution import preset_config, reproduction_config, reproduction_specs, select_variants

__all__ = ["Reproduction", "Variant", "preset_config", "reproduce", "run_reproduction", "select_variants"]


def plot_training_loss(dirs: dict[str, list[Path]], path: Path, metric: str, title: str) -> Path:
    """Training loss (left) and validation `metric` (right) of every run against step, one line per run."""
    from poskit.report.plots import plot_runs
    from poskit.training import read_metrics

    runs = {(label if len(ds) == 1 else f"{label} {d.name}"): read_metrics(d) for label, ds in dirs.items() for d in ds}
    return plot_runs(runs, path, metric=metric, title=title)


def _get(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def run_reproduction(name: str, **arguments) -> dict:
    """Run the reproduction `name` of the registry (experiments/registry.py), whichever its runner: the
    arguments are those of `reproduce` below, which every reproduction's runner takes."""
    return experiment(name, "reproduction").run(**arguments)


def reproduce(exp, *, out_dir=None, seeds=None, encodings=None, steps: int | None = None,
              workers: int | None = None, resume: bool = False, quiet: bool = False,
              overrides: list[str] | None = None, variants: str | None = None, preset: str | None = None) -> dict:
    """Run a decoder reproduction (`exp.settings` a Reproduction) as a compare, or one compare per variant
    (`variants`: a comma-separated subset of the variant values, default all); returns the results. `seeds`
    and `steps` replace every variant's, `encodings` (specs, or their text) the reproduction's;
    `preset="paper"` gives the paper's model size and schedule (`preset_config`). Every sub-run is checked
    before the first one trains. Language-model reproductions also report the NLL per token (`nll` in
    results.json, a second table in results.md) and, where the reproduction declares one, a
    length-extrapolation sweep of the trained runs (<out>/extrapolation/), and where it asks for one, a
    training-loss plot of every run (training_loss.png). results.json is the reproduction's results record
    (report/record.py): provenance, the resolved configuration, every seed's numbers and the paper's."""
    started = time.perf_counter()
    name, r = exp.name, exp.settings
    chosen = select_variants(r, variants)
    cfg = reproduction_config(r, preset, steps, overrides)
    specs = reproduction_specs(r, encodings)
    out = Path(out_dir or f"runs/reproduce-{name}")
    title = f"reproduce {name}: {r.paper}"
    arguments = {"seeds": list(seeds) if seeds is not None else None,
                 "encodings": [s.label for s in specs] if encodings is not None else None, "steps": steps,
                 "overrides": list(overrides or []), "variants": variants, "preset": preset}
    record = {"name": name, "arguments": arguments, "started": started, "paper": reproduction_paper(r)}
    if not chosen:
        return _reproduce_one(r, cfg, specs, seeds, out, title, record, workers=workers, resume=resume, quiet=quiet)
    if _get(cfg, r.variant_field) != _get(r.config, r.variant_field):
        raise ValueError(f"{r.variant_field} is what the {name} reproduction varies; choose among "
                         f"{[v.value for v in r.variants]} with --variants instead of overriding it")
    return _reproduce_variants(r, chosen, cfg, specs, seeds, out, title, record, workers=workers, resume=resume,
                               quiet=quiet)


def _reproduce_one(r: Reproduction, cfg: dict, specs, seeds, out: Path, title: str, record: dict, *, workers,
                   resume, quiet) -> dict:
    """One compare (a reproduction without variants), then its NLL table, sweep, loss plot and results record,
    all inside the owned and locked output directory."""
    plan = plan_compare(TrainConfig.from_dict(cfg), specs, list(seeds or r.seeds), out, workers=workers,
                        resume=resume, split=r.split)
    sweep_plan = plan_sweep(r, plan, out, workers) if r.extrapolation else None
    with compare_dir(out):
        results = train_and_report(plan, workers=workers, quiet=quiet, title=title)
        if not results:  # a rank other than 0 under torchrun: rank 0 writes the outputs
            return results
        if results["metric"] == "perplexity":
            add_nll(results, plan, out)
        if sweep_plan is not None:
            results["extrapolation"] = run_sweep(sweep_plan, quiet)
            atomic_write_json(out / COMPARE_JSON, results)
        if r.training_loss_plot:
            plot_training_loss(plan.dirs, out / TRAINING_LOSS_PLOT, results["metric"], title)
        from poskit.report.aggregate import compare_measurements

        write_record(out, kind="reproduction", **record, details=results,
                     measurements=measurements_of(results["metric"], results["split"],
                                                  {"": compare_measurements(plan.dirs, out)}),
                     files=[COMPARE_MD, COMPARE_PLOT, CURVES_PLOT, TRAINING_LOSS_PLOT, f"{EXTRAPOLATION_DIR}/{EXTRAPOLATION_PLOT}"])
    return results


def _reproduce_variants(r: Reproduction, chosen: list[Variant], cfg: dict, specs, seeds, out: Path, title: str,
                        record: dict, *, workers, resume, quiet) -> dict:
    """One compare per chosen variant under <out>/<field>_<value>/ (all planned before the first trains), then
    one results.json and one table with a column naming the variant of each row. A reproduction with an
    extrapolation sweep sweeps each variant's runs (<out>/<field>_<value>/extrapolation/), and the record holds
    every model's sweep, named "<field>=<value> <model>"."""
    check(out, "compare", legacy=is_legacy_compare)  # the parent directory too, before anything is written
    plans = []
    for v in chosen:
        vcfg = apply_overrides(copy.deepcopy(cfg), [f"{r.variant_field}={v.value}"])
        label = f"{r.variant_name}={v.value}"
        plan = plan_compare(TrainConfig.from_dict(vcfg), specs, list(seeds or v.seeds or r.seeds),
                            out / safe_label(label), workers=workers, resume=resume, split=r.split)
        sweep = plan_sweep(r, plan, plan.out_dir, workers) if r.extrapolation else None
        plans.append((v, label, plan, sweep))
    from poskit.report.aggregate import compare_measurements

    with compare_dir(out):
        per_variant, groups, sweeps = {}, {}, {}
        for v, label, plan, sweep in plans:
            with compare_dir(plan.out_dir):
                per_variant[v.value] = train_and_report(plan, workers=workers, quiet=quiet, title=f"{title} [{label}]")
                if per_variant[v.value] and sweep is not None:
                    per_variant[v.value]["extrapolation"] = run_sweep(sweep, quiet)
            if not per_variant[v.value]:  # a rank other than 0 under torchrun
                continue
            groups[str(v.value)] = compare_measurements(plan.dirs, out)
            if sweep is not None:
                swept = per_variant[v.value]["extrapolation"]
                sweeps.update({f"{label} {model}": rows for model, rows in swept["sweeps"].items()})
        if not groups:
            return {}
        first = next(iter(per_variant.values()))
        results = {"task": first["task"], "metric": first["metric"], "split": first["split"],
                   "variant_field": r.variant_field,
                   "variants": {str(value): {**res, "dir": safe_label(f"{r.variant_name}={value}")}
                                for value, res in per_variant.items()}}
        if sweeps:
            swept = first["extrapolation"]
            results["extrapolation"] = {"lengths": swept["lengths"], "scalings": swept["scalings"],
                                        "n_chars": swept["n_chars"], "sweeps": sweeps}
        atomic_write_json(out / COMPARE_JSON, results)
        pngs = [f"{safe_label(f'{r.variant_name}={value}')}/{COMPARE_PLOT}" for value in per_variant]
        plots = "\n".join(f"![{r.variant_name}={value}]({png})" for value, png in zip(per_variant, pngs))
        (out / COMPARE_MD).write_text(f"# {title}\n\n{variants_table(r.variant_name, per_variant)}\n\n{plots}\n")
        write_record(out, kind="reproduction", **record, details=results, files=[COMPARE_MD, *pngs],
                     measurements=measurements_of(first["metric"], first["split"], groups, r.variant_field))
    return results
