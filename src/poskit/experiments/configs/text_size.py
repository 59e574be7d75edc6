"""`poskit reproduce text-size`: PoPE paper Fig. 2 and Table 4 in direction: does PoPE's advantage over RoPE hold
as the model grows, at the training length and zero-shot beyond it? The text-extrapolation set-up (the Wikipedia
extract in bytes at context 128, 400 steps) at three widths, each evaluated at 1x-10x.

Deviations from the paper: the paper's sizes are GPT-2's 124M / 253M / 774M (12 / 24 / 36 layers at d 768 /
1024 / 1280, trained on OpenWebText for 100k steps); here only the width changes (d_model 64 / 128 / 256, 2
layers, 4 heads of 16 / 32 / 64 channels: 0.1 M / 0.4 M / 1.6 M parameters besides the embeddings), every size
trains the same 400 steps, and one seed per size. `--preset paper` is refused: the paper's sizes differ in
depth, width and heads at once, three configurations rather than one varied field."""
from .corpus_lm import corpus_lm_config
from .records import Reproduction, Variant

TEXT_SIZE = Reproduction(
    paper="PoPE paper, Fig. 2 and Table 4 (three model sizes: PoPE ahead of RoPE at every size, in and beyond "
          "the training length)",
    summary="rope, pope on the Wikipedia extract (bytes) at context 128, 2 layers at d_model 64, 128 and 256, "
            "400 steps, 1 seed, then perplexity at 1x-10x: 7 min on 2 cores",
    config=corpus_lm_config("lm-wiki", task_options={"tokenizer": "bytes", "context": 128}),
    encodings="rope,pope",
    seeds=(0,),
    variant_field="model.d_model",
    variants=(Variant(64), Variant(128), Variant(256)),
    no_paper_preset="the PoPE paper's three sizes (124M, 253M, 774M) differ in depth, width and heads at once; "
                    "`poskit reproduce text --preset paper` is its 124M model",
    extrapolation={
        "lengths": "1x,2x,4x,6x,8x,10x",  # text-extrapolation's multiples of the training context
        "n_chars": 32768,
    },
)
