"""Medians of the three alternated runs of benchmarks/call_overhead.py in this directory: the code before
(commit fee6cc6, `before_N.md`) and after (`after_N.md`) the per-call changes, both with
POSKIT_KERNEL_CALIBRATION=0 so that both route alike (when.txt: the runs' start and end)."""
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[2] / "benchmarks"))
from call_overhead import read_printed_table as load  # noqa: E402

before = [load(HERE / f"before_{r}.md") for r in (1, 2, 3)]
after = [load(HERE / f"after_{r}.md") for r in (1, 2, 3)]
print("| call | encoding | us before (3 runs) | us after (3 runs) | median before -> after |")
print("|---|---|---|---|---|")
for key in before[0]:
    b, a = [r[key] for r in before], [r[key] for r in after]
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"| {key[0]} | {key[1]} | {', '.join(map(str, b))} | {', '.join(map(str, a))} | "
          f"{mb:.1f} -> {ma:.1f} ({ma / mb:.2f}x) |")
