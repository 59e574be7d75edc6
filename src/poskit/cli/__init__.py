"""The `poskit` command: train, compare, extrapolate, demo, reproduce, study, analyze, finetune-glue, digits,
convert-checkpoint, list, data, export, report.

Every sub-command has --help. Settings not exposed as flags are set with trailing `key=value` overrides on
the training config (dotted for nested fields), e.g. `model.d_model=64 lr=1e-3 task_options.length=64`.

One module per command group adds its sub-parsers and runs them: train (train, compare, extrapolate),
reproduce (reproduce, study, list), demo, digits, analyze, finetune (finetune-glue), data, export (export,
convert-checkpoint), report (report, report collect); common holds the flag groups and checks they share.
"""
from __future__ import annotations

import argparse
import sys

from . import analyze, data, demo, digits, export, finetune, report, reproduce, train
from .common import base_config as _base_config  # the name the training tests build configs with

__all__ = ["build_parser", "main"]

# the sub-commands, in the order `poskit --help` lists them
_SUBCOMMANDS = (train.add_train, train.add_compare, train.add_extrapolate, demo.add_demo, reproduce.add_reproduce,
                reproduce.add_study, export.add_convert_checkpoint, analyze.add_analyze, finetune.add_finetune_glue,
                digits.add_digits, reproduce.add_list, data.add_data, export.add_export, report.add_report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="poskit", description="Train and compare positional encodings.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version="poskit " + _version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in _SUBCOMMANDS:
        add(sub)
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
    from poskit.report.record import command_line

    try:
        with command_line(["poskit", *(sys.argv[1:] if argv is None else argv)]):  # recorded in results files
            return args.func(args)
    except (ValueError, OSError) as e:
        # bad input or a file that cannot be read or written: one line naming the argument or the file
        parser.exit(2, f"poskit {args.command}: error: {e}\n")
