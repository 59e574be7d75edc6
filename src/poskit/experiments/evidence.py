"""The results record (report/record.py) of every experiment kind: the fully resolved configuration its
arguments give, the command that reruns it, and the writing of the record itself.

Resolution is one function per kind, from the arguments a record stores, and the same function serves both
ends: a runner records what `resolve` gives when it writes its results, and `poskit report` calls `resolve`
again on the stored arguments to find what the same command would run today. A default that changed in
between (an encoding's constructor default, a reproduction's config) shows as a difference (report/staleness.py).
"""
from __future__ import annotations

import copy
import time
from dataclasses import asdict, replace
from pathlib import Path

from poskit.report.record import ResultsRecord, new_record, paper_block, relative_to, resolve_encodings

from .resolution import without_run_fields

__all__ = ["ANALYSES", "analysis_record", "compare_record", "equivalent_command", "resolve", "resolve_today",
           "write_record"]


def _train_config(fields: dict) -> dict:
    from poskit.training import TrainConfig

    return TrainConfig.from_dict(fields).to_dict()


# ------------------------------------------------------------------------------------------------ resolution

def resolve_reproduction(name: str, arguments: dict) -> dict:
    from .configs import TranslationReproduction
    from .overrides import apply_overrides
    from .registry import experiment
    from .configs.context_extension import ContextExtension
    from .resolution import reproduction_config, reproduction_specs, select_variants

    r = experiment(name, "reproduction").settings
    if isinstance(r, TranslationReproduction):
        return _resolve_translation(name, r, arguments)
    if isinstance(r, ContextExtension):
        from .context_extension_plan import resolve_plan

        return resolve_plan(r, arguments)
    cfg = reproduction_config(r, arguments.get("preset"), arguments.get("steps"), arguments.get("overrides"))
    specs = reproduction_specs(r, arguments.get("encodings"))
    seeds = arguments.get("seeds")
    out = {"base": without_run_fields(_train_config(cfg)), "encodings": resolve_encodings(specs),
           "seeds": list(seeds or r.seeds), "split": r.split, "extrapolation": r.extrapolation}
    chosen = select_variants(r, arguments.get("variants"))
    if chosen:
        out["variant_field"] = r.variant_field
        out["variants"] = [{"value": v.value, "seeds": list(seeds or v.seeds or r.seeds),
                            "base": without_run_fields(_train_config(
                                apply_overrides(copy.deepcopy(cfg), [f"{r.variant_field}={v.value}"])))}
                           for v in chosen]
        del out["seeds"]
    return out


def _resolve_translation(name: str, r, arguments: dict) -> dict:
    from poskit.encodings.spec import EncodingSpec
    from poskit.training.recipes.seq2seq import Seq2SeqConfig

    from .resolution import translation_config

    preset = "paper" if arguments.get("preset") == "paper" else "cpu"
    base = translation_config(r, name, preset, arguments.get("steps"), arguments.get("overrides"))
    base["model"]["encoding"] = "sinusoidal"  # a placeholder to validate the rest; set per run
    specs = ([EncodingSpec.of(e) for e in arguments["encodings"]] if arguments.get("encodings") is not None
             else EncodingSpec.parse_list(r.encodings))
    return {"base": without_run_fields(Seq2SeqConfig.from_dict(base).to_dict()),
            "encodings": resolve_encodings(specs), "seeds": list(arguments.get("seeds") or r.seeds),
            "preset": preset}


def resolve_compare(arguments: dict) -> dict:
    """A `poskit compare`: its recorded base config, checked again (today's validation and field defaults),
    and its encodings with today's constructor defaults."""
    return {"base": without_run_fields(_train_config(arguments["base"])),
            "encodings": resolve_encodings(arguments["encodings"]), "seeds": list(arguments["seeds"])}


