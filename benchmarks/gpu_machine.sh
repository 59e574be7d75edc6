#!/usr/bin/env bash
# Everything poskit measures on a machine with a CUDA GPU, in one command (such machines are lent by the hour):
#   1. the GPU's attention table: poskit's default GPU paths and the fused Triton PoPE and CoPE kernels against
#      RoPE + SDPA's flash kernel at the same shapes, forward and forward + backward, and decode with room; then
#      the host's time per call at a tiny shape (benchmarks/call_overhead.py);
#   2. the tests of the Triton kernels, run on the GPU (elsewhere they run under the Triton interpreter);
#   3. the machine's own CPU as a second CPU family, on 2 pinned cores like the development machine: the default
#      CPU paths at the speed goals' shapes, decode at 8k keys (with 8 and with 2 kv heads, and the steps without
#      the kernel, a generation's growing cache, and the kernel's decode form against its tiles), the demo LM's
#      training step and PoPE's q/k transform at its shape.
# The GPU table and tests run one after the other (the tests would disturb the timings); the CPU runs go beside
# them, each on its own pair of cores. Each part has a time limit, so one that hangs cannot take the others with it.
#
#     OUT=some/dir bash benchmarks/gpu_machine.sh
#     OUT=some/dir PARTS="gpu gpu-tests" GPU_DTYPES=bf16,fp32 bash benchmarks/gpu_machine.sh   # some parts only
#
# The GPU table is bf16 unless GPU_DTYPES says otherwise: in fp32 PoPE's Triton kernel (full-precision dots) is
# slow enough that the table does not end inside its time limit. --with-triton adds the fused kernels' rows where
# `auto` takes another path (PoPE's full sequences go to SDPA on CUDA), so the kernels are timed either way.
#
# PARTS: any of gpu (the GPU table), gpu-tests, cpu (the CPU tables and the kernel's tests); default all.
#
# Writes OUT/<part>/benchmark.json (benchmark documents: copied to docs/results/bench-<what>-<machine>/ they
# become committed evidence that `poskit report` renders), OUT/cpu-calibration.json (the kernel's calibration
# on this CPU, when the cpu part runs) and OUT/logs.tar.gz (each part's log and env.txt: GPU, CPU, compiler,
# versions), eight files at most, as a lent machine returns. POSKIT_CODE_COMMIT names the commit when the
# checkout travels without its .git.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the directory the results go to}"
mkdir -p "$OUT/logs"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOGS="$OUT/logs"
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }

has() { case " ${PARTS:-gpu gpu-tests cpu} " in *" $1 "*) return 0;; esac; return 1; }

# pin a command to two cores when the machine has them (and taskset exists), else run it as it is
pinned() {
    local cores=$1; shift
    if command -v taskset >/dev/null && [ "$(nproc)" -ge 16 ]; then taskset -c "$cores" "$@"; else "$@"; fi
}

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
    lscpu 2>&1 | grep -E '^(Model name|Vendor ID|CPU\(s\)|Thread|Core|Socket|L2|L3|Flags)'
    "$PY" -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "triton", triton.__version__, "gpu", torch.cuda.get_device_name())' 2>&1
    ${CXX:-c++} --version 2>&1 | head -1
} > "$LOGS/env.txt"
cat "$LOGS/env.txt"

