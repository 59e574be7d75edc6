"""The aggregated results file every experiment writes in its output directory (`results.json`), in one schema.

A reproduction, a compare, a study, a demo and an analysis each end by writing one small file that holds what
a reader needs to trust a number without the run directories: what ran (the command, and the arguments that
resolve its configuration again), on which code (poskit's version, the git commit and whether the tree had
changes), when (UTC), where (CPU, cores, torch, OS), how long (wall time), with which settings (the fully
resolved configuration: every option with its default, the encodings' constructor defaults included), the
numbers (per encoding and per seed, per split) and the paper's numbers beside them.

Schema (version 1; `ResultsRecord` below is its one definition, `to_dict`/`from_dict` its JSON form):

    schema, schema_version   "poskit.results", 1
    name, kind               the experiment ("jsb", "indirect-indexing", "decay", a task for `compare`), and
                             one of KINDS
    command                  the command line as typed (machine paths made relative), or for a run started
                             from Python the equivalent command
    arguments                the arguments that decide the configuration (seeds, encodings, steps, overrides,
                             preset, variants, ...): what resolves it again today (staleness)
    code                     {"poskit_version", "git_commit" (None outside a git checkout), "dirty" (None
                             likewise)}
    date                     "YYYY-MM-DDTHH:MM:SSZ", when the record was written
    machine                  {"cpu", "cores", "torch", "python", "os"}
    wall_seconds             the command's wall time
    resolved                 the fully resolved configuration ({"base": the training config with every field,
                             "encodings": {label: {"spec", "name", "options": every constructor option with its
                             value or default, "fixed"}}, plus what the kind adds)
    measurements             {"metric", "split", "variant_field", "groups": {group: {label: [run, ...]}}} where a
                             run is {"seed", "run" (directory relative to the output directory), "steps",
                             "train_seconds", "splits": {split: {metric: value}}}; group "" when there are no
                             variants
    paper                    {"source": which table or figure, "numbers": [{"source", "metric", "columns", "rows"
                             {encoding: [value per column]}, "note"}] or None where the paper has no number}
    files                    the plots and tables beside it (relative names)
    extrapolation            optional: {"context", "sweeps": {label: [{"length", "multiple", "perplexity",
                             "last_perplexity", ...}]}}

Fields a kind wrote before this schema (compare's task, metric, split, encodings, seeds, config, runs, nll,
variants; translation's setup and signatures; digits' settings) stay at the top level beside these (`details`),
so that their readers keep working.
"""
from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import inspect
import math
import os
import platform
import shlex
import subprocess
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from pathlib import Path

SCHEMA, SCHEMA_VERSION = "poskit.results", 1
RESULTS_JSON = "results.json"
KINDS = ("reproduction", "compare", "study", "demo", "analysis")

_COMMAND: contextvars.ContextVar = contextvars.ContextVar("poskit_command", default=None)
_CODE_AT_START: contextvars.ContextVar = contextvars.ContextVar("poskit_code_at_start", default=None)


@contextlib.contextmanager
def command_line(argv: list[str]):
    """Record `argv` (["poskit", "reproduce", ...]) as the command of the results written inside the block
    (the CLI wraps every command in it; a run started from Python gets its equivalent command instead), and the
    code as the command starts: a run can outlast commits made meanwhile, and what it measured is the code it
    started with (new_record)."""
    token = _COMMAND.set([str(a) for a in argv])
    # git is asked beside the command, not before it: most commands write no record and need not wait for it
    code_token = _CODE_AT_START.set(_in_background(code_info))
    try:
        yield
    finally:
        _COMMAND.reset(token)
        _CODE_AT_START.reset(code_token)


def _in_background(fn) -> Future:
    future: Future = Future()

    def run():
        try:
            future.set_result(fn())
        except BaseException as e:  # handed to whoever asks for the result
            future.set_exception(e)

    threading.Thread(target=run, name="poskit-code-info", daemon=True).start()
    return future


def _same_code(a: dict, b: dict) -> bool:
    return a.get("git_commit") == b.get("git_commit") and a.get("dirty") == b.get("dirty")


def _portable_token(token: str, cwd: Path) -> str:
    flag, eq, value = token.partition("=") if token.startswith("--") else ("", "", token)
    if not os.path.isabs(value):
        return token
    path = Path(value)
    try:
        value = os.path.relpath(path, cwd) if cwd in path.resolve().parents or path.resolve() == cwd else None
    except ValueError:  # another drive (Windows)
        value = None
    value = value if value is not None else f".../{path.name}"
    return f"{flag}{eq}{value}" if eq else value


def portable_command(argv: list[str], cwd=None) -> str:
    """`argv` as one shell line without machine paths: an absolute path under the working directory becomes
    relative to it, any other becomes ".../<its name>"."""
    cwd = Path(cwd or os.getcwd()).resolve()
    return shlex.join(_portable_token(a, cwd) for a in argv)


