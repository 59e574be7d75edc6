"""attention/grouped.py: the blocked paths' products with grouped kv heads equal the products against kv heads
repeated per query head (repeat_kv), for any grouping, and read a half-precision cache's spread-out rows in place."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from poskit.attention import grouped
from poskit.attention.inputs import repeat_kv
from memory_helpers import allocated_bytes


def _spread(x: torch.Tensor, room: int) -> torch.Tensor:
    """x (n, c, D) as a view into a buffer with `room` spare rows per matrix (a KV cache's layout)."""
    n, c, D = x.shape
    buffer = torch.full((n, c + room, D), float("nan"), dtype=x.dtype)  # (NaN: a read of the room would show)
    buffer[:, :c] = x
    return buffer[:, :c]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), g=st.sampled_from([1, 2, 4]), r=st.integers(1, 20), c=st.integers(1, 40),
       D=st.integers(1, 9), room=st.integers(0, 5), half=st.booleans(), seed=st.integers(0, 2**16))
def test_grouped_products_equal_the_products_against_repeated_kv_heads(n, g, r, c, D, room, half, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if half else torch.float32
    a, x = (torch.randn(n * g, r, size, generator=gen).to(dtype) for size in (c, D))
    kv = _spread(torch.randn(n, c, D, generator=gen).to(dtype), room)

    def repeated(t):  # (n, c, D) -> (n * g, c, D): kv head m for query rows m * g ... m * g + g - 1
        return repeat_kv(t[None], g)[0]

    tol = dict(atol=1e-5, rtol=1e-5) if not half else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(grouped.per_head(a, kv, g), torch.bmm(a, repeated(kv.contiguous())), **tol)
    q = torch.randn(n * g, r, D, generator=gen).to(dtype)
    keys_t = _spread(torch.randn(n, c, D, generator=gen).to(dtype), room).transpose(1, 2)  # q k^T's operand
    torch.testing.assert_close(grouped.per_head(q, keys_t, g),
                               torch.bmm(q, repeated(keys_t.transpose(1, 2).contiguous()).transpose(1, 2)), **tol)
    summed = torch.bmm(a.transpose(1, 2).double(), x.double()).view(n, g, c, D).sum(1)  # summed over each group
    torch.testing.assert_close(grouped.to_kv_heads(a, x, g).double(), summed, **tol)


def test_a_few_half_precision_rows_read_a_spread_out_operand_in_place():
    kv = _spread(torch.randn(4, 4096, 64).bfloat16(), 512)
    a = torch.randn(4 * 4, 1, 4096).bfloat16()
    outs = []
    allocated = allocated_bytes(lambda: outs.append(grouped.per_head(a, kv, 4)))
    out = outs[0]
    assert allocated < kv.nbytes / 8, allocated  # (torch's bf16 bmm copies kv whole first)
    torch.testing.assert_close(out.float(), torch.bmm(a.float(), repeat_kv(kv.float()[None], 4)[0]), atol=0.05,
                               rtol=0.02)


def test_products_that_record_a_graph_keep_torch_bmm():
    # (torch.mm with out= records no graph, so a backward run with create_graph=True must not take it)
    kv = _spread(torch.randn(2, 30, 8).bfloat16(), 3).requires_grad_(False)
    a = torch.randn(2, 1, 30).bfloat16().requires_grad_()
    out = grouped.bmm_in_place(a, kv)
    assert out.requires_grad and out.grad_fn is not None
    with torch.no_grad():
        torch.testing.assert_close(out, grouped.bmm_in_place(a.detach(), kv))


@pytest.mark.parametrize("shape, strides, packed", [
    ((3, 4, 5), (20, 5, 1), True), ((3, 4, 5), (20, 1, 4), True), ((3, 4, 5), (25, 5, 1), False),
    ((3, 4, 5), (20, 10, 2), False), ((1, 4, 5), (99, 5, 1), True)])
def test_which_operands_torch_takes_without_a_copy(shape, strides, packed):
    x = torch.empty(200).as_strided(shape, strides)
    assert grouped._packed(x) == packed
