"""`poskit report`: every table in README.md and docs/**/*.md that sits between markers is generated from the
committed results records under docs/results/ (and the coverage table from report/coverage.py).

Marker syntax (each marker a line of its own, outside code blocks; the generated text goes between them and is
replaced on every run):

    <!-- report: NAME table=KIND [option=value ...] -->
    ...generated...
    <!-- /report -->

NAME is a directory of docs/results/ (its results.json, or for table=benchmark its benchmark.json), or several
separated by commas for table=compact and table=contrast, or `coverage` for table=coverage. KIND is one of
summary, seeds, values, extrapolation, curves, compact, contrast, coverage, benchmark. Options:
group=G (one group of a record: a variant such as 3, the demo's lm or diagnostic), metric=M (e.g. loss, nll,
bleu; default the record's headline metric), split=S (the headline split of a summary; the split a values or
curves table shows), reach=X (curves: also the first step whose mean reaches X), key=K (extrapolation:
perplexity or last_perplexity), paper=NNN (coverage: one paper's rows), option=O (contrast, required: the
encoding option whose two values are set against each other, e.g. delta_projection; report/contrast.py),
part=P (benchmark: which table of the benchmark document, e.g. attention, peers, decode; default attention).

Every generated table starts with its provenance line (command, code version, date, machine, wall time) and,
when its record's configuration is not what its command would run today, a visible "stale: ..." label
(report/staleness.py). A NAME without results generates a "not backed" line instead of a table (`not_backed`). `check`
regenerates without writing and names every file and table whose text differs, which `poskit report --check`
and the test suite turn into a failure, and every problem of the coverage data.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import coverage
from .benchmark import BENCHMARK_JSON, benchmark_table, read_document
from .benchmark import provenance as benchmark_provenance
from .contrast import contrast_table
from .record import RESULTS_JSON, code_label, read_record
from .results_tables import (TABLE_KINDS, compact_table, curves_table, extrapolation_table_of, link, provenance,
                             seeds_table, summary_table, values_table)
from .staleness import stale_label

RESULTS_DIR = Path("docs") / "results"
KINDS = (*TABLE_KINDS, "contrast", "coverage", "benchmark")
_MULTI = ("compact", "contrast")  # the kinds that take several results names
OPTIONS = {"summary": {"group", "metric", "split"}, "seeds": {"group", "metric"}, "values": {"group", "split"},
           "extrapolation": {"key"}, "curves": {"split", "reach"}, "compact": set(), "contrast": {"option"},
           "coverage": {"paper"}, "benchmark": {"part"}}
REQUIRED = {"contrast": {"option"}}
_OPEN = re.compile(r"<!-- report: (?P<args>.*?) -->")  # a whole line (parse_blocks)
_CLOSE = "<!-- /report -->"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class MarkerError(ValueError):
    """A malformed marker: the message names the file and line."""


@dataclass(frozen=True)
class Block:
    """One marked table of a markdown file."""

    file: Path
    line: int
    names: tuple
    kind: str
    options: dict
    start: int
    """Offset of the generated text (just after the opening marker's line)."""
    end: int
    """Offset of the closing marker."""

    @property
    def title(self) -> str:
        opts = "".join(f" {k}={v}" for k, v in self.options.items())
        return f"{','.join(self.names)} table={self.kind}{opts}"


def markdown_files(root) -> list[Path]:
    """README.md and every markdown file under docs/ (sorted): the files `poskit report` regenerates."""
    root = Path(root)
    files = [root / "README.md"] if (root / "README.md").exists() else []
    return files + sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else files


def _lines(text: str):
    """(offset, line) of every line outside fenced code blocks (``` or ~~~): a marker shown in a code block is
    an example, not a marker."""
    offset, fence = 0, None
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if fence is None and stripped[:3] in ("```", "~~~"):
            fence = stripped[:3]
        elif fence is not None and stripped.startswith(fence):
            fence = None
        elif fence is None:
            yield offset, line
        offset += len(line)


def parse_blocks(path: Path, text: str) -> list[Block]:
    """The marked blocks of `text` (file `path`). A marker is a line of its own, outside code blocks; a marker
    written inside a sentence or a code block is left alone."""
    blocks, open_ = [], None
    for offset, line in _lines(text):
        number = text.count("\n", 0, offset) + 1
        stripped = line.strip()
        if stripped == _CLOSE:
            if open_ is None:
                raise MarkerError(f"{path}:{number}: {_CLOSE} without an opening <!-- report: ... --> marker")
            blocks.append(Block(path, *open_, offset))
            open_ = None
            continue
        m = _OPEN.fullmatch(stripped)
        if m is None:
            continue
        if open_ is not None:
            raise MarkerError(f"{path}:{open_[0]}: marker has no {_CLOSE} before the next marker")
        open_ = (number, *_parse_marker(path, number, m.group("args")), offset + len(line))
    if open_ is not None:
        raise MarkerError(f"{path}:{open_[0]}: marker has no {_CLOSE} before the end of the file")
    return blocks


def _parse_marker(path: Path, line: int, args: str) -> tuple:
    """(names, kind, options) of a marker's text, checked."""
    words = args.split()
    if not words or "=" in words[0]:
        raise MarkerError(f"{path}:{line}: a report marker must start with a results name, e.g. "
                          "<!-- report: jsb table=summary -->")
    options = {}
    for w in words[1:]:
        key, eq, value = w.partition("=")
        if not eq or not value or key in options:
            raise MarkerError(f"{path}:{line}: marker options must be key=value, each once; got {w!r}")
        options[key] = value
    kind = options.pop("table", None)
    if kind not in KINDS:
        raise MarkerError(f"{path}:{line}: table must be one of {list(KINDS)}, got {kind!r}")
    unknown = sorted(set(options) - OPTIONS[kind])
    if unknown:
        raise MarkerError(f"{path}:{line}: options of table={kind} must be among {sorted(OPTIONS[kind])}, "
                          f"got {unknown}")
    missing = sorted(REQUIRED.get(kind, set()) - set(options))
    if missing:
        raise MarkerError(f"{path}:{line}: table={kind} needs the option(s) {missing}")
    names = tuple(words[0].split(","))
    if any(not _NAME.fullmatch(n) for n in names) or (len(names) > 1 and kind not in _MULTI):
        raise MarkerError(f"{path}:{line}: the results name must be a docs/results directory name (several, "
                          f"comma-separated, only for table={' and table='.join(_MULTI)}), got {words[0]!r}")
    if kind == "coverage" and names != ("coverage",):
        raise MarkerError(f"{path}:{line}: table=coverage takes the name coverage, got {words[0]!r}")
    return names, kind, options


def not_backed(name: str) -> str:
    """The text of a marked table whose results are not committed: it says so instead of inventing a table, and
    warns that any table typed by hand right after it is not checked against anything."""
    return (f"**Not backed by a results file:** docs/results/{name}/ holds no results.json, so nothing is "
            "generated here, and a table typed below this line is not checked by `poskit report --check` and "
            f"may predate today's code. To back it, run the command with `--out runs/{name}`, then "
            f"`poskit report collect runs/{name} --name {name}` and `poskit report`.\n")


def benchmark_not_backed(name: str) -> str:
    """`not_backed` for a benchmark table: the document comes from a benchmark script's --json, not a run."""
    return (f"**Not backed by a benchmark file:** docs/results/{name}/ holds no {BENCHMARK_JSON}, so nothing is "
            "generated here, and a table typed below this line is not checked by `poskit report --check`. To back "
            f"it, run the benchmark with `--json docs/results/{name}/{BENCHMARK_JSON}`, then `poskit report`.\n")


class Generator:
    """Makes the text of each block from the records under <root>/docs/results (each read once)."""

    def __init__(self, root, resolve_today):
        self.root = Path(root)
        self.resolve_today = resolve_today
        self._records: dict = {}
        self.stale: list[tuple[Block, str]] = []

    def results_path(self, name: str) -> Path:
        return self.root / RESULTS_DIR / name / RESULTS_JSON

    def record(self, name: str):
        """(record or None when not backed, its stale label or None)."""
        if name not in self._records:
            path = self.results_path(name)
            record = read_record(path) if path.exists() else None
            label = stale_label(record, self.resolve_today) if record is not None else None
            self._records[name] = (record, label)
        return self._records[name]

    def evidence(self, md: Path, name: str) -> str:
        record, label = self.record(name)
        if record is None:
            return f"not backed (no `docs/results/{name}/`)"
        return (f"[{name}]({link(md, self.results_path(name))}) ({record.date[:10]}, {code_label(record.code)})"
                + (" **stale**" if label else ""))

    def text(self, block: Block) -> str:
        if block.kind == "coverage":
            table = coverage.coverage_table(lambda name: self.evidence(block.file, name), block.options.get("paper"))
            return f"*Generated by `poskit report` from report/coverage.py and docs/results/.*\n\n{table}\n"
        if block.kind in _MULTI:
            entries = [(n, *self.record(n)) for n in block.names]
            for n, _, label in entries:
                if label:
                    self.stale.append((block, f"{n}: {label}"))
            try:
                table = (compact_table(entries) if block.kind == "compact" else
                         contrast_table([(n, r) for n, r, _ in entries], block.options["option"]))
            except ValueError as e:
                raise MarkerError(f"{block.file}:{block.line}: {e}") from None
            return f"*Generated by `poskit report` from docs/results/ (each row's record).*\n\n{table}\n"
        name = block.names[0]
        if block.kind == "benchmark":
            return self.benchmark_text(block, name)
        record, label = self.record(name)
        if record is None:
            return not_backed(name)
        o = block.options
        try:
            if block.kind == "summary":
                table = summary_table(record, group=o.get("group"), metric=o.get("metric"), split=o.get("split"))
            elif block.kind == "seeds":
                table = seeds_table(record, group=o.get("group"), metric=o.get("metric"))
            elif block.kind == "values":
                table = values_table(record, group=o.get("group"), split=o.get("split"))
            elif block.kind == "curves":
                reach = o.get("reach")
                table = curves_table(record, split=o.get("split"), reach=None if reach is None else float(reach))
            else:
                table = extrapolation_table_of(record, key=o.get("key", "perplexity"))
        except ValueError as e:
            raise MarkerError(f"{block.file}:{block.line}: {e}") from None
        lines = [provenance(record, link(block.file, self.results_path(name)))]
        if label:
            self.stale.append((block, label))
            lines.append(f"\n**{label}** (rerun `{record.command}` and `poskit report collect`)")
        return "\n".join(lines) + f"\n\n{table}\n"

    def benchmark_text(self, block: Block, name: str) -> str:
        path = self.root / RESULTS_DIR / name / BENCHMARK_JSON
        if not path.exists():
            return benchmark_not_backed(name)
        try:
            doc = read_document(path)
            table = benchmark_table(doc, block.options.get("part", "attention"))
        except ValueError as e:
            raise MarkerError(f"{block.file}:{block.line}: {e}") from None
        return f"{benchmark_provenance(doc, link(block.file, path))}\n\n{table}\n"


@dataclass
class Outcome:
    files: dict
    """{path: new text} of every markdown file with markers."""
    differing: list
    """[(path, Block)] whose generated text differs from the file's."""
    stale: list
    """[(Block, label)] of stale tables."""
    coverage_problems: list


def regenerate(root, resolve_today) -> Outcome:
    """Generate every marked table under `root` (nothing is written)."""
    gen = Generator(root, resolve_today)
    files, differing = {}, []
    for path in markdown_files(root):
        text = path.read_text(encoding="utf-8")
        blocks = parse_blocks(path, text)
        if not blocks:
            continue
        out, pos = [], 0
        for b in blocks:
            new = gen.text(b)
            if text[b.start:b.end] != new:
                differing.append((path, b))
            out += [text[pos:b.start], new]
            pos = b.end
        files[path] = "".join(out) + text[pos:]
    return Outcome(files, differing, gen.stale, coverage.problems())


def write(outcome: Outcome) -> list[Path]:
    """Write the files whose text changed; returns them."""
    from poskit.training.files import atomic_write_bytes

    changed = []
    for path, text in outcome.files.items():
        if path.read_text(encoding="utf-8") != text:
            data = text.encode("utf-8")
            atomic_write_bytes(path, lambda f: f.write(data))
            changed.append(path)
    return changed
