"""The two alternated runs in this directory of benchmarks/attention.py's bf16 rows (forward + backward at the
speed goals' shapes, decode at 8192 cached keys): the compiled kernel's bf16 products as a hand-written
AVX512_BF16 loop (commit d54ffba, `before_N.json`) and through oneDNN's brgemm (`after_N.json`: the working
tree committed as d2d5cbf, whose kernel differs from it in comments and one error message only; hence "dirty"
in their code field), both with POSKIT_KERNEL_CALIBRATION=0 so that both route alike (when.txt: the runs' order
and start, UTC). Each row: the two runs' times in ms (ratio to RoPE + SDPA in its own run)."""
import json
from pathlib import Path

HERE = Path(__file__).parent


def rows(path):
    doc = json.loads(path.read_text())
    for name, part in doc["parts"].items():
        for row in part["rows"]:
            if name == "attention":
                yield (f"B={row['B']} T={row['T']}", row["path"]), float(row["ms"]), row["ratio"]
            else:
                yield (f"decode {row['dtype']} kv_heads={row['kv_heads']}", row["encoding"]), \
                    float(row["ms_per_step"]), row["vs_rope"]


table = {}
for side in ("before", "after"):
    for run in (1, 2):
        for key, ms, ratio in rows(HERE / f"{side}_{run}.json"):
            table.setdefault(key, {}).setdefault(side, []).append(f"{ms:.1f} ({ratio})")
print("| shape | path | hand-written loop (2 runs) | brgemm (2 runs) |")
print("|---|---|---|---|")
for (shape, path), sides in table.items():
    print(f"| {shape} | {path} | {', '.join(sides['before'])} | {', '.join(sides['after'])} |")
