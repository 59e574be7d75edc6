import os

import pytest
import torch  # torch does not import triton, so TRITON_INTERPRET can still be decided below

from thread_helpers import single_thread


def _cuda_present() -> bool:
    # NVML-based check: answers without cuInit in the pytest process, so children that tests fork
    # (DataLoader workers, multiprocessing) can still initialise CUDA themselves
    saved = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        return torch.cuda.is_available()
    finally:
        if saved is None:
            del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = saved


# Triton kernels are tested compiled on CUDA tensors when a GPU is present, otherwise on CPU tensors
# through the interpreter, which must be switched on before triton is first imported (setting it on a
# GPU machine would leave the compiled kernels untested). An explicit TRITON_INTERPRET is kept.
HAS_CUDA = _cuda_present()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
TRITON_DEVICE = "cuda" if HAS_CUDA else "cpu"


BF16_NEEDS_CUDA = pytest.mark.skipif(
    not HAS_CUDA, reason="bf16 is tested on CUDA only: the Triton interpreter's bf16 tl.dot is wrong")


def require_runnable_kernels(interpreted: bool, module: str) -> None:
    """Skip a kernel test module that can run neither on a GPU nor in the interpreter."""
    if not HAS_CUDA and not interpreted:
        pytest.skip(f"no GPU, and {module} was imported before TRITON_INTERPRET=1 was set, so its kernels "
                    "cannot run on CPU", allow_module_level=True)


@pytest.fixture
def triton_device() -> str:
    """The device the Triton kernel tests put their tensors on."""
    return TRITON_DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _no_calibration_from_the_kernel_cache():
    """The suite asserts where the compiled kernel serves; a calibration this machine's user saved beside the
    cached library (`poskit kernel calibrate`) may route forms elsewhere or change its tiles, so the suite reads
    none from the kernel cache. Tests of calibration write theirs elsewhere (tmp_path) and read it as users do.
    Session-wide, so that module-scoped fixtures (a benchmark run once per module) read none either, and by
    POSKIT_KERNEL_CALIBRATION=off for the processes tests start (tests/test_cpu_flash.py turns it on for its own
    calibration tests)."""
    from pathlib import Path

    from poskit.attention import kernel_build
    from poskit.attention import kernel_calibration as kc

    real = kc._decisions_at

    def decisions_at(path: str):
        root = kernel_build.cache_root().resolve()
        return kc.NOTHING_MEASURED if root in Path(path).resolve().parents else real(path)

    decisions_at.cache_clear = real.cache_clear  # kc.write forgets what was read through it
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kc, "_decisions_at", decisions_at)
        patch.setenv(kc.ENV_SWITCH, "off")
        yield


def load_benchmark(script: str):
    """benchmarks/<script>.py as a module (the scripts are not a package), run afresh."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{script}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{script}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_qkv(B=2, H=4, Hkv=2, Tq=7, Tk=7, D=16, Dv=None, dtype=torch.float64, requires_grad=False, gen_seed=0):
    g = torch.Generator().manual_seed(gen_seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=dtype)
    k = torch.randn(B, Hkv, Tk, D, generator=g, dtype=dtype)
    v = torch.randn(B, Hkv, Tk, Dv or D, generator=g, dtype=dtype)
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


# options that make every registered encoding buildable at small sizes
ENCODING_OPTIONS = {
    "rope-linear": dict(factor=2.0),
    "rope-ntk": dict(factor=2.0),
    "rope-dynamic": dict(factor=2.0, original_max_positions=4),
    "rope-yarn": dict(factor=4.0, original_max_positions=8),
    "rope-llama3": dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8),
    # rotary_dim=4: two factors fit every head_dim the tests use; the context (64) stays short of the long factors
    "rope-longrope": dict(rotary_dim=4, short_factor=[1.0, 1.5], long_factor=[2.0, 4.0], factor=4.0, original_max_positions=64),
    "relative": dict(max_distance=64),
    "relative-capped": dict(max_distance=3),
    "learned": dict(max_positions=64),
    "cope": dict(p_max=6, init_std=0.5),
    "pope": dict(delta_init="uniform"),
}


def build(name, head_dim=16, num_heads=4, dim=32, dtype=torch.float64, **extra):
    import poskit

    opts = dict(ENCODING_OPTIONS.get(name, {}), **extra)
    enc = poskit.build_encoding(name, head_dim=head_dim, num_heads=num_heads, dim=dim, **opts)
    return enc.to(dtype)


@pytest.fixture
def one_thread():
    """torch on one thread for the test (tiny matrices: faster, and the same arithmetic in every process)."""
    with single_thread():
        yield
