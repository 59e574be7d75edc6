"""`poskit reproduce mlm`: RoFormer (paper 002) sec. 4.2, Fig. 2 left (the MLM loss of BERT vs RoFormer during
pre-training), scaled down to one CPU core per run. `--preset paper` gives the paper's BERT-base set-up."""
import dataclasses

from .common import OPTIMIZER_AND_LOGGING
from .records import Reproduction

MLM_MODEL = {
    "d_model": 128, "n_layers": 2, "n_heads": 4,  # 2 layers, d 128 instead of BERT-base's 12 layers, d 768
    "mlp": "gelu",  # BERT's GELU MLP, 4 x d_model wide
    "causal": False,  # a bidirectional encoder (BERT)
    "tie_embeddings": True,  # BERT's output layer reuses the token embeddings
    "encoding": "rope",  # replaced per run by the encodings below
}

MLM = Reproduction(
    paper="RoFormer paper, sec. 4.2 / Fig. 2 left (BERT-base, batch 64, length 512, 100k steps, AdamW lr 1e-5; "
          "BookCorpus + Wikipedia)",
    summary="learned vs rope (+ pope): BERT-style MLM on the wiki extract, 2 layers d 128, context 128, 400 steps, "
            "2 seeds: about 1400 s of CPU time in all (one seed took 712 s)",
    config={
        "task": "mlm-wiki",
        "preset": "default",  # the task's CPU-scale sizes (the paper preset below sets "paper")
        "task_options": {
            "context": 128,  # tokens per window (the paper's 512, scaled down)
            # 4096 ids: the 3837 most frequent GPT-2 tokens of the training split, the 256 bytes for the rest,
            # end-of-document and [MASK]; the output layer over GPT-2's 50k ids would cost 10x the model
            "vocab_size": 4096,
        },
        "model": MLM_MODEL,
        "batch_size": 32,  # windows per step (the paper's 64, halved for CPU time)
        "max_steps": 400,  # the paper's 100k, scaled down
        "lr": 1e-3,  # peak learning rate (the paper's 1e-5 is for a 110M-parameter model over 100k steps)
        "min_lr": 1e-4,  # end of the cosine decay: lr / 10
        "warmup_fraction": 0.05,  # 5 % of the steps warm up linearly
        "beta2": 0.98,  # AdamW's second-moment decay
        "eval_every": 50,  # validation MLM loss every 50 steps (the loss curves)
        "eval_batches": 8,  # on 8 batches of 32 windows (about half the split; the final evaluation uses all)
        "checkpoint_every": 200,  # resumable
        **{**OPTIMIZER_AND_LOGGING, "log_every": 10},  # a training-loss point every 10 steps
        "device": "cpu",  # one CPU thread per run
        "bf16": False,  # fp32
    },
    # learned absolute positions (BERT's, which the paper calls its baseline) vs RoPE (RoFormer); pope: an extra
    encodings="learned,rope,pope",
    seeds=(0, 1),  # two seeds: the learned-vs-rope gap is read against the seed spread
    training_loss_plot=True,  # the paper's figure plots the training MLM loss: written to training_loss.png
)

# What a GPU user runs to match the paper (`poskit reproduce mlm --preset paper`): BERT-base and RoFormer sec. 4.2.
# Not run here (days of CPU time); the corpus stays the offline wiki extract unless task_options.corpus is set to
# an hf: dataset (e.g. a saved Wikipedia + BookCorpus text dataset; then use the `mlm` task).
MLM_PAPER = {
    # with "preset": "paper" (set by --preset paper): the task preset's context 512 and the tokenizer's full
    # vocabulary (GPT-2's 50k + [MASK])
    "task_options.context": 512,
    "task_options.vocab_size": None,
    "model.d_model": 768, "model.n_layers": 12, "model.n_heads": 12,  # BERT-base: 110M parameters
    "batch_size": 64,  # the paper's batch size
    "max_steps": 100_000,  # the paper's 100k steps
    "lr": 1e-5,  # the paper's AdamW learning rate
    "min_lr": 1e-5,  # the paper names no schedule: a constant rate after the warmup
    "warmup_fraction": 0.01,  # 1 % warmup (BERT's 10k of 1M steps)
    "beta2": 0.999,  # AdamW's default (BERT's)
    "eval_every": 1000,
    "checkpoint_every": 1000,
    "device": "cuda",
    "bf16": True,
}

MLM = dataclasses.replace(MLM, paper_preset=MLM_PAPER)
