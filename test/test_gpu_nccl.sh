#!/usr/bin/env bash
# test/test_gpu_nccl.sh — the NCCL communicator on this machine's GPU(s) (make test-gpu).
#  - test_comm.sh --gpu: the communicator's own tests with NCCL (and, with 2+ GPUs, two ranks and a
#    stalled rank), the MPI backend staging device buffers, the GPU-sharing error.
#  - the trainer through NCCL: one rank with --comm nccl (NCCL's collectives on their own stream,
#    ordered by events) against the same run with no communicator, at zero_stage 0, 1 and 2 and with
#    the overlapped all-gather: bit-identical losses and model (a sum over one rank is the value).
#    With 2+ GPUs also N = 2 through NCCL against N = 2 through MPI (tools/bench_multigpu.sh measures more).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
if bash test/test_comm.sh build/test_comm --gpu > "$TMP/comm.txt" 2>&1; then ok "test_comm.sh --gpu: $(tail -1 "$TMP/comm.txt")"
else bad "test_comm.sh --gpu"; grep -E "^FAIL|failed" "$TMP/comm.txt" | head -5; fi
build/make_shard "$TMP/train.bin" 200000 1 >/dev/null
COMMON="--device cuda --input_bin $TMP/train.bin --model d2 --n_embd 128 --max_seq_len 128
  --batch_size 4 --sequence_length 128 --num_iterations 10 --learning_rate 1e-3 --warmup_iters 2
  --weight_decay 0.1 --grad_clip 0.5 --seed 5 --bucket_size 100K"
for dt in bf16 fp32; do
    run "$TMP/$dt-single" 0 --dtype $dt || { bad "$dt reference run"; continue; }
    for cfg in "0" "1" "2" "1 --overlap_param_gather" "2 --overlap_param_gather"; do
        name="$dt-z${cfg// /}"; name=${name//--overlap_param_gather/o}
        if run "$TMP/$name" 1 --dtype $dt --comm nccl --zero_stage $cfg; then
            grep -q "comm nccl" "$TMP/$name.out" || { bad "$name: the run did not use NCCL"; continue; }
            check "$dt nccl np=1 zero_stage $cfg = no communicator, bit for bit" same_losses "$TMP/$name" "$TMP/$dt-single"
            check "$dt nccl np=1 zero_stage $cfg: same model file" cmp -s "$TMP/$name/model.bin" "$TMP/$dt-single/model.bin"
        else bad "$name run"; fi
    done
done
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$NGPU" -ge 2 ]; then
    run "$TMP/n2-mpi" 2 --comm mpi --zero_stage 1 && run "$TMP/n2-nccl" 2 --comm nccl --zero_stage 1 &&
        check "N=2 zero_stage 1: NCCL within 1e-2 of MPI (bf16)" close_losses "$TMP/n2-nccl" "$TMP/n2-mpi" 1e-2
fi
finish test_gpu_nccl
