"""Every table and figure of the five papers (docs/papers.md) and what poskit ran for it: the coverage table
`poskit report` generates between `<!-- report: coverage table=coverage -->` markers.

`ITEMS` lists each paper's tables and figures, written from the papers themselves (the article, 001, has no
numbered ones: its plot and three tables are named by what they show). `ROWS` gives one row per claim of an
item (an item may have several parts, e.g. Table 2's JSB and MAESTRO columns), with a status from `STATUSES`,
the command that runs it, the name of its committed results under docs/results/ (the evidence; a name that is
not there yet shows as "not backed") and notes on how the set-up differs. `problems()` is what `poskit report
--check` verifies: a row for every item, no row for an item a paper does not have, a known status.

A status says no more than the numbers show: "reproduced in direction (N seeds)" only where every seed of one
side beats every seed of the other (2 seeds) or the mean ± std ranges do not overlap (3 seeds); "measured, one
seed" where there is no spread to judge a direction by; "measured, inconclusive" where gaps lie within the
spread, the reports conflict or the metric cannot test the claim at its level; "not reproduced" where the
measurement shows no effect or the opposite; "not run (why)" otherwise; "reproduced (deterministic)" for an
analysis or test without training. A row whose results are not committed shows "not backed" in the evidence
column; the notes quote the committed record's numbers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PAPERS = {
    "000": "PoPE (polar positional embeddings)",
    "001": "the position article",
    "002": "RoFormer",
    "003": "Legendre PE",
    "004": "CoPE",
}

# every table and figure of each paper, in the paper's order
ITEMS = {
    "000": ("Fig. 1", "Table 1", "Table 2", "Table 3", "Table 4", "Table 5", "Fig. 2", "Fig. 3", "Fig. 4",
            "Table 6", "Table 7", "Table 8", "Fig. 5", "Fig. 6"),
    "001": ("Plot: RoPE rotation angles by position", "Table: dot products by (m, n)",
            "Table: ALiBi slopes per head", "Table: comparing position encodings"),
    "002": ("Fig. 1", "Table 1", "Fig. 2 left", "Fig. 2 right", "Table 2", "Table 3", "Table 4", "Table 5",
            "Fig. 3"),
    "003": ("Fig. 1", "Fig. 2", "Fig. 3", "Table 1", "Fig. 4"),
    "004": ("Fig. 1", "Table 1", "Table 2 left", "Table 2 right", "Table 3", "Fig. 2", "Table 4", "Table 5 left",
            "Table 5 right", "Fig. 3", "Fig. 4", "Table 6", "Table 7", "Fig. 5", "Table 8", "Table 9", "Table 10",
            "Fig. 6"),
}

STATUSES = (
    r"reproduced in direction \(\d+ seeds\)",
    r"not reproduced( \([^)]+\))?",
    r"measured, inconclusive( \([^)]+\))?",
    r"measured, one seed",
    r"not run \(.+\)",
    r"reproduced \(deterministic\)",
)


@dataclass(frozen=True)
class Row:
    paper: str
    """The paper's number in docs/papers.md ("000" ... "004")."""
    item: str
    """The table or figure, as ITEMS names it."""
    part: str
    """Which part of the item this row covers ("" for all of it)."""
    claim: str
    """The paper's claim, in one line."""
    status: str
    """One of STATUSES."""
    command: str = ""
    """The command that runs it ("" when none can)."""
    results: str | None = None
    """The docs/results/ name that holds the evidence (None: nothing to commit)."""
    notes: str = ""
    """How poskit's set-up differs from the paper's, and what the numbers do and do not show."""


