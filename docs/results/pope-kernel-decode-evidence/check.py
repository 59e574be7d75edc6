"""Does PoPE's decode on the compiled CPU kernel change any shipped result that decodes through the KV cache?

The kernel's decode (attention/pope_decode.py) replaced two torch.compile'd loops as the default for fp32/bf16
CPU decode steps after these results were measured: the context-extension grids' passkey scores (greedy decoding)
and the translation reproduction's BLEU/chrF (beam search). This script decodes the same checkpoints both ways,
the kernel's (today's default) and the loops' (the kernel's decode patched out, as the code that measured them
ran), and compares each with what the run stored. Markdown on stdout.

    python docs/results/pope-kernel-decode-evidence/check.py passkey runs/context-extension          # default grid
    python docs/results/pope-kernel-decode-evidence/check.py passkey runs/context-extension-quick --quick
    python docs/results/pope-kernel-decode-evidence/check.py translation runs/translation/pope-seed0 ...

A grid's output directory holds its base models, the last checkpoint of every extension and every step's stored
evaluation; intermediate fine-tuning steps keep no checkpoint, so only the base (step 0) and the last step are
decoded again.
"""
import argparse
import json
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch

from poskit.attention import pope_decode


@contextmanager
def decode_path(path: str, counter: dict):
    """Decode by `path` ("kernel" or "loops") inside the block, counting the kernel's decode calls."""
    real = pope_decode.cpu_flash.magnitude_decode

    def counted(*args, **kwargs):
        counter["calls"] += 1
        return real(*args, **kwargs)

    counter["calls"] = 0
    with mock.patch.object(pope_decode.cpu_flash, "magnitude_decode", counted):
        if path == "loops":
            with mock.patch.object(pope_decode, "_kernel_serves", lambda *args: False):
                yield
        else:
            yield


def passkey(out_dir: Path, quick: bool) -> None:
    from poskit.evaluate.passkey import passkey_grid
    from poskit.experiments.context_extension_plan import plan
    from poskit.training.recipes.extend import load_extend_run
    from poskit.training.run import load_run

    p = plan(out_dir=str(out_dir), quick=quick, seeds=(0, 1) if quick else None)
    print(f"Passkey scores of the PoPE checkpoints in {out_dir.name} ({'quick' if quick else 'default'} grid): "
          "exact-match and digit accuracy per length x depth, and the key's log-probability\n")
    print("| seed | method | scale | step | decode | kernel calls | seconds | accuracy as stored | digit accuracy as "
          "stored | largest key log-prob difference | mean accuracy (stored) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    counter = {"calls": 0}
    for job in p.chains:
        if job.setup != "pope":
            continue
        step = max(job.steps)
        model, task = (load_run(job.parent) if job.encoding is None else load_extend_run(job.run_dir))[:2]
        stored = json.loads((Path(job.eval_dir) / f"step-{step:05d}.json").read_text())["passkey"]
        e = job.evaluation
        for path in ("kernel", "loops"):
            t0 = time.perf_counter()
            with decode_path(path, counter):
                g = passkey_grid(model, task, list(e.lengths), list(e.depths), e.trials, seed=0, split=e.split)
            seconds = time.perf_counter() - t0
            logprob = max(abs(a - b) for ra, rb in zip(g["key_logprob"], stored["key_logprob"]) for a, b in zip(ra, rb))
            print(f"| {job.seed} | {job.method} | {job.scale or '-'} | {step} | {path} | {counter['calls']} | "
                  f"{seconds:.1f} | {'yes' if g['accuracy'] == stored['accuracy'] else 'NO'} | "
                  f"{'yes' if g['digit_accuracy'] == stored['digit_accuracy'] else 'NO'} | {logprob:.1e} | "
                  f"{g['mean_accuracy']:.4f} ({stored['mean_accuracy']:.4f}) |")
    print()


def translation(run_dirs: list[Path]) -> None:
    from poskit.models.encoder_decoder import EncoderDecoder
    from poskit.training.recipes.seq2seq import (CONFIG, HYPOTHESES, RESULTS, Seq2SeqConfig, load_pairs,
                                                  read_seq2seq_checkpoint, translate_and_score)

    print("Test translations (beam search) of PoPE translation runs: hypotheses that differ from the stored ones\n")
    print("| run | decode | kernel calls | seconds | BLEU (stored) | chrF (stored) | hypotheses differing from the "
          "stored ones |")
    print("|---|---|---|---|---|---|---|")
    counter = {"calls": 0}
    for run_dir in run_dirs:
        cfg = Seq2SeqConfig.from_dict(json.loads((run_dir / CONFIG).read_text()))
        model = EncoderDecoder(cfg.model_config())
        model.load_state_dict(read_seq2seq_checkpoint(run_dir)[0]["model"])
        data, sets = load_pairs(cfg)
        stored = (run_dir / HYPOTHESES).read_text().splitlines()
        results = json.loads((run_dir / RESULTS).read_text())
        for path in ("kernel", "loops"):
            t0 = time.perf_counter()
            with decode_path(path, counter):
                hyps, scores = translate_and_score(model, data, sets, cfg, "test", cfg.test_limit)
            differ = sum(a != b for a, b in zip(hyps, stored)) + abs(len(hyps) - len(stored))
            print(f"| {run_dir.name} | {path} | {counter['calls']} | {time.perf_counter() - t0:.0f} | "
                  f"{scores['bleu']:.4f} ({results['bleu']:.4f}) | {scores['chrf']:.4f} ({results['chrf']:.4f}) | "
                  f"{differ} of {len(stored)} |")
    print()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("passkey", "translation"))
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--quick", action="store_true", help="passkey: the grid is the quick one (seeds 0 and 1)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.what == "passkey":
        for d in args.dirs:
            passkey(d, args.quick)
    else:
        translation(args.dirs)
