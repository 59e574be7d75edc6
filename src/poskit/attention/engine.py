"""`poskit.attention`: one plan per call, from what the encoding declares and from the inputs, then its runner.

`plan_inputs` is the one dispatch: `attention()` and `cached_attention()` execute the `Plan` it returns, and
`plan()` / `route()` report it for the same arguments, so what is reported is what runs. The paths:

"reference":          materialised logits (attention/reference.py), every encoding, any dtype.
"sdpa":               F.scaled_dot_product_attention on encoded q/k (none, the rope family, pope) or with the
                      encoding's bias as an additive float mask (alibi, relative); traced by torch.compile.
"blocked":            the exact CPU path in query blocks (attention/blocked.py) where the kernel does not serve a
                      call: q/k wider than v (qk_width > 1, PoPE) up to BLOCKED_MAX_KEYS keys or a few queries,
                      and a bias of positions alone (ALiBi) generated block by block instead of a T x T float mask.
"blocked-bias":       a bias that reads q or trains (relative), per query block on CPU (attention/blocked_bias.py).
"blocked-contextual": a contextual encoding whose fused kernel has a blocked CPU counterpart (cope) on CPU
                      (attention/blocked_cope.py), where the compiled kernel does not serve it (gates from the
                      values or separate gate keys, the kernel off).
"cpu-flash":          the compiled CPU kernel (attention/cpu_flash.py), the default on CPU (fp32, bf16) for q/k wider
                      than v (PoPE), for contextual positions with gates from the keys (CoPE, cope-alibi) and
                      for a bias the encoding declares for the kernel (`kernel_bias`:
                      encodings/kernel_bias.py; ALiBi, T5, KERPLE, dynamic, FIRE below its threshold, relative),
                      with causal, key padding, grouped kv heads and decode; for equal-width q/k (the rope
                      family) where this machine's calibration measured it faster than SDPA; unless
                      POSKIT_CPU_KERNEL=0 or it cannot be built (then the blocked paths below, as before).
"triton":             the fused kernel an encoding declares (`fused_kernel`: pope, cope) on CUDA tensors (or CPU
                      tensors under the Triton interpreter).
"magnitude-decode":   a KV cache of key magnitudes (cache_form "magnitude", PoPE): attention/pope_decode.py.

backend="auto" takes triton for encodings with a fused kernel on CUDA when triton is importable (for full
sequences only where the encoding declares the kernel faster there, `fused_kernel_for_full_sequences`: PoPE's is
not), the blocked contextual path for contextual encodings on CPU, else the sdpa backend where it serves the
encoding, else the reference; "reference", "sdpa" and "triton" ask for a backend, inside which the plan picks the path.

Every choice reads the encoding's declared capabilities (`kind`, `qk_width`, `cache_form`, `fused_kernel`,
`fused_kernel_for_full_sequences`, `bias_reads_q`, `position_coords`: encodings/base.py; `kernel_bias`: encodings/kernel_bias.py), never its name.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import torch

from ..encodings.base import PositionalEncoding, encoding_class, registered_names
from ..encodings.registration import warn_if_untrained
from . import cpu_flash, runners, sdpa
from .inputs import AttentionInputs, prepare, refuse_renamed
from .padding import real_token_mask

BACKENDS = ("auto", "reference", "sdpa", "triton")
KEY_FORMS = ("raw", "encoded", "magnitude")  # what the keys handed to the plan hold (a KV cache may encode them)


class Plan(NamedTuple):
    """How one attention call runs: `path` (one of the paths in the module docstring), the `backend` it belongs
    to (after "auto" and any fallback), the `reasons` for both, one line each, and the `runner` that executes it
    (`runner(inputs, enc, gate_keys)`, attention/runners.py)."""

    path: str
    backend: str
    reasons: tuple
    runner: Callable

    def __str__(self) -> str:
        return f"{self.path} (backend {self.backend}): " + "; ".join(self.reasons)


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def is_static_bias(enc: PositionalEncoding) -> bool:
    """A bias of positions alone (ALiBi) without trainable parameters: built once per shape and reused. One that
    reads q (relative PE, even with frozen embeddings) cannot be: a cache keyed by positions would hand a later
    call a stale bias."""
    return (enc.kind == "bias" and not enc.bias_reads_q
            and not any(p.requires_grad for p in enc.parameters()))


def sdpa_serves(enc: PositionalEncoding) -> bool:
    return enc.kind in ("none", "qk", "bias")  # (absolute encodings never get here: `prepare` refuses them)


def triton_serves(enc: PositionalEncoding) -> bool:
    # the kernels compute angles from scalar positions: an axial encoding (position_coords > 0) is routed to
    # the sdpa/blocked paths, which call its encode_q / encode_k
    return enc.fused_kernel in runners.TRITON and enc.position_coords == 0


def _triton_served_names() -> str:
    """The registered encodings with a fused kernel, kernel by kernel: "pope, cope and cope-alibi"."""
    names = [n for kernel in runners.TRITON for n in registered_names() if encoding_class(n).fused_kernel == kernel]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def _choose(enc: PositionalEncoding, q: torch.Tensor, backend: str, keys: str = "raw") -> tuple[str, str]:
    """(the backend a call with `backend` takes, why); ValueError for a backend that cannot serve the call.
    keys: as plan_inputs' ("raw" for a full-sequence call, else the keys of a cache)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        if q.is_cuda and triton_available() and triton_serves(enc):
            if keys != "raw" or enc.fused_kernel_for_full_sequences:
                return "triton", f"auto: CUDA tensors and a fused Triton kernel ({enc.fused_kernel}) for the encoding"
            if sdpa_serves(enc):
                return "sdpa", ("auto: CUDA tensors; the encoding declares SDPA on its transform_qk faster than its "
                                "fused kernel for full sequences (fused_kernel_for_full_sequences=False)")
        if q.device.type == "cpu" and enc.kind == "contextual" and enc.fused_kernel in runners.BLOCKED_CONTEXTUAL:
            return "blocked-contextual", "auto: a contextual encoding on CPU with an exact blocked CPU counterpart"
        if sdpa_serves(enc):
            return "sdpa", f"auto: the sdpa backend serves an encoding of kind {enc.kind!r}"
        return "reference", f"auto: no fast path serves an encoding of kind {enc.kind!r} here"
    if backend == "sdpa" and not sdpa_serves(enc):
        raise ValueError(f"backend='sdpa' cannot serve the {enc.kind} encoding {enc.name!r}; use 'reference' or 'triton'")
    if backend == "triton":
        if enc.fused_kernel in runners.TRITON and enc.position_coords:
            raise ValueError(f"backend='triton' takes scalar positions only; the encoding {enc.name!r} has axial_dims "
                             f"({enc.position_coords} coordinates per position): use backend='auto' or 'sdpa'")
        if not triton_serves(enc):
            raise ValueError(f"backend='triton' serves only {_triton_served_names()}, got {enc.name!r}")
        if not triton_available():
            raise ValueError("backend='triton' needs the triton package (pip install 'poskit[triton]')")
        if not q.is_cuda:
            # triton's own reading of TRITON_INTERPRET (so "0" means off, "true" on), not mere presence
            from triton import knobs

            if not knobs.runtime.interpret:
                raise ValueError(f"backend='triton' needs CUDA tensors, got q on {q.device} (CPU tensors run only "
                                 "under the Triton interpreter: TRITON_INTERPRET=1 before triton is imported)")
    return backend, f"backend={backend!r} asked for"