def command_text(equivalent: list[str]) -> str:
    """The command of a record: the CLI's argv when the CLI runs, else `equivalent` (the same command
    rebuilt from the arguments of the Python call)."""
    argv = _COMMAND.get()
    return portable_command(argv if argv is not None else equivalent)


def relative_to(path, base) -> str:
    """`path` relative to `base` (a run directory inside an output directory: "rope/seed0"); a path outside
    `base` keeps only its name, so that no machine path enters a results file."""
    path, base = Path(path), Path(base)
    for p, b in ((path, base), (path.resolve(), base.resolve())):
        try:
            return p.relative_to(b).as_posix() or "."
        except ValueError:
            continue
    return f".../{path.name}"


# ---------------------------------------------------------------------------------------------- provenance

CODE_COMMIT_ENV = "POSKIT_CODE_COMMIT"


def code_info() -> dict:
    """poskit's version and, when the package is imported from a git checkout, its commit and whether the
    package's files differ from it (tracked changes or new files under the package directory).

    A copy of a checkout sent elsewhere (the tree a benchmark machine receives) names its commit in
    POSKIT_CODE_COMMIT, which then wins over git: such a copy may carry a stale .git of its own (seen: a device
    machine's copy whose .git still stood at the session's first commit). Whether the copy differs from the
    commit it names stays unknown (dirty None)."""
    import poskit

    pkg = Path(poskit.__file__).resolve().parent
    info = {"poskit_version": poskit.__version__, "git_commit": None, "dirty": None}
    given = os.environ.get(CODE_COMMIT_ENV, "").strip()
    if given:
        return {**info, "git_commit": given}
    try:
        commit = subprocess.run(["git", "-C", str(pkg), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=20)
        if commit.returncode != 0:
            return info
        status = subprocess.run(["git", "-C", str(pkg), "status", "--porcelain", "--", "."], capture_output=True,
                                text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):  # no git, or it hangs: the version alone
        return info
    info["git_commit"] = commit.stdout.strip()
    info["dirty"] = bool(status.stdout.strip()) if status.returncode == 0 else None
    return info


def code_label(code: dict) -> str:
    """"0.1.0 (4dd55da, dirty)" for a provenance line."""
    commit = code.get("git_commit")
    if not commit:
        return str(code.get("poskit_version"))
    return f"{code.get('poskit_version')} ({commit[:7]}{', dirty' if code.get('dirty') else ''})"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict:
    """The CPU model, its core count, torch's and Python's versions, the OS and the GPU where torch sees one (no
    host name, no paths)."""
    import torch

    info = {"cpu": _cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "os": f"{platform.system()} {platform.release()}"}
    if torch.cuda.is_available():
        info["gpu"] = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    return info


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -------------------------------------------------------------------------------------- resolved encodings

def _json_safe(value):
    """A value as JSON holds it (tuples as lists, non-finite floats and other objects as text)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def resolve_encoding(spec) -> dict:
    """Every constructor option of the spec's encoding with its value: the spec's where it sets one, else the
    constructor's default (an option without a default is "required"); `fixed` are the options the
    registration fixes. A changed default shows here, so a results file records what its runs really used."""
    from poskit.encodings.base import encoding_class
    from poskit.encodings.spec import EncodingSpec, allowed_options
    from poskit.encodings.base import _REGISTRY

    spec = EncodingSpec.of(spec)
    params = inspect.signature(encoding_class(spec.name).__init__).parameters
    given = spec.options
    options = {}
    for key in allowed_options(spec.name):
        default = params[key].default
        options[key] = given[key] if key in given else ("required" if default is inspect.Parameter.empty
                                                        else default)
    return {"spec": spec.label, "name": spec.name, "options": _json_safe(options),
            "fixed": _json_safe(dict(_REGISTRY[spec.name][1]))}


def resolve_encodings(specs) -> dict:
    """{label: resolve_encoding(spec)} in the given order."""
    from poskit.encodings.spec import EncodingSpec

    out = {}
    for s in specs:
        s = EncodingSpec.of(s)
        out[s.label] = resolve_encoding(s)
    return out


# ------------------------------------------------------------------------------------------------ the record

class RecordError(ValueError):
    """A results file that is not a record of this schema: the message names the file and the field."""


_FIELD_TYPES = {"name": str, "kind": str, "command": str, "arguments": dict, "code": dict, "date": str,
                "machine": dict, "wall_seconds": (int, float), "resolved": dict, "measurements": dict,
                "paper": dict, "files": list}


@dataclass
class ResultsRecord:
    """One experiment run's aggregate (the module docstring lists the fields)."""

    name: str
    kind: str
    command: str
    arguments: dict
    code: dict
    date: str
    machine: dict
    wall_seconds: float
    resolved: dict
    measurements: dict
    paper: dict
    files: list = field(default_factory=list)
    details: dict = field(default_factory=dict)
    """Fields the kind wrote before this schema, kept at the top level of the JSON for their readers."""

    def __post_init__(self):
        _check(self.to_dict(), "results record")

    def to_dict(self) -> dict:
        header = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION}
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "details"}
        clash = sorted(set(self.details) & (set(own) | set(header)))
        if clash:
            raise ValueError(f"details must not repeat the record's own fields, got {clash}")
        return _json_safe({**header, **own, **self.details})

    @classmethod
    def from_dict(cls, data: dict, where: str = "results record") -> "ResultsRecord":
        _check(data, where)
        names = {f.name for f in fields(cls)} - {"details"}
        details = {k: v for k, v in data.items() if k not in names and k not in ("schema", "schema_version")}
        return cls(**{k: data[k] for k in names if k in data}, details=details)

    def write(self, out_dir) -> Path:
        from poskit.training import atomic_write_json

        path = Path(out_dir) / RESULTS_JSON
        atomic_write_json(path, self.to_dict())
        return path


