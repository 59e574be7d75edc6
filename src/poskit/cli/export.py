"""`poskit export` (a run as a Hugging Face directory) and `poskit convert-checkpoint` (old runs' single-file
checkpoints in the current format)."""
from __future__ import annotations

from .common import add_run_flags

#: what `poskit export --format` writes: poskit's own PoskitForCausalLM, or transformers' LlamaForCausalLM
EXPORT_FORMATS = ("poskit", "llama")


def add_convert_checkpoint(sub) -> None:
    p = sub.add_parser("convert-checkpoint", help="rewrite old runs' checkpoint.pt as safetensors + training state",
                       description="Rewrite the single-file checkpoint.pt of runs (training or translation runs) "
                                   "written by older poskit versions in "
                                   "the current format (model.safetensors, model_config.json and training_state.pt, "
                                   "committed by checkpoint.json) and remove checkpoint.pt. Resuming an old run "
                                   "converts it too, at its next checkpoint.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories holding a checkpoint.pt")
    add_run_flags(p, quiet="no summary lines", workers=False)
    p.set_defaults(func=cmd_convert_checkpoint)


def cmd_convert_checkpoint(args) -> int:
    from poskit.training.convert import convert_checkpoint

    for run in args.runs:
        record = convert_checkpoint(run)
        if not args.quiet:
            print(f"converted {run}: checkpoint.pt -> {record} (safetensors weights beside the training state)")
    return 0


def add_export(sub) -> None:
    p = sub.add_parser("export", help="write a trained run as a Hugging Face model directory (needs poskit[hf])",
                       description="Write RUN (a `poskit train` or `poskit extend` directory) as a Hugging Face "
                                   "directory: config.json (PoskitConfig), model.safetensors, poskit_run.json (run "
                                   "config, task, vocabulary; an extension's parent and schedule). "
                                   "--format llama writes a native LlamaForCausalLM instead (a RoPE run with "
                                   "Llama's architecture: mlp=swiglu; loads without poskit). See docs/hf.md.")
    p.add_argument("run", metavar="RUN", help="run directory of `poskit train` or `poskit extend`")
    p.add_argument("--hf", required=True, metavar="DIR", help="output directory (written whole, then renamed)")
    p.add_argument("--format", choices=EXPORT_FORMATS, default="poskit",
                   help="poskit: PoskitForCausalLM, any encoding (default); llama: transformers' own "
                        "LlamaForCausalLM, for runs whose architecture is Llama's (refused naming the first "
                        "model field that is not)")
    p.add_argument("--overwrite", action="store_true", help="replace DIR if it holds an earlier export (a directory poskit did not "
                   "write as an export is never replaced)")
    add_run_flags(p, quiet="no summary line", workers=False)
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    """`poskit export RUN --hf DIR [--format llama]`: a trained run as a Hugging Face directory (needs the `hf`
    extra)."""
    try:
        from poskit.hf import export_run
        from poskit.hf.llama import export_llama
    except ImportError as e:  # transformers missing: one line naming the extra
        raise ValueError(str(e)) from None
    if args.format == "llama":
        out = export_llama(args.run, args.hf, overwrite=args.overwrite)
        how = "a native LlamaForCausalLM: transformers.AutoModelForCausalLM.from_pretrained, no poskit needed"
    else:
        out = export_run(args.run, args.hf, overwrite=args.overwrite)
        how = "load with `import poskit.hf` and transformers.AutoModelForCausalLM.from_pretrained"
    if not args.quiet:
        print(f"{args.run} -> {out}: config.json + model.safetensors ({how}; see docs/hf.md)")
    return 0
