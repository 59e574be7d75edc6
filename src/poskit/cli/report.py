"""`poskit report`: regenerate the tables in README.md and docs/ from the committed results (docs/results/),
`poskit report --check` to verify them, `poskit report collect OUT_DIR` to commit an experiment's results."""
from __future__ import annotations

from pathlib import Path


def add_report(sub) -> None:
    p = sub.add_parser(
        "report", help="regenerate the tables of README.md and docs/ from docs/results/ (--check: verify them)",
        description="Every table between <!-- report: NAME table=KIND --> and <!-- /report --> markers in "
                    "README.md and docs/**/*.md is generated from docs/results/NAME/results.json (KIND: summary, "
                    "seeds, values, extrapolation, compact, coverage). A table whose configuration differs from what its "
                    "command runs today is labelled stale. `poskit report collect OUT_DIR` copies an "
                    "experiment's results.json and plots to docs/results/NAME/.")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming every table that differs from what its results generate, "
                        "and every gap in the coverage table")
    p.add_argument("--root", default=".", help="the repository root (default: the current directory)")
    actions = p.add_subparsers(dest="action", metavar="collect")
    c = actions.add_parser("collect", help="copy OUT_DIR's results.json and PNG plots to docs/results/NAME/")
    c.add_argument("out_dir", metavar="OUT_DIR", help="an experiment's output directory (holding results.json)")
    c.add_argument("--name", help="the docs/results name (default: the experiment's, e.g. jsb, study-NAME, "
                                  "analyze-decay)")
    c.add_argument("--root", dest="collect_root", help="the repository root (default: the current directory)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    root = Path(getattr(args, "collect_root", None) or args.root)
    if not root.is_dir():
        raise ValueError(f"--root {str(root)!r} must be a directory (the repository root)")
    if args.action == "collect":
        from poskit.report.collect import collect

        dest, written = collect(args.out_dir, root, args.name)
        for path in written:
            print(f"wrote {path}")
        from poskit.report.record import RESULTS_JSON, read_record

        # an analysis keeps several numbers per encoding: the values table shows them all
        kind = "values" if read_record(dest / RESULTS_JSON).kind == "analysis" else "summary"
        print(f"put a table in README.md or docs/*.md with <!-- report: {dest.name} table={kind} --> ... "
              "<!-- /report --> and run `poskit report`")
        return 0
    from poskit.experiments.evidence import resolve_today
    from poskit.report import markers

    outcome = markers.regenerate(root, resolve_today)
    for block, label in outcome.stale:
        print(f"{block.file}:{block.line}: {block.title}: {label}")
    if args.check:
        for path, block in outcome.differing:
            print(f"{path}:{block.line}: table {block.title} differs from what docs/results/ generates; run "
                  "`poskit report`")
        for problem in outcome.coverage_problems:
            print(f"coverage (report/coverage.py): {problem}")
        bad = bool(outcome.differing or outcome.coverage_problems)
        print(f"poskit report --check: {'FAILED' if bad else 'ok'} ({len(outcome.files)} files with tables, "
              f"{len(outcome.differing)} tables differ, {len(outcome.coverage_problems)} coverage problems)")
        return 1 if bad else 0
    for problem in outcome.coverage_problems:
        print(f"coverage (report/coverage.py): {problem}")
    for path in markers.write(outcome):
        print(f"wrote {path}")
    return 1 if outcome.coverage_problems else 0
