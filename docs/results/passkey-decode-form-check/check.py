"""Whether the kernel's decode form changes the context-extension reproduction's passkey results: every checkpoint
the reproduction evaluated last (its bases and each extension's final step, both seeds) scored again by
passkey_grid with the reproduction's settings, against the accuracies, digit accuracies and key log-probabilities
its evaluation files hold; then which attention operators one base model's generations ran.

    python check.py RUN_DIR      (a `poskit reproduce context-extension --quick --seeds 0,1` output directory)
"""
import json, sys, glob, time
from pathlib import Path
import torch
from poskit.evaluate.passkey import passkey_grid
from poskit.training.run import load_run
from poskit.training.recipes.extend import load_extend_run
R = Path(sys.argv[1])
t0 = time.time(); changed = 0; total = 0
for f in sorted(glob.glob(str(R / "evals/seed*/*/*/step-*.json"))):
    rec = json.load(open(f))
    seed, setup, method = rec["seed"], rec["setup"], Path(f).parent.name
    step = rec["step"]
    if rec["encoding"] is None:
        model, task, _ = load_run(R / f"bases/seed{seed}/{setup}")
    else:
        # the extend run keeps its last step only
        steps = sorted(int(Path(g).stem.split("-")[1]) for g in glob.glob(str(Path(f).parent / "step-*.json")))
        if step != steps[-1]:
            continue
        model, task, _ = load_extend_run(R / f"extend/seed{seed}/{setup}/{method}")
    pk = rec["passkey"]
    grid = passkey_grid(model, task, pk["lengths"], pk["depths"], pk["trials"], seed=0, split="test")
    same = all(grid[k] == pk[k] for k in ("accuracy", "digit_accuracy"))
    dlp = max(abs(a - b) for ra, rb in zip(grid["key_logprob"], pk["key_logprob"]) for a, b in zip(ra, rb))
    total += 1; changed += not same
    print(f"{setup}/{method} seed {seed} step {step}: accuracy and digits {'same' if same else 'CHANGED'}; "
          f"key log-prob max diff {dlp:.2e}", flush=True)
print(f"{total} checkpoints, {changed} changed, {time.time() - t0:.0f} s")
# which attention op the generations ran (one base model's grid, under torch's profiler)
model, task, _ = load_run(R / "bases/seed0/rope")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    passkey_grid(model, task, [64], [0.0], 2, seed=0, split="test")
ops = {}
for e in prof.events():
    if e.name.startswith("poskit_cpu_flash::") or "scaled_dot_product" in e.name:
        ops[e.name] = ops.get(e.name, 0) + 1
print("attention ops in one RoPE base model's passkey generations:", ops)
