"""`poskit digits`: a ViT-style classifier on scikit-learn's 8x8 digits with learned absolute, axial rope and
axial pope positions (and none), evaluated at the training size and on the same digits upsampled to larger
images with the patch size fixed (more patches, so positions the model never saw), and with the 8x8 digit
unchanged at the centre of a larger blank canvas (the same patch contents, only the positions are new).

    poskit digits                      # 4 encodings x 3 seeds
    poskit digits --seeds 0 --epochs 5 # a quick look

Each (encoding, seed) run writes <out>/<encoding>/seed<s>/result.json when it finishes; a rerun skips finished
runs (resumable), so an interrupted demo loses at most the run in progress. Writes <out>/results.json,
<out>/results.md (the table) and <out>/digits_vit.png (accuracy vs image size). Needs the `vision` extra
(scikit-learn) and `experiments` (matplotlib).
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..training.files import atomic_write_json, check_writable_dir, read_json
from ..validate import check_int, check_real
from ..models.vit import ViT
from .configs.digits import VIT_ENCODINGS, DigitsSettings

__all__ = ["DigitsSettings", "results_table", "run", "run_digits"]


def _check(s: DigitsSettings) -> None:
    for e in s.encodings:
        if e not in VIT_ENCODINGS:
            raise ValueError(f"encodings must be among {list(VIT_ENCODINGS)}, got {e!r}")
    if not s.encodings or len(set(s.encodings)) != len(s.encodings):
        raise ValueError(f"encodings must list at least one encoding, none twice, got {list(s.encodings)}")
    if not s.seeds or len(set(s.seeds)) != len(s.seeds):
        raise ValueError(f"seeds must list at least one seed, none twice, got {list(s.seeds)}")
    for seed in s.seeds:
        check_int(seed, "seeds", minimum=0)
    for name in ("patch", "dim", "depth", "heads", "epochs", "batch_size"):
        check_int(getattr(s, name), name, minimum=1)
    check_real(s.lr, "lr", minimum=0, strict=True)
    check_real(s.weight_decay, "weight_decay", minimum=0)
    check_int(s.canvas_size, "canvas_size", minimum=8)
    if s.canvas_size % s.patch or 8 % s.patch:
        raise ValueError(f"patch must divide the training size 8 and canvas_size={s.canvas_size}, got {s.patch}")
    for size in s.eval_sizes:
        check_int(size, "eval_sizes", minimum=s.patch)
        if size % s.patch:
            raise ValueError(f"eval_sizes must be multiples of patch={s.patch}, got {size}")


def _lr_at(step: int, total: int, s: DigitsSettings) -> float:
    warm = max(1, round(0.05 * total))
    if step < warm:
        return s.lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return s.lr / 10 + (s.lr - s.lr / 10) * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def accuracy(model: ViT, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    correct = sum(int((model(images[i:i + 256]).argmax(-1) == labels[i:i + 256]).sum())
                  for i in range(0, len(images), 256))
    return correct / len(images)


def train_one(encoding: str, seed: int, s: DigitsSettings, data) -> dict:
    """Train one ViT; returns its accuracies {split@size: value} and the training time."""
    from ..data.digits import on_canvas, upsample

    torch.manual_seed(seed)
    model = ViT(encoding=encoding, patch=s.patch, train_size=8, dim=s.dim, depth=s.depth, heads=s.heads)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n != "table"]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and n != "table")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay}, {"params": other,
                                                                                  "weight_decay": 0.0}], lr=s.lr)
    x, y = data.images["train"], data.labels["train"]
    g = torch.Generator().manual_seed(seed)
    per_epoch = math.ceil(len(x) / s.batch_size)
    total, step, start = s.epochs * per_epoch, 0, time.perf_counter()
    for _ in range(s.epochs):
        model.train()
        order = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), s.batch_size):
            idx = order[i:i + s.batch_size]
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, total, s)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
    seconds = time.perf_counter() - start
    result = {"encoding": encoding, "seed": seed, "steps": step, "train_seconds": round(seconds, 1),
              "final_train_loss": loss.item()}
    for split in ("validation", "test"):
        for size in s.eval_sizes:
            result[f"{split}@{size}"] = accuracy(model, upsample(data.images[split], size), data.labels[split])
        result[f"{split}@canvas"] = accuracy(model, on_canvas(data.images[split], s.canvas_size), data.labels[split])
    return result


def _summary(runs: list[dict], key: str) -> dict:
    values = [r[key] for r in runs]
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "per_seed": values}


def results_table(results: dict) -> str:
    st = results["settings"]
    sizes, p, c = st["eval_sizes"], st["patch"], st["canvas_size"]
    head = ("| encoding | " + " | ".join(f"upsampled {z}x{z} ({z // p}x{z // p} patches)" for z in sizes)
            + f" | 8x8 on a {c}x{c} canvas | validation {sizes[0]}x{sizes[0]} |")
    lines = [head, "|---" * (len(sizes) + 3) + "|"]
    for enc, summary in results["encodings"].items():
        cells = [f"{100 * summary[f'test@{z}']['mean']:.1f} ± {100 * summary[f'test@{z}']['std']:.1f}"
                 for z in (*sizes, "canvas")]
        val = summary[f"validation@{sizes[0]}"]
        lines.append(f"| {enc} | " + " | ".join(cells) + f" | {100 * val['mean']:.1f} |")
    return "\n".join(lines)


def plot_results(results: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..report.figure import save_figure
    from ..report.plots import color

    sizes = results["settings"]["eval_sizes"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for enc, summary in results["encodings"].items():
        means = [100 * summary[f"test@{z}"]["mean"] for z in sizes]
        stds = [100 * summary[f"test@{z}"]["std"] for z in sizes]
        ax.errorbar(sizes, means, yerr=stds, marker="o", capsize=3, label=enc, color=color(enc))
        for z in sizes:
            ax.scatter([z] * len(summary[f"test@{z}"]["per_seed"]),
                       [100 * v for v in summary[f"test@{z}"]["per_seed"]], s=8, color="black", zorder=3)
    cx = sizes[-1] + 3  # the canvas evaluation, beside the upsampled sizes
    for i, (enc, summary) in enumerate(results["encodings"].items()):
        entry = summary["test@canvas"]
        ax.errorbar([cx + 0.25 * (i - 1.5)], [100 * entry["mean"]], yerr=[100 * entry["std"]], marker="s",
                    capsize=3, color=color(enc), linestyle="none")
    ax.axvline(8, color="gray", linestyle=":", linewidth=1)
    ax.set_xticks([*sizes, cx])
    ax.set_xticklabels([*(f"{z}x{z}" for z in sizes), f"8x8 on\n{results['settings']['canvas_size']}x"
                        f"{results['settings']['canvas_size']}"])
    ax.set_xlabel(f"test images (patch {results['settings']['patch']}x{results['settings']['patch']}; trained "
                  "at 8x8): upsampled, and on a canvas")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("ViT on sklearn digits: mean ± std over seeds (dots: seeds)")
    ax.legend()
    return save_figure(fig, path, dpi=120)


def _run_settings(s: DigitsSettings) -> dict:
    """What a finished run depends on (not which other encodings and seeds the demo runs beside it)."""
    # through JSON, as read back from result.json (tuples become lists)
    return json.loads(json.dumps({k: v for k, v in asdict(s).items() if k not in ("encodings", "seeds")}))


def run_digits(settings: DigitsSettings, out_dir, *, quiet: bool = False) -> dict:
    """Train every (encoding, seed) not already finished under out_dir, then aggregate, tabulate and plot."""
    from ..data.digits import load_digits_splits

    _check(settings)
    out = Path(out_dir)
    check_writable_dir(out, "out")
    data = load_digits_splits()
    torch.set_num_threads(1)  # tiny models: one thread each is fastest on a shared CPU
    start = time.perf_counter()
    runs: dict[str, list[dict]] = {}
    todo = [(e, s) for e in settings.encodings for s in settings.seeds]
    for n, (enc, seed) in enumerate(todo, 1):
        path = out / enc / f"seed{seed}" / "result.json"
        if path.exists():
            result = read_json(path, "a digits run result")
            if result.get("settings") != _run_settings(settings):
                raise ValueError(f"{path} was written with other settings; use another --out")
            state = "kept"
        else:
            result = {**train_one(enc, seed, settings, data), "settings": _run_settings(settings)}
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, result)
            state = f"done ({result['train_seconds']} s)"
        runs.setdefault(enc, []).append(result)
        if not quiet:
            print(f"  [{n}/{len(todo)}] {enc} seed {seed} {state}: test {100 * result['test@8']:.1f} % at 8x8, "
                  f"{100 * result[f'test@{settings.eval_sizes[-1]}']:.1f} % at {settings.eval_sizes[-1]}x"
                  f"{settings.eval_sizes[-1]}", file=sys.stderr, flush=True)
    keys = [f"{split}@{z}" for split in ("validation", "test") for z in (*settings.eval_sizes, "canvas")]
    results = {"settings": asdict(settings), "wall_seconds": round(time.perf_counter() - start, 1),
               "encodings": {e: {k: _summary(rs, k) for k in keys} | {"steps": rs[0]["steps"]}
                             for e, rs in runs.items()}}
    atomic_write_json(out / "results.json", results)
    (out / "results.md").write_text(f"# digits ViT\n\n{results_table(results)}\n")
    plot_results(results, out / "digits_vit.png")
    return results


def run(experiment, *, out_dir, quiet: bool = False, **changes) -> dict:
    """The registry's entry (`poskit digits`): run_digits with the experiment's settings, `changes` applied."""
    return run_digits(replace(experiment.settings, **changes), out_dir, quiet=quiet)
