"""`poskit reproduce maestro`: PoPE paper Table 2 (MAESTRO column), NLL per REMI token on a held-out performance."""
from .corpus_lm import corpus_lm_config
from .records import PaperNumbers, Reproduction

MAESTRO = Reproduction(
    paper="PoPE paper, Table 2 MAESTRO (6 layers, d 384, context 2048, 60k steps; RoPE 1.501, PoPE 1.486 NLL)",
    summary="rope, pope, none, alibi on the ten MAESTRO performances miditok ships, context 256, 2 layers d 128, "
            "400 steps, 2 seeds: 11.5 min measured on the partly loaded 2-core machine (docs/reproductions.md)",
    config=corpus_lm_config("lm-maestro"),
    encodings="rope,pope:delta_init=uniform,none,alibi",  # delta init range 2 pi for MAESTRO (Table 6)
    seeds=(0, 1),
    paper_numbers=(PaperNumbers(source="PoPE paper, Table 2 (MAESTRO)", metric="best test NLL per token",
                                columns=("test",), rows={"rope": (1.501,), "pope": (1.486,)},
                                note="best, not last, checkpoint; ~1,200 performances, 328 ids, context 2048"),),
    paper_preset={  # Tables 6-7, MAESTRO column; the task's paper preset sets context 2048
        "model.d_model": 384, "model.n_layers": 6, "model.n_heads": 8, "model.dropout": 0.1,
        "batch_size": 16, "lr": 6e-4, "min_lr": 6e-5, "beta2": 0.99, "max_steps": 60_000, "warmup_fraction": None,
        "warmup_steps": 500, "eval_every": 1000, "eval_batches": 50, "checkpoint_every": 1000,
    },
)
