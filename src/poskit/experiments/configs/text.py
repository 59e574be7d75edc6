"""`poskit reproduce text`: PoPE paper Table 4 (OpenWebText perplexity, 124M) in shape, on the Wikipedia extract
gensim ships (a proxy: 0.63M GPT-2 tokens, not 9B).

CPU default: UTF-8 bytes, not GPT-2 BPE. With 50,258 ids the output layer of a d-128 model costs about 80
GFLOP per step of 16 x 128 tokens, 5-6 s on one loaded core, so 400 steps of 8 runs would take hours and teach
only unigram statistics; byte-level modelling of the same text keeps every position-dependent effect and fits
the budget. `--preset paper` uses GPT-2 BPE and the paper's 124M model (context 1024)."""
from .corpus_lm import GPT2_SMALL, OPENWEBTEXT_SCHEDULE, corpus_lm_config
from .records import PaperNumbers, Reproduction

TEXT = Reproduction(
    paper="PoPE paper, Table 4 (OpenWebText, 124M: RoPE 21.55, PoPE 21.33 validation perplexity)",
    summary="rope, pope, none, alibi on the Wikipedia extract (bytes), context 256, 2 layers d 128, 400 steps, "
            "2 seeds: 12.5 min measured on the partly loaded 2-core machine (docs/reproductions.md)",
    config=corpus_lm_config("lm-wiki", task_options={"tokenizer": "bytes"}),
    encodings="rope,pope,none,alibi",  # delta init 0 for OpenWebText (Table 6): pope's default
    seeds=(0, 1),
    paper_numbers=(PaperNumbers(source="PoPE paper, Table 4", metric="validation perplexity per GPT-2 token",
                                columns=("124M", "253M", "774M"),
                                rows={"rope": (21.55, 18.88, 15.85), "pope": (21.33, 18.55, 15.45)},
                                note="OpenWebText BPE tokens, not bytes: the levels are not comparable, only the "
                                     "direction"),),
    paper_preset={"task_options.tokenizer": "gpt2", **GPT2_SMALL, **OPENWEBTEXT_SCHEDULE},  # context 1024
)