def choose_backend(enc: PositionalEncoding, q: torch.Tensor, backend: str) -> str:
    """The backend a call takes: "reference", "sdpa", "triton" or "blocked-contextual" (the first step of the plan)."""
    return _choose(enc, q, backend)[0]


def plan_inputs(inp: AttentionInputs, enc: PositionalEncoding, backend: str = "auto", keys: str = "raw") -> Plan:
    """The one dispatch: the Plan for validated inputs (`prepare`). keys: what `inp.k` holds, "raw" (every call
    of attention()) or, for a KV cache that stores them so, "encoded" (encode_k output) or "magnitude"."""
    chosen, why = _choose(enc, inp.q, backend, keys)
    reasons = (why,)
    if not inp.has_pairs:
        return Plan("reference", "reference", reasons + (
            "no query or no key: empty rows, or rows of zeros (no visible key), on every path",), runners.run_reference)
    if keys == "magnitude":
        # (these runners also take the cache layer, to which they append the new magnitudes first)
        if chosen == "triton":
            return Plan("triton", chosen, reasons + ("cached key magnitudes fed to the fused kernel",),
                        runners.run_magnitude_triton)
        return Plan("magnitude-decode", chosen, reasons + (
            "cached key magnitudes (cache_form 'magnitude'): attention/pope_decode.py",), runners.run_magnitude_decode)
    if keys == "encoded":
        if inp.q.device.type == "cpu" and cpu_flash.serves_encoded_keys(inp, enc):
            return Plan("cpu-flash", chosen, reasons + (
                "cached encoded keys, q/k as wide as v, on CPU: the compiled kernel (measured faster than SDPA on "
                "this machine)",), runners.run_cpu_flash_encoded_keys)
        if sdpa.use_blocked(inp, enc):
            return Plan("blocked", chosen, reasons + (
                f"cached encoded keys {enc.qk_width}x wider than v on CPU",), runners.run_blocked_encoded_keys)
        return Plan("sdpa", chosen, reasons + ("cached encoded keys: the queries encoded alone",),
                    runners.run_sdpa_encoded_keys)
    if inp.attn_mask is not None and chosen in ("triton", "blocked-contextual"):  # key padding only
        if backend == "triton":
            raise ValueError("backend='triton' serves attn_mask only when it varies along the keys alone (a key "
                             "padding mask, shape (B, 1, 1, Tk)); use backend='auto' for a general mask")
        chosen = "sdpa" if sdpa_serves(enc) else "reference"  # the paths that are exact with a general mask
        reasons += (f"a general attn_mask (not a key padding mask): the {chosen} backend is exact with it",)
    if chosen == "blocked-contextual" and cpu_flash.serves_contextual(inp, enc):
        return Plan("cpu-flash", chosen, reasons + ("gates from the keys on CPU: the compiled kernel",),
                    runners.run_cpu_flash_contextual)
    if chosen == "blocked-contextual" and torch.compiler.is_compiling():
        # the blocked path plans its blocks from tensor values, which torch.compile cannot trace
        return Plan("reference", "reference", reasons + (
            "traced by torch.compile: the materialised formula (the blocked path reads tensor values)",),
            runners.run_reference)
    if chosen == "sdpa":
        return _plan_sdpa(inp, enc, reasons)
    runner = {"reference": runners.run_reference, "triton": runners.run_triton,
              "blocked-contextual": runners.run_blocked_contextual}[chosen]
    return Plan(chosen, chosen, reasons, runner)


