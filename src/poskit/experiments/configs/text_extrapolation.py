"""`poskit reproduce text-extrapolation`: PoPE paper Fig. 2 in shape: train at context L on text, then evaluate
zero-shot at L..10L on held-out documents, RoPE also with test-time linear, NTK and YaRN scaling (`poskit
extrapolate`). The Wikipedia extract stands in for OpenWebText (training) and PG-19 (evaluation): its held-out
articles are joined, so a 10L window may span several of them (docs/data.md)."""
from .corpus_lm import GPT2_SMALL, OPENWEBTEXT_SCHEDULE, corpus_lm_config
from .records import Reproduction

TEXT_EXTRAPOLATION = Reproduction(
    paper="PoPE paper, Fig. 2 (trained at 1024 tokens on OpenWebText, evaluated up to 10240 on PG-19)",
    summary="none, alibi, rope, pope on the Wikipedia extract (bytes) at context 128, 2 layers d 128, 400 steps, "
            "1 seed, then perplexity at 1x-10x (rope also linear/ntk/yarn): 4.5 min measured on the partly loaded 2-core machine (docs/reproductions.md)",
    config=corpus_lm_config("lm-wiki", task_options={"tokenizer": "bytes", "context": 128}),
    encodings="none,alibi,rope,pope",
    seeds=(0,),  # one seed, as the paper's figure
    paper_preset={"task_options.tokenizer": "gpt2", "task_options.context": 1024, **GPT2_SMALL,
                  **OPENWEBTEXT_SCHEDULE},
    extrapolation={
        "lengths": "1x,2x,4x,6x,8x,10x",  # the figure's multiples of the training context, up to 10x
        "scalings": ("linear", "ntk", "yarn"),  # test-time RoPE variants (factor = window / context)
        "n_chars": 32768,  # the first 32k held-out tokens per length: a stable perplexity in seconds
    },
)
