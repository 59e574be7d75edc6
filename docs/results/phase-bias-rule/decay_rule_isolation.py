"""Selective copy at the reproduction's settings, PoPE under both phase-bias rules, trained on today's code with
the optimizer groups of the code before the trainer's consolidation (training/step.py LEGACY_RULE: weight decay
on embeddings too). Run from a checkout: `python docs/results/phase-bias-rule/decay_rule_isolation.py SPEC SEED`
(SPEC `pope` or `pope:delta_projection=true`); it trains in runs/decay-rule-isolation/ and prints one JSON line.
Together with the same runs under today's rule it isolates what the decay rule does to each seed."""
import json
import sys
import time
from pathlib import Path

import torch

from poskit.encodings.spec import EncodingSpec
from poskit.experiments.registry import experiment
from poskit.experiments.resolution import reproduction_config
from poskit.training.config import TrainConfig
from poskit.training.recipes.lm import LMRecipe
from poskit.training.run import run
from poskit.training.step import DECAY_RULE, LEGACY_RULE


class LegacyDecay(LMRecipe):
    def optimizer(self, model, rule=DECAY_RULE):
        return super().optimizer(model, LEGACY_RULE)


def main(spec: str, seed: int) -> dict:
    torch.set_num_threads(1)  # as the reproduction's workers
    cfg = reproduction_config(experiment("selective-copy", "reproduction").settings, None, None, None)
    cfg["model"]["encoding"], cfg["model"]["encoding_options"] = EncodingSpec.of(spec).to_config()
    cfg["seed"] = seed
    run_dir = Path("runs/decay-rule-isolation") / f"{spec.replace(':', '_').replace('=', '_')}-s{seed}"
    started = time.time()
    results = run(LegacyDecay(TrainConfig.from_dict(cfg)), run_dir, quiet=True)
    return {"spec": spec, "seed": seed, "decay_rule": LEGACY_RULE, "wall_seconds": round(time.time() - started, 1),
            "test_accuracy": results["splits"]["test"]["accuracy"]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
