"""`poskit analyze frequency RUN... | decay | correlation | phase-bias RUN... | cope-gates RUN...` (poskit.analyze); each analysis returns its result,
the arguments that resolve it and its files, and the command writes the results record (results.json) beside
them."""
from __future__ import annotations

from pathlib import Path

from .common import add_run_flags, check_positive, encoding_names, parse_ints


def add_analyze(sub) -> None:
    p = sub.add_parser("analyze", help="frequency usage of trained runs, RoPE's long-term decay, position correlation, "
                                       "PoPE's phase bias over training",
                       description="frequency RUN...: mean query/key magnitude per frequency component, per layer "
                                   "and head, over held-out inputs (PoPE paper Figs. 3-6). decay: RoFormer's "
                                   "long-term decay bound (App. C) beside poskit's measured logits. correlation: "
                                   "position-correlation matrices of absolute encodings (Legendre paper Figs. 1, 3). "
                                   "phase-bias RUN...: where PoPE's phase bias sits over training, beside the "
                                   "validation metric (runs of the phase-bias rules compared). cope-gates RUN...: "
                                   "what CoPE's gates count, by kind of key token, and the attention from position "
                                   "alone on one window (CoPE paper Figs. 4 and 6).")
    p.add_argument("analysis", choices=["frequency", "decay", "correlation", "phase-bias", "cope-gates"])
    p.add_argument("runs", nargs="*", metavar="RUN",
                   help="frequency: run directories of trained rope/pope models; phase-bias: of trained pope models; "
                        "cope-gates: of trained cope/cope-alibi text models")
    p.add_argument("--metric", default="accuracy", help="phase-bias: the validation metric beside delta (default "
                                                        "accuracy)")
    p.add_argument("--split", default="test", help="frequency, cope-gates: held-out split (default test)")
    p.add_argument("--max-tokens", type=int, default=16384,
                   help="frequency, cope-gates: tokens analysed per run (default 16384)")
    p.add_argument("--encodings", help="decay: default rope,pope; correlation: default sinusoidal,legendre")
    p.add_argument("--head-dim", type=int, default=128, help="decay: head dimension (default 128)")
    p.add_argument("--max-distance", type=int, default=256, help="decay: largest relative distance (default 256)")
    p.add_argument("--samples", type=int, default=256, help="decay: random contents averaged (default 256)")
    p.add_argument("--seed", type=int, default=0, help="decay: seed of the random contents (default 0)")
    p.add_argument("--dim", type=int, default=512, help="correlation: encoding dimension (default 512, the paper's)")
    p.add_argument("--positions", type=int, default=300, help="correlation: positions 0..N-1 (default 300)")
    p.add_argument("--high-from", type=int, default=356, help="correlation: first 'high' dimension (default 356)")
    p.add_argument("--anchors", help="correlation: positions n of the curves (default 1,40,100,200,260,299)")
    add_run_flags(p, quiet="print only the files written, not the summary", out="runs/analyze-<analysis>",
                  workers=False)
    p.set_defaults(func=cmd_analyze)


def cmd_analyze(args) -> int:
    out = Path(args.out or f"runs/analyze-{args.analysis}")
    if args.analysis not in ("frequency", "phase-bias", "cope-gates") and args.runs:
        raise ValueError(f"RUN directories are read by `analyze frequency`, `phase-bias` and `cope-gates` only; `analyze "
                         f"{args.analysis}` takes none, got {args.runs}")
    import time

    started = time.perf_counter()
    names = (encoding_names(args.encodings, "--encodings", f"analyze {args.analysis} builds each encoding with its defaults")
             if args.encodings else [])
    result, arguments, files = {"frequency": _frequency, "decay": _decay, "correlation": _correlation,
                                "phase-bias": _phase_bias, "cope-gates": _cope_gates}[args.analysis](args, out, names)
    from poskit.experiments.evidence import analysis_record

    analysis_record(args.analysis, out, arguments, result, started, files)  # results.json, the results record
    print(f"wrote {out / 'results.json'}")
    return 0


