"""`poskit reproduce text-cope`: CoPE paper Table 5 left (Wikitext-103) in shape: CoPE against relative PE, RoPE
and PoPE on the Wikipedia extract gensim ships, a proxy for Wikitext-103 (0.63M GPT-2 tokens, not 100M;
bytes at CPU scale, as `text` says why)."""
from .corpus_lm import GPT2_SMALL, corpus_lm_config
from .records import PaperNumbers, Reproduction

TEXT_COPE = Reproduction(
    paper="CoPE paper, Table 5 left (Wikitext-103, GPT-2 size, context 1024, p_max 64; relative 23.81, "
          "CoPE 23.46 test perplexity)",
    summary="learned, cope, relative, rope, pope on the Wikipedia extract (bytes), context 256, 2 layers d 128, 400 steps, "
            "2 seeds: 8 min measured on the nearly idle 2-core machine (docs/reproductions.md)",
    config=corpus_lm_config("lm-wiki", task_options={"tokenizer": "bytes"}),
    # p_max 64 as the paper's language model; relative PE with offsets up to the context (no cap needed)
    # learned: the paper's absolute PE row
    encodings="learned,cope:p_max=64,relative:max_distance=256,rope,pope",
    seeds=(0, 1),
    paper_numbers=(PaperNumbers(source="CoPE paper, Table 5 left", metric="Wikitext-103 perplexity per token",
                                columns=("validation", "test"),
                                rows={"learned": (23.96, 24.87), "relative": (22.90, 23.81),
                                      "cope": (22.55, 23.46)},
                                note="Absolute PE is poskit's learned; CoPE + Relative (22.31 / 23.23) has no poskit "
                                     "encoding; word-level tokens, not bytes"),),
    paper_preset={  # §5.4: GPT-2 architecture (12 layers, d 768), context 1024, batch 64; lr and steps are not
        # given as steps (100 epochs of Wikitext-103): the PoPE paper's OpenWebText schedule stands in
        "task_options.tokenizer": "gpt2", "task_options.context": 1024, **GPT2_SMALL,
        "batch_size": 64, "lr": 6e-4, "min_lr": 6e-5, "beta2": 0.95, "max_steps": 100_000, "warmup_fraction": None,
        "warmup_steps": 1000, "eval_every": 1000, "eval_batches": 50, "checkpoint_every": 1000,
    },
)
