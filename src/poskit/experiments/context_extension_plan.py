"""The grid of `poskit reproduce context-extension` as jobs and directories (`plan`), and the configuration it
resolves to (`resolve_plan`, what its results record stores and `poskit report` resolves again to find a stale
table). Nothing here trains or writes: experiments/context_extension.py runs the plan."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from poskit.encodings.spec import EncodingSpec
from poskit.training import TrainConfig

from .configs.context_extension import CONTEXT_EXTENSION, ContextExtension, Grid
from .jobs import TrainJob
from .overrides import apply_overrides


@dataclass(frozen=True)
class Evaluation:
    """What every checkpoint is evaluated on."""

    lengths: tuple
    """Tokens."""
    base_context: int
    split: str
    n_chars: int
    depths: tuple
    trials: int


@dataclass(frozen=True)
class ChainJob:
    """One method at one scale on one base model: extended stepwise to each step and evaluated there (one
    process; the steps build on each other)."""

    setup: str
    seed: int
    method: str
    encoding: str | None
    """The extension's spec; None: the base model itself (zero-shot, step 0)."""
    scale: int | None
    context: int | None
    steps: tuple
    parent: str
    run_dir: str | None
    eval_dir: str
    evaluation: Evaluation
    checkpoint_every: int


@dataclass
class Plan:
    settings: ContextExtension
    grid: Grid
    out_dir: Path
    seeds: tuple
    scales: tuple
    steps: tuple
    bases: list
    """TrainJob per (seed, setup)."""
    base_keys: list
    """(seed, setup) of each base job."""
    chains: list
    """ChainJob, each method of each setup at each scale (zero-shot methods once per setup)."""
    arguments: dict
    """The command's arguments that give this plan (quick, seeds, steps, variants, overrides): what its results
    record stores and `resolve_plan` resolves again."""


def grid_methods(settings: ContextExtension, grid: Grid, setup) -> tuple:
    """The setup's methods in the grid; "none" (the base model itself) always: the others are compared to it."""
    return tuple(m for m in setup.methods if grid.methods is None or m.name in grid.methods or m.name == "none")


def plan(settings: ContextExtension = CONTEXT_EXTENSION, out_dir="runs/reproduce-context-extension", *,
         quick: bool = False, seeds=None, steps: int | None = None, scales=None, overrides=()) -> Plan:
    """The sub-runs of the grid (`quick`: the quick one), with the command's restrictions: `seeds`, `steps` (the
    fine-tuning length: the grid's evaluated steps up to it, and it), `scales` (a subset of s values or others),
    `overrides` (key=value on the base models' TrainConfig). Checks everything; writes nothing."""
    grid = settings.grid(quick)
    given_seeds, given_scales = seeds, scales
    seeds = (0,) if seeds is None else tuple(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must be distinct non-negative integers, got {list(seeds)}")
    scales = grid.scales if scales is None else tuple(scales)
    if not scales or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in scales) \
            or len(set(scales)) != len(scales):
        raise ValueError(f"--variants (the scales s) must be distinct positive integers, got {list(scales)}")
    evaluated = grid.steps
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"--steps (the fine-tuning steps) must be a non-negative integer, got {steps!r}")
        evaluated = tuple(sorted({s for s in grid.steps if s <= steps} | {steps}))
    base_cfg = copy.deepcopy(settings.pretrain)
    base_cfg["max_steps"] = grid.pretrain_steps
    apply_overrides(base_cfg, list(overrides or ()))
    context = settings.context
    if base_cfg.get("task_options", {}).get("context", context) != context:
        raise ValueError(f"task_options.context is the experiment's base context {context}; it cannot be overridden")
    out_dir = Path(out_dir)
    evaluation = Evaluation(tuple(context * m for m in grid.lengths), context, settings.split, grid.n_chars,
                            tuple(grid.depths), grid.trials)
    bases, base_keys, chains = [], [], []
    for seed in seeds:
        for name in grid.setups:
            setup = settings.setup(name)
            cfg = copy.deepcopy(base_cfg)
            spec = EncodingSpec.parse(setup.encoding)
            cfg["model"] = {**cfg["model"], "encoding": spec.name, "encoding_options": spec.options}
            cfg["task_options"] = {**cfg["task_options"], "passkey_fraction": setup.passkey_fraction}
            cfg["seed"] = seed
            TrainConfig.from_dict(cfg)  # checked here, before anything runs
            base_dir = out_dir / "bases" / f"seed{seed}" / name
            bases.append(TrainJob(cfg, str(base_dir), resume=True, quiet=True))
            base_keys.append((seed, name))
            for method in grid_methods(settings, grid, setup):
                for scale in (scales if method.encoding is not None else (None,)):
                    label = method.name if scale is None else f"{method.name}-s{scale}"
                    own = [s for s in evaluated if method.fine_tune or s == 0]
                    if method.unchanged:
                        own = [s for s in own if s > 0]  # its step 0 is the base model, evaluated as "none"
                    if not own:
                        continue
                    chains.append(ChainJob(
                        name, seed, method.name, method.encoding, scale, None if scale is None else context * scale,
                        tuple(own), str(base_dir),
                        None if method.encoding is None else str(out_dir / "extend" / f"seed{seed}" / name / label),
                        str(out_dir / "evals" / f"seed{seed}" / name / label), evaluation, settings.checkpoint_every))
    arguments = {"quick": bool(quick), "seeds": None if given_seeds is None else list(seeds), "steps": steps,
                 "variants": None if given_scales is None else ",".join(map(str, scales)),
                 "overrides": list(overrides or ())}
    return Plan(settings, grid, out_dir, seeds, scales, evaluated, bases, base_keys, chains, arguments)


def parse_scales(variants) -> list[int] | None:
    """The scales s of `--variants` ("4,8"), or None for the grid's."""
    if not variants:
        return None
    try:
        return [int(v) for v in str(variants).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--variants are the scales s of context-extension, e.g. 4,8; got {variants!r}") from None


def resolve_plan(settings: ContextExtension, arguments: dict) -> dict:
    """The fully resolved configuration of the command whose arguments (quick, seeds, steps, variants,
    overrides) are `arguments`: the base models' training config, every encoding with its constructor defaults
    (the bases' and the methods'), the grid as it runs, the setups and the seeds."""
    from poskit.report.record import resolve_encodings

    from .resolution import without_run_fields

    p = plan(settings, "unused", quick=bool(arguments.get("quick")), seeds=arguments.get("seeds"),
             steps=arguments.get("steps"), scales=parse_scales(arguments.get("variants")),
             overrides=arguments.get("overrides") or ())
    specs = []
    for name in p.grid.setups:
        setup = settings.setup(name)
        for spec in [setup.encoding] + [m.encoding for m in grid_methods(settings, p.grid, setup) if m.encoding]:
            if EncodingSpec.parse(spec) not in specs:
                specs.append(EncodingSpec.parse(spec))
    return {"base": without_run_fields(TrainConfig.from_dict(p.bases[0].config).to_dict()),
            "encodings": resolve_encodings(specs),
            "grid": {**dataclasses.asdict(p.grid), "scales": list(p.scales), "steps": list(p.steps)},
            "setups": [dataclasses.asdict(settings.setup(n)) for n in p.grid.setups],
            "seeds": list(p.seeds), "passkey_threshold": settings.passkey_threshold, "context": settings.context}
