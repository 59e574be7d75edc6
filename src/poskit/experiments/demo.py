"""`poskit demo`: the PoPE paper's zero-shot length extrapolation claim (Fig. 2) at CPU scale, then a short
diagnostic comparison, in about five minutes on a 2-core CPU.

1. Train tiny character-level LMs on Shakespeare (context 64) with none, alibi, rope and pope, two at a time
   as single-thread processes, each for a fixed time budget (the steps it reached are reported).
2. Evaluate each on held-out plays with windows of 1x, 2x, 4x and 8x the training context; print the table
   and plot perplexity against window length.
3. Train the same encodings briefly on a diagnostic task (flip-flop) and compare them (table + plot).

The defaults were chosen by measurement on a 2-core CPU; they and the diagnostic's settings are the demo's
record in experiments/configs/ (demo.py, demo_diagnostic.py), which the registry runs through `run`.
"""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from poskit.encodings.spec import EncodingSpec
from poskit.evaluate import parse_lengths
from poskit.report import compare_table, markdown_table, plot_extrapolation
from poskit.training import TrainConfig, atomic_write_json, check_writable_dir

from .compare import run_compare
from .configs.demo import DEMO
from .configs.records import DemoSettings
from .jobs import ExtrapolationJob, TrainJob, train_job
from .outputs import COMPARE_PLOT, DEMO_DIAGNOSTIC_DIR, DEMO_JSON, DEMO_LM_DIR, DEMO_MD, EXTRAPOLATION_PLOT, safe_label
from .parallel import check_workers, run_parallel
from .resolution import lm_config


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)




def run_demo(out_dir=DEMO.out_dir, encodings=DEMO.encodings, train_seconds: float = DEMO.train_seconds,
             context: int = DEMO.context, lengths: str = DEMO.lengths, n_chars: int | None = DEMO.n_chars,
             diagnostic: bool = True, diagnostic_steps: int = DEMO.diagnostic_steps, workers: int = DEMO.workers,
             seed: int = 0, quiet: bool = False, settings: DemoSettings = DEMO) -> dict:
    """The demo; `encodings` are EncodingSpecs or their text, `settings` the record whose language-model and
    diagnostic configs it trains (the other defaults are the flags of `poskit demo`)."""
    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    # every argument is checked before the rmtree below and before the first model trains
    if not train_seconds > 0:
        raise ValueError(f"train_seconds must be > 0, got {train_seconds!r}")
    check_workers(workers)
    for name, value in (("context", context), ("diagnostic_steps", diagnostic_steps), ("n_chars", n_chars)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    windows = parse_lengths(lengths, context)
    specs = [EncodingSpec.of(e) for e in encodings]
    labels = [s.label for s in specs]
    if not specs or len({safe_label(label) for label in labels}) != len(labels):
        raise ValueError(f"encodings must list at least one spec, each with a directory of its own, got {labels}")
    configs = {s.label: lm_config(s, context, train_seconds, seed, settings) for s in specs}
    diagnostic_base = TrainConfig.from_dict(dict(settings.diagnostic.config, max_steps=diagnostic_steps))
    check_writable_dir(out_dir, "out")
    # the demo always starts fresh: remove only what an earlier demo wrote here
    for sub in (DEMO_LM_DIR, DEMO_DIAGNOSTIC_DIR):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)

    _say(f"poskit demo: {len(labels)} character-level Shakespeare LMs (context {context}, "
         f"{train_seconds:g} s each, {workers} at a time), evaluated at {', '.join(f'{w}' for w in windows)} tokens", quiet)
    report, plot = _language_models(configs, windows, out_dir, context=context, train_seconds=train_seconds,
                                    n_chars=n_chars, workers=workers, quiet=quiet)
    t_lm = time.perf_counter() - t_start
    print(f"\nZero-shot length extrapolation (held-out plays, perplexity per character; lower is better)\n\n"
          f"{report['lm_table']}\n")
    print(f"plot: {plot}  ({t_lm:.0f} s so far)\n", flush=True)
    md = [f"# poskit demo\n\n## Zero-shot length extrapolation\n\nTrained at context {context} for "
          f"{train_seconds:g} s each; perplexity per character on held-out plays.\n\n{report['lm_table']}\n\n"
          f"![]({EXTRAPOLATION_PLOT})\n"]
    if diagnostic:
        report["diagnostic"] = _diagnostic(settings.diagnostic.what, diagnostic_base, specs, seed, out_dir, md,
                                           workers=workers, quiet=quiet)
    total = time.perf_counter() - t_start
    report["seconds"] = round(total, 1)
    atomic_write_json(out_dir / DEMO_JSON, report)
    md.append(f"\nTotal time: {total:.0f} s.\n")
    (out_dir / DEMO_MD).write_text("\n".join(md))
    arguments = {"encodings": labels, "train_seconds": train_seconds, "context": context, "lengths": lengths,
                 "n_chars": n_chars, "diagnostic": diagnostic, "diagnostic_steps": diagnostic_steps, "seed": seed}
    _write_record(settings, out_dir, report, arguments, t_start)
    print(f"demo finished in {total:.0f} s; summary in {out_dir / DEMO_MD}")
    return report


