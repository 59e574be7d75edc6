"""`poskit reproduce text-extrapolation`: PoPE paper Fig. 2 in shape: train at context L on text, then evaluate
zero-shot at L..10L on held-out documents, RoPE also with test-time linear, NTK and YaRN scaling (`poskit
extrapolate`). The Wikipedia extract stands in for OpenWebText (training) and PG-19 (evaluation): its held-out
articles are joined, so a 10L window may span several of them (docs/data.md)."""
from .corpus_lm import GPT2_SMALL, OPENWEBTEXT_SCHEDULE, corpus_lm_config
from .records import Reproduction

# The rows past the paper's four are the encodings designed to extrapolate (xPos, FIRE, KERPLE), T5's bucketed
# bias, and Llama 4's iRoPE: RoPE with no position on every k-th layer. Llama 4 takes k = 4; this model has 2 layers,
# where k = 4 would leave no layer without position (the model would be plain rope), so the row takes k = 2: no
# position on layer 2 of 2. That keeps the model of every other row (2 layers, d 128), which 4 layers would not,
# and keeps the RoPE / NoPE mix of iRoPE (attention layers with and without position). Under --preset paper
# (12 layers) the same spec puts no position on every 2nd layer, not every 4th.
TEXT_EXTRAPOLATION = Reproduction(
    paper="PoPE paper, Fig. 2 (trained at 1024 tokens on OpenWebText, evaluated up to 10240 on PG-19)",
    summary="none, alibi, rope, pope, xpos, t5, fire, kerple-log, irope (no position on layer 2 of 2) on the "
            "Wikipedia extract (bytes) at context 128, 2 layers d 128, 400 steps, 1 seed, then perplexity at 1x-10x "
            "(rope also linear/ntk/yarn): 4.5 min measured for the first four encodings on the partly loaded 2-core "
            "machine (docs/reproductions.md), about twice that for all nine",
    config=corpus_lm_config("lm-wiki", task_options={"tokenizer": "bytes", "context": 128}),
    encodings="none,alibi,rope,pope,xpos,t5,fire,kerple-log,irope:nope_every=2",
    seeds=(0,),  # one seed, as the paper's figure
    paper_preset={"task_options.tokenizer": "gpt2", "task_options.context": 1024, **GPT2_SMALL,
                  **OPENWEBTEXT_SCHEDULE},
    extrapolation={
        "lengths": "1x,2x,4x,6x,8x,10x",  # the figure's multiples of the training context, up to 10x
        "scalings": ("linear", "ntk", "yarn"),  # test-time RoPE variants (factor = window / context)
        "n_chars": 32768,  # the first 32k held-out tokens per length: a stable perplexity in seconds
    },
)
