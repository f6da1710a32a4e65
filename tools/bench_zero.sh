#!/usr/bin/env bash
# tools/bench_zero.sh — memory per rank and step time of zero_stage 1 and 2, with and without
# --overlap_param_gather, for several N. On one GPU the ranks share it through the MPI
# communicator (--comm mpi), so the step times show the cost of the schedule, not the overlap that
# separate GPUs would give; the gradient bytes per rank are what they would be on N GPUs.
#
#   tools/bench_zero.sh [--np "1 2 4"] [--device cuda|cpu] [--model d12] [--b 8] [--t 1024]
#                       [--steps 4] [--flags "..."] [--out DIR]
#
# Prints one row per (N, stage, overlap): median ms/step over the steps after the first, rank 0's
# gradient MB (stage 0/1: the full buffer; stage 2: shard + working buffers, from the report after
# the first step), and rank 0's peak allocated MB. Uses a synthetic token shard (build/make_shard).
set -u
cd "$(dirname "$0")/.."
NP="1 2 4" DEVICE=cuda MODEL=d12 B=8 T=1024 STEPS=4 FLAGS="" OUT=runs/bench_zero
die() { echo "bench_zero.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || die "$1 needs a value (see --help)"
    case "$1" in
        --np) NP="$2" ;; --device) DEVICE="$2" ;; --model) MODEL="$2" ;; --b) B="$2" ;;
        --t) T="$2" ;; --steps) STEPS="$2" ;; --flags) FLAGS="$2" ;; --out) OUT="$2" ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift 2
done
[ -x ./train_gpt2 ] && [ -x build/make_shard ] || die "./train_gpt2 or build/make_shard missing: run make"
mkdir -p "$OUT" || die "--out $OUT: cannot create"
build/make_shard "$OUT/train.bin" 2000000 1 >/dev/null || die "make_shard failed"
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
COMM=""; [ "$DEVICE" = cuda ] && COMM="--comm mpi"
printf "| N | zero_stage | overlap | ms/step | grads MB/rank | peak alloc MB (rank 0) |\n|--:|--:|--:|--:|--:|--:|\n" | tee "$OUT/table.md"
for n in $NP; do
    for cfg in "1 0" "1 1" "2 0" "2 1"; do
        set -- $cfg; z=$1; o=$2
        d="$OUT/n$n-z$z-o$o"; mkdir -p "$d"
        ov=""; [ "$o" = 1 ] && ov="--overlap_param_gather"
        OMP_NUM_THREADS=1 timeout 600 $MPIRUN -np "$n" -x OMP_NUM_THREADS ./train_gpt2 --device "$DEVICE" $COMM \
            --input_bin "$OUT/train.bin" --model "$MODEL" --batch_size "$B" --sequence_length "$T" \
            --num_iterations "$STEPS" --zero_stage "$z" $ov --output_dir "$d" \
            $FLAGS > "$d/out.txt" 2>&1 || { echo "run $d failed:"; tail -3 "$d/out.txt"; continue; }
        ms=$(grep -o '"ms":[^,]*' "$d/log.jsonl" | cut -d: -f2 | tail -n +2 | sort -g |
             awk '{a[NR]=$1} END {if (NR) print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2); else print "n/a"}')
        if [ "$z" = 2 ]; then
            g=$(grep "^rank 0 zero_stage 2 gradients" "$d/out.txt" | sed -E 's/.*= ([0-9.]+) MB.*/\1/')
        else
            g=$(grep "^rank 0 memory:" "$d/out.txt" | sed -E 's/.*grads ([0-9.]+) MB.*/\1/')
        fi
        pk=$(grep -o '"peak_alloc_mb":[^,}]*' "$d/log.jsonl" | cut -d: -f2 | sort -g | tail -1)
        printf "| %s | %s | %s | %s | %s | %s |\n" "$n" "$z" "$o" "$ms" "${g:-?}" "${pk:-?}" | tee -a "$OUT/table.md"
    done
done
