#!/usr/bin/env bash
# test/test_sanitizers.sh — the CPU code under AddressSanitizer (with leak
# checking) and UndefinedBehaviorSanitizer, built by `make asan` (gcc, no
# MPI, build-asan/): every C unit test; a short single-rank training run
# that validates, samples nothing, checkpoints, skips an injected NaN step
# and resumes (bit-identical losses under the sanitizers too); the same
# build refusing to start as one of several launched processes; and the
# replay of the fuzzing corpus (seeds and regression inputs, test/fuzz/).
# Any sanitizer report fails the case.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
if ! make -s asan >"$TMP/build.txt" 2>&1; then
    bad "make asan"; tail -20 "$TMP/build.txt"; finish test_sanitizers; exit 1
fi
A=build-asan
# max_allocation_size_mb: an allocation above 2 GB is a report, as under libFuzzer (a parser that
# sizes a buffer from a header before checking the file must not pass by luck of lazy memory)
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:check_initialization_order=1:max_allocation_size_mb=2048
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
clean() { ! grep -qE 'runtime error:|ERROR: (Address|Leak)Sanitizer|SUMMARY: (Address|UndefinedBehavior)Sanitizer' "$1"; }
# sanitized NAME CMD...: runs CMD, passes when it exits 0 with no sanitizer report
sanitized() {
    local name="$1"; shift
    local out="$TMP/$(echo "$name" | tr -c 'a-zA-Z0-9_' '_').out" t0=$(date +%s)
    "$@" >"$out" 2>&1; local rc=$?
    if [ $rc -eq 0 ] && clean "$out"; then
        ok "$name ($(( $(date +%s) - t0 )) s): $(grep -E 'passed|replayed|done:' "$out" | tail -1)"
    else
        bad "$name: exit $rc"; grep -m3 -E -A8 'runtime error:|ERROR: |SUMMARY' "$out" | head -30 | sed 's/^/      /'; tail -3 "$out" | sed 's/^/      /'
    fi
}
for t in $A/test_*; do
    case "$t" in *.d|*.o|*test_kernels_gpu) continue;; esac
    sanitized "$(basename "$t") under ASan+UBSan" "$t"
done
# a short training run with validation, a checkpoint, a skipped NaN step and a resume
$A/make_shard "$TMP/train.bin" 20000 1 >/dev/null
RUN="--input_bin $TMP/train.bin --input_val_bin $TMP/train.bin --val_loss_every 2 --val_max_steps 1 --model d2
  --n_embd 32 --n_head 2 --max_seq_len 32 --batch_size 2 --sequence_length 16 --num_iterations 4
  --checkpoint_every 2 --inject_nan_at_step 3 --seed 3 --shuffle 1"
sanitized "training, 4 steps: validation, checkpoints, a skipped NaN step" $A/train_gpt2 $RUN --output_dir "$TMP/run"
mkdir -p "$TMP/res" && cp -r "$TMP/run/ckpt_00000002" "$TMP/run/log.jsonl" "$TMP/res/"
sanitized "training resumed from the step-2 checkpoint" $A/train_gpt2 $RUN --output_dir "$TMP/res" --resume
check "the resumed run's losses equal the first run's (3 finite steps)" \
    eval 'cmp -s <(losses "$TMP/run") <(losses "$TMP/res") && [ "$(losses "$TMP/res" | wc -l)" = 3 ]'
# this build has no MPI: started by a launcher as one of several processes (each would train alone
# on the whole batch), it refuses with one error line
OMPI_COMM_WORLD_SIZE=2 $A/train_gpt2 $RUN --output_dir "$TMP/mpi" >"$TMP/nompi.out" 2>&1; rc=$?
check "built without MPI, launched as one of 2 processes: exit 1 and one error line (exit $rc)" \
    eval '[ $rc -eq 1 ] && grep -q "^error: the launcher started 2 processes (OMPI_COMM_WORLD_SIZE=2) but this binary was built without MPI" "$TMP/nompi.out" && clean "$TMP/nompi.out" && [ ! -e "$TMP/mpi/log.jsonl" ]'
for h in shard model tokenizer checkpoint; do
    sanitized "fuzz corpus replay: $h ($(ls test/fuzz/$h | wc -l) inputs)" $A/fuzz_replay_$h test/fuzz/$h
done
finish test_sanitizers