def resolve_study(name: str, arguments: dict) -> dict:
    from poskit.encodings.spec import EncodingSpec

    from .registry import experiment

    study = experiment(name, "study").settings
    runs, specs = {}, []
    for r in study.runs:
        cfg = r.train_config()
        spec = EncodingSpec.from_config(cfg.model.encoding, cfg.model.encoding_options)
        runs[r.name] = {"group": r.group, "seed": cfg.seed, "encoding": spec.label,
                        "config": without_run_fields(cfg.to_dict())}
        if spec not in specs:
            specs.append(spec)
    return {"runs": runs, "encodings": resolve_encodings(specs), "rule": asdict(study.rule),
            "metric_split": study.metric_split}


def resolve_demo(name: str, arguments: dict) -> dict:
    from poskit.encodings.spec import EncodingSpec

    from .resolution import lm_config
    from .registry import experiment

    settings = experiment(name, "demo").settings
    a = {**demo_defaults(settings), **arguments}
    specs = [EncodingSpec.of(e) for e in a["encodings"]]
    lm = lm_config(specs[0], a["context"], a["train_seconds"], a["seed"], settings).to_dict()
    out = {"language_model": without_run_fields(lm), "encodings": resolve_encodings(specs),
           "lengths": a["lengths"], "n_chars": a["n_chars"], "seed": a["seed"]}
    if a["diagnostic"]:
        out["diagnostic"] = without_run_fields(_train_config(dict(settings.diagnostic.config,
                                                                  max_steps=a["diagnostic_steps"])))
    return out


def demo_defaults(settings) -> dict:
    """The arguments of `poskit demo` left at their defaults (its settings' values)."""
    return {"encodings": list(settings.encodings), "train_seconds": settings.train_seconds,
            "context": settings.context, "lengths": settings.lengths, "n_chars": settings.n_chars,
            "diagnostic": True, "diagnostic_steps": settings.diagnostic_steps, "seed": 0}


def resolve_digits(name: str, arguments: dict) -> dict:
    from .registry import experiment

    changes = {k: tuple(v) if isinstance(v, list) else v for k, v in arguments.items()}
    settings = replace(experiment(name, "demo").settings, **changes)
    return {"settings": asdict(settings), "encodings": resolve_encodings(settings.encodings)}


# `poskit analyze NAME`: which paper figure each analysis computes, and the arguments it resolves
ANALYSES = {
    "decay": {"paper": "RoFormer, Fig. 3 (long-term decay; a figure, no numbers)", "numbers": ()},
    "correlation": {"paper": "Legendre PE paper, Figs. 1 and 3 (position correlation of sinusoidal and Legendre "
                             "encodings)",
                    "numbers": ({"source": "Legendre PE paper, Fig. 1 (b)",
                                 "metric": "correlation between sinusoidal positions in dimensions > 356",
                                 "columns": ("lower bound",), "rows": {"sinusoidal": (0.999,)},
                                 "note": "the text's '> 0.999', even between positions 2 and 299"},)},
    "frequency": {"paper": "PoPE paper, Figs. 3-6 (frequency usage of queries and keys; figures, no numbers)",
                  "numbers": ()},
    "phase-bias": {"paper": "PoPE paper, the phase bias delta clamped to [-2 pi, 0] (a diagnostic of poskit's "
                            "phase-bias rules; no paper numbers)", "numbers": ()},
    "cope-gates": {"paper": "CoPE paper, Figs. 4 and 6 (attention from position alone and gate values at paragraph "
                            "and section boundaries; figures, no numbers)", "numbers": ()},
}


def resolve_analysis(name: str, arguments: dict) -> dict:
    if name not in ANALYSES:
        raise ValueError(f"analysis must be one of {sorted(ANALYSES)}, got {name!r}")
    out = {k: v for k, v in arguments.items() if k != "encodings"}
    if arguments.get("encodings"):
        out["encodings"] = resolve_encodings(arguments["encodings"])
    return out


def resolve(kind: str, name: str, arguments: dict) -> dict:
    """The fully resolved configuration that `arguments` give the experiment `name` of `kind` with today's
    code and defaults."""
    if kind == "reproduction":
        return resolve_reproduction(name, arguments)
    if kind == "compare":
        return resolve_compare(arguments)
    if kind == "study":
        return resolve_study(name, arguments)
    if kind == "demo":
        return resolve_digits(name, arguments) if name == "digits" else resolve_demo(name, arguments)
    if kind == "analysis":
        return resolve_analysis(name, arguments)
    raise ValueError(f"kind must be one of reproduction, compare, study, demo, analysis; got {kind!r}")


