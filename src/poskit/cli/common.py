"""What the sub-commands share, defined once: the flag groups, the checks of numeric flags, the flag-named
errors, the list and encoding-spec flags, and the training config built from the flags."""
from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

from poskit.encodings.spec import EncodingSpec

EPILOG_OVERRIDES = ("overrides: trailing key=value pairs set any TrainConfig field (see poskit.training.TrainConfig), "
                    "dotted for nested ones: model.d_model=64 model.n_layers=4 lr=1e-3 batch_size=64 "
                    "task_options.length=64 model.encoding_options.base=500 loss_on=last loss_on=[-2,-1] "
                    "bf16=true. Values are JSON where they parse; each is checked against the field's type "
                    "(booleans are true/false, integers integers, floats numbers).")

# flags that set a TrainConfig field: (argparse attribute, field, flag as typed)
CONFIG_FLAGS = (("steps", "max_steps", "--steps"), ("train_seconds", "train_seconds", "--train-seconds"),
                ("lr", "lr", "--lr"), ("batch_size", "batch_size", "--batch-size"), ("seed", "seed", "--seed"),
                ("parallel", "parallel", "--parallel"), ("tensorboard", "tensorboard", "--tensorboard"),
                ("compile", "compile", "--compile"))


class Wrapped(argparse.HelpFormatter):
    """Wraps the epilog's paragraphs separately (the default formatter joins them into one)."""

    def _fill_text(self, text, width, indent):
        return "\n\n".join(super(Wrapped, self)._fill_text(p, width, indent) for p in text.split("\n\n"))


def add_common_training(p: argparse.ArgumentParser, task_required: bool = True) -> None:
    """The flags of a training config (train, compare): task, config file, sizes, schedule, overrides."""
    from poskit.tasks import PRESETS, available_tasks

    p.add_argument("--task", required=task_required, help=f"task name: {', '.join(available_tasks())}")
    p.add_argument("--config", help="JSON file with TrainConfig fields (merged over the task's defaults)")
    p.add_argument("--preset", choices=list(PRESETS), help="task sizes: CPU-scale defaults or the paper's")
    p.add_argument("--steps", type=int, help="optimizer steps (max_steps)")
    p.add_argument("--train-seconds", type=float, help="time budget: choose max_steps by timing a few steps")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--batch-size", type=int, help="training batch size (the global batch under torchrun: split "
                                                  "evenly across the processes)")
    p.add_argument("--parallel", choices=["ddp", "fsdp"],
                   help="under torchrun: DistributedDataParallel (default) or FSDP2 sharding (docs/distributed.md)")
    p.add_argument("--tensorboard", action="store_const", const=True,
                   help="also log metrics as TensorBoard scalars in <run>/tensorboard (the tensorboard extra)")
    p.add_argument("--compile", action="store_const", const=True,
                   help="train through torch.compile (same maths; the first steps compile, 10-40 s on CPU)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. model.d_model=64")


def add_run_flags(p: argparse.ArgumentParser, *, quiet: str, out: str | None = None, out_default: str | None = None,
                  workers: bool = True, workers_default: int | None = None, resume: str | None = None) -> None:
    """The flags the sub-commands share: --out, --workers, --resume (each only where its help text is given)
    and --quiet (everywhere: what it silences)."""
    if out is not None:
        p.add_argument("--out", default=out_default, help=f"output directory (default {out})")
    if workers:
        default = "CPU count" if workers_default is None else workers_default
        p.add_argument("--workers", type=int, default=workers_default,
                       help=f"parallel single-thread processes (default: {default})")
    if resume is not None:
        p.add_argument("--resume", action="store_true", help=resume)
    p.add_argument("--quiet", action="store_true", help=quiet)


def check_positive(args, *attrs: str) -> None:
    """Numeric flags that must be > 0, checked before any work (argparse has already checked their type)."""
    for attr in attrs:
        value = getattr(args, attr, None)
        if value is not None and not value > 0:
            kind = "integer" if isinstance(value, int) else "number"
            raise ValueError(f"--{attr.replace('_', '-')} must be a positive {kind}, got {value!r}")


def as_flag(message: str, names: tuple[str, ...]) -> str:
    """A library message that starts with a parameter name, with the name written as the CLI flag."""
    for name in names:
        if message.startswith(f"{name} "):
            return f"--{name.replace('_', '-')}" + message[len(name):]
    return message


def parse_ints(text: str, name: str) -> list[int]:
    """A comma-separated list of integers (--seeds, --anchors), at least one."""
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"{name} must be a comma-separated list of integers, got {text!r}") from None
    if not values:
        raise ValueError(f"{name} must list at least one integer, got {text!r}")
    return values


def encoding_names(text: str, flag: str, why: str) -> list[str]:
    """The names of an --encodings list for a command that builds its encodings itself: specs are parsed
    (one parser, one error format) and options refused, saying `why`, rather than dropped."""
    specs = EncodingSpec.parse_list(text, arg=flag)
    for spec in specs:
        if spec.options:
            raise ValueError(f"{flag}: {why}; give names only, got {spec.label!r}")
    return [spec.name for spec in specs]


def rank() -> int:
    """This process's rank under torchrun (0 otherwise): only rank 0 reports."""
    from poskit.training.distributed import processes_from_env

    return processes_from_env().rank


def base_config(args, encoding: EncodingSpec | str | None, saved: dict | None = None):
    """Task defaults (resuming: the saved config) <- --config file <- flags <- key=value overrides, as a
    validated TrainConfig. `encoding` (the --encoding spec) sets the encoding and merges its options over the
    config's. An error about a field a flag set names the flag, as the user typed it."""
    from poskit.util.config_check import ConfigError
    from poskit.experiments.defaults import task_defaults
    from poskit.experiments.overrides import apply_overrides
    from poskit.tasks import available_tasks
    from poskit.training import TrainConfig

    if args.task is not None and args.task not in available_tasks():
        raise ValueError(f"--task must be one of {available_tasks()}, got {args.task!r}")
    cfg = copy.deepcopy(saved) if saved is not None else task_defaults(args.task)
    if args.config:
        _merge(cfg, _config_file(args.config))
    if args.task is not None:
        cfg["task"] = args.task
    if args.preset is not None:
        cfg["preset"] = args.preset
    flags = {}  # field -> (flag, value) of the flags given
    if isinstance(encoding, str):
        encoding = EncodingSpec.parse(encoding, arg="--encoding")
    if encoding is not None:
        model = cfg.setdefault("model", {})
        given = model.get("encoding_options")
        model["encoding"] = encoding.name
        if isinstance(given, dict) or encoding.options:  # a malformed value is left for the config's check
            model["encoding_options"] = {**(given if isinstance(given, dict) else {}), **encoding.options}
        flags["model.encoding"] = ("--encoding", encoding.name)
    for attr, key, flag in CONFIG_FLAGS:
        value = getattr(args, attr, None)
        if value is not None:
            cfg[key] = value
            flags[key] = (flag, value)
    apply_overrides(cfg, args.overrides)
    try:
        return TrainConfig.from_dict(cfg)
    except ConfigError as e:
        flag, value = flags.get(e.field, (None, None))
        if flag is not None and e.value == value:  # the flag's value, not one a later key=value put there
            raise e.renamed(f"{flag} ({e.field})") from None
        raise


def _config_file(name: str) -> dict:
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"--config must be an existing JSON file, got {name!r}")
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--config must be a JSON file, {name!r} is not: {e}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"--config must hold a JSON object of TrainConfig fields, {name!r} holds "
                         f"a {type(loaded).__name__}")
    return loaded


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v
