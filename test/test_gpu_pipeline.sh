#!/usr/bin/env bash
# test/test_gpu_pipeline.sh — pipeline parallelism on ONE GPU: P ranks share
# it through the MPI communicator (--comm mpi), P in {2, 3} x V in {1, 2} x
# zero_stage 1 and 2, against the one-rank run of the same global batch:
# fp32 losses within 1e-5 and final parameters within 1e-5 relative, bf16
# losses within 1e-2; the two copies of the tied embedding bit-identical after
# every step (--check_tied_embedding); a cell run twice is bit-identical.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
build/make_shard "$TMP/train.bin" 400000 1
COMMON="--device cuda --input_bin $TMP/train.bin --model d6 --n_embd 128 --n_head 4 --max_seq_len 128
  --batch_size 4 --sequence_length 128 --num_iterations 10 --learning_rate 1e-3 --warmup_iters 2
  --learning_rate_decay_frac 0.1 --weight_decay 0.1 --grad_clip 0.5 --seed 5 --bucket_size 100K"
RUN_MPI_FLAGS="--comm mpi"   # ranks share the GPU (test/lib.sh's run)
M=6                          # micro-batches per step: a multiple of 2 and 3
G=$((4 * 128 * M))
for dt in fp32 bf16; do
    run "$TMP/$dt-ref" 0 --dtype $dt --total_batch_size $G || bad "$dt one-rank reference"
    for P in 2 3; do for V in 1 2; do for zs in 1 2; do
        cell="$dt-p$P-v$V-z$zs"
        if ! run "$TMP/$cell" $P --dtype $dt --pipeline_parallel $P --virtual_pipeline_parallel $V --zero_stage $zs \
                --total_batch_size $G --check_tied_embedding; then
            bad "$cell runs"; continue
        fi
        if [ $dt = fp32 ]; then
            check "$cell: losses within 1e-5 of one rank" close_losses "$TMP/$cell" "$TMP/$dt-ref" 1e-5
            check "$cell: params within 1e-5 of one rank" build/compare_models "$TMP/$cell/model.bin" "$TMP/$dt-ref/model.bin" --rtol 1e-5
        else
            check "$cell: losses within 1e-2 of one rank" close_losses "$TMP/$cell" "$TMP/$dt-ref" 1e-2
        fi
    done; done; done
done
run "$TMP/again" 3 --dtype bf16 --pipeline_parallel 3 --virtual_pipeline_parallel 2 --zero_stage 2 --total_batch_size $G ||
    bad "bf16 rerun"
check "bf16 P=3 V=2 zero 2 run twice: bit-identical losses" same_losses "$TMP/again" "$TMP/bf16-p3-v2-z2"
grep -h '^step' "$TMP/bf16-p3-v2-z2.out" | tail -2 | sed 's/^/    /'
finish test_gpu_pipeline