def resolve_today(record: ResultsRecord) -> dict:
    """What the command of `record` would run today (report/staleness.py compares it with record.resolved)."""
    return resolve(record.kind, record.name, record.arguments)


# ------------------------------------------------------------------------------------------------- commands

def _listed(values) -> str:
    return ",".join(str(v) for v in values)


def equivalent_command(kind: str, name: str, arguments: dict, out_dir) -> list[str]:
    """The command line that runs what a Python call with `arguments` ran (recorded when no CLI command is)."""
    a, out = arguments, ["--out", str(out_dir)]
    if kind == "reproduction":
        cmd = ["poskit", "reproduce", name]
        for flag, key in (("--seeds", "seeds"), ("--encodings", "encodings"), ("--variants", "variants")):
            if a.get(key) is not None:
                cmd += [flag, a[key] if isinstance(a[key], str) else _listed(a[key])]
        for flag, key in (("--steps", "steps"), ("--preset", "preset")):
            if a.get(key) is not None:
                cmd += [flag, str(a[key])]
        return cmd + (["--quick"] if a.get("quick") else []) + out + list(a.get("overrides") or [])
    if kind == "compare":
        return ["poskit", "compare", "--task", str(a["base"].get("task")), "--encodings", _listed(a["encodings"]),
                "--seeds", _listed(a["seeds"])] + out
    if kind == "study":
        return ["poskit", "study", name] + out
    if kind == "demo":
        cmd = ["poskit", name]
        for key, value in a.items():
            if key == "diagnostic":
                cmd += [] if value else ["--no-diagnostic"]
            else:
                cmd += [f"--{key.replace('_', '-')}", _listed(value) if isinstance(value, (list, tuple)) else str(value)]
        return cmd + out
    if kind == "analysis":
        cmd = ["poskit", "analyze", name] + list(a.get("runs") or [])
        for key, value in a.items():
            if key != "runs" and value is not None:
                cmd += [f"--{key.replace('_', '-')}", _listed(value) if isinstance(value, (list, tuple)) else str(value)]
        return cmd + out
    raise ValueError(f"kind must be one of reproduction, compare, study, demo, analysis; got {kind!r}")


# -------------------------------------------------------------------------------------------------- records

def write_record(out_dir, *, kind: str, name: str, arguments: dict, measurements: dict, started: float,
                 paper: dict | None = None, files=(), details: dict | None = None) -> ResultsRecord:
    """Resolve, stamp and write <out_dir>/results.json; `started` is the runner's time.perf_counter() at its
    start (the record's wall time)."""
    record = new_record(name=name, kind=kind, equivalent=equivalent_command(kind, name, arguments, out_dir),
                        arguments=arguments, resolved=resolve(kind, name, arguments), measurements=measurements,
                        paper=paper, wall_seconds=time.perf_counter() - started, out_dir=out_dir, files=files,
                        details=details)
    record.write(out_dir)
    return record


def measurements_of(metric: str | None, split: str | None, groups: dict, variant_field: str | None = None) -> dict:
    return {"metric": metric, "split": split, "variant_field": variant_field, "groups": groups}


def compare_record(out_dir, results: dict, dirs: dict, *, kind: str, name: str, arguments: dict, started: float,
                   paper: dict | None = None, files=()) -> ResultsRecord:
    """The record of a compare (or of a reproduction run as one compare): `results` the compare's summary
    (kept as the record's details), `dirs` {label: run directories}."""
    from poskit.report.aggregate import compare_measurements

    measurements = measurements_of(results["metric"], results["split"],
                                   {"": compare_measurements(dirs, out_dir)})
    return write_record(out_dir, kind=kind, name=name, arguments=arguments, measurements=measurements,
                        started=started, paper=paper, files=files, details=results)


def reproduction_paper(settings) -> dict | None:
    """The `paper` field of an experiment's record from its settings (`paper` text, `paper_numbers`)."""
    return paper_block(getattr(settings, "paper", None), getattr(settings, "paper_numbers", ()))


