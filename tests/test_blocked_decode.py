"""The blocked CPU paths (what serves bias and contextual encodings where the compiled kernel does not: no
compiler, POSKIT_CPU_KERNEL=0) against a KV cache: grouped kv heads and a cache with room to grow are read where
they lie, not copied per decode step."""
import copy

import pytest
import torch

import poskit
from poskit.attention import KVCache, cached_attention
from conftest import ENCODING_OPTIONS
from memory_helpers import allocated_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("label", ["alibi", "t5", "relative-capped", "cope", "cope-alibi"])
def test_a_decode_step_without_the_kernel_reads_grouped_heads_in_place(monkeypatch, label, dtype):
    # (repeat_kv copied the whole cache once per query head of a group at every step: at B=4, H=8, 2 kv heads,
    # 4096 cached keys, fp32, ALiBi's step took 5-7x the time of a step with 8 kv heads and no grouping)
    monkeypatch.setenv("POSKIT_CPU_KERNEL", "0")
    B, H, Hkv, T, D, capacity = 2, 8, 2, 1024, 128, 2048  # (Llama's head width and grouping)
    enc = poskit.build_encoding(label, head_dim=D, num_heads=H, **ENCODING_OPTIONS.get(label, {})).to(dtype)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, T + 2, D, generator=g)
    k, v = (torch.randn(B, Hkv, T + 2, D, generator=g) for _ in range(2))
    cache = KVCache(1, max_length=capacity)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            cached_attention(*(t[:, :, :T].to(dtype) for t in (q, k, v)), enc, cache, 0, torch.arange(T))
            warm, new = ([t[:, :, i:i + 1].to(dtype) for t in (q, k, v)] for i in (T, T + 1))
            cached_attention(*warm, enc, cache, 0, torch.tensor([T]))  # (the first step builds what it keeps)
            assert not cache.layer(0).values.is_contiguous()
            steps = []
            allocated = allocated_bytes(
                lambda: steps.append(cached_attention(*new, enc, cache, 0, torch.tensor([T + 1]))))
    finally:
        torch.set_num_threads(threads)
    # (a copy of the cached keys or values alone is half the cache; what a step needs besides, the logits and
    # probabilities of H query heads in fp32, is several times smaller at these sizes)
    cache_bytes = 2 * k[:, :, :T].to(dtype).nbytes
    assert allocated < cache_bytes / 3, f"{allocated} bytes allocated for a step against {cache_bytes}"
    enc64 = copy.deepcopy(enc).double()
    q, k, v = (t.to(dtype).double() for t in (q, k, v))  # the formula on the inputs the step saw
    want = poskit.attention(q[:, :, T + 1:], k, v, enc64, backend="reference", q_positions=torch.tensor([T + 1]),
                            k_positions=torch.arange(T + 2), is_causal=True, enable_gqa=True)
    # (bf16: the products round the logits to bf16, CoPE's position embeddings here are 0.5 wide)
    atol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(steps[0].double(), want, atol=atol, rtol=0)
