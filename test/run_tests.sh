#!/usr/bin/env bash
# test/run_tests.sh — the CPU test suite (make test). Runs every C unit test
# and every shell test, then prints one summary line counting suites.
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
passed=0; failed=0; failed_names=""
run_suite() {
    local name="$1"; shift
    echo "==== $name"
    local t0=$(date +%s)
    if "$@"; then passed=$((passed+1)); else failed=$((failed+1)); failed_names="$failed_names $name"; fi
    echo "==== $name took $(( $(date +%s) - t0 )) s"
}
for t in build/test_*; do
    case "$t" in *.d|*.o) continue;; esac
    name=$(basename "$t")
    [ "$name" = test_kernels_gpu ] && continue
    run_suite "$name" "$t"
done
for s in test/test_*.sh; do
    case "$s" in test/test_gpu_*) continue;; esac   # GPU suites: test/run_tests_gpu.sh
    run_suite "$(basename "$s" .sh)" bash "$s"
done
echo
[ -n "$failed_names" ] && echo "failed suites:$failed_names"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
