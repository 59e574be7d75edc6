"""`poskit reproduce NAME`: CPU-scale versions of the papers' diagnostic tasks.

Each reproduction is a `compare` with fixed settings: the paper's task scaled down until one model trains on
one CPU core in minutes to hours. A reproduction with variants (counting: 1, 3 and 5 variables, as the CoPE
paper's Table 3) runs one compare per variant under <out>/<field>_<value>/ and writes one results.json and one
table with a column naming the variant of each row. Run times in the summaries are wall-clock on an idle 2-core
CPU with two single-thread workers; the outcomes are in docs/reproductions.md.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from poskit.report import variants_table
from poskit.train import TrainConfig, atomic_write_json

from .compare import execute_compare, plan_compare
from .specs import apply_overrides, parse_encodings, parse_value, safe_label


@dataclass(frozen=True)
class Variant:
    """One sub-run of a reproduction with variants."""

    value: object
    """The value of the reproduction's variant_field in this sub-run."""
    seeds: tuple | None = None
    """Seeds of this sub-run (None: the reproduction's seeds)."""


@dataclass(frozen=True)
class Reproduction:
    paper: str
    """Which table of which paper this scales down."""
    summary: str
    """One line for `poskit list`: what runs and how long it takes."""
    config: dict
    """TrainConfig fields (the base config; the encoding is set per run)."""
    encodings: str
    """Comma-separated encoding specs."""
    seeds: tuple = (0,)
    """Seeds of every run (of every variant that does not set its own)."""
    split: str = "test"
    """Split of the headline metric."""
    variant_field: str | None = None
    """Dotted config key that differs between the sub-runs (e.g. "task_options.n_vars"); None: one compare."""
    variants: tuple = ()
    """The sub-runs (Variant), in table order."""

    @property
    def variant_name(self) -> str:
        return self.variant_field.rsplit(".", 1)[-1] if self.variant_field else ""


_COMMON = {"beta1": 0.9, "weight_decay": 0.01, "grad_clip": 1.0, "log_every": 50}

REPRODUCTIONS: dict[str, Reproduction] = {
    "indirect-indexing": Reproduction(
        paper="PoPE paper, Table 1 (App. B: 8 layers, d 512, lr 2e-4 -> 2e-5, warmup 4k, 100k steps, batch 64)",
        summary="rope vs pope, 2 layers d 64, 100k steps: about 2 h 10 min for both on 2 idle cores (75-80 and 60-67 ms "
                "per step)",
        config={"task": "indirect-indexing", "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "encoding": "rope"},
                "batch_size": 64, "max_steps": 100_000, "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 4000,
                "beta2": 0.99, "eval_every": 2000, "checkpoint_every": 2000, **_COMMON},
        encodings="rope,pope:delta_init=uniform",
    ),
    "flip-flop": Reproduction(
        paper="CoPE paper, Table 2 left (4 layers, d 256, 10k steps, lr 3e-4; length 512)",
        summary="none, rope, pope, alibi, cope at length 64, 2 layers d 64, 1000 steps, 3 seeds: 8 min on 2 idle cores",
        config={"task": "flip-flop", "task_options": {"length": 64, "eval_size": 1000},
                "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "encoding": "rope"},
                "batch_size": 32, "max_steps": 1000, "lr": 3e-3, "min_lr": 3e-4, "warmup_fraction": 0.05,
                "beta2": 0.98, "eval_every": 100, "checkpoint_every": 500, **_COMMON},
        encodings="none,rope,pope,alibi,cope",
        seeds=(0, 1, 2),
    ),
    "selective-copy": Reproduction(
        paper="CoPE paper, Table 2 right (2 layers, d 64, 2 heads, 100k steps; 256 tokens, 256 blanks)",
        summary="rope, pope, relative, cope; 16 tokens, 16 blanks (OOD 8 / 32), 2 layers d 64, 1000 steps, "
                "3 seeds: 4.5 min on 2 idle cores",
        config={"task": "selective-copy", "task_options": {"n_tokens": 16, "n_blanks": 16, "ood_dense_blanks": 8,
                                                           "ood_sparse_blanks": 32},
                "model": {"d_model": 64, "n_layers": 2, "n_heads": 2, "encoding": "rope"},
                "batch_size": 32, "max_steps": 1000, "lr": 3e-3, "min_lr": 3e-4, "warmup_fraction": 0.05,
                "beta2": 0.98, "eval_every": 100, "checkpoint_every": 500, **_COMMON},
        encodings="rope,pope,relative,cope",
        seeds=(0, 1, 2),
    ),
    "counting": Reproduction(
        paper="CoPE paper, Tables 3-4 (relative PE vs CoPE; 512 operations, 1/3/5 variables)",
        summary="relative, rope, pope, cope; up to 64 operations, 2 layers d 64, 1000 steps; 3 variables with 3 "
                "seeds, 1 and 5 variables with 1 seed each to keep the time down: 19 min on 2 idle cores",
        config={"task": "counting", "task_options": {"max_steps": 64, "n_vars": 3},
                "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "encoding": "rope"},
                "batch_size": 32, "max_steps": 1000, "lr": 3e-3, "min_lr": 3e-4, "warmup_fraction": 0.05,
                "beta2": 0.98, "eval_every": 250, "checkpoint_every": 500, **_COMMON},
        encodings="relative,rope,pope,cope",
        seeds=(0, 1, 2),
        variant_field="task_options.n_vars",
        variants=(Variant(1, seeds=(0,)), Variant(3), Variant(5, seeds=(0,))),
    ),
}


