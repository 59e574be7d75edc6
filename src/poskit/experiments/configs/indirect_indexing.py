"""`poskit reproduce indirect-indexing`: PoPE paper, Table 1, scaled down to one CPU core."""
from .common import OPTIMIZER_AND_LOGGING
from .records import Reproduction

INDIRECT_INDEXING = Reproduction(
    paper="PoPE paper, Table 1 (App. B: 8 layers, d 512, lr 2e-4 -> 2e-5, warmup 4k, 100k steps, batch 64)",
    summary="rope vs pope, 2 layers d 64, 100k steps: about 2 h 10 min for both on 2 idle cores (75-80 and 60-67 ms "
            "per step)",
    config={
        "task": "indirect-indexing",
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4,  # 2 layers, d 64 instead of the paper's 8, d 512
                  "encoding": "rope"},  # replaced per run by the encodings below
        "batch_size": 64,  # the paper's batch size
        "max_steps": 100_000,  # the paper's 100k steps
        "lr": 1e-3,  # peak learning rate (five times the paper's, for the smaller model)
        "min_lr": 1e-4,  # end of the cosine decay: lr / 10, as the paper's 2e-4 -> 2e-5
        "warmup_steps": 4000,  # the paper's warmup
        "beta2": 0.99,  # AdamW's second-moment decay
        "eval_every": 2000,  # validation accuracy every 2000 steps
        "checkpoint_every": 2000,  # resumable every 2000 steps (the run takes hours)
        **OPTIMIZER_AND_LOGGING,
    },
    encodings="rope,pope:delta_init=uniform",  # the paper's comparison, PoPE with its uniform delta init
    paper_preset={  # App. B, Tables 6-7 (Indirect Idx. column); the task's paper preset: 1M fixed training
        # examples, 10k validation and test examples
        "model.d_model": 512, "model.n_layers": 8, "model.n_heads": 8,  # Table 6
        "lr": 2e-4, "min_lr": 2e-5, "warmup_steps": 4000, "max_steps": 100_000,  # Table 7 (decay over all steps)
        "eval_every": 5000, "checkpoint_every": 5000,  # 0.6-0.7 GPU-hours per run in the paper
    },
)
