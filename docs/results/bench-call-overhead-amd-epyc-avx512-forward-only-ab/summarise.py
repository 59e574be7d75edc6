"""The two alternated runs of benchmarks/call_overhead.py in this directory: the code before (commit 47d77b3,
`before_N.md`) and after (`after_N.md`: the working tree committed next, which runs an autograd Function's forward
directly where no gradient can be needed, util/function_call.py), both with POSKIT_KERNEL_CALIBRATION=0
(when.txt: the runs' order and start, UTC, 2026-11-27)."""
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[2] / "benchmarks"))
from call_overhead import read_printed_table as load  # noqa: E402


before = [load(HERE / f"before_{r}.md") for r in (1, 2)]
after = [load(HERE / f"after_{r}.md") for r in (1, 2)]
print("| call | encoding | us before (2 runs) | us after (2 runs) |")
print("|---|---|---|---|")
for key in before[0]:
    print(f"| {key[0]} | {key[1]} | {', '.join(str(r[key]) for r in before)} | "
          f"{', '.join(str(r[key]) for r in after)} |")