def select_variants(r: Reproduction, spec: str | None, name: str = "--variants") -> list[Variant]:
    """The variants to run: all of them, or those whose values `spec` lists ("1,5")."""
    if spec is None:
        return list(r.variants)
    allowed = [v.value for v in r.variants]
    if not allowed:
        raise ValueError(f"{name} applies only to reproductions with variants; this one has none")
    wanted = [parse_value(s.strip()) for s in str(spec).split(",") if s.strip()]
    if not wanted or any(w not in allowed for w in wanted):
        raise ValueError(f"{name} must be a comma-separated subset of {allowed} ({r.variant_name}), got {spec!r}")
    return [v for v in r.variants if v.value in wanted]


def _get(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def run_reproduction(name: str, *, out_dir=None, seeds=None, encodings=None, steps: int | None = None,
                     workers: int | None = None, resume: bool = False, quiet: bool = False,
                     overrides: list[str] | None = None, variants: str | None = None) -> dict:
    """Run reproduction `name` (see REPRODUCTIONS) as a compare, or one compare per variant (`variants`: a
    comma-separated subset of the variant values, default all); returns the results. `seeds` and `steps`
    replace every variant's. Every sub-run is checked before the first one trains."""
    if name not in REPRODUCTIONS:
        raise ValueError(f"name must be one of {sorted(REPRODUCTIONS)}, got {name!r}")
    r = REPRODUCTIONS[name]
    chosen = select_variants(r, variants)
    cfg = copy.deepcopy(r.config)
    if steps is not None:
        cfg["max_steps"] = steps
    apply_overrides(cfg, overrides or [])
    specs = encodings if encodings is not None else parse_encodings(r.encodings)
    out = Path(out_dir or f"runs/reproduce-{name}")
    title = f"reproduce {name}: {r.paper}"
    if not chosen:
        plan = plan_compare(TrainConfig.from_dict(cfg), specs, list(seeds or r.seeds), out, workers=workers,
                            resume=resume, split=r.split)
        return execute_compare(plan, workers=workers, quiet=quiet, title=title)

    if _get(cfg, r.variant_field) != _get(r.config, r.variant_field):
        raise ValueError(f"{r.variant_field} is what the {name} reproduction varies; choose among "
                         f"{[v.value for v in r.variants]} with --variants instead of overriding it")
    plans = []
    for v in chosen:
        vcfg = apply_overrides(copy.deepcopy(cfg), [f"{r.variant_field}={v.value}"])
        label = f"{r.variant_name}={v.value}"
        plans.append((v, label, plan_compare(TrainConfig.from_dict(vcfg), specs, list(seeds or v.seeds or r.seeds),
                                             out / safe_label(label), workers=workers, resume=resume, split=r.split)))
    per_variant = {}
    for v, label, plan in plans:
        per_variant[v.value] = execute_compare(plan, workers=workers, quiet=quiet, title=f"{title} [{label}]")
    first = next(iter(per_variant.values()))
    results = {"task": first["task"], "metric": first["metric"], "split": first["split"],
               "variant_field": r.variant_field,
               "variants": {str(value): {**res, "dir": safe_label(f"{r.variant_name}={value}")}
                            for value, res in per_variant.items()}}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", results)
    plots = "\n".join(f"![{r.variant_name}={value}]({safe_label(f'{r.variant_name}={value}')}/compare.png)"
                      for value in per_variant)
    (out / "results.md").write_text(f"# {title}\n\n{variants_table(r.variant_name, per_variant)}\n\n{plots}\n")
    return results
