"""`poskit demo`: the demo of the registry, its flags' defaults read from its settings."""
from __future__ import annotations

from .common import add_run_flags, as_flag, check_positive


def add_demo(sub) -> None:
    from poskit.experiments.registry import experiment

    demo = experiment("demo", "demo").settings
    p = sub.add_parser("demo", help=demo.summary)
    p.add_argument("--encodings", default=",".join(demo.encodings), help=f"default {','.join(demo.encodings)}")
    p.add_argument("--train-seconds", type=float, default=demo.train_seconds,
                   help=f"training time per LM in seconds (default {demo.train_seconds:g})")
    p.add_argument("--context", type=int, default=demo.context, help=f"training context (default {demo.context})")
    p.add_argument("--lengths", default=demo.lengths, help=f"evaluation windows (default {demo.lengths})")
    p.add_argument("--n-chars", type=int, default=demo.n_chars,
                   help=f"held-out characters evaluated per length (default {demo.n_chars})")
    p.add_argument("--diagnostic-steps", type=int, default=demo.diagnostic_steps,
                   help=f"training steps per diagnostic model (default {demo.diagnostic_steps})")
    p.add_argument("--no-diagnostic", action="store_true", help="skip the short diagnostic comparison")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    add_run_flags(p, quiet="only the final tables", out=demo.out_dir, out_default=demo.out_dir,
                  workers_default=demo.workers)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    from poskit.encodings.spec import EncodingSpec
    from poskit.experiments.registry import experiment

    check_positive(args, "train_seconds", "context", "n_chars", "diagnostic_steps", "workers")
    encodings = EncodingSpec.parse_list(args.encodings, arg="--encodings")
    try:
        experiment("demo", "demo").run(
            out_dir=args.out, encodings=encodings, train_seconds=args.train_seconds, context=args.context,
            lengths=args.lengths, n_chars=args.n_chars, diagnostic=not args.no_diagnostic,
            diagnostic_steps=args.diagnostic_steps, workers=args.workers, seed=args.seed, quiet=args.quiet)
    except ValueError as e:
        raise ValueError(as_flag(str(e), ("lengths", "train_seconds", "context", "n_chars", "workers", "out"))) from None
    return 0
