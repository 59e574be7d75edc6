"""`poskit reproduce ablations`: PoPE paper Table 8 in shape: full PoPE against PoPE without softplus and without
the phase bias delta, plus delta initialised at zero (the OpenWebText setting) versus uniform in [-2 pi, 0] (the
music and genome setting, Table 6), on the Wikipedia extract (bytes, as `text` says why)."""
from .corpus_lm import GPT2_SMALL, OPENWEBTEXT_SCHEDULE, corpus_lm_config
from .records import PaperNumbers, Reproduction

ABLATIONS = Reproduction(
    paper="PoPE paper, Table 8 (124M on OpenWebText: without softplus 21.57, without delta 21.42, full 21.33 "
          "validation perplexity)",
    summary="pope, pope without softplus, without delta, delta init uniform on the Wikipedia extract (bytes), "
            "context 256, 2 layers d 128, 400 steps, 2 seeds: 12.5 min measured on the partly loaded 2-core machine (docs/reproductions.md)",
    config=corpus_lm_config("lm-wiki", task_options={"tokenizer": "bytes"}),
    # the options pope declares (encodings/pope.py): softplus, phase_bias, delta_init
    encodings="pope,pope:softplus=false,pope:phase_bias=false,pope:delta_init=uniform",
    seeds=(0, 1),
    paper_numbers=(PaperNumbers(source="PoPE paper, Table 8", metric="validation perplexity per GPT-2 token (124M)",
                                columns=("validation",),
                                rows={"pope": (21.33,), "pope:softplus=false": (21.57,),
                                      "pope:phase_bias=false": (21.42,)},
                                note="OpenWebText BPE tokens, not bytes: only the order is comparable"),),
    split="validation",  # Table 8 reports validation perplexity
    paper_preset={"task_options.tokenizer": "gpt2", **GPT2_SMALL, **OPENWEBTEXT_SCHEDULE},
)
