"""`poskit reproduce jsb`: PoPE paper Table 2 (JSB column), NLL per token on held-out Bach chorales."""
from .corpus_lm import corpus_lm_config
from .records import PaperNumbers, Reproduction

JSB = Reproduction(
    paper="PoPE paper, Table 2 JSB (6 layers, d 256, context 2048, 3000 steps; RoPE 0.5081, PoPE 0.4889 NLL)",
    summary="rope, pope, none, alibi on JSB chorales at context 256, 2 layers d 128, 400 steps, 2 seeds: "
            "9 min measured on the 2-core machine, partly loaded (docs/reproductions.md)",
    config=corpus_lm_config("lm-jsb"),  # context 256 = about a quarter of a chorale (~900 tokens raster-scanned)
    # the paper's delta init range for JSB is 2 pi (its Table 6): uniform in [-2 pi, 0]
    encodings="rope,pope:delta_init=uniform,none,alibi",
    seeds=(0, 1),  # two seeds: mean and standard deviation
    paper_numbers=(PaperNumbers(source="PoPE paper, Table 2 (JSB)", metric="best test NLL per token",
                                columns=("test",), rows={"rope": (0.5081,), "pope": (0.4889,)},
                                note="best, not last, checkpoint; context 2048, 6 layers d 256"),),
    paper_preset={  # Tables 6-7, JSB column; the task's paper preset sets context 2048
        "model.d_model": 256, "model.n_layers": 6, "model.n_heads": 8, "model.dropout": 0.2,
        "batch_size": 4, "lr": 6e-4, "min_lr": 6e-5, "beta2": 0.99, "max_steps": 3000, "warmup_fraction": None,
        "warmup_steps": 10, "eval_every": 100, "eval_batches": None, "checkpoint_every": 500,
    },
)