ROWS = (
    # ---------------------------------------------------------------------------------------------- 000 PoPE
    Row("000", "Fig. 1", "", "Diagram: how RoPE and PoPE build and rotate query components",
        "not run (not applicable: a diagram)", "",
        notes="Its formulas (eq. 2-9) are the `pope` encoding, tested against a float64 reference."),
    Row("000", "Table 1", "the paper's task",
        "Indirect Indexing test accuracy: RoPE 11.16 ± 2.45 %, PoPE 94.82 ± 2.91 % (3 seeds, 8 layers d 512)",
        "not reproduced (one seed, 2 layers d 64)", "poskit study indirect-indexing", "study-indirect-indexing",
        "One seed at 2 layers d 64, 100k steps: RoPE 7.6 %, PoPE 6.4 %, both at the 6.7 % floor of copying the "
        "source for shift 0 (1 query in 31) and guessing otherwise. 4 layers at d 128: the next row; the paper's "
        "size (`poskit reproduce indirect-indexing --preset paper`) is about 67 h per run on one core."),
    Row("000", "Table 1", "the paper's task, d_model 128",
        "Indirect Indexing test accuracy: RoPE 11.16 ± 2.45 %, PoPE 94.82 ± 2.91 % (3 seeds, 8 layers d 512)",
        "not reproduced (one seed, 4 layers d 128)", "poskit study indirect-indexing-paper",
        "indirect-indexing-paper",
        "Neither model learns it: both plateau by the study's rule (PoPE at 12k steps, RoPE at 14k of 30k), test "
        "PoPE 4.9 %, RoPE 5.1 %, below the 6.7 % of copying for shift 0 and guessing otherwise. The loss still "
        "falls slowly. The largest size trained here (a background study: about 3 h per run beside other work); "
        "the paper trains 100k steps at d 512 with 8 layers."),
    Row("000", "Table 1", "small-shift variant",
        "(as above, on a smaller variant: shifts up to 3, 16 letters, strings of 8-16, 4 queries)",
        "reproduced in direction (3 seeds)", "poskit reproduce indirect-indexing", "indirect-indexing",
        "PoPE 93.47 ± 4.54 %, RoPE 30.21 ± 5.35 % on today's code (2026-11-23: 93.9 and 32.1). The variant was "
        "chosen after seeing results (the one study group of six that separated). Its floor is 22.6 %: shift 0 "
        "is 1 query in 7 and is answered by copying."),
    Row("000", "Table 2", "JSB", "Music test NLL: PoPE 0.4889 < RoPE 0.5081",
        "reproduced in direction (2 seeds)", "poskit reproduce jsb", "jsb",
        "Test NLL PoPE 0.6788 ± 0.0179, RoPE 0.7279 ± 0.0045 on today's code. 2 layers d 128, context 256, "
        "400 steps (paper: 6 layers d 256, context 2048, 3k steps); last checkpoint, not the best."),
    Row("000", "Table 2", "MAESTRO", "Music test NLL: PoPE 1.486 < RoPE 1.501",
        "not reproduced (2 seeds)", "poskit reproduce maestro", "maestro",
        "Test NLL RoPE 2.6076 ± 0.0025 < PoPE 2.6305 ± 0.0079 on today's code, the seeds separate, opposite to "
        "the paper. 10 performances offline, not ~1,200; 400 steps."),
    Row("000", "Table 3", "", "Human reference genome test NLL: PoPE 4.152 < RoPE 4.217",
        "measured, inconclusive (2 seeds)", "poskit reproduce genome", "genome",
        "Test NLL PoPE 7.9905 ± 0.0188 vs RoPE 7.9828 ± 0.0596 on today's code (2026-11-23: 7.9798 vs 7.9861), "
        "both 0.07-0.08 nats below the 6-mer unigram level. 16 bacterial genomes stand in for the human genome "
        "(not offline)."),
    Row("000", "Table 4", "one size",
        "OpenWebText validation perplexity PoPE < RoPE (124M: 21.33 vs 21.55)",
        "reproduced in direction (2 seeds)", "poskit reproduce text", "text",
        "Byte-level test NLL PoPE 2.0521 ± 0.0098 vs RoPE 2.0955 ± 0.0086 on today's code (perplexity 4.2 % "
        "lower) on a 0.63M-token Wikipedia extract, 0.46M parameters; bytes, so only the direction compares."),
    Row("000", "Table 4", "size trend", "The gap holds or grows from 124M to 253M and 774M",
        "reproduced in direction (2 seeds)", "poskit reproduce text-size", "text-size",
        "The gap holds: test perplexity per byte PoPE below RoPE at every width in both seeds, by 3.4 / 2.2 % "
        "(seed 0 / 1) at d_model 64, 3.2 / 5.0 % at 128, 6.1 / 3.1 % at 256. Whether it grows is not resolved: "
        "the seeds' gaps overlap across widths (means 2.8, 4.1, 4.6 %). 2 layers, 400 steps; only the width "
        "varies, the paper's sizes differ in depth too."),
    Row("000", "Table 5", "", "Zero-shot LAMBADA, BLiMP, CBT, HellaSwag, PIQA, ARC-E: PoPE's mean accuracy is "
        "higher at all three sizes",
        "not run (benchmark data not offline; no BPE-pretrained model of a useful size; GPU compute)",
        "recipe only: python -m poskit.hf.harness (docs/hf.md)", None, "CBT is not a task of lm-eval 0.4.13."),
    Row("000", "Fig. 2", "PoPE vs RoPE",
        "Zero-shot extrapolation on PG-19 up to 10x: PoPE stays flat, RoPE degrades",
        "reproduced in direction (3 seeds)",
        "poskit reproduce text-extrapolation --encodings rope,pope --seeds 0,1,2", "text-extrapolation-seeds",
        "RoPE's 10x/1x perplexity 1.72 / 1.49 / 1.63 (seeds 0-2), PoPE's 1.05 / 1.08 / 1.07; PoPE below RoPE at "
        "every length in every seed, and below RoPE + test-time YaRN at 10x. 400 steps, context 128 bytes; "
        "concatenated wiki articles stand in for PG-19 books. The default run (one seed, with xPos, T5, FIRE, "
        "KERPLE and iRoPE rows: `text-extrapolation`) has KERPLE (log) flattest, ahead of PoPE from 6x."),
    Row("000", "Fig. 2", "size effect", "RoPE's degradation grows with model size",
        "not reproduced (2 seeds)", "poskit reproduce text-size", "text-size",
        "The opposite direction in both seeds: RoPE's 10x/1x perplexity is 2.10 / 1.79 (seed 0 / 1) at d_model 64, "
        "1.72 / 1.49 at 128, 1.77 / 1.47 at 256; PoPE's 1.05-1.20. Widths only, 400 steps."),
    Row("000", "Fig. 3", "", "RoPE 124M: high query/key norms only on a sparse set of frequency chunks",
        "measured, inconclusive (2 seeds)", "poskit reproduce text; poskit analyze frequency RUN_rope RUN_pope",
        "analyze-frequency",
        "Partial: layer 1 peaks at the highest chunk and around chunk 8 of 16, not sparse; the highest quarter "
        "holds 0.33-0.36 of the magnitude, the lowest 0.13-0.14 (seed 1, analyze-frequency-seed1: 0.33-0.36 and "
        "0.13-0.15). text's 2-layer d_model-128 byte LMs after 400 steps, not 124M."),
    Row("000", "Fig. 4", "", "PoPE 124M: high magnitudes on the highest frequencies in every layer but the "
        "first; broader use of frequencies",
        "measured, inconclusive (2 seeds)", "poskit analyze frequency RUN_rope RUN_pope", "analyze-frequency",
        "Partial: second-layer keys peak at the highest frequencies, the first layer is flatter; the keys' lowest "
        "quarter holds 0.17-0.18 of the magnitude against RoPE's 0.13-0.14 (seed 1: 0.17-0.19 against "
        "0.13-0.15), but the highest quarter's share is about RoPE's (0.29-0.37 over both seeds)."),
    Row("000", "Table 6", "", "Model configurations per dataset",
        "not run (not applicable: a configuration table)", "poskit reproduce NAME --preset paper",
        notes="The jsb, maestro, genome, text (124M) and indirect-indexing presets match it; no 253M or 774M "
              "preset."),
    Row("000", "Table 7", "", "Training hyper-parameters per dataset",
        "not run (not applicable: a configuration table)", "poskit reproduce NAME --preset paper",
        notes="The same presets as Table 6."),
    Row("000", "Table 8", "softplus", "124M validation perplexity: without softplus 21.57 > full 21.33",
        "reproduced in direction (2 seeds)", "poskit reproduce ablations", "ablations",
        "Validation perplexity per byte 8.61 ± 0.09 without softplus vs 8.01 ± 0.08 full, on today's code (PoPE "
        "under the clamp alone); the 2026-11-23 run under the projection gave the same to within 0.01."),
    Row("000", "Table 8", "delta", "without delta 21.42 > full 21.33",
        "measured, inconclusive (2 seeds)", "poskit reproduce ablations", "ablations",
        "8.016 ± 0.078 without delta vs 8.013 ± 0.079 on today's code; in the 2026-11-23 run delta was within "
        "0.27 rad of its start after 400 steps."),
    Row("000", "Fig. 5", "", "Fig. 3's analysis on the 253M model: RoPE uses a sparse set of frequencies and "
        "not the highest ones",
        "measured, inconclusive (2 seeds)",
        "poskit reproduce text-size; poskit analyze frequency RUN_rope RUN_pope", "analyze-frequency-d256",
        "Partial: at d_model 256 layer 1 has a sparse set of high-norm chunks, but the highest chunk is among "
        "them (the largest in both seeds); highest quarter 0.36-0.42 of the magnitude (seed 1, "
        "analyze-frequency-d256-seed1: 0.37-0.44). text-size's d_model-256 runs stand in for 253M."),
    Row("000", "Fig. 6", "", "Fig. 4's analysis on the 253M model: PoPE uses a broader set, notably the highest",
        "measured, inconclusive (2 seeds)", "poskit analyze frequency RUN_rope RUN_pope",
        "analyze-frequency-d256",
        "Partial: layer-1 keys peak in a band of the upper third (seed 1: at the highest components and a band "
        "there); their lowest quarter holds 0.16-0.21 against RoPE's 0.13-0.16 (seed 1: 0.17-0.22 against "
        "0.12-0.15). As Fig. 5."),
    # ------------------------------------------------------------------------------------------ 001 article
    Row("001", "Plot: RoPE rotation angles by position", "",
        "High-frequency pairs cycle fast; low-frequency pairs barely move",
        "not run (not applicable: an illustration of theta_i = 10000^(-2i/d))", "",
        notes="The rope frequencies are unit-tested (tests/test_rope.py)."),
    Row("001", "Table: dot products by (m, n)", "", "The RoPE dot product depends only on m - n",
        "reproduced (deterministic)", "python -m pytest tests/test_properties.py tests/test_rope.py",
        notes="test_logits_depend_only_on_relative_position covers every encoding; a test covers positions "
              "near a million in fp32."),
    Row("001", "Table: ALiBi slopes per head", "", "m_h = 2^(-8h/H): early heads broad, late heads local",
        "reproduced (deterministic)", "python -m pytest tests/test_bias_encodings.py",
        notes="test_alibi_slopes_power_of_two."),
    Row("001", "Table: comparing position encodings", "sinusoidal, RoPE, ALiBi and test-time scalings",
        "Extrapolation: sinusoidal poor, RoPE poor without scaling, ALiBi good, linear moderate, NTK good, YaRN "
        "excellent",
        "reproduced in direction (2 seeds)",
        "poskit reproduce text-extrapolation --encodings sinusoidal,learned,alibi,rope --seeds 0,1",
        "text-extrapolation-article",
        "10x/1x perplexity per byte after 400 steps (seed 0 / 1): ALiBi 0.99 / 1.00, RoPE with test-time YaRN "
        "1.28 / 1.31, NTK 1.50 / 1.36, RoPE 1.72 / 1.49, sinusoidal 2.06 / 1.50, linear 2.59 / 2.19: the "
        "article's order, except that linear interpolation without fine-tuning is the worst, not moderate (its "
        "rating assumes fine-tuning, which the rows below do)."),
    Row("001", "Table: comparing position encodings", "learned",
        "Extrapolation: learned absolute positions none (no embedding beyond the training length)",
        "measured, inconclusive (2 seeds)",
        "poskit reproduce text-extrapolation --encodings sinusoidal,learned,alibi,rope --seeds 0,1",
        "text-extrapolation-article",
        "10x/1x 1.06 / 1.08: the learned model hardly degrades, but its 1x perplexity (12.40 / 12.24) is about "
        "the no-position model's (12.39): in 400 steps its table learned little position, so its rows beyond "
        "the training length (2048 rows, untrained beyond 128) had little to break."),
    Row("001", "Table: comparing position encodings", "with fine-tuning: perplexity (PI, NTK, YaRN)",
        "RoPE extends 4-16x with a scaling plus a few hundred fine-tuning steps; YaRN best at step 0 and fastest; "
        "PI recovers the base's perplexity within about 200 steps (PI Table 3)",
        "reproduced in direction (2 seeds)", "poskit reproduce context-extension", "context-extension",
        "Default grid, one seed (49 min): at s = 16 after 400 steps YaRN 5.53, NTK 5.73, direct 5.99, PI 8.72 "
        "perplexity per character (base at 1x: 5.75); YaRN lowest at every step. The quick grid confirms YaRN's "
        "lead on two seeds at 0-100 steps. PI recovers only in part and regresses most at 1x (+3.29 at s = 16). "
        "Shakespeare characters, context 64, 2 layers instead of LLaMA at 2k-4k."),
    Row("001", "Table: comparing position encodings", "with fine-tuning: NTK against PI",
        "Fine-tuned NTK is worse than PI (YaRN)",
        "not reproduced (2 seeds)", "poskit reproduce context-extension --quick --seeds 0,1",
        "context-extension-quick",
        "The opposite on both seeds: after 100 steps at s = 16 NTK 9.37 / 10.47 against PI 12.40 / 12.53; in the "
        "default grid (one seed) NTK is below PI at every scale and step."),
    Row("001", "Table: comparing position encodings", "with fine-tuning: passkey (PI Table 4, YaRN)",
        "Passkey retrieval covers the extended window after about 200 steps; direct fine-tuning barely moves it",
        "not reproduced (one seed)", "poskit reproduce context-extension", "context-extension",
        "The RoPE base retrieves 93 % at 1x (seed 0; seed 1's base retrieves nothing) and every fine-tuned method "
        "loses retrieval at the extended length; PI's effective window is 0. docs/results/passkey-finetune/ shows "
        "that the scaled positions, not the plain-text data, erase it."),
    # ----------------------------------------------------------------------------------------- 002 RoFormer
    Row("002", "Fig. 1", "", "Diagram of RoPE's implementation", "not run (not applicable: a diagram)", "",
        notes="Eq. 34's element-wise form is rope with layout=\"interleaved\", tested against a float64 "
              "reference."),
    Row("002", "Table 1", "", "WMT14 En-De BLEU: RoFormer 27.5 > Transformer-base 27.3",
        "measured, inconclusive (2 seeds)", "poskit reproduce translation", "translation",
        "No model translates after 1200 steps (BLEU 0.9-1.5 on today's code, overlapping spreads), so the BLEU "
        "claim is not tested; by held-out NLL RoPE 4.233 is below sinusoidal 4.342 in both seeds, a proxy the "
        "paper does not report. 18.5k dictionary sentences De->En instead of 4.5M WMT14 pairs En->De. One "
        "12000-step sinusoidal run (translation-curve) reaches test BLEU 5.53; its validation BLEU levels off near "
        "5 from 8000 steps."),
    Row("002", "Fig. 2 left", "", "MLM pre-training loss: RoFormer converges faster than BERT",
        "reproduced in direction (2 seeds)", "poskit reproduce mlm", "mlm",
        "Test MLM loss RoPE 3.345 ± 0.021 vs learned absolute 4.489 ± 0.005 on today's code; in the one-seed run "
        "of 2026-11-23 RoPE was lower at every evaluation from step 100. 2 layers d 128, 400 steps, lr 1e-3 "
        "(paper: BERT-base, 100k steps, lr 1e-5); the gap is far larger than the paper's."),
    Row("002", "Fig. 2 right", "vs no positions",
        "Performer (linear attention) LM loss: lower and faster with RoPE than without",
        "reproduced in direction (2 seeds)", "poskit reproduce performer", "performer",
        "Test perplexity per byte RoPE 9.15 / 9.11 vs none 12.03 / 12.01 on today's code. elu + 1 features "
        "instead of FAVOR+; 2 layers d 128, context 128, 1000 steps."),
    Row("002", "Fig. 2 right", "vs learned absolute positions",
        "(the paper's baseline: performer-pytorch adds learned absolute positions)",
        "reproduced in direction (2 seeds)", "poskit reproduce performer", "performer",
        "Test perplexity per byte RoPE 9.15 / 9.11 vs learned absolute 10.22 / 10.21 on today's code, the curves "
        "of the paper's figure in direction; same deviations as the row above."),
    Row("002", "Table 2", "", "GLUE fine-tuning: RoFormer comparable to BERT overall",
        "not run (GLUE not offline; no BERT-size pretrained encoder)",
        "poskit finetune-glue RUN --task sst2 [--data hf:DIR]", None,
        "In the paper's text the MRPC column is blank. Offline, `--task cola --data word-order` runs the recipe "
        "end to end on a word-order stand-in built from the Wikipedia extract (not GLUE)."),
    Row("002", "Table 3", "", "Tokenisation level and position embedding of Chinese models",
        "not run (not applicable: a descriptive table)", ""),
    Row("002", "Table 4", "", "Chinese pre-training stages: accuracy rises with maximum length (65.0 -> 67.4 %)",
        "not run (the 34 GB Chinese corpus is not available; compute)", ""),
    Row("002", "Table 5", "", "CAIL2019-SCM: RoFormer-1024 69.79 % > WoBERT-512 68.10 %",
        "not run (CAIL2019-SCM and the Chinese pretrained models are not available)", ""),
    Row("002", "Fig. 3", "", "Long-term decay: the relative upper bound falls with distance",
        "reproduced (deterministic)", "poskit analyze decay", "analyze-decay",
        "Bound relative to distance 0: 1, 0.49, 0.31, 0.29, 0.20 at 0, 16, 64, 128, 256 (head dim 128)."),
    # --------------------------------------------------------------------------------------- 003 Legendre
    Row("003", "Fig. 1", "(b) direction",
        "Sinusoidal positions are nearly perfectly correlated in high dimensions",
        "reproduced (deterministic)", "poskit analyze correlation", "analyze-correlation",
        "Mean |corr| over dimensions 356-511 is 0.996 (d 512, positions 0-299, as in the paper)."),
    Row("003", "Fig. 1", "(b) size", "'> 0.999', even between positions 2 and 299",
        "not reproduced (deterministic)", "poskit analyze correlation", "analyze-correlation",
        "The smallest correlation over the paper's anchors is 0.976-0.991, not > 0.999."),
    Row("003", "Fig. 1", "(a)", "Low variance of sinusoidal values in high dimensions",
        "not run (the panel is not plotted; its values are in correlation.json)", "poskit analyze correlation"),
    Row("003", "Fig. 2", "", "The first four Legendre polynomials",
        "not run (not applicable: an illustration)", "",
        notes="The legendre values are tested against scipy to 1e-10."),
    Row("003", "Fig. 3", "(b)", "Legendre positions: correlation behaves as a function of distance",
        "reproduced (deterministic)", "poskit analyze correlation", "analyze-correlation",
        "High-dimension correlations between anchors run from -0.36 to 0.16; P_0 is constant, so position 0 has "
        "no correlation (NaN)."),
    Row("003", "Fig. 3", "(a)", "A better spread of values than sinusoidal",
        "not run (the panel is not plotted; its values are in correlation.json)", "poskit analyze correlation"),
    Row("003", "Table 1", "", "Multi30k En-De BLEU: Legendre 40.7 vs sinusoidal 35.59 (Zhang et al.'s run)",
        "measured, inconclusive (2 seeds)", "poskit reproduce translation", "translation",
        "BLEU Legendre 0.99 ± 0.11 vs sinusoidal 0.89 ± 0.34 on today's code: no model translates, the claim is "
        "not tested. Multi30k is not offline; the paper compares with another paper's numbers."),
    Row("003", "Fig. 4", "", "Training loss converges 2-3x faster with Legendre than with sinusoidal",
        "not reproduced (2 seeds, 1200 steps)", "poskit reproduce translation", "translation",
        "Validation NLL Legendre 4.292 ± 0.032 vs sinusoidal 4.321 ± 0.001 on today's code, inside Legendre's "
        "spread; no faster convergence. At this scale only."),
    # -------------------------------------------------------------------------------------------- 004 CoPE
    Row("004", "Fig. 1", "", "Diagram: CoPE counts gated tokens to form positions",
        "not run (not applicable: a diagram)", "", notes="Eq. 3-9 and App. B are `cope`, tested against a reference."),
    Row("004", "Table 1", "", "GPT-4 and Llama-2-70B fail to count a word in the last sentence",
        "not run (not applicable: prompting closed or 70B models; no network)", ""),
    Row("004", "Table 2 left", "CoPE vs RoPE",
        "Flip-Flop test error: CoPE 0.0 / 4.9 (in / OOD) vs RoPE 1.8 / 20.3",
        "not reproduced (3 seeds)", "poskit reproduce flip-flop", "flip-flop",
        "Rerun on today's code: in-distribution accuracy CoPE 96.95 ± 5.29 % (one seed at 90.8), RoPE 99.99 ± "
        "0.01; OOD sparse 97.71 ± 3.97 vs 99.97 ± 0.04. The run of 2026-11-23 had RoPE stuck at 77 % in one seed "
        "instead: at this length the gap is a matter of unlucky seeds. Length 64, 2 layers d 64, 1000 steps "
        "(paper: 512, 4 layers d 256, 10k)."),
    Row("004", "Table 2 left", "absolute PE", "Absolute PE 6.8 / 21.7: behind RoPE and CoPE in distribution",
        "reproduced in direction (3 seeds)", "poskit reproduce flip-flop", "flip-flop",
        "Learned positions 81.05 ± 2.25 % in distribution (19 % error, the paper's 6.8 %), barely above no "
        "positions (79.39 ± 1.84); RoPE 99.99, CoPE 96.95 ± 5.29. OOD sparse 81.8 ± 15.7 %. Length 64, 1000 "
        "steps (paper: 512, 10k)."),
    Row("004", "Table 2 right", "CoPE vs RoPE",
        "Selective copy error: CoPE 0 / 0 / 0 (in / dense / sparse) vs RoPE 40.1 / 100 / 100",
        "reproduced in direction (3 seeds)", "poskit reproduce selective-copy", "selective-copy",
        "Rerun on today's code: CoPE 100 ± 0 % in-distribution and on dense blanks, 88.1 ± 20.6 % on sparse "
        "(64.4 % in one seed); RoPE 24.0 ± 6.5 % in-distribution, 0 % OOD. 16 tokens and 16 blanks (OOD 8 / "
        "32), 1000 steps. Accuracy per whole example."),
    Row("004", "Table 2 right", "absolute PE", "Absolute PE 16.9 / 25.6 / 85.2",
        "not reproduced (3 seeds)", "poskit reproduce selective-copy", "selective-copy",
        "Learned positions: 0.13 ± 0.15 % accuracy in distribution (the paper: 83.1 %), 0 % on both OOD splits; "
        "below RoPE (24.0 %), where the paper has absolute PE ahead of it. 1000 steps on 32-token sequences "
        "(paper: 100k steps, 512 tokens); no longer run tried. The paper has no relative-PE row; poskit's is an "
        "extra."),
    Row("004", "Table 3", "3 variables", "Counting error: CoPE 1.2 < relative 17.8 < absolute 67.6 %",
        "reproduced in direction (3 seeds)", "poskit reproduce counting", "counting",
        "Accuracy CoPE 83.87 ± 0.67 % vs relative 79.37 ± 0.15, learned 80.47 ± 0.70, RoPE 80.57 ± 0.59, PoPE "
        "80.70 ± 0.30. 64 operations, not 512; fresh programs every batch. The gaps shrink with more variables; "
        "the paper's grow."),
    Row("004", "Table 3", "1 and 5 variables", "CoPE 0.0 / 7.4 < relative 1.1 / 22.4 %",
        "reproduced in direction (3 seeds)", "poskit reproduce counting --seeds 0,1,2", "counting",
        "Accuracy with 1 variable: CoPE 99.67 ± 0.58, relative 91.57 ± 3.71 %. With 5: CoPE 82.47 ± 0.81 against "
        "relative 81.07 ± 0.35, ahead in all three seeds by 0.9-2.1 points, every encoding within 1.5 points. The "
        "gap shrinks with more variables (8.1, 4.5, 1.4 points); the paper's grows. The default runs one seed of "
        "these two variants."),
    Row("004", "Table 3", "absolute PE", "Absolute PE 5.3 / 67.6 / 71.5 %: the worst at every variable count",
        "not reproduced (3 seeds)", "poskit reproduce counting --seeds 0,1,2", "counting",
        "Learned absolute positions are level with or above relative PE: 92.93 ± 1.05 against 91.57 ± 3.71 % with "
        "1 variable, 80.47 ± 0.70 against 79.37 ± 0.15 with 3, 81.10 ± 1.23 against 81.07 ± 0.35 with 5. 64 "
        "operations (paper: 512): at this length every absolute position is seen often in training."),
    Row("004", "Fig. 2", "CoPE ahead", "CoPE beats relative PE on counting at every training-set size",
        "reproduced in direction (5 seeds)",
        "poskit reproduce counting --variants 3 --encodings relative,cope --seeds 0,1,2,3,4 task_options.train_size=N",
        "counting-train300",
        "3 variables, test accuracy, CoPE minus relative PE: 12.6 points on average with 300 training programs, "
        "2.0 with 1000, 1.5 with 3000 (counting-train1000, counting-train3000), 4.5 with fresh programs "
        "(counting, 3 seeds); CoPE behind in one seed of fifteen (0.5 points, 1000 programs). 64 operations, "
        "1000 steps; the paper's sizes differ."),
    Row("004", "Fig. 2", "less data", "The gap is larger with less training data",
        "reproduced in direction (5 seeds)",
        "poskit reproduce counting --variants 3 --encodings relative,cope --seeds 0,1,2,3,4 task_options.train_size=N",
        "counting-train300",
        "Largest at the smallest size: 12.6 points (per seed 9.5-14.4) with 300 programs against 2.0 (-0.5 to 6.8) "
        "with 1000 and 1.5 (0.9-2.6) with 3000, which overlap. Not monotone over all sizes: fresh programs "
        "(counting, 3 seeds, another run) give 4.5."),
    Row("004", "Table 4", "", "Counting OOD at 1 variable (w_pass 50 / 100 / 10): relative 1.1 / 8.8 / 34.1 "
        "vs CoPE 0.0 / 0.0 / 4.0 % error",
        "reproduced in direction (3 seeds)", "poskit reproduce counting --seeds 0,1,2", "counting",
        "1 variable: CoPE 99.7 ± 0.6 / 100.0 ± 0.0 / 88.0 ± 1.2 % vs relative 91.6 ± 3.7 / 97.5 ± 1.5 / 50.5 ± 6.4 % "
        "accuracy (test / OOD longer / OOD shorter): CoPE ahead on every split, most on the shorter one, as in the "
        "paper. At 5 variables: 82.5 / 91.4 / 43.3 vs 81.1 / 90.9 / 40.2."),
    Row("004", "Table 5 left", "CoPE vs relative",
        "Wikitext-103 test perplexity: CoPE 23.46 < relative 23.81 < absolute 24.87",
        "reproduced in direction (2 seeds)", "poskit reproduce text-cope", "text-cope",
        "Test perplexity per byte CoPE 7.96 ± 0.16 vs relative 9.08 ± 0.08 on today's code (both seeds apart; "
        "12 % lower, the paper's 1.5 %). 400 steps, 2 layers d 128, bytes of the wiki extract instead of "
        "Wikitext-103."),
    Row("004", "Table 5 left", "absolute", "Absolute PE 24.87: the worst",
        "reproduced in direction (2 seeds)", "poskit reproduce text-cope", "text-cope",
        "Learned absolute positions 12.82 ± 0.01 test perplexity per byte, worst in both seeds (relative 9.08, the "
        "paper's gap 4 %, here 41 %). Same set-up as the row above."),
    Row("004", "Table 5 left", "CoPE + relative", "CoPE + relative 23.23: better than either",
        "not run (CoPE + relative not implemented)", ""),
    Row("004", "Table 5 right", "CoPE vs RoPE", "Code test perplexity: CoPE 3.9 < RoPE 4.1 < absolute 4.7",
        "reproduced in direction (2 seeds)", "poskit reproduce code", "code",
        "Test perplexity per byte CoPE 4.94 ± 0.03 vs RoPE 5.37 ± 0.03 on today's code (8 % lower; the paper's 5 %), "
        "relative 5.93, PoPE 4.83. After 150 steps (one seed) RoPE was still ahead. The standard library's "
        "modules instead of the Llama-2 code mix."),
    Row("004", "Table 5 right", "absolute", "Absolute PE 4.7: the worst",
        "reproduced in direction (2 seeds)", "poskit reproduce code", "code",
        "Learned absolute positions 7.89 ± 0.06 test perplexity per byte, worst in both seeds (RoPE 5.37; the "
        "paper's gap 15 %, here 47 %). Same set-up as the row above."),
    Row("004", "Table 5 right", "CoPE + RoPE", "CoPE + RoPE 4.0: between CoPE and RoPE",
        "not run (CoPE + RoPE not implemented)", ""),
    Row("004", "Fig. 3", "", "Perplexity at longer contexts: CoPE beats relative and relative-capped, more so "
        "the longer the context",
        "reproduced in direction (2 seeds)", "poskit reproduce text-extrapolation --encodings cope:p_max=64,"
        "relative-capped:max_distance=128,rope,alibi --seeds 0,1", "text-extrapolation-cope",
        "Perplexity per byte at 1x / 10x (seeds 0, 1): CoPE 8.50, 8.27 / 8.81, 8.52; relative-capped 9.36, 8.95 / "
        "11.45, 12.25, so the gap grows from about 0.8 to 3.2; RoPE 8.47, 8.50 / 14.54, 12.66; ALiBi flat (8.89, "
        "8.82 at 10x). 400 steps at context 128 bytes of the wiki extract (the paper: Wikitext-103 at 512 and 1024 "
        "tokens). Uncapped relative refuses positions beyond max_distance, so only relative-capped is evaluated "
        "beyond 1x."),
    Row("004", "Fig. 4", "sep-keys", "Position-only attention of a sep-keys CoPE model follows paragraphs and sections",
        "measured, inconclusive (2 seeds; 400 steps)", "poskit analyze cope-gates RUN...", "analyze-cope-gates-sep",
        "On the two sep-keys runs of text-cope-ablations no head's gates single out newlines (0.68-1.43x its mean "
        "gate in 15 of 16 heads); layer-1 gates vary with the query as well as the key. 2 layers, 400 steps, "
        "bytes of the wiki extract instead of Wikitext-103; no measure of alignment with paragraph boundaries."),
    Row("004", "Fig. 4", "keys-gated", "Position-only attention of a sep-keys CoPE model follows paragraphs and sections",
        "measured, inconclusive (2 seeds; keys-gated, 400 steps)", "poskit analyze cope-gates RUN...",
        "analyze-cope-gates",
        "On text-cope's two CoPE runs the attention from position alone falls off within a few dozen bytes, not at "
        "paragraph boundaries. Gates from the keys, not sep-keys; 2 layers, 400 steps, bytes of the wiki extract "
        "(no section titles) instead of Wikitext-103."),
    Row("004", "Table 6", "", "The full LLM prompts behind Table 1",
        "not run (not applicable: LLM prompting)", ""),
    Row("004", "Table 7", "", "Flip-Flop error across architectures; CoPE_MLP; hard attention; CoPE_ALiBi slopes",
        "not run (compute; CoPE_MLP and hard attention not implemented)",
        "poskit reproduce flip-flop --encodings learned,rope,cope,\"cope-alibi:slopes=[1,0.5,0.25,0.125]\" "
        "model.d_model=256 model.n_layers=4"),
    Row("004", "Fig. 5", "", "Flip-Flop test error every 500 steps: CoPE converges fastest",
        "not reproduced (3 seeds)", "poskit reproduce flip-flop", "flip-flop",
        "Test accuracy every 100 of 1000 steps: the mean reaches 99 % first with PoPE (step 300), then ALiBi "
        "(600) and RoPE (700; 600 when rerun through the compiled CPU kernel on code f5253df); CoPE's levels "
        "off near 96 % from step 500 (one seed of three stalls near 9 % error). Same order on the sparse OOD "
        "split. 2 layers d 64, length 64, 1000 steps (paper: 4 layers d 256, length 512, 10k steps, every 500)."),
    Row("004", "Table 8", "CoPE_ALiBi", "Wikitext ablations: CoPE_ALiBi 25.09, worse than CoPE's 23.46",
        "reproduced in direction (2 seeds)",
        "poskit reproduce text-cope --encodings cope:p_max=64,cope:p_max=64:gates=values,"
        "cope:p_max=64:gates=separate,cope:p_max=16,cope:p_max=256,cope-alibi:p_max=64", "text-cope-ablations",
        "Test perplexity per byte 8.74 / 8.66 against CoPE's 7.85 / 8.07 (about 9 % worse; the paper's 7 %). "
        "Bytes of the wiki extract at context 256, 2 layers, 400 steps."),
    Row("004", "Table 8", "p_max", "p_max 16 (23.22) and p_max = T (23.31) do no worse than 64",
        "measured, inconclusive (2 seeds; within the spread, as the paper's no-harm finding)",
        "poskit reproduce text-cope --encodings cope:p_max=64,cope:p_max=16,cope:p_max=256", "text-cope-ablations",
        "7.76 / 7.89 (16) and 7.92 / 7.79 (256 = T) against 7.85 / 8.07 (64): no side separates in both seeds."),
    Row("004", "Table 8", "gates", "val-gates 23.33 and sep-keys 23.18 slightly better than 23.46",
        "measured, inconclusive (2 seeds)",
        "poskit reproduce text-cope --encodings cope:p_max=64,cope:p_max=64:gates=values,cope:p_max=64:gates=separate",
        "text-cope-ablations",
        "7.86 / 7.92 (values) and 7.97 / 7.92 (sep-keys) against 7.85 / 8.07: within the spread; the paper's "
        "gains are 0.6-1.2 %."),
    Row("004", "Table 8", "shared embeddings", "Layers not sharing embeddings 23.58 against shared 23.46",
        "not run (embeddings shared across layers are not implemented)", "",
        notes="poskit keeps one CoPE table per layer: its cope is the paper's 'layers do not share' row."),
    Row("004", "Table 9", "", "Standard deviations of the counting errors (3 seeds)",
        "not run (not applicable: the paper's seed spread of Tables 3-4; poskit's spreads are in those rows)",
        "poskit reproduce counting", "counting"),
    Row("004", "Table 10", "", "Standard deviations of the selective-copy errors (3 seeds)",
        "not run (not applicable: the paper's seed spread of Table 2 right; poskit's are in that row)",
        "poskit reproduce selective-copy", "selective-copy"),
    Row("004", "Fig. 6", "sep-keys", "Gate values behind Fig. 4: CoPE counts paragraphs and sections",
        "measured, inconclusive (2 seeds; 400 steps)", "poskit analyze cope-gates RUN...", "analyze-cope-gates-sep",
        "One head of 16 (seed 1, layer 1, head 3) gates newlines 2.31x its mean, and digits and punctuation too, "
        "with letters 0.20 and spaces 0.15: it counts digits, punctuation and line breaks, not paragraphs. As Fig. 4."),
    Row("004", "Fig. 6", "keys-gated", "Gate values behind Fig. 4: CoPE counts paragraphs and sections",
        "measured, inconclusive (2 seeds; keys-gated, 400 steps)", "poskit analyze cope-gates RUN...",
        "analyze-cope-gates",
        "No head's gates single out newlines (0.79-1.26x its mean gate in 15 of 16 heads); one head (seed 1, layer 1) "
        "gates non-letters (letters 0.25, newlines 0.81): it counts words and lines, not paragraphs. Same "
        "deviations as Fig. 4."),
)


