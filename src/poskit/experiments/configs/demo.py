"""`poskit demo`: its defaults, and the character-level Shakespeare LM it trains (also the default config of
`poskit train --task shakespeare`). The sizes were measured on a 2-core CPU to fit the demo in about five
minutes; README.md ("Demo") has the numbers they give."""
from .demo_diagnostic import DIAGNOSTIC
from .records import DemoSettings

LM_MODEL = {
    "d_model": 128,  # about 415 k parameters at 81 characters: trains to a readable LM in 85 s
    "n_layers": 2,  # two layers: enough for the attention patterns length extrapolation tests
    "n_heads": 4,  # 32 dimensions per head
    "mlp": "gelu",  # GELU MLP, untied head
    "encoding": "rope",  # replaced per run by the demo's encodings
}

LM_TRAIN = {
    "task": "shakespeare",
    "task_options": {"context": 64},  # training context in characters; the demo evaluates 1x to 8x of it
    "model": LM_MODEL,
    "batch_size": 32,  # windows per step
    "max_steps": 2000,  # without a time budget (the demo sets one)
    "lr": 2e-3,  # peak learning rate
    "min_lr": 2e-4,  # end of the cosine decay: lr / 10
    "warmup_fraction": 0.05,  # 5 % of the steps warm up linearly
    "beta2": 0.98,  # AdamW's second-moment decay (the papers' transformers)
    "weight_decay": 0.01,  # decoupled weight decay on weight matrices and embeddings
    "grad_clip": 1.0,  # global gradient-norm clipping
    "eval_every": 250,  # validation perplexity every 250 steps
    "eval_batches": 8,  # on 8 batches (the whole split takes longer than the steps between)
    "log_every": 25,  # a training-loss line every 25 steps
    "checkpoint_every": 250,  # resumable every 250 steps
}

DEMO = DemoSettings(
    summary="Shakespeare length extrapolation + a short diagnostic (about 5 min on 2 cores)",
    out_dir="runs/demo",  # where the demo writes (it replaces only its own lm/ and diagnostic/)
    encodings=("none", "alibi", "rope", "pope"),  # the PoPE paper's Fig. 2 comparison, plus no encoding
    train_seconds=85.0,  # per LM; two at a time on 2 cores
    context=64,  # training context in characters
    lengths="1x,2x,4x,8x",  # evaluation windows: 64 to 512 characters
    n_chars=65536,  # held-out characters per window length: a stable perplexity in seconds
    diagnostic_steps=600,  # steps per diagnostic model: about a minute for all four on 2 cores
    workers=2,  # parallel single-thread processes (2 cores)
    language_model=LM_TRAIN,  # the LMs above, each with the demo's context, time budget and seed
    diagnostic=DIAGNOSTIC,  # flip-flop, shortened (demo_diagnostic.py)
    paper="PoPE paper, Fig. 2 (zero-shot length extrapolation; a figure, no numbers)",
)
