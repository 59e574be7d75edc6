"""What CoPE counts in a trained model (CoPE paper, Figs. 4 and 6): per layer and head, the mean gate value by the
kind of key token (newline, space, punctuation, digit, letter, other), and on one held-out window the gates and
the attention induced by position alone, with the newlines marked.

In the paper a sep-keys model trained on Wikitext-103 has heads whose gates fire on the newlines between
paragraphs or on section titles, so that their contextual position counts paragraphs or sections (Fig. 6), and
the attention from position alone falls off at those boundaries (Fig. 4: softmax over the keys of the position
term z_t[p_ts], normalised so that each query's largest weight is 1). Here the same quantities are computed
for any trained run whose layers use a contextual encoding (cope, cope-alibi), from the raw projections that the
layer gives the engine (captured by forward hooks) and the encoding's own functions, so they are the numbers the
model attends with. A head "counts newlines" when its mean gate on newline keys is well above its mean over all
keys (`newline_ratio`); the classes come from decoding each token id with the run's tokenizer.
"""
from __future__ import annotations

import math
import string
from pathlib import Path

import torch

from poskit.attention.inputs import prepare, repeat_kv
from poskit.attention.reference import contextual_gate_logits, softmax_rows
from .output import checked_out_dir, write_result
from .trained import capture_projections, layer_heads, load_held_out

COPE_GATES_JSON, COPE_GATES_PNG = "cope_gates.json", "cope_gates.png"
CLASSES = ("newline", "space", "punctuation", "digit", "letter", "other")
EXAMPLE_TOKENS = 96  # the example window's last tokens drawn as maps (more would not be readable)


def token_class(text: str) -> str:
    """The class of one decoded token: newline if it holds one, space if only whitespace, else by its first
    non-space character."""
    if "\n" in text:
        return "newline"
    stripped = text.strip()
    if not stripped:
        return "space" if text else "other"
    c = stripped[0]
    if c.isdigit():
        return "digit"
    if c.isalpha():
        return "letter"
    if c in string.punctuation or not c.isalnum():
        return "punctuation"
    return "other"


def class_table(decode, vocab_size: int) -> torch.Tensor:
    """(vocab_size,) index into CLASSES of every token id; an id that does not decode on its own (a special
    token such as the byte tokenizer's padding id) is "other"."""
    def text(i):
        try:
            return decode([i])
        except ValueError:
            return None

    return torch.tensor([CLASSES.index("other" if (t := text(i)) is None else token_class(t))
                         for i in range(vocab_size)])


def layer_terms(attn, heads: dict):
    """(gates (B, H, T, T), position-only logits (B, H, T, T) with -inf where hidden, visible) of one causal
    self-attention layer with a contextual encoding, from its raw heads (q, k, v and, with separate gates, g)."""
    q, k, v, g = heads["q"], heads["k"], heads["v"], heads.get("g")
    enc = attn.encoding
    inp = prepare(q, k, v, enc, causal=True, q_positions=None, k_positions=None, scale=None, enable_gqa=True)
    visible = inp.visible()
    logits = inp.scale * (inp.q @ repeat_kv(inp.k, inp.groups).transpose(-1, -2))
    gate_logits = contextual_gate_logits(inp, enc, g, logits)
    gates = torch.sigmoid(gate_logits.float()) * visible
    position = enc.contextual_bias(q, gate_logits, visible).float().masked_fill(~visible, float("-inf"))
    return gates, position, visible


def model_cope_gates(model, batches, classes: torch.Tensor, max_tokens: int | None = None) -> dict:
    """Mean gate per (layer, head, key class) over the visible (query, key) pairs of the windows in `batches`
    (objects with an `inputs` (B, T) tensor), at most `max_tokens` tokens; the example maps of the first window
    that holds at least two newlines among its last EXAMPLE_TOKENS tokens (else the first window). Raises
    ValueError naming the layer when a layer's encoding is not contextual."""
    layers = [b.attn for b in model.blocks]
    for i, attn in enumerate(layers):
        if getattr(attn.encoding, "kind", None) != "contextual":
            name = getattr(attn.encoding, "name", "") or type(attn.encoding).__name__
            raise ValueError(f"the encoding {name!r} of layer {i} is not contextual: the gate analysis needs a cope "
                             "or cope-alibi run")
    captured, hooks = capture_projections(layers, ("q", "k", "v", "g"))
    n_classes = len(CLASSES)
    sums = [torch.zeros(attn.num_heads, n_classes, dtype=torch.float64) for attn in layers]
    counts = torch.zeros(n_classes, dtype=torch.float64)
    end_positions = [torch.zeros(attn.num_heads, dtype=torch.float64) for attn in layers]
    example, tokens, windows = None, 0, 0
    try:
        with torch.no_grad():
            for batch in batches:
                x = batch.inputs
                if max_tokens is not None:
                    x = x[:max(1, math.ceil((max_tokens - tokens) / x.shape[1]))]
                model(x)
                key_class = torch.nn.functional.one_hot(classes[x], n_classes).double()  # (B, T, C)
                for i, attn in enumerate(layers):
                    gates, position, visible = layer_terms(attn, layer_heads(captured, i, attn))
                    # sum over queries of each key's gate, then over keys by class: (B, H, Tk) x (B, Tk, C)
                    sums[i] += torch.einsum("bhk,bkc->hc", gates.double().sum(2), key_class)
                    p = gates.double().flip(-1).cumsum(-1).flip(-1)  # unclamped count from each key to the query
                    end_positions[i] += p[:, :, -1, 0].sum(0)  # the last query's count over its whole window
                if example is None:
                    newlines = (classes[x[:, -EXAMPLE_TOKENS:]] == CLASSES.index("newline")).sum(1)
                    found = (newlines >= 2).nonzero()
                    example = x[int(found[0])] if len(found) else None
                # visible pairs per key class: key s is seen by the T - s queries at or after it
                T = x.shape[1]
                seen = torch.arange(T, 0, -1, dtype=torch.float64)  # (T,)
                counts += torch.einsum("k,bkc->c", seen, key_class)
                tokens += x.numel()
                windows += x.shape[0]
                if max_tokens is not None and tokens >= max_tokens:
                    break
            if tokens == 0:
                raise ValueError("batches must hold at least one input window, got none")
            window = example if example is not None else x[0]
            maps = _example_maps(model, layers, captured, window)
            maps["newline"] = [j for j, t in enumerate(maps["tokens"]) if classes[t] == CLASSES.index("newline")]
    finally:
        for h in hooks:
            h.remove()
    mean = [(s / counts.clamp(min=1)).tolist() for s in sums]
    overall = [(s.sum(1) / counts.sum()).tolist() for s in sums]
    return {"classes": list(CLASSES), "tokens": tokens, "windows": windows,
            "pairs_per_class": counts.tolist(),
            "layers": [{"mean_gate": m, "mean_gate_all": o,
                        "newline_ratio": [row[0] / all_ if all_ > 0 else math.nan for row, all_ in zip(m, o)],
                        "window_count": (e / windows).tolist()}
                       for m, o, e in zip(mean, overall, end_positions)],
            "example": maps}


