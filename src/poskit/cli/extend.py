"""`poskit extend`: a trained decoder's context extended by fine-tuning with another RoPE scaling (PI, NTK,
YaRN, ...), plain RoPE or its own encoding (experiments/extend.py, training/recipes/extend.py)."""
from __future__ import annotations

from pathlib import Path

from .common import Wrapped, add_run_flags


def add_extend(sub) -> None:
    p = sub.add_parser(
        "extend", help="extend a trained decoder's context: swap its encoding's scaling, fine-tune at the new context",
        formatter_class=Wrapped,
        description="Starts from RUN (a finished `poskit train` or `poskit extend` run, or a `poskit export --hf` "
                    "directory), replaces its encoding by --encoding, copies its weights and fine-tunes all of them "
                    "at --context, as Position Interpolation and YaRN extend LLaMA. The new run directory records "
                    "the parent run and its exact checkpoint; --resume continues it (a larger --steps extends it).",
        epilog="Encodings: a RoPE run extends with any RoPE scaling (rope-linear = PI, rope-ntk, rope-yarn, "
               "rope-dynamic, rope-llama3, rope-longrope) or plain rope (direct fine-tuning); any other run with its "
               "own encoding (pope). Scaling options default to the extension: factor = CONTEXT / RUN's original "
               "context, original_max_positions = that context; give them to override (rope-yarn:factor=8:beta_fast=4)."
               "\n\nSchedule (PI, YaRN): AdamW (0.9, 0.95), no weight decay, a linear warm-up over --warmup steps "
               "from 10 % of --lr, then --lr constant, gradients clipped at 1. The default --lr is RUN's peak lr / 15 "
               "(the papers' ratio: LLaMA pre-trained at 3e-4, fine-tuned at 2e-5); the default --batch-size keeps "
               "RUN's tokens per step. --steps 0 writes the swapped model (zero-shot).")
    p.add_argument("run", metavar="RUN", help="a finished run directory, an extension run, or an exported HF directory")
    p.add_argument("--encoding", required=True, metavar="SPEC",
                   help="the encoding to fine-tune with, e.g. rope-yarn:factor=8, rope-linear, rope-ntk, rope, pope")
    p.add_argument("--context", type=int, required=True, metavar="L2", help="the new training context (tokens)")
    p.add_argument("--steps", type=int, required=True, metavar="N", help="fine-tuning steps (0: zero-shot)")
    p.add_argument("--lr", type=float, help="learning rate after the warm-up (default RUN's peak lr / 15)")
    p.add_argument("--warmup", type=int, default=20, help="linear warm-up steps from 10%% of --lr (default 20)")
    p.add_argument("--batch-size", type=int, help="windows per step (default: RUN's tokens per step)")
    p.add_argument("--checkpoint-every", type=int, metavar="K", help="checkpoint every K steps (default 50)")
    p.add_argument("--passkey-fraction", type=float, default=0.0,
                   help="fraction of training windows that are passkey prompts (default 0: plain text, as the papers)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data stream and dropout (default 0)")
    add_run_flags(p, quiet="no progress lines", out="RUN-<SPEC>-<L2> beside RUN", workers=False,
                  resume="continue an interrupted (or extend a finished) extension in --out")
    p.set_defaults(func=cmd_extend)


def cmd_extend(args) -> int:
    from poskit.encodings.spec import EncodingSpec
    from poskit.experiments.extend import extend
    from poskit.experiments.outputs import safe_label

    spec = EncodingSpec.parse(args.encoding, arg="--encoding")
    run = Path(args.run)
    out = Path(args.out) if args.out else run.parent / f"{run.name}-{safe_label(spec.label)}-{args.context}"
    results = extend(args.run, spec, args.context, args.steps, out, resume=args.resume, quiet=args.quiet,
                     lr=args.lr, warmup=args.warmup, batch_size=args.batch_size,
                     checkpoint_every=args.checkpoint_every, passkey_fraction=args.passkey_fraction, seed=args.seed)
    metric = results["metric"]
    shown = ", ".join(f"{split} {metric} {values[metric]:.4f}" for split, values in results["splits"].items())
    print(f"extended {args.run} to context {results['context']} with {spec.label}: {results['steps']} steps; {shown}")
    print(f"wrote {out}")
    return 0
