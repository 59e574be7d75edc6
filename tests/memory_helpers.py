"""What a call allocates, for the tests that a step reads a KV cache (or another large input) where it lies."""
from torch.profiler import ProfilerActivity, profile


def allocated_bytes(fn) -> int:
    """The bytes torch's allocator handed out while fn ran (every allocation counted, freed or not)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(max(e.self_cpu_memory_usage, 0) for e in prof.key_averages())
