#!/usr/bin/env bash
# tools/same_bits.sh — checks that a change kept the trainer's results bit for
# bit: runs the same configurations with two trainer binaries (before and after
# the change) and compares the final model files byte for byte with cmp.
#
#   tools/same_bits.sh BEFORE_BIN AFTER_BIN [--gpu] [--out DIR]
#
# CPU configurations (test-size model, 6 steps, clipping that triggers):
#   single process; N=2 zero_stage 0 with accumulation 2; N=3 zero_stage 1;
#   N=4 zero_stage 2 with the overlapped all-gather and tiny buckets;
#   a checkpoint saved at N=2 zero_stage 1 and resumed at N=3 zero_stage 2.
# --gpu adds: CUDA bf16 one rank; CUDA bf16 two ranks sharing the GPU (--comm mpi).
# Prints one line per configuration and "same_bits: N passed, M failed".
set -u
[ $# -ge 2 ] || { echo "usage: tools/same_bits.sh BEFORE_BIN AFTER_BIN [--gpu] [--out DIR]" >&2; exit 2; }
BEFORE=$(readlink -f "$1"); AFTER=$(readlink -f "$2"); shift 2
GPU=0; OUT=$(mktemp -d /tmp/same_bits.XXXXXX)
while [ $# -gt 0 ]; do
    case "$1" in
    --gpu) GPU=1 ;;
    --out) OUT="$2"; shift ;;
    *) echo "tools/same_bits.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
done
cd "$(dirname "$0")/.."
for b in "$BEFORE" "$AFTER"; do [ -x "$b" ] || { echo "tools/same_bits.sh: $b is not an executable" >&2; exit 2; }; done
[ -x build/make_shard ] || { echo "tools/same_bits.sh: build/make_shard missing (run make)" >&2; exit 2; }
mkdir -p "$OUT"
build/make_shard "$OUT/train.bin" 30000 1 >/dev/null
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS"
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
CPU="--input_bin $OUT/train.bin --model d2 --n_embd 32 --n_head 2 --max_seq_len 32 --batch_size 2
  --sequence_length 16 --num_iterations 6 --learning_rate 3e-3 --warmup_iters 2 --weight_decay 0.1
  --grad_clip 0.5 --seed 7 --shuffle 1"
GPUF="--device cuda --input_bin $OUT/train.bin --model d2 --n_embd 128 --max_seq_len 128 --batch_size 4
  --sequence_length 64 --num_iterations 6 --learning_rate 1e-3 --grad_clip 1.0 --seed 7"
pass=0; fail=0

# trainer NP DIR FLAGS...: NP 0 = no mpirun
trainer() {
    local bin="$1" np="$2" dir="$3"; shift 3
    mkdir -p "$dir"
    if [ "$np" = 0 ]; then "$bin" "$@" >>"$dir.out" 2>&1
    else $MPIRUN -np "$np" "$bin" "$@" >>"$dir.out" 2>&1; fi
}
# config NAME NP FLAGS...: the same run with both binaries, then cmp of the models
config() {
    local name="$1" np="$2"; shift 2
    for side in before after; do
        local bin=$BEFORE; [ $side = after ] && bin=$AFTER
        rm -rf "$OUT/$name.$side" "$OUT/$name.$side.out"
        trainer "$bin" "$np" "$OUT/$name.$side" "$@" --save_model "$OUT/$name.$side/model.bin" ||
            echo "    $name ($side) exited non-zero: see $OUT/$name.$side.out"
    done
    report "$name"
}
report() {
    local name="$1" a="$OUT/$1.before/model.bin" b="$OUT/$1.after/model.bin"
    if [ -s "$a" ] && cmp "$a" "$b"; then
        pass=$((pass + 1)); echo "ok   $name: cmp $(basename "$(dirname "$a")")/model.bin $(basename "$(dirname "$b")")/model.bin: identical ($(stat -c %s "$a") bytes)"
    else
        fail=$((fail + 1)); echo "FAIL $name: the final models differ (or one is missing)"
    fi
}

config single 0 $CPU
config n2_stage0_accum2 2 $CPU --zero_stage 0 --total_batch_size 128
config n3_stage1 3 $CPU --zero_stage 1
config n4_stage2_overlap_tiny 4 $CPU --zero_stage 2 --overlap_param_gather --bucket_size 500
# a checkpoint saved at N=2 zero_stage 1 (steps 1-3), resumed at N=3 zero_stage 2 (steps 4-6)
for side in before after; do
    bin=$BEFORE; [ $side = after ] && bin=$AFTER
    d="$OUT/resume.$side"; rm -rf "$d" "$d.out"
    trainer "$bin" 2 "$d" $CPU --zero_stage 1 --num_iterations 3 --output_dir "$d" --checkpoint_every 3 ||
        echo "    resume ($side, save) exited non-zero"
    trainer "$bin" 3 "$d" $CPU --zero_stage 2 --output_dir "$d" --checkpoint_every 3 --resume \
        --save_model "$d/model.bin" || echo "    resume ($side, resume) exited non-zero"
done
report resume
if [ $GPU = 1 ]; then
    config cuda_bf16_1rank 0 $GPUF --dtype bf16
    config cuda_bf16_2ranks_shared_gpu 2 $GPUF --dtype bf16 --comm mpi --zero_stage 1
fi
echo "same_bits: $pass passed, $fail failed"
[ $fail -eq 0 ]
