"""`poskit reproduce selective-copy`: CoPE paper, Table 2 right, scaled down to one CPU core."""
from .common import COPE_TASKS_RECIPE
from .records import PaperNumbers, Reproduction

SELECTIVE_COPY = Reproduction(
    paper="CoPE paper, Table 2 right (2 layers, d 64, 2 heads, 100k steps; 256 tokens, 256 blanks)",
    summary="learned, rope, pope, relative, cope; 16 tokens, 16 blanks (OOD 8 / 32), 2 layers d 64, 1000 steps, "
            "3 seeds: about 6 min on 2 idle cores",
    config={
        "task": "selective-copy",
        "task_options": {
            "n_tokens": 16,  # tokens to copy (the paper's 256, scaled down)
            "n_blanks": 16,  # blanks between them in training (the paper's 256)
            "ood_dense_blanks": 8,  # out-of-distribution split with fewer blanks
            "ood_sparse_blanks": 32,  # out-of-distribution split with more blanks
        },
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 2,  # the paper's model size
                  "encoding": "rope"},  # replaced per run by the encodings below
        "eval_every": 100,  # validation accuracy every 100 steps (the learning curves)
        **COPE_TASKS_RECIPE,  # 1000 steps, lr 3e-3 -> 3e-4, batch 32 (common.py)
    },
    encodings="learned,rope,pope,relative,cope",  # the paper's absolute PE, RoPE, CoPE; and pope, relative
    seeds=(0, 1, 2),  # three seeds: mean and standard deviation
    paper_numbers=(PaperNumbers(
        source="CoPE paper, Tables 2 right and 10", metric="test error (%)",
        columns=("in-distribution", "OOD dense", "OOD sparse"),
        rows={"learned": (16.9, 25.6, 85.2), "rope": (40.1, 100.0, 100.0), "cope": (0.0, 0.0, 0.004)},
        note="error, not accuracy; Absolute PE is poskit's learned; the paper has no relative-PE row; "
             "256 tokens and 256 blanks (OOD 128 / 512), 100k steps"),),
)
