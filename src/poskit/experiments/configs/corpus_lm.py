"""The recipe shared by the real-data reproductions (jsb, maestro, genome, text, text-cope, code,
text-extrapolation, ablations): a small decoder trained for a fixed number of steps on one corpus of
poskit.data, sized so that one reproduction (8 runs, two at a time) fits in about 15 minutes on an idle
2-core CPU. `corpus_lm_config` builds one reproduction's config from it; each experiment's module says what it
changes and why, and its `--preset paper` changes (the PoPE paper's Tables 6-7, the CoPE paper's §5.4-5.5)."""
from .common import OPTIMIZER_AND_LOGGING
from .records import derive

CORPUS_LM_BASE = {
    "task": "lm-jsb",  # replaced by each experiment
    "task_options": {"context": 256},  # training context in tokens (the papers' 1000-4096, scaled down)
    "model": {"d_model": 128, "n_layers": 2, "n_heads": 4,  # about 0.4 M parameters plus the embeddings
              "mlp": "gelu", "dropout": 0.0,
              "encoding": "rope"},  # replaced per run by the reproduction's encodings
    "batch_size": 16,  # windows per step
    "max_steps": 400,  # a few thousand steps at most in the papers' small settings; 400 fit the time budget
    "lr": 2e-3,  # peak learning rate: the papers' 6e-4 is for 100x more steps
    "min_lr": 2e-4,  # end of the cosine decay: lr / 10 (the papers' ratio)
    "warmup_fraction": 0.05,  # 5 % of the steps warm up linearly
    "beta2": 0.98,  # AdamW's second-moment decay
    "eval_every": 50,  # validation perplexity every 50 steps: the learning curves
    "eval_batches": 4,  # on 4 batches of 32 windows (the whole split at every point would double the run)
    "final_eval_batches": None,  # the final numbers cover the whole validation and test splits
    "checkpoint_every": 100,  # resumable every 100 steps
    **OPTIMIZER_AND_LOGGING,  # AdamW beta1 0.9, weight decay 0.01, clip 1.0, a loss line every 50 steps
}

# the schedule of the PoPE paper's OpenWebText runs (Table 7), shared by every text preset that follows it
OPENWEBTEXT_SCHEDULE = {
    "batch_size": 64, "lr": 6e-4, "min_lr": 6e-5, "beta2": 0.95, "max_steps": 100_000, "warmup_fraction": None,
    "warmup_steps": 1000, "eval_every": 1000, "eval_batches": 50, "checkpoint_every": 1000,
}
# the PoPE paper's 124M model (Table 6): 12 layers, d 768, 12 heads, no dropout
GPT2_SMALL = {"model.d_model": 768, "model.n_layers": 12, "model.n_heads": 12, "model.dropout": 0.0}


def corpus_lm_config(task: str, task_options: dict | None = None, **changes) -> dict:
    """CORPUS_LM_BASE for `task`: `task_options` added to its task options (e.g. a tokenizer), `changes`
    ({dotted key with "." written "__": value}, existing settings only) applied."""
    options = {**CORPUS_LM_BASE["task_options"], **(task_options or {})}
    return derive(CORPUS_LM_BASE, {"task": task, "task_options": options,
                                   **{k.replace("__", "."): v for k, v in changes.items()}})
