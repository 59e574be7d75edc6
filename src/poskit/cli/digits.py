"""`poskit digits`: the ViT digits demo of the registry (experiments/digits.py)."""
from __future__ import annotations

from pathlib import Path

from .common import add_run_flags, check_positive, encoding_names, parse_ints


def add_digits(sub) -> None:
    from poskit.experiments.registry import experiment

    digits = experiment("digits", "demo")
    p = sub.add_parser("digits", help=digits.summary)
    p.add_argument("--encodings", help=f"comma-separated, among {', '.join(digits.settings.encodings)} (default all)")
    p.add_argument("--seeds", help="comma-separated seeds (default "
                                   f"{','.join(str(s) for s in digits.settings.seeds)})")
    p.add_argument("--epochs", type=int, help=f"training epochs (default {digits.settings.epochs})")
    add_run_flags(p, quiet="no status lines", out="runs/digits", out_default="runs/digits", workers=False)
    p.set_defaults(func=cmd_digits)


def cmd_digits(args) -> int:
    from poskit.experiments.digits import results_table
    from poskit.experiments.registry import experiment

    check_positive(args, "epochs")
    changes = {}
    if args.encodings:
        changes["encodings"] = tuple(encoding_names(
            args.encodings, "--encodings", "digits builds its encodings itself (axial rope and pope)"))
    if args.seeds:
        changes["seeds"] = tuple(parse_ints(args.seeds, "--seeds"))
    if args.epochs:
        changes["epochs"] = args.epochs
    try:
        results = experiment("digits", "demo").run(out_dir=args.out, quiet=args.quiet, **changes)
    except ValueError as e:  # a settings error names the flag that set it
        raise ValueError(str(e).replace("encodings must", "--encodings must").replace("seeds must", "--seeds must")
                         ) from None
    print(results_table(results))
    print(f"wrote {Path(args.out) / 'results.json'}, results.md, digits_vit.png ({results['wall_seconds']} s)")
    return 0