def _write_record(settings: DemoSettings, out_dir: Path, report: dict, arguments: dict, started: float) -> None:
    """results.json, the demo's results record (report/record.py): the language models' final numbers and
    their length sweep, the diagnostic's runs; `arguments` are recorded where they differ from the defaults."""
    from poskit.report.aggregate import compare_measurements, run_measurement
    from poskit.training import RESULTS_FILE
    from poskit.training.files import read_results

    from .evidence import demo_defaults, measurements_of, reproduction_paper, write_record

    lm = {label: [run_measurement(read_results(out_dir / DEMO_LM_DIR / safe_label(label) / RESULTS_FILE),
                                  out_dir / DEMO_LM_DIR / safe_label(label), out_dir)]
          for label in report["steps"]}
    groups = {DEMO_LM_DIR: lm}
    if "diagnostic" in report:
        runs = report["diagnostic"]["runs"]
        groups[DEMO_DIAGNOSTIC_DIR] = compare_measurements(
            {label: [out_dir / DEMO_DIAGNOSTIC_DIR / r for r in rs] for label, rs in runs.items()}, out_dir)
    defaults = demo_defaults(settings)
    changed = {k: v for k, v in arguments.items() if v != defaults.get(k)}
    details = {k: v for k, v in report.items() if k not in ("sweeps", "lm_table")}
    details["extrapolation"] = {"context": report["context"], "sweeps": report["sweeps"]}
    write_record(out_dir, kind="demo", name="demo", arguments=changed,
                 measurements=measurements_of("perplexity", "test", groups), started=started,
                 paper=reproduction_paper(settings), details=details,
                 files=[DEMO_MD, EXTRAPOLATION_PLOT, f"{DEMO_DIAGNOSTIC_DIR}/{COMPARE_PLOT}"])


def _language_models(configs: dict[str, TrainConfig], windows: list[int], out_dir: Path, *, context, train_seconds,
                     n_chars, workers, quiet) -> tuple[dict, Path]:
    """Train the LMs (label -> config) in parallel, each followed by its sweep over the windows; plot the
    sweeps; return the report's first part (context, steps, sweeps, the table) and the plot's path."""
    lm_dirs = {label: str(out_dir / DEMO_LM_DIR / safe_label(label)) for label in configs}
    jobs = [TrainJob(cfg.to_dict(), lm_dirs[e], extrapolation=ExtrapolationJob(lm_dirs[e], windows, "test", n_chars))
            for e, cfg in configs.items()]
    outs = run_parallel(train_job, jobs, workers=workers, labels=list(configs), quiet=quiet)
    sweeps = {e: o.sweep for e, o in zip(configs, outs)}
    steps = {e: o.results["steps"] for e, o in zip(configs, outs)}

    headers = ["encoding", "steps"] + [f"{w // context}x ({w})" for w in windows] + [f"last quarter {windows[-1] // context}x"]
    rows = [[e, steps[e]] + [f"{r['perplexity']:.2f}" for r in sweeps[e]] + [f"{sweeps[e][-1]['last_perplexity']:.2f}"]
            for e in configs]
    lm_table = markdown_table(headers, rows)
    plot = plot_extrapolation(sweeps, out_dir / EXTRAPOLATION_PLOT, context=context,
                              title=f"Shakespeare char-LM, trained at context {context}: perplexity vs window length")
    return {"context": context, "train_seconds": train_seconds, "n_chars": n_chars, "steps": steps,
            "sweeps": sweeps, "lm_table": lm_table}, plot


def _diagnostic(what: str, base: TrainConfig, specs: list[EncodingSpec], seed: int, out_dir: Path, md: list[str], *,
                workers, quiet) -> dict:
    """The short compare on the diagnostic task; prints its table and appends it to the summary `md`."""
    _say(f"\ndiagnostic: {what}; {', '.join(s.label for s in specs)}, {base.max_steps} steps each", quiet)
    res = run_compare(base, specs, [seed], out_dir / DEMO_DIAGNOSTIC_DIR, workers=workers, quiet=quiet,
                      title=f"demo diagnostic: {what}")
    diag_table = compare_table(res).strip()  # the table run_compare wrote under its title
    diag_plot = f"{DEMO_DIAGNOSTIC_DIR}/{COMPARE_PLOT}"
    print(f"Diagnostic: {what} ({res['metric']}, one seed)\n\n{diag_table}\n")
    print(f"plot: {out_dir / diag_plot}\n")
    md.append(f"## Diagnostic: {what}\n\n{diag_table}\n\n![]({diag_plot})\n")
    return res


def run(experiment, **arguments) -> dict:
    """The registry's runner (`poskit demo`): the demo with the experiment's settings."""
    return run_demo(settings=experiment.settings, **arguments)
