"""`poskit reproduce flip-flop`: CoPE paper, Table 2 left, scaled down to one CPU core."""
from .common import COPE_TASKS_RECIPE
from .records import PaperNumbers, Reproduction

FLIP_FLOP = Reproduction(
    paper="CoPE paper, Table 2 left (4 layers, d 256, 10k steps, lr 3e-4; length 512)",
    summary="none, learned, rope, pope, alibi, cope at length 64, 2 layers d 64, 1000 steps, 3 seeds: about 10 min on "
            "2 idle cores",
    config={
        "task": "flip-flop",
        "task_options": {
            "length": 64,  # sequence length (the paper's 512, scaled down)
            "eval_size": 1000,  # examples per evaluation split
        },
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4,  # a 2-layer transformer instead of the paper's 4
                  "encoding": "rope"},  # replaced per run by the encodings below
        "eval_every": 100,  # validation accuracy every 100 steps (the learning curves)
        # the test and OOD splits every 100 steps too: Fig. 5's convergence comparison (the paper: every 500 of
        # 10k steps; here every 100 of 1000)
        "curve_splits": ["test", "ood_sparse", "ood_dense"],
        **COPE_TASKS_RECIPE,  # 1000 steps, lr 3e-3 -> 3e-4, batch 32 (common.py)
    },
    encodings="none,learned,rope,pope,alibi,cope",  # every family: none, absolute, rotary, polar, bias, contextual
    seeds=(0, 1, 2),  # three seeds: mean and standard deviation
    paper_numbers=(PaperNumbers(
        source="CoPE paper, Table 2 left", metric="test error (%)", columns=("in-distribution", "OOD"),
        rows={"learned": (6.8, 21.7), "rope": (1.8, 20.3), "cope": (0.0, 4.9)},
        note="error, not accuracy; Absolute PE is poskit's learned; length 512, 4 layers d 256, 10k steps"),),
)