def _frequency(args, out: Path, names: list[str]) -> tuple:
    from poskit import analyze

    if not args.runs:
        raise ValueError("`poskit analyze frequency` needs at least one RUN directory (a trained rope or pope run)")
    check_positive(args, "max_tokens")
    report = analyze.write_frequency(args.runs, out, split=args.split, max_tokens=args.max_tokens)
    for r in report["runs"] if not args.quiet else ():
        shares = ", ".join(f"L{i} q {s['q_high_quarter_share']:.2f} k {s['k_high_quarter_share']:.2f}"
                           for i, s in enumerate(r["summary"]))
        print(f"{r['encoding']:8s} {r['run_dir']}: share of magnitude in the highest-frequency quarter: {shares}")
    print(f"wrote {out / analyze.frequency.FREQUENCY_JSON}, {out / analyze.frequency.FREQUENCY_PNG}")
    return report, {"runs": list(args.runs), "split": args.split, "max_tokens": args.max_tokens}, \
        [analyze.frequency.FREQUENCY_JSON, analyze.frequency.FREQUENCY_PNG]


def _decay(args, out: Path, names: list[str]) -> tuple:
    from poskit import analyze

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
    return result, {"encodings": names or ["rope", "pope"], "head_dim": args.head_dim,
                    "max_distance": args.max_distance, "samples": args.samples, "seed": args.seed}, \
        [analyze.decay.DECAY_JSON, analyze.decay.DECAY_PNG]


def _correlation(args, out: Path, names: list[str]) -> tuple:
    from poskit import analyze

    anchors = tuple(parse_ints(args.anchors, "--anchors")) if args.anchors else analyze.correlation.PAPER_ANCHORS
    result = analyze.write_correlation(out, names or ["sinusoidal", "legendre"], dim=args.dim,
                                       positions=args.positions, high_from=args.high_from, anchors=anchors)
    for name, e in result["encodings"].items() if not args.quiet else ():
        print(f"{name:10s} mean |corr| between positions: all dims {e['mean_abs_offdiag_all']:.3f}, "
              f"dims >= {args.high_from}: {e['mean_abs_offdiag_high']:.3f}")
    print(f"wrote {out / analyze.correlation.CORRELATION_JSON}, {out / analyze.correlation.CORRELATION_PNG}")
    return result, {"encodings": names or ["sinusoidal", "legendre"], "dim": args.dim, "positions": args.positions,
                    "high_from": args.high_from, "anchors": list(anchors)}, \
        [analyze.correlation.CORRELATION_JSON, analyze.correlation.CORRELATION_PNG]


def _phase_bias(args, out: Path, names: list[str]) -> tuple:
    from poskit.analyze import phase_bias

    if not args.runs:
        raise ValueError("`poskit analyze phase-bias` needs at least one RUN directory (a trained pope run)")
    result = phase_bias.write_phase_bias(args.runs, out, metric=args.metric)
    for label, runs in result["groups"].items() if not args.quiet else ():
        last = ", ".join(f"{r[args.metric][-1]:.3f} (delta at 0: {r['delta_at_zero'][-1]:.2f})" for r in runs)
        print(f"{label}: final {args.metric} per run {last}")
    if not args.quiet:
        print(phase_bias.summary_table(result), end="")
    print(f"wrote {out / phase_bias.PHASE_BIAS_JSON}, {out / phase_bias.PHASE_BIAS_PNG}, {out / phase_bias.PHASE_BIAS_MD}")
    return result, {"runs": list(args.runs), "metric": args.metric}, \
        [phase_bias.PHASE_BIAS_JSON, phase_bias.PHASE_BIAS_PNG, phase_bias.PHASE_BIAS_MD]


def _cope_gates(args, out: Path, names: list[str]) -> tuple:
    from poskit.analyze import cope_gates

    if not args.runs:
        raise ValueError("`poskit analyze cope-gates` needs at least one RUN directory (a trained cope text run)")
    check_positive(args, "max_tokens")
    report = cope_gates.write_cope_gates(args.runs, out, split=args.split, max_tokens=args.max_tokens)
    for r in report["runs"] if not args.quiet else ():
        for i, layer in enumerate(r["layers"]):
            ratios = " ".join(f"{x:5.2f}" for x in layer["newline_ratio"])
            counts = " ".join(f"{x:6.1f}" for x in layer["window_count"])
            print(f"{r['encoding']} {r['run_dir']} L{i}: gate on newlines / mean gate per head {ratios}; "
                  f"count over a window per head {counts}")
    print(f"wrote {out / cope_gates.COPE_GATES_JSON}, {out / cope_gates.COPE_GATES_PNG}")
    return report, {"runs": list(args.runs), "split": args.split, "max_tokens": args.max_tokens}, \
        [cope_gates.COPE_GATES_JSON, cope_gates.COPE_GATES_PNG]
