"""`poskit finetune-glue`: a masked-language-model run fine-tuned on a GLUE task (experiments/finetune.py)."""
from __future__ import annotations

from pathlib import Path

from .common import add_run_flags


def add_finetune_glue(sub) -> None:
    from poskit.tasks.glue import DEFAULT_GLUE_SOURCE, GLUE_TASKS

    p = sub.add_parser("finetune-glue", help="fine-tune a masked-language-model run on a GLUE task (RoFormer 4.3)",
                       description="Fine-tunes the encoder of RUN (a `poskit reproduce mlm` or `poskit train --task "
                                   "mlm-wiki` run directory) with a classification head on GLUE, read with the "
                                   "datasets package (the data extra).")
    p.add_argument("run", metavar="RUN", help="run directory of a masked-language-model run")
    p.add_argument("--task", required=True, choices=list(GLUE_TASKS), help="GLUE task")
    p.add_argument("--data", help=f"a directory saved by DatasetDict.save_to_disk (hf:DIR), a hub dataset "
                                  f"(default {DEFAULT_GLUE_SOURCE}, needs the network), or word-order: an "
                                  f"offline stand-in in CoLA's format (--task cola; is a sentence in its own word "
                                  f"order?), built from the Wikipedia extract")
    p.add_argument("--epochs", type=int, default=3, help="epochs (default 3, the paper's)")
    p.add_argument("--lr", type=float, default=5e-5, help="peak learning rate (default 5e-5; the paper tries 2-5e-5)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per step (default 32, the paper's)")
    p.add_argument("--max-length", type=int, default=128,
                   help="tokens per example; longer ones are cut and counted (default 128; the paper's 512)")
    p.add_argument("--max-train-examples", type=int, help="use only the first N training examples")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    add_run_flags(p, quiet="no per-epoch lines", out="RUN/glue-<TASK>", workers=False)
    p.set_defaults(func=cmd_finetune_glue)


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
