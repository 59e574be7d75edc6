"""`poskit reproduce genome`: PoPE paper Table 3, NLL per 6-mer token on held-out genomes (bacterial genomes from
Debian ragout-examples stand in for the human reference genome: docs/data.md)."""
from .corpus_lm import corpus_lm_config
from .records import PaperNumbers, Reproduction

GENOME = Reproduction(
    paper="PoPE paper, Table 3 (human reference genome, 16 layers, d 1024, context 1000, 100k steps; "
          "RoPE 4.217, PoPE 4.152 NLL)",
    summary="rope, pope on 16 bacterial genomes (6-mers), context 256, 2 layers d 128, 400 steps, 2 seeds: "
            "17 min measured while other work held half the machine (967 s of CPU: about 9 min on 2 idle "
            "cores; docs/reproductions.md)",
    # the held-out splits are two whole genomes each (~1M tokens): the final evaluation reads the first 16
    # batches of 32 windows (131k tokens, the start of the first held-out genome) instead of all of it, which
    # would take longer than the training
    config=corpus_lm_config("lm-genome", final_eval_batches=16),
    # rope and pope only: with 4107 ids the output layer dominates the step, so no and alibi are left to
    # --encodings (they are cheap elsewhere)
    encodings="rope,pope:delta_init=uniform",  # delta init range 2 pi for HRG (Table 6)
    seeds=(0, 1),
    paper_numbers=(PaperNumbers(source="PoPE paper, Table 3", metric="best test NLL per token",
                                columns=("test",), rows={"rope": (4.217,), "pope": (4.152,)},
                                note="the human reference genome (4107 ids), not bacterial genomes"),),
    paper_preset={  # Tables 6-7, HRG column; the task's paper preset sets context 1000
        "model.d_model": 1024, "model.n_layers": 16, "model.n_heads": 16, "model.dropout": 0.1,
        "batch_size": 64, "lr": 2.5e-4, "min_lr": 2.5e-5, "beta2": 0.999, "max_steps": 100_000,
        "warmup_fraction": None, "warmup_steps": 4000, "eval_every": 1000, "eval_batches": 50,
        "checkpoint_every": 1000, "final_eval_batches": None,
    },
)
