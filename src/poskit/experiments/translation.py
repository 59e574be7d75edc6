"""`poskit reproduce translation`: train one EncoderDecoder per (encoding, seed) on the German-English pairs,
translate the test split with beam search, and report BLEU and chrF (mean and std over seeds), the
validation/test NLL, and the training-loss curves (the Legendre PE paper's Fig. 4 shape) as a PNG.

Runs are independent single-thread processes (experiments/parallel.py); each is a run directory of the
Trainer, so `--resume` after an interruption continues where the runs stopped and reuses the finished ones. Output files: <out>/<encoding>-seed<seed>/ (one run each), results.json, results.md,
convergence.png.
"""
from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

from ..encodings.spec import EncodingSpec
from ..training.files import atomic_write_json, check_writable_dir, read_metrics
from ..training.recipes.seq2seq import CONFIG, Seq2SeqConfig, load_pairs, require_scorer, train_seq2seq
from ..report.record import relative_to
from ..training.run_dir import owned
from .configs import TranslationReproduction
from .evidence import measurements_of, reproduction_paper, write_record
from .outputs import COMPARE_JSON, COMPARE_MD, CONVERGENCE_PLOT, safe_label
from .parallel import check_workers, run_parallel
from .registry import experiments
from .resolution import translation_config

__all__ = ["run_translation", "reproduce", "RESULTS_JSON", "RESULTS_MD", "CONVERGENCE_PNG"]

RESULTS_JSON, RESULTS_MD, CONVERGENCE_PNG = COMPARE_JSON, COMPARE_MD, CONVERGENCE_PLOT
BLEU_CURVE_PNG = "bleu_curve.png"  # with bleu_every=N: validation BLEU against training steps


def _job(job: tuple) -> dict:
    cfg_dict, run_dir, quiet, label = job
    return train_seq2seq(Seq2SeqConfig.from_dict(cfg_dict), run_dir, resume=True, quiet=quiet, label=label)


def _stats(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "per_seed": values}


def _curve(run_dir: Path) -> tuple[list[int], list[float]]:
    records = [r for r in read_metrics(run_dir) if "train_loss" in r]
    return [r["step"] for r in records], [r["train_loss"] for r in records]


def _bleu_curve(run_dir: Path) -> dict | None:
    """The validation BLEU and chrF a run logged (`bleu_every`), or None when it logged none."""
    records = [r for r in read_metrics(run_dir) if r.get("split") == "validation" and "bleu" in r]
    if not records:
        return None
    return {"steps": [r["step"] for r in records], "bleu": [r["bleu"] for r in records],
            "chrf": [r["chrf"] for r in records]}


def _settings(name: str) -> TranslationReproduction:
    """The settings of the registry's encoder-decoder reproduction `name`."""
    found = {e.name: e.settings for e in experiments("reproduction") if isinstance(e.settings, TranslationReproduction)}
    if name not in found:
        raise ValueError(f"name must be one of {sorted(found)}, got {name!r}")
    return found[name]




def plan_translation(name: str = "translation", *, preset: str = "cpu", encodings: list | None = None,
                     seeds: list[int] | None = None, steps: int | None = None,
                     overrides: list[str] | None = None) -> list[tuple[str, int, Seq2SeqConfig]]:
    """Every run's (encoding spec label, seed, config), each config validated: nothing runs unless all are valid.
    `encodings`: EncodingSpecs or their text (default: the reproduction's)."""
    r = _settings(name)
    base = translation_config(r, name, preset, steps, overrides)
    specs = [EncodingSpec.of(e) for e in encodings] if encodings is not None else EncodingSpec.parse_list(r.encodings)
    labels = [s.label for s in specs]
    if not specs or len(set(labels)) != len(labels):
        raise ValueError(f"encodings must list distinct encodings, got {labels}")
    plan = []
    for spec in specs:
        for seed in (seeds if seeds is not None else r.seeds):
            cfg = copy.deepcopy(base)
            cfg["model"]["encoding"] = spec.name
            if spec.options:  # only then: the saved model config of a plain encoding stays as it was (resume)
                cfg["model"]["encoding_options"] = spec.options
            cfg["seed"] = seed
            plan.append((spec.label, seed, Seq2SeqConfig.from_dict(cfg)))
    return plan


