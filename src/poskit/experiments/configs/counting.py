"""`poskit reproduce counting`: CoPE paper, Tables 3-4, scaled down to one CPU core."""
from .common import COPE_TASKS_RECIPE
from .records import PaperNumbers, Reproduction, Variant

COUNTING = Reproduction(
    paper="CoPE paper, Tables 3-4 (relative PE vs CoPE; 512 operations, 1/3/5 variables)",
    summary="learned, relative, rope, pope, cope; up to 64 operations, 2 layers d 64, 1000 steps; 3 variables with 3 "
            "seeds, 1 and 5 variables with 1 seed each to keep the time down: 19 min on 2 idle cores",
    config={
        "task": "counting",
        "task_options": {
            "max_steps": 64,  # operations per sequence (the paper's 512, scaled down)
            "n_vars": 3,  # variables; the variants below set 1, 3 and 5
        },
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4,  # a 2-layer transformer
                  "encoding": "rope"},  # replaced per run by the encodings below
        "eval_every": 250,  # validation accuracy every 250 steps
        **COPE_TASKS_RECIPE,  # 1000 steps, lr 3e-3 -> 3e-4, batch 32 (common.py)
    },
    # the paper's absolute PE (poskit's learned), relative PE and CoPE, with rope and pope beside them
    encodings="learned,relative,rope,pope,cope",
    seeds=(0, 1, 2),  # three seeds for the paper's headline setting (3 variables)
    variant_field="task_options.n_vars",  # Table 3's columns: 1, 3 and 5 variables
    variants=(Variant(1, seeds=(0,)), Variant(3), Variant(5, seeds=(0,))),  # one seed for 1 and 5: run time
    paper_numbers=(
        PaperNumbers(source="CoPE paper, Tables 3 and 9", metric="test error (%)",
                     columns=("1 variable", "3 variables", "5 variables"),
                     rows={"learned": (5.3, 67.6, 71.5), "relative": (1.1, 17.8, 22.4), "cope": (0.0, 1.2, 7.4)},
                     note="error, not accuracy; Absolute PE is poskit's learned; 512 operations, 10K training "
                          "sequences"),
        PaperNumbers(source="CoPE paper, Table 4 (1 variable)", metric="test error (%)",
                     columns=("in-domain (w_pass 50)", "OOD longer (w_pass 100)", "OOD shorter (w_pass 10)"),
                     rows={"relative": (1.1, 8.8, 34.1), "cope": (0.0, 0.0, 4.0)},
                     note="the paper's OOD numbers are for 1 variable only"),
    ),
)
