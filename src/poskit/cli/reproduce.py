"""`poskit reproduce`, `poskit study` and `poskit list`: the experiments of the registry
(experiments/registry.py), run by name."""
from __future__ import annotations

from pathlib import Path

from .common import EPILOG_OVERRIDES, add_run_flags, check_positive, parse_ints


def add_reproduce(sub) -> None:
    from poskit.experiments.registry import experiments

    reproductions = experiments("reproduction")
    with_variants = [e for e in reproductions if getattr(e.settings, "variants", ())]
    p = sub.add_parser("reproduce", help="a CPU-scale reproduction of a paper's diagnostic (see `poskit list`)",
                       epilog=EPILOG_OVERRIDES)
    p.add_argument("name", nargs="?", metavar="NAME", help=f"one of {', '.join(e.name for e in reproductions)}")
    p.add_argument("--list", action="store_true", help="list the reproductions, one line each, and exit")
    p.add_argument("--seeds", help="comma-separated seeds (default: the reproduction's)")
    p.add_argument("--encodings", help="override the reproduction's encodings")
    p.add_argument("--steps", type=int, help="override the number of steps (of every variant)")
    p.add_argument("--preset", choices=["default", "paper"],
                   help="default: CPU scale; paper: the paper's model size, sequence length and schedule (a GPU job; "
                        "translation: the papers' Transformer-base)")
    p.add_argument("--variants",
                   help="for reproductions with variants, the ones to run, comma-separated ("
                        + "; ".join(f"{e.name}: {e.settings.variant_name} from "
                                    f"{','.join(str(v.value) for v in e.settings.variants)}" for e in with_variants)
                        + "; default all)")
    add_run_flags(p, quiet="no status lines", out="runs/reproduce-<NAME>",
                  resume="reuse finished runs, continue interrupted ones")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. model.n_layers=4")
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(args) -> int:
    """Any reproduction of the registry, through its runner: every runner takes these arguments."""
    from poskit.encodings.spec import EncodingSpec
    from poskit.experiments.registry import experiment, experiments

    if args.list:
        _print_experiments("reproduction", indent="")
        return 0
    if args.name is None:
        raise ValueError(f"NAME is required (one of {sorted(e.name for e in experiments('reproduction'))}), or "
                         "--list to list them")
    exp = experiment(args.name, "reproduction", arg="NAME")
    check_positive(args, "steps", "workers")
    out = Path(args.out or f"runs/reproduce-{args.name}")
    exp.run(out_dir=out, seeds=parse_ints(args.seeds, "--seeds") if args.seeds else None,
            encodings=EncodingSpec.parse_list(args.encodings, arg="--encodings") if args.encodings else None,
            steps=args.steps, workers=args.workers, resume=args.resume, quiet=args.quiet, overrides=args.overrides,
            variants=args.variants, preset=args.preset)
    print((out / exp.table).read_text())
    print("wrote " + ", ".join(str(out / name) for name in exp.outputs))
    return 0


def add_study(sub) -> None:
    p = sub.add_parser("study", help="a background study: a queue of long runs with early stops (resumable)",
                       description="Runs the study's runs, --workers at a time, each in its own single-thread "
                                   "process; a run stops early when it has learned or plateaued. Running the "
                                   "same command again resumes. Writes study.md and study.png in --out.")
    p.add_argument("name", metavar="NAME", help="the study (see `poskit list`)")
    p.add_argument("--out", help="study directory (default runs/study-<NAME>)")
    p.add_argument("--workers", type=int, help="runs training at once (default 2)")
    p.add_argument("--report-only", action="store_true", help="only write the table and plots of what is done")
    p.add_argument("--attention", metavar="GROUP",
                   help="also plot where the group's trained models attend (Indirect Indexing: source, target)")
    p.set_defaults(func=cmd_study)


def cmd_study(args) -> int:
    import time

    from poskit.experiments.registry import experiment

    started = time.perf_counter()
    exp = experiment(args.name, "study", arg="NAME")
    study, out = exp.settings, Path(args.out or f"runs/study-{args.name}")
    groups = sorted({r.group for r in study.runs})
    if args.attention is not None and args.attention not in groups:  # refused before any run or file
        raise ValueError(f"--attention must name a group of study {args.name!r}: one of {groups}, "
                         f"got {args.attention!r}")
    if not args.report_only:
        check_positive(args, "workers")
        exp.run(out_dir=out, workers=args.workers or 2)
    runs = {}
    if args.attention:  # where the group's trained models look (seed 0 of each encoding); checked first
        runs = {r.config["model"]["encoding"]: out / r.name for r in study.runs
                if r.group == args.attention and r.config.get("seed", 0) == 0 and (out / r.name).exists()}
        if not runs:
            raise ValueError(f"--attention: group {args.attention!r} has no trained runs in {out} yet")
    from poskit.experiments.study import write_report

    paths = write_report(exp, out, started)  # the table, plot and results record
    if runs:
        from poskit.report.lookup_plot import write_lookup_report

        paths += write_lookup_report(runs, out / f"attention-{args.attention}")
    for path in paths:
        print(f"wrote {path}")
    return 0


def add_list(sub) -> None:
    p = sub.add_parser("list", help="available encodings, tasks and reproductions")
    p.set_defaults(func=cmd_list)


def cmd_list(args) -> int:
    import poskit
    from poskit.tasks import available_tasks

    print("encodings:      " + ", ".join(poskit.available_encodings()))
    print("tasks:          " + ", ".join(available_tasks()))
    for kind, heading in (("reproduction", "reproductions"), ("study", "studies"), ("demo", "demos")):
        print(f"{heading}:")
        _print_experiments(kind, indent="  ")
    return 0


def _print_experiments(kind: str, indent: str) -> None:
    from poskit.experiments.registry import experiments

    for e in experiments(kind):
        print(f"{indent}{e.name:20s} {e.summary}")