def reproduce(exp, *, out_dir=None, seeds=None, encodings=None, steps: int | None = None, workers: int | None = None,
              resume: bool = False, quiet: bool = False, overrides: list[str] | None = None,
              variants: str | None = None, preset: str | None = None) -> dict:
    """The registry's runner (`poskit reproduce translation`): the arguments every reproduction takes; the
    "paper" preset is the papers' Transformer-base, any other the CPU-scale default."""
    if variants is not None:
        raise ValueError(f"--variants does not apply to {exp.name} (it has no variants)")
    arguments = {"seeds": list(seeds) if seeds is not None else None,
                 "encodings": [EncodingSpec.of(e).label for e in encodings] if encodings is not None else None,
                 "steps": steps, "overrides": list(overrides or []), "variants": None, "preset": preset}
    return run_translation(exp.name, out_dir=out_dir or f"runs/reproduce-{exp.name}",
                           preset="paper" if preset == "paper" else "cpu", encodings=encodings, seeds=seeds,
                           steps=steps, workers=workers, resume=resume, quiet=quiet, overrides=overrides,
                           arguments=arguments)


def run_translation(name: str = "translation", *, out_dir, preset: str = "cpu", encodings: list | None = None,
                    seeds: list[int] | None = None, steps: int | None = None, workers: int | None = None,
                    resume: bool = False, quiet: bool = False, overrides: list[str] | None = None,
                    arguments: dict | None = None) -> dict:
    """Run (or resume) the reproduction; writes results.json (its results record, report/record.py),
    results.md and convergence.png in out_dir. `arguments`: those of `poskit reproduce` that chose this run
    (recorded; by default the ones given here)."""
    check_workers(workers)
    out = Path(out_dir)
    check_writable_dir(out, "out")
    plan = plan_translation(name, preset=preset, encodings=encodings, seeds=seeds, steps=steps, overrides=overrides)
    runs = [(enc, seed, cfg, out / safe_label(f"{enc}-seed{seed}")) for enc, seed, cfg in plan]
    if not resume:
        taken = [str(d) for *_, d in runs if (d / CONFIG).exists()]
        if taken:
            raise ValueError(f"out already holds runs ({taken[0]} ...): pass --resume to continue them, or choose "
                             "another --out")
    require_scorer()
    with owned(out, "compare", legacy=_legacy_out):
        t0 = time.perf_counter()
        load_pairs(plan[0][2], quiet=quiet)  # build the data cache once, before the workers read it
        jobs = [(cfg.to_dict(), str(d), quiet, f"{enc} seed {seed}") for enc, seed, cfg, d in runs]
        if not quiet:
            print(f"reproduce {name} ({preset}): {len(jobs)} runs, {cfg_line(plan[0][2])}", file=sys.stderr, flush=True)
        results = run_parallel(_job, jobs, workers=workers, labels=[j[3] for j in jobs], quiet=quiet)
        report = aggregate(name, preset, runs, results, time.perf_counter() - t0)
        atomic_write_json(out / RESULTS_JSON, report)
        (out / RESULTS_MD).write_text(markdown(report))
        plot_convergence(report, {enc: [_curve(d) for e, _, _, d in runs if e == enc] for enc in report["encodings"]},
                         out / CONVERGENCE_PNG)
        bleu_curves = {f"{enc} seed {seed}": c for enc, seed, _, d in runs if (c := _bleu_curve(d)) is not None}
        if bleu_curves:  # the learning curve of validation BLEU (bleu_every=N)
            report["bleu_curves"] = bleu_curves
            atomic_write_json(out / RESULTS_JSON, report)
            plot_bleu_curves(report, bleu_curves, out / BLEU_CURVE_PNG)
        if arguments is None:
            arguments = {"seeds": list(seeds) if seeds is not None else None,
                         "encodings": [EncodingSpec.of(e).label for e in encodings] if encodings is not None else None,
                         "steps": steps, "overrides": list(overrides or []), "variants": None,
                         "preset": "paper" if preset == "paper" else None}
        write_record(out, kind="reproduction", name=name, arguments=arguments, started=t0, details=report,
                     measurements=measurements_of("bleu", "test", {"": measurements(runs, results, out)}),
                     paper=reproduction_paper(_settings(name)), files=[RESULTS_MD, CONVERGENCE_PNG, BLEU_CURVE_PNG])
    return report


def measurements(runs, results: list[dict], out: Path) -> dict:
    """{encoding: [run, ...]} for the results record: BLEU, chrF and NLL on the test split, NLL on validation."""
    by_label: dict = {}
    for (enc, seed, _, run_dir), res in zip(runs, results):
        by_label.setdefault(enc, []).append({
            "seed": seed, "run": relative_to(run_dir, out), "steps": res.get("steps"),
            "train_seconds": res.get("train_seconds"),
            "splits": {"test": {"bleu": res["bleu"], "chrf": res["chrf"], "nll": res["test_nll"]},
                       "validation": {"nll": res["validation_nll"]}}})
    return by_label


def _legacy_out(directory: Path) -> bool:
    """An output directory of an older `poskit reproduce translation` (no marker): its report files and runs."""
    return all(p.name in (RESULTS_JSON, RESULTS_MD, CONVERGENCE_PNG, BLEU_CURVE_PNG) or (p.is_dir() and (p / CONFIG).exists())
               for p in directory.iterdir())


