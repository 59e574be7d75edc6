"""`poskit digits`: a ViT-style classifier on scikit-learn's 8x8 digits with learned absolute, axial rope and
axial pope positions (and none), evaluated at the training size and on the same digits upsampled to larger
images with the patch size fixed (more patches, so positions the model never saw), and with the 8x8 digit
unchanged at the centre of a larger blank canvas (the same patch contents, only the positions are new).

    poskit digits                      # 4 encodings x 3 seeds
    poskit digits --seeds 0 --epochs 5 # a quick look

Each (encoding, seed) run is a run directory <out>/<encoding>/seed<s>/ (the Trainer's: checkpoints every epoch,
result.json when it finishes); a rerun returns finished runs and resumes interrupted ones from their last
checkpoint. Writes <out>/results.json,
<out>/results.md (the table) and <out>/digits_vit.png (accuracy vs image size). Needs the `vision` extra
(scikit-learn) and `experiments` (matplotlib).
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ..training.files import check_writable_dir, read_results
from ..training.recipes.vit import ViTConfig, ViTRecipe
from ..training.run import run as run_training
from ..training.run_dir import owned
from ..util.validate import check_int, check_real
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


def train_one(encoding: str, seed: int, s: DigitsSettings, data, run_dir, quiet: bool = True) -> dict:
    """Train one ViT in `run_dir` through the Trainer (resumable; a finished run returns its result.json);
    returns its accuracies {split@size: value}, the training time and the settings."""
    cfg = ViTConfig(model={"encoding": encoding}, seed=seed, settings=_run_settings(s))
    return run_training(ViTRecipe(cfg, data), run_dir, resume=True, quiet=quiet, label=f"{encoding} seed {seed}")


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
    with owned(out, "compare", legacy=_legacy_out):
        for n, (enc, seed) in enumerate(todo, 1):
            run_dir = out / enc / f"seed{seed}"
            path = run_dir / ViTRecipe.results_file
            if path.exists() and {p.name for p in run_dir.iterdir()} == {path.name}:
                result, state = read_results(path, "a digits run result"), "kept"  # a run of an older version
            else:
                finished = path.exists()
                result = train_one(enc, seed, settings, data, run_dir, quiet=quiet)
                state = "kept" if finished else f"done ({result['train_seconds']} s)"
            if result.get("settings") != _run_settings(settings):
                raise ValueError(f"{path} was written with other settings; use another --out")
            runs.setdefault(enc, []).append(result)
            if not quiet:
                print(f"  [{n}/{len(todo)}] {enc} seed {seed} {state}: test {100 * result['test@8']:.1f} % at 8x8, "
                      f"{100 * result[f'test@{settings.eval_sizes[-1]}']:.1f} % at {settings.eval_sizes[-1]}x"
                      f"{settings.eval_sizes[-1]}", file=sys.stderr, flush=True)
        keys = [f"{split}@{z}" for split in ("validation", "test") for z in (*settings.eval_sizes, "canvas")]
        results = {"settings": asdict(settings), "wall_seconds": round(time.perf_counter() - start, 1),
                   "encodings": {e: {k: _summary(rs, k) for k in keys} | {"steps": rs[0]["steps"]}
                                 for e, rs in runs.items()}}
        (out / "results.md").write_text(f"# digits ViT\n\n{results_table(results)}\n")
        plot_results(results, out / "digits_vit.png")
        _write_record(settings, out, runs, results, start)
    return results


def _write_record(settings: DigitsSettings, out: Path, runs: dict[str, list[dict]], results: dict,
                  start: float) -> None:
    """results.json: the results record (report/record.py) with the summary's fields beside it; the arguments
    are the settings that differ from the registry's defaults (what `poskit digits` flags changed)."""
    from .configs.digits import DIGITS
    from .evidence import measurements_of, write_record

    default = asdict(DIGITS)
    arguments = {k: v for k, v in asdict(settings).items() if v != default[k]}
    sizes = [*settings.eval_sizes, "canvas"]
    groups = {"": {enc: [{"seed": seed, "run": f"{enc}/seed{seed}", "steps": r.get("steps"),
                          "train_seconds": r.get("train_seconds"),
                          "splits": {f"{split}@{z}": {"accuracy": r[f"{split}@{z}"]}
                                     for split in ("test", "validation") for z in sizes}}
                         for seed, r in zip(settings.seeds, rs)] for enc, rs in runs.items()}}
    write_record(out, kind="demo", name="digits", arguments=arguments, started=start, details=results,
                 measurements=measurements_of("accuracy", f"test@{settings.eval_sizes[0]}", groups),
                 files=["results.md", "digits_vit.png"])


def run(experiment, *, out_dir, quiet: bool = False, **changes) -> dict:
    """The registry's entry (`poskit digits`): run_digits with the experiment's settings, `changes` applied."""
    return run_digits(replace(experiment.settings, **changes), out_dir, quiet=quiet)


def _legacy_out(directory: Path) -> bool:
    """An output directory of an older `poskit digits` (no marker): its tables, plot and encoding folders."""
    return all(p.name in ("results.json", "results.md", "digits_vit.png") or (p.is_dir() and p.name in VIT_ENCODINGS)
               for p in directory.iterdir())