def _example_maps(model, layers, captured, window: torch.Tensor) -> dict:
    """Gates and position-only attention (normalised to a maximum of 1 per query) of the window's last
    EXAMPLE_TOKENS tokens, per layer and head, and which of those tokens are newlines."""
    model(window[None])
    n = min(EXAMPLE_TOKENS, window.shape[0])
    out = {"tokens": window[-n:].tolist(), "layers": []}
    for i, attn in enumerate(layers):
        gates, position, visible = layer_terms(attn, layer_heads(captured, i, attn))
        weights = softmax_rows(position, visible)
        weights = weights / weights.amax(-1, keepdim=True).clamp(min=1e-30)
        out["layers"].append({"gates": gates[0, :, -n:, -n:].tolist(),
                              "position_attention": weights[0, :, -n:, -n:].tolist()})
    return out


def cope_gate_counts(run_dir, split: str = "test", max_tokens: int | None = 16384) -> dict:
    """`model_cope_gates` of the trained run in `run_dir` over its task's held-out `split`."""
    model, task, cfg = load_held_out(run_dir, split, max_tokens)
    if not hasattr(task, "decode"):
        raise ValueError(f"the task {cfg.task!r} of run {str(run_dir)!r} cannot decode its tokens: the gate analysis "
                         "needs a text task")
    model.eval()
    classes = class_table(task.decode, model.config.vocab_size)  # the built model's (the task sets it)
    result = model_cope_gates(model, task.split(split), classes, max_tokens)
    result["example"]["text"] = task.decode(result["example"]["tokens"])
    result.update(run_dir=str(run_dir), encoding=cfg.model.encoding, encoding_options=cfg.model.encoding_options,
                  task=cfg.task, split=split)
    return result


def plot_cope_gates(results: list[dict], path):
    """Per run and layer, one row of heads: the example window's gates (top) and its attention from position
    alone (bottom), queries down and keys across, newline keys marked in red on the top edge."""
    from poskit.report.figure import save_figure
    from poskit.report.plots import plt

    rows = [(r, i, what) for r in results for i in range(len(r["layers"])) for what in ("gates", "position_attention")]
    heads = max(len(r["example"]["layers"][0]["gates"]) for r in results)
    fig, axes = plt.subplots(len(rows), heads, figsize=(2.6 * heads, 2.5 * len(rows)), squeeze=False)
    for ax_row, (r, i, what) in zip(axes, rows):
        ex = r["example"]
        newline = ex["newline"]
        for h, ax in enumerate(ax_row):
            grid = ex["layers"][i][what]
            if h >= len(grid):
                ax.axis("off")
                continue
            ax.imshow(torch.tensor(grid[h]).numpy(), aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0,
                      interpolation="nearest")
            ax.scatter(newline, [-1.5] * len(newline), marker="+", color="red", s=25, clip_on=False)
            label = "gates" if what == "gates" else "attention from position"
            ax.set_title(f"{r['encoding']} {Path(r['run_dir']).name} L{i} h{h}: {label}", fontsize=7)
            ax.set_xticks([])
            ax.set_yticks([])
    return save_figure(fig, path, dpi=90)


def write_cope_gates(run_dirs: list, out_dir, split: str = "test", max_tokens: int | None = 16384) -> dict:
    """Analyse every run; write out_dir/cope_gates.json (every number behind the plot) and cope_gates.png."""
    if not run_dirs:
        raise ValueError("runs must list at least one run directory")
    out_dir = checked_out_dir(out_dir)
    results = [cope_gate_counts(d, split, max_tokens) for d in run_dirs]
    report = {"split": split, "max_tokens": max_tokens, "runs": results}
    return write_result(out_dir, report, COPE_GATES_JSON, lambda r, p: plot_cope_gates(r["runs"], p), COPE_GATES_PNG)
