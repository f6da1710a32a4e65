#!/usr/bin/env bash
# test/run_tests_gpu.sh — the GPU test suite (make test-gpu), for the GPU
# machine. Runs each GPU test binary and prints one summary line counting
# suites. Without a GPU the binaries report "skipped" and pass.
#   BUILD_DIR=dir   where the test binaries are (default build)
#   GPU_BENCH=1     also run the kernel micro-benchmarks (test_kernels_gpu --bench)
set -u
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
passed=0; failed=0; failed_names=""
run_suite() {
    local name="$1"; shift
    echo "==== $name"
    local t0=$(date +%s)
    if "$@"; then passed=$((passed+1)); else failed=$((failed+1)); failed_names="$failed_names $name"; fi
    echo "==== $name took $(( $(date +%s) - t0 )) s"
}
if [ ! -x "$BUILD_DIR/test_kernels_gpu" ]; then
    echo "error: $BUILD_DIR/test_kernels_gpu not found; run make first" >&2
    exit 1
fi
if [ "${GPU_BENCH:-0}" = 1 ]; then
    run_suite test_kernels_gpu "$BUILD_DIR/test_kernels_gpu" --bench
else
    run_suite test_kernels_gpu "$BUILD_DIR/test_kernels_gpu"
fi
# the attention backward's K and V fragments, held in registers over its loop,
# never overwritten inside it (a ptxas hazard: tools/sass_frag_check.py)
CUOBJDUMP=$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")
if [ -x "$CUOBJDUMP" ]; then
    run_suite sass_frag_check bash -c \
        'set -o pipefail; [ -f "$2" ] || { echo "sass_frag_check: $2 not found"; exit 1; }
         "$1" -sass "$2" | python3 tools/sass_frag_check.py attn_bwd_sm90 32' \
        _ "$CUOBJDUMP" "$BUILD_DIR/kernels/cuda/attention_sm90.cu.o"
else
    echo "==== sass_frag_check: not run (no cuobjdump on PATH or in \$CUDA_HOME/bin)"
fi
# the PyTorch fixture on the GPU: fp32 at the CPU tolerances, bf16 loss within 1e-2
run_suite test_fixture_cuda_fp32 "$BUILD_DIR/test_fixture" --device cuda --dtype fp32
run_suite test_fixture_cuda_bf16 "$BUILD_DIR/test_fixture" --device cuda --dtype bf16
# the trainer end to end on the GPU (several ranks sharing it, PyTorch d12 comparison)
for s in test/test_gpu_*.sh; do
    [ -f "$s" ] && run_suite "$(basename "$s" .sh)" bash "$s"
done
# compute-sanitizer: test/test_gpu_sanitizers.sh (run by the loop above)
echo
[ -n "$failed_names" ] && echo "failed suites:$failed_names"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