def _plan_sdpa(inp: AttentionInputs, enc: PositionalEncoding, reasons: tuple) -> Plan:
    """The path inside the sdpa backend, for raw keys."""
    def sdpa_plan(path, why, runner):
        return Plan(path, "sdpa", reasons + (why,), runner)

    if torch.compiler.is_compiling():  # no data-dependent path choice: traced.py says why
        return sdpa_plan("sdpa", "traced by torch.compile: one SDPA call, no choice that reads tensor values",
                         runners.run_traced_sdpa)
    cpu = inp.q.device.type == "cpu"
    served = cpu_flash.serves(inp, enc) if cpu and enc.kind in ("qk", "bias") else None
    if served is not None:
        what = (f"q/k {enc.qk_width}x wider than v" if served is cpu_flash.QK else
                "q/k as wide as v (measured faster than SDPA on this machine)" if served == cpu_flash.QK_EQUAL else
                f"a bias declared as a {served.form.replace('_', ' ')}, computed per tile from the positions")
        return sdpa_plan("cpu-flash", f"{what} on CPU: the compiled kernel", functools.partial(
            runners.run_cpu_flash, served=served))
    if enc.kind == "qk":
        if sdpa.use_blocked(inp, enc):
            return sdpa_plan("blocked", f"q/k {enc.qk_width}x wider than v on CPU, at most {sdpa.BLOCKED_MAX_KEYS} "
                             "keys or a few queries", runners.run_blocked_qk)
        return sdpa_plan("sdpa", "q and k encoded by transform_qk", runners.run_sdpa_qk)
    if enc.kind == "bias":
        static = is_static_bias(enc)
        if cpu and inp.attn_mask is None:  # (a general attn_mask goes to SDPA with the mask merged into the bias)
            if static:
                return sdpa_plan("blocked", "a bias of positions alone on CPU, generated per query block",
                                 runners.run_blocked_static_bias)
            return sdpa_plan("blocked-bias", "a bias that reads q or trains, on CPU: it and its gradient per "
                             "query block, never T x T", runners.run_blocked_bias)
        if static:
            return sdpa_plan("sdpa", "a bias of positions alone, built once per shape and reused, as a float mask",
                             runners.run_sdpa_static_bias)
        return sdpa_plan("sdpa", "the encoding's bias as a float mask", runners.run_sdpa_bias)
    return sdpa_plan("sdpa", f"kind {enc.kind!r}: q and k as given", runners.run_sdpa_plain)


