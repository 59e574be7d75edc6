"""Settings shared by every reproduction: the optimizer and logging of the papers' small transformers."""

OPTIMIZER_AND_LOGGING = {
    "beta1": 0.9,  # AdamW's first-moment decay (the papers' value)
    "weight_decay": 0.01,  # decoupled weight decay on weight matrices and embeddings
    "grad_clip": 1.0,  # global gradient-norm clipping
    "log_every": 50,  # a training-loss line every 50 steps
}

# the recipe of the CoPE paper's tasks at CPU scale (flip-flop, selective copy, counting): 1000 steps of one
# 2-layer d-64 model take minutes on one core
COPE_TASKS_RECIPE = {
    "batch_size": 32,  # examples per step
    "max_steps": 1000,  # the papers' 10k-100k, scaled down
    "lr": 3e-3,  # peak learning rate (ten times the papers' 3e-4, for the shorter runs)
    "min_lr": 3e-4,  # end of the cosine decay: lr / 10
    "warmup_fraction": 0.05,  # 5 % of the steps warm up linearly
    "beta2": 0.98,  # AdamW's second-moment decay (the papers' transformers)
    "checkpoint_every": 500,  # resumable twice per run
    **OPTIMIZER_AND_LOGGING,
}
