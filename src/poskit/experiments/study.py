"""`poskit study NAME --out DIR`: a queue of long training runs, advanced in the background with early stops.

A study (a config module in experiments/configs/, named in experiments/registry.py) is an ordered list of
runs, each a full TrainConfig. The runner keeps `workers` of them training at once, each in its own
single-thread process (`python -m poskit.experiments.study OUT_DIR RUN`), and every process advances its
run one evaluation interval at a time through `train(..., stop_after=...)`, so a killed study loses at most
one interval: running the same command again resumes every unfinished run.

Between intervals the stop rule reads the run's validation curve (metrics.jsonl): a run stops when it has
*learned* (validation metric past `learned_at`) or has *plateaued* (no gain of `min_gain` in the best value
for `patience` evaluations, once `min_steps` are done); otherwise it runs to max_steps. A stopped run is
evaluated on every split (the same evaluation as a finished run's results.json) and the outcome goes to
`<run>/study.json`; the study's table and plots are built from those files alone (report/study.py), and its
results record (results.json, report/record.py) from the same outcomes.

The study directory is poskit's own (training/run_dir.py, kind "study"): a runner claims and locks it for its
whole life, so a second runner on the same directory is refused at once; a worker holds a lock of its own run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

from poskit.util.file_lock import file_lock
from poskit.training import atomic_write_json
from poskit.training.files import read_json, read_metrics
from poskit.training.run_dir import RunDirError, check, owned

from poskit.report.study import OUTCOME_FILE, curve_of, outcome, training_seconds, validation_curve

from .configs.records import StopRule, Study, StudyRun
from .outputs import is_legacy_study

SPEC_FILE = "study_spec.json"
LOG_DIR = "logs"
_REPORT_ONLY = ("wait for it or stop it first (`poskit study NAME --report-only` writes the report and plots "
                "without running anything)")


class StudyBusy(RunDirError):
    """Another process already runs this study directory (or this run of it)."""


@contextlib.contextmanager
def exclusive(lock_path: Path, what: str):
    """Hold a non-blocking exclusive file lock for `what`, or raise StudyBusy at once. Two runners on one
    directory would start two workers per run, and both would train and checkpoint the same run (seen: every
    evaluation logged twice). A killed runner releases its lock with its process."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(file_lock(lock_path, wait=False))
        except BlockingIOError:  # (only the acquisition: an error of the locked work is not "busy")
            raise StudyBusy(f"{what} is already running in another process (lock {lock_path}); {_REPORT_ONLY}") from None
        yield


def advance(study: Study, run: StudyRun, out_dir, quiet: bool = True) -> dict:
    """Train `run` in <out_dir>/<name> one evaluation interval at a time until it has learned, plateaued or
    reached max_steps (resuming what is there); writes and returns its outcome."""
    from poskit.training import train
    from poskit.training.run import load_run
    from poskit.training.step import evaluate

    run_dir = Path(out_dir) / run.name
    done = outcome(run_dir)
    if done is not None:
        return done
    cfg = run.train_config()
    t0 = time.perf_counter()
    while True:
        # resume=True also starts a run whose directory holds no checkpoint yet
        results = train(cfg, run_dir, resume=True, stop_after=cfg.eval_every, quiet=quiet)
        verdict = study.rule.verdict(validation_curve(run_dir))
        if results is not None or verdict is not None:
            break
    log = read_metrics(run_dir)
    curve = curve_of(log)
    if results is None:  # stopped early: the same evaluation a finished run's results.json holds
        model, task, cfg = load_run(run_dir)
        splits = {s: evaluate(model, task, s) for s in task.split_names}
        steps = max((s for s, _ in curve), default=0)
    else:
        splits, steps = results["splits"], results["steps"]
    record = {"name": run.name, "group": run.group, "encoding": cfg.model.encoding, "seed": cfg.seed,
              "stop": verdict or "max_steps", "steps": steps, "planned_steps": cfg.max_steps,
              "train_seconds": round(training_seconds(log) or 0.0, 1),
              "this_invocation_seconds": round(time.perf_counter() - t0, 1), "splits": splits, "curve": curve}
    atomic_write_json(run_dir / OUTCOME_FILE, record)
    return record


def write_spec(study: Study, out_dir) -> Path:
    """The study as JSON in its directory: what the worker processes read, and a record of what ran."""
    spec = {"question": study.question, "metric_split": study.metric_split,
            "rule": dataclasses.asdict(study.rule), "runs": [dataclasses.asdict(r) for r in study.runs]}
    atomic_write_json(Path(out_dir) / SPEC_FILE, spec)
    return Path(out_dir) / SPEC_FILE