def plan(q, k, v, enc, *, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False, scale=None,
         enable_gqa: bool = False, q_positions=None, k_positions=None, gate_keys=None, backend: str = "auto",
         **removed) -> Plan:
    """The `Plan` that `attention(q, k, v, enc, ...)` with the same arguments executes: its path, its backend,
    why, and its runner. Validates the arguments as attention() does (and raises the same errors).
    `print(plan(...))` reads, e.g., "blocked (backend sdpa): auto: ...; q/k 2x wider than v on CPU, ..."."""
    refuse_renamed("plan", removed)
    inp = _prepare_call(q, k, v, enc, attn_mask, dropout_p, is_causal, scale, enable_gqa, q_positions, k_positions)
    return plan_inputs(inp, enc, backend)


def route(enc: PositionalEncoding, q: torch.Tensor, k: torch.Tensor | None = None, backend: str = "auto", *,
          v=None, **keywords) -> str:
    """The path `attention(q, k, v, enc, backend=backend, **keywords)` takes: `plan(...).path`, one of
    "reference", "sdpa", "blocked", "blocked-bias", "blocked-contextual", "cpu-flash" or "triton" (the module
    docstring says which serves what). k defaults to q; v (whose values no choice reads) to k. The keywords are
    attention()'s, with its defaults (e.g. enable_gqa=True for fewer kv heads than query heads)."""
    k = q if k is None else k
    return plan(q, k, k if v is None else v, enc, backend=backend, **keywords).path


def _check_dropout(dropout_p) -> None:
    # accepted for drop-in compatibility with SDPA calls that spell out dropout_p=0.0; attention-weight dropout
    # is not implemented by any poskit path
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0.0 (poskit.attention has no attention-weight dropout), got {dropout_p!r}")


def attention(q, k, v, enc, *, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False, scale=None,
              enable_gqa: bool = False, q_positions=None, k_positions=None, gate_keys=None, backend: str = "auto",
              **removed) -> torch.Tensor:
    """(B, H, Tq, Dv) == softmax(attention_scores(q, k, enc, ...)) @ v, by the fastest exact path.

    The keywords are those of `F.scaled_dot_product_attention`, with the same meanings and defaults, plus
    the encoding `enc` and poskit's own `q_positions`, `k_positions`, `gate_keys`, `backend`:

    attn_mask: bool (True = attend) or float of q's dtype (added to the logits), broadcastable to
        (B, H, Tq, Tk). May be combined with is_causal (both apply).
    is_causal: causal *by position*: key s is visible to query t iff k_positions[s] <= q_positions[t]. With
        the default positions (arange) that is SDPA's top-left aligned mask, for any Tq and Tk; to attend a
        few new queries to a longer cache (bottom-right), give their positions, e.g.
        q_positions=torch.arange(Tk - Tq, Tk).
    scale: default 1/sqrt(head_dim) of q (before any encoding widens it).
    enable_gqa: False requires H == H_kv, as SDPA; True lets H_kv divide H (query head h reads kv head
        h // (H // H_kv)).
    dropout_p: only 0.0 (no attention-weight dropout).

    A query that sees no key outputs zeros on every path (CPU SDPA of torch 2.13 also gives 0 there).
    See `poskit.attention_scores` for the other conventions (shapes, positions).
    """
    refuse_renamed("attention", removed)
    inp = _prepare_call(q, k, v, enc, attn_mask, dropout_p, is_causal, scale, enable_gqa, q_positions, k_positions)
    planned = plan_inputs(inp, enc, backend)
    warn_if_untrained(enc)
    return planned.runner(inp, enc, gate_keys)


