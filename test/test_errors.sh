#!/usr/bin/env bash
# test/test_errors.sh — bad input to the trainer: each case must end with a
# non-zero exit, one line "error: ..." naming the file or flag and the
# problem, no crash, and (under mpirun) every rank ending within the timeout.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
build/make_shard "$TMP/good.bin" 5000 1
SMALL="--model d2 --n_embd 32 --n_head 2 --max_seq_len 32 --batch_size 2 --sequence_length 16 --num_iterations 1"
# expect NAME PATTERN NP [args...]: NP=0 runs without mpirun
expect() {
    local name="$1" pat="$2" np="$3"; shift 3
    local out="$TMP/err.txt" rc
    if [ "$np" = 0 ]; then
        timeout 60 ./train_gpt2 "$@" >"$out" 2>&1; rc=$?
    else
        OMP_NUM_THREADS=1 timeout 60 $MPIRUN -np "$np" -x OMP_NUM_THREADS ./train_gpt2 "$@" >"$out" 2>&1; rc=$?
    fi
    local line
    line=$(grep -m1 '^error:' "$out")
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -n "$line" ] && echo "$line" | grep -q -- "$pat" &&
       ! grep -qiE 'segmentation|assert|core dumped|backtrace' "$out"; then
        ok "$name (exit $rc): $line"
    else
        bad "$name (exit $rc, wanted an error line matching '$pat'):"; sed 's/^/      /' "$out" | head -8
    fi
}
# --- data files ---
expect "missing shard" "nosuch.bin" 0 $SMALL --input_bin "$TMP/nosuch.bin"
expect "no file matches the glob" "no file matches" 0 $SMALL --input_bin "$TMP/none_*.bin"
cp "$TMP/good.bin" "$TMP/magic.bin"; printf '\x01\x02\x03\x04' | dd of="$TMP/magic.bin" bs=1 conv=notrunc status=none
expect "shard with a wrong magic number" "magic.bin.*magic" 0 $SMALL --input_bin "$TMP/magic.bin"
cp "$TMP/good.bin" "$TMP/version.bin"; printf '\x07' | dd of="$TMP/version.bin" bs=1 seek=4 conv=notrunc status=none
expect "shard with a wrong version" "version.bin.*version" 0 $SMALL --input_bin "$TMP/version.bin"
head -c 3000 "$TMP/good.bin" > "$TMP/trunc.bin"
expect "truncated shard" "trunc.bin.*truncated" 0 $SMALL --input_bin "$TMP/trunc.bin"
build/make_shard "$TMP/tiny.bin" 20 1
expect "shard with fewer than B*T+1 tokens" "tiny.bin.*fewer than" 0 $SMALL --input_bin "$TMP/tiny.bin"
cp "$TMP/good.bin" "$TMP/badtok.bin"; printf '\xff\xff' | dd of="$TMP/badtok.bin" bs=1 seek=1100 conv=notrunc status=none
expect "token id >= vocabulary" "badtok.bin.*token id 65535" 0 $SMALL --input_bin "$TMP/badtok.bin"
expect "missing tokenizer for samples" "nosuch_tok.bin" 0 $SMALL --input_bin "$TMP/good.bin" --sample_every 1 --tokenizer "$TMP/nosuch_tok.bin"
# --- model files ---
./train_gpt2 $SMALL --input_bin "$TMP/good.bin" --num_iterations 0 --save_model "$TMP/m.bin" >/dev/null 2>&1
head -c 100000 "$TMP/m.bin" > "$TMP/mtrunc.bin"
expect "truncated model file" "mtrunc.bin.*truncated" 0 $SMALL --input_bin "$TMP/good.bin" --model "$TMP/mtrunc.bin"
cp "$TMP/m.bin" "$TMP/mmagic.bin"; printf '\x00\x00' | dd of="$TMP/mmagic.bin" bs=1 conv=notrunc status=none
expect "model file with a wrong magic number" "mmagic.bin.*magic" 0 $SMALL --input_bin "$TMP/good.bin" --model "$TMP/mmagic.bin"
cp "$TMP/m.bin" "$TMP/mver.bin"; printf '\x09' | dd of="$TMP/mver.bin" bs=1 seek=4 conv=notrunc status=none
expect "model file with a wrong version" "mver.bin.*version" 0 $SMALL --input_bin "$TMP/good.bin" --model "$TMP/mver.bin"
expect "model shape disagrees with the flags" "m.bin.*disagrees" 0 --input_bin "$TMP/good.bin" --model "$TMP/m.bin" --n_embd 64 --batch_size 2 --sequence_length 16
expect "sequence longer than the model's maxT" "sequence_length 64 exceeds" 0 --input_bin "$TMP/good.bin" --model "$TMP/m.bin" --batch_size 2 --sequence_length 64
expect "unknown model preset" "neither a preset" 0 --input_bin "$TMP/good.bin" --model d99
# --- output files: refused at start-up, before any step is spent ---
expect "--save_model in a missing directory (np 2)" "save_model .*nodir/m.bin: cannot create" 2 $SMALL --input_bin "$TMP/good.bin" --save_model "$TMP/nodir/m.bin"
if grep -q '^step' "$TMP/err.txt"; then bad "--save_model in a missing directory: the run trained before refusing it"; fi
expect "--save_model naming a directory" "save_model .* is a directory" 0 $SMALL --input_bin "$TMP/good.bin" --save_model "$TMP"
# --- flags ---
expect "batch size 0" "batch_size must be positive" 0 $SMALL --input_bin "$TMP/good.bin" --batch_size 0
expect "negative sequence length" "sequence_length must be positive" 0 $SMALL --input_bin "$TMP/good.bin" --sequence_length -4
expect "total batch not divisible by B*T" "total_batch_size 100 does not divide" 0 $SMALL --input_bin "$TMP/good.bin" --total_batch_size 100
expect "unknown flag" "unknown flag '--bogus'" 0 $SMALL --input_bin "$TMP/good.bin" --bogus 1
expect "malformed integer" "batch_size: '4x' is not an integer" 0 $SMALL --input_bin "$TMP/good.bin" --batch_size 4x
expect "malformed number" "learning_rate: 'abc' is not a number" 0 $SMALL --input_bin "$TMP/good.bin" --learning_rate abc
expect "flag without a value" "needs a value" 0 $SMALL --input_bin "$TMP/good.bin" --batch_size
expect "overlapped all-gather at zero_stage 0" "overlap_param_gather needs --zero_stage 1 or 2" 0 $SMALL --input_bin "$TMP/good.bin" --zero_stage 0 --overlap_param_gather
expect "unknown --gather_order" "gather_order: unknown value 'sideways'" 2 $SMALL --input_bin "$TMP/good.bin" --zero_stage 1 --overlap_param_gather --gather_order sideways
expect "--gather_hold without the overlapped all-gather" "gather_hold 1 needs --overlap_param_gather" 0 $SMALL --input_bin "$TMP/good.bin" --zero_stage 1 --gather_hold 1
expect "--overlap_param_gather takes no value" "overlap_param_gather takes no value" 0 $SMALL --input_bin "$TMP/good.bin" --zero_stage 1 --overlap_param_gather=1
expect "zero_stage 3" "zero_stage 3 is not supported" 2 $SMALL --input_bin "$TMP/good.bin" --zero_stage 3
expect "bf16 on the CPU" "bf16 needs --device cuda" 0 $SMALL --input_bin "$TMP/good.bin" --device cpu --dtype bf16
# --- distributed ---
build/make_shard "$TMP/few.bin" 100 1
expect "more ranks than the data can feed (np 4)" "fewer than one step needs" 4 $SMALL --input_bin "$TMP/few.bin" --batch_size 2 --sequence_length 16
expect "NCCL requested on a CPU run (np 2)" "comm nccl needs --device cuda" 2 $SMALL --input_bin "$TMP/good.bin" --device cpu --comm nccl
expect "world size 1 with --comm nccl on CPU" "comm nccl needs --device cuda" 0 $SMALL --input_bin "$TMP/good.bin" --device cpu --comm nccl
expect "unknown --comm value" "comm: unknown value" 2 $SMALL --input_bin "$TMP/good.bin" --comm carrier-pigeon
expect "bad input under mpirun: every rank ends (np 3)" "nosuch.bin" 3 $SMALL --input_bin "$TMP/nosuch.bin"
# a launcher's process count that this binary's MPI does not see (another MPI's mpirun; or, in a
# build without MPI, any launcher): each process would train alone on the whole batch
OMPI_COMM_WORLD_SIZE=2 expect "one of 2 processes of a launcher (OMPI_COMM_WORLD_SIZE) that MPI does not see" \
    "launcher started.*(OMPI_COMM_WORLD_SIZE=2)" 0 $SMALL --input_bin "$TMP/good.bin"
PMI_SIZE=3 expect "one of 3 processes of a PMI launcher (PMI_SIZE) that MPI does not see" \
    "launcher started.*(PMI_SIZE=3)" 0 $SMALL --input_bin "$TMP/good.bin"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
    expect "--device cuda with no GPU" "cuda" 0 $SMALL --input_bin "$TMP/good.bin" --device cuda
    expect "world 1, --comm nccl, --device auto, no GPU" "nccl" 0 $SMALL --input_bin "$TMP/good.bin" --comm nccl
fi
finish test_errors
