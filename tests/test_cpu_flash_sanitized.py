"""The compiled CPU kernel under AddressSanitizer and UndefinedBehaviorSanitizer: a library built with both
(`-fsanitize=address,undefined`, every report fatal) runs tests/sanitized_kernel_calls.py, every kind of call the
kernel serves, in a subprocess with the sanitizer's runtime preloaded (Python and torch themselves are not
instrumented; the kernel's reads and writes of torch's allocations are). An out-of-bounds read that the results
mask out (a bf16 product's vector running past a packed operand's store) is invisible to every numerical test;
this is where it shows.

Built for this machine's instruction set and, on an AVX-512 machine, for AVX2 as well (the library a CPU without
AVX-512 builds). Slow: each build takes 30-60 s.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_kernel_helpers import require_kernel
from poskit.attention import cpu_flash, kernel_build

pytestmark = pytest.mark.slow

CALLS = Path(__file__).with_name("sanitized_kernel_calls.py")
SANITIZERS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]


def sanitizer_runtime(compiler: str) -> str:
    """The path of the compiler's AddressSanitizer runtime (to preload), or skip where it has none (GCC's
    libasan.so is what this looks for)."""
    found = subprocess.run([compiler, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not os.path.isabs(found) or not os.path.exists(found):
        pytest.skip(f"{compiler} has no AddressSanitizer runtime (libasan.so) here")
    return found


@pytest.mark.parametrize("isa", ["machine", "AVX2"])
def test_every_kind_of_call_runs_clean_under_the_sanitizers(isa, tmp_path):
    require_kernel()
    if sys.platform != "linux":
        pytest.skip("preloading the sanitizer runtime is done the Linux way (LD_PRELOAD)")
    machine = kernel_build.isa_level()
    if isa == "AVX2" and machine != "AVX512":
        pytest.skip(f"the machine's own build is the {machine} one")
    compiler = kernel_build.find_compiler()
    runtime = sanitizer_runtime(compiler)
    library = tmp_path / kernel_build.LIBRARY_NAME
    command = kernel_build.compile_command(compiler, library, isa=None if isa == "machine" else isa,
                                           extra_flags=SANITIZERS)
    built = subprocess.run(command, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]

    env = {**os.environ, "LD_PRELOAD": runtime, "ASAN_OPTIONS": "detect_leaks=0",
           "UBSAN_OPTIONS": "print_stacktrace=1", kernel_build.PREBUILT_ENV: str(library),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(kernel_build.__file__).parents[2]),
                                                       os.environ.get("PYTHONPATH")]))}
    if isa == "AVX2":
        env["ATEN_CPU_CAPABILITY"] = "avx2"  # torch's own dispatch as on such a CPU (no bf16 products then)
    run = subprocess.run([sys.executable, str(CALLS), "200"], capture_output=True, text=True, env=env, timeout=900)
    report = run.stderr[-4000:]
    assert "Sanitizer" not in run.stderr and "runtime error" not in run.stderr, report
    assert run.returncode == 0, report
    # every part ran, the bf16 products among them where this CPU has them
    products = isa == "machine" and cpu_flash.bf16_products_available()
    assert "direct calls: 200" in run.stdout and f"bf16 products: {products}" in run.stdout, run.stdout + report
