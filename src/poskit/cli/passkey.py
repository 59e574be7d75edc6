"""`poskit passkey`: passkey retrieval accuracy of a trained decoder per prompt length and key depth, as
results.json and a heat map (experiments/extend.py passkey_report; the prompts: tasks/passkey.py)."""
from __future__ import annotations

from pathlib import Path

from .common import add_run_flags


def add_passkey(sub) -> None:
    from poskit.experiments.extend import DEFAULT_DEPTHS

    p = sub.add_parser("passkey", help="passkey retrieval of a trained decoder per length and key depth (heat map)",
                       description="Scores RUN (a `poskit train` or `poskit extend` run directory, or a `poskit export "
                                   "--hf` directory of a text LM) on passkey prompts: filler from held-out text, a "
                                   "random 5-digit key at each depth, greedy decoding, exact match. Writes "
                                   "results.json and passkey.png.")
    p.add_argument("run", metavar="RUN", help="a run directory, an extension run or an exported HF directory")
    p.add_argument("--lengths", default="1x,2x,4x,8x",
                   help="prompt lengths, Nx = N times RUN's training context (default 1x,2x,4x,8x)")
    p.add_argument("--depths", default=",".join(f"{d:g}" for d in DEFAULT_DEPTHS),
                   help="key depths in [0, 1], 0 = the key first (default 0,0.25,0.5,0.75,1)")
    p.add_argument("--trials", type=int, default=10, help="prompts per (length, depth) (default 10)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the prompts (default 0: every run gets the same prompts)")
    add_run_flags(p, quiet="no summary line", out="RUN/passkey", workers=False)
    p.set_defaults(func=cmd_passkey)


def cmd_passkey(args) -> int:
    from poskit.experiments.extend import PASSKEY_JSON, PASSKEY_PLOT, passkey_report

    out = Path(args.out) if args.out else Path(args.run) / "passkey"
    result = passkey_report(args.run, lengths=args.lengths, depths=args.depths, trials=args.trials, seed=args.seed,
                            out_dir=out)
    if not args.quiet:
        by_length = ", ".join(f"{row['length']}: {100 * row['accuracy']:.0f}%" for row in result["by_length"])
        print(f"passkey accuracy of {args.run} ({result['encoding']}, trained at {result['context']}) by length: "
              f"{by_length}")
    print(f"wrote {out / PASSKEY_JSON}, {out / PASSKEY_PLOT}")
    return 0