if has cpu; then
    stamp "building the CPU kernel"
    pinned 8-15 "$PY" -m poskit.cli kernel build > "$LOGS/kernel-build.log" 2>&1
    stamp "kernel build rc=$?"; tail -3 "$LOGS/kernel-build.log"
    # the calibration `kernel build` wrote (this CPU's routing decisions and their timings), kept as evidence
    calibration=$("$PY" -c 'from poskit.attention import kernel_build, kernel_calibration as kc
print(kc.path_for(kernel_build.cached_library()))' 2>/dev/null) && cp "$calibration" "$OUT/cpu-calibration.json"
fi

cpu_attention() {
    pinned 8,9 timeout 400 "$PY" benchmarks/attention.py --shapes 1x4096,8x1024 --dtypes fp32,bf16 --modes fwdbwd \
        --encodings rope,pope,alibi,cope,relative-capped --skip-peers --skip-decode --threads 2 --repeats 5 \
        --json "$OUT/cpu-attention/benchmark.json" > "$LOGS/cpu-attention.log" 2>&1
    stamp "cpu attention rc=$?"
}
cpu_decode() {  # with the kernel-off rows (a machine without a compiler); then 2 kv heads for 8 query heads
    pinned 10,11 timeout 220 "$PY" benchmarks/attention.py --skip-grid --decode-lengths 8192 --decode-dtypes fp32,bf16 \
        --without-kernel --threads 2 --repeats 3 --json "$OUT/cpu-decode/benchmark.json" > "$LOGS/cpu-decode.log" 2>&1
    stamp "cpu decode rc=$?"
    pinned 10,11 timeout 220 "$PY" benchmarks/attention.py --skip-grid --decode-lengths 8192 --decode-dtypes fp32,bf16 \
        --decode-kv-heads 2 --without-kernel --threads 2 --repeats 3 --json "$OUT/cpu-decode-gqa/benchmark.json" \
        > "$LOGS/cpu-decode-gqa.log" 2>&1
    stamp "cpu decode with grouped kv heads rc=$?"
    # a generation's growing cache: the process's growth and the first steps' cost with the brgemm code generated
    # per shape (AMX configures tiles per shape too; the log only)
    for args in "8 8 1024 rope" "16 1 1024 pope"; do
        # shellcheck disable=SC2086
        pinned 10,11 timeout 120 "$PY" docs/results/brgemm-kernel-memory-amd-epyc/growth.py $args \
            >> "$LOGS/cpu-decode-growth.log" 2>&1
    done
    stamp "cpu decode growth rc=$?"
    # the kernel's decode form against its tiles in one process (the log only; the calibration holds the rows from
    # which this CPU takes the tiles)
    pinned 10,11 timeout 120 "$PY" docs/results/flash-decode-form-ab-amd-epyc/ab.py \
        > "$LOGS/cpu-decode-form-ab.log" 2>&1
    stamp "cpu decode form against tiles rc=$?"
}
cpu_train_step() {
    pinned 12,13 timeout 400 "$PY" benchmarks/train_step.py --encodings rope,pope,alibi,cope,relative-capped \
        --threads 2 --rounds 7 --json "$OUT/cpu-train-step/benchmark.json" > "$LOGS/cpu-train-step.log" 2>&1
    stamp "cpu train step rc=$?"
    # PoPE's q/k transform at the step's query shape (the log only: the returned files are at their limit of eight)
    pinned 12,13 timeout 120 "$PY" benchmarks/polar_transform.py --shapes 32x4x64x32 --dtypes fp32,bf16 --rounds 9 \
        > "$LOGS/cpu-polar-transform.log" 2>&1
    stamp "cpu polar transform rc=$?"
}
gpu() {
    pinned 0-7 timeout 240 "$PY" benchmarks/attention.py --device cuda --shapes 1x4096,8x1024,1x16384 \
        --dtypes "${GPU_DTYPES:-bf16}" --modes fwd,fwdbwd --encodings pope,cope,alibi,relative-capped --with-triton \
        --repeats 10 --warmup 2 --decode-lengths 8192 --decode-dtypes bf16 --json "$OUT/gpu-attention/benchmark.json" \
        > "$LOGS/gpu-attention.log" 2>&1
    stamp "gpu attention rc=$?"
    # the host's time per call where the GPU's arithmetic is negligible: what small and decode calls wait for
    pinned 0-7 timeout 120 "$PY" benchmarks/call_overhead.py --device cuda \
        --json "$OUT/gpu-call-overhead/benchmark.json" > "$LOGS/gpu-call-overhead.log" 2>&1
    stamp "gpu call overhead rc=$?"
}
gpu_tests() {  # compiling the kernels for the GPU takes seconds per test: spread over the GPU part's cores
    # (pytest-xdist), never over 8-15, where the CPU tables may still be measuring
    pinned 0-7 timeout 240 "$PY" -m pytest -q -p no:cacheprovider -n 8 --timeout 180 -rfE \
        tests/test_triton_pope.py tests/test_triton_cope.py > "$LOGS/gpu-tests.log" 2>&1
    stamp "gpu tests rc=$?"
}

cpu_tests() {  # the kernel against the float64 reference, built for this CPU's instruction set
    pinned 14,15 timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests/test_cpu_flash.py \
        tests/test_pope_decode.py tests/test_polar_pair.py -k "not triton" > "$LOGS/cpu-kernel-tests.log" 2>&1
    stamp "cpu kernel tests rc=$?"
}

if has cpu; then cpu_attention & cpu_decode & cpu_train_step & cpu_tests & fi
# the tests run after the GPU table, whose timings they would disturb
{ if has gpu; then gpu; fi; if has gpu-tests; then gpu_tests; fi; } &
wait
stamp "all parts ended"
for f in "$LOGS"/*.log; do echo "== $f"; tail -25 "$f"; done
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$LOGS"