def _check(data, where: str) -> None:
    if not isinstance(data, dict):
        raise RecordError(f"{where}: holds a JSON {type(data).__name__}, not a results record")
    if data.get("schema") != SCHEMA or data.get("schema_version") != SCHEMA_VERSION:
        raise RecordError(f"{where}: schema must be {SCHEMA!r} version {SCHEMA_VERSION} (a results file written by "
                          f"`poskit reproduce`, `study`, `demo`, `digits` or `analyze`), got "
                          f"{data.get('schema')!r} version {data.get('schema_version')!r}")
    for key, kind in _FIELD_TYPES.items():
        value = data.get(key)
        if key == "paper" and value is None:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            raise RecordError(f"{where}: field {key!r} must be a {getattr(kind, '__name__', 'number')}, got "
                              f"{type(value).__name__}")
    if data["kind"] not in KINDS:
        raise RecordError(f"{where}: kind must be one of {list(KINDS)}, got {data['kind']!r}")
    groups = data["measurements"].get("groups")
    if not isinstance(groups, dict):
        raise RecordError(f"{where}: measurements must hold groups {{group: {{label: [run, ...]}}}}")
    for group, labels in groups.items():
        for label, runs in (labels.items() if isinstance(labels, dict) else [(None, None)]):
            if not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("splits"), dict)
                                                     for r in runs):
                raise RecordError(f"{where}: measurements of group {group!r} label {label!r} must be a list of "
                                  "runs, each with splits")


_OWN_FIELDS = {f.name for f in fields(ResultsRecord)} | {"schema", "schema_version"}


def read_record(path) -> ResultsRecord:
    """The results record in `path`, checked (a RecordError or RunFileError naming the file)."""
    from poskit.training.files import read_json

    return ResultsRecord.from_dict(read_json(path, "a results record"), where=str(path))


def new_record(*, name: str, kind: str, equivalent: list[str], arguments: dict, resolved: dict,
               measurements: dict, paper: dict | None, wall_seconds: float, out_dir, files=(),
               details: dict | None = None) -> ResultsRecord:
    """A record stamped now, on this machine; `equivalent` is the command rebuilt from the Python call's arguments
    (used when no CLI command is being recorded); `files` are names under `out_dir` that exist. The code is the
    code the CLI command started with (command_line), or now's for a call from Python; where the two differ, the
    details keep the code at the end too (`code_at_end`)."""
    out_dir = Path(out_dir)
    started = _CODE_AT_START.get()
    started = started.result() if started is not None else None  # read before now's, as the command began
    now = code_info()
    code = started if started is not None else now
    if not _same_code(code, now):
        details = {**(details or {}), "code_at_end": now}
    return ResultsRecord(
        name=name, kind=kind, command=command_text(equivalent), arguments=_json_safe(arguments), code=code,
        date=utc_now(), machine=machine_info(), wall_seconds=round(float(wall_seconds), 1),
        resolved=_json_safe(resolved), measurements=_json_safe(measurements), paper=paper,
        files=[f for f in files if (out_dir / f).exists()],
        # a field the kind's summary shares with the record (a translation's name and wall_seconds) is the record's
        details=_json_safe({k: v for k, v in (details or {}).items() if k not in _OWN_FIELDS}))


def paper_block(source: str | None, numbers) -> dict | None:
    """The record's `paper` field from a config's `paper` text and its `paper_numbers` (PaperNumbers records
    or dicts; none: the paper has no number for it)."""
    from dataclasses import asdict, is_dataclass

    if source is None and not numbers:
        return None
    items = [asdict(n) if is_dataclass(n) else dict(n) for n in (numbers or ())]
    return {"source": source, "numbers": items or None}


def absolute_paths(obj, path: str = "") -> list[str]:
    """Every string in `obj` that looks like a machine path (absolute, or naming a home directory), with where
    it is: a results file must hold none."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            found += absolute_paths(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += absolute_paths(v, f"{path}[{i}]")
    elif isinstance(obj, str):
        home = str(Path.home())
        for word in obj.split():
            word = word.strip("'\"(),;")
            value = word.partition("=")[2] if word.startswith("--") else word
            if (len(value) > 1 and value[0] == "/" and value[1] not in " /") or (home != "/" and home in word):
                found.append(f"{path}: {obj[:80]}")
                break
    return found


