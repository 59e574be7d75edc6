"""The context-extension grids run twice on this repository's development machine: at commit 376d53b
(docs/results/context-extension{,-quick}) and again at a later commit (docs/results/context-extension{,-quick}-rerun,
their code field says which), with the compiled CPU kernel and this machine's calibration routing RoPE's calls
by then. Per grid: how many rows the two share, the largest difference in perplexity (every evaluation length)
and in passkey accuracy, and whether the orderings the docs draw conclusions from hold in both runs.

    python docs/results/context-extension-rerun/compare.py
"""
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1]


def rows(name):
    doc = json.loads((RESULTS / name / "results.json").read_text())
    out = {}
    for row in doc["rows"]:
        key = (row["setup"], row["seed"], row["method"], row["scale"], row["step"])
        out[key] = row
    return doc["code"]["git_commit"][:7], out


def at(row, length):
    return row["perplexity"][str(length)]


def compare(first, second, extended):
    code_a, a = rows(first)
    code_b, b = rows(second)
    shared = sorted(set(a) & set(b), key=str)
    ppl = max(abs(at(a[k], n) - at(b[k], n)) / at(a[k], n) for k in shared for n in a[k]["perplexity"])
    passkey = max((abs(x - y) for k in shared if a[k].get("passkey") and b[k].get("passkey")
                   for ra, rb in zip(a[k]["passkey"]["accuracy"], b[k]["passkey"]["accuracy"])
                   for x, y in zip(ra, rb)), default=0.0)
    print(f"## {first} ({code_a}) against {second} ({code_b})\n")
    print(f"rows: {len(a)} and {len(b)}, {len(shared)} shared; largest relative perplexity difference "
          f"{ppl:.2%}; largest passkey accuracy difference {passkey:.2f}\n")
    # the orderings the docs quote: per (setup, seed, scale) at the last step, methods by extended perplexity
    print("| setup | seed | scale | step | methods by extended perplexity, first run | second run | same order |")
    print("|---|---|---|---|---|---|---|")
    groups = {}
    for k in shared:
        setup, seed, method, scale, step = k
        if scale is not None and method not in ("none", "dynamic"):
            groups.setdefault((setup, seed, scale, step), []).append(method)
    for (setup, seed, scale, step), methods in sorted(groups.items(), key=str):
        if step != max(s for (su, se, sc, s) in groups if (su, se, sc) == (setup, seed, scale)) or len(methods) < 2:
            continue
        key = lambda run: lambda m: at(run[(setup, seed, m, scale, step)], extended * scale)
        order_a = sorted(methods, key=key(a))
        order_b = sorted(methods, key=key(b))
        fmt = lambda run, order: ", ".join(f"{m} {at(run[(setup, seed, m, scale, step)], extended * scale):.2f}"
                                           for m in order)
        print(f"| {setup} | {seed} | {scale} | {step} | {fmt(a, order_a)} | {fmt(b, order_b)} | "
              f"{'yes' if order_a == order_b else 'no'} |")
    # PoPE fine-tuned without a scaling against RoPE's best method, YaRN, at the last step of each scale
    print("\n| seed | scale | step | PoPE - YaRN (extended perplexity), first run | second run | same sign |")
    print("|---|---|---|---|---|---|")
    for (setup, seed, scale, step) in sorted(groups, key=str):
        pope, yarn = ("pope", seed, "pope", scale, step), ("rope", seed, "yarn", scale, step)
        if setup != "pope" or yarn not in a or pope not in a or step != max(
                s for (su, se, sc, s) in groups if (su, se, sc) == (setup, seed, scale)):
            continue
        da, db = (at(r[pope], extended * scale) - at(r[yarn], extended * scale) for r in (a, b))
        print(f"| {seed} | {scale} | {step} | {da:+.3f} | {db:+.3f} | {'yes' if (da > 0) == (db > 0) else 'no'} |")
    # passkey retrieval (mean over depths) at 1x and at the extended length: the base and each method's last step
    print("\n| setup | seed | method | scale | step | passkey at 1x, first / second run | at the extended length |")
    print("|---|---|---|---|---|---|---|")
    for k in shared:
        setup, seed, method, scale, step = k
        last = scale is None or step == max(s for (su, se, me, sc, s) in shared
                                            if (su, se, me, sc) == (setup, seed, method, scale))
        if setup != "rope" or not last or not a[k].get("passkey") or not b[k].get("passkey"):
            continue
        def mean_at(run, length):
            keys = run[k]["passkey"]
            if length not in keys["lengths"]:
                return float("nan")
            row = keys["accuracy"][keys["lengths"].index(length)]
            return sum(row) / len(row)
        far = extended * (scale or 1)
        print(f"| {setup} | {seed} | {method} | {scale or '-'} | {step} | {mean_at(a, extended):.2f} / "
              f"{mean_at(b, extended):.2f} | {mean_at(a, far):.2f} / {mean_at(b, far):.2f} |")
    print()


if __name__ == "__main__":
    compare("context-extension", "context-extension-rerun", 64)
    compare("context-extension-quick", "context-extension-quick-rerun", 64)