def read_spec(out_dir) -> Study:
    spec = read_json(Path(out_dir) / SPEC_FILE, "a study's spec")
    try:
        return Study(question=spec["question"], metric_split=spec["metric_split"], rule=StopRule(**spec["rule"]),
                     runs=tuple(StudyRun(**r) for r in spec["runs"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{Path(out_dir) / SPEC_FILE}: not a study spec ({e})") from None


def run_study(study: Study, out_dir, workers: int = 2, nice: int = 19, poll_seconds: float = 5.0,
              python: str = sys.executable) -> list[dict]:
    """Keep `workers` single-thread processes busy with the study's unfinished runs, in order; returns the
    outcomes. Each process's output goes to <out_dir>/logs/<run>.log; one status line per started or
    finished run goes to stdout."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    for r in study.runs:
        r.train_config()  # every run's config is checked before the first one starts
    out_dir = Path(out_dir)
    check(out_dir, "study", legacy=is_legacy_study)  # not a study directory: refused, naming what it holds
    with contextlib.ExitStack() as held:
        try:  # claimed and locked before the spec or a log changes
            held.enter_context(owned(out_dir, "study", legacy=is_legacy_study))
        except RunDirError as e:  # checked above, so the directory is busy: another runner holds it
            raise StudyBusy(f"{e}; {_REPORT_ONLY}") from None
        return _run_queue(study, out_dir, workers, nice, poll_seconds, python)


def run(experiment, *, out_dir, workers: int = 2) -> list[dict]:
    """The registry's runner (`poskit study NAME`): run_study on the experiment's study."""
    return run_study(experiment.settings, out_dir, workers=workers)


def write_report(experiment, out_dir, started: float | None = None) -> list[Path]:
    """The study's table and plot (report/study.py) and its results record (results.json) of every finished
    run, written at any time (a running study's unfinished runs are left out of the record). A directory that
    is not a study directory is refused before anything is written. `started`: the time.perf_counter() of the
    command's start (the record's wall time)."""
    from poskit.report.study import write_study_report

    from .evidence import measurements_of, reproduction_paper, write_record

    started = time.perf_counter() if started is None else started
    out_dir = Path(out_dir)
    study = experiment.settings
    check(out_dir, "study", legacy=is_legacy_study)
    paths = write_study_report(study, out_dir)
    groups: dict = {}
    for r in study.runs:
        o = outcome(out_dir / r.name)
        if o is None:
            continue
        label = r.config["model"]["encoding"]
        options = r.config["model"].get("encoding_options") or {}
        if options:
            from poskit.encodings.spec import EncodingSpec

            label = EncodingSpec.from_config(label, options).label
        groups.setdefault(r.group or r.name, {}).setdefault(label, []).append(
            {"seed": o["seed"], "run": r.name, "steps": o["steps"], "train_seconds": o["train_seconds"],
             "stop": o["stop"], "splits": {s: {k: v for k, v in m.items() if isinstance(v, (int, float))}
                                           for s, m in o["splits"].items()}})
    record = write_record(out_dir, kind="study", name=experiment.name, arguments={},
                          measurements=measurements_of("accuracy", study.metric_split, groups), started=started,
                          paper=reproduction_paper(study), files=[p.name for p in paths],
                          details={"question": study.question,
                                   "finished": sum(len(v) for g in groups.values() for v in g.values()),
                                   "planned": len(study.runs)})
    return [*paths, out_dir / "results.json"] if record else paths


def _run_queue(study: Study, out_dir: Path, workers: int, nice: int, poll_seconds: float, python: str) -> list[dict]:
    (out_dir / LOG_DIR).mkdir(parents=True, exist_ok=True)
    write_spec(study, out_dir)
    pending = [r for r in study.runs if outcome(out_dir / r.name) is None]
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    failed = []
    while pending or running:
        while pending and len(running) < workers:
            r = pending.pop(0)
            cmd = [python, "-m", "poskit.experiments.study", str(out_dir), r.name]
            with open(out_dir / LOG_DIR / f"{r.name}.log", "a") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        preexec_fn=(lambda: os.nice(nice)) if nice else None)
            running[r.name] = (proc, time.perf_counter())
            print(f"[study] started {r.name} ({len(pending)} waiting)", flush=True)
        time.sleep(poll_seconds)
        for rname, (proc, started) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[rname]
            o = outcome(out_dir / rname)
            if proc.returncode != 0 or o is None:
                failed.append(rname)
                print(f"[study] {rname} FAILED (exit {proc.returncode}; see {out_dir / LOG_DIR / rname}.log)",
                      flush=True)
            else:
                acc = o["splits"].get(study.metric_split, {}).get("accuracy")
                print(f"[study] {rname}: {o['stop']} at step {o['steps']}, {study.metric_split} accuracy "
                      f"{acc:.4f}, {time.perf_counter() - started:.0f} s", flush=True)
    if failed:
        raise RuntimeError(f"study runs failed: {failed} (logs in {out_dir / LOG_DIR})")
    return [outcome(out_dir / r.name) for r in study.runs]


def main(argv=None) -> int:
    """A worker process: `python -m poskit.experiments.study OUT_DIR RUN` advances one run of the study
    whose spec run_study wrote in OUT_DIR, on one thread."""
    import torch

    out_dir, name = (sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)
    study = read_spec(out_dir)
    run = study.run(name)
    with exclusive(Path(out_dir) / f".{run.name}.lock", f"run {run.name} of the study in {out_dir}"):
        advance(study, run, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
