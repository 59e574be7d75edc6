"""The cos/sin tables of the rotary encodings: the table and the direct formula agree bit for bit, and tensors
off the CPU never have their positions read on the host (a host read waits for the GPU's queued kernels)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from poskit.encodings.angles import MAX_ROWS, AngleTables

INV_FREQ = 10000.0 ** -(torch.arange(0, 64, 2, dtype=torch.float64) / 64)


@settings(max_examples=40, deadline=None)
@given(positions=st.lists(st.integers(-5, 3 * MAX_ROWS), min_size=1, max_size=30),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]), gain=st.sampled_from([1.0, 1.17]))
def test_the_table_and_the_direct_formula_agree_bit_for_bit(positions, dtype, gain):
    tables = AngleTables(gain)
    p = torch.tensor(positions)
    cos, sin = tables.lookup(p, INV_FREQ, dtype)
    dcos, dsin = tables.lookup(p, INV_FREQ, dtype, cache=False)
    assert cos.dtype == dtype and cos.shape == (len(positions), 32)
    assert torch.equal(cos, dcos) and torch.equal(sin, dsin)


def test_cpu_positions_use_the_table_and_it_grows_to_the_largest_position():
    tables = AngleTables()
    tables.lookup(torch.arange(10), INV_FREQ, torch.float32)
    tables.lookup(torch.tensor([3000]), INV_FREQ, torch.float32)
    (table, _), = tables._tables.values()
    assert table[0].shape == (4096, 32)  # a power of two at least 1024, covering position 3000


def test_positions_off_the_cpu_are_never_read_on_the_host():
    # the meta device has no values: reading one (int(), .item(), torch.equal) raises, as a host sync would
    # wait on a GPU. The angles are computed on the device, and no table is kept for it.
    tables = AngleTables()
    positions = torch.arange(4096, device="meta")[None].expand(2, -1)
    cos, sin = tables.lookup(positions, INV_FREQ.to("meta"), torch.bfloat16)
    assert cos.shape == sin.shape == (2, 4096, 32) and cos.device.type == "meta" and cos.dtype == torch.bfloat16
    assert not tables._tables


@pytest.mark.parametrize("name", ["rope", "pope", "rope-yarn"])
def test_an_encodings_q_and_k_on_an_accelerator_need_no_host_read_of_the_positions(name):
    import poskit

    options = dict(factor=4.0, original_max_positions=1024) if name == "rope-yarn" else {}
    enc = poskit.build_encoding(name, head_dim=64, num_heads=4, **options).to("meta")
    q = torch.empty(2, 4, 128, 64, device="meta")
    positions = torch.arange(128, device="meta")[None]
    q2, k2 = enc.transform_qk(q, q, positions, positions)
    assert q2.device.type == "meta" and q2.shape[:3] == (2, 4, 128)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["rope", "pope", "rope-yarn", "rope-ntk", "xpos"]), T=st.integers(1, 40),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]), seed=st.integers(0, 2**16))
def test_one_lookup_for_q_and_k_gives_what_two_give(name, T, dtype, seed):
    # transform_qk looks the angles up once when q and k share their positions tensor (as prepare() passes
    # them for self-attention); the result is bit for bit that of two separate lookups
    import poskit

    options = dict(factor=4.0, original_max_positions=16) if name in ("rope-yarn",) else (
        dict(factor=4.0) if name == "rope-ntk" else {})
    enc = poskit.build_encoding(name, head_dim=16, num_heads=2, **options).to(dtype)
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, 2, T, 16, generator=g).to(dtype) for _ in range(2))
    positions = torch.arange(7, 7 + T)[None]
    shared = enc.transform_qk(q, k, positions, positions)
    apart = enc.transform_qk(q, k, positions, positions.clone())
    assert all(torch.equal(a, b) for a, b in zip(shared, apart))


@pytest.mark.parametrize("name", ["rope", "pope", "xpos"])
def test_q_and_k_at_the_same_positions_take_one_lookup(name, monkeypatch):
    import poskit

    enc = poskit.build_encoding(name, head_dim=16, num_heads=2)
    calls = []
    lookup = AngleTables.lookup
    monkeypatch.setattr(AngleTables, "lookup", lambda self, *a, **kw: calls.append(1) or lookup(self, *a, **kw))
    q = torch.randn(1, 2, 6, 16)
    positions = torch.arange(6)[None]
    enc.transform_qk(q, q, positions, positions)
    assert len(calls) == 1
    calls.clear()
    enc.transform_qk(q, q, positions, positions.clone())
    assert len(calls) == 2


def test_prepare_gives_q_and_k_one_positions_tensor_where_they_are_the_same():
    import poskit
    from poskit.attention.inputs import prepare

    enc = poskit.build_encoding("rope", head_dim=16, num_heads=2)
    q = torch.randn(1, 2, 5, 16)
    omitted = prepare(q, q, q, enc, causal=True, q_positions=None, k_positions=None, scale=None)
    assert omitted.k_positions is omitted.q_positions and torch.equal(omitted.q_positions, torch.arange(5)[None])
    given_twice = torch.arange(3, 8)
    twice = prepare(q, q, q, enc, causal=True, q_positions=given_twice, k_positions=given_twice, scale=None)
    assert twice.k_positions is twice.q_positions
    apart = prepare(q, q, q, enc, causal=True, q_positions=given_twice, k_positions=given_twice.clone(), scale=None)
    assert apart.k_positions is not apart.q_positions and torch.equal(apart.k_positions, apart.q_positions)
