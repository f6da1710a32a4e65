#!/usr/bin/env bash
# tools/bench_pp.sh — pipeline parallelism figures, printed as markdown tables:
#  1. the measured bubble (time a rank waits on transfers / step time, the
#     worst rank's, median over the timed steps) against (P-1)/(V*m), for
#     P in {2,4}, V in {1,2}, m in {4,8,16}, with the 1F1B (interleaved when
#     V > 1) schedule;
#  2. activation memory per rank, 1F1B against GPipe, for a d12 and a deeper
#     model at P = 1, 2, 4 (m = 8): the first stage of 1F1B holds at most P
#     micro-batches of activations, GPipe's every stage m.
#
#   tools/bench_pp.sh [--device cpu|cuda] [--model d12] [--deep d16] [--b B] [--t T] [--steps N]
#                     [--only bubble|memory]
#
# On one machine every rank shares the CPU cores or the one GPU (--comm mpi
# on cuda), so the bubble measured here includes the ranks' contention; it
# is the shape of the schedules (bubble against theory, memory) that these
# tables show. Each run writes to a temp directory; nothing is kept.
set -u
cd "$(dirname "$0")/.."
DEVICE=cpu MODEL=d12 DEEP=d16 BB=1 TT=64 STEPS=4 ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
    --device) DEVICE="$2"; shift ;;
    --model) MODEL="$2"; shift ;;
    --deep) DEEP="$2"; shift ;;
    --b) BB="$2"; shift ;;
    --t) TT="$2"; shift ;;
    --steps) STEPS="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    *) echo "tools/bench_pp.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
done
case "$ONLY" in "" | bubble | memory) ;; *) echo "tools/bench_pp.sh: --only takes bubble or memory" >&2; exit 2 ;; esac
[ -x ./train_gpt2 ] && [ -x build/make_shard ] || { echo "tools/bench_pp.sh: build first (make)" >&2; exit 2; }
TMP=$(mktemp -d /tmp/bench_pp.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
build/make_shard "$TMP/train.bin" 2000000 1 >/dev/null
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
export OMPI_MCA_btl_vader_single_copy_mechanism=none
DEV="--device $DEVICE"
[ "$DEVICE" = cuda ] && DEV="$DEV --comm mpi"
THREADS=1; [ "$DEVICE" = cpu ] && THREADS=$(( $(nproc) / 4 > 0 ? $(nproc) / 4 : 1 ))

# trainer NP OUT FLAGS...: a run of STEPS steps; the output in OUT.out
trainer() {
    local np="$1" out="$2"; shift 2
    mkdir -p "$out"
    OMP_NUM_THREADS=$THREADS $MPIRUN -np "$np" -x OMP_NUM_THREADS ./train_gpt2 $DEV --input_bin "$TMP/train.bin" \
        --batch_size $BB --sequence_length $TT --num_iterations $STEPS --output_dir "$out" "$@" >"$out.out" 2>&1
}
# the median of the "bubble" of the timed steps (step 1 excluded)
median_bubble() {
    grep -o '"bubble":[^}]*' "$1/log.jsonl" | cut -d: -f2 | tail -n +2 | sort -g |
        awk '{ a[NR] = $1 } END { if (NR == 0) print "n/a"; else printf "%.3f", a[int((NR + 1) / 2)] }'
}

if [ "$ONLY" != memory ]; then
echo "## Bubble: measured against (P-1)/(V*m) ($DEVICE, $MODEL, B=$BB, T=$TT, $STEPS steps)"
echo
echo "| P | V | m | theory | measured (rank 0) | ms/step |"
echo "|--:|--:|--:|--:|--:|--:|"
for P in 2 4; do for V in 1 2; do for M in 4 8 16; do
    out="$TMP/b_p${P}v${V}m${M}"
    if trainer $P "$out" --model $MODEL --pipeline_parallel $P --virtual_pipeline_parallel $V \
            --total_batch_size $((BB * TT * M)); then
        ms=$(grep -o '"ms":[^,]*' "$out/log.jsonl" | cut -d: -f2 | tail -n +2 | sort -g |
             awk '{ a[NR] = $1 } END { printf "%.1f", a[int((NR + 1) / 2)] }')
        echo "| $P | $V | $M | $(awk -v p=$P -v v=$V -v m=$M 'BEGIN { printf "%.3f", (p - 1) / (v * m) }') | $(median_bubble "$out") | $ms |"
    else
        echo "| $P | $V | $M | | failed: $(grep -m1 error "$out.out") | |"
    fi
done; done; done
echo
fi

[ "$ONLY" = bubble ] && exit 0
echo "## Activation memory per rank, 1F1B against GPipe (m = 8; MB of activations on each rank, its slots)"
echo
echo "| model | P | schedule | stage 0 | stage P-1 | peak alloc, stage 0 (MB) |"
echo "|---|--:|---|--:|--:|--:|"
for mdl in $MODEL $DEEP; do for P in 1 2 4; do for S in 1f1b gpipe; do
    [ $P = 1 ] && [ $S = gpipe ] && continue
    out="$TMP/m_${mdl}_p${P}_$S"
    if trainer $P "$out" --model $mdl --pipeline_parallel $P --pp_schedule $S --total_batch_size $((BB * TT * 8)); then
        if [ $P = 1 ]; then
            a0=$(grep -o 'activations [0-9.]* MB' "$out.out" | head -1 | awk '{ print $2 }'); a1=$a0
        else
            a0=$(grep "^rank 0 chunk" "$out.out" | sed 's/.*activations \([0-9.]*\) MB (peak: \([0-9]*\) .*/\1 (\2 slots)/' | head -1)
            a1=$(grep "^rank $((P - 1)) chunk" "$out.out" | sed 's/.*activations \([0-9.]*\) MB (peak: \([0-9]*\) .*/\1 (\2 slots)/' | head -1)
        fi
        peak=$(grep -o '"peak_alloc_mb":[^,]*' "$out/log.jsonl" | tail -1 | cut -d: -f2)
        echo "| $mdl | $P | $S | $a0 | $a1 | $peak |" | sed 's/(1 slots)/(1 slot)/g'
    else
        echo "| $mdl | $P | $S | failed: $(grep -m1 error "$out.out") | | |"
    fi
done; done; done