def cfg_line(cfg: Seq2SeqConfig) -> str:
    m = cfg.model_config()
    return (f"d_model {m.d_model}, {m.n_encoder_layers}+{m.n_decoder_layers} layers, vocab {cfg.vocab_size}, "
            f"{cfg.max_steps} steps of ~{cfg.batch_tokens} target tokens, beam {cfg.beam_size}")


def aggregate(name: str, preset: str, runs, results: list[dict], wall: float) -> dict:
    by_enc: dict[str, list[dict]] = {}
    for (enc, *_), res in zip(runs, results):
        by_enc.setdefault(enc, []).append(res)
    encodings = {}
    for enc, rs in by_enc.items():
        encodings[enc] = {key: _stats([r[key] for r in rs]) for key in ("bleu", "chrf", "test_nll", "validation_nll",
                                                                          "train_seconds")}
        encodings[enc]["seeds"] = [r["seed"] for r in rs]
        encodings[enc]["steps"] = rs[0]["steps"]
        encodings[enc]["parameters"] = rs[0]["parameters"]
    first = runs[0][2]
    return {"name": name, "preset": preset, "setup": cfg_line(first), "config": first.to_dict(),
            "test_pairs": results[0]["test_pairs"], "bleu_signature": results[0]["bleu_signature"],
            "chrf_signature": results[0]["chrf_signature"], "wall_seconds": wall, "encodings": encodings}


def markdown(report: dict) -> str:
    lines = [f"# reproduce {report['name']} ({report['preset']}): {report['setup']}", "",
             f"Test split: {report['test_pairs']} pairs; BLEU `{report['bleu_signature']}`; "
             f"wall time {report['wall_seconds']:.0f} s.", "",
             "| encoding | seeds | BLEU | chrF | test NLL | validation NLL | train s / run | parameters |",
             "|---|---|---|---|---|---|---|---|"]
    for enc, e in report["encodings"].items():
        f = lambda k, p=2: f"{e[k]['mean']:.{p}f} ± {e[k]['std']:.{p}f}"  # noqa: E731
        lines.append(f"| {enc} | {len(e['seeds'])} | {f('bleu')} | {f('chrf')} | {f('test_nll', 3)} | "
                     f"{f('validation_nll', 3)} | {e['train_seconds']['mean']:.0f} | {e['parameters']:,} |")
    return "\n".join(lines) + "\n"


def plot_convergence(report: dict, curves: dict, path: Path) -> Path:
    """Left: training loss vs step, mean over seeds (003 Fig. 4's shape); right: test BLEU per encoding."""
    from ..report.figure import save_figure
    from ..report.plots import color, plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for enc, runs in curves.items():
        runs = [r for r in runs if r[0]]
        if not runs:
            continue
        n = min(len(r[0]) for r in runs)
        steps = runs[0][0][:n]
        mean = [statistics.fmean(r[1][i] for r in runs) for i in range(n)]
        ax1.plot(steps, mean, label=enc, color=color(enc), linewidth=1.2)
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss (label-smoothed cross-entropy)")
    ax1.set_title("training-loss convergence (mean over seeds)")
    ax1.legend()
    encs = list(report["encodings"])
    for i, enc in enumerate(encs):
        b = report["encodings"][enc]["bleu"]
        ax2.bar(i, b["mean"], yerr=b["std"], capsize=4, color=color(enc), alpha=0.85)
        ax2.scatter([i] * len(b["per_seed"]), b["per_seed"], s=12, color="black", zorder=3)
    ax2.set_xticks(range(len(encs)))
    ax2.set_xticklabels(encs)
    ax2.set_ylabel("test BLEU")
    ax2.set_title("test BLEU (bars: mean, whiskers: std, dots: seeds)")
    fig.suptitle(f"reproduce {report['name']} ({report['preset']}): {report['setup']}", fontsize=10)
    return save_figure(fig, path, dpi=110)


def plot_bleu_curves(report: dict, curves: dict, path: Path) -> Path:
    """Validation BLEU (left) and chrF (right) against training steps, one line per run: where BLEU plateaus."""
    from ..report.figure import save_figure
    from ..report.plots import color, plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, c in curves.items():
        enc = label.rsplit(" seed ", 1)[0]
        for ax, key in zip(axes, ("bleu", "chrf")):
            ax.plot(c["steps"], c[key], "-o", markersize=3, label=label, color=color(enc), linewidth=1.2)
    for ax, key in zip(axes, ("BLEU", "chrF")):
        ax.set_xlabel("step")
        ax.set_ylabel(f"validation {key} (first {report['config'].get('bleu_pairs')} pairs)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"reproduce {report['name']} ({report['preset']}): validation BLEU and chrF over training",
                 fontsize=10)
    return save_figure(fig, path, dpi=110)
