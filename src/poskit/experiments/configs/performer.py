"""`poskit reproduce performer`: RoFormer (paper 002) section 4.4 / Fig. 2 right, linear attention with and
without RoPE on a character-level Wikipedia LM, scaled down to one CPU core.

The paper trains a 12-layer, 768-wide, 12-head char-level PerFormer on Enwik8 (learning rate 1e-4, batch 128,
sequence length 1024) and plots the pre-training loss with and without RoPE. Here: the offline English
Wikipedia extract of poskit.data (`lm-wiki`; plain text, not Enwik8's raw XML) at the byte level (UTF-8 bytes,
the `bytes` tokenizer: one token per character for ASCII text), causal linear attention with elu(x) + 1
features (Katharopoulos et al., the map RoFormer names; the paper's Performer uses random features instead),
and pope beside rope (PoPE in linear attention: the softplus magnitudes are the features,
attention/linear.py says how). The paper's baseline, through the performer-pytorch code it used, has learned
absolute positions: that is the default's `learned`; `none` (no positions at all) is the floor beside it.
`--preset paper` sets the paper's sizes (PAPER below): a GPU run.
"""
from .common import OPTIMIZER_AND_LOGGING
from .records import Reproduction

PERFORMER = Reproduction(
    paper="RoFormer, section 4.4 / Fig. 2 right (12-layer char PerFormer on Enwik8, with and without RoPE)",
    summary="linear attention: none, learned, rope, pope on byte-level wiki, context 128, 2 layers d 128, 1000 "
            "steps of 16 windows, 2 seeds: 56 min for seed 0 (3 encodings) on a heavily loaded 2-core machine",
    config={
        "task": "lm-wiki",
        "task_options": {
            "tokenizer": "bytes",  # character level (UTF-8 bytes), as the paper's char-based model
            "context": 128,  # training sequence length (the paper's 1024, scaled down)
        },
        "model": {"d_model": 128, "n_layers": 2, "n_heads": 4,  # the paper's 12 layers x 768, scaled down
                  "attention": "linear",  # RoFormer eq. 19: causal linear attention, encoding after the features
                  "encoding": "rope"},  # replaced per run by the encodings below
        "batch_size": 16,  # windows per step (the paper's 128)
        "max_steps": 1000,  # the paper trains far longer; the curves separate within a few hundred steps
        "lr": 2e-3,  # peak learning rate (the paper's 1e-4 suits its 12-layer model, not a 2-layer one)
        "min_lr": 2e-4,  # end of the cosine decay: lr / 10
        "warmup_fraction": 0.05,  # 5 % of the steps warm up linearly
        "beta2": 0.98,  # AdamW's second-moment decay
        "eval_every": 100,  # validation perplexity every 100 steps: the loss curves
        "eval_batches": 8,  # on 8 batches of 32 windows (the task's eval batch size)
        "final_eval_batches": 32,  # each split at the end: 32 batches of 32 windows of 128 bytes
        "checkpoint_every": 300,  # resumable
        **OPTIMIZER_AND_LOGGING,
    },
    encodings="none,learned,rope,pope",  # the paper's two curves (learned / RoPE), no positions, PoPE's polar form
    seeds=(0, 1),  # two seeds: mean and spread of the curves
    # `poskit reproduce performer --preset paper`: the paper's set-up (12 layers, 768 wide, 12 heads, batch
    # 128, lr 1e-4, sequence 1024); hours on a GPU, not meant for a CPU
    paper_preset={
        "task_options.context": 1024,
        "model.d_model": 768, "model.n_layers": 12, "model.n_heads": 12,
        "batch_size": 128, "lr": 1e-4, "min_lr": 1e-5, "max_steps": 100000,
        "eval_every": 1000, "checkpoint_every": 1000,
    },
)
