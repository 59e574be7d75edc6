"""`poskit reproduce translation`: RoFormer's Table 1 (002, WMT14 En-De, RoPE vs sinusoidal) and the Legendre
PE paper's Table 1 and Figure 4 (003, Multi30k En-De BLEU, training-loss convergence), scaled down to the
German-English example sentences of Debian's trans-de-en (18.5k pairs) and to CPU.

An encoder-decoder reproduction does not fit the decoder-only `Reproduction` record (a TrainConfig of a
decoder task), so its settings have their own record here and their own runner (experiments/translation.py);
the registry lists it among the reproductions, so `poskit reproduce translation` runs like any other."""
from __future__ import annotations

from dataclasses import dataclass

from .records import PaperNumbers


@dataclass(frozen=True)
class TranslationReproduction:
    paper: str
    """Which tables and figures of which papers this scales down."""
    summary: str
    """One line for `poskit list`: what runs and how long it takes."""
    config: dict
    """Seq2SeqConfig fields (poskit.training.recipes.seq2seq); the encoding is set per run."""
    encodings: str
    """Comma-separated encoding specs."""
    seeds: tuple
    """Seeds of every encoding: mean and standard deviation."""
    presets: dict
    """--preset NAME -> changes to `config` ({dotted key: value}); "cpu" is the default."""
    paper_numbers: tuple = ()
    """The papers' numbers (PaperNumbers records)."""


TRANSLATION = TranslationReproduction(
    paper="RoFormer (002) Table 1: WMT14 En-De BLEU, RoPE 27.5 vs sinusoidal 27.3; Legendre PE (003) Table 1 and "
          "Fig. 4: Multi30k En-De BLEU 40.7 vs 35.6, faster convergence",
    summary="sinusoidal, legendre, learned, rope, pope on De->En trans-de-en, 2+2 layers d 128, 1200 steps, 2 seeds, "
            "beam 4: BLEU, chrF, loss curves (about 20 min on 2 idle cores)",
    config={
        "model": {
            "d_model": 128, "n_heads": 4, "d_ff": 512,  # Transformer-base is 512 / 8 / 2048 (--preset paper)
            "n_encoder_layers": 2, "n_decoder_layers": 2,  # base: 6 + 6
            "dropout": 0.1,  # as base
            "norm": "post",  # post-norm, as both papers' Transformer
            "share_embeddings": True, "tie_output": True,  # joint BPE, all three matrices shared (Vaswani)
            "encoding": "sinusoidal",  # replaced per run
        },
        "vocab_size": 4000,  # joint BPE; 002 uses 37k for 4.5M WMT pairs, this corpus has 16.7k training pairs
        "direction": "de-en",  # German -> English; the papers translate En->De (see docs/reproductions.md)
        "max_steps": 1200,  # about 4 epochs of the training pairs
        "batch_tokens": 1000,  # target tokens per batch (base: ~25k)
        "lr": 1e-3, "warmup": 300,  # inverse square root schedule; 002: 5e-4 after 4k warm-up steps for base
        "label_smoothing": 0.1,  # as 002
        "beam_size": 4, "length_penalty": 0.6,  # as 002
        "eval_every": 300, "checkpoint_every": 300, "log_every": 10,
    },
    encodings="sinusoidal,legendre,learned,rope,pope",
    seeds=(0, 1),
    presets={
        "cpu": {},
        # the papers' model: Transformer-base, 10k steps as 003 (Zhang et al.'s Multi30k budget), lr 5e-4 with
        # 4k warm-up as 002, batches of ~4k target tokens; a GPU job (hours on CPU)
        "paper": {"model.d_model": 512, "model.n_heads": 8, "model.d_ff": 2048, "model.n_encoder_layers": 6,
                  "model.n_decoder_layers": 6, "max_steps": 10000, "lr": 5e-4, "warmup": 4000,
                  "batch_tokens": 4096, "vocab_size": 8000, "eval_every": 1000, "checkpoint_every": 500},
    },
    paper_numbers=(
        PaperNumbers(source="RoFormer, Table 1", metric="WMT14 En-De test BLEU", columns=("BLEU",),
                     rows={"sinusoidal": (27.3,), "rope": (27.5,)},
                     note="Transformer-base on 4.5M pairs, En->De, checkpoint averaging"),
        PaperNumbers(source="Legendre PE paper, Table 1", metric="Multi30k En-De test BLEU", columns=("BLEU",),
                     rows={"sinusoidal": (35.59,), "legendre": (40.7,)},
                     note="the sinusoidal number is Zhang et al.'s (another paper's run), not a same-setup run"),
    ),
)