def analysis_record(name: str, out_dir, arguments: dict, result: dict, started: float, files=()) -> ResultsRecord:
    """The record of `poskit analyze NAME`: a few numbers that summarise the analysis's figure per encoding
    (or per run), beside the full result file the analysis writes."""
    import math

    groups: dict = {"": {}}

    def entry(values: dict) -> list[dict]:
        clean = {k: v for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        return [{"seed": None, "run": None, "steps": None, "train_seconds": None, "splits": {"analysis": clean}}]

    if name == "decay":
        picks = [d for d in (0, 16, 64, 128, 256, 1024) if d <= result["distances"][-1]]
        for enc, c in result["curves"].items():
            values = {}
            for d in picks:
                if c.get("upper_bound_relative") is not None:
                    values[f"bound@{d}"] = c["upper_bound_relative"][d]
                if c.get("mean_abs_logit_relative") is not None:
                    values[f"logit@{d}"] = c["mean_abs_logit_relative"][d]
            groups[""][enc] = entry(values)
        metric = "bound@64"
    elif name == "correlation":
        for enc, e in result["encodings"].items():
            anchors = [min((v for j, v in enumerate(curve) if j != int(a) and math.isfinite(v)), default=math.nan)
                       for a, curve in e["curves_high"].items()]
            groups[""][enc] = entry({"mean_abs_corr_all": e["mean_abs_offdiag_all"],
                                     "mean_abs_corr_high": e["mean_abs_offdiag_high"],
                                     "min_anchor_corr_high": min(anchors) if anchors else math.nan})
        metric = "mean_abs_corr_high"
    elif name == "frequency":
        for r in result["runs"]:
            values = {f"L{i}_{k}": v for i, layer in enumerate(r["summary"]) for k, v in layer.items()}
            # the run named by its last two directories (rope/seed0, lm/pope): no machine path
            groups[""][f"{r['encoding']} ({'/'.join(Path(r['run_dir']).parts[-2:])})"] = entry(values)
        metric = "L0_q_high_quarter_share"
    elif name == "phase-bias":
        key = result["metric"]
        for label, runs in result["groups"].items():
            # each run's last evaluation, named by its last two directories (pope/seed0): no machine path
            groups[""][label] = [{"seed": r["seed"], "run": "/".join(Path(r["run_dir"]).parts[-2:]),
                                  "steps": r["steps"][-1], "train_seconds": None,
                                  "splits": {"analysis": {k: r[k][-1] for k in (key, "delta_at_zero", "delta_mean")
                                                          if r[k][-1] is not None},
                                             # the finished run's held-out result (its results.json)
                                             **{split: {key: v} for split, v in r.get("final", {}).items()}}}
                                 for r in runs]
        metric = key
    elif name == "cope-gates":
        # one group per run (its last two directories, e.g. cope/seed0: no machine path), one row per layer and head
        groups = {}
        for r in result["runs"]:
            rows = groups.setdefault('/'.join(Path(r['run_dir']).parts[-2:]), {})
            for i, layer in enumerate(r["layers"]):
                for h, gates in enumerate(layer["mean_gate"]):
                    rows[f"L{i} h{h}"] = entry({**{f"gate_{c}": g for c, g in zip(r["classes"], gates)
                                                   if c != "other"},
                                                "gate_all": layer["mean_gate_all"][h],
                                                "newline_ratio": layer["newline_ratio"][h],
                                                "window_count": layer["window_count"][h]})
        metric = "newline_ratio"
    else:
        raise ValueError(f"analysis must be one of {sorted(ANALYSES)}, got {name!r}")
    info = ANALYSES[name]
    args = dict(arguments)
    if args.get("runs"):
        args["runs"] = [relative_to(r, Path.cwd()) for r in args["runs"]]
    return write_record(out_dir, kind="analysis", name=name, arguments=args,
                        measurements=measurements_of(metric, "analysis", groups), started=started,
                        paper=paper_block(info["paper"], info["numbers"]), files=files)
