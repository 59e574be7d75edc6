"""`poskit reproduce code`: CoPE paper Table 5 right (code) in shape: CoPE against RoPE (and relative PE, PoPE) on
the Python standard library's own sources, held out by module (the paper's Llama-2 code mix is not available
offline; bytes at CPU scale, as `text` says why)."""
from .corpus_lm import corpus_lm_config
from .records import PaperNumbers, Reproduction

CODE = Reproduction(
    paper="CoPE paper, Table 5 right (code, 4 layers, d 256, 8 heads, context 4096; RoPE 4.1, CoPE 3.9 test "
          "perplexity)",
    summary="learned, cope, relative, rope, pope on the standard library's .py files (bytes, first 400 modules), context "
            "256, 2 layers d 128, 400 steps, 2 seeds: 13 min measured on the partly loaded 2-core machine (docs/reproductions.md)",
    # the first 400 modules of the hashed order (about 4M bytes): tokenising all 1,790 to bytes and evaluating
    # their held-out tenth would cost more than the training
    config=corpus_lm_config("lm-code", task_options={"tokenizer": "bytes", "max_documents": 400},
                            final_eval_batches=64),
    # learned: the paper's absolute PE row
    encodings="learned,cope:p_max=64,relative:max_distance=256,rope,pope",
    seeds=(0, 1),
    paper_numbers=(PaperNumbers(source="CoPE paper, Table 5 right", metric="code test perplexity per token",
                                columns=("test",), rows={"learned": (4.7,), "rope": (4.1,), "cope": (3.9,)},
                                note="Absolute PE is poskit's learned; CoPE + RoPE (4.0) has no poskit encoding; "
                                     "Llama-2 tokens, not bytes"),),
    paper_preset={  # §5.5: 4 layers, 8 heads, d 256, context 4096, lr 5e-4; GPT-2 BPE stands in for Llama-2's
        "task_options.tokenizer": "gpt2", "task_options.max_documents": None, "task_options.context": 4096,
        "model.d_model": 256, "model.n_layers": 4, "model.n_heads": 8, "lr": 5e-4, "min_lr": 5e-5,
        "batch_size": 64, "max_steps": 100_000, "warmup_fraction": None, "warmup_steps": 1000,
        "eval_every": 1000, "eval_batches": 50, "checkpoint_every": 1000, "final_eval_batches": None,
    },
)