def attention_with_key_mask(q, k, v, enc, *, key_mask=None, attn_mask=None, is_causal: bool = False, scale=None,
                            enable_gqa: bool = False, q_positions=None, k_positions=None, gate_keys=None,
                            backend: str = "auto", keys_finite: bool = False) -> torch.Tensor:
    """`attention()` for a caller that knows which keys are real as a (B, Tk) bool mask, True = a real key (the
    form a model's batch carries, models/batch.py): the mask reaches the plan as it is, instead of being widened
    to attn_mask=key_mask[:, None, None, :] and split back. attn_mask: as attention()'s, for any other
    visibility (both apply). keys_finite: k is known to hold no NaN or infinity (a KV cache's keys: it checks each
    append), so the fast paths need not read it to check. The other keywords and the result are attention()'s,
    bit for bit."""
    inp = _prepare_call(q, k, v, enc, attn_mask, 0.0, is_causal, scale, enable_gqa, q_positions, k_positions,
                        key_mask, keys_finite)
    planned = plan_inputs(inp, enc, backend)
    warn_if_untrained(enc)
    return planned.runner(inp, enc, gate_keys)


# `import poskit.attention.engine as engine` looks `engine` up on the object poskit.attention (this function)
# and, not finding it there, takes sys.modules[f"{that object's __name__}.engine"]: named after the package
# it stands for, the function lets that spelling reach the package's modules as it would on the package.
attention.__name__ = "poskit.attention"


def _prepare_call(q, k, v, enc, attn_mask, dropout_p, is_causal, scale, enable_gqa, q_positions, k_positions,
                  key_mask=None, keys_finite: bool = False):
    """The validated inputs of one attention() call (shared by attention, attention_with_key_mask and plan)."""
    _check_dropout(dropout_p)
    if v is None:
        raise ValueError("v must be a tensor (B, H_kv, Tk, Dv), got None")
    return prepare(q, k, v, enc, causal=is_causal, q_positions=q_positions, k_positions=k_positions, scale=scale,
                   attn_mask=attn_mask, enable_gqa=enable_gqa, key_padding_mask=key_mask, keys_finite=keys_finite)


def cached_key_form(enc: PositionalEncoding, backend: str) -> str:
    """What a KV cache stores for the keys of `enc` when a call takes `backend` (choose_backend): "magnitude"
    (cache_form "magnitude", any fast backend), "encoded" (cache_form "encoded", the sdpa backend) or "raw"."""
    if enc.cache_form == "magnitude" and backend != "reference":
        return "magnitude"
    if enc.cache_form == "encoded" and backend == "sdpa":
        return "encoded"
    return "raw"


def cached_attention(q, k, v, enc, cache, layer_idx: int, q_positions, *, attention_mask=None, gate_keys=None,
                     backend: str = "auto", **removed):
    """Append the new keys/values at `q_positions` to layer `layer_idx` of `cache`, then attend the new
    queries to everything cached, causally by position. Equals the corresponding rows of a full forward.

    q: (B, H, Tn, D); k, v: (B, H_kv, Tn, .) for the same Tn new tokens (H_kv dividing H: grouped-query
    attention is implicit here); q_positions (Tn,) or (B, Tn), required
    (e.g. `torch.arange(cache.next_position(), cache.next_position() + Tn)`): a default of arange(Tn) would
    silently put a later token at position 0.
    attention_mask: (B, Tn) bool or 0/1 ints, True/1 = real token, 0 = padding (Hugging Face's convention),
    for the new tokens; stored in the cache beside their keys, so that no later query attends to a pad, and
    for CoPE pads count in no gate sum. Give pads positions that keep each row's real tokens at 0, 1, 2, ...
    (`padded_positions` in poskit.attention.padding).
    The encoding's `cache_form` says what is cached: rope (static frequencies) caches the rotated key and pope
    the key magnitude softplus(k) (attention/pope_decode.py), so a decode step encodes only the new token;
    every other encoding caches raw keys (CoPE recomputes its gates per query, dynamic NTK re-rotates).

    Everything is validated before the cache is touched (shapes, dtypes and widths against the cached ones,
    gate keys, the positions the encoding accepts over the whole cache): a refused step leaves it unchanged, and
    a step that fails once its tokens are appended (in the attention itself) takes them back out.
    """
    refuse_renamed("cached_attention", removed)
    if v is None:
        raise ValueError("v must be a tensor (B, H_kv, Tn, Dv), got None")
    if q_positions is None:
        raise ValueError("q_positions must be given to cached_attention: the (Tn,) or (B, Tn) positions of the new "
                         "tokens, e.g. torch.arange(cache.next_position(), cache.next_position() + Tn)")
    real = None if attention_mask is None else real_token_mask(attention_mask, q.shape[0], q.shape[2], q.device)
    inp = prepare(q, k, v, enc, causal=True, q_positions=q_positions, k_positions=q_positions, scale=None,
                  key_padding_mask=real)
    form = cached_key_form(enc, choose_backend(enc, q, backend))
    if not inp.has_pairs:  # no new token: nothing to append, and no query to answer
        return plan_inputs(inp, enc, backend).runner(inp, enc, gate_keys)
    layer = cache.layer(layer_idx)
    enc.gate_source(inp.k, inp.v, gate_keys)  # refuses gate keys the encoding does not take, or lacks
    with layer.undone_on_error():  # an attention that fails after the append takes the new tokens back out
        return _append_and_attend(q, k, v, enc, inp, layer, form, real, gate_keys, backend)


