#!/usr/bin/env bash
# test/test_pipeline.sh — pipeline parallelism on CPU, against the
# single-process run of the same global batch:
#  - a grid of (P, V, DP, zero_stage, m) cells (m = micro-batches per step:
#    P, 2P and one that is not a multiple of P), a layer count that does not
#    split evenly (9 layers), clipping that triggers: losses, grad norms (the
#    tied embedding counted once) and final parameters within 1e-6 relative;
#    the two copies of the tied embedding bit-identical after every step
#    (--check_tied_embedding); every chunk's reductions launched during its
#    last backward in the schedule (the start-up report);
#  - GPipe against the same reference; a cell run twice is bit-identical;
#  - --pp_reduce_early (reductions launched in a chunk's first backward, on
#    purpose) is caught: the losses leave the reference and the report names
#    the wrong op;
#  - bad flags: one line on every rank, non-zero exit;
#  - checkpoints saved at (P=2, V=2, DP=2, zero 1) resume at (P=1, DP=1,
#    zero 0), (P=4, V=1) and (P=2, DP=1, zero 2) with the uninterrupted run's
#    losses; a stage killed during a step ends every rank within the timeout,
#    and the resume continues bit for bit.
# PP_GRID=full runs every cell of P 1..4 x V 1..2 x DP 1..2 (world <= 8) x
# zero 0..2 x m in {P, 2P, a non-multiple} and prints the table of
# docs/PIPELINE.md (minutes); the default is the CI subset.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
build/make_shard "$TMP/train.bin" 60000 1
B=2; T=16
COMMON="--input_bin $TMP/train.bin --model d9 --n_embd 32 --n_head 2 --max_seq_len 32 --batch_size $B
  --sequence_length $T --num_iterations 6 --learning_rate 3e-3 --warmup_iters 2 --learning_rate_decay_frac 0.1
  --weight_decay 0.1 --grad_clip 0.5 --seed 7 --shuffle 1"
norms() { grep -o '"grad_norm":[^,]*' "$1/log.jsonl" | cut -d: -f2; }
# close COL A B TOL: the column (losses or norms) of two runs, 6 steps, max relative difference <= TOL
close_col() {
    paste <($1 "$2") <($1 "$3") | awk -v tol="$4" -v what="$1" '
      { d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r; n++ }
      END { printf "    %s: %d steps, max rel diff %.2e\n", what, n, m; exit !(n == 6 && m <= tol) }'
}
# the reference: one process, the same global batch of B*T*prod tokens
# (ref N sets REFDIR; each reference runs once)
declare -A REF
ref() {
    local prod=$1
    if [ -z "${REF[$prod]:-}" ]; then
        run "$TMP/ref$prod" 0 --total_batch_size $((B * T * prod)) || bad "reference run x$prod"
        REF[$prod]="$TMP/ref$prod"
    fi
    REFDIR="${REF[$prod]}"
}
# launches_ok DIR ZERO: every chunk's "reductions launched during ops X..Y, its last backward is op Z" has
# Y == Z (the final reduction in the last backward) and, at zero_stage 0/1, X == Z (no reduction before it;
# zero_stage 2 reduce-scatters every backward into the shard)
launches_ok() {
    grep 'reductions launched during ops' "$1.out" | awk -v z="$2" '
      { split($9, xy, /\.\./); y = xy[2]; sub(",", "", y); if (y != $15 || (z < 2 && xy[1] != $15)) bad = 1; n++ }
      END { exit bad || n == 0 }'
}
not() { ! "$@"; }
# cell P V DP ZERO M [extra flags]: the run against its reference
cell() {
    local P=$1 V=$2 DP=$3 Z=$4 M=$5; shift 5
    local np=$((P * DP)) name="p${P}v${V}dp${DP}z${Z}m${M}${1:+_x}"
    ref $((DP * M)); local r="$REFDIR"
    local dir="$TMP/$name"
    if ! run "$dir" $np --pipeline_parallel $P --virtual_pipeline_parallel $V --zero_stage $Z \
            --total_batch_size $((B * T * DP * M)) --check_tied_embedding "$@"; then
        bad "P=$P V=$V DP=$DP zero $Z m=$M: the run failed"; return
    fi
    check "P=$P V=$V DP=$DP zero $Z m=$M $*: losses within 1e-6 of one process" close_col losses "$dir" "$r" 1e-6
    check "P=$P V=$V DP=$DP zero $Z m=$M $*: grad norms within 1e-6 (tied embedding counted once)" \
        close_col norms "$dir" "$r" 1e-6
    check "P=$P V=$V DP=$DP zero $Z m=$M $*: final parameters within 1e-6" \
        build/compare_models "$dir/model.bin" "$r/model.bin" --rtol 1e-6
    [ "$P" -gt 1 ] && check "P=$P V=$V DP=$DP zero $Z m=$M: every chunk reduces during its last backward" launches_ok "$dir" $Z
    LAST_CELL="$dir"
}