def problems(rows=ROWS, items=ITEMS) -> list[str]:
    """What is wrong with the coverage data: an item of a paper without a row, a row for an item or paper
    that does not exist, a status outside STATUSES, a row repeated."""
    out = []
    seen = set()
    for r in rows:
        key = (r.paper, r.item, r.part)
        if key in seen:
            out.append(f"row {r.paper} {r.item} {r.part!r} appears twice")
        seen.add(key)
        if r.paper not in items:
            out.append(f"row {r.item!r}: paper must be one of {sorted(items)}, got {r.paper!r}")
        elif r.item not in items[r.paper]:
            out.append(f"row {r.paper} {r.item!r}: not a table or figure of paper {r.paper} ({list(items[r.paper])})")
        if not any(re.fullmatch(p, r.status) for p in STATUSES):
            out.append(f"row {r.paper} {r.item} {r.part!r}: status {r.status!r} is not one of the allowed forms "
                       f"{list(STATUSES)}")
    covered = {(r.paper, r.item) for r in rows}
    for paper, names in items.items():
        for name in names:
            if (paper, name) not in covered:
                out.append(f"paper {paper} ({PAPERS.get(paper, '?')}) {name}: no row in the coverage table")
    return out


def coverage_table(evidence, paper: str | None = None) -> str:
    """The coverage table (markdown); `evidence(name)` gives the evidence cell of a docs/results name (a link
    with its date, "not backed" when the name has no results yet). `paper`: only that paper's rows."""
    from .tables import markdown_table

    if paper is not None and paper not in PAPERS:
        raise ValueError(f"paper must be one of {sorted(PAPERS)}, got {paper!r}")
    rows = []
    for r in ROWS:
        if paper is not None and r.paper != paper:
            continue
        item = f"{r.item}, {r.part}" if r.part else r.item
        rows.append([f"{r.paper} {PAPERS[r.paper]}", item, _cell(r.claim), _cell(r.status),
                     evidence(r.results) if r.results else "—", f"`{_cell(r.command)}`" if r.command else "—",
                     _cell(r.notes) or "—"])
    return markdown_table(["paper", "table / figure", "claim", "status", "evidence", "command", "notes"], rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