def _append_and_attend(q, k, v, enc, inp: AttentionInputs, layer, form: str, real, gate_keys, backend: str):
    if form == "magnitude":
        _check_positions_over_cache(enc, inp, layer)
        warn_if_untrained(enc)
        # the runner appends the magnitudes (its append validates first), then attends
        return plan_inputs(inp, enc, backend, keys="magnitude").runner(inp, enc, gate_keys, layer)
    encoded = form == "encoded"
    keys = enc.encode_k(k, inp.k_positions) if encoded else k
    layer.check_append(keys, v, inp.k_positions, gate_keys=gate_keys, encoded=encoded, key_mask=real)
    _check_positions_over_cache(enc, inp, layer)
    warn_if_untrained(enc)
    layer = layer._write(keys, v, inp.k_positions, gate_keys, encoded, None, real)  # checked above
    # the new tokens were validated above and the cache's own tensors when they were appended: the whole layer's
    # inputs are assembled as they are, not validated again (a second prepare() was 8-20 % of a small decode step)
    full = AttentionInputs(q, layer.keys, layer.values, inp.q_positions, layer.positions, inp.scale, True,
                           layer.key_mask, False, keys_finite=layer.keys_finite)
    # the whole layer's gate keys (CoPE's; an encoded-key encoding takes none, gate_source refused them above)
    return plan_inputs(full, enc, backend, keys=form).runner(full, enc, layer.gate_keys)


def _check_positions_over_cache(enc: PositionalEncoding, inp: AttentionInputs, layer) -> None:
    """Raise ValueError, before appending, for key positions the encoding cannot represent over the whole
    cache once the new tokens are added (e.g. CoPE decoding a position earlier than a cached one)."""
    if type(enc).check_positions is PositionalEncoding.check_positions:
        return  # accepts every position: skip building the key positions and the visibility mask
    kp = inp.k_positions
    if layer.length:
        cached = layer.positions
        if kp.shape[0] != cached.shape[0] and 1 not in (kp.shape[0], cached.shape[0]):
            raise ValueError(f"q_positions must have batch 1 or {cached.shape[0]} to extend the cache, got "
                             f"{tuple(kp.shape)}")
        b = max(cached.shape[0], kp.shape[0])
        kp = torch.cat((cached.expand(b, -1), kp.expand(b, -1)), -1)
    visible = kp[:, None, None, :] <= inp.q_positions[:, None, :, None]
    real = _key_mask_after_append(layer, inp)
    if real is not None:
        visible = visible & real[:, None, None, :]
    enc.check_positions(inp.q_positions, kp, visible)


def _key_mask_after_append(layer, inp: AttentionInputs):
    """(B, L + Tn) bool: the layer's key mask once the new tokens are appended, or None when all are real."""
    new, cached = inp.key_padding_mask, layer.key_mask
    if new is None and cached is None:
        return None
    B, Tn = inp.k.shape[0], inp.k.shape[2]
    if new is None:
        new = torch.ones(B, Tn, dtype=torch.bool, device=inp.k.device)
    if cached is None:
        cached = torch.ones(B, layer.length, dtype=torch.bool, device=inp.k.device)
    return torch.cat((cached, new), -1)