if [ "${PP_GRID:-ci}" = full ]; then
    echo "| P | V | DP | zero | m | losses | norms | params |"
    for P in 1 2 3 4; do for V in 1 2; do for DP in 1 2; do for Z in 0 1 2; do
        [ $V -gt 1 ] && [ $P -eq 1 ] && continue
        [ $((P * DP)) -gt 8 ] && continue
        for M in $P $((2 * P)) $((P + 1)); do
            before=$FAIL; cell $P $V $DP $Z $M >/dev/null
            echo "| $P | $V | $DP | $Z | $M | $([ $FAIL = $before ] && echo ok || echo FAIL) |"
        done
    done; done; done; done
    finish test_pipeline_grid
    exit
fi

# ---- the CI subset: every P, V, DP, zero stage and kind of m at least once ----
cell 2 1 1 0 2
cell 2 1 2 1 3
cell 2 2 1 2 4
cell 2 2 2 0 3
cell 3 1 1 1 6
cell 3 1 2 2 3
cell 3 2 1 0 4
cell 3 2 1 1 3
cell 4 1 1 2 4
cell 4 1 2 0 5
cell 4 2 1 1 8
cell 4 2 2 2 4
cell 2 1 1 1 4 --pp_schedule gpipe
cell 4 2 1 0 4 --pp_schedule gpipe
check "9 layers over 8 chunks: the extra layer on chunk 6, printed" grep -q ' 6: layers 6-7' "$TMP/p4v2dp2z2m4.out"

# ---- bit-identical reruns ----
run "$TMP/again" 6 --pipeline_parallel 3 --virtual_pipeline_parallel 2 --zero_stage 2 --total_batch_size $((B * T * 2 * 3)) || bad "rerun"
run "$TMP/again2" 6 --pipeline_parallel 3 --virtual_pipeline_parallel 2 --zero_stage 2 --total_batch_size $((B * T * 2 * 3)) || bad "rerun 2"
check "the same pipeline run twice: bit-identical losses" same_losses "$TMP/again" "$TMP/again2"
check "the same pipeline run twice: bit-identical parameters" same_params "$TMP/again" "$TMP/again2"

# ---- a reduction launched before a chunk's last backward is caught ----
# (two replicas: with one, a reduction is the identity and launching it early changes nothing)
ref 8; r="$REFDIR"
run "$TMP/early" 4 --pipeline_parallel 2 --zero_stage 1 --total_batch_size $((B * T * 8)) --pp_reduce_early || bad "early run"
check "--pp_reduce_early: the report names an op before the last backward" not launches_ok "$TMP/early" 1
check "--pp_reduce_early: the losses leave the single-process reference" not close_col losses "$TMP/early" "$r" 1e-6

