#!/usr/bin/env bash
# test/test_gpu_ranks.sh — several ranks on ONE GPU through the MPI
# communicator (NCCL refuses two ranks on one GPU): N = 2 and 3 x
# zero_stage 0 and 1, against the one-rank run with the same global batch.
# fp32 mode: losses and final parameters within 1e-5 relative; bf16 mode:
# losses within 1e-2 relative. Also: two identical GPU runs give bit-identical
# losses, and zero_stage 1 at N=1 equals the plain run bit for bit.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
build/make_shard "$TMP/train.bin" 200000 1
COMMON="--device cuda --input_bin $TMP/train.bin --model d2 --n_embd 128 --max_seq_len 128
  --batch_size 4 --sequence_length 128 --num_iterations 10 --learning_rate 1e-3 --warmup_iters 2
  --learning_rate_decay_frac 0.1 --weight_decay 0.1 --grad_clip 0.5 --seed 5 --bucket_size 100K"
run() {
    local dir="$1" np="$2"; shift 2
    mkdir -p "$dir"
    if [ "$np" = 0 ]; then
        ./train_gpt2 $COMMON --output_dir "$dir" --save_model "$dir/model.bin" "$@" >"$dir/out.txt" 2>&1
    else
        timeout 300 $MPIRUN -np "$np" ./train_gpt2 $COMMON --comm mpi --output_dir "$dir" --save_model "$dir/model.bin" "$@" >"$dir/out.txt" 2>&1
    fi
    local rc=$?; [ $rc -eq 0 ] || { echo "run $dir failed ($rc):"; tail -5 "$dir/out.txt"; }; return $rc
}
close_losses() {
    paste <(losses "$1") <(losses "$2") | awk -v tol="$3" '
      { d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r; n++ }
      END { printf "    losses: %d steps, max rel diff %.2e\n", n, m; exit !(n == 10 && m <= tol) }'
}
same_losses() { cmp -s <(losses "$1") <(losses "$2"); }
for dt in fp32 bf16; do
    run "$TMP/$dt-ref1" 0 --dtype $dt && run "$TMP/$dt-ref1b" 0 --dtype $dt
    check "$dt: two identical GPU runs give bit-identical losses" same_losses "$TMP/$dt-ref1" "$TMP/$dt-ref1b"
    run "$TMP/$dt-z1n1" 0 --dtype $dt --zero_stage 1
    check "$dt: zero_stage 1 at N=1 equals the plain run bit for bit" same_losses "$TMP/$dt-z1n1" "$TMP/$dt-ref1"
    for n in 2 3; do
        run "$TMP/$dt-ref$n" 0 --dtype $dt --total_batch_size $((4*128*n))
        for zs in 0 1; do
            cell="$dt-n$n-z$zs"
            if ! run "$TMP/$cell" $n --dtype $dt --zero_stage $zs --total_batch_size $((4*128*n)); then bad "$cell runs"; continue; fi
            if [ $dt = fp32 ]; then
                check "$cell: losses within 1e-5 of one rank" close_losses "$TMP/$cell" "$TMP/$dt-ref$n" 1e-5
                check "$cell: params within 1e-5 of one rank" build/compare_models "$TMP/$cell/model.bin" "$TMP/$dt-ref$n/model.bin" --rtol 1e-5
            else
                check "$cell: losses within 1e-2 of one rank" close_losses "$TMP/$cell" "$TMP/$dt-ref$n" 1e-2
            fi
        done
    done
done
grep -h 'rank [0-9] memory' "$TMP"/bf16-n3-z1/out.txt "$TMP"/bf16-n3-z0/out.txt | sed 's/^/    /'
finish test_gpu_ranks
