#!/usr/bin/env bash
# test/test_gpu_ranks.sh — several ranks on ONE GPU through the MPI
# communicator (NCCL refuses two ranks on one GPU): N = 2 and 3 x
# zero_stage 0 and 1, against the one-rank run with the same global batch.
# fp32 mode: losses and final parameters within 1e-5 relative; bf16 mode:
# losses within 1e-2 relative. Also: two identical GPU runs give bit-identical
# losses, and zero_stage 1 at N=1 equals the plain run bit for bit.
# ZeRO-2 and the overlapped all-gather, fp32 and bf16: zero_stage 2
# at N=1 equals the plain run bit for bit; N = 2, 3 x {zero_stage 2, zero_stage
# 1 and 2 with --overlap_param_gather} against the one-rank run (tolerances as
# above); without accumulation zero_stage 2 equals zero_stage 1 bit for bit;
# overlapped = blocking all-gather bit for bit; N=2 with accumulation 2 (stage
# 2 reduces every micro-step); all-gathers launched in reverse and held back
# until waited for (--gather_order reverse --gather_hold 1) = blocking, bit for
# bit. Prints the memory lines of zero_stage 1 and 2 and the step times with
# and without the overlapped all-gather.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
build/make_shard "$TMP/train.bin" 200000 1
COMMON="--device cuda --input_bin $TMP/train.bin --model d2 --n_embd 128 --max_seq_len 128
  --batch_size 4 --sequence_length 128 --num_iterations 10 --learning_rate 1e-3 --warmup_iters 2
  --learning_rate_decay_frac 0.1 --weight_decay 0.1 --grad_clip 0.5 --seed 5 --bucket_size 100K"
RUN_MPI_FLAGS="--comm mpi"   # ranks share the GPU (test/lib.sh's run)
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
grep -h 'rank [0-9] memory' "$TMP"/bf16-n3-z1.out "$TMP"/bf16-n3-z0.out | sed 's/^/    /'

# ---- zero_stage 2 and the overlapped all-gather ----
same_params() { build/compare_models "$1/model.bin" "$2/model.bin" --exact; }
for dt in fp32 bf16; do
    run "$TMP/$dt-z2n1" 0 --dtype $dt --zero_stage 2
    check "$dt: zero_stage 2 at N=1 equals the plain run bit for bit" same_losses "$TMP/$dt-z2n1" "$TMP/$dt-ref1"
    for n in 2 3; do
        for cfg in z2 z1o z2o; do
            case $cfg in
                z2)  flags="--zero_stage 2" ;;
                z1o) flags="--zero_stage 1 --overlap_param_gather" ;;
                z2o) flags="--zero_stage 2 --overlap_param_gather" ;;
            esac
            cell="$dt-n$n-$cfg"
            if ! run "$TMP/$cell" $n --dtype $dt $flags --total_batch_size $((4*128*n)); then bad "$cell runs"; continue; fi
            if [ $dt = fp32 ]; then
                check "$cell: losses within 1e-5 of one rank" close_losses "$TMP/$cell" "$TMP/$dt-ref$n" 1e-5
                check "$cell: params within 1e-5 of one rank" build/compare_models "$TMP/$cell/model.bin" "$TMP/$dt-ref$n/model.bin" --rtol 1e-5
            else
                check "$cell: losses within 1e-2 of one rank" close_losses "$TMP/$cell" "$TMP/$dt-ref$n" 1e-2
            fi
        done
        c="$TMP/$dt-n$n"
        check "$dt-n$n: zero_stage 2 = zero_stage 1 bit for bit (no accumulation)" same_params "$c-z2" "$c-z1"
        check "$dt-n$n: zero_stage 1 overlapped all-gather = blocking" same_params "$c-z1o" "$c-z1"
        check "$dt-n$n: zero_stage 2 overlapped all-gather = blocking" same_params "$c-z2o" "$c-z2"
    done
    run "$TMP/$dt-ref4" 0 --dtype $dt --total_batch_size $((4*128*4))
    a2="--dtype $dt --zero_stage 2 --total_batch_size $((4*128*4))"
    if run "$TMP/$dt-n2-a2-z2" 2 $a2 && run "$TMP/$dt-n2-a2-z2o" 2 $a2 --overlap_param_gather &&
       run "$TMP/$dt-n2-a2-z2rev" 2 $a2 --overlap_param_gather --gather_order reverse --gather_hold 1; then
        if [ $dt = fp32 ]; then
            check "$dt-n2-a2-z2: losses within 1e-5 of one rank" close_losses "$TMP/$dt-n2-a2-z2" "$TMP/$dt-ref4" 1e-5
            check "$dt-n2-a2-z2: params within 1e-5 of one rank" build/compare_models "$TMP/$dt-n2-a2-z2/model.bin" "$TMP/$dt-ref4/model.bin" --rtol 1e-5
        else
            check "$dt-n2-a2-z2: losses within 1e-2 of one rank" close_losses "$TMP/$dt-n2-a2-z2" "$TMP/$dt-ref4" 1e-2
        fi
        check "$dt-n2-a2: zero_stage 2 overlapped all-gather = blocking" same_params "$TMP/$dt-n2-a2-z2o" "$TMP/$dt-n2-a2-z2"
        check "$dt-n2-a2: reversed, held all-gathers = blocking" same_params "$TMP/$dt-n2-a2-z2rev" "$TMP/$dt-n2-a2-z2"
    else
        bad "$dt-n2-a2 zero_stage 2 runs"
    fi
done
grep -h 'rank [0-9] memory\|zero_stage 2 gradients' "$TMP"/bf16-n3-z1.out "$TMP"/bf16-n3-z2.out | sed 's/^/    /'
for c in bf16-n3-z1 bf16-n3-z1o bf16-n3-z2 bf16-n3-z2o; do
    echo "    $c: $(grep -h '^done:' "$TMP/$c.out")"
done
finish test_gpu_ranks