# ---- bad flags: one line on every rank ----
bad_flags() {
    local want="$1" np="$2"; shift 2
    run_quiet "$TMP/err" "$np" "$@"; local rc=$?
    local n; n=$(grep -c "^error: .*$want" "$TMP/err.out")
    [ $rc -ne 0 ] && [ "$n" -eq "$np" ] || { echo "    rc $rc, $n of $np ranks said '$want':"; tail -3 "$TMP/err.out"; return 1; }
}
check "P not dividing the ranks" bad_flags "pipeline_parallel 2 does not divide the 3 ranks" 3 --pipeline_parallel 2
check "P x V above the layers" bad_flags "5 x --virtual_pipeline_parallel 2 = 10 model chunks, more than the model's 9" \
    5 --pipeline_parallel 5 --virtual_pipeline_parallel 2
check "V > 1 with P = 1" bad_flags "virtual_pipeline_parallel 2 needs --pipeline_parallel > 1" 2 --virtual_pipeline_parallel 2
check "an unknown schedule" bad_flags "pp_schedule: unknown value 'zb'" 2 --pipeline_parallel 2 --pp_schedule zb

# ---- checkpoints across pipeline shapes ----
# the uninterrupted run saves at step 3 (and 6); each resume starts from its step 3
G=$((B * T * 8))
run "$TMP/full" 4 --pipeline_parallel 2 --virtual_pipeline_parallel 2 --zero_stage 1 --total_batch_size $G \
    --checkpoint_every 3 || bad "P=2 V=2 DP=2 zero 1 run with checkpoints"
resume_case() {
    local name="$1" np="$2"; shift 2
    local d="$TMP/ck_$(echo "$name" | tr -c 'a-zA-Z0-9\n' _)"
    rm -rf "$d"; mkdir -p "$d"; cp -r "$TMP/full/ckpt_00000003" "$d/"
    run "$d" "$np" --total_batch_size $G --checkpoint_every 3 --resume "$@" || { bad "resume at $name"; return; }
    check "saved at P=2 V=2 DP=2 zero 1, resumed at $name: steps 4-6 within 1e-6 of the uninterrupted run" \
        bash -c "paste <(grep -o '\"loss\":[^,]*' $TMP/full/log.jsonl | cut -d: -f2 | tail -3) \
                       <(grep -o '\"loss\":[^,]*' $d/log.jsonl | cut -d: -f2 | tail -3) |
                 awk '{ d = \$1 - \$2; if (d < 0) d = -d; if (d / \$2 > 1e-6) bad = 1; n++ } END { exit bad || n != 3 }'"
}
resume_case "P=1 DP=1 zero 0" 1 --zero_stage 0
resume_case "P=4 V=1 DP=1" 4 --pipeline_parallel 4 --zero_stage 1
resume_case "P=2 DP=1 zero 2" 2 --pipeline_parallel 2 --zero_stage 2

# ---- a stage killed during a step ----
KILLF="--pipeline_parallel 3 --zero_stage 1 --total_batch_size $((B * T * 3)) --num_iterations 400 --lr_schedule constant
  --checkpoint_every 2 --comm_timeout 10"
run "$TMP/kref" 3 $KILLF --num_iterations 6 --output_dir "$TMP/kref" || bad "kill reference"
start_bg "$TMP/kill" 3 $KILLF
for _ in $(seq 1 500); do [ -f "$TMP/kill/ckpt_00000004/DONE" ] && break; sleep 0.05; done
victim=$(rank_pid 1)
t0=$(date +%s)
[ -n "$victim" ] && kill -9 "$victim"
wait "$BG"; rc=$?
t1=$(date +%s)
check "the middle stage killed (rc $rc): every rank ended within the 10 s timeout ($((t1 - t0)) s)" \
    bash -c "[ $rc -ne 0 ] && [ $((t1 - t0)) -le 30 ]"
rm -rf "$TMP/kill2"; mkdir -p "$TMP/kill2"; cp -r "$TMP/kill/ckpt_00000004" "$TMP/kill2/"
run "$TMP/kill2" 3 $KILLF --num_iterations 6 --output_dir "$TMP/kill2" --resume || bad "resume after the kill"
check "resumed from step 4 after the kill: the final model of the uninterrupted run, bit for bit" \
    cmp -s "$TMP/kref/model.bin" "$TMP/kill2/model.bin"

finish test_pipeline
