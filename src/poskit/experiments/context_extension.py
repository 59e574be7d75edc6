"""`poskit reproduce context-extension` (its settings and grids: experiments/configs/context_extension.py).

    plan(...)       the grid as jobs and directories, every argument checked, nothing trained or written
    run_plan(...)   train the base models, extend and evaluate them (two processes at a time), aggregate
    reproduce(...)  the registry's runner

The output directory (a "compare" directory: run_dir.py) holds one run directory per sub-run, each resumable on
its own, and one evaluation file per evaluated checkpoint, so that `--resume` continues where a killed command
stopped and recomputes nothing finished:

    bases/seed<k>/<setup>/                   the base models (training runs)
    extend/seed<k>/<setup>/<method>-s<s>/    the extensions (extension runs, trained stepwise to each step)
    evals/seed<k>/<setup>/<method>-s<s>/step-<n>.json   perplexity at every length, passkey per length x depth
    results.json, results.md                 every number, and the tables
    steps-<setup>.png                        perplexity and passkey accuracy at 64 s vs fine-tuning steps
    passkey/<setup>-<method>-s<s>-step<n>.png   heat maps (each method's last step, and step 0)

Definitions: "perplexity" is per character on the held-out split over whole windows, "last" over their last
quarter (evaluate/extrapolation.py); the 1x regression is the perplexity at the base context minus the base
model's; passkey accuracy at a length is the mean over depths of the exact-match accuracy; YaRN's "passkey
context" is the longest evaluated length with accuracy >= the threshold, PI's effective window the longest
length up to which every evaluated length reaches it (0: not even the base context).
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

from poskit.encodings import rope_scaling
from poskit.encodings.spec import EncodingSpec
from poskit.training import atomic_write_json, check_writable_dir, load_run
from poskit.training.files import read_json
from poskit.training.recipes.extend import load_extend_run
from poskit.training.run_dir import LOCK_FILE, MARKER_FILE, owned

from poskit.report.record import paper_block

from .configs.context_extension import Method
from .context_extension_plan import ChainJob, Evaluation, Plan, grid_methods, parse_scales, plan
from .evidence import write_record
from .jobs import train_job
from .outputs import COMPARE_MD as RESULTS_MD, safe_label
from .parallel import check_workers, run_parallel

# -- the jobs (top-level: run in worker processes)

def step_file(eval_dir, step: int) -> Path:
    return Path(eval_dir) / f"step-{step:05d}.json"


def evaluate_checkpoint(model, task, evaluation: Evaluation) -> dict:
    """Perplexity at every length (all positions and the last quarter) and passkey accuracy per length x depth."""
    from poskit.evaluate import evaluate_lengths
    from poskit.evaluate.passkey import passkey_grid

    rows = evaluate_lengths(model, task, list(evaluation.lengths), context=evaluation.base_context,
                            split=evaluation.split, n_chars=evaluation.n_chars)
    grid = passkey_grid(model, task, list(evaluation.lengths), list(evaluation.depths), evaluation.trials, seed=0,
                        split=evaluation.split)
    keep = ("lengths", "depths", "trials", "accuracy", "digit_accuracy", "key_logprob", "by_length", "mean_accuracy")
    return {"perplexity": rows, "passkey": {k: grid[k] for k in keep}}


def chain_job(job: ChainJob) -> list[dict]:
    """Extend (or take the base) to each step of `job` in turn, evaluating each; a step whose evaluation file
    exists is read back instead (a resumed command)."""
    from .extend import extend

    records = []
    for step in job.steps:
        path = step_file(job.eval_dir, step)
        if path.exists():
            records.append(read_json(path, "an evaluation of the context-extension reproduction"))
            continue
        t0 = time.perf_counter()
        if job.encoding is None:
            model, task, _ = load_run(job.parent)
            info = {"encoding": None, "tokens": 0, "train_seconds": 0.0}
        else:
            results = extend(job.parent, job.encoding, job.context, step, job.run_dir, resume=True, quiet=True,
                             checkpoint_every=job.checkpoint_every, eval_every=10**9, eval_batches=1,
                             final_eval_batches=1, seed=job.seed)
            model, task, cfg = load_extend_run(job.run_dir)
            info = {"encoding": {"name": cfg.model["encoding"], "options": cfg.model["encoding_options"]},
                    "tokens": results["tokens"]["fine_tuning"], "batch_size": cfg.batch_size,
                    "train_seconds": results["train_seconds"]}
        t1 = time.perf_counter()
        record = {"setup": job.setup, "seed": job.seed, "method": job.method, "scale": job.scale,
                  "context": job.context, "step": step, **info, **evaluate_checkpoint(model, task, job.evaluation),
                  "seconds": {"extend": round(t1 - t0, 3), "evaluate": round(time.perf_counter() - t1, 3)}}
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, record)
        records.append(record)
    return records


# -- the experiment

def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def _label(c: ChainJob) -> str:
    return f"{c.setup}/{c.method}" + (f" s={c.scale}" if c.scale else "")


def _cost(c: ChainJob) -> float:
    # training steps (a step costs about the same at every scale: tokens per step are the base's) and evaluations
    return max(c.steps) + 20 * len(c.steps)


def run_plan(p: Plan, *, workers: int = 2, resume: bool = False, quiet: bool = False) -> dict:
    """Train the bases, run the chains, aggregate: results.json (the results record, report/record.py, with every
    row of `aggregate` beside it), results.md and the plots in the plan's out_dir. An output directory that holds
    anything is refused without `resume`."""
    check_workers(workers)
    check_writable_dir(p.out_dir, "out")
    if p.out_dir.is_dir() and not resume and any(f.name not in (MARKER_FILE, LOCK_FILE) for f in p.out_dir.iterdir()):
        raise ValueError(f"out {str(p.out_dir)!r} holds an earlier run of this reproduction; pass --resume to "
                         "continue it, or choose another directory")
    t0 = time.perf_counter()
    with owned(p.out_dir, "compare"):
        _say(f"context-extension ({p.grid.name} grid): {len(p.bases)} base models, {len(p.chains)} extensions "
             f"(s = {', '.join(map(str, p.scales))}; steps {', '.join(map(str, p.steps))}), {workers} at a time",
             quiet)
        outcomes = run_parallel(train_job, p.bases, workers=workers,
                                labels=[f"base {name} seed {seed}" for seed, name in p.base_keys], quiet=quiet)
        # the longest chains first, so that two workers finish together
        order = sorted(range(len(p.chains)), key=lambda i: -_cost(p.chains[i]))
        done = run_parallel(chain_job, [p.chains[i] for i in order], workers=workers,
                            labels=[_label(p.chains[i]) for i in order], quiet=quiet)
        chains = [done[order.index(i)] for i in range(len(p.chains))]
        results = aggregate(p, [o.results for o in outcomes], [r for records in chains for r in records],
                            time.perf_counter() - t0)
        plots = write_plots(p, results)
        record = write_record(p.out_dir, kind="reproduction", name="context-extension",
                              arguments=p.arguments,
                              measurements=measurements(p, results), started=t0,
                              paper=paper_block(p.settings.paper, ()), files=[RESULTS_MD, *plots], details=results)
        results = {**results, "command": record.command, "wall_seconds": record.wall_seconds}
        (p.out_dir / RESULTS_MD).write_text(markdown(p, results, plots))
    return results


def measurements(p: Plan, results: dict) -> dict:
    """The record's measurements: one group per (setup, s), one entry per method and seed, with the numbers at
    the extended context 64 s ("extended": at the method's last step; "step N": the perplexity there; "1x": the
    perplexity at the base context). The zero-shot rows ("none", dynamic NTK) sit in every group of their setup."""
    groups: dict = {}
    context = p.settings.context
    for name in p.grid.setups:
        methods = grid_methods(p.settings, p.grid, p.settings.setup(name))
        for scale in p.scales:
            length = str(context * scale)
            group = groups.setdefault(f"{name} s={scale}", {})
            for method in methods:
                for seed in p.seeds:
                    rows = _series(results, name, seed, method.name, scale)
                    if not rows:
                        continue
                    end = max(rows, key=lambda r: r["step"])
                    accuracy = {str(b["length"]): b["accuracy"] for b in end["passkey"]["by_length"]}
                    extended = {"perplexity": end["perplexity"].get(length),
                                "last_perplexity": end["last_perplexity"].get(length),
                                "regression_1x": end["regression_1x"], "passkey": accuracy.get(length),
                                "passkey_1x": accuracy.get(str(context)),
                                "effective_window": end["effective_window"], "passkey_context": end["passkey_context"],
                                "token_fraction": end["token_fraction"]}
                    splits = {"extended": {k: v for k, v in extended.items() if v is not None},
                              "1x": {"perplexity": end["perplexity"].get(str(context))}}
                    for r in rows:
                        splits[f"step {r['step']}"] = {"perplexity": r["perplexity"].get(length)}
                    group.setdefault(method.name, []).append(
                        {"seed": seed, "run": f"evals/seed{seed}/{name}/" + (method.name if end["scale"] is None
                                                                             else f"{method.name}-s{scale}"),
                         "steps": end["step"], "train_seconds": end.get("train_seconds"), "splits": splits})
    return {"metric": "perplexity", "split": "extended", "variant_field": None, "groups": groups}


def reproduce(experiment, *, out_dir, seeds=None, encodings=None, steps=None, workers=None, resume=False,
              quiet=False, overrides=None, variants=None, preset=None, quick=False) -> dict:
    """The registry's runner: `poskit reproduce context-extension [--quick] [--seeds ...] [--steps N]
    [--variants 4,8] [key=value on the base models]`."""
    if encodings is not None:
        raise ValueError("--encodings: context-extension trains its own base models (rope, pope); choose the scales "
                         "with --variants and the fine-tuning length with --steps")
    if preset not in (None, "default"):
        raise ValueError(f"--preset: context-extension has only its CPU-scale grids (default and --quick), got "
                         f"{preset!r}")
    p = plan(experiment.settings, out_dir, quick=quick, seeds=seeds, steps=steps, scales=parse_scales(variants),
             overrides=overrides or ())
    return run_plan(p, workers=workers or experiment.settings.workers, resume=resume, quiet=quiet)


# -- aggregation

def yarn_bands(head_dim: int, base: float, context: int, beta_fast: float, beta_slow: float,
               factor: float = 8.0) -> dict:
    """How many rotary pairs fall in each of YaRN's bands: by its definition (rotations r inside the original
    context: kept r > beta_fast, interpolated r < beta_slow, the ramp between) and as computed (the frequency
    kept whole, divided by the factor, or blended)."""
    p = rope_scaling.RopeParameters(head_dim, base, factor, context, beta_fast=beta_fast, beta_slow=beta_slow)
    original = rope_scaling.default_inv_freq(head_dim, base)
    weight = ((rope_scaling.yarn_scaling(p)[0] / original - 1 / factor) / (1 - 1 / factor)).tolist()
    rotations = (context * original / (2 * math.pi)).tolist()
    return {"head_dim": head_dim, "base": base, "context": context, "beta_fast": beta_fast, "beta_slow": beta_slow,
            "rotations": [round(r, 3) for r in rotations],
            "by_definition": {"kept": sum(r > beta_fast for r in rotations),
                              "ramp": sum(beta_slow <= r <= beta_fast for r in rotations),
                              "interpolated": sum(r < beta_slow for r in rotations)},
            "as_computed": {"kept": sum(w > 1 - 1e-9 for w in weight),
                            "ramp": sum(1e-9 <= w <= 1 - 1e-9 for w in weight),
                            "interpolated": sum(w < 1e-9 for w in weight)},
            "kept_weight": [round(w, 3) for w in weight]}


def _bands(p: Plan) -> dict:
    out = {}
    model = p.settings.pretrain["model"]
    head_dim = model["d_model"] // model["n_heads"]
    for name in p.grid.setups:
        setup = p.settings.setup(name)
        spec = EncodingSpec.parse(setup.encoding)
        for method in setup.methods:
            if method.encoding and method.encoding.startswith("rope-yarn"):
                options = EncodingSpec.parse(method.encoding).options
                out[name] = yarn_bands(head_dim, float(spec.options.get("base", 10000.0)), p.settings.context,
                                       options.get("beta_fast", rope_scaling.YARN_BETA_FAST),
                                       options.get("beta_slow", rope_scaling.YARN_BETA_SLOW))
    return out


def passkey_contexts(by_length: list[dict], threshold: float) -> tuple[int, int]:
    """(PI's effective window, YaRN's passkey context) from passkey rows {"length", "accuracy"} (module docstring)."""
    rows = sorted(by_length, key=lambda r: r["length"])
    passing = [r["length"] for r in rows if r["accuracy"] >= threshold]
    window = 0
    for r in rows:
        if r["accuracy"] < threshold:
            break
        window = r["length"]
    return window, max(passing, default=0)


def _row(record: dict, base: dict, threshold: float, pretrain_tokens: int) -> dict:
    ppl = {str(r["length"]): r["perplexity"] for r in record["perplexity"]}
    last = {str(r["length"]): r["last_perplexity"] for r in record["perplexity"]}
    base_1x = base["perplexity"][0]["perplexity"]
    window, passkey_context = passkey_contexts(record["passkey"]["by_length"], threshold)
    return {k: record.get(k) for k in ("setup", "seed", "method", "scale", "context", "step", "encoding", "tokens",
                                       "train_seconds", "seconds")} | {
        "token_fraction": record["tokens"] / pretrain_tokens, "perplexity": ppl, "last_perplexity": last,
        "regression_1x": record["perplexity"][0]["perplexity"] - base_1x,
        "passkey": {k: record["passkey"][k] for k in ("lengths", "depths", "accuracy", "by_length", "mean_accuracy")},
        "effective_window": window, "passkey_context": passkey_context}


def aggregate(p: Plan, base_results: list[dict], records: list[dict], seconds: float) -> dict:
    """One dict with every number: the command, the grid, the YaRN bands, the base models, and one row per
    (setup, seed, method, scale, step) (an unchanged method's step 0 is its base model's row)."""
    threshold = p.settings.passkey_threshold
    pretrain = p.grid.pretrain_steps * p.settings.pretrain["batch_size"] * p.settings.context
    none = {(r["setup"], r["seed"]): r for r in records if r["method"] == "none"}
    rows = []
    for r in records:
        rows.append(_row(r, none[(r["setup"], r["seed"])], threshold, pretrain))
    for chain in p.chains:  # step 0 of direct fine-tuning and PoPE: the base model as trained
        method = next(m for m in p.settings.setup(chain.setup).methods if m.name == chain.method)
        if method.unchanged and 0 in p.steps and (chain.setup, chain.seed) in none:
            zero = dict(none[(chain.setup, chain.seed)], method=chain.method, scale=chain.scale, context=chain.context)
            rows.append(_row(zero, none[(chain.setup, chain.seed)], threshold, pretrain))
    rows.sort(key=lambda r: (r["setup"], r["seed"], r["method"], r["scale"] or 0, r["step"]))
    bases = {f"{name}/seed{seed}": {"steps": res["steps"], "train_seconds": res["train_seconds"],
                                     "encoding": res["encoding"], "tokens": pretrain, "splits": res["splits"]}
             for (seed, name), res in zip(p.base_keys, base_results)}
    timings = _timings(p, base_results, records)
    return {"experiment": "context-extension", "grid": dataclasses.asdict(p.grid),
            "seeds": list(p.seeds), "scales": list(p.scales), "steps": list(p.steps),
            "settings": {"paper": p.settings.paper, "context": p.settings.context, "split": p.settings.split,
                         "passkey_threshold": threshold, "pretrain": p.settings.pretrain,
                         "setups": [dataclasses.asdict(p.settings.setup(n)) for n in p.grid.setups]},
            "definitions": {"effective_window": f"the longest length up to which every evaluated length has passkey "
                                                f"accuracy >= {threshold} (PI)",
                            "passkey_context": f"the longest evaluated length with passkey accuracy >= {threshold} "
                                               "(YaRN)",
                            "regression_1x": "perplexity at the base context minus the base model's",
                            "token_fraction": "fine-tuning tokens / the base model's pre-training tokens"},
            "bands": _bands(p), "bases": bases, "rows": rows, "timings": timings,
            "grid_seconds": round(seconds, 1)}


def _timings(p: Plan, base_results: list[dict], records: list[dict]) -> dict:
    """Seconds per step measured in this run: pre-training per setup, fine-tuning per scale, and the evaluation
    of one checkpoint."""
    pre = {f"{name}/seed{seed}": res["train_seconds"] / max(1, res["steps"])
           for (seed, name), res in zip(p.base_keys, base_results)}
    fine: dict = {}
    for r in records:
        if r.get("tokens") and r["step"] == max(p.steps):
            fine.setdefault(str(r["scale"]), []).append(r["train_seconds"] / r["step"])
    evals = [r["seconds"]["evaluate"] for r in records if "seconds" in r]
    return {"pretrain_seconds_per_step": pre,
            "finetune_seconds_per_step": {s: sum(v) / len(v) for s, v in fine.items()},
            "evaluate_seconds_per_checkpoint": sum(evals) / len(evals) if evals else None}


# -- report

def _series(results: dict, setup: str, seed: int, method: str, scale: int) -> list[dict]:
    return [r for r in results["rows"] if (r["setup"], r["seed"], r["method"]) == (setup, seed, method)
            and r["scale"] in (scale, None)]


def write_plots(p: Plan, results: dict) -> list[str]:
    """Per setup: perplexity (all positions, last quarter) and passkey accuracy at 64 s vs fine-tuning steps,
    one panel per s; passkey heat maps of each method's last step and step 0. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import matplotlib.ticker

    from poskit.report.figure import save_figure
    from poskit.report.passkey import plot_passkey

    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.3g}")  # 7.2, not 7.2 x 10^0

    written = []
    seed = p.seeds[0]
    for name in p.grid.setups:
        methods = [m for m in grid_methods(p.settings, p.grid, p.settings.setup(name)) if m.name != "none"]
        if not methods:
            continue
        fig, axes = plt.subplots(3, len(p.scales), figsize=(max(6.0, 4.2 * len(p.scales)), 9.5), squeeze=False)
        for j, scale in enumerate(p.scales):
            length = str(p.settings.context * scale)
            for method in methods + [Method("none", None)]:
                rows = _series(results, name, seed, method.name, scale)
                if not rows:
                    continue
                tuned = method.fine_tune and method.encoding is not None
                steps = [r["step"] for r in rows] if tuned else [0, max(p.steps)]
                values = [[r["perplexity"].get(length) for r in rows], [r["last_perplexity"].get(length) for r in rows],
                          [next(b["accuracy"] for b in r["passkey"]["by_length"] if str(b["length"]) == length)
                           for r in rows]]
                for i, series in enumerate(values):
                    if not tuned:  # a zero-shot model: one value, drawn across the steps
                        series = series[:1] * len(steps)
                    axes[i][j].plot(steps, series, "-o" if tuned else "--", label=method.name, markersize=3)
            axes[0][j].set_title(f"{name}, seed {seed}: s = {scale} (context {length})", fontsize=10)
            for i, what in enumerate(("perplexity", "perplexity, last quarter", "passkey accuracy")):
                ax = axes[i][j]
                ax.set_xscale("symlog", linthresh=max(1, min(s for s in p.steps if s > 0) if max(p.steps) else 1))
                ax.set_xticks(list(p.steps), [str(s) for s in p.steps])
                ax.set_xlabel("fine-tuning steps")
                ax.set_ylabel(f"{what} at {length}")
                if i == 2:
                    ax.set_ylim(-0.03, 1.03)
                else:
                    ax.set_yscale("log")
                    ax.yaxis.set_major_formatter(plain)
                    ax.yaxis.set_minor_formatter(plain)
        axes[0][0].legend(fontsize=8)
        path = p.out_dir / f"steps-{safe_label(name)}.png"
        save_figure(fig, path, dpi=100)
        written.append(path.name)
    heat = p.out_dir / "passkey"
    heat.mkdir(exist_ok=True)
    last = max(p.steps)
    for r in results["rows"]:
        # each method's last step, and the zero-shot models (at the largest scale; "none" has one)
        shown = r["step"] == last if r["step"] else r["scale"] in (None, p.scales[-1])
        if r["seed"] != seed or not shown:
            continue
        label = f"{r['setup']}-{r['method']}" + (f"-s{r['scale']}" if r["scale"] else "") + f"-step{r['step']}"
        path = heat / f"{safe_label(label)}.png"
        plot_passkey(r["passkey"], path, context=p.settings.context, title=f"passkey: {label}")
        written.append(f"passkey/{path.name}")
    return written


def _fmt(v, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def markdown(p: Plan, results: dict, plots: list[str]) -> str:
    """The tables: per setup and scale, perplexity at 64 s by step and, at the last step, the 1x regression,
    passkey at 64 s, the effective window, the passkey context and the fine-tuning tokens; per setup, perplexity
    and passkey accuracy at every length at the last step; the YaRN bands."""
    from poskit.report import markdown_table

    lines = [f"# context extension ({p.grid.name} grid)\n", f"`{results['command']}`; {results['wall_seconds']:.0f} s. "
             f"Base models: context {p.settings.context}, {p.grid.pretrain_steps} steps. Perplexity per character on "
             f"the held-out {p.settings.split} split; passkey accuracy: exact match, mean over depths "
             f"{list(p.grid.depths)}, {p.grid.trials} prompts per cell; threshold {p.settings.passkey_threshold} "
             "(definitions in results.json). Fine-tuning tokens are a fraction of the base model's pre-training "
             "tokens (PI: about 0.04 % of LLaMA's, YaRN about 0.1 % of Llama 2's).\n"]
    seed, last = p.seeds[0], max(p.steps)
    lengths = [str(p.settings.context * m) for m in p.grid.lengths]
    for name in p.grid.setups:
        methods = grid_methods(p.settings, p.grid, p.settings.setup(name))
        lines.append(f"## {name} (seed {seed})\n")
        by_length = []
        for scale in p.scales if len(methods) > 1 else ():
            length = str(p.settings.context * scale)
            headers = ["method"] + [f"ppl@{length} step {s}" for s in p.steps] + [
                f"last-quarter ppl@{length}", "1x regression", f"passkey@{length}", "effective window",
                "passkey context", "tokens / pre-training"]
            table = []
            for method in methods:
                rows = {r["step"]: r for r in _series(results, name, seed, method.name, scale)}
                if not rows:
                    continue
                end = rows.get(last) or rows[max(rows)]
                accuracy = {str(b["length"]): b["accuracy"] for b in end["passkey"]["by_length"]}
                table.append([method.name] + [_fmt(rows[s]["perplexity"].get(length)) if s in rows else "" for s in
                                              p.steps] + [
                    _fmt(end["last_perplexity"].get(length)), _fmt(end["regression_1x"], 3), _fmt(accuracy.get(length)),
                    end["effective_window"], end["passkey_context"], f"{100 * end['token_fraction']:.1f} %"])
                if method.name != "none" or scale == p.scales[0]:
                    label = method.name if method.name == "none" else f"{method.name} s={scale}"
                    by_length.append([f"{label} (step {end['step']})"] +
                                     [_fmt(end["perplexity"].get(n)) for n in lengths] +
                                     [_fmt(accuracy.get(n)) for n in lengths])
            lines.append(f"s = {scale}:\n\n{markdown_table(headers, table)}\n")
        if len(methods) == 1:  # the base alone (the control)
            end = _series(results, name, seed, "none", p.scales[0])[0]
            accuracy = {str(b["length"]): b["accuracy"] for b in end["passkey"]["by_length"]}
            by_length.append(["none (step 0)"] + [_fmt(end["perplexity"].get(n)) for n in lengths] +
                             [_fmt(accuracy.get(n)) for n in lengths])
        lines.append("Every length, at each method's last step (perplexity, then passkey accuracy):\n\n" +
                     markdown_table(["model"] + [f"ppl@{n}" for n in lengths] + [f"passkey@{n}" for n in lengths],
                                    by_length) + "\n")
    lines.append("## YaRN's bands (rotary pairs)\n")
    band_rows = [[name, b["base"], f"{b['beta_fast']:g}/{b['beta_slow']:g}",
                  "/".join(str(b["by_definition"][k]) for k in ("kept", "ramp", "interpolated")),
                  "/".join(str(b["as_computed"][k]) for k in ("kept", "ramp", "interpolated"))]
                 for name, b in results["bands"].items()]
    lines.append(markdown_table(["setup", "base", "betas", "kept/ramp/interpolated (definition)",
                                 "kept/ramp/interpolated (computed)"], band_rows) + "\n")
    lines.append("## plots\n\n" + "\n".join(f"![]({f})" for f in plots if not f.startswith("passkey/")) + "\n")
    return "\n".join(lines)


__all__ = ["ChainJob", "Evaluation", "Plan", "aggregate", "chain_job", "evaluate_checkpoint", "passkey_contexts",
           "plan", "reproduce", "run_plan", "yarn_bands"]
