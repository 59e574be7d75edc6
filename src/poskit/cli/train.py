"""`poskit train`, `poskit compare` and `poskit extrapolate`: one run, several encodings x seeds, and trained
language models evaluated at longer windows."""
from __future__ import annotations

import sys
from pathlib import Path

from poskit.encodings.spec import EncodingSpec

from .common import (EPILOG_OVERRIDES, Wrapped, add_common_training, add_run_flags, as_flag, base_config,
                     check_positive, parse_ints, rank)

EPILOG_RESUME = ("resume: --resume --run-dir D continues D from its checkpoint with the config saved in "
                 "D/config.json, so the result equals an uninterrupted run's. --steps N with N above the saved "
                 "max_steps extends the run (the cosine schedule is recomputed for the new length from the "
                 "checkpoint on; a time-budget run cannot be extended); any other flag or key=value that "
                 "changes the saved config is an error naming the field. Task and encoding may be omitted.")


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train one model, writing a run directory",
                       epilog=EPILOG_OVERRIDES + "\n\n" + EPILOG_RESUME, formatter_class=Wrapped)
    add_common_training(p, task_required=False)
    p.add_argument("--encoding", help="positional encoding (see `poskit list`), options as name:key=value, e.g. "
                                      "pope:delta_init=uniform; required unless resuming")
    p.add_argument("--seed", type=int, help="seed of initialisation, dropout and data")
    p.add_argument("--run-dir", help="output directory (default runs/<task>-<encoding>-seed<seed>)")
    p.add_argument("--stop-after", type=int, help="stop (with a checkpoint) after this many steps of this invocation")
    add_run_flags(p, quiet="no progress bars or status lines", workers=False,
                  resume="continue the run in --run-dir from its checkpoint with its saved config; only --steps "
                         "may change it, upwards, to extend the run (see below)")
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    from poskit.experiments.outputs import safe_label
    from poskit.training import train

    check_positive(args, "steps", "train_seconds", "lr", "batch_size", "stop_after")
    spec = EncodingSpec.parse(args.encoding, arg="--encoding") if args.encoding is not None else None
    cfg = _train_config(args, spec)
    # a run is named by the spec it was asked for, so that two specs of one encoding get two directories
    label = spec.label if spec is not None else cfg.model.encoding
    run_dir = Path(args.run_dir or f"runs/{cfg.task}-{safe_label(label)}-seed{cfg.seed}")
    args.quiet = args.quiet or rank() > 0  # under torchrun rank 0 reports
    if not args.quiet:
        print(f"train: {cfg.task} with {label} -> {run_dir}", file=sys.stderr)
    results = train(cfg, run_dir, resume=args.resume, stop_after=args.stop_after, quiet=args.quiet)
    if rank() > 0:
        return 0
    if results is None:
        print(f"stopped after this invocation's steps; continue with: poskit train --resume --run-dir {run_dir}")
        return 0
    metric = results["metric"]
    parts = [f"{s} {metric} {m[metric]:.4f}" for s, m in results["splits"].items()]
    print(f"{cfg.task} / {label}: {results['steps']} steps in {results['train_seconds']:.1f} s; " + "; ".join(parts))
    print(f"run directory: {run_dir}")
    return 0


def _train_config(args, spec: EncodingSpec | None):
    """The run's config: resuming, the saved one (flags and overrides may only extend max_steps,
    train.resume_config); otherwise the task's defaults with the flags."""
    from poskit.training import CONFIG_FILE, load_config

    saved_at = Path(args.run_dir) / CONFIG_FILE if args.run_dir else None
    if args.resume and saved_at is not None and saved_at.exists():
        saved = load_config(args.run_dir)
        if args.steps is not None and saved.train_seconds is not None:
            raise ValueError(f"--steps cannot extend {args.run_dir!r}: it trains for a time budget "
                             f"(train_seconds={saved.train_seconds:g}) that planned its max_steps")
        return base_config(args, spec, saved=saved.to_dict())
    starting = args.task is not None and spec is not None
    if args.resume and args.run_dir and not starting:
        # nothing to resume here; say so rather than ask for the flags of a new run
        if not Path(args.run_dir).exists():
            raise ValueError(f"--run-dir {args.run_dir!r} does not exist: --resume continues an existing run "
                             "directory (give --task and --encoding to start a new run there)")
        raise ValueError(f"--run-dir {args.run_dir!r} holds no run to resume (no {CONFIG_FILE}); give --task and "
                         "--encoding to start one there")
    for flag in ("task", "encoding"):
        if getattr(args, flag) is None:
            raise ValueError(f"--{flag} is required (except with --resume on an existing --run-dir)")
    return base_config(args, spec)


def add_compare(sub) -> None:
    p = sub.add_parser("compare", help="train several encodings x seeds; table and plot", epilog=EPILOG_OVERRIDES)
    add_common_training(p)
    p.add_argument("--encodings", required=True,
                   help="comma-separated encodings, options as name:key=value, e.g. rope,pope:delta_init=uniform")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--split", default="test", help="split of the headline metric (default test)")
    add_run_flags(p, quiet="no progress bars or status lines", out="runs/compare-<task>",
                  resume="reuse finished runs, continue interrupted ones (their saved configs must match; "
                         "--steps may extend them)")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    from poskit.experiments.compare import run_compare
    from poskit.experiments.outputs import COMPARE_JSON, COMPARE_MD, COMPARE_PLOT
    from poskit.tasks import task_split_names

    check_positive(args, "steps", "train_seconds", "lr", "batch_size", "workers")
    base = base_config(args, None)
    encodings = EncodingSpec.parse_list(args.encodings, arg="--encodings")
    seeds = parse_ints(args.seeds, "--seeds")
    splits = task_split_names(base.task)
    if args.split not in splits:
        raise ValueError(f"--split must be one of the splits of task {base.task!r}: {list(splits)}, got {args.split!r}")
    out = Path(args.out or f"runs/compare-{base.task}")
    results = run_compare(base, encodings, seeds, out, workers=args.workers, resume=args.resume, quiet=args.quiet,
                          split=args.split)
    if not results and rank() > 0:  # under torchrun rank 0 reports
        return 0
    print((out / COMPARE_MD).read_text())
    print(f"wrote {out / COMPARE_JSON}, {out / COMPARE_MD}, {out / COMPARE_PLOT}")
    return 0 if results else 1


def add_extrapolate(sub) -> None:
    from poskit.evaluate import ROPE_SCALINGS

    p = sub.add_parser("extrapolate", help="evaluate trained LMs on windows longer than their context")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories of `poskit train --task shakespeare`")
    p.add_argument("--lengths", default="1x,2x,4x,8x", help="window lengths, Nx = N times the training context")
    p.add_argument("--rope-scaling", help=f"test-time variants for rope runs, comma-separated from {','.join(ROPE_SCALINGS)}")
    p.add_argument("--split", default="test", help="held-out split (default test)")
    p.add_argument("--n-chars", type=int, help="evaluate on the first N characters of the split (default all)")
    add_run_flags(p, quiet="no status lines", out="the first run's parent")
    p.set_defaults(func=cmd_extrapolate)


def cmd_extrapolate(args) -> int:
    from poskit.experiments.extrapolate import run_extrapolate
    from poskit.experiments.outputs import EXTRAPOLATION_JSON, EXTRAPOLATION_MD, EXTRAPOLATION_PLOT

    check_positive(args, "n_chars", "workers")
    scalings = tuple(s for s in (args.rope_scaling or "").split(",") if s)
    try:
        report = run_extrapolate(args.runs, args.lengths, scalings=scalings, out_dir=args.out, split=args.split,
                                 n_chars=args.n_chars, workers=args.workers, quiet=args.quiet)
    except ValueError as e:
        # run_extrapolate names its parameters; on the command line they are flags
        raise ValueError(as_flag(str(e), ("split", "n_chars", "workers", "lengths", "out"))) from None
    print(report["table"])
    out = Path(args.out) if args.out else Path(args.runs[0]).parent
    print(f"wrote {out / EXTRAPOLATION_JSON}, {out / EXTRAPOLATION_MD}, {out / EXTRAPOLATION_PLOT}")
    return 0
